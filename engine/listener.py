"""StreamingListener: callbacks on batch progress, as in pyspark.streaming."""

from __future__ import annotations

from dataclasses import dataclass

from sparkwal.tracker import BatchInfo
from sparkwal.tracker.input_info import OutputOperationInfo


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


@dataclass(frozen=True)
class StreamingListenerBatchCommitted:
    """sparkwal's event: ``commits/<batchId>`` is durable (every output of the batch succeeded,
    and every earlier batch is committed); a restart never runs this batch's outputs again."""

    batch_id: int
    batch_time_ms: int

    def batchId(self) -> int:
        return self.batch_id

    def batchTime(self) -> int:
        return self.batch_time_ms


@dataclass(frozen=True)
class StreamingListenerDriverTakeover:
    """sparkwal's event: a standby became the active driver. ``resumed_from_ms``: the batch time
    of the checkpoint it resumed from (None: there was none yet); ``took_ms``: from holding the
    leadership to running (the checkpoint read, the state restored, the batches queued);
    ``rerun_batch_times``: the batches it re-runs with their logged inputs."""

    epoch: int
    resumed_from_ms: int | None
    took_ms: int
    rerun_batch_times: tuple[int, ...]

    def epochNumber(self) -> int:
        return self.epoch

    def resumedFrom(self) -> int | None:
        return self.resumed_from_ms

    def takeoverTime(self) -> int:
        return self.took_ms

    def rerunBatchTimes(self) -> tuple[int, ...]:
        return self.rerun_batch_times


@dataclass(frozen=True)
class StreamingListenerStandbyReady:
    """sparkwal's event: a standby is hot. Its warm-up is done and the state of the newest
    checkpoint it read (``checkpoint_time_ms``; None: none yet) is cached in its executors.
    ``took_ms`` is from its ``start()``. Posted once. A takeover before it still works, but
    starts colder."""

    checkpoint_time_ms: int | None
    took_ms: int

    def checkpointTime(self) -> int | None:
        return self.checkpoint_time_ms

    def readyTime(self) -> int:
        return self.took_ms


@dataclass(frozen=True)
class StreamingListenerBacklog:
    """sparkwal's event: the batches' scheduling delay passed ``spark.sparkwal.backlog.warnIntervals``
    batch intervals while batches run faster than the interval (``state`` "catching_up") or not
    (``"falling_behind"``), is still growing (``"still_behind"``, at most once a minute) or came
    back under one interval (``"caught_up"``): :mod:`sparkwal.engine.driver.backlog`. ``backlog``: batches due and
    not yet started when it was measured; ``batch_time_ms``: the batch that measured it."""

    state: str
    scheduling_delay_ms: int
    backlog: int
    batch_time_ms: int

    def schedulingDelay(self) -> int:
        return self.scheduling_delay_ms


@dataclass(frozen=True)
class StreamingListenerCheckpointWritten:
    """sparkwal's event: the DStream checkpoint of ``checkpoint_time_ms`` is durable (written at
    the driver's leadership ``epoch``; None: not leading), ``took_ms`` after it was handed to the
    writer. Posted on the checkpoint writer's thread."""

    checkpoint_time_ms: int
    epoch: int | None
    took_ms: int
    bytes: int = 0  #: the checkpoint file's size

    def checkpointTime(self) -> int:
        return self.checkpoint_time_ms


@dataclass(frozen=True)
class StreamingListenerDriverRestarted:
    """sparkwal's event: this driver started from a checkpoint directory that held a stream
    (``recovery``: "checkpoint", "upgrade" or "takeover"; ``checkpoint_time_ms`` None: only the
    batch log was there). ``rerun_batch_times`` re-run; ``skipped_batch_times`` were committed
    and do not output again; ``upgrade_plan``: an upgrade to a changed graph's plan, a line per
    input and stateful operator (carried, new, dropped)."""

    recovery: str
    checkpoint_time_ms: int | None
    rerun_batch_times: tuple[int, ...]
    skipped_batch_times: tuple[int, ...]
    upgrade_plan: tuple[str, ...] = ()


