"""A receiver without the WAL on a cluster (``local-cluster[2,1,1024]``: two executor JVMs of one
core each), so the receiver's task fills its executor and every batch task runs on the other one.

usage: python block_fetch_app.py MASTER LINES REPLICATION
Prints one JSON line: {"lines": distinct lines counted, "total": lines counted,
"receiver_executor", "reading_executors", "failed_batches"}.
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import SparkConf, SparkContext, StorageLevel  # noqa: E402

from sparkwal.engine import Receiver, StreamingContext, StreamingListener  # noqa: E402

master, n, replication = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


class Numbers(Receiver):
    def __init__(self, count: int, level):
        super().__init__(level)
        self.count = count

    def onStart(self):
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for i in range(0, self.count, 200):
            self.storeMany([f"l{j}" for j in range(i, min(i + 200, self.count))])
            time.sleep(0.05)

    def onStop(self):
        pass


def where(rows):
    from sparkwal.engine.receiver.placement import this_executor

    lines = list(rows)
    return [(this_executor("127.0.0.1").executor_id, lines)]


conf = (SparkConf().setMaster(master).setAppName("block-fetch").set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.locality.wait", "0"))
sc = SparkContext(conf=conf)
sc.setLogLevel("ERROR")
ssc = StreamingContext(sc, 1.0)
level = StorageLevel.MEMORY_AND_DISK if replication == 1 else StorageLevel.MEMORY_AND_DISK_2
counted, readers, state = [], set(), {"receiver": None, "failed": 0}
done = threading.Event()


def on_batch(rdd):
    try:
        found = rdd.mapPartitions(where).collect()
    except Exception:
        state["failed"] += 1
        raise
    for executor, lines in found:
        readers.add(executor)
        counted.extend(lines)
    if len(counted) >= n:
        done.set()


class Watch(StreamingListener):
    def onReceiverStarted(self, started):
        state["receiver"] = started.receiverInfo().executorId()


ssc.receiverStream(Numbers(n, level)).foreachRDD(on_batch)
ssc.addStreamingListener(Watch())
ssc.start()
done.wait(90)
ssc.stop(stopSparkContext=True, stopGraceFully=False)
print(json.dumps({"lines": len(set(counted)), "total": len(counted), "receiver_executor": state["receiver"],
                  "reading_executors": sorted(readers), "failed_batches": state["failed"]}), flush=True)
