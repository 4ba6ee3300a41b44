"""A driver for the recovery tests, shaped like Spark's recoverable_network_wordcount example:
its setup function starts a fresh output file and announces a new context, so it must run only
when there is no checkpoint. Per-batch word counts are appended to the output file, running
totals (updateStateByKey) are written per batch.

usage: python recoverable_app.py WORKDIR [upgrade]
Prints JSON lines: {"event": "context", "recovery": ...} once, {"event": "batch", "ms": ...} per
completed batch. Runs until killed or stdin closes.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark import SparkConf, SparkContext  # noqa: E402

from sparkwal.engine import StreamingContext, StreamingListener  # noqa: E402

workdir = sys.argv[1]
upgrade = len(sys.argv) > 2 and sys.argv[2] == "upgrade"
input_dir, output_path = os.path.join(workdir, "in"), os.path.join(workdir, "out.txt")
checkpoint = os.path.join(workdir, "ckpt")


def append_counts(path, t, rdd):
    counts = sorted(rdd.collect())
    if counts:
        with open(path, "a") as f:
            f.write(json.dumps({"ms": int(t.timestamp() * 1000), "counts": counts}) + "\n")


def save_totals(directory, t, rdd):
    totals = dict(rdd.collect())
    if totals:
        tmp = os.path.join(directory, ".totals.tmp")
        with open(tmp, "w") as f:
            json.dump({"ms": int(t.timestamp() * 1000), "totals": totals}, f)
        os.replace(tmp, os.path.join(directory, "totals.json"))


def create_context():
    print(json.dumps({"event": "setup"}), flush=True)  # "Creating new context"
    if os.path.exists(output_path):
        os.remove(output_path)  # as Spark's example does: a new context starts a new output
    sc = SparkContext.getOrCreate(SparkConf().setMaster("local[2]").setAppName("recoverable")
                                  .set("spark.ui.enabled", "false"))
    ssc = StreamingContext(sc, 0.5)
    words = ssc.textFileStream(input_dir).flatMap(str.split).map(lambda w: (w, 1))
    counts = words.reduceByKey(lambda a, b: a + b)
    counts.foreachRDD(lambda t, rdd: append_counts(output_path, t, rdd))
    totals = counts.updateStateByKey(lambda new, old: sum(new) + (old or 0)).checkpoint(1.0)
    totals.foreachRDD(lambda t, rdd: save_totals(workdir, t, rdd))
    return ssc


class Batches(StreamingListener):
    def onBatchCompleted(self, batchCompleted):
        print(json.dumps({"event": "batch", "ms": batchCompleted.batchInfo().batch_time_ms}), flush=True)


ssc = StreamingContext.getOrCreate(checkpoint, create_context, upgrade=upgrade)
print(json.dumps({"event": "context", "recovery": ssc.recovery}), flush=True)
ssc.addStreamingListener(Batches())
ssc.start()
sys.stdin.read()
ssc.stop(stopSparkContext=True, stopGraceFully=False)
