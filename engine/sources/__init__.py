"""Direct (receiver-less) sources: replayable by offset range, read by tasks, exactly once with
the batch protocol of :mod:`sparkwal.engine.sources.batch_log`."""

from .batch_log import BatchLog, BatchLogStatistics
from .direct import DirectInputDStream
from .filelog import FileLogSource
from .protocol import (DataLossError, OffsetRange, ReplayableSource, SinkOffsets, SourceError,
                       TopicPartition)

__all__ = ["BatchLog", "BatchLogStatistics", "DataLossError", "DirectInputDStream", "FileLogSource",
           "OffsetRange", "ReplayableSource", "SinkOffsets", "SourceError", "TopicPartition"]
