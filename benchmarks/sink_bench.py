"""Exactly-once sinks against the same output written the plain way, in one run.

    python -m benchmarks.sink_bench [--lines-per-batch 100000] [--batches 6] [--rounds 2]
                                    [--sinks delta,iceberg,postgres,kafka]

A direct stream over a FileLogSource (two partitions, a backlog written before the run, each
batch capped at ``--lines-per-batch`` lines by ``spark.streaming.direct.maxRatePerPartition``)
writes every line as a row ``(partition, line)``:

* ``delta exactly-once``: :class:`sparkwal.engine.sinks.DeltaSink` (executors write Parquet, the
  driver commits one Delta transaction with the batch's txn and offsets);
* ``delta plain``: ``foreachRDD`` collecting the batch and appending it with
  ``deltalake.write_deltalake`` (no batch identity: a re-run after a crash appends it again);
* ``iceberg exactly-once``: :class:`sparkwal.engine.sinks.IcebergSink` (executors write the data
  files with pyiceberg's writer, the driver commits one snapshot carrying the batch and its offsets),
  on pyiceberg's SQL catalog over a SQLite file and a local warehouse;
* ``iceberg plain``: ``foreachRDD`` collecting the batch and appending it with pyiceberg's
  ``Table.append`` (the driver writes the files and commits; no batch identity);
* ``postgres exactly-once``: :class:`sparkwal.engine.sinks.PostgresSink` per partition (the rows
  keep the source's partitioning: each task COPYs its rows into the table and stores its range's
  end in one transaction of its own);
* ``postgres staged``: the same sink with ``per_partition=False`` (the tasks COPY into its staging
  table, the driver's transaction moves the rows and stores the offsets: a batch visible whole);
* ``postgres plain``: ``foreachRDD`` with ``foreachPartition`` COPYing each partition into the
  table in a transaction of its own (a re-run appends again, a crash may leave part of a batch).

* ``kafka exactly-once``: :class:`sparkwal.engine.sinks.KafkaSink` (the tasks encode the records,
  the driver's transactional producer sends them and the batch's marker in one transaction);
* ``kafka per partition``: the same sink with ``per_partition=True`` (each task produces its
  partition and its range's marker in a Kafka transaction of its own, from the executor);
* ``kafka per partition, untagged``: the same, as it runs against a broker that honours
  transactions (the start-up probe's answer set so): Tansu 0.6 shows aborted records, so the sink
  tags every record with its write there (a header), a cost a Kafka broker does not impose; this
  row measures the sink without it (no failure happens in the run, so its output is the same);
* ``kafka plain``: ``foreachRDD`` with ``foreachPartition`` producing each partition from the
  executors with a plain producer (``acks=all``; a re-run produces again, a crash may leave part
  of a batch).

PostgreSQL is a server of the run's own (Debian's ``postgresql``, ``fsync=on``).

Each path runs ``--batches`` batches of 1 s per round (after one that starts the sink, not
counted), a fresh table each, the paths alternated over ``--rounds`` rounds after a warm-up round
that is not counted. Reported per path: records per second of processing time (records / the
batches' processing time), the batches' processing p50 (a batch's output is visible when its
processing ends: the commit is its last step) and the ratio of exactly-once to plain throughput
per sink. Durability: Delta rows commit the log with delta-rs's put-if-absent, sparkwal's Parquet
files are fsync'd before its commit, the plain path's are not; Iceberg rows commit in the SQLite
catalog (its journal synced), sparkwal's data files fsync'd before it, pyiceberg's plain ones not;
Kafka records are acknowledged by the broker (Tansu, memory storage: no fsync, for both paths);
PostgreSQL rows commit with the server's WAL flush (``synchronous_commit=on``), twice for the
staged path (the tasks' staging, then the move). """

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

SINKS = ("delta", "iceberg", "postgres", "kafka")
PATHS = ("delta exactly-once", "delta plain", "iceberg exactly-once", "iceberg plain",
         "postgres exactly-once", "postgres staged", "postgres plain",
         "kafka exactly-once", "kafka per partition", "kafka per partition, untagged", "kafka plain")


