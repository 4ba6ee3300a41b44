"""Exactly-once outputs: transactional sinks that store a batch's results with its offsets."""

from .delta import DeltaSink
from .postgres import PostgresSink
from .transactional import DbApiSink, SinkOffsetsError, SQLiteSink

__all__ = ["DbApiSink", "DeltaSink", "PostgresSink", "SQLiteSink", "SinkOffsetsError"]
