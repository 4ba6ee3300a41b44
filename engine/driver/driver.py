"""The driver behind a :class:`sparkwal.engine.StreamingContext`: one object owning its state.

``StreamingContext`` keeps pyspark's API; everything that runs the stream works on a
:class:`Driver`: the checkpoint directory and its storage options, the leadership and its epoch,
the state snapshots, the job scheduler (which owns the generator, the block and receiver trackers
and the batch log), and the :class:`~sparkwal.engine.driver.events.EventBus` that listeners subscribe to. The driver's
modules read and change these attributes only through this object (a test walks the syntax trees to keep it so).

Its lifecycle is Spark's ``StreamingContext.start``/``stop`` (``StreamingContext.scala``): lead the
checkpoint directory (:mod:`.leadership`) or stand by (:mod:`.standby`), write the program's code
part, recover or start the batch log (:mod:`.batches`) and the batches (:mod:`.recovery`), start the
receivers (:mod:`.receiver_lifecycle`) and the timer (:mod:`.scheduler`); checkpoints as in
:mod:`.checkpointing`.
"""

from __future__ import annotations

import logging
import threading

from pyspark import SparkContext

from sparkwal.base.service import Service
from sparkwal.base.times import batch_name
from sparkwal.checkpoint import Checkpoint, CheckpointWriter, write_code
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.tracker import ReceivedBlockTracker
from sparkwal.wal import SYSTEM_CLOCK, Clock, FencedError, RetryPolicy, StorageLocation, set_default_policy
from sparkwal.wal.leases import request_timeout_s
from sparkwal.wal.retry import default_policy

from .. import cluster, config
from ..config import StreamingConf
from ..errors import BatchFailedError, one_line
from ..graph import DStreamGraph
from ..listener import (StreamingListenerCheckpointWritten, StreamingListenerDriverFenced,
                        StreamingListenerDriverRestarted, StreamingListenerStreamingStarted)
from ..signals import stop_gracefully_on_signals
from ..state import StateSnapshots
from ..upgrade_plan import UpgradePlan
from . import batches, checkpointing, leadership, observability, receiver_lifecycle, recovery, standby
from .backlog import BacklogWatch
from .events import EventBus
from .program import checkpoint_conf, serialize_program
from .generator import BatchSteps, JobGenerator
from .scheduler import GracefulStop, JobScheduler, await_batches
from .states import ACTIVE, INITIALIZED, STOPPED, StreamingContextStateError

log = logging.getLogger(__name__)

#: how long stop() lets the listeners catch up with the events queued for them
LISTENER_DRAIN_S = 30.0


