"""StreamingContext: the entry point, with pyspark.streaming's names, on plain PySpark RDDs."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from pyspark import RDD, SparkContext

from checkpoint import Checkpoint, CheckpointWriter, write_code
from tracker import InputInfoTracker, ReceivedBlockTracker, StreamInputInfo, TrackerError
from wal import SYSTEM_CLOCK, Clock, FencedError, resolve

from .dstream import DStream, TransformedDStream, UnionDStream, _ms, describe_times
from .backlog import WARN_INTERVALS_KEY, BacklogWatch
from .graph import DStreamGraph
from .inputs import FileInputDStream, QueueInputDStream
from .listener import StreamingListener, StreamingListenerStreamingStarted
from .program import checkpoint_conf, get_or_create, serialize_program
from .scheduler import JobGenerator, JobScheduler
from . import batches, checkpointing, cluster, receivers, restart, standby
from .restart import CheckpointMismatchError  # noqa: F401  (re-exported)
from .leadership import (LEASE_TIMEOUT_KEY, DriverLeadership, confirm_leadership, fence,
                         parse_duration_ms)
from .sources.batch_log import BatchLog
from .state import StateSnapshots

log = logging.getLogger(__name__)

INITIALIZED, ACTIVE, STOPPED = "INITIALIZED", "ACTIVE", "STOPPED"


class StreamingContextStateError(RuntimeError):
    """An operation not allowed in the context's current state."""