def _row_of(line: str) -> tuple:
    return line.split(" ", 1)[0].rsplit("-", 1)[0], line


def _copy_partition(rows, conninfo: str, table: str) -> None:
    import psycopg

    with psycopg.connect(conninfo) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY {table} (partition, line) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def _produce_partition(rows, bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    for key, value in rows:
        while True:
            try:
                producer.produce(topic, value.encode(), key.encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def _new_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"lines-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    for f in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        f.result(30)
    return topic


def run_path(sc, path: str, workdir: str, logdir: str, batches: int, offsets: dict, conninfo: str,
             bootstrap: str) -> dict:
    """``batches`` batches of ``path`` reading on from ``offsets`` (updated): their records and
    processing times."""
    import pyarrow as pa

    from sparkwal.engine import StreamingContext, StreamingListener
    from sparkwal.engine.sinks import DeltaSink
    from sparkwal.engine.sources import FileLogSource

    schema = pa.schema([("partition", pa.string()), ("line", pa.string())])
    table = os.path.join(workdir, f"table-{time.monotonic_ns()}")
    done, lock = [], threading.Condition()

    class Batches(StreamingListener):
        def onBatchCompleted(self, e):
            info = e.batchInfo()
            with lock:
                if info.numRecords():
                    done.append((info.numRecords(), info.processingDelay()))
                lock.notify_all()

    ssc = StreamingContext(sc, 1.0)
    stream = ssc.directStream(FileLogSource(logdir), fromOffsets=dict(offsets))
    rows = stream.map(_row_of)
    if path.startswith("postgres"):
        import psycopg

        from sparkwal.engine.sinks import PostgresSink

        name = f"lines_{time.monotonic_ns()}"
        with psycopg.connect(conninfo) as conn:
            conn.execute(f"CREATE TABLE {name} (partition TEXT, line TEXT)")
        if path == "postgres exactly-once":
            PostgresSink(conninfo, name, name).saveStream(rows, stream)
        elif path == "postgres staged":
            PostgresSink(conninfo, name, name).saveStream(rows, stream, per_partition=False)
        else:
            rows.foreachRDD(lambda rdd: rdd.foreachPartition(
                lambda part: _copy_partition(part, conninfo, name)))
    elif path.startswith("kafka"):
        from sparkwal.engine.sinks import KafkaSink

        topic = _new_topic(bootstrap)
        if path != "kafka plain":
            sink = KafkaSink(topic, {"bootstrap.servers": bootstrap}, "bench", per_partition="per partition" in path)
            if path.endswith("untagged"):
                sink.honours_transactions = True  # (no probe: as against a broker that hides aborted records)
            sink.saveStream(rows, stream)
        else:
            rows.foreachRDD(lambda rdd: rdd.foreachPartition(lambda part: _produce_partition(part, bootstrap, topic)))
    elif path.startswith("iceberg"):
        from sparkwal.engine.sinks import IcebergSink

        catalog = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"}
        sink = IcebergSink(catalog, f"bench.t{time.monotonic_ns()}", "bench", schema=schema)
        if path == "iceberg exactly-once":
            sink.saveStream(rows, stream)
        else:
            iceberg = sink.create_table()

            def append_iceberg(rdd) -> None:
                got = rdd.collect()
                if got:
                    iceberg.append(pa.Table.from_pylist([{"partition": p, "line": v} for p, v in got], schema))
            rows.foreachRDD(append_iceberg)
    elif path == "delta exactly-once":
        DeltaSink(table, "bench", schema=schema).saveStream(rows, stream)
    else:
        def append(rdd) -> None:
            from deltalake import write_deltalake

            got = rdd.collect()
            if got:
                write_deltalake(table, pa.Table.from_pylist([{"partition": p, "line": v} for p, v in got], schema),
                                mode="append")
        rows.foreachRDD(append)
    reached: dict = {}
    stream.foreachRDD(lambda t, rdd: reached.update({(r.topic, r.partition): r.untilOffset
                                                     for r in stream.offset_ranges(int(t.timestamp() * 1000))}))
    ssc.addStreamingListener(Batches())
    ssc.start()
    try:
        with lock:
            lock.wait_for(lambda: len(done) >= batches + 1, timeout=600)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    offsets.update({k: v for k, v in reached.items()})
    counted = done[1:batches + 1]  # the first batch starts the sink (its connections, topics, fencing)
    return {"records": sum(n for n, _ in counted), "processing_ms": [ms for _, ms in counted]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines-per-batch", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sinks", default=",".join(SINKS), help="which sinks' paths to run (comma-separated)")
    args = ap.parse_args(argv)
    sinks = [s for s in args.sinks.split(",") if s]
    if not sinks or set(sinks) - set(SINKS):
        ap.error(f"--sinks takes some of {', '.join(SINKS)}, got {args.sinks!r}")
    paths = [p for p in PATHS if p.split(" ")[0] in sinks]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf, SparkContext

    from sparkwal.engine.apps.direct_wordcount import append_lines
    from sparkwal.engine.sources import TopicPartition

    per_partition = args.lines_per_batch // 2
    conf = (SparkConf().setMaster("local[2]").setAppName("sink-bench").set("spark.ui.enabled", "false")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.streaming.direct.maxRatePerPartition", str(per_partition)))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    workdir = tempfile.mkdtemp(prefix="sink-bench-")
    logdir = os.path.join(workdir, "log")
    os.makedirs(logdir)
    total_batches = (args.rounds + 1) * len(paths) * (args.batches + 3)  # (the first, and a batch or two more)
    for p in ("p0", "p1"):
        for start in range(0, per_partition * total_batches, 100_000):
            append_lines(logdir, p, start, min(100_000, per_partition * total_batches - start))
    offsets = {TopicPartition("log", p): 0 for p in ("p0", "p1")}
    results: dict[str, list[dict]] = {p: [] for p in paths}
    from contextlib import ExitStack, nullcontext

    from sparkwal.engine.apps.kafka_server import tansu_broker
    from sparkwal.engine.apps.postgres_server import PostgresCluster

    with ExitStack() as stack:
        server = PostgresCluster() if "postgres" in sinks else None
        if server is not None:
            server.start()
            stack.callback(server.remove)
        bootstrap = stack.enter_context(tansu_broker() if "kafka" in sinks else nullcontext())
        for rnd in range(args.rounds + 1):
            for path in paths if rnd % 2 == 0 else reversed(paths):
                r = run_path(sc, path, workdir, logdir, args.batches, offsets, server and server.conninfo, bootstrap)
                if rnd > 0:  # round 0 warms them all up
                    results[path].append(r)
                print(json.dumps({"round": rnd, "path": path, "records": r["records"],
                                  "processing_ms": r["processing_ms"]}), flush=True)
    sc.stop()
    rows = {}
    for path, runs in results.items():
        records = sum(r["records"] for r in runs)
        seconds = sum(sum(r["processing_ms"]) for r in runs) / 1000
        rows[path] = {"records_per_s": records / seconds if seconds else 0.0,
                      "processing_p50_ms": statistics.median([ms for r in runs for ms in r["processing_ms"]])}
    ratios = {sink: rows[f"{sink} exactly-once"]["records_per_s"] / rows[f"{sink} plain"]["records_per_s"]
              for sink in sinks}
    for path, plain in (("kafka per partition", "kafka plain"), ("kafka per partition, untagged", "kafka plain"),
                        ("postgres staged", "postgres plain")):
        if path in rows:
            ratios[path] = rows[path]["records_per_s"] / rows[plain]["records_per_s"]
    print("\n| path | records/s (processing) | batch processing p50 ms (output visible at its end) |")
    print("|---|---:|---:|")
    for path, row in rows.items():
        print(f"| {path} | {row['records_per_s']:,.0f} | {row['processing_p50_ms']:.0f} |")
    for sink, ratio in ratios.items():
        print(f"{sink}: exactly-once / plain throughput {ratio:.2f}")
    print(json.dumps({"summary": rows, "ratios": ratios}))


if __name__ == "__main__":
    main()
