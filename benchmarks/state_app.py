"""One stateful word count for :mod:`benchmarks.state_bench`, in its own process (so that it can
be SIGKILLed and restarted with ``getOrCreate``):

    python -m benchmarks.state_app --engine {pyspark,sparkwal} --op {update,map,shuffle}
        --input DIR --checkpoint DIR --batch SECONDS --events FILE [--partitions N] [--standby]
        [--conf KEY=VALUE ...] [--storage-option KEY=VALUE ...]

sparkwal's checkpoint may be any fsspec URL (``--storage-option`` as the main job's).

Lines of a file stream are keys; the state is each key's count (``updateStateByKey``, or
sparkwal's ``mapWithState``), snapshotted every two batches. The output counts the stream's
records each batch: updateStateByKey's are the whole state, mapWithState's the touched keys.
``--op shuffle`` keeps no state: the batch's records moved to their keys' partitions and counted,
the floor under any stateful batch of the same data. Each completed batch appends a JSON
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["pyspark", "sparkwal"], required=True)
    p.add_argument("--op", choices=["update", "map", "shuffle"], default="update")
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
        lines = ssc.textFileStream(args.input)
        pairs = (lines.filter(bool) if args.version == 2 else lines).map(lambda k: (k, 1))
        if args.op == "map":  # its output: the batch's mapped records (the keys it touched)
            out = pairs.mapWithState(StateSpec.function(count_map).numPartitions(n))
        elif args.op == "shuffle":  # no state: the batch moved to its keys' partitions, a floor
            out = pairs.partitionBy(n)
        else:  # its output: the state, every key (what updateStateByKey gives)
            out = pairs.updateStateByKey(count_update, numPartitions=n)
        if args.op != "shuffle":
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
