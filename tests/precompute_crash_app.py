"""A driver for the precompute crash test: lines from an AckedLineSource, each counted under its
id (``r<i>``) by ``map`` + ``reduceByKey`` with ``spark.sparkwal.receiver.precompute`` on, each
batch's counts written to ``out/<batch ms>.json`` atomically (a re-run batch replaces its file);
before that, ``foreachBlock`` appends each block's counts to ``out/blocks.log`` as one JSON line
(``{"block", "rows"}``) as soon as the block is recorded.

usage: python precompute_crash_app.py WORKDIR PORT   (the source's secret in SPARKWAL_SOURCE_SECRET)
Prints JSON lines: {"event": "batch", "ms", "precomputed"} per completed batch; runs until killed.
"""

import json
import operator
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark import SparkConf, SparkContext  # noqa: E402

from sparkwal.engine import StreamingContext, StreamingListener  # noqa: E402
from sparkwal.engine.receiver.acked_lines import AckedLineReceiver  # noqa: E402

workdir, port = sys.argv[1], int(sys.argv[2])
out = os.path.join(workdir, "out")
os.makedirs(out, exist_ok=True)


def save(t, rdd):
    counts = dict(rdd.collect())
    if counts:
        path = os.path.join(out, f"{int(t.timestamp() * 1000)}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(counts, f)
        os.replace(path + ".tmp", path)


def append_block(t, block_id, rdd):
    line = json.dumps({"block": block_id, "rows": sorted(rdd.collect())}) + "\n"
    fd = os.open(os.path.join(out, "blocks.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def setup():
    ssc = StreamingContext(sc, 0.5)
    ssc.checkpoint(os.path.join(workdir, "ckpt"))
    lines = ssc.receiverStream(AckedLineReceiver("127.0.0.1", port, secret_env="SPARKWAL_SOURCE_SECRET"))
    counts = lines.map(lambda line: (line.split()[0], 1)).reduceByKey(operator.add)
    counts.foreachBlock(append_block)  # (first: a batch's blocks are all out before its counts' file)
    counts.foreachRDD(save)
    return ssc


class Batches(StreamingListener):
    def onBatchCompleted(self, e):
        info = e.batchInfo()
        precomputed = any(i.metadata.get("precomputed") for i in info.streamIdToInputInfo().values())
        print(json.dumps({"event": "batch", "ms": info.batchTime().milliseconds(), "precomputed": precomputed}),
              flush=True)


conf = (SparkConf().setMaster("local[2]").setAppName("precompute-crash").set("spark.ui.enabled", "false")
        .set("spark.sparkwal.receiver.precompute", "true"))
sc = SparkContext(conf=conf)
sc.setLogLevel("ERROR")
ssc = StreamingContext.getOrCreate(os.path.join(workdir, "ckpt"), setup)
ssc.addStreamingListener(Batches())
ssc.start()
ssc.awaitTermination()
