"""sparkwal: Spark Streaming's fault tolerance and storage, rebuilt in Python on PySpark.

Port a ``pyspark.streaming`` app by changing its import::

    from sparkwal import StreamingContext   # was: from pyspark.streaming import StreamingContext

The top holds pyspark.streaming's public names (``StreamingContext``, ``DStream``,
``StreamingListener``); the rest lives in the rooms: :mod:`sparkwal.engine` (the DStream engine:
receivers, direct sources, sinks, state), :mod:`sparkwal.checkpoint`, :mod:`sparkwal.tracker` and
:mod:`sparkwal.wal`. The ``sparkwal`` command is :mod:`sparkwal.cli`. Names are looked up on first
use, so importing ``sparkwal`` (the command does) starts no PySpark.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

from sparkwal.base.errors import SparkwalError


try:
    __version__ = version("sparkwal")
except PackageNotFoundError:  # run from a checkout that was not installed
    __version__ = "0+unknown"

#: pyspark.streaming's public names, from the engine
_ENGINE_NAMES = ("StreamingContext", "DStream", "StreamingListener")

__all__ = ["SparkwalError", "__version__", *_ENGINE_NAMES]


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        value = getattr(import_module("sparkwal.engine"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sparkwal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENGINE_NAMES})
