"""The app the Kubernetes manifests beside this file run in both driver pods: the same program,
the same checkpoint on S3; whichever pod holds the checkpoint's lease runs the stream, the other
waits as a hot standby and takes over when it dies. Its settings come from spark-defaults.conf
(the ConfigMap), its credentials from the environment. SIGTERM (a rollout, a drained node) stops
it gracefully; the standby then takes over."""

import os

from pyspark import SparkConf, SparkContext

from sparkwal.engine import StreamingContext, prepare_conf

CHECKPOINT = os.environ["CHECKPOINT"]  # s3://bucket/app
INPUT = os.environ.get("INPUT", "s3://streaming-input/logs")


def create() -> StreamingContext:
    sc = SparkContext.getOrCreate(prepare_conf(SparkConf().setAppName("sparkwal-app")))
    ssc = StreamingContext(sc, 1.0)
    ssc.checkpoint(CHECKPOINT)
    counts = (ssc.textFileStream(INPUT).flatMap(str.split).map(lambda w: (w, 1))
              .updateStateByKey(lambda new, old: sum(new) + (old or 0)))
    counts.foreachRDD(lambda t, rdd: print(t, rdd.takeOrdered(10, key=lambda kv: -kv[1])))
    return ssc


if __name__ == "__main__":
    ssc = StreamingContext.getOrCreate(CHECKPOINT, create, standby=True)
    ssc.start()
    ssc.awaitTermination()
