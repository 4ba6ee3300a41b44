"""Every line of a FileLogSource as a row ``(partition, line)`` into an exactly-once sink, with a
crash injected: ``CRASH_AT`` names the step at which this process SIGKILLs itself, the first time
a batch with records reaches it.

    python tests/sink_crash_app.py WORKDIR SECONDS SINK [CRASH_AT]

``SINK``: ``delta`` (DeltaSink on WORKDIR/table), ``iceberg`` (IcebergSink on the table ``db.lines`` of
a SQLite catalog WORKDIR/catalog.db, warehouse WORKDIR/warehouse), ``postgres`` (PostgresSink, staged, into the
table ``lines`` of the database whose conninfo is in ``SPARKWAL_TEST_PG``) or ``kafka`` (KafkaSink
into the topic ``SPARKWAL_TEST_TOPIC`` of the broker ``SPARKWAL_TEST_KAFKA``). Steps: ``written``
(the executors wrote or staged the batch's rows, or the driver produced its records, the sink's
commit not made), ``committed`` (the sink's commit made, the stream's commit log and checkpoint
not written), ``partition`` (PostgresSink per partition: p0's task committed, p1's not; with
``SPARKWAL_TEST_PG_WAY=partitions``, or KafkaSink with ``SPARKWAL_TEST_PER_PARTITION``), ``upserted``
(IcebergSink with ``SPARKWAL_TEST_ICEBERG_MODE=upsert``, by the key ``line``: the driver's upsert wrote
its data files, the catalog not asked to take the commit). Without CRASH_AT it stops gracefully once
caught up (or after SECONDS).
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
    partition = line.split(" ", 1)[0].rsplit("-", 1)[0]
    if partition == "p1" and os.environ.get("SPARKWAL_TEST_DRIVER_PID"):
        kill_driver_once_p0_is_in()
    return partition, line


def kill_driver_once_p0_is_in() -> None:
    """``partition`` (a sink per partition, in a task of p1): once p0's task has committed its
    rows and offsets, SIGKILL the driver, p1's transaction not begun (once per work directory)."""
    marker = os.path.join(os.environ["SPARKWAL_TEST_WORKDIR"], "killed-at-partition")
    if os.path.exists(marker):
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not p0_committed():
        time.sleep(0.05)
    open(marker, "w").close()
    os.kill(int(os.environ["SPARKWAL_TEST_DRIVER_PID"]), signal.SIGKILL)
    time.sleep(60)  # (this worker goes with the driver's JVM)


def p0_committed() -> bool:
    if os.environ.get("SPARKWAL_TEST_KAFKA"):
        from sparkwal.engine.sinks import KafkaSink

        sink = KafkaSink(os.environ["SPARKWAL_TEST_TOPIC"], {"bootstrap.servers": os.environ["SPARKWAL_TEST_KAFKA"]},
                         "lines", per_partition=True)
        return sink.committed_batch() is not None
    import psycopg

    with psycopg.connect(os.environ["SPARKWAL_TEST_PG"], autocommit=True) as conn:
        query = "SELECT count(*) FROM sparkwal_offsets WHERE sink = 'lines' AND partition = '\"p0\"'"
        return conn.execute(query).fetchone()[0] > 0


def main() -> None:
    workdir, seconds, kind = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    crash_at = sys.argv[4] if len(sys.argv) > 4 else None
    if crash_at == "partition":  # before the JVM starts: its Python workers inherit the environment
        os.environ.update(SPARKWAL_TEST_DRIVER_PID=str(os.getpid()), SPARKWAL_TEST_WORKDIR=workdir)
    import pyarrow as pa
    from pyspark import SparkConf, SparkContext

    from sparkwal.engine import StreamingContext

    from caught_up import run_until_caught_up  # this script's directory, tests/
    from sparkwal.engine.sinks import DeltaSink, IcebergSink, KafkaSink, PostgresSink
    from sparkwal.engine.sources import FileLogSource

    import sink_crash_app as app  # by its importable name: the row function is pickled by reference

    conf = (SparkConf().setMaster("local[2]").setAppName("delta-crash")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    if kind == "delta":
        schema = pa.schema([(n, getattr(pa, t)()) for n, t in SCHEMA_FIELDS])
        sink = DeltaSink(os.path.join(workdir, "table"), "lines", schema=schema, partition_by=["partition"])
    elif kind == "iceberg":
        schema = pa.schema([(n, getattr(pa, t)()) for n, t in SCHEMA_FIELDS])
        catalog = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"}
        upsert = os.environ.get("SPARKWAL_TEST_ICEBERG_MODE") == "upsert"
        sink = IcebergSink(catalog, "db.lines", "lines", schema=schema, partition_by=["partition"],
                           **(dict(mode="upsert", keys=["line"]) if upsert else {}))
        if crash_at == "upserted":
            from pyiceberg.table import Transaction

            commit_transaction = Transaction.commit_transaction

            def killed_before_the_catalog(transaction):
                if armed:
                    os.kill(os.getpid(), signal.SIGKILL)
                return commit_transaction(transaction)

            Transaction.commit_transaction = killed_before_the_catalog
    elif kind == "kafka":
        sink = KafkaSink(os.environ["SPARKWAL_TEST_TOPIC"], {"bootstrap.servers": os.environ["SPARKWAL_TEST_KAFKA"]},
                         "lines", per_partition=crash_at == "partition" or "SPARKWAL_TEST_PER_PARTITION" in os.environ)
    else:
        sink = PostgresSink(os.environ["SPARKWAL_TEST_PG"], "lines", "lines")
    sink_class = type(sink)
    commit_batch = sink_class.commit_batch
    armed = False

    def patched(self, batch_time_ms, ranges, *args):
        nonlocal armed
        has = any(r.untilOffset > r.fromOffset for r in ranges)
        armed = crash_at == "upserted" and has
        if crash_at == "written" and has:
            os.kill(os.getpid(), signal.SIGKILL)
        result = commit_batch(self, batch_time_ms, ranges, *args)
        if crash_at == "committed" and has:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    sink_class.commit_batch = patched

    def create():
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(os.path.join(workdir, "ckpt"))
        stream = ssc.directStream(FileLogSource(os.path.join(workdir, "log")), fromOffsets=sink.offsets())
        if kind == "postgres":  # staged for the steps at the commit, per partition for "partition"
            per_partition = os.environ.get("SPARKWAL_TEST_PG_WAY", "staged") == "partitions"
            sink.saveStream(stream.map(app.row), stream, per_partition=per_partition)
        else:
            sink.saveStream(stream.map(app.row), stream)
        return ssc

    ssc = StreamingContext.getOrCreate(os.path.join(workdir, "ckpt"), create)
    run_until_caught_up(ssc, seconds, stop_when_caught_up=crash_at is None)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