def _checkpoint_path(value, name: str = "checkpointPath") -> str | None:
    """``value`` as a path string (None stays None), or a TypeError naming the parameter."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
    raise TypeError(f"{name} must be a non-empty path or URL string (or None for no checkpoint), "
                    f"got {value!r} of type {type(value).__name__}")


def _check_setup_func(setupFunc) -> None:
    if setupFunc is None:
        raise ValueError("setupFunc cannot be None")
    if not callable(setupFunc):
        raise TypeError(f"setupFunc must be callable, got {type(setupFunc).__name__}")


def _setup(setupFunc) -> StreamingContext:
    ssc = setupFunc()
    if not isinstance(ssc, StreamingContext):
        raise TypeError(f"setupFunc must return a StreamingContext, got {type(ssc).__name__}")
    return ssc


class StreamingContext:
    """Runs a graph of DStreams on ``sparkContext`` every ``batchDuration`` seconds.

    ``clock`` (a :class:`wal.ManualClock` in tests) drives batch times; ``concurrentJobs``
    defaults to ``spark.streaming.concurrentJobs`` (1).
    """

    _active: StreamingContext | None = None
    _active_lock = threading.Lock()

    def __init__(self, sparkContext: SparkContext, batchDuration: float | None = None, *,
                 clock: Clock | None = None, concurrentJobs: int | None = None):
        if batchDuration is None or batchDuration <= 0:
            raise ValueError(f"batchDuration must be a positive number of seconds, got {batchDuration!r}")
        self._sc = sparkContext
        self._batch_ms = _ms(batchDuration)
        self._clock = clock or SYSTEM_CLOCK
        self._graph = DStreamGraph()
        self._listeners: list[StreamingListener] = []
        self._input_infos = InputInfoTracker()
        self._checkpoint_dir: str | None = None
        self._storage_options: dict | None = None  # fsspec options of the checkpoint directory
        self._checkpoint_writer: CheckpointWriter | None = None
        self._state = INITIALIZED
        self._restored: Checkpoint | None = None  # set by getOrCreate when a checkpoint exists
        #: How this context came to be: "new" (built by the program), "checkpoint" (rebuilt from
        #: a checkpoint, code included) or "upgrade" (the program's graph, the checkpoint's data).
        self.recovery = "new"
        self._code_name: str | None = None  # the checkpoint's code part (written by start())
        #: The batch times a restart re-runs (pending when the driver died, or due while it was
        #: down), set by start() on a recovered context.
        self.rerun_batch_times: list[int] = []
        #: The committed batch times a restart found among those to re-run: their outputs do
        #: not run again (their RDDs are recomputed only if later state needs them).
        self.skipped_batch_times: list[int] = []
        self._conf_pairs: list[list[str]] = []
        self._snapshots = StateSnapshots(self)
        self._checkpoints_written = 0
        self._code_parts_cleaned = False  # earlier runs' code parts deleted (see checkpointing)
        self._batch_log: BatchLog | None = None  # made by start() when checkpointing
        self._block_tracker: ReceivedBlockTracker | None = None  # made by start()
        self._receiver_tracker = None  # made by start() when there are receiver inputs
        self._cleanup_floors: dict[int, list[int]] = {}  # checkpoint time -> oldest batch it may re-run
        self._floors_lock = threading.Lock()  # not self._lock: stop() holds that while the writer ends
        self._terminated = threading.Event()
        self._standby_requested = False  # getOrCreate(..., standby=True)
        self._is_standby = False
        self._prepared_program: tuple[bytes, list[list[str]]] | None = None  # a standby's
        self._leadership: DriverLeadership | None = None  # made by start() when checkpointing
        self._leader_event = threading.Event()  # set once this context is the active driver
        self._standby_stop = threading.Event()
        self._standby_thread: threading.Thread | None = None
        self._fenced: BaseException | None = None
        self._succeeded_ms = -1  # the newest batch whose outputs all succeeded
        #: batch times a restart regenerates without running their outputs (see restart.rerun)
        self._skip_outputs_ms: set[int] = set()
        self._stopping = False  # errors of jobs cancelled by stop() are not the app's errors
        #: The batch times a graceful stop gave up waiting for (its timeout passed): a restart
        #: runs them.
        self.batches_left_for_restart: list[int] = []
        self._graceful_deadline: float | None = None  # set by stop()
        self._error: BaseException | None = None
        self._lock = threading.RLock()
        self._conf = sparkContext.getConf()  # a copy, read once: each getConf() is a JVM round trip
        cluster.choose_python(sparkContext, self._conf)  # before any Python function is wrapped
        jobs = concurrentJobs or int(self._conf.get("spark.streaming.concurrentJobs", "1"))
        self._scheduler = JobScheduler(self, jobs)
        self._generator = JobGenerator(self)
        self._listeners.append(BacklogWatch(
            self._batch_ms, float(self._conf.get(WARN_INTERVALS_KEY, "3")), self._clock,
            lambda: len(set(self._scheduler.pending_times()) | set(self._generator.queued_times())),
            self._post))

    # ------------------------------------------------------------------ properties

    @property
    def sparkContext(self) -> SparkContext:
        return self._sc

    @property
    def receivedBlockTracker(self) -> ReceivedBlockTracker | None:
        """The tracker every batch asks for its received blocks first (None before start())."""
        return self._block_tracker

    @property
    def receiverTracker(self):
        """The driver side of the receivers (endpoint, placement, statistics), made by start()
        when the graph has receiver inputs; else None."""
        return self._receiver_tracker

    @property
    def batchLog(self) -> BatchLog | None:
        """The offsets/commits logs that number and commit the batches (None before start() or
        without a checkpoint); see :mod:`engine.sources.batch_log`."""
        return self._batch_log

    def _check_not_started(self, what: str) -> None:
        if self._state != INITIALIZED:
            raise StreamingContextStateError(
                f"{what} after starting a context is not supported (the context is {self._state})")

    # ------------------------------------------------------------------ configuration

    def checkpoint(self, directory: str | os.PathLike | None, *,
                   storage_options: dict | None = None) -> None:
        """Write checkpoints (data only) and state snapshots to ``directory``, a path or any fsspec
        URL that both the driver and Spark's tasks can reach (``storage_options`` are that
        filesystem's options, e.g. an S3 endpoint; tasks receive them too). None turns
        checkpointing off, as in Spark. The directory is created at once, as Spark's
        ``checkpoint()`` does (on an object store there is nothing to create), and a relative
        path is made absolute, as Spark qualifies it."""
        self._check_not_started("Setting a checkpoint directory")
        directory = _checkpoint_path(directory, "directory")
        if directory is not None:
            storage, root = resolve(directory, storage_options)
            storage.makedirs(root)
            if "://" not in directory:  # qualified, as Spark's checkpoint() does: tasks run elsewhere
                directory = root
        self._checkpoint_dir = directory
        self._storage_options = storage_options if directory is not None else None
        # Spark's RDD checkpoint directory (<directory>/rdds) is set by start(), once this
        # driver leads the directory: Spark creates it at once, and a standby writes nothing

    def remember(self, duration: float) -> None:
        """Keep each stream's RDDs for at least ``duration`` seconds."""
        self._check_not_started("Changing the remember duration")
        self._graph.remember_ms = _ms(duration)

    def addStreamingListener(self, streamingListener: StreamingListener) -> None:
        self._listeners.append(streamingListener)

    # ------------------------------------------------------------------ inputs

    def queueStream(self, rdds: Sequence, oneAtATime: bool = True, default=None) -> DStream:
        """A stream of the given RDDs (or lists, parallelized): one per batch, or all at once."""
        self._check_not_started("Adding new inputs")
        if default is not None and not isinstance(default, RDD):
            default = self._sc.parallelize(default)
        rdds = [r if isinstance(r, RDD) else self._sc.parallelize(list(r)) for r in rdds]
        return QueueInputDStream(self, rdds, oneAtATime, default)

    def textFileStream(self, directory: str, newFilesOnly: bool = True, *,
                       storage_options: dict | None = None) -> DStream:
        """Lines of the text files that appear in ``directory`` (moved in atomically), a local
        path or any fsspec URL (``storage_options``: its filesystem's; on a cluster every executor
        must reach it). ``newFilesOnly=False`` (Scala's fileStream option) also takes files that
        were there when a fresh context started, so an app killed before its first checkpoint
        misses nothing."""
        self._check_not_started("Adding new inputs")
        return FileInputDStream(self, directory, newFilesOnly, storage_options=storage_options)

    def binaryRecordsStream(self, directory: str, recordLength: int, *,
                            storage_options: dict | None = None) -> DStream:
        """Fixed-length binary records (``bytes``) of the files that appear in ``directory``."""
        self._check_not_started("Adding new inputs")
        if not isinstance(recordLength, int) or recordLength <= 0:
            raise ValueError(f"recordLength must be a positive integer, got {recordLength!r}")
        return FileInputDStream(self, directory, True, record_length=recordLength,
                                storage_options=storage_options)

    def receiverStream(self, receiver) -> DStream:
        """The stream of what ``receiver`` (an :class:`engine.Receiver`) stores; it runs on an
        executor, occupying one core, from ``start()`` to ``stop()``."""
        self._check_not_started("Adding new inputs")
        from .receiver.input import ReceiverInputDStream

        return ReceiverInputDStream(self, receiver)

    def socketTextStream(self, hostname: str, port: int, storageLevel=None) -> DStream:
        """UTF-8 lines read from ``hostname:port`` over TCP (reconnecting when it drops)."""
        from .receiver import SocketReceiver

        return self.receiverStream(SocketReceiver(hostname, port, storageLevel))

    def directStream(self, source, fromOffsets: dict | None = None, *,
                     failOnDataLoss: bool = True) -> DStream:
        """The records of ``source`` (an :class:`engine.sources.ReplayableSource`), read by tasks
        straight from it: each batch is a range of offsets per partition, logged before the batch
        runs and committed after its outputs, so that a restart re-runs exactly the uncommitted
        batches. Each batch's RDD answers ``offsetRanges()``. ``fromOffsets`` ({(topic, partition):
        offset}) is where a stream without a checkpoint starts (else the source's initial offsets);
        a checkpoint's offset log takes precedence."""
        self._check_not_started("Adding new inputs")
        from .sources.direct import DirectInputDStream

        return DirectInputDStream(self, source, fromOffsets, failOnDataLoss)

    def union(self, *dstreams: DStream) -> DStream:
        if not dstreams:
            raise ValueError("should have at least one DStream to union")
        if len(dstreams) == 1:
            return dstreams[0]
        return UnionDStream(self, list(dstreams))

    def transform(self, dstreams: Sequence[DStream], transformFunc: Callable) -> DStream:
        """``transformFunc(rdds) -> RDD`` over the RDDs of ``dstreams`` at each batch."""
        return TransformedDStream(self, list(dstreams), lambda t, rdds: transformFunc(rdds))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the streams. With a checkpoint directory the context first leads it (see
        :mod:`engine.leadership`): a directory led by a live driver makes this raise
        :class:`DriverAlreadyActiveError`, having written nothing, unless the context came from
        ``getOrCreate(..., standby=True)``: it then returns at once as a standby
        (:meth:`isStandby`), which takes over when the leader dies (:meth:`awaitLeadership`)."""
        with StreamingContext._active_lock:
            if self._state == ACTIVE:
                log.warning("StreamingContext has already been started")
                return
            if self._state == STOPPED:
                raise StreamingContextStateError("StreamingContext has already been stopped")
            active = StreamingContext._active
            if active is not None and active._state == ACTIVE:
                raise StreamingContextStateError("Only one StreamingContext may be started in this process")
            self._graph.validate()
            self._snapshots.check_directory()
            cluster.prepare(self._sc, self._conf)  # sparkwal's code on the executors, or a clear error
            if self._checkpoint_dir is not None:
                self._leadership = DriverLeadership(self._checkpoint_dir, self._storage_options,
                                                    self._lease_timeout_ms())
                if self._standby_requested and self._leadership.try_take() is None:
                    standby.become_standby(self)
                    return
                if not self._standby_requested:
                    self._leadership.take()
            self._start_active()
            self._leader_event.set()
        if self._conf.get("spark.streaming.stopGracefullyOnShutdown", "false").lower() == "true":
            from .signals import stop_gracefully_on_signals

            stop_gracefully_on_signals(self)
        self._post("onStreamingStarted", StreamingListenerStreamingStarted(self._clock.now_ms()))

    def _start_active(self) -> None:
        """Everything a leading driver starts (under ``_active_lock``, leadership held)."""
        try:
            if self._checkpoint_dir is not None:  # the code part first: it may refuse the graph
                code, self._conf_pairs = self._prepared_program or self._prepare_program()
                self._code_name = write_code(self._checkpoint_dir, code, self._storage_options)
                if "://" not in self._checkpoint_dir or self._checkpoint_dir.startswith("file://"):
                    # for users' own rdd.checkpoint() calls, as pyspark.streaming does; the engine
                    # keeps state in snapshots (any fsspec URL), and Spark's JVM would not know
                    # memory:// etc. Set here, not in checkpoint(): Spark creates it at once
                    self._sc.setCheckpointDir(f"{self._checkpoint_dir.rstrip('/')}/rdds")
            self._block_tracker = self._make_block_tracker()
            if self._checkpoint_dir is not None:
                self._checkpoint_writer = CheckpointWriter(self._checkpoint_dir,
                                                           storage_options=self._storage_options,
                                                           on_written=self._on_checkpoint_written,
                                                           on_error=self._on_checkpoint_error,
                                                           lock=self._lead())
        except BaseException:
            if self._leadership is not None:
                self._leadership.release()
            raise
        try:
            batches.start_batch_log(self)
            if self._restored is None:
                first = restart.fresh_start(self)
            else:
                first = restart.restart(self)
        except BaseException:
            if self._checkpoint_writer is not None:
                self._checkpoint_writer.stop()
            self._block_tracker.stop()
            if self._leadership is not None:
                self._leadership.release()
            raise
        if self._leadership is not None:
            self._leadership.keep(self._on_fenced)
        self._start_receivers()
        self._generator.timer.start(first)
        self._state = ACTIVE
        StreamingContext._active = self

    def _prepare_program(self) -> tuple[bytes, list[list[str]]]:
        """The checkpoint's code part and conf pairs, as a leader writes them at start (a
        standby prepares them while it waits: 50-100 ms less for a takeover)."""
        return serialize_program(self), checkpoint_conf(self._sc)

    def isStandby(self) -> bool:
        """True while this context is a started standby, waiting to take over its checkpoint
        directory from the driver that leads it."""
        return self._is_standby

    def awaitLeadership(self, timeout: float | None = None) -> bool:
        """Block until this context is the active driver (True), or ``timeout`` seconds passed,
        or it stopped (False). An error of the takeover is raised here."""
        self._leader_event.wait(timeout)
        self._raise_error()
        return self._leader_event.is_set() and self._state == ACTIVE and not self._is_standby

    @property
    def leaderEpoch(self) -> int | None:
        """The epoch at which this driver leads its checkpoint directory (None: not leading)."""
        lead = self._lead()
        return lead.epoch if lead is not None else None

    def _lead(self):
        return self._leadership.held if self._leadership is not None else None

    def _lease_timeout_ms(self) -> int:
        return parse_duration_ms(self._conf.get(LEASE_TIMEOUT_KEY, "30s"), LEASE_TIMEOUT_KEY)

    def _on_fenced(self, error: BaseException) -> None:
        fence(self, error)

    def _on_checkpoint_error(self, error: BaseException) -> None:
        if isinstance(error, FencedError):
            fence(self, error)

    def _confirm_leadership(self) -> None:
        confirm_leadership(self)

    def awaitTermination(self, timeout: float | None = None) -> None:
        """Wait until the context stops; an error raised in a batch is raised here."""
        self._terminated.wait(timeout)
        self._raise_error()

    def awaitTerminationOrTimeout(self, timeout: float) -> bool:
        """True if the context stopped (or failed) within ``timeout`` seconds."""
        stopped = self._terminated.wait(timeout)
        self._raise_error()
        return stopped

    def _raise_error(self) -> None:
        if self._fenced is not None:  # the cause of whatever failed after it (a write refused, ...)
            raise self._fenced
        if self._error is not None:
            raise self._error

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        """Stop the streams (a standby just stops waiting: the active driver is not touched), then
        give up the leadership; ``stopSparkContext`` stops the SparkContext too."""
        self._standby_stop.set()
        if self._standby_thread is not None and self._standby_thread is not threading.current_thread():
            self._standby_thread.join()
        with self._lock:
            if self._state == STOPPED:
                return
            self._stopping = True
            if self._state == ACTIVE and not self._is_standby:
                self._graceful_deadline = time.monotonic() + self.graceful_stop_timeout_s()
                self._stop_receivers(stopGraceFully)
                self._generator.timer.stop()
                finished = stopGraceFully and self._await_batches()
                if not finished:
                    self._scheduler.abandon()
                self._scheduler.stop(wait=finished)
                self._generator.stop(cancel_queued=not finished)
                if self._checkpoint_writer is not None:
                    try:
                        self._checkpoint_writer.stop()
                    except Exception:
                        if self._fenced is None:
                            raise
                self._block_tracker.stop()
                for s in batches.direct_inputs(self):
                    s.stop()
            if self._leadership is not None:
                self._leadership.release()
            self._state = STOPPED
            self._leader_event.set()  # awaitLeadership returns (False)
            with StreamingContext._active_lock:
                if StreamingContext._active is self:
                    StreamingContext._active = None
            self._terminated.set()
        if stopSparkContext:
            self._sc.stop()

    def graceful_stop_timeout_s(self) -> float:
        """``spark.streaming.gracefulStopTimeout`` in seconds (Spark's default: 10 batch
        intervals); Spark reads it as milliseconds when it has no unit."""
        value = self._conf.get("spark.streaming.gracefulStopTimeout", None)
        if value is None:
            return 10 * self._batch_ms / 1000
        return parse_duration_ms(value, "spark.streaming.gracefulStopTimeout", default_unit="ms") / 1000

    def _graceful_remaining_s(self) -> float:
        """What is left of a graceful stop's timeout (its receivers' wait and its batches'
        share one ``spark.streaming.gracefulStopTimeout``)."""
        if self._graceful_deadline is None:
            return self.graceful_stop_timeout_s()
        return max(0.0, self._graceful_deadline - time.monotonic())

    def _await_batches(self) -> bool:
        """A graceful stop's wait: every batch due so far generated and run, within
        ``spark.streaming.gracefulStopTimeout``. On timeout the batches not done are left for
        the restart (they are in the checkpoint, logged in the batch log or due again: nothing
        is lost), named in :attr:`batches_left_for_restart` and in one warning."""
        timeout = self.graceful_stop_timeout_s()
        if (self._generator.drain(self._graceful_remaining_s())
                and self._scheduler.wait_idle(self._graceful_remaining_s())):
            return True
        left = sorted(set(self._scheduler.pending_times()) | set(self._generator.queued_times()))
        self.batches_left_for_restart = left
        if left:
            log.warning("graceful stop: %s not done within spark.streaming.gracefulStopTimeout "
                        "(%.1f s) left for the restart (nothing is lost: a restart runs them)",
                        describe_times(left), timeout)
        return not left

    @staticmethod
    def getActive() -> StreamingContext | None:
        with StreamingContext._active_lock:
            return StreamingContext._active

    @staticmethod
    def getOrCreate(checkpointPath: str | os.PathLike | None, setupFunc: Callable[[], StreamingContext],
                    *, upgrade: bool = False, storage_options: dict | None = None,
                    standby: bool = False, clock: Clock | None = None) -> StreamingContext:
        """pyspark's contract: ``setupFunc()`` makes the context only when ``checkpointPath``
        holds no valid checkpoint (the context is then checkpointed there); otherwise the context
        is rebuilt from the checkpoint: its graph with every function, its inputs, state and
        pending batches, on the active SparkContext or on one made from the checkpointed conf.
        ``checkpointPath=None`` (as pyspark accepts) just calls ``setupFunc``.

        ``upgrade=True`` is for a new version of the program: ``setupFunc`` runs, its graph must
        be the checkpoint's (else :class:`CheckpointMismatchError` names the first difference),
        and the checkpoint's data (inputs, state, pending batches) is applied to the new code,
        which never runs the old code. It also recovers checkpoints written before they held
        the program's code. ``clock`` is the clock a context recovered from the checkpoint runs
        on (as the constructor's; ``setupFunc`` makes its own context). Recovering without it runs the code stored in the checkpoint
        directory: trust that directory like the program itself.

        ``standby=True``: if a live driver leads ``checkpointPath``, the context's ``start()``
        returns at once and it waits as a hot standby (``isStandby()``), writing nothing, until
        it takes the stream over from the newest checkpoint when that driver dies (see
        :mod:`engine.standby`); with no live leader it starts as the active driver."""
        path = _checkpoint_path(checkpointPath)
        _check_setup_func(setupFunc)
        if path is None:
            if standby:
                raise ValueError("standby=True needs a checkpoint directory (checkpointPath is None)")
            return _setup(setupFunc)
        ssc = get_or_create(StreamingContext, path, lambda: _setup(setupFunc), upgrade, storage_options,
                            clock=clock)
        ssc._standby_requested = standby
        return ssc

    @staticmethod
    def getActiveOrCreate(checkpointPath: str | os.PathLike | None,
                          setupFunc: Callable[[], StreamingContext], *, upgrade: bool = False,
                          storage_options: dict | None = None, standby: bool = False) -> StreamingContext:
        """The active context if there is one, else :meth:`getOrCreate`'s (``checkpointPath``
        may be None, as in pyspark)."""
        _checkpoint_path(checkpointPath)
        _check_setup_func(setupFunc)
        return StreamingContext.getActive() or StreamingContext.getOrCreate(
            checkpointPath, setupFunc, upgrade=upgrade, storage_options=storage_options, standby=standby)

    # ------------------------------------------------------------------ internals

    def _plan_batch(self, time_ms: int) -> bool:
        return batches.plan_batch(self, time_ms)

    def _make_block_tracker(self) -> ReceivedBlockTracker:
        return receivers.make_block_tracker(self)

    def _start_receivers(self) -> None:
        receivers.start_receivers(self)

    def _stop_receivers(self, graceful: bool) -> None:
        receivers.stop_receivers(self, graceful)

    def _on_batch_done(self, time_ms: int, info) -> None:
        ok = info is None or all(o.failure is None for o in info.output_operation_infos.values())
        if ok:
            self._succeeded_ms = max(self._succeeded_ms, time_ms)
        if self._batch_log is not None:
            self._batch_log.batch_done(time_ms, ok)
        self._snapshots.on_batch_done(time_ms)
        for s in batches.direct_inputs(self):
            s.on_batch_completed(info)
        if self._receiver_tracker is not None:
            self._receiver_tracker.on_batch_completed(time_ms, info)

    def _cleanup_old_blocks(self, thresh_ms: int) -> None:
        if thresh_ms < self._clock.now_ms():
            self._block_tracker.cleanup_old_batches(thresh_ms)
            if self._receiver_tracker is not None:
                self._receiver_tracker.cleanup_old_blocks(thresh_ms)

    def _post(self, callback: str, event) -> None:
        for listener in list(self._listeners):
            try:
                getattr(listener, callback)(event)
            except Exception:  # noqa: BLE001
                log.warning("listener %r failed in %s", listener, callback, exc_info=True)

    def _report_error(self, error: BaseException, time_ms: int | None) -> None:
        if self._stopping:
            log.info("batch %s ended by stop(): %s", time_ms, error)
            return
        log.error("error in batch %s: %s", time_ms, error)
        if self._error is None:
            self._error = error
        self._terminated.set()

    def _report_input(self, time_ms: int, stream, num_records: int, metadata: dict) -> None:
        try:
            self._input_infos.report_info(time_ms, StreamInputInfo(stream.input_id, num_records, metadata))
        except TrackerError:  # a re-generated batch (after a restart) reports its input again
            pass

    def _max_remember_ms(self) -> int:
        return max((s.remember_ms or 0) for s in self._graph.streams) if self._graph.streams else 0

    def _checkpoint_rdd(self, stream: DStream, time_ms: int, rdd: RDD) -> None:
        """Cut the lineage of an RDD due for checkpointing, before any job uses it. A stateful
        stream's RDD, when the context checkpoints, is cut later by its snapshot instead (see
        ``_snapshot_state``); others are checkpointed locally (no files to clean up)."""
        if not (stream.must_checkpoint and self._checkpoint_dir is not None):
            rdd.localCheckpoint()

    def _on_checkpoint_written(self, time_ms: int) -> None:
        checkpointing.on_checkpoint_written(self, time_ms)

    def _do_checkpoint(self, time_ms: int, clear_later: bool) -> None:
        checkpointing.do_checkpoint(self, time_ms, clear_later)
