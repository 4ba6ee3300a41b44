"""A batch's job set: its jobs and the progress of each output operation, as the scheduler
(:mod:`sparkwal.engine.driver.scheduler`) records it and reports it to the listeners."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sparkwal.tracker import BatchInfo

from ..dstream import Job
from ..listener import OutputOperationInfo


@dataclass
class JobSet:
    """A batch's jobs and the progress of its output operations (the scheduler's, per batch)."""

    time_ms: int
    jobs: list[Job]
    input_infos: dict
    submission_ms: int
    start_ms: int | None = None
    end_ms: int | None = None
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    ops: dict[int, OutputOperationInfo] = field(default_factory=dict)
    breakdown: dict[str, float] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ops = {j.output_op_id: OutputOperationInfo(self.time_ms, j.output_op_id, j.op_name)
                    for j in self.jobs}

    def op_started(self, op: OutputOperationInfo) -> bool:
        """Record ``op`` as started; True for the batch's first (the batch starts with it)."""
        with self.lock:
            first = self.start_ms is None
            if first:
                self.start_ms = op.start_time_ms
            self.ops[op.output_op_id] = op
        return first

    def op_done(self, output_op_id: int) -> bool:
        """Whether operation ``output_op_id`` completed; True where the batch has no such job (a
        window sliding slower than the batches)."""
        with self.lock:
            op = self.ops.get(output_op_id)
            return op is None or op.end_time_ms >= 0

    def op_completed(self, op: OutputOperationInfo, end_ms: int) -> bool:
        """Record ``op`` as completed; True once it was the batch's last (ended at ``end_ms``)."""
        with self.lock:
            self.ops[op.output_op_id] = op
            self.done += 1
            complete = self.done == len(self.jobs)
            if complete:
                self.end_ms = end_ms
        return complete

    def with_input_infos(self, input_infos: dict) -> None:
        """The batch's input infos, counted again once its jobs are done (file streams)."""
        with self.lock:
            self.input_infos = input_infos

    def info(self) -> BatchInfo:
        with self.lock:
            ops = dict(self.ops)
            breakdown = dict(self.breakdown)
        return BatchInfo(self.time_ms, self.input_infos, self.submission_ms, self.start_ms, self.end_ms,
                         ops, breakdown, dict(self.paths))
