"""The job scheduler (Spark's streaming/src/main/scala/org/apache/spark/streaming/scheduler/JobScheduler.scala).

It owns the job generator (:mod:`.generator`), which it makes and which submits each batch's jobs
to it, the input info tracker (Spark's ``inputInfoTracker``) and the order of in-order outputs
(:mod:`.output_order`); a start hands it, and through it the generator, the batch's collaborators
(:class:`.generator.BatchSteps`), whose block and receiver trackers and batch log it owns from then on
(:attr:`JobScheduler.receiver_tracker`, as Spark's ``receiverTracker``, is what streams read). It runs a batch's jobs on
``spark.streaming.concurrentJobs`` threads, each batch under its own Spark job group so that a
non-graceful stop can cancel it, reports progress to the listeners, commits each batch once its
jobs are done and calls the generator's :meth:`~.generator.JobGenerator.on_batch_completion`, which
checkpoints it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sparkwal.base.times import batch_name
from sparkwal.tracker import InputInfoTracker, StreamInputInfo, TrackerError

from ..dstream import Job, describe_times
from .breakdown import Phases, SparkJobs
from .generator import BatchSteps, JobGenerator
from .job_set import JobSet
from .output_order import note_failure, wait_turn
from ..listener import (BatchInfo, OutputOperationInfo, StreamingListenerBatchCompleted,
                       StreamingListenerBatchStarted, StreamingListenerBatchSubmitted,
                       StreamingListenerOutputOperationCompleted,
                       StreamingListenerOutputOperationStarted)

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkwal.tracker import ReceivedBlockTracker
    from sparkwal.wal import Clock

    from ..receiver.receiver_tracker import ReceiverTracker
    from ..sources.batch_log import BatchLog

    from ..state import StateSnapshots
    from .checkpointing import Checkpointing
    from .events import EventBus

log = logging.getLogger(__name__)


class JobScheduler:
    """Runs each batch's jobs and commits the batch; makes and owns the :attr:`generator`.
    ``on_error(error, batch time)``: a batch's error, for the driver to end with;
    ``fenced()``: why this driver lost its leadership (None: it did not)."""

    def __init__(self, sc: SparkContext, clock: Clock, batch_ms: int, concurrent_jobs: int, events: EventBus,
                 snapshots: StateSnapshots, checkpoints: Checkpointing,
                 on_error: Callable[[BaseException, int | None], None],
                 fenced: Callable[[], BaseException | None]):
        self._sc, self._clock, self._events = sc, clock, events
        self._snapshots, self._checkpoints = snapshots, checkpoints
        self._on_error, self._fenced = on_error, fenced
        self._steps: BatchSteps | None = None  # handed at start
        self.concurrent_jobs = concurrent_jobs
        self.input_info_tracker = InputInfoTracker()  # each batch's inputs, as its streams report them
        self.generator = JobGenerator(self, clock, batch_ms, snapshots, checkpoints, self.input_info_tracker,
                                      on_error, fenced)
        self._pool = ThreadPoolExecutor(concurrent_jobs, thread_name_prefix="streaming-job")
        self._pending: dict[int, JobSet] = {}
        self._lock = threading.Condition()
        self._abandoned = False  # a stop gave up on the queued batches: none starts any more
        self._failed_in_order: dict[int, int] = {}  # in-order operation -> the first batch it failed in
        self._spark_jobs = SparkJobs(sc)
        self._run_tag = uuid.uuid4().hex[:8]  # this driver's job groups, apart from an earlier one's

    def start(self, steps: BatchSteps) -> None:
        """The collaborators the start made, for this scheduler and its generator (before any
        batch is generated; the generator's timer starts once the receivers have)."""
        self._steps = steps
        self.generator.use(steps)

    @property
    def block_tracker(self) -> ReceivedBlockTracker | None:
        """The received blocks' tracker (None before the start)."""
        return self._steps.block_tracker if self._steps is not None else None

    @property
    def receiver_tracker(self) -> ReceiverTracker | None:
        """The driver side of the receivers (None before the start, or without receivers)."""
        return self._steps.receiver_tracker if self._steps is not None else None

    @property
    def batch_log(self) -> BatchLog | None:
        """The offsets and commits logs (None before the start, or without a checkpoint)."""
        return self._steps.batches.batch_log if self._steps is not None else None

    def report_input(self, time_ms: int, stream, num_records: int, metadata: dict) -> None:
        """An input stream's report of what batch ``time_ms`` read (Spark's ``inputInfoTracker.reportInfo``)."""
        try:
            self.input_info_tracker.report_info(time_ms, StreamInputInfo(stream.input_id, num_records, metadata))
        except TrackerError:  # a re-generated batch (after a restart) reports its input again
            pass

    def pending_times(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)

    def submit(self, time_ms: int, jobs: list[Job], input_infos: dict, due_ms: int | None = None,
               breakdown: dict[str, float] | None = None, paths: dict[str, str] | None = None) -> None:
        """``due_ms``: when the batch was due to be generated (default: now). It is the batch's
        submission time, so a batch generated late (held for its state's lineage, or queued
        behind a snapshot on the generator's thread) counts that wait in its scheduling delay:
        "caught up" is never said of a stream that is still late. ``breakdown``: its generation's
        phases (:mod:`.breakdown`); ``paths``: where each stream's work ran (:func:`.breakdown.batch_paths`)."""
        if not jobs:
            log.debug("no jobs for batch %d", time_ms)
            self._commit(time_ms, None)
            return
        now = self._clock.now_ms()
        js = JobSet(time_ms, jobs, input_infos, now if due_ms is None else min(due_ms, now),
                     breakdown=dict(breakdown or {}), paths=dict(paths or {}))
        with self._lock:
            self._pending[time_ms] = js
        self._events.post(StreamingListenerBatchSubmitted(js.info()))
        for job in jobs:
            self._pool.submit(self._run_reporting, js, job)

    def _run_reporting(self, js: JobSet, job: Job) -> None:
        """A pool thread's failure outside the job itself (a bug of the engine, a listener's
        error escaping) ends the context with that error instead of vanishing in the pool."""
        try:
            self._run(js, job)
        except BaseException as e:  # noqa: BLE001
            log.error("%s: the scheduler failed outside its job", batch_name(js.time_ms), exc_info=True)
            self._on_error(e, js.time_ms)

    def _run(self, js: JobSet, job: Job) -> None:
        if self._abandoned:  # picked up just as a stop gave up: left for the restart
            with self._lock:
                self._pending.pop(js.time_ms, None)
                self._lock.notify_all()
            return
        sc, events = self._sc, self._events
        group = job_group(js.time_ms, job.output_op_id, self._run_tag)
        sc.setJobGroup(group, f"streaming batch {js.time_ms}, output operation {job.output_op_id}: {job.op_name}",
                       interruptOnCancel=True)
        now, start_wall_ms = self._clock.now_ms(), time.time() * 1000
        op = OutputOperationInfo(js.time_ms, job.output_op_id, job.op_name, now)
        if js.op_started(op):
            events.post(StreamingListenerBatchStarted(js.info()))
        events.post(StreamingListenerOutputOperationStarted(op))
        failure = None
        try:
            if (fenced := self._fenced()) is not None:  # another driver leads: this one outputs nothing more
                raise fenced
            if job.in_order:
                wait_turn(self._lock, self._pending, js.time_ms, job.output_op_id, lambda: self._abandoned,
                          self._failed_in_order)
            job.run()
        except BaseException as e:  # noqa: BLE001
            failure = f"{type(e).__name__}: {e}"
            if job.in_order:  # (before its completion wakes the later batches waiting for their turn)
                self.output_failed(job.output_op_id, js.time_ms)
            self._on_error(e, js.time_ms)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        end, end_wall_ms, job_ids = self._clock.now_ms(), time.time() * 1000, self._spark_jobs.job_ids(group)
        op = OutputOperationInfo(js.time_ms, job.output_op_id, job.op_name, now, end, failure, job_ids,
                                 self._spark_jobs.operation_phases(job_ids, start_wall_ms, end_wall_ms))
        events.post(StreamingListenerOutputOperationCompleted(op))
        complete = js.op_completed(op, self._clock.now_ms())
        with self._lock:  # an operation waiting for its turn (output_order) may go on
            if complete:
                self._pending.pop(js.time_ms, None)
            self._lock.notify_all()
        if complete:
            try:
                js.with_input_infos(self._with_records_read(js.time_ms, js.input_infos))
                phases = Phases()
                with phases.phase("commit"):
                    self._commit(js.time_ms, js.info())
            except BaseException:  # no completion to wait for (a graceful stop's wait)
                self.generator.completion_failed(js.time_ms)
                raise
            written_ms = self._checkpoints.write_ms.get(js.time_ms)
            with js.lock:
                if written_ms is not None:
                    js.breakdown["checkpointWrite"] = written_ms
                js.breakdown.update(phases.ms)
            info = js.info()
            # queued before listeners hear of it: a stop they make then still checkpoints it
            self.generator.on_batch_completion(js.time_ms)
            events.post(StreamingListenerBatchCompleted(info))

    def _commit(self, time_ms: int, info: BatchInfo | None) -> None:
        """Batch ``time_ms``'s jobs are done (``info`` None: it had none): commit it in the batch
        log, then tell the checkpoints, the state snapshots, the receivers and the driver."""
        steps = self._steps
        assert steps is not None
        ok = info is None or all(o.failure is None for o in info.output_operation_infos.values())
        if ok:
            self._checkpoints.batch_succeeded(time_ms)
        steps.batches.batch_ran(time_ms, info, ok)
        self._snapshots.on_batch_done(time_ms)
        if steps.receiver_tracker is not None:
            steps.receiver_tracker.on_batch_completed(time_ms, info)
        steps.on_batch_committed(time_ms)

    def _with_records_read(self, time_ms: int, infos: dict) -> dict:
        """``infos`` (a batch's input infos) with the records of the inputs that count them as
        their tasks read them (file streams), once the batch's jobs are done."""
        out = dict(infos)
        for stream in self._steps.graph.inputs if self._steps is not None else ():
            n = stream.records_read(time_ms)
            if n is not None and stream.input_id in out:
                out[stream.input_id] = StreamInputInfo(stream.input_id, n, out[stream.input_id].metadata)
        return out

    def cleanup_old_blocks(self, thresh_ms: int) -> None:
        """Forget the received blocks of batches before ``thresh_ms`` (once no restart can need them).
        Before the start hands the trackers over (a checkpoint an upgrade writes while it restarts)
        nothing: the next durable checkpoint cleans up behind its later floor."""
        steps = self._steps
        if steps is not None and thresh_ms < self._clock.now_ms():
            steps.block_tracker.cleanup_old_batches(thresh_ms)
            if steps.receiver_tracker is not None:
                steps.receiver_tracker.cleanup_old_blocks(thresh_ms)

    def output_failed(self, output_op_id: int, time_ms: int) -> None:
        """In-order operation ``output_op_id`` (:data:`.output_order.ANY_OPERATION`: every one) failed in batch
        ``time_ms``: the same operation of later batches does not run (output_order)."""
        note_failure(self._lock, self._failed_in_order, output_op_id, time_ms)

    def wait_idle(self, timeout_s: float) -> bool:  # until no batch runs or is queued; False on timeout
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending, timeout_s)

    def cancel_all(self, timeout_s: float = 5.0) -> None:
        """Cancel the Spark jobs of every pending batch. A job group only cancels jobs already
        submitted, so keep cancelling until the batches end (a job may start just after)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pending = self.pending_times()
            if not pending:
                return
            for t in pending:
                with self._lock:
                    js = self._pending.get(t)
                for op_id in (js.ops if js is not None else ()):
                    self._sc.cancelJobGroup(job_group(t, op_id, self._run_tag))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("batches %s still running after cancelling them for %s s", pending, timeout_s)
                return
            with self._lock:
                self._lock.wait_for(lambda: not self._pending, min(0.1, remaining))

    def abandon(self) -> None:
        """A stop that does not wait: batches not started never start (they stay in the
        checkpoint for the restart), running ones are cancelled."""
        self._abandoned = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for t, js in list(self._pending.items()):
                with js.lock:
                    started = js.start_ms is not None
                if not started:
                    del self._pending[t]
            self._lock.notify_all()
        self.cancel_all()

    def stop(self, wait: bool) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def prestart(self, task: Callable[[], None]) -> None:
        """Start every job thread now, each running ``task`` (a standby opens their Py4J connections
        ahead of a takeover; ``task`` holds each until all have one: an idle thread takes the next)."""
        for _ in range(self.concurrent_jobs):
            self._pool.submit(task)


def job_group(time_ms: int, output_op_id: int, run: str = "") -> str:
    """One Spark job group per output operation of a batch: cancelled at a stop; the UI finds its jobs by it."""
    return f"sparkwal-streaming-{run + '-' if run else ''}batch-{time_ms}-op-{output_op_id}"


class GracefulStop:
    """A graceful stop's one ``spark.streaming.gracefulStopTimeout``, which its receivers' wait and
    its batches' share: Spark's default is 10 batch intervals, and Spark reads a value without a unit
    as milliseconds (``value_ms``, None: unset)."""

    def __init__(self, value_ms: int | None, batch_ms: int):
        self.timeout_s = 10 * batch_ms / 1000 if value_ms is None else value_ms / 1000
        self._deadline: float | None = None

    def begin(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s

    def remaining_s(self) -> float:
        """What is left of the timeout since :meth:`begin` (all of it before)."""
        return self.timeout_s if self._deadline is None else max(0.0, self._deadline - time.monotonic())


def await_batches(generator: JobGenerator, scheduler: JobScheduler, remaining_s: Callable[[], float],
                  timeout_s: float) -> list[int]:
    """A graceful stop's wait: every batch due so far generated and run, within ``timeout_s``
    (``remaining_s()``: what is left of it). On timeout the batches not done are left for the
    restart (they are in the checkpoint, logged in the batch log or due again: nothing is lost),
    returned and named in one warning."""
    while generator.drain(remaining_s()) and scheduler.wait_idle(remaining_s()):
        if not generator.queued_times() and not generator.completions_due():
            generator.snapshot_last_state(remaining_s())
            return []
        # batches held for a state's lineage, or a completion not processed yet (a job set leaves
        # the pending ones before its completion is queued): once the last completion is processed
        generator.wait_processed(min(0.1, remaining_s()))
    left = sorted(set(scheduler.pending_times()) | set(generator.queued_times()))
    if left:
        log.warning("graceful stop: %s not done within spark.streaming.gracefulStopTimeout "
                    "(%.1f s) left for the restart (nothing is lost: a restart runs them)",
                    describe_times(left), timeout_s)
    return left
