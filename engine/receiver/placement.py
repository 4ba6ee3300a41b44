"""Where things run: executor identity inside a Python worker, the driver's view of live
executors, and RDDs whose partitions prefer given executors.

PySpark has no Python API for an RDD with preferred locations, so ``rdd_with_locations`` builds
one with Spark core's ``SparkContext.makeRDD(Seq[(T, Seq[String])])`` through py4j, using Spark's
location strings (``executor_<host>_<executorId>`` or a bare host), and wraps it as a Python RDD
of strings.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from pyspark import RDD, SparkContext
from pyspark.serializers import UTF8Deserializer

from sparkwal.tracker import ExecutorCacheTaskLocation, HostTaskLocation

DRIVER_EXECUTOR_ID = "driver"  # local mode: tasks run in the driver's JVM


def _cmdline(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def this_executor(default_host: str) -> ExecutorCacheTaskLocation:
    """The executor running this Python worker: its ``--executor-id`` and ``--hostname``, read
    from the command line of the executor JVM this worker descends from. A worker of a local-mode
    driver (no such JVM) is on executor "driver" at ``default_host``."""
    pid = os.getpid()
    try:
        for _ in range(8):
            pid = _parent(pid)
            if pid <= 1:
                break
            args = _cmdline(pid)
            if b"--executor-id" in args:
                eid = args[args.index(b"--executor-id") + 1].decode()
                host = (args[args.index(b"--hostname") + 1].decode() if b"--hostname" in args
                        else socket.gethostname())
                return ExecutorCacheTaskLocation(host, eid)
    except (OSError, IndexError, ValueError):
        pass
    return ExecutorCacheTaskLocation(default_host, DRIVER_EXECUTOR_ID)


def live_executor_ids(sc: SparkContext) -> set[str] | None:
    """The ids of the executors registered with the driver now, or None in local mode."""
    if sc.master.startswith("local") and not sc.master.startswith("local-cluster"):
        return None
    converters = sc._jvm.scala.collection.JavaConverters
    return set(converters.seqAsJavaListConverter(sc._jsc.sc().getExecutorIds()).asJava())


def location_string(loc: ExecutorCacheTaskLocation | HostTaskLocation) -> str:
    if isinstance(loc, ExecutorCacheTaskLocation):
        return f"executor_{loc.host}_{loc.executor_id}"
    return loc.host


def rdd_with_locations(sc: SparkContext, items: Sequence[str], locations: Sequence[Sequence[str]]) -> RDD:
    """An RDD with one partition per string of ``items``, partition i preferring the Spark
    location strings ``locations[i]`` (Spark falls back to any executor after
    ``spark.locality.wait``)."""
    jvm = sc._jvm
    # Scala's JavaConverters: in Scala 2.12 (Spark 3.5) and 2.13 (Spark 4) alike, where 2.13's
    # scala.jdk.javaapi.CollectionConverters is not in 2.12
    convert = jvm.scala.collection.JavaConverters
    pairs = jvm.java.util.ArrayList()
    for item, locs in zip(items, locations, strict=True):
        jlocs = jvm.java.util.ArrayList()
        for loc in locs:
            jlocs.add(loc)
        pairs.add(jvm.scala.Tuple2(item, convert.asScalaBufferConverter(jlocs).asScala().toSeq()))
    tag = getattr(jvm.scala.reflect, "ClassTag$").__getattr__("MODULE$").apply(
        jvm.java.lang.Class.forName("java.lang.String"))
    jrdd = sc._jsc.sc().makeRDD(convert.asScalaBufferConverter(pairs).asScala().toSeq(), tag)
    return RDD(jvm.org.apache.spark.api.java.JavaRDD(jrdd, tag), sc, UTF8Deserializer())
