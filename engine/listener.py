"""StreamingListener: callbacks on batch progress, as in pyspark.streaming."""

from __future__ import annotations

from dataclasses import dataclass

from tracker import BatchInfo
from tracker.input_info import OutputOperationInfo


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
