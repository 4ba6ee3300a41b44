"""StreamingContext: the entry point, with pyspark.streaming's names, on plain PySpark RDDs."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from pyspark import RDD, SparkContext

from sparkwal.checkpoint.copy import fork_refusal
from sparkwal.checkpoint.errors import CheckpointMismatchError
from sparkwal.tracker import ReceivedBlockTracker
from sparkwal.wal import Clock, resolve

from . import config, console, rejoin
from .get_or_create import check_setup_func, checkpoint_path, get_or_create, setup_context
from .driver import Driver, upgrade_preview
from .driver.states import ACTIVE, INITIALIZED, STOPPED, StreamingContextStateError
from .dstream import DStream, TransformedDStream, UnionDStream, to_ms
from .errors import CopySourceActiveError
from .inputs import FileInputDStream, QueueInputDStream
from .listener import StreamingListener
from .receiver.block_output import ForEachBlockDStream
from .receiver.input import ReceiverInputDStream
from .receiver.socket_receiver import SocketReceiver
from .sources.batch_log import BatchLog
from .sources.direct import DirectInputDStream
from .state import STATEFUL_OPERATIONS

log = logging.getLogger(__name__)

__all__ = ["ACTIVE", "INITIALIZED", "STOPPED", "CheckpointMismatchError", "CopySourceActiveError",
           "StreamingContext", "StreamingContextStateError"]


class StreamingContext:
    """Runs a graph of DStreams on ``sparkContext`` every ``batchDuration`` seconds.

    ``clock`` (a :class:`sparkwal.wal.ManualClock` in tests) drives batch times; ``concurrentJobs``
    defaults to ``spark.streaming.concurrentJobs`` (1). The machinery behind it is its
    :attr:`driver` (:mod:`sparkwal.engine.driver`).
    """

    #: DStream's stateful operations by name, each ``build(parent, *args) -> DStream`` (their streams
    #: are defined in :mod:`sparkwal.engine.state`, above DStream's module)
    stateful_operations = STATEFUL_OPERATIONS
    #: DStream's ``foreachBlock`` output, ``build(parent, func)`` (its stream is defined with its
    #: outputs in :mod:`sparkwal.engine.receiver.block_output`, above DStream's module)
    block_output_stream = ForEachBlockDStream

    def __init__(self, sparkContext: SparkContext, batchDuration: float | None = None, *,
                 clock: Clock | None = None, concurrentJobs: int | None = None):
        if batchDuration is None or batchDuration <= 0:
            raise ValueError(f"batchDuration must be a positive number of seconds, got {batchDuration!r}")
        self._driver = Driver(self, sparkContext, to_ms(batchDuration), clock, concurrentJobs)
        console.one_line_errors()
        #: start() on a copy whose source a live driver leads runs anyway (see start())
        self.allow_live_source = False
        self._console_back: Callable[[], None] | None = None  # puts Spark's console back at stop() (console.py)

    # ------------------------------------------------------------------ properties

    @property
    def driver(self) -> Driver:
        """The :class:`sparkwal.engine.driver.Driver` behind this context: what the engine's streams and
        tools read (its checkpoint directory, leadership, trackers, event bus); not pyspark's API."""
        return self._driver

    @property
    def sparkContext(self) -> SparkContext:
        return self._driver.sc

    @property
    def uiWebUrl(self) -> str | None:
        """The streaming UI's address (``{uiWebUrl}/streaming/``, ``/api/v1/...``, ``/metrics``) once
        started; None before, and when ``spark.ui.enabled`` is false (:mod:`.driver.observability`)."""
        observer = self._driver.observer
        return observer.url if observer is not None else None

    @property
    def recovery(self) -> str:
        """How this context came to be: "new" (built by the program), "checkpoint" (rebuilt from
        a checkpoint, code included), "upgrade" (the program's graph, the checkpoint's data) or
        "takeover" (a standby that took the stream over)."""
        return self._driver.restart.kind

    @property
    def rerun_batch_times(self) -> list[int]:
        """The batch times a restart re-runs (pending when the driver died, or due while it was
        down), set by start() on a recovered context."""
        return self._driver.restart.rerun_batch_times

    @property
    def skipped_batch_times(self) -> list[int]:
        """The committed batch times a restart found among those to re-run: their outputs do
        not run again (their RDDs are recomputed only if later state needs them)."""
        return self._driver.restart.skipped_batch_times

    @property
    def coalesced_batch_times(self) -> list[int]:
        """The batch times a restart did not run because their input went into its first new
        batch (``spark.sparkwal.recovery.coalesceDowntime``), set by start()."""
        return self._driver.restart.coalesced_batch_times

    @property
    def batches_left_for_restart(self) -> list[int]:
        """The batch times a graceful stop gave up waiting for (its timeout passed): a restart
        runs them."""
        return self._driver.restart.batches_left_for_restart

    @property
    def receivedBlockTracker(self) -> ReceivedBlockTracker | None:
        """The tracker every batch asks for its received blocks first (None before start())."""
        return self._driver.scheduler.block_tracker

    @property
    def receiverTracker(self):
        """The driver side of the receivers (endpoint, placement, statistics), made by start()
        when the graph has receiver inputs; else None."""
        return self._driver.scheduler.receiver_tracker

    @property
    def batchLog(self) -> BatchLog | None:
        """The offsets/commits logs that number and commit the batches (None before start() or
        without a checkpoint); see :mod:`sparkwal.engine.sources.batch_log`."""
        return self._driver.scheduler.batch_log

    @property
    def leaderEpoch(self) -> int | None:
        """The epoch at which this driver leads its checkpoint directory (None: not leading)."""
        return self._driver.leader_epoch

    def _check_not_started(self, what: str) -> None:
        if self._driver.state != INITIALIZED:
            raise StreamingContextStateError(
                f"{what} after starting a context is not supported (the context is {self._driver.state})")

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
        directory = checkpoint_path(directory, "directory")
        if directory is not None:
            storage, root = resolve(directory, storage_options)
            storage.makedirs(root)
            if "://" not in directory:  # qualified, as Spark's checkpoint() does: tasks run elsewhere
                directory = root
        self._driver.use_checkpoint_directory(directory, storage_options)
        # Spark's RDD checkpoint directory (<directory>/rdds) is set by start(), once this
        # driver leads the directory: Spark creates it at once, and a standby writes nothing

    def remember(self, duration: float) -> None:
        """Keep each stream's RDDs for at least ``duration`` seconds."""
        self._check_not_started("Changing the remember duration")
        self._driver.graph.remember(to_ms(duration))

    def addStreamingListener(self, streamingListener: StreamingListener) -> None:
        """Subscribe ``streamingListener`` to the driver's events; it is called on the listener
        bus's own thread, in order, so a slow listener does not stall the stream
        (:mod:`sparkwal.engine.driver.events`)."""
        self._driver.events.subscribe(streamingListener, queued=True)

    # ------------------------------------------------------------------ inputs

    def queueStream(self, rdds: Sequence, oneAtATime: bool = True, default=None) -> DStream:
        """A stream of the given RDDs (or lists, parallelized): one per batch, or all at once."""
        self._check_not_started("Adding new inputs")
        sc = self._driver.sc
        if default is not None and not isinstance(default, RDD):
            default = sc.parallelize(default)
        rdds = [r if isinstance(r, RDD) else sc.parallelize(list(r)) for r in rdds]
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
        """The stream of what ``receiver`` (an :class:`sparkwal.engine.Receiver`) stores; it runs on an
        executor, occupying one core, from ``start()`` to ``stop()``."""
        self._check_not_started("Adding new inputs")
        return ReceiverInputDStream(self, receiver)

    def socketTextStream(self, hostname: str, port: int, storageLevel=None) -> DStream:
        """UTF-8 lines read from ``hostname:port`` over TCP (reconnecting when it drops)."""
        return self.receiverStream(SocketReceiver(hostname, port, storageLevel))

    def directStream(self, source, fromOffsets: dict | None = None, *,
                     failOnDataLoss: bool = True) -> DStream:
        """The records of ``source`` (an :class:`sparkwal.engine.sources.ReplayableSource`), read by tasks
        straight from it: each batch is a range of offsets per partition, logged before the batch
        runs and committed after its outputs, so that a restart re-runs exactly the uncommitted
        batches. Each batch's RDD answers ``offsetRanges()``. ``fromOffsets`` ({(topic, partition):
        offset}) is where a stream without a checkpoint starts (else the source's initial offsets);
        a checkpoint's offset log takes precedence."""
        self._check_not_started("Adding new inputs")
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
        :mod:`sparkwal.engine.driver.leadership`): a directory led by a live driver makes this raise
        :class:`DriverAlreadyActiveError`, having written nothing, unless the context came from
        ``getOrCreate(..., standby=True)``: it then returns at once as a standby
        (:meth:`isStandby`), which takes over when the leader dies (:meth:`awaitLeadership`).

        A checkpoint directory copied by ``sparkwal checkpoint copy`` whose source a live driver
        still leads makes this raise :class:`CopySourceActiveError` first, having written nothing
        (the copy is a fork: both drivers would consume the same inputs), unless
        ``spark.sparkwal.copy.allowLiveSource`` or :attr:`allow_live_source` is true."""
        driver = self._driver
        if upgrade_preview.requested():  # sparkwal upgrade plan, for a program that makes its context itself
            upgrade_preview.write_and_exit(driver, driver.checkpoint_dir, "fresh", driver.storage_options)
        if driver.state == INITIALIZED and driver.checkpoint_dir is not None:
            refused = fork_refusal(driver.checkpoint_dir, driver.storage_options,
                                   self.allow_live_source or driver.settings[config.ALLOW_LIVE_SOURCE])
            if refused is not None:
                raise CopySourceActiveError(*refused)
        if self._console_back is None:
            self._console_back = console.quiet_spark(driver.sc, driver.settings)
        driver.start()

    def isStandby(self) -> bool:
        """True while this context is a started standby, waiting to take over its checkpoint
        directory from the driver that leads it."""
        return self._driver.is_standby

    def currentLeader(self):
        """The driver that leads this context's checkpoint directory, as the directory's lock
        records it (``holder``, ``epoch``, ``describe()``); None when none does (or there is no
        checkpoint directory, or the context has not started)."""
        return self._driver.current_leader()

    def awaitLeadership(self, timeout: float | None = None) -> bool:
        """Block until this context is the active driver (True), or ``timeout`` seconds passed,
        or it stopped (False). An error of the takeover is raised here."""
        self._wait(lambda driver: driver.leader_event, timeout)
        driver = self._driver
        return driver.leader_event.is_set() and driver.state == ACTIVE and not driver.is_standby

    def awaitTermination(self, timeout: float | None = None) -> None:
        """Wait until the context stops; an error raised in a batch is raised here."""
        self._wait(lambda driver: driver.terminated, timeout)

    def awaitTerminationOrTimeout(self, timeout: float) -> bool:
        """True if the context stopped (or failed) within ``timeout`` seconds."""
        return self._wait(lambda driver: driver.terminated, timeout)

    def _wait(self, event: Callable[[Driver], threading.Event], timeout: float | None) -> bool:
        """Wait for ``event`` of the driver (True) or ``timeout``, raising its error; a fenced leader of
        ``getOrCreate(..., standby=True)`` rejoins as a standby and the wait goes on (:mod:`.rejoin`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            driver = self._driver
            happened = event(driver).wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            rejoiner = driver.rejoiner
            if rejoiner is None or not rejoiner.rejoin(lambda: self._driver, driver, self._start_rejoined):
                driver.raise_error()
                return happened

    def _start_rejoined(self, fresh: Driver, fenced: Driver) -> bool:
        self._driver, fresh.context = fresh, self
        try:
            self.start()
        except Exception as e:  # noqa: BLE001  (logged; the fence is raised)
            self._driver = fenced
            fresh.stop(graceful=False)
            rejoin.failed(fenced, e)
            return False
        log.warning("%s: rejoined as a %s", fenced.checkpoint_dir, "standby" if fresh.is_standby else "leader")
        return True

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        """Stop the streams (a standby just stops waiting: the active driver is not touched), then
        give up the leadership; ``stopSparkContext`` stops the SparkContext too."""
        if self._driver.rejoiner is not None:  # (after a rejoin under way: this stops the driver it started)
            self._driver.rejoiner.stopping()
        driver = self._driver
        driver.stop(stopGraceFully)
        put_back, self._console_back = self._console_back, None
        if put_back is not None:
            put_back()
        if stopSparkContext:
            driver.sc.stop()

    def graceful_stop_timeout_s(self) -> float:
        """``spark.streaming.gracefulStopTimeout`` in seconds (Spark's default: 10 batch
        intervals); Spark reads it as milliseconds when it has no unit."""
        return self._driver.graceful.timeout_s

    @staticmethod
    def getActive() -> StreamingContext | None:
        with Driver.active_lock:
            return Driver.active.context if Driver.active is not None else None

    @staticmethod
    def getOrCreate(checkpointPath: str | os.PathLike | None, setupFunc: Callable[[], StreamingContext],
                    *, upgrade: bool = False, storage_options: dict | None = None,
                    standby: bool = False, clock: Clock | None = None,
                    allow_live_source: bool = False, allow_other_app: bool = False) -> StreamingContext:
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
        on (as the constructor's; ``setupFunc`` makes its own context). Recovering without
        ``upgrade`` runs the code stored in the checkpoint directory: trust that directory like
        the program itself.

        ``standby=True``: if a live driver leads ``checkpointPath``, the context's ``start()``
        returns at once and it waits as a hot standby (``isStandby()``), writing nothing, until
        it takes the stream over from the newest checkpoint when that driver dies (see
        :mod:`sparkwal.engine.driver.standby`); with no live leader it starts as the active driver.
        Fenced as a leader (its lease lapsed and another driver took over), it rejoins as a standby
        and its ``await...`` wait goes on (:mod:`sparkwal.engine.rejoin`).

        ``allow_live_source=True`` (as ``spark.sparkwal.copy.allowLiveSource``): ``start()`` on a
        copy whose source a live driver leads runs anyway (see :meth:`start`), two drivers then
        consuming the same inputs.

        A checkpoint written by an application of another ``spark.app.name`` than the active
        SparkContext's is not recovered (its program would run): :class:`AnotherApplicationError`
        names both, unless ``allow_other_app=True`` (as ``spark.sparkwal.recover.allowOtherApp``)."""
        console.one_line_errors()
        path = checkpoint_path(checkpointPath)
        check_setup_func(setupFunc)
        if path is None:
            if standby:
                raise ValueError("standby=True needs a checkpoint directory (checkpointPath is None)")
            return setup_context(setupFunc, StreamingContext)
        def make() -> StreamingContext:
            return get_or_create(StreamingContext, path, lambda: setup_context(setupFunc, StreamingContext),
                                 upgrade, storage_options, clock, allow_other_app)
        ssc = make()
        ssc.driver.request_standby(standby, rejoin.Rejoiner(make) if standby else None)  # fenced: see _wait
        ssc.allow_live_source = allow_live_source
        return ssc

    @staticmethod
    def getActiveOrCreate(checkpointPath: str | os.PathLike | None,
                          setupFunc: Callable[[], StreamingContext], *, upgrade: bool = False,
                          storage_options: dict | None = None, standby: bool = False,
                          allow_live_source: bool = False, allow_other_app: bool = False) -> StreamingContext:
        """The active context if there is one, else :meth:`getOrCreate`'s (``checkpointPath``
        may be None, as in pyspark)."""
        checkpoint_path(checkpointPath)
        check_setup_func(setupFunc)
        return StreamingContext.getActive() or StreamingContext.getOrCreate(
            checkpointPath, setupFunc, upgrade=upgrade, storage_options=storage_options, standby=standby,
            allow_live_source=allow_live_source, allow_other_app=allow_other_app)
