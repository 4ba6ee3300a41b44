"""A stateful app for crash tests: lines ``key`` of a FileLogSource (written beforehand), counted
per key by mapWithState and by updateStateByKey, both snapshotted every batch (delta chains of
up to three deltas), at a capped rate so that the run spans many batches.

    python tests/state_crash_app.py WORKDIR TOTAL_LINES [VERSION [standby]]

It stops once both states count TOTAL_LINES, after writing them to WORKDIR/final.json. Tests
SIGKILL it at random moments and run it again: a restart must restore both states exactly.
VERSION 2 is a new version of the program, started with ``getOrCreate(..., upgrade=True)``: a
step added before both states (every stream moves), mapWithState in 6 partitions instead of 4, and
updateStateByKey's values ``{"n": count}`` at state version 2, migrating version 1's counts. It
writes WORKDIR/started-<pid> (holding its PySpark's version) once its stream has started (a
standby: once it stands by, and WORKDIR/leads-<pid> once it took over).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def count(key, value, state):
    state.update((state.getOption() or 0) + value)


def number(value) -> int:
    return value["n"] if isinstance(value, dict) else value


def setup(sc, workdir: str, total: int, version: int = 1):
    from sparkwal.engine import StateSpec, StreamingContext
    from sparkwal.engine.sources import FileLogSource

    def create():
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(os.path.join(workdir, "ckpt"))
        lines = ssc.directStream(FileLogSource(os.path.join(workdir, "log")))
        pairs = (lines if version == 1 else lines.filter(bool)).map(lambda k: (k, 1))
        mapped = pairs.mapWithState(StateSpec.function(count).numPartitions(4 if version == 1 else 6)).checkpoint(0.5)
        if version == 1:
            totals = pairs.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(0.5)
        else:
            totals = pairs.updateStateByKey(lambda vs, s: {"n": sum(vs) + (s["n"] if s else 0)}, stateVersion=2,
                                            migrate=lambda _v, n: {"n": n}).checkpoint(0.5)
        final = os.path.join(workdir, "final.json")

        def check(_t, a, b):  # both states, joined into one RDD so that one job sees both
            return a.map(lambda kv: ("m", kv)).union(b.map(lambda kv: ("u", kv)))

        def done(rdd):  # the sums in the executors; the states themselves once complete
            sums = dict(rdd.map(lambda r: (r[0], number(r[1][1]))).reduceByKey(lambda a, b: a + b).collect())
            if sums.get("m", 0) < total or sums.get("u", 0) < total:
                return
            states = {"m": {}, "u": {}}
            for which, (k, v) in rdd.collect():
                states[which][k] = number(v)
            with open(final + ".tmp", "w") as f:
                json.dump(states, f)
            os.replace(final + ".tmp", final)

        mapped.stateSnapshots().transformWith(check, totals).foreachRDD(done)
        return ssc
    return create


def main() -> None:
    workdir, total = sys.argv[1], int(sys.argv[2])
    version = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    standby = sys.argv[4:5] == ["standby"]
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName("state-crash")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.streaming.direct.maxRatePerPartition", os.environ.get("STATE_CRASH_RATE", "5000"))
            .set("spark.sparkwal.state.deltasPerFull", "3"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    run_until_final(workdir, setup(sc, workdir, total, version), upgrade=version > 1, standby=standby)


def run_until_final(workdir: str, create, upgrade: bool = False, standby: bool = False) -> None:
    """Run the app of WORKDIR/ckpt (``create`` makes a new one) until WORKDIR/final.json exists."""
    from sparkwal.engine import StreamingContext

    ssc = StreamingContext.getOrCreate(os.path.join(workdir, "ckpt"), create, upgrade=upgrade, standby=standby)
    ssc.start()
    import pyspark

    with open(os.path.join(workdir, f"started-{os.getpid()}"), "w") as f:
        f.write(pyspark.__version__)
    if standby:
        ssc.awaitLeadership()
        open(os.path.join(workdir, f"leads-{os.getpid()}"), "w").close()
    final = os.path.join(workdir, "final.json")
    while not os.path.exists(final) and not ssc.awaitTerminationOrTimeout(0.1):
        pass
    ssc.stop(stopSparkContext=True, stopGraceFully=False)


if __name__ == "__main__":
    main()
