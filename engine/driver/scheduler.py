"""Batch timing and execution: RecurringTimer, JobGenerator, JobScheduler (Spark's
streaming/src/main/scala/org/apache/spark/streaming/util/RecurringTimer.scala,
scheduler/JobGenerator.scala, scheduler/JobScheduler.scala).

The timer fires at every batch time on the context's clock (a ManualClock makes tests
deterministic). The generator turns each time into a job set on one event thread, where clearing
metadata and checkpointing happen too, in order. The scheduler runs a batch's jobs on
``spark.streaming.concurrentJobs`` threads, each batch under its own Spark job group so that a
non-graceful stop can cancel it, and reports progress to the listeners.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from ..dstream import Job, describe_times
from .breakdown import Phases, SparkJobs
from .job_set import JobSet
from .output_order import ANY_OPERATION, note_failure, wait_turn
from .timer import RecurringTimer
from ..listener import (OutputOperationInfo, StreamingListenerBatchCompleted,
                       StreamingListenerBatchStarted, StreamingListenerBatchSubmitted,
                       StreamingListenerOutputOperationCompleted,
                       StreamingListenerOutputOperationStarted)

from ..host import DriverFacts

if TYPE_CHECKING:
    from sparkwal.checkpoint import CheckpointWriter
    from sparkwal.tracker import InputInfoTracker, ReceivedBlockTracker

    from ..receiver.receiver_tracker import ReceiverTracker
    from ..state import StateSnapshots
    from .events import EventBus


class SchedulerHost(DriverFacts, Protocol):
    """What the job generator and scheduler read and call of the driver (which hands itself in):
    the graph and inputs to generate batches from, and the driver's steps around each batch."""

    @property
    def events(self) -> EventBus: ...
    @property
    def input_infos(self) -> InputInfoTracker: ...
    @property
    def block_tracker(self) -> ReceivedBlockTracker | None: ...
    @property
    def receiver_tracker(self) -> ReceiverTracker | None: ...
    @property
    def checkpoint_writer(self) -> CheckpointWriter | None: ...
    @property
    def snapshots(self) -> StateSnapshots: ...
    @property
    def scheduler(self) -> JobScheduler: ...
    @property
    def generator(self) -> JobGenerator: ...
    @property
    def fenced(self) -> BaseException | None: ...
    def plan_batch(self, time_ms: int) -> bool: ...
    def confirm_leadership(self) -> None: ...
    def do_checkpoint(self, time_ms: int, clear_later: bool) -> None: ...
    def on_batch_done(self, time_ms: int, info) -> None: ...
    def with_records_read(self, time_ms: int, infos: dict) -> dict: ...
    def cleanup_old_blocks(self, thresh_ms: int) -> None: ...
    def max_remember_ms(self) -> int: ...
    def report_error(self, error: BaseException, time_ms: int | None) -> None: ...
    def checkpoint_write_ms(self, time_ms: int) -> float | None: ...

log = logging.getLogger(__name__)


