"""The root of every error sparkwal raises.

Each room has its own root under :class:`SparkwalError`: :class:`sparkwal.wal.WalError` (the WAL
and the storage seam), :class:`sparkwal.checkpoint.CheckpointError` (checkpoints, their logs and
snapshots), :class:`sparkwal.tracker.TrackerError` (block and input tracking) and
:class:`sparkwal.engine.EngineError` (the DStream engine, its receivers, sources and sinks).
``except SparkwalError`` catches whatever sparkwal raised on purpose; an error that is also a kind
Python knows keeps that built-in base (``CheckpointMismatchError`` is a ``ValueError``,
``StreamingContextStateError`` a ``RuntimeError``), so code written against the built-ins still
catches it.
"""

from __future__ import annotations


class SparkwalError(Exception):
    """Base class of every error sparkwal raises."""
