"""The main job's direct mode with a crash injected: ``CRASH_AT`` names the step after (or
before) which this process SIGKILLs itself, the first time a batch with records reaches it.

    python tests/direct_crash_app.py WORKDIR SECONDS [CRASH_AT]

Steps: ``offsets`` (offsets/N written, the batch's jobs submitted), ``jobs`` (inside the output,
before its database transaction), ``output`` (the transaction committed, commits/N not yet
written), ``commit`` (commits/N written), ``checkpoint`` (a DStream checkpoint written after a
commit). Without CRASH_AT it runs SECONDS and stops gracefully.
"""

from __future__ import annotations

import os
import signal
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    workdir, seconds = sys.argv[1], float(sys.argv[2])
    crash_at = sys.argv[3] if len(sys.argv) > 3 else None
    from pyspark import SparkConf, SparkContext

    from sparkwal.engine import StreamingListener
    from sparkwal.engine.sinks import SQLiteSink
    from sparkwal.engine.apps.wordcount import build

    conf = (SparkConf().setMaster("local[2]").setAppName("direct-crash")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    os.makedirs(os.path.join(workdir, "log"), exist_ok=True)
    committed_data = []

    class Crash(StreamingListener):
        def onBatchSubmitted(self, e):
            if crash_at == "offsets" and e.batchInfo().num_records > 0:
                die()

        def onBatchCommitted(self, e):
            committed_data.append(e.batchId())
            if crash_at == "commit" and _had_data[0]:
                die()

        def onCheckpointWritten(self, e):  # the checkpoint is durable, its cleanup done
            if crash_at == "checkpoint" and _had_data[0] and committed_data:
                die()

    _had_data = [False]
    commit_batch = SQLiteSink.commit_batch

    def patched(self, batch_time_ms, ranges, write):
        has = any(r.untilOffset > r.fromOffset for r in ranges)
        if crash_at == "jobs" and has:
            die()
        result = commit_batch(self, batch_time_ms, ranges, write)
        if has:
            _had_data[0] = True
        if crash_at == "output" and has:
            die()
        return result

    SQLiteSink.commit_batch = patched
    ssc, _ = build(sc, workdir, 0.5, json_events=True, direct=True)
    ssc.addStreamingListener(Crash())
    ssc.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ssc.awaitTerminationOrTimeout(0.1):
        pass
    ssc.stop(stopSparkContext=True, stopGraceFully=True)


if __name__ == "__main__":
    main()