class JobScheduler:
    def __init__(self, driver: SchedulerHost, concurrent_jobs: int):
        self._driver = driver
        self.concurrent_jobs = concurrent_jobs
        self._pool = ThreadPoolExecutor(concurrent_jobs, thread_name_prefix="streaming-job")
        self._pending: dict[int, JobSet] = {}
        self._lock = threading.Condition()
        self._abandoned = False  # a stop gave up on the queued batches: none starts any more
        self._failed_in_order: dict[int, int] = {}  # in-order operation -> the first batch it failed in
        self._spark_jobs = SparkJobs(driver.sc)
        self._run_tag = uuid.uuid4().hex[:8]  # this driver's job groups, apart from an earlier one's

    def pending_times(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)

    def submit(self, time_ms: int, jobs: list[Job], input_infos: dict, due_ms: int | None = None,
               breakdown: dict[str, float] | None = None) -> None:
        """``due_ms``: when the batch was due to be generated (default: now). It is the batch's
        submission time, so a batch generated late (held for its state's lineage, or queued
        behind a snapshot on the generator's thread) counts that wait in its scheduling delay:
        "caught up" is never said of a stream that is still late. ``breakdown``: its generation's
        phases (:mod:`.breakdown`)."""
        if not jobs:
            log.debug("no jobs for batch %d", time_ms)
            self._driver.on_batch_done(time_ms, None)
            return
        now = self._driver.clock.now_ms()
        js = JobSet(time_ms, jobs, input_infos, now if due_ms is None else min(due_ms, now),
                     breakdown=dict(breakdown or {}))
        with self._lock:
            self._pending[time_ms] = js
        self._driver.events.post(StreamingListenerBatchSubmitted(js.info()))
        for job in jobs:
            self._pool.submit(self._run_reporting, js, job)

    def _run_reporting(self, js: JobSet, job: Job) -> None:
        """A pool thread's failure outside the job itself (a bug of the engine, a listener's
        error escaping) ends the context with that error instead of vanishing in the pool."""
        try:
            self._run(js, job)
        except BaseException as e:  # noqa: BLE001
            log.error("batch %d: the scheduler failed outside its job", js.time_ms, exc_info=True)
            self._driver.report_error(e, js.time_ms)

    def _run(self, js: JobSet, job: Job) -> None:
        if self._abandoned:  # picked up just as a stop gave up: left for the restart
            with self._lock:
                self._pending.pop(js.time_ms, None)
                self._lock.notify_all()
            return
        driver, sc = self._driver, self._driver.sc
        group = job_group(js.time_ms, job.output_op_id, self._run_tag)
        sc.setJobGroup(group, f"streaming batch {js.time_ms}, output operation {job.output_op_id}: {job.op_name}",
                       interruptOnCancel=True)
        now, start_wall_ms = driver.clock.now_ms(), time.time() * 1000
        op = OutputOperationInfo(js.time_ms, job.output_op_id, job.op_name, now)
        if js.op_started(op):
            driver.events.post(StreamingListenerBatchStarted(js.info()))
        driver.events.post(StreamingListenerOutputOperationStarted(op))
        failure = None
        try:
            if driver.fenced is not None:  # another driver leads: this one outputs nothing more
                raise driver.fenced
            if job.in_order:
                wait_turn(self._lock, self._pending, js.time_ms, job.output_op_id, lambda: self._abandoned,
                          self._failed_in_order)
            job.run()
        except BaseException as e:  # noqa: BLE001
            failure = f"{type(e).__name__}: {e}"
            if job.in_order:  # (before its completion wakes the later batches waiting for their turn)
                self.output_failed(job.output_op_id, js.time_ms)
            driver.report_error(e, js.time_ms)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        end, end_wall_ms, job_ids = driver.clock.now_ms(), time.time() * 1000, self._spark_jobs.job_ids(group)
        op = OutputOperationInfo(js.time_ms, job.output_op_id, job.op_name, now, end, failure, job_ids,
                                 self._spark_jobs.operation_phases(job_ids, start_wall_ms, end_wall_ms))
        driver.events.post(StreamingListenerOutputOperationCompleted(op))
        complete = js.op_completed(op, self._driver.clock.now_ms())
        with self._lock:  # an operation waiting for its turn (output_order) may go on
            if complete:
                self._pending.pop(js.time_ms, None)
            self._lock.notify_all()
        if complete:
            try:
                js.with_input_infos(self._driver.with_records_read(js.time_ms, js.input_infos))
                phases = Phases()
                with phases.phase("commit"):
                    self._driver.on_batch_done(js.time_ms, js.info())
            except BaseException:  # no completion to wait for (a graceful stop's wait)
                self._driver.generator.completion_failed(js.time_ms)
                raise
            written_ms = self._driver.checkpoint_write_ms(js.time_ms)
            with js.lock:
                if written_ms is not None:
                    js.breakdown["checkpointWrite"] = written_ms
                js.breakdown.update(phases.ms)
            info = js.info()
            # queued before listeners hear of it: a stop they make then still checkpoints it
            self._driver.generator.on_batch_completion(js.time_ms)
            self._driver.events.post(StreamingListenerBatchCompleted(info))

    def output_failed(self, output_op_id: int, time_ms: int) -> None:
        """In-order operation ``output_op_id`` (:data:`ANY_OPERATION`: every one) failed in batch
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
                    self._driver.sc.cancelJobGroup(job_group(t, op_id, self._run_tag))
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


class JobGenerator:
    """Turns batch times into job sets; clears metadata and checkpoints, in order.

    A batch whose state would reach back too far (:meth:`sparkwal.engine.state.snapshots.StateSnapshots.
    generation_waits`) is held, with every later one, until the batches in flight are done and
    their snapshots have cut the lineage; it is then generated from the state read back. A held
    batch takes the inputs that arrived until it is generated (receiver blocks, direct ranges,
    files), as a late batch does in Spark."""

    def __init__(self, driver: SchedulerHost):
        self._driver = driver
        self.timer = RecurringTimer(driver.clock, driver.batch_ms, self._on_tick, "JobGenerator")
        self._events = ThreadPoolExecutor(1, thread_name_prefix="JobGenerator-events")
        self.last_processed_ms: int | None = None
        self._processed = threading.Condition()
        self._queued: set[int] = set()  # batch times queued for generation, not generated yet
        self._due_ms: dict[int, int] = {}  # batch time -> when its generation was queued
        self._held: list[int] = []  # due, held until the batches in flight cut a state's lineage
        self._in_flight: set[int] = set()  # generated with jobs, completion not processed yet
        self._queued_lock = threading.Lock()
        self._generation_cancelled = False

    def _on_tick(self, time_ms: int) -> None:
        self._queue_generation(time_ms)

    def _queue_generation(self, time_ms: int) -> None:
        with self._queued_lock:
            self._queued.add(time_ms)
            self._due_ms.setdefault(time_ms, self._driver.clock.now_ms())
        self._events.submit(self._guard, self._generate_queued, time_ms)

    def _generate_queued(self, time_ms: int) -> None:
        with self._queued_lock:
            behind_held = bool(self._held)  # batches go out in order
        why = "held behind earlier batches" if behind_held else self._must_wait(time_ms)
        with self._queued_lock:
            self._queued.discard(time_ms)
            if self._generation_cancelled:
                self._due_ms.pop(time_ms, None)
                return
            if why is not None:
                self._held.append(time_ms)
        if why is None:
            self.generate_jobs(time_ms)
        elif not behind_held:
            log.info("batch %d waits for the batches in flight (%s): %s", time_ms,
                     ", ".join(map(str, sorted(self._in_flight))), why)

    def _must_wait(self, time_ms: int) -> str | None:
        return self._driver.snapshots.generation_waits(time_ms) if self._in_flight else None

    def _release_held(self) -> None:
        """Generate held batches, in order, while none must wait any more."""
        while True:
            with self._queued_lock:
                if not self._held or self._generation_cancelled:
                    return
                time_ms = self._held[0]
            if self._must_wait(time_ms) is not None:
                return
            self.generate_jobs(time_ms)
            with self._queued_lock:  # held until submitted: a graceful stop sees it either way
                self._held.remove(time_ms)

    def queued_times(self) -> list[int]:
        """Batch times due but not generated yet (a restart's backlog waits here, and batches
        held for a state's lineage)."""
        with self._queued_lock:
            return sorted(self._queued | set(self._held))

    def completions_due(self) -> bool:
        """Whether a batch generated with jobs has its completion still to be processed (read
        off the event thread, which alone changes the set)."""
        return bool(self._in_flight) and self._driver.fenced is None

    def completion_failed(self, time_ms: int) -> None:
        """A batch whose jobs ended but whose commit failed: no completion comes."""
        try:
            self._events.submit(self._in_flight.discard, time_ms)
        except RuntimeError:  # stopped
            pass

    def call(self, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` on the generation thread, after every generation queued so far."""
        return self._events.submit(fn, *args)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every event queued so far has run; False on timeout."""
        try:
            self._events.submit(lambda: None).result(timeout_s)
            return True
        except (TimeoutError, RuntimeError):
            return False

    def _guard(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001
            self._driver.report_error(e, args[0] if args else None)

    def generate_jobs(self, time_ms: int) -> None:
        driver = self._driver
        with self._queued_lock:
            due_ms = self._due_ms.pop(time_ms, None)
        phases, planned = Phases(), False
        try:
            with phases.phase("generation"):
                if driver.receiver_tracker is not None:  # the receivers' blocks cut at the batch time
                    with phases.phase("receiverCuts"):
                        driver.receiver_tracker.batch_cuts.wait_for(time_ms)
                with phases.phase("blockAllocation"):  # then the batch's blocks
                    driver.block_tracker.allocate_blocks_to_batch(time_ms)
                with phases.phase("batchLog"):  # ranges planned and logged, unless committed
                    if not driver.plan_batch(time_ms):
                        return
                planned = True
                with phases.phase("leadership"):  # outputs run only under an epoch confirmed current
                    driver.confirm_leadership()
                with phases.phase("graph"):
                    jobs = driver.graph.generate_jobs(time_ms)
        except BaseException as e:  # noqa: BLE001
            if planned:  # logged, never run: no later batch's in-order output may run before its re-run
                driver.scheduler.output_failed(ANY_OPERATION, time_ms)
            driver.report_error(e, time_ms)
            return
        if jobs:  # its completion is processed by _clear_metadata (no jobs: none)
            self._in_flight.add(time_ms)
        driver.scheduler.submit(time_ms, jobs, driver.input_infos.get_info(time_ms), due_ms, phases.ms)
        driver.do_checkpoint(time_ms, clear_later=False)

    def rerun(self, times_ms: list[int]) -> None:
        """Regenerate and submit batches of a restarted context, in order."""
        for t in times_ms:
            self._queue_generation(t)

    def on_batch_completion(self, time_ms: int) -> None:
        try:
            self._events.submit(self._guard, self._clear_metadata, time_ms)
        except RuntimeError:  # finished after the stop: its checkpoint is the restart's to write
            log.info("batch %s completed after the stop; not checkpointed", time_ms)

    def _clear_metadata(self, time_ms: int) -> None:
        driver = self._driver
        try:
            driver.graph.clear_metadata(time_ms)
            driver.do_checkpoint(time_ms, clear_later=True)
            if driver.checkpoint_writer is None:  # else once the checkpoint is durable
                driver.cleanup_old_blocks(time_ms - driver.max_remember_ms())
            driver.input_infos.cleanup(time_ms - driver.max_remember_ms())
        finally:  # (processed, even when its checkpoint failed: a graceful stop waits for no more)
            self._in_flight.discard(time_ms)  # its snapshot, if due, is served now
        self._release_held()
        with self._processed:
            self.last_processed_ms = max(self.last_processed_ms or time_ms, time_ms)
            self._processed.notify_all()

    def wait_processed(self, timeout_s: float) -> None:
        """Wait until the next batch's completion is processed (held batches released), or ``timeout_s``."""
        with self._processed:
            self._processed.wait(timeout_s)

    def snapshot_last_state(self, timeout_s: float) -> None:
        """A graceful stop, every batch done: where the checkpoint interval left the last batch's state
        without a snapshot, snapshot it (its completion's checkpoint written again with it), so that the
        driver going on (a restart, a standby) starts from that state, re-running no batch from inputs."""
        try:  # (the last batch decided on the event thread: a completion queued before it is processed)
            self._events.submit(self._guard, self._snapshot_last_state).result(timeout_s)
        except TimeoutError:
            log.warning("graceful stop: the last batch's state is still being snapshotted past "
                        "spark.streaming.gracefulStopTimeout; the stop waits for it")

    def _snapshot_last_state(self) -> None:
        """On the event thread. A batch's job set leaves the pending ones (a graceful stop's wait
        ends) before its completion is queued here: the last processed batch read earlier could be
        the one before it, whose completion checkpoint written after it would then take its place
        (a checkpoint file is named by the newest time written) and re-run it at the restart."""
        last, snapshots = self.last_processed_ms, self._driver.snapshots
        if last is not None and snapshots.each_batch and snapshots.any_due(last):
            self._driver.do_checkpoint(last, True)

    def stop(self, cancel_queued: bool = False) -> None:
        """Stop the timer and the event thread; ``cancel_queued`` drops the generations not
        started (a stop that gave up waiting: those batches are left to the restart). Batches
        that completed are still checkpointed, unlike Spark's (JobGenerator.stop drops its
        event loop's queue): a batch a listener saw complete is not run again."""
        self.timer.stop()
        if cancel_queued:
            with self._queued_lock:
                self._generation_cancelled = True
        self._events.shutdown(wait=True)


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
