"""Deprecated alias: the errors' root lives in the base room, :mod:`sparkwal.base.errors`."""

from sparkwal.base.errors import SparkwalError

__all__ = ["SparkwalError"]