@dataclass(frozen=True)
class StreamingListenerDriverFenced:
    """sparkwal's event: this driver lost the leadership of its checkpoint directory (another
    driver leads at a newer epoch); it stops running and writing at once."""

    reason: str


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

    def onBatchCommitted(self, batchCommitted: StreamingListenerBatchCommitted) -> None:
        """sparkwal's: a batch's commit is durable (contexts with a checkpoint)."""

    def onDriverTakeover(self, driverTakeover: StreamingListenerDriverTakeover) -> None:
        """sparkwal's: this context, a standby, took the stream over (see engine.driver.standby)."""

    def onStandbyReady(self, standbyReady: StreamingListenerStandbyReady) -> None:
        """sparkwal's: this context, a standby, is hot (see engine.driver.standby)."""

    def onBacklog(self, backlog: StreamingListenerBacklog) -> None:
        """sparkwal's: the app fell behind, is still behind, or caught up (see engine.driver.backlog)."""

    def onCheckpointWritten(self, checkpointWritten: StreamingListenerCheckpointWritten) -> None:
        """sparkwal's: a DStream checkpoint is durable."""

    def onDriverRestarted(self, driverRestarted: StreamingListenerDriverRestarted) -> None:
        """sparkwal's: this driver resumed a stream from its checkpoint directory."""

    def onDriverFenced(self, driverFenced: StreamingListenerDriverFenced) -> None:
        """sparkwal's: this driver was fenced (another leads its checkpoint directory)."""

    # Receiver callbacks (pyspark.streaming's names), with a ReceiverInfo in each event.
    def onReceiverStarted(self, receiverStarted) -> None:
        pass

    def onReceiverError(self, receiverError) -> None:
        pass

    def onReceiverStopped(self, receiverStopped) -> None:
        pass


@dataclass(frozen=True)
class ReceiverInfo:
    """A receiver as the driver sees it (pyspark.streaming's ``ReceiverInfo`` accessors)."""

    stream_id: int
    name_: str
    active_: bool
    location_: str
    executor_id_: str
    last_error_message: str = ""
    last_error: str = ""
    last_error_time_ms: int = -1
    worker_pid: int = -1  #: the receiver's Python worker process (on its executor's machine)

    def streamId(self) -> int:
        return self.stream_id

    def name(self) -> str:
        return self.name_

    def active(self) -> bool:
        return self.active_

    def location(self) -> str:
        return self.location_

    def executorId(self) -> str:
        return self.executor_id_

    def lastErrorMessage(self) -> str:
        return self.last_error_message

    def lastError(self) -> str:
        return self.last_error

    def lastErrorTime(self) -> int:
        return self.last_error_time_ms


@dataclass(frozen=True)
class _ReceiverEvent:
    receiver_info: ReceiverInfo

    def receiverInfo(self) -> ReceiverInfo:  # pyspark's accessor
        return self.receiver_info


class StreamingListenerReceiverStarted(_ReceiverEvent):
    pass


class StreamingListenerReceiverError(_ReceiverEvent):
    pass


class StreamingListenerReceiverStopped(_ReceiverEvent):
    pass


#: The listener callback each event goes to (see :class:`sparkwal.engine.driver.events.EventBus`).
CALLBACKS: dict[type, str] = {
    StreamingListenerStreamingStarted: "onStreamingStarted",
    StreamingListenerBatchSubmitted: "onBatchSubmitted",
    StreamingListenerBatchStarted: "onBatchStarted",
    StreamingListenerBatchCompleted: "onBatchCompleted",
    StreamingListenerOutputOperationStarted: "onOutputOperationStarted",
    StreamingListenerOutputOperationCompleted: "onOutputOperationCompleted",
    StreamingListenerBatchCommitted: "onBatchCommitted",
    StreamingListenerDriverTakeover: "onDriverTakeover",
    StreamingListenerStandbyReady: "onStandbyReady",
    StreamingListenerBacklog: "onBacklog",
    StreamingListenerCheckpointWritten: "onCheckpointWritten",
    StreamingListenerDriverRestarted: "onDriverRestarted",
    StreamingListenerDriverFenced: "onDriverFenced",
    StreamingListenerReceiverStarted: "onReceiverStarted",
    StreamingListenerReceiverError: "onReceiverError",
    StreamingListenerReceiverStopped: "onReceiverStopped",
}
