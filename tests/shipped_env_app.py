"""A stateful receiver app on executors whose own Python is bare (no pyarrow, no msgpack, no
sparkwal): ``prepare_conf`` ships the driver's environment.

usage: python shipped_env_app.py MASTER WORKDIR CACHE_DIR LINES
Prints one JSON line: {"totals": word -> count, "workers": [[sys.executable, pyspark.__file__,
PYTHON_UNIX_DOMAIN_ENABLED, sparkwal preimported], ...], "app_id"}.
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import SparkConf, SparkContext  # noqa: E402

from sparkwal.engine import Receiver, StreamingContext, prepare_conf  # noqa: E402

master, workdir, cache, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


class Words(Receiver):
    def __init__(self, count):
        super().__init__()
        self.count = count

    def onStart(self):
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for i in range(0, self.count, 100):
            self.storeMany([f"w{j % 7}" for j in range(i, min(i + 100, self.count))])
            time.sleep(0.05)

    def onStop(self):
        pass


def about_worker(_):
    import os
    import sys

    import pyspark

    return [(sys.executable, pyspark.__file__, os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED"),
             "sparkwal.engine.state.snapshot_tasks" in sys.modules)]


conf = (SparkConf().setMaster(master).setAppName("shipped-env").set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.sparkwal.shipEnvironment", "true")
        .set("spark.sparkwal.shipEnvironment.cacheDir", cache))
sc = SparkContext(conf=prepare_conf(conf))
sc.setLogLevel("ERROR")
ssc = StreamingContext(sc, 1.0)
ssc.checkpoint(os.path.join(workdir, "ckpt"))
latest = {"totals": {}}


def on_totals(rdd):
    latest["totals"] = dict(rdd.collect())  # replaced whole: a stop mid-collect leaves the last totals


(ssc.receiverStream(Words(n)).map(lambda w: (w, 1))
 .updateStateByKey(lambda new, old: sum(new) + (old or 0)).foreachRDD(on_totals))
ssc.start()
deadline = time.monotonic() + 120
while sum(latest["totals"].values()) < n and time.monotonic() < deadline:
    time.sleep(0.2)
totals = latest["totals"]
workers = sc.parallelize(range(4), 4).mapPartitions(about_worker).collect()
app_id = sc.applicationId
ssc.stop(stopSparkContext=True, stopGraceFully=False)
print(json.dumps({"totals": totals, "workers": workers, "app_id": app_id}), flush=True)
