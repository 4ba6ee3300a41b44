"""The job generator (Spark's streaming/src/main/scala/org/apache/spark/streaming/scheduler/JobGenerator.scala).

The scheduler that owns it (:class:`.scheduler.JobScheduler`) makes it and hands it its
collaborators: at construction the clock, the state snapshots, the checkpoints and the input
report, which live as long as the driver; at start the ones a start makes (:class:`BatchSteps`:
the graph to run, the block and receiver trackers, the batch protocol and the leadership), as
Spark's ``JobScheduler.start`` makes its receiver tracker. The timer fires at every batch time on
the clock; the generator turns each time into a job set on one event thread, where clearing
metadata and checkpointing happen too, in order, and submits it to the scheduler, which calls
:meth:`JobGenerator.on_batch_completion` when the batch is done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .breakdown import Phases, batch_paths
from .output_order import ANY_OPERATION
from .timer import RecurringTimer

if TYPE_CHECKING:
    from sparkwal.tracker import InputInfoTracker, ReceivedBlockTracker
    from sparkwal.wal import Clock

    from ..graph import DStreamGraph
    from ..receiver.receiver_tracker import ReceiverTracker
    from ..state import StateSnapshots
    from .batches import BatchPlanner
    from .checkpointing import Checkpointing
    from .scheduler import JobScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchSteps:
    """What generating, running and completing a batch calls beyond the scheduler and the
    generator: the collaborators a start makes, handed to :meth:`.scheduler.JobScheduler.start`."""

    graph: DStreamGraph
    block_tracker: ReceivedBlockTracker
    receiver_tracker: ReceiverTracker | None
    batches: BatchPlanner  #: the batch protocol: plans and logs each batch, commits it once done
    confirm_leadership: Callable[[], None]  #: raises unless this driver's epoch is current
    on_batch_committed: Callable[[int], None]  #: the driver's progress, once the commit is handed to the batch log
    checkpointing: bool  #: whether the checkpoint is written (blocks are then cleaned up once it is durable)


class JobGenerator:
    """Turns batch times into job sets; clears metadata and checkpoints, in order.

    A batch whose state would reach back too far (:meth:`sparkwal.engine.state.snapshots.StateSnapshots.
    generation_waits`) is held, with every later one, until the batches in flight are done and
    their snapshots have cut the lineage; it is then generated from the state read back. A held
    batch takes the inputs that arrived until it is generated (receiver blocks, direct ranges,
    files), as a late batch does in Spark."""

    def __init__(self, scheduler: JobScheduler, clock: Clock, batch_ms: int, snapshots: StateSnapshots,
                 checkpoints: Checkpointing, input_infos: InputInfoTracker,
                 on_error: Callable[[BaseException, int | None], None],
                 fenced: Callable[[], BaseException | None]):
        self._scheduler, self._clock = scheduler, clock
        self._snapshots, self._checkpoints, self._input_infos = snapshots, checkpoints, input_infos
        self._on_error, self._fenced = on_error, fenced
        self._steps: BatchSteps | None = None  # handed at start
        self.timer = RecurringTimer(clock, batch_ms, self._on_tick, "JobGenerator")
        self._events = ThreadPoolExecutor(1, thread_name_prefix="JobGenerator-events")
        self.last_processed_ms: int | None = None
        self._processed = threading.Condition()
        self._queued: set[int] = set()  # batch times queued for generation, not generated yet
        self._due_ms: dict[int, int] = {}  # batch time -> when its generation was queued
        self._held: list[int] = []  # due, held until the batches in flight cut a state's lineage
        self._in_flight: set[int] = set()  # generated with jobs, completion not processed yet
        self._queued_lock = threading.Lock()
        self._generation_cancelled = False

    def use(self, steps: BatchSteps) -> None:
        """The collaborators a start made (before any batch is generated)."""
        self._steps = steps

    def _on_tick(self, time_ms: int) -> None:
        self._queue_generation(time_ms)

    def _queue_generation(self, time_ms: int) -> None:
        with self._queued_lock:
            self._queued.add(time_ms)
            self._due_ms.setdefault(time_ms, self._clock.now_ms())
        try:
            self._events.submit(self._guard, self._generate_queued, time_ms)
        except RuntimeError:  # the event thread is gone: stopped, or the interpreter exiting (an app that
            with self._queued_lock:  # ended on an error without stop()): the batch is the restart's
                self._queued.discard(time_ms)
                self._due_ms.pop(time_ms, None)
            log.debug("batch %d not generated: the generator has stopped", time_ms)

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
        return self._snapshots.generation_waits(time_ms) if self._in_flight else None

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
        return bool(self._in_flight) and self._fenced() is None

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
        except BaseException as e:  # noqa: BLE001  the driver's error (awaitTermination raises it), not the pool's
            self._on_error(e, args[0] if args else None)

    def generate_jobs(self, time_ms: int) -> None:
        steps = self._steps
        assert steps is not None, "a batch generated before the start handed the generator its collaborators"
        with self._queued_lock:
            due_ms = self._due_ms.pop(time_ms, None)
        phases, planned = Phases(), False
        try:
            with phases.phase("generation"):
                if steps.receiver_tracker is not None:  # the receivers' blocks cut at the batch time
                    with phases.phase("receiverCuts"):
                        steps.receiver_tracker.batch_cuts.wait_for(time_ms)
                with phases.phase("blockAllocation"):  # then the batch's blocks
                    steps.block_tracker.allocate_blocks_to_batch(time_ms)
                with phases.phase("batchLog"):  # ranges planned and logged, unless committed
                    if not steps.batches.plan_batch(time_ms):
                        return
                planned = True
                with phases.phase("leadership"):  # outputs run only under an epoch confirmed current
                    steps.confirm_leadership()
                with phases.phase("graph"):
                    jobs = steps.graph.generate_jobs(time_ms)
        except BaseException as e:  # noqa: BLE001  the driver's error, reported with its batch
            if planned:  # logged, never run: no later batch's in-order output may run before its re-run
                self._scheduler.output_failed(ANY_OPERATION, time_ms)
            self._on_error(e, time_ms)
            return
        if jobs:  # its completion is processed by _clear_metadata (no jobs: none)
            self._in_flight.add(time_ms)
        infos = self._input_infos.get_info(time_ms)
        self._scheduler.submit(time_ms, jobs, infos, due_ms, phases.ms, batch_paths(steps.graph, time_ms, infos))
        self._checkpoints.checkpoint_batch(time_ms, clear_later=False)

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
        steps = self._steps
        assert steps is not None
        try:
            steps.graph.clear_metadata(time_ms)
            self._checkpoints.checkpoint_batch(time_ms, clear_later=True)
            remembered = time_ms - steps.graph.max_remember_ms()
            if not steps.checkpointing:  # else once the checkpoint is durable
                self._scheduler.cleanup_old_blocks(remembered)
            self._input_infos.cleanup(remembered)
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
        last, snapshots = self.last_processed_ms, self._snapshots
        if last is not None and snapshots.each_batch and snapshots.any_due(last):
            self._checkpoints.checkpoint_batch(last, True)

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
