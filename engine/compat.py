"""What the running Spark offers, for sparkwal to run on every Spark from 3.5 to the newest 4.x.

sparkwal uses a few things only newer Sparks have; each is asked for here by name, and on a Spark
without it sparkwal falls back to what that Spark does, saying so once per process in one log line.
Everything else (receivers and their WAL, executor recovery, direct sources and sinks, state and
snapshots, the hot standby, the UI and metrics, shipped environments, storage faults) works the
same on all of them.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger(__name__)

#: feature -> (the first Spark version with it, what sparkwal does without it)
FEATURES = {
    # spark.python.unix.domain.socket.enabled (SPARK-47769 and followers)
    "unix_socket_workers": ((4, 1), "Python workers talk to their executor over loopback TCP "
                                    "(spark.python.unix.domain.socket.enabled needs Spark 4.1)"),
}

_said: set[str] = set()
_lock = threading.Lock()


def version_of(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``3.5.0`` or ``4.1.0.dev1``."""
    m = re.match(r"(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"not a Spark version: {text!r}")
    return int(m.group(1)), int(m.group(2))


def spark_version(sc=None) -> tuple[int, int]:
    """The running Spark's version (the SparkContext's; PySpark's when there is none)."""
    if sc is not None:
        return version_of(sc.version)
    import pyspark

    return version_of(pyspark.__version__)


def supports(feature: str, sc=None) -> bool:
    """Whether the running Spark has ``feature`` (one of :data:`FEATURES`); the first time it has
    not, one line says what sparkwal does instead."""
    first, fallback = FEATURES[feature]
    version = spark_version(sc)
    if version >= first:
        return True
    with _lock:
        if feature not in _said:
            _said.add(feature)
            log.warning("Spark %d.%d: %s", *version, fallback)
    return False
