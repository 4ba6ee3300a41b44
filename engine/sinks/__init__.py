"""Exactly-once outputs: transactional sinks that store a batch's results with its offsets."""

from .delta import DeltaSink
from .transactional import DbApiSink, SinkOffsetsError, SQLiteSink

__all__ = ["DbApiSink", "DeltaSink", "SQLiteSink", "SinkOffsetsError"]
