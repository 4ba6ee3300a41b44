"""A ported app as a user writes it (no log level, no settings of its own), for the console test.

usage: python console_app.py failing            a batch's Spark job fails in the JVM
       python console_app.py task               a task of a batch fails in the app's own function
       python console_app.py session-task       the same with a SparkSession (PySpark's captured errors)
       python console_app.py recover CHECKPOINT  getOrCreate on another application's checkpoint
       python console_app.py stop               a stream started and stopped, the SparkContext kept
Prints one JSON line ``{"event": "started", "logLevel", "threshold"}`` once the stream runs (and
``"stopped"`` after the stop), then lets any error end it as an uncaught one would.
"""

import json
import sys

from pyspark import SparkConf, SparkContext

from sparkwal import StreamingContext

conf = (SparkConf().setMaster("local[2]").setAppName("console-app").set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1"))
sc = SparkContext(conf=conf)


def divide(x):
    return 1 / (x - x)


def setup():
    ssc = StreamingContext(sc, 0.5)
    if sys.argv[1] == "session-task":
        from pyspark.sql import SparkSession

        SparkSession.builder.getOrCreate()  # PySpark turns a failed job into its own PythonException from now on
    if sys.argv[1] in ("task", "session-task"):
        ssc.queueStream([sc.parallelize(range(4), 2)]).map(divide).count().pprint()
    else:
        ssc.queueStream([sc.textFile("/nonexistent/sparkwal-console-input")]).count().pprint()
    return ssc


def say(event: str) -> None:
    level = sc._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel()
    threshold = getattr(getattr(sc._jvm.org.apache.spark.internal, "Logging$"), "MODULE$").sparkShellThresholdLevel()
    print(json.dumps({"event": event, "logLevel": str(level), "threshold": threshold and str(threshold)}), flush=True)


if sys.argv[1] == "stop":
    ssc = StreamingContext(sc, 0.5)
    ssc.queueStream([], default=sc.parallelize([], 1)).count().pprint()
else:
    ssc = StreamingContext.getOrCreate(sys.argv[2], setup) if sys.argv[1] == "recover" else setup()
ssc.start()
say("started")
if sys.argv[1] == "stop":
    ssc.stop(stopSparkContext=False)
    say("stopped")
    sc.stop()
else:
    ssc.awaitTermination(60)
