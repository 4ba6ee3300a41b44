"""What each batch read: per-stream record counts and metadata, and the timings of a batch.

``BatchInfo`` lives here rather than in ``engine/`` because the rate controller (this package)
consumes it; the engine's listeners receive the same objects.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sparkwal.base.errors import SparkwalError


class TrackerError(SparkwalError):
    """Misuse of a tracker (e.g. reporting a batch's input twice)."""


class Time(NamedTuple):
    """A batch time, with the accessor of pyspark.streaming's (JVM) ``Time``."""

    ms: int

    def milliseconds(self) -> int:
        return self.ms


@dataclass(frozen=True)
class StreamInputInfo:
    input_stream_id: int
    num_records: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_records < 0:
            raise ValueError(f"num_records must be >= 0, got {self.num_records}")

    # pyspark.streaming's accessors, so ported listeners run unchanged
    def inputStreamId(self) -> int:
        return self.input_stream_id

    def numRecords(self) -> int:
        return self.num_records


#: An output operation's phases (``OutputOperationInfo.breakdown``), in order. ``submit``: from
#: the operation's start until its first Spark stage was submitted (the user's function, the RDDs'
#: Python functions pickled and handed to the JVM, Spark's DAG scheduler); ``tasks``: from there
#: until its last stage was submitted (the stages before the last one: a shuffle's map side);
#: ``collect``: the last stage's tasks and its results back in the driver's Python, until the
#: operation ended. Taken from Spark's status tracker (stage submission times) as the operation
#: ends; a phase it has no times for is left out.
OPERATION_PHASES = ("submit", "tasks", "collect")

#: A batch's phases on the driver (``BatchInfo.breakdown``), in order, in ms. ``generation``: the
#: batch turned into jobs on the generator's thread, made of ``receiverCuts`` (the wait for the
#: receivers' blocks cut at the batch time to be recorded: engine/receiver/batch_cuts.py; present
#: with receivers), ``blockAllocation`` (the receivers' blocks allocated to it, the allocation
#: written to the block tracker's WAL and synced),
#: ``batchLog`` (a direct stream's ranges planned and logged, synced), ``leadership`` (the
#: driver's epoch confirmed) and ``graph`` (the batch's RDDs built); ``checkpointWrite``: its
#: checkpoint written (off the batch's path, on the checkpoint writer's thread; present once
#: written by the time the batch completes); ``commit``: what follows its last output (its batch
#: log's done mark, state snapshots, the direct streams' and receivers' completion steps).
BATCH_PHASES = ("generation", "receiverCuts", "blockAllocation", "batchLog", "leadership", "graph", "checkpointWrite",
                "commit")

#: Where a batch's work ran, per stream (``BatchInfo.paths``, keyed by the stream's creation site, e.g.
#: "socketTextStream at app.py:12"): a receiver stream's batch "precomputed" (built from what its
#: receivers computed as they stored the blocks: no block read) or "executors" (its blocks read in
#: tasks) or "per-block" (its blocks' rows output one block at a time as they were recorded:
#: ``foreachBlock``); a state's "driver" (held on the driver: no Spark job) or "executors".
BATCH_PATHS = ("precomputed", "driver", "executors", "per-block")


@dataclass(frozen=True)
class OutputOperationInfo:
    """One output operation (e.g. a foreachRDD) of one batch; times in ms, -1 while unknown."""

    batch_time_ms: int
    output_op_id: int
    op_name: str
    start_time_ms: int = -1
    end_time_ms: int = -1
    failure: str | None = None
    job_ids: tuple[int, ...] = ()  #: the Spark jobs it ran (Spark's ``OutputOpIdAndSparkJobId`` pairs)
    #: where the operation's time went, in ms (:data:`OPERATION_PHASES`; absent: not known)
    breakdown: dict[str, float] = field(default_factory=dict)

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
class BatchInfo:
    batch_time_ms: int
    stream_id_to_input_info: dict[int, StreamInputInfo]
    submission_time_ms: int
    processing_start_time_ms: int | None = None
    processing_end_time_ms: int | None = None
    #: output operation id -> its OutputOperationInfo in this batch (as Spark's BatchInfo)
    output_operation_infos: dict[int, OutputOperationInfo] = field(default_factory=dict)
    #: where the batch's time went on the driver, in ms (:data:`BATCH_PHASES`; absent: not known
    #: yet, or the batch had no such step)
    breakdown: dict[str, float] = field(default_factory=dict)
    #: where each receiver stream's and state's work ran (:data:`BATCH_PATHS`)
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def scheduling_delay_ms(self) -> int | None:
        """Time from submission until the first job started."""
        start = self.processing_start_time_ms
        return None if start is None else start - self.submission_time_ms

    @property
    def processing_delay_ms(self) -> int | None:
        start, end = self.processing_start_time_ms, self.processing_end_time_ms
        return None if start is None or end is None else end - start

    @property
    def total_delay_ms(self) -> int | None:
        s, p = self.scheduling_delay_ms, self.processing_delay_ms
        return None if s is None or p is None else s + p

    @property
    def num_records(self) -> int:
        return sum(i.num_records for i in self.stream_id_to_input_info.values())

    # pyspark.streaming's accessors (its JavaBatchInfo: times in ms, -1 when not known yet), so
    # listeners ported from pyspark.streaming run unchanged
    def batchTime(self) -> Time:
        return Time(self.batch_time_ms)

    def submissionTime(self) -> int:
        return self.submission_time_ms

    def processingStartTime(self) -> int:
        return _or_unknown(self.processing_start_time_ms)

    def processingEndTime(self) -> int:
        return _or_unknown(self.processing_end_time_ms)

    def schedulingDelay(self) -> int:
        return _or_unknown(self.scheduling_delay_ms)

    def processingDelay(self) -> int:
        return _or_unknown(self.processing_delay_ms)

    def totalDelay(self) -> int:
        return _or_unknown(self.total_delay_ms)

    def numRecords(self) -> int:
        return self.num_records

    def streamIdToInputInfo(self) -> dict[int, StreamInputInfo]:
        return dict(self.stream_id_to_input_info)

    def outputOperationInfos(self) -> dict[int, OutputOperationInfo]:
        return dict(self.output_operation_infos)


def _or_unknown(value: int | None) -> int:
    return -1 if value is None else value


class InputInfoTracker:
    """Batch time -> stream id -> :class:`StreamInputInfo`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._infos: dict[int, dict[int, StreamInputInfo]] = {}

    def report_info(self, batch_time_ms: int, info: StreamInputInfo) -> None:
        with self._lock:
            batch = self._infos.setdefault(batch_time_ms, {})
            if info.input_stream_id in batch:
                raise TrackerError(f"input info of stream {info.input_stream_id} for batch "
                                   f"{batch_time_ms} was already reported")
            batch[info.input_stream_id] = info

    def get_info(self, batch_time_ms: int) -> dict[int, StreamInputInfo]:
        with self._lock:
            return dict(self._infos.get(batch_time_ms, {}))

    def cleanup(self, batch_threshold_ms: int) -> None:
        """Forget batches before ``batch_threshold_ms``."""
        with self._lock:
            for t in [t for t in self._infos if t < batch_threshold_ms]:
                del self._infos[t]
