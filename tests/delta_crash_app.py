"""Every line of a FileLogSource into a Delta table through DeltaSink, with a crash injected:
``CRASH_AT`` names the step at which this process SIGKILLs itself, the first time a batch with
records reaches it.

    python tests/delta_crash_app.py WORKDIR SECONDS [CRASH_AT]

Steps: ``written`` (the executors wrote the batch's files, the Delta commit not made), ``committed``
(the Delta commit made, the stream's commit log and checkpoint not written). Without CRASH_AT it
runs SECONDS and stops gracefully.
"""

from __future__ import annotations

import os
import signal
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SCHEMA_FIELDS = (("partition", "string"), ("line", "string"))


def row(line: str) -> tuple:
    return line.split(" ", 1)[0].rsplit("-", 1)[0], line


def main() -> None:
    workdir, seconds = sys.argv[1], float(sys.argv[2])
    crash_at = sys.argv[3] if len(sys.argv) > 3 else None
    import pyarrow as pa
    from pyspark import SparkConf, SparkContext

    from sparkwal.engine import StreamingContext
    from sparkwal.engine.sinks import DeltaSink
    from sparkwal.engine.sources import FileLogSource

    import delta_crash_app as app  # by its importable name: the row function is pickled by reference

    conf = (SparkConf().setMaster("local[2]").setAppName("delta-crash")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    schema = pa.schema([(n, getattr(pa, t)()) for n, t in SCHEMA_FIELDS])
    sink = DeltaSink(os.path.join(workdir, "table"), "lines", schema=schema, partition_by=["partition"])

    commit_batch = DeltaSink.commit_batch

    def patched(self, batch_time_ms, ranges, written, schema):
        has = any(r.untilOffset > r.fromOffset for r in ranges)
        if crash_at == "written" and has:
            os.kill(os.getpid(), signal.SIGKILL)
        result = commit_batch(self, batch_time_ms, ranges, written, schema)
        if crash_at == "committed" and has:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    DeltaSink.commit_batch = patched

    def create():
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(os.path.join(workdir, "ckpt"))
        stream = ssc.directStream(FileLogSource(os.path.join(workdir, "log")), fromOffsets=sink.offsets())
        sink.saveStream(stream.map(app.row), stream)
        return ssc

    ssc = StreamingContext.getOrCreate(os.path.join(workdir, "ckpt"), create)
    ssc.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ssc.awaitTerminationOrTimeout(0.1):
        pass
    ssc.stop(stopSparkContext=True, stopGraceFully=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