class Driver:
    """The state and lifecycle of one streaming driver. ``context`` is the
    :class:`sparkwal.engine.StreamingContext` it runs for (what :meth:`StreamingContext.getActive`
    returns); ``clock`` drives batch times (a :class:`sparkwal.wal.ManualClock` in tests)."""

    #: The driver started in this process (one at a time, as Spark allows), under ``active_lock``.
    active: Driver | None = None
    active_lock = threading.Lock()

    def __init__(self, context, sc: SparkContext, batch_ms: int, clock: Clock | None,
                 concurrent_jobs: int | None):
        self.context, self.sc = context, sc
        self.settings = StreamingConf.of(sc.getConf())  # every setting, checked once (engine/config.py)
        #: the retries of this driver's storage calls (spark.sparkwal.storage.deadline; each request's answer
        #: within its lease's margin); its checkpoint location carries it, and while it runs it is the default
        self.retry_policy = RetryPolicy(deadline_s=cluster.storage_deadline_s(sc, self.settings),
                                        request_timeout_s=request_timeout_s(self.settings[config.LEASE_TIMEOUT]))
        self._policy_before: RetryPolicy | None = None
        self.batch_ms = batch_ms
        self.clock = clock or SYSTEM_CLOCK
        self.graph = DStreamGraph()
        self.events = EventBus(capacity=self.settings[config.LISTENER_QUEUE_CAPACITY])
        self.location: StorageLocation | None = None  # the checkpoint directory
        self.checkpoint_writer: CheckpointWriter | None = None
        self.state = INITIALIZED
        self.restored: Checkpoint | None = None  # set by getOrCreate when a checkpoint exists
        self.upgrade_plan: UpgradePlan | None = None  # what an upgrade to a changed graph carried
        self.restart = recovery.RestartFacts()  # how it came to be; what its start re-ran, its stop left
        self.snapshots = StateSnapshots(sc, self.settings, batch_ms, self.graph, held=self.lead)
        self.checkpointing = checkpointing.Checkpointing(batch_ms, self.snapshots, lambda: self.leader_epoch)
        self.terminated = threading.Event()
        self.standby_requested, self.rejoiner = False, None  # getOrCreate(..., standby=True): see request_standby
        self.standby: standby.Standby | None = None  # while started as a standby
        self.leadership: leadership.DriverLeadership | None = None  # made at start when checkpointing
        self.leader_event = threading.Event()  # set once this driver is the active one
        self.observer: observability.Observer | None = None  # the UI, metrics and event log
        self.progress_ms: int | None = None  # when a batch last completed (or one fell due): leadership.StallWatch
        self.stopping = False  # errors of jobs cancelled by stop() are not the app's errors
        self.graceful = GracefulStop(self.settings[config.GRACEFUL_STOP_TIMEOUT], batch_ms)  # begun by stop()
        self.error: BaseException | None = None
        self.lock = threading.RLock()
        cluster.choose_python(sc, self.settings)  # before any Python function is wrapped
        jobs = concurrent_jobs or self.settings[config.CONCURRENT_JOBS]
        self.scheduler = JobScheduler(sc, self.clock, batch_ms, jobs, self.events, self.snapshots, self.checkpointing,
                                      self.report_error, lambda: self.fenced)
        self.events.subscribe(BacklogWatch(
            self.batch_ms, self.settings[config.BACKLOG_WARN_INTERVALS], self.clock,
            lambda: len(set(self.scheduler.pending_times()) | set(self.generator.queued_times())),
            self.events.post))

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Lead the checkpoint directory (or stand by) and start the stream; see ``StreamingContext.start``."""
        with Driver.active_lock:
            if self.state == ACTIVE:
                log.warning("StreamingContext has already been started")
                return
            if self.state == STOPPED:
                raise StreamingContextStateError("StreamingContext has already been stopped")
            if Driver.active is not None and Driver.active.state == ACTIVE:
                raise StreamingContextStateError("Only one StreamingContext may be started in this process")
            self.graph.validate()
            receiver_lifecycle.check_block_outputs(self.graph)
            self.snapshots.check_directory()
            self.observer = observability.Observer(  # a bad UI setting fails start() here
                self.sc, self.settings, self.clock, self.batch_ms, self.events, self.snapshots, self.location,
                self.current_leader, lambda: self.standby if self.is_standby else None)
            cluster.prepare(self.sc, self.settings)  # sparkwal's code on the executors, or a clear error
            self.observer.open(self.graph, self.standby_requested)  # before leading: a UI port in use fails start()
            self._use_retry_policy()
            try:
                if self.checkpoint_dir is not None:
                    self.leadership = leadership.for_driver(self)
                    if self.standby_requested and self.leadership.try_take() is None:
                        self.standby = standby.Standby(
                            self.sc, self.settings, self.clock, self.events, self.location, self.graph,
                            self.snapshots, self.scheduler, self.leadership, self.restart, self.prepare_program(),
                            restore=self.restore, start_active=self.start_active,
                            keep_leadership=self.keep_leadership, report_error=self.report_error,
                            locks=(Driver.active_lock, self.lock), leader_event=self.leader_event)
                        self.activate()
                        self.standby.start()
                        return
                    if not self.standby_requested:
                        self.leadership.take()
                self.start_active()
            except BaseException:
                self.observer.close()
                self._restore_retry_policy()
                raise
            self.leader_event.set()
        if self.settings[config.STOP_GRACEFULLY_ON_SHUTDOWN]:
            stop_gracefully_on_signals(self.context)
        self.events.post(StreamingListenerStreamingStarted(self.clock.now_ms()))

    def _use_retry_policy(self) -> None:
        """While it runs, this driver's retry policy is the process's default (for the storage
        calls made without its location); constructing another context changes nothing."""
        self._policy_before = default_policy()
        set_default_policy(self.retry_policy)

    def _restore_retry_policy(self) -> None:
        if self._policy_before is not None:
            set_default_policy(self._policy_before)
            self._policy_before = None

    def activate(self) -> None:
        """This driver is the process's started one (a leader, or a standby waiting)."""
        self.state = ACTIVE
        Driver.active = self

    def start_active(self, kind: str | None = None) -> None:
        """Everything a leading driver starts (under ``active_lock``, leadership held); ``kind``: how it led."""
        if kind is not None:
            self.restart.kind = kind
        code_name: str | None = None
        conf_pairs: list[list[str]] = []
        block_tracker: ReceivedBlockTracker | None = None
        try:
            self.keep_leadership()  # (a standby's already is kept)
            if self.checkpoint_dir is not None:  # the code part first: it may refuse the graph
                prepared = self.standby.program if self.standby is not None else None
                code, conf_pairs = prepared or self.prepare_program()
                code_name = write_code(self.location, code)
                if "://" not in self.checkpoint_dir or self.checkpoint_dir.startswith("file://"):
                    # for users' own rdd.checkpoint() calls, as pyspark.streaming does; the engine
                    # keeps state in snapshots (any fsspec URL), and Spark's JVM would not know
                    # memory:// etc. Set here, not in checkpoint(): Spark creates it at once
                    self.sc.setCheckpointDir(CheckpointLayout(self.checkpoint_dir).rdds)
            block_tracker = receiver_lifecycle.make_block_tracker(
                self.graph, self.location, self.settings, self.clock, self.restored is not None, self.lead())
            self.observer.use_block_tracker(block_tracker)
            if self.checkpoint_dir is not None:
                self.checkpoint_writer = CheckpointWriter(self.location,
                                                          on_written=self.on_checkpoint_written,
                                                          on_error=self.on_checkpoint_error,
                                                          lock=self.lead())
            self.snapshots.use_writer(self.checkpoint_writer)
        except BaseException:
            if block_tracker is not None:  # (its WAL open: a checkpoint writer that failed to start)
                block_tracker.stop()
            if self.leadership is not None:
                self.leadership.release()
            raise
        try:
            batch_log = batches.start_batch_log(self.settings, self.location, self.graph, self.batch_ms,
                                                     self.lead(), self.restored, self.upgrade_plan is not None,
                                                     self.events)
            run = checkpointing.CheckpointedRun(self.checkpoint_writer, self.location, self.graph, batch_log,
                                                code_name, conf_pairs, self.scheduler)
            self.checkpointing.start(run)
            rule = recovery.RestartRule(self.graph, self.snapshots, self.checkpointing, self.generator.timer,
                                        batch_log, block_tracker, self.settings, self.batch_ms,
                                        self.checkpoint_dir)
            plan = rule.fresh_start() if self.restored is None else rule.restart(self.restored)
            self.restart.took(plan)
            if self.leadership is not None:  # the leadership lost since it was taken: the start fails here
                self.leadership.stream_started()
            first = plan.first_ms
            self.progress_ms = self.clock.now_ms() if plan.regenerate else max(self.clock.now_ms(), first)
            receiver_tracker = receiver_lifecycle.make_receiver_tracker(  # (started below)
                self.graph, block_tracker, sc=self.sc, settings=self.settings, clock=self.clock,
                events=self.events, batch_ms=self.batch_ms, report_input=self.scheduler.report_input,
                checkpoint=self.location, leader_epoch=self.leader_epoch, confirm_leadership=self.confirm_leadership)
            self.scheduler.start(BatchSteps(
                self.graph, block_tracker, receiver_tracker,
                batches.BatchPlanner(batch_log, batches.direct_inputs(self.graph), plan.skip_outputs_ms),
                self.confirm_leadership, self.on_batch_committed, self.checkpoint_writer is not None))
            self.generator.rerun(list(plan.regenerate))
            if self.restored is None and self.checkpoint_writer is not None:
                self.checkpointing.write_first(first)
        except BaseException:
            if self.checkpoint_writer is not None:
                self.checkpoint_writer.stop()
            block_tracker.stop()
            if self.leadership is not None:
                self.leadership.release()
            raise
        if receiver_tracker is not None:  # (a takeover's first re-run batch runs before they launch)
            receiver_lifecycle.start_receivers(receiver_tracker, kind, self.settings, plan.rerun_batch_times)
        self.generator.timer.start(first)
        self.activate()
        self.observer.on_active(self.restart, self.restored, self.upgrade_plan, self.lead(), block_tracker)
        facts = self.restart
        if facts.kind != "new" or facts.rerun_batch_times or facts.skipped_batch_times:
            self.events.post(StreamingListenerDriverRestarted(
                facts.kind, self.restored.checkpoint_time_ms if self.restored else None,
                tuple(facts.rerun_batch_times), tuple(facts.skipped_batch_times),
                tuple(self.upgrade_plan.lines()) if self.upgrade_plan is not None else ()))

    def restore(self, checkpoint: Checkpoint, kind: str | None = None) -> None:
        """Apply ``checkpoint`` to the graph and the state snapshots; ``start()`` then restarts
        from it. ``kind``, when given, is how this driver came to be (:attr:`recovery`)."""
        restore = recovery.CheckpointRestore(self.graph, self.snapshots, self.settings, self.batch_ms, self.location)
        plan = restore.apply(checkpoint, kind, said=self.upgrade_plan)
        self.restored = checkpoint
        if kind is not None:
            self.restart.kind, self.upgrade_plan = kind, plan

    def use_checkpoint_directory(self, directory: str | None, storage_options: dict | None) -> None:
        """Checkpoint into ``directory`` (None: no checkpointing), with these fsspec options."""
        self.location = StorageLocation(directory, storage_options, policy=self.retry_policy) if directory else None
        self.snapshots.use_location(self.location)

    @property
    def checkpoint_dir(self) -> str | None:
        """The checkpoint directory's URL (None: no checkpointing)."""
        return self.location.url if self.location is not None else None

    @property
    def storage_options(self) -> dict | None:
        """The checkpoint directory's fsspec options."""
        return self.location.options if self.location is not None else None

    def use_graph(self, graph: DStreamGraph) -> None:
        """Run ``graph`` (a checkpoint's program's) instead of the one built on this driver."""
        self.graph = graph
        self.snapshots.use_graph(graph)

    def request_standby(self, standby: bool, rejoiner=None) -> None:
        """``start()`` stands by while another driver leads; fenced, it rejoins by ``rejoiner`` (engine/rejoin.py)."""
        self.standby_requested, self.rejoiner = standby, rejoiner

    def prepare_program(self) -> tuple[bytes, list[list[str]]]:
        """The checkpoint's code part and conf pairs, as a leader writes them at start (a
        standby prepares them while it waits: 50-100 ms less for a takeover)."""
        return (serialize_program(self.graph, self.batch_ms, self.scheduler.concurrent_jobs, self.checkpoint_dir),
                checkpoint_conf(self.sc))

    # ------------------------------------------------------------------ leadership

    def lead(self):
        """The held lock of the checkpoint directory (None: not leading one)."""
        return self.leadership.held if self.leadership is not None else None

    @property
    def leader_epoch(self) -> int | None:
        return lead.epoch if (lead := self.lead()) is not None else None

    def current_leader(self):
        """Who leads the checkpoint directory now, as its lock records it (holder, epoch,
        ``describe()``); None: no directory, or nobody leads it."""
        return self.leadership.storage.leader(self.leadership.path) if self.leadership is not None else None

    @property
    def is_standby(self) -> bool:
        """Started as a standby and still waiting to lead."""
        return self.standby is not None and self.standby.waiting

    @property
    def fenced(self) -> BaseException | None:
        """Why this driver lost its leadership (None: it did not)."""
        return self.leadership.fenced if self.leadership is not None else None

    def keep_leadership(self) -> None:
        """Renewed from when it is taken, and given up if the stream stalls (:class:`.leadership.StallWatch`)."""
        intervals = self.settings[config.LEADER_STALL_INTERVALS]
        watch = leadership.StallWatch(self.clock, self.batch_ms, intervals,
                                      lambda: None if self.stopping else self.progress_ms) if intervals > 0 else None
        if self.leadership is not None:
            self.leadership.keep(self.on_fenced, stalled=watch)

    def on_fenced(self, error: BaseException) -> None:
        """The leadership is lost: stop running and writing at once (self-fencing); the error ends
        ``awaitTermination``."""
        if self.leadership is None or not self.leadership.record_fence(error):
            return
        log.error("this driver was fenced and stops: %s", error)
        self.events.post(StreamingListenerDriverFenced(str(error)))
        self.generator.timer.stop()
        try:
            self.sc.cancelAllJobs()
        except Exception:  # noqa: BLE001  (the fence stands; its jobs' writes are refused anyway)
            log.warning("could not cancel the running jobs", exc_info=True)
        self.report_error(error, None)

    def on_checkpoint_error(self, error: BaseException) -> None:
        if isinstance(error, FencedError):
            self.on_fenced(error)

    def confirm_leadership(self) -> None:
        """Before a batch's jobs: raises unless this epoch is current (:meth:`.leadership.DriverLeadership.confirm`)."""
        if self.leadership is not None:
            self.leadership.confirm(self.on_fenced)

    @property
    def generator(self) -> JobGenerator:
        """The scheduler's job generator."""
        return self.scheduler.generator

    # ------------------------------------------------------------------ stop

    def stop(self, graceful: bool) -> None:
        """Stop the stream (a standby just stops waiting), then give up the leadership."""
        if self.standby is not None:
            self.standby.stop()
        with self.lock:
            if self.state == STOPPED:
                return
            self.stopping = True
            if self.state == ACTIVE and not self.is_standby:
                self.graceful.begin()
                self.snapshots.each_batch |= graceful  # the batches left snapshot their state: none re-runs
                receivers, blocks = self.scheduler.receiver_tracker, self.scheduler.block_tracker
                if receivers is not None:
                    receiver_lifecycle.stop_receivers(receivers, blocks, graceful,
                                                      self.graceful.remaining_s(), self.terminated)
                self.generator.timer.stop()
                finished = graceful and self.await_batches()
                if not finished:
                    self.scheduler.abandon()
                self.scheduler.stop(wait=finished)
                self.generator.stop(cancel_queued=not finished)
                if self.checkpoint_writer is not None:
                    try:
                        self.checkpoint_writer.stop()
                    except Exception as e:
                        if self.fenced is None and self.error is None:
                            raise
                        log.info("checkpoint writer stopped after the app's error: %s", e)
                blocks.stop()
                for s in batches.direct_inputs(self.graph):
                    s.stop()
            if self.observer is not None:  # its last events are written while still leading
                self.observer.close()
            if self.leadership is not None:  # (a handover's then waits for the new leader: driver/handover.py)
                self.leadership.release(await_successor=graceful and not self.restart.batches_left_for_restart)
            self.state = STOPPED
            self.leader_event.set()  # awaitLeadership returns (False)
            with Driver.active_lock:
                if Driver.active is self:
                    Driver.active = None
            self._restore_retry_policy()
            self.events.stop(LISTENER_DRAIN_S)  # the listeners hear of everything before stop returns
            self.terminated.set()

    def await_batches(self) -> bool:
        """A graceful stop's wait (:func:`.scheduler.await_batches`); the batches not done within
        ``spark.streaming.gracefulStopTimeout`` are named in ``restart.batches_left_for_restart``."""
        left = await_batches(self.generator, self.scheduler, self.graceful.remaining_s, self.graceful.timeout_s)
        self.restart.batches_left_for_restart = left
        return not left

    def raise_error(self) -> None:
        error = self.fenced or self.error  # a fence first: the cause of whatever failed after it (a write refused)
        if error is not None:
            raise error

    # ------------------------------------------------------------------ batches

    def on_batch_committed(self, time_ms: int) -> None:
        """Batch ``time_ms``'s jobs are done and its commit handed to the batch log (which writes it
        once a checkpoint covering the batch is durable; :meth:`.scheduler.JobScheduler._commit`):
        this driver's progress; a handover asked for begins."""
        self.progress_ms = self.clock.now_ms()
        if self.leadership is not None and not self.stopping and self.leadership.take_handover_request():
            # stop gracefully on a thread of its own (the batches generated finish, the checkpoint is
            # written, the leadership given up, the new leader's first batch awaited: driver/handover.py)
            self.snapshots.each_batch = True  # before this batch's completion is checkpointed: its state too
            log.warning("%s: a handover was asked for (sparkwal checkpoint handover): stopping gracefully for a "
                        "standby to take over", self.leadership.url)
            Service("sparkwal-handover", lambda: self.context.stop(stopSparkContext=True, stopGraceFully=True),
                    daemon=False).start()  # the process waits for the stop to finish

    def report_error(self, error: BaseException, time_ms: int | None) -> None:
        if self.stopping or "after interpreter shutdown" in str(error):  # (Python's pools, an app exiting)
            log.info("%s ended by stop(): %s", batch_name(time_ms), error)
            return
        if self.leadership is not None and self.leadership.lost_before(error, self.on_fenced):
            log.info("%s failed after this driver was fenced: %s", batch_name(time_ms), one_line(error))
            return  # a lost leadership is the cause: fenced first
        log.error("error in %s: %s", batch_name(time_ms), one_line(error))
        if self.error is None:  # the app gets the error itself; a JVM's, as one line (its trace kept)
            self.error = BatchFailedError(time_ms, error) if BatchFailedError.wraps(error) else error
        self.terminated.set()

    # ------------------------------------------------------------------ checkpoints

    def on_checkpoint_written(self, time_ms: int) -> None:
        took_ms = self.checkpointing.on_written(time_ms)
        self.events.post(StreamingListenerCheckpointWritten(time_ms, self.leader_epoch, took_ms,
                                                            self.checkpoint_writer.last_written_bytes))
