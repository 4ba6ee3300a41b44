"""A stateful app as a user ports it from pyspark.streaming: no PYSPARK_PYTHON of its own, its
own SparkContext, started as ``.venv/bin/python port_app.py`` (the virtualenv not activated).

usage: python port_app.py WORKDIR BATCHES [KEY=VALUE ...]   (Spark conf entries)
Prints JSON lines: {"event": "started", "python"}, {"event": "batch", "ms", "totals"} per
completed batch, {"event": "error", "type", "message"} if start() fails (exit 3), and
{"event": "stopped"} at the end. Stops itself after BATCHES batches (0: runs until stopped, by a
signal with spark.streaming.stopGracefullyOnShutdown=true), or after 120 s.
"""

import json
import os
import sys
import threading

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import SparkConf, SparkContext  # noqa: E402

from sparkwal.engine import StreamingContext, StreamingListener  # noqa: E402

workdir, batches = sys.argv[1], int(sys.argv[2])
conf = (SparkConf().setMaster("local[2]").setAppName("port-app").set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1"))
for arg in sys.argv[3:]:
    key, _, value = arg.partition("=")
    conf.set(key, value)
sc = SparkContext.getOrCreate(conf)
sc.setLogLevel("ERROR")
ssc = StreamingContext(sc, 0.5)
ssc.checkpoint(os.path.join(workdir, "ckpt"))
lines = ssc.queueStream([["a b", "b"], ["a"], ["c"]], default=sc.parallelize([], 1))
totals = lines.flatMap(str.split).map(lambda w: (w, 1)).updateStateByKey(
    lambda new, old: sum(new) + (old or 0))
seen = {}
totals.foreachRDD(lambda t, rdd: seen.__setitem__(int(t.timestamp() * 1000), dict(rdd.collect())))


done = threading.Event()


class Batches(StreamingListener):
    completed = 0

    def onBatchCompleted(self, batchCompleted):
        ms = batchCompleted.batchInfo().batch_time_ms
        print(json.dumps({"event": "batch", "ms": ms, "totals": seen.get(ms)}), flush=True)
        self.completed += 1
        if self.completed == batches:
            done.set()


ssc.addStreamingListener(Batches())
try:
    ssc.start()
except Exception as e:  # noqa: BLE001  the test reads the error's type and message
    print(json.dumps({"event": "error", "type": type(e).__name__, "message": str(e)}), flush=True)
    sc.stop()
    sys.exit(3)
print(json.dumps({"event": "started", "python": sc.pythonExec}), flush=True)
for _ in range(600):
    if done.is_set() or ssc.awaitTerminationOrTimeout(0.2):
        break
ssc.stop()
print(json.dumps({"event": "stopped"}), flush=True)
