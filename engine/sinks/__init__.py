"""Exactly-once outputs: transactional sinks that store a batch's results with its offsets."""

from .delta import DeltaSink
from .iceberg import IcebergSink
from .kafka import KafkaSink, KafkaSinkError
from .postgres import PostgresSink
from .transactional import DbApiSink, SinkOffsetsError, SQLiteSink

__all__ = ["DbApiSink", "DeltaSink", "IcebergSink", "KafkaSink", "KafkaSinkError", "PostgresSink", "SQLiteSink",
           "SinkOffsetsError"]
