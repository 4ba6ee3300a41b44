"""A ported app as a user writes it (no log level, no settings of its own), for the console test.

usage: python console_app.py failing            a batch's Spark job fails in the JVM
       python console_app.py recover CHECKPOINT  getOrCreate on another application's checkpoint
Prints one JSON line ``{"event": "started", "logLevel"}`` once the stream runs, then lets any error
end it as an uncaught one would.
"""

import json
import sys

from pyspark import SparkConf, SparkContext

from sparkwal import StreamingContext

conf = (SparkConf().setMaster("local[2]").setAppName("console-app").set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1"))
sc = SparkContext(conf=conf)


def setup():
    ssc = StreamingContext(sc, 0.5)
    ssc.queueStream([sc.textFile("/nonexistent/sparkwal-console-input")]).count().pprint()
    return ssc


ssc = StreamingContext.getOrCreate(sys.argv[2], setup) if sys.argv[1] == "recover" else setup()
ssc.start()
level = str(sc._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
print(json.dumps({"event": "started", "logLevel": level}), flush=True)
ssc.awaitTermination(60)
