"""A stateful app for crash tests of a state held on the driver: lines ``r<id> <key>`` from an
AckedLineSource (reliable receiver, receiver WAL on, ``spark.sparkwal.receiver.precompute``),
counted per key by ``reduceByKey`` then ``mapWithState``, whose state stays on the driver while it
is small; snapshotted every second.

    python tests/driver_state_crash_app.py WORKDIR PORT TOTAL_LINES [standby]

The source's secret is in the environment variable ``DRIVER_STATE_SECRET``. The app appends to
WORKDIR/batches.jsonl, per batch with records, whether its state was held on the driver (and its
process id, which names the run), and stops
once the state counts TOTAL_LINES, after writing it to WORKDIR/final.json. Tests SIGKILL it at
random moments, or inside a batch held by WORKDIR/hold, and run it again: a restart must restore the
state exactly. With ``standby``, it waits as a hot standby, to take over by a handover.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SECRET_ENV = "DRIVER_STATE_SECRET"


def count(key, value, state):
    total = (state.getOption() or 0) + value
    state.update(total)
    return key, total


def hold_until_released(workdir: str) -> None:
    """The test's way to kill the driver inside a batch with records: while WORKDIR/hold exists, a
    batch's output waits (after saying so in WORKDIR/held), so the batch is never completed."""
    import time

    open(os.path.join(workdir, "held"), "w").close()
    while os.path.exists(os.path.join(workdir, "hold")):
        time.sleep(0.05)


def setup(sc, workdir: str, port: int, total: int):
    from sparkwal.engine import StateSpec, StreamingContext
    from sparkwal.engine.driver_rows import DriverRowsRDD
    from sparkwal.engine.receiver.acked_lines import AckedLineReceiver

    def create():
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(os.path.join(workdir, "ckpt"))
        lines = ssc.receiverStream(AckedLineReceiver("127.0.0.1", port, secret_env=SECRET_ENV))
        counts = lines.map(str.split).map(lambda ws: (ws[1], 1)).reduceByKey(lambda a, b: a + b)
        mapped = counts.mapWithState(StateSpec.function(count).numPartitions(3)).checkpoint(1.0)
        final = os.path.join(workdir, "final.json")

        def note(t, rdd):
            rows = rdd.collect()
            if rows and os.path.exists(os.path.join(workdir, "hold")):
                hold_until_released(workdir)
            if rows:
                with open(os.path.join(workdir, "batches.jsonl"), "a") as f:
                    f.write(json.dumps({"batch_ms": int(t.timestamp() * 1000), "keys": len(rows), "run": os.getpid(),
                                        "on_driver": isinstance(rdd, DriverRowsRDD)}) + "\n")

        def done(rdd):
            state = dict(rdd.collect())
            if sum(state.values()) >= total:
                with open(final + ".tmp", "w") as f:
                    json.dump(state, f)
                os.replace(final + ".tmp", final)

        mapped.foreachRDD(note)
        mapped.stateSnapshots().foreachRDD(done)
        return ssc
    return create


def main() -> None:
    workdir, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import logging

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("sparkwal.engine.state.driver_state").setLevel(logging.INFO)  # where the state moves
    logging.getLogger("sparkwal.engine.receiver").setLevel(logging.INFO)
    logging.getLogger("driver_state_crash_app").warning("run %d starts", os.getpid())
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName("driver-state-crash")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.streaming.receiver.writeAheadLog.enable", "true")
            .set("spark.sparkwal.receiver.precompute", "true")
            .set("spark.streaming.blockInterval", "200ms")
            .set("spark.sparkwal.state.deltasPerFull", "3"))  # (local: the workers inherit the secret)
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    from state_crash_app import run_until_final  # (this script's folder; the driver's alone)

    run_until_final(workdir, setup(sc, workdir, port, total), standby=sys.argv[4:] == ["standby"])


if __name__ == "__main__":
    main()
