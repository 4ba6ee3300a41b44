"""The main job's direct mode with a crash injected: ``CRASH_AT`` names the step after (or
before) which this process SIGKILLs itself, the first time a batch with records reaches it.

    python tests/direct_crash_app.py WORKDIR SECONDS [CRASH_AT]

Steps: ``offsets`` (offsets/N written, the batch's jobs submitted), ``jobs`` (inside the output,
before its database transaction), ``output`` (the transaction committed, commits/N not yet
written), ``commit`` (commits/N written), ``checkpoint`` (a DStream checkpoint written after a
commit). With two concurrent jobs (spark.streaming.concurrentJobs=2): ``overlap`` (inside the
output, before its transaction, once a later batch's output operation has started: two batches in
flight), ``overlap_output`` (the same, after the transaction), ``pipelined`` (no crash). Without
CRASH_AT (or with ``pipelined``) it stops gracefully once caught up (or after SECONDS).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

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
    from sparkwal.engine.apps.direct_wordcount import append_lines, logged_lines
    from sparkwal.engine.apps.wordcount import build

    from caught_up import run_until_caught_up  # this script's directory, tests/

    conf = (SparkConf().setMaster("local[2]").setAppName("direct-crash")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1"))
    if crash_at in ("overlap", "overlap_output", "pipelined"):
        conf.set("spark.streaming.concurrentJobs", "2")
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    os.makedirs(os.path.join(workdir, "log"), exist_ok=True)
    committed_data = []
    started_later = threading.Condition()
    started: list[int] = []  # batch times whose output operations started

    def wait_for_a_later_batch(batch_ms: int) -> None:
        """Another batch's output has started while this one's is in flight (bounded: without
        it the app runs on, exits 0, and the test says the crash never came)."""
        logdir = os.path.join(workdir, "log")
        append_lines(logdir, "p1", logged_lines(logdir).get("p1", 0), 3)  # the later batches' input
        with started_later:
            started_later.wait_for(lambda: any(t > batch_ms for t in started), 60)
            if any(t > batch_ms for t in started):
                die()

    class Crash(StreamingListener):
        def onOutputOperationStarted(self, e):
            with started_later:
                started.append(e.outputOperationInfo().batch_time_ms)
                started_later.notify_all()

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
        if crash_at == "overlap" and has:
            wait_for_a_later_batch(batch_time_ms)
        result = commit_batch(self, batch_time_ms, ranges, write)
        if crash_at == "overlap_output" and has:
            wait_for_a_later_batch(batch_time_ms)
        if has:
            _had_data[0] = True
        if crash_at == "output" and has:
            die()
        return result

    SQLiteSink.commit_batch = patched
    ssc, _ = build(sc, workdir, 0.5, json_events=True, direct=True)
    ssc.addStreamingListener(Crash())
    run_until_caught_up(ssc, seconds, stop_when_caught_up=crash_at in (None, "pipelined"))


if __name__ == "__main__":
    main()
