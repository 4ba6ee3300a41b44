"""StreamingListener: callbacks on batch progress, as in pyspark.streaming."""

from __future__ import annotations

from dataclasses import dataclass

from tracker import BatchInfo
from tracker.input_info import Time


@dataclass(frozen=True)
class _BatchEvent:
    batch_info: BatchInfo

    def batchInfo(self) -> BatchInfo:  # pyspark's accessor
        return self.batch_info


class StreamingListenerBatchSubmitted(_BatchEvent):
    pass


class StreamingListenerBatchStarted(_BatchEvent):
    pass


class StreamingListenerBatchCompleted(_BatchEvent):
    pass


@dataclass(frozen=True)
class StreamingListenerStreamingStarted:
    time_ms: int

    def time(self) -> int:  # pyspark's accessor
        return self.time_ms


@dataclass(frozen=True)
class OutputOperationInfo:
    """One output operation (e.g. a foreachRDD) of one batch; times in ms, -1 while unknown."""

    batch_time_ms: int
    output_op_id: int
    op_name: str
    start_time_ms: int = -1
    end_time_ms: int = -1
    failure: str | None = None

    # pyspark.streaming's accessors
    def batchTime(self) -> Time:
        return Time(self.batch_time_ms)

    def id(self) -> int:
        return self.output_op_id

    def name(self) -> str:
        return self.op_name

    def description(self) -> str:
        return self.op_name

    def startTime(self) -> int:
        return self.start_time_ms

    def endTime(self) -> int:
        return self.end_time_ms

    def failureReason(self) -> str | None:
        return self.failure

    def duration(self) -> int:
        return -1 if self.end_time_ms < 0 else self.end_time_ms - self.start_time_ms


@dataclass(frozen=True)
class _OutputOperationEvent:
    output_operation_info: OutputOperationInfo

    def outputOperationInfo(self) -> OutputOperationInfo:  # pyspark's accessor
        return self.output_operation_info


class StreamingListenerOutputOperationStarted(_OutputOperationEvent):
    pass


class StreamingListenerOutputOperationCompleted(_OutputOperationEvent):
    pass


class StreamingListener:
    """Override the callbacks you need; they run on the scheduler's threads, so keep them short."""

    def onStreamingStarted(self, streamingStarted) -> None:
        pass

    def onBatchSubmitted(self, batchSubmitted: StreamingListenerBatchSubmitted) -> None:
        pass

    def onBatchStarted(self, batchStarted: StreamingListenerBatchStarted) -> None:
        pass

    def onBatchCompleted(self, batchCompleted: StreamingListenerBatchCompleted) -> None:
        pass

    def onOutputOperationStarted(self, outputOperationStarted) -> None:
        pass

    def onOutputOperationCompleted(self, outputOperationCompleted) -> None:
        pass

    # Receiver callbacks (pyspark.streaming's names): not called until receiver inputs exist.
    def onReceiverStarted(self, receiverStarted) -> None:
        pass

    def onReceiverError(self, receiverError) -> None:
        pass

    def onReceiverStopped(self, receiverStopped) -> None:
        pass
