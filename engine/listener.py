"""StreamingListener: callbacks on batch progress, as in pyspark.streaming."""

from __future__ import annotations

from dataclasses import dataclass

from tracker import BatchInfo


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
