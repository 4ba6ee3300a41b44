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

import importlib.util
import sys
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version


def _not_installed() -> str:
    """What a Python that found this folder but not the rooms mapped under it (a checkout that was
    not installed: ``python3 -m sparkwal...`` outside the virtualenv) lacks, and how to get it."""
    missing = [name for name in ("pyspark",) if importlib.util.find_spec(name) is None] + ["sparkwal"]
    return (f"this Python ({sys.executable}) lacks {', '.join(missing)}: run it from the virtualenv the README "
            "sets up (.venv/bin/python), or pip install -e . in the checkout")


try:
    from sparkwal.base.errors import SparkwalError
except ModuleNotFoundError as e:
    if not (e.name or "").startswith("sparkwal."):
        raise
    if sys.argv[:1] == ["-m"]:  # (python -m names its module only once it is found)
        print(f"sparkwal: error: {_not_installed()}", file=sys.stderr)
        raise SystemExit(2) from None
    raise ImportError(_not_installed()) from None

try:
    __version__ = version("sparkwal")
except PackageNotFoundError:  # an install without its metadata
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
