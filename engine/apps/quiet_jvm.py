"""The main job's JVM, started with its standard error read by the job: the lines Spark and Java
print on every start (a JDK module warning, the shell's log-level hint) are left out unless
``--verbose``, everything else is passed on as it comes. A JVM outliving a driver killed with
SIGKILL writes into a pipe nobody reads: its shutdown errors (``EOF reached before Python server
acknowledged`` and a Java trace) reach no terminal."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

from sparkwal.base.service import spawn

#: lines every start prints that say nothing about this run
NOISE = re.compile(r"WARNING: Using incubator modules: .*|Setting default log level to .*"
                   r"|To adjust logging level use sc\.setLogLevel\(newLevel\)\..*"
                   r"|Using Spark's default log4j profile: .*")


#: set once the job stops on a failure it has named in its one line: the JVM's errors from tasks
#: still running as its context stops (Spark 3.5: a NullPointerException of ``SparkEnv.get()``) are dropped
_stopping = threading.Event()


def stopping_after_failure() -> None:
    """From now on, the JVM's standard error is left out unless ``--verbose``."""
    _stopping.set()


def start_spark(conf, verbose: bool):
    """A SparkContext made from ``conf`` on a JVM whose standard error this process filters."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    _stopping.clear()  # (a new job in this process)
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    spawn("sparkwal-jvm-stderr", _pass_on, gateway.proc.stderr, verbose)
    return SparkContext(conf=conf, gateway=gateway)


def _pass_on(stream, verbose: bool) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if verbose or not (_stopping.is_set() or NOISE.match(line.rstrip("\n"))):
            sys.stderr.write(line)
            sys.stderr.flush()
