"""A program for ``sparkwal upgrade plan``: word totals of a directory, in three versions.

usage: python upgrade_plan_app.py CHECKPOINT INPUT_DIR VERSION [plain]
1: totals (updateStateByKey); 2: a lower-casing step before them, the totals at state version 2
(migrating) and a new line count (mapWithState) ; 3: the totals dropped. It starts its stream and
runs until killed, as a deployed program would (the plan command ends it before that).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark import SparkConf, SparkContext  # noqa: E402

from sparkwal.engine import StateSpec, StreamingContext  # noqa: E402

checkpoint, input_dir, version = sys.argv[1], sys.argv[2], int(sys.argv[3])


def count(key, value, state):
    state.update((state.get() if state.exists() else 0) + value)


def setup():
    conf = SparkConf().setMaster("local[1]").setAppName("upgrade-plan-app").set("spark.ui.enabled", "false")
    ssc = StreamingContext(SparkContext.getOrCreate(conf), 0.5)
    ssc.checkpoint(checkpoint)
    lines = ssc.textFileStream(input_dir)
    if version >= 2:
        lines = lines.map(str.lower)
        lines.map(lambda _: ("lines", 1)).mapWithState(StateSpec.function(count)).pprint()
    if version != 3:
        words = lines.flatMap(str.split).map(lambda w: (w, 1))
        if version == 2:
            totals = words.updateStateByKey(lambda vs, s: {"n": sum(vs) + (s or {"n": 0})["n"]}, numPartitions=3,
                                            stateVersion=2, migrate=lambda v, n: {"n": n})
        else:
            totals = words.updateStateByKey(lambda vs, s: sum(vs) + (s or 0))
        totals.pprint()
    return ssc


ssc = StreamingContext.getOrCreate(checkpoint, setup, upgrade=sys.argv[4:5] != ["plain"])  # plain: a mistake
ssc.start()
print("started", flush=True)
ssc.awaitTermination()
