"""One stateful word count for :mod:`benchmarks.state_bench`, in its own process (so that it can
be SIGKILLed and restarted with ``getOrCreate``):

    python -m benchmarks.state_app --engine {pyspark,sparkwal} --op {update,map,map-snapshots,shuffle,structure,hosted}
        --input DIR --checkpoint DIR --batch SECONDS --events FILE [--partitions N] [--standby]
        [--conf KEY=VALUE ...] [--storage-option KEY=VALUE ...] [--source filelog [--sink SQLITE_FILE]]
        [--source receiver --source-port PORT [--precompute]]

sparkwal's checkpoint may be any fsspec URL (``--storage-option`` as the main job's).
``--source filelog`` reads ``--input`` as a FileLogSource (a direct stream, its lines' offsets
logged); with ``--sink``, ``mapWithState`` counts and each batch's keys and new counts go into a
SQLite file with the batch's offsets in one transaction (``SQLiteSink``: exactly once).
``--source receiver`` reads an ``AckedLineSource`` (receiver WAL on): each batch's counts (a
``reduceByKey``, precomputed by the receiver with ``--precompute``) into ``mapWithState``, whose
state's total is a ``total`` event every batch.

Lines of a file stream are keys; the state is each key's count (``updateStateByKey``, or
sparkwal's ``mapWithState``), snapshotted every two batches. The output counts the stream's
records each batch: updateStateByKey's are the whole state, mapWithState's the touched keys.
``--op map-snapshots`` also counts ``stateSnapshots()`` (every key) each batch. ``--op shuffle``
keeps no state: the batch's records moved to their keys' partitions and counted, the floor under
any stateful batch of the same data. ``--op structure`` is the shape of a state kept in PySpark's
cache with no state in it (:func:`structure_batch`): the floor under any such state. ``--op hosted``
is a state out of Spark's cache, kept and run by host processes (:mod:`benchmarks.hosted_state`):
the bound of that design, with nothing recovering it. Each completed batch appends a JSON
line ``{"event": "batch", "time_ms", "records", "processing_ms", "scheduling_ms", "at"}`` to
FILE (``at``: the wall clock when the listener saw it; sparkwal's also ``breakdown`` and
``operations``: where the batch's time went, ``BatchInfo.breakdown`` and each output operation's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def count_update(values, state):
    return sum(values) + (state or 0)


def write_total(time, rdd) -> None:
    """``--totals``: the sum of the state's counts after the batch, a JSON line in the events file
    (named by the environment: the graph, pickled into the checkpoint, holds no open file)."""
    with open(os.environ["STATE_APP_EVENTS"], "a") as f:
        f.write(json.dumps({"event": "total", "time_ms": int(time.timestamp() * 1000),
                            "total": rdd.values().sum(), "at": _now()}) + "\n")


def _now() -> float:
    return time.time()


def count_map(key, value, state):
    state.update((state.getOption() or 0) + value)


def count_map_emit(key, value, state):
    """``--sink``'s mapping: the key's count after the record."""
    n = (state.getOption() or 0) + value
    state.update(n)
    return key, n


def write_counts(cur, batch_ms: int, records: list) -> None:
    """``--sink``: the batch's record count and its keys' new counts, in the transaction that stores
    the batch's offsets (exactly once: a batch re-run after a commit writes nothing)."""
    cur.execute("CREATE TABLE IF NOT EXISTS batches (batch_ms INTEGER PRIMARY KEY, records INTEGER NOT NULL)")
    cur.execute("CREATE TABLE IF NOT EXISTS counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    newest: dict[str, int] = {}
    for key, n in records:
        newest[key] = max(n, newest.get(key, 0))
    cur.executemany("INSERT INTO counts VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET n = excluded.n",
                    list(newest.items()))
    cur.execute("INSERT INTO batches VALUES (?, ?)", (batch_ms, len(records)))


_STRUCTURE: dict = {}  # --op structure: the newest cached "state" RDD (the driver's)


def structure_batch(rdd):
    """``--op structure``: mapWithState's shape, with nothing in the state. The previous batch's
    cached RDD (one record per partition: a blob as large as the partition's pickled counts after
    the first batch, 6 MB at 1M keys, carried along unread) unioned with the batch's records moved
    to their partitions, one pass over them that only counts, its result cached and read by the
    output (one ``None`` per record, as ``count_map`` maps). What is left of a ``mapWithState`` batch
    is the state's own work. A module function, so that the checkpoint's graph names it."""
    from pyspark import StorageLevel

    n = rdd.getNumPartitions()
    if n == 0:  # an empty batch (no file moved in): no job, as the engine runs none for it
        return rdd

    def update(index, records):
        records = iter(records)
        first = next(records)
        blob = first[1] if isinstance(first[1], bytes) else None
        counted = 0
        if blob is None:  # the first batch: the partition's keys, pickled, is the blob from now on
            counts: dict = {}
            for key, value in records:
                counts[key] = counts.get(key, 0) + value
                counted += 1
            import pickle

            blob = pickle.dumps(counts, pickle.HIGHEST_PROTOCOL)
        else:
            for _ in records:
                counted += 1
        yield index, (blob, [None] * counted)

    previous = _STRUCTURE.get("state")
    if previous is None:
        previous = rdd.context.parallelize([(i, None) for i in range(n)], n).partitionBy(n)
    state = previous.union(rdd).mapPartitionsWithIndex(update, preservesPartitioning=True)
    state.persist(StorageLevel.MEMORY_ONLY)
    older, _STRUCTURE["state"] = _STRUCTURE.get("older"), state
    _STRUCTURE["older"] = previous
    if older is not None and older.is_cached:
        older.unpersist(blocking=False)  # (as the engine keeps only the newest state cached)
    return state.flatMap(lambda r: r[1][1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["pyspark", "sparkwal"], required=True)
    p.add_argument("--op", choices=["update", "map", "map-snapshots", "shuffle", "structure", "hosted"],
                   default="update")
    p.add_argument("--input", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--batch", type=float, required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--events", required=True)
    p.add_argument("--standby", action="store_true",
                   help="sparkwal: a hot standby of the driver leading --checkpoint")
    p.add_argument("--version", type=int, default=1, choices=[1, 2],
                   help="sparkwal: 2 adds a step before the state (a changed graph; upgrade_bench)")
    p.add_argument("--upgrade", action="store_true", help="sparkwal: getOrCreate(..., upgrade=True)")
    p.add_argument("--totals", action="store_true", help="update: each batch's sum of counts, as an event")
    p.add_argument("--source", choices=["files", "filelog", "receiver"], default="files",
                   help="sparkwal: filelog reads --input as a FileLogSource (a direct stream) instead; receiver "
                        "reads an AckedLineSource at --source-port (its secret: $STATE_APP_SOURCE_SECRET)")
    p.add_argument("--source-port", type=int)
    p.add_argument("--precompute", action="store_true",
                   help="receiver: spark.sparkwal.receiver.precompute (off without it)")
    p.add_argument("--sink", metavar="SQLITE_FILE",
                   help="sparkwal, --source filelog --op map: each batch's keys and count into this SQLite "
                        "file, exactly once (SQLiteSink)")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[])
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName(f"state-{args.engine}-{args.op}")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.driver.memory", "3g"))
    if os.environ.get("SPARKWAL_BENCH_MASTER"):  # --standalone of the state and standby benchmarks
        conf.setMaster(os.environ["SPARKWAL_BENCH_MASTER"])
        for pair in filter(None, os.environ.get("SPARKWAL_BENCH_CONF", "").split(",")):
            conf.set(*pair.split("=", 1))
    if args.source == "receiver":  # the receiver WAL; blocks cut at least twice a batch
        conf.set("spark.streaming.receiver.writeAheadLog.enable", "true")
        conf.set("spark.streaming.blockInterval", f"{min(200, int(args.batch * 500))}ms")
        conf.setExecutorEnv("STATE_APP_SOURCE_SECRET", os.environ["STATE_APP_SOURCE_SECRET"])
        conf.set("spark.sparkwal.receiver.precompute", "true" if args.precompute else "false")  # (on by default)
    for pair in args.conf:
        conf.set(*pair.split("=", 1))
    if args.engine == "sparkwal":  # off local mode: the executors' workers set up (installed there)
        from sparkwal.engine import prepare_conf

        conf = prepare_conf(conf.setIfMissing("spark.sparkwal.shipCode", "false"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    if args.engine == "pyspark":
        from pyspark.streaming import StreamingContext, StreamingListener
    else:
        from sparkwal.engine import StateSpec, StreamingContext, StreamingListener
    events = open(args.events, "a", buffering=1)
    os.environ["STATE_APP_EVENTS"] = args.events
    options = None
    if args.storage_option:
        from sparkwal.wal.storage import parse_storage_options

        options = parse_storage_options(args.storage_option)
    where = {"storage_options": options} if options else {}
    n = args.partitions

    def create():
        ssc = StreamingContext(sc, args.batch)
        ssc.checkpoint(args.checkpoint, **where)
        if args.source == "filelog":
            from sparkwal.engine.sinks import SQLiteSink
            from sparkwal.engine.sources import FileLogSource

            sink = SQLiteSink(args.sink, "state_app") if args.sink else None
            lines = ssc.directStream(FileLogSource(args.input), fromOffsets=sink.offsets() if sink else None)
        elif args.source == "receiver":
            from sparkwal.engine.receiver.acked_lines import AckedLineReceiver

            lines = ssc.receiverStream(AckedLineReceiver("127.0.0.1", args.source_port,
                                                         secret_env="STATE_APP_SOURCE_SECRET"))
        else:
            lines = ssc.textFileStream(args.input)
        pairs = (lines.filter(bool) if args.version == 2 else lines).map(lambda k: (k, 1))
        if args.source == "receiver":  # (a batch's counts, precomputed by its receiver with --precompute)
            counted = pairs.reduceByKey(lambda a, b: a + b).mapWithState(
                StateSpec.function(count_map_emit).numPartitions(n))
            counted.checkpoint(2 * args.batch)
            counted.stateSnapshots().foreachRDD(write_total)
            return ssc
        if args.sink:  # its output: each record's key and count, into the sink with the batch's offsets
            out = pairs.mapWithState(StateSpec.function(count_map_emit).numPartitions(n))
            out.checkpoint(2 * args.batch)
            sink.saveStream(out, lines, write_counts)
            return ssc
        if args.op in ("map", "map-snapshots"):  # its output: the batch's mapped records (the keys it touched)
            out = pairs.mapWithState(StateSpec.function(count_map).numPartitions(n))
            if args.op == "map-snapshots":  # and every key's state after the batch, as updateStateByKey gives
                out.stateSnapshots().foreachRDD(lambda rdd: None if rdd.count() < 0 else None)
        elif args.op == "shuffle":  # no state: the batch moved to its keys' partitions, a floor
            out = pairs.partitionBy(n)
        elif args.op == "structure":  # a state's shape in PySpark's cache, nothing in it: a floor
            from benchmarks import state_app  # (by name: this file runs as __main__)

            out = pairs.partitionBy(n).transform(state_app.structure_batch)
        elif args.op == "hosted":  # a state out of Spark's cache, run by host processes: a bound
            from benchmarks import hosted_state

            out = pairs.partitionBy(n).transform(hosted_state.hosted_batch)
        else:  # its output: the state, every key (what updateStateByKey gives)
            out = pairs.updateStateByKey(count_update, numPartitions=n)
        if args.op not in ("shuffle", "structure", "hosted"):
            out.checkpoint(2 * args.batch)  # mapWithState forwards it to its state stream, as Spark
        if args.totals and args.op == "update":
            out.foreachRDD(write_total)  # (materialises every batch too)
        else:
            out.foreachRDD(lambda rdd: None if rdd.count() < 0 else None)  # materialise every batch
        return ssc

    class Listener(StreamingListener):
        def onBatchCompleted(self, e):
            b = e.batchInfo()
            if args.engine == "pyspark":
                row = (b.batchTime().milliseconds(), b.numRecords(), b.processingDelay(), b.schedulingDelay())
            else:
                row = (b.batch_time_ms, b.num_records, b.processing_delay_ms, b.scheduling_delay_ms)
            where = {} if args.engine == "pyspark" else {  # where the batch's time went (ms)
                "breakdown": b.breakdown, "operations": [o.breakdown for o in b.output_operation_infos.values()]}
            events.write(json.dumps({"event": "batch", "time_ms": row[0], "records": row[1],
                                     "processing_ms": row[2], "scheduling_ms": row[3],
                                     "at": time.time(), **where}) + "\n")

        def onStandbyReady(self, e):
            events.write(json.dumps({"event": "hot", "took_ms": e.took_ms, "at": time.time()}) + "\n")

        def onDriverTakeover(self, e):
            events.write(json.dumps({"event": "takeover", "took_ms": e.took_ms, "epoch": e.epoch,
                                     "rerun": len(e.rerun_batch_times), "at": time.time()}) + "\n")

    how = {**where, **({"upgrade": True} if args.upgrade else {})}
    if args.standby:
        ssc = StreamingContext.getOrCreate(args.checkpoint, create, standby=True, **how)
    else:
        ssc = StreamingContext.getOrCreate(args.checkpoint, create, **how)
    ssc.addStreamingListener(Listener())
    ssc.start()
    if args.standby and ssc.isStandby():
        events.write(json.dumps({"event": "standby", "at": time.time()}) + "\n")
        ssc.awaitLeadership()
    events.write(json.dumps({"event": "started", "at": time.time()}) + "\n")
    ssc.awaitTermination()
    events.write(json.dumps({"event": "stopped", "at": time.time()}) + "\n")


if __name__ == "__main__":
    main()
