"""StreamingContext: the entry point, with pyspark.streaming's names, on plain PySpark RDDs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from pyspark import RDD, SparkContext

from checkpoint import Checkpoint, CheckpointWriter
from tracker import InputInfoTracker, StreamInputInfo
from wal import SYSTEM_CLOCK, Clock

from .dstream import DStream, TransformedDStream, UnionDStream, _ms
from .graph import DStreamGraph
from .inputs import FileInputDStream, QueueInputDStream
from .listener import StreamingListener
from .scheduler import JobGenerator, JobScheduler

log = logging.getLogger(__name__)

INITIALIZED, ACTIVE, STOPPED = "INITIALIZED", "ACTIVE", "STOPPED"


class StreamingContextStateError(RuntimeError):
    """An operation not allowed in the context's current state."""


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
        self._checkpoint_writer: CheckpointWriter | None = None
        self._state = INITIALIZED
        self._terminated = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.RLock()
        jobs = concurrentJobs or int(sparkContext.getConf().get("spark.streaming.concurrentJobs", "1"))
        self._scheduler = JobScheduler(self, jobs)
        self._generator = JobGenerator(self)

    # ------------------------------------------------------------------ properties

    @property
    def sparkContext(self) -> SparkContext:
        return self._sc

    def _check_not_started(self, what: str) -> None:
        if self._state != INITIALIZED:
            raise StreamingContextStateError(
                f"{what} after starting a context is not supported (the context is {self._state})")

    # ------------------------------------------------------------------ configuration

    def checkpoint(self, directory: str) -> None:
        """Write checkpoints (data only) to ``directory`` and checkpoint RDDs under it."""
        self._check_not_started("Setting a checkpoint directory")
        self._checkpoint_dir = directory
        self._sc.setCheckpointDir(f"{directory.rstrip('/')}/rdds")

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

    def textFileStream(self, directory: str) -> DStream:
        """Lines of the text files that appear in ``directory`` (moved in atomically)."""
        self._check_not_started("Adding new inputs")
        return FileInputDStream(self, directory)

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
            first = self._generator.timer.start_time()
            self._graph.start(first - self._batch_ms)
            if self._checkpoint_dir is not None:
                self._checkpoint_writer = CheckpointWriter(self._checkpoint_dir)
            self._generator.timer.start(first)
            self._state = ACTIVE
            StreamingContext._active = self

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
        if self._error is not None:
            raise self._error

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        with self._lock:
            if self._state == STOPPED:
                return
            if self._state == ACTIVE:
                self._generator.timer.stop()
                if stopGraceFully:
                    timeout = float(self._sc.getConf().get("spark.streaming.gracefulStopTimeout",
                                                           str(10 * self._batch_ms / 1000)))
                    if not self._scheduler.wait_idle(timeout):
                        log.warning("graceful stop: batches still running after %s s", timeout)
                else:
                    self._scheduler.cancel_all()
                self._scheduler.stop(wait=stopGraceFully)
                self._generator.stop()
                if self._checkpoint_writer is not None:
                    self._checkpoint_writer.stop()
            self._state = STOPPED
            with StreamingContext._active_lock:
                if StreamingContext._active is self:
                    StreamingContext._active = None
            self._terminated.set()
        if stopSparkContext:
            self._sc.stop()

    @staticmethod
    def getActive() -> StreamingContext | None:
        with StreamingContext._active_lock:
            return StreamingContext._active

    # ------------------------------------------------------------------ internals

    def _post(self, callback: str, event) -> None:
        for listener in list(self._listeners):
            try:
                getattr(listener, callback)(event)
            except Exception:  # noqa: BLE001
                log.warning("listener %r failed in %s", listener, callback, exc_info=True)

    def _report_error(self, error: BaseException, time_ms: int | None) -> None:
        log.error("error in batch %s: %s", time_ms, error)
        if self._error is None:
            self._error = error
        self._terminated.set()

    def _report_input(self, time_ms: int, stream, num_records: int, metadata: dict) -> None:
        try:
            self._input_infos.report_info(time_ms, StreamInputInfo(stream.input_id, num_records, metadata))
        except Exception:  # noqa: BLE001  (a re-generated batch reports again)
            pass

    def _max_remember_ms(self) -> int:
        return max((s.remember_ms or 0) for s in self._graph.streams) if self._graph.streams else 0

    def _checkpoint_rdd(self, stream: DStream, time_ms: int, rdd: RDD) -> None:
        """Cut the lineage of a stateful stream's RDD (kept by the next job that uses it)."""
        if self._checkpoint_dir is not None:
            rdd.checkpoint()
        else:
            rdd.localCheckpoint()

    def _restored_state(self, stream: DStream, time_ms: int) -> RDD | None:
        return None

    def _do_checkpoint(self, time_ms: int, clear_later: bool) -> None:
        if self._checkpoint_writer is None:
            return
        data = {
            "fingerprint": self._graph.fingerprint(),
            "graph": self._graph.describe(),
            "batch_ms": self._batch_ms,
            "zero_time_ms": self._graph.zero_time_ms,
            "inputs": {str(s.input_id): s.checkpoint_data() for s in self._graph.inputs},
        }
        self._checkpoint_writer.write(Checkpoint(time_ms, self._scheduler.pending_times(), data))
