"""The Spark settings of every JVM the tests start: cheaper to start on two cores.

The tests' JVMs live seconds to a minute each, and most of the suite's time goes to starting them
(drivers killed and restarted, executors killed, local-cluster and standalone workers). Three
settings leave the CPU to the work the tests wait for:

* the client JIT compiler alone (``-XX:TieredStopAtLevel=1``): C2, the compiler for long-lived hot
  code, spends seconds of CPU compiling code a short JVM never runs again;
* the serial collector (no GC threads beside the work);
* for drivers, a class-data-sharing archive of the classes a PySpark driver loads (``-XX:SharedArchiveFile``,
  made once per Java and PySpark by a driver run with ``-XX:ArchiveClassesAtExit``, kept under
  ``~/.cache/sparkwal/test-jvms``): loading Spark's classes from it instead of its jars halves a
  driver's start. Executors are not given it: their class path differs from the driver's, and the
  JVM uses an archive only where the class path matches the one it was made with.

They reach every driver, subprocess drivers included, as the properties file of
``PYSPARK_SUBMIT_ARGS`` (not as ``SPARK_CONF_DIR``: that directory goes on the class path, and the
JVM refuses to archive classes with a non-empty directory on it), and the executors through the
driver's ``spark.executor.defaultJavaOptions``. The library and the benchmarks run with the JVM's
defaults.

``SPARKWAL_TEST_JVM_LOG=DIR`` makes every driver and executor JVM write a file there as it starts
(``driver-<pid>.log``, ``executor-<pid>.log``): how many JVMs a run started, counted with ``ls``.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys

COMMON = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: a mismatched archive is a silent miss, not a warning on every JVM's output
QUIET_ARCHIVE = "-Xlog:cds=off,cds+dynamic=off"
KEEP = 3  # archives kept (one per PySpark the suite runs under)

_DUMP_JOB = """
from pyspark import SparkConf, SparkContext
sc = SparkContext(conf=SparkConf().setMaster("local[2]").setAppName("class-archive")
                  .set("spark.ui.enabled", "false"))
words = sc.parallelize(["a b", "b c"] * 50, 2).flatMap(str.split).map(lambda w: (w, 1))
words.reduceByKey(lambda a, b: a + b).collect()
sc.broadcast([1]).value
sc.parallelize(range(10), 2).cache().count()
jvm = sc._gateway.proc
sc.stop()
jvm.stdin.close()  # the gateway's JVM exits when its standard input closes, and writes the archive
jvm.wait(120)
"""


def submit_args() -> str:
    """``PYSPARK_SUBMIT_ARGS`` naming the tests' properties file (written, with the archive, on
    first use)."""
    import pyspark

    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    cache = os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "sparkwal", "test-jvms")
    os.makedirs(cache, exist_ok=True)
    key = _fingerprint(jars)
    archive = os.path.join(cache, f"driver-{key}.jsa")
    if not os.path.exists(archive):
        _dump(archive)
        for old in sorted(glob.glob(os.path.join(cache, "driver-*.jsa")), key=os.path.getmtime)[:-KEEP]:
            os.unlink(old)  # archives of jars or a Java no longer here, with their settings
            old_key = os.path.basename(old)[len("driver-"):-len(".jsa")]
            for stale in (f"spark-{old_key}.conf", f"spark-{old_key}-counted.conf"):
                if os.path.exists(os.path.join(cache, stale)):
                    os.unlink(os.path.join(cache, stale))
    driver, executor = COMMON, COMMON
    if os.path.exists(archive):
        driver += f" -XX:SharedArchiveFile={archive} {QUIET_ARCHIVE}"
    settings = os.path.join(cache, f"spark-{key}.conf")
    counted = os.path.abspath(os.environ["SPARKWAL_TEST_JVM_LOG"]) if os.environ.get("SPARKWAL_TEST_JVM_LOG") else None
    if counted:  # the JVM's start-up lines of its heap, one file per JVM
        os.makedirs(counted, exist_ok=True)
        driver += f" -Xlog:gc+init=info:file={counted}/driver-%p.log"
        executor += f" -Xlog:gc+init=info:file={counted}/executor-%p.log"
        settings = os.path.join(cache, f"spark-{key}-counted.conf")
    text = f"spark.driver.defaultJavaOptions {driver}\nspark.executor.defaultJavaOptions {executor}\n"
    partial = f"{settings}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, settings)
    return f"--properties-file {settings} pyspark-shell"


def _fingerprint(jars: str) -> str:
    """What an archive is valid for: the Java that runs and the jars it loads (an archive made
    with others would be refused by the JVM)."""
    digest = hashlib.sha256()
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    for path in [os.path.realpath(java or "java"), *sorted(glob.glob(os.path.join(jars, "*.jar")))]:
        st = os.stat(path) if os.path.exists(path) else None
        digest.update(f"{path}\0{st and st.st_size}\0{st and st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _dump(archive: str) -> None:
    """One short driver run that writes the archive of the classes it loaded as its JVM exits
    (about 15 s, once; its output, the JVM's notes on classes it cannot archive, dropped)."""
    partial = f"{archive}.{os.getpid()}.partial"
    dump_settings = f"{partial}.conf"
    with open(dump_settings, "w") as f:
        f.write(f"spark.driver.defaultJavaOptions {COMMON} -XX:ArchiveClassesAtExit={partial}\n")
    env = dict(os.environ, PYSPARK_SUBMIT_ARGS=f"--properties-file {dump_settings} pyspark-shell")
    try:
        subprocess.run([sys.executable, "-c", _DUMP_JOB], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=180, check=False)
        if os.path.exists(partial):
            os.replace(partial, archive)
    except subprocess.TimeoutExpired:
        pass  # no archive: drivers start without one
    finally:
        for leftover in (partial, dump_settings):
            if os.path.exists(leftover):
                os.unlink(leftover)


def submit_args_with(extra: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a subprocess driver that needs settings of its own (``extra``,
    spark-submit's options) and keeps the cheaper JVM of every other driver the tests start."""
    ours = os.environ.get("PYSPARK_SUBMIT_ARGS") or submit_args()
    return f"{ours.removesuffix('pyspark-shell').strip()} {extra} pyspark-shell"
