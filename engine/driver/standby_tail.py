"""What keeps a hot standby ready while it waits (:mod:`.standby`): its tail of the leader's
checkpoints (applied to its graph, the state a takeover would start from read ahead), its warm JVM
and Python workers, and, once it took over, the read of the state its first new batch builds on."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkwal.base.service import Service
from sparkwal.checkpoint import Checkpoint, CheckpointFollower

from .. import config
from ..cluster import start_python_workers
from ..errors import one_line
from ..listener import StreamingListenerStandbyReady

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkwal.wal import StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from ..state import StateSnapshots
    from .events import EventBus
    from .generator import JobGenerator
    from .leadership import DriverLeadership
    from .recovery import RestartFacts
    from .scheduler import JobScheduler

log = logging.getLogger(__name__.removesuffix("_tail"))  # the standby's own log: one name to configure

TAIL_EVERY_S = 0.5
REWARM_EVERY_S = 40.0  # Spark stops a Python worker idle for 60 s
READ_AHEAD_WAIT_S = 10.0  # for a takeover's re-generated batches, before reading their state


class StandbyTail:
    """The newest checkpoint seen, applied to the graph ahead of a takeover, on a thread of its
    own (its Spark jobs never delay the leadership polling), with its jobs in job groups that a
    takeover or a stop cancels. Each checkpoint read is applied by ``restore`` (the driver's, with
    its kind: ``"upgrade"`` on a new version of the program, as ``restart`` says), raises the
    ``leadership``'s lowest epoch, and, with ``spark.sparkwal.standby.preloadState``, has the
    ``snapshots`` read the state a takeover from it starts from."""

    JOB_GROUP = "sparkwal-standby"
    PRELOAD_GROUP = "sparkwal-standby-preload"

    def __init__(self, sc: SparkContext, settings: StreamingConf, events: EventBus, location: StorageLocation,
                 leadership: DriverLeadership, snapshots: StateSnapshots, restart: RestartFacts,
                 restore: Callable[[Checkpoint, str | None], None]):
        self._sc, self._events, self._location, self._leadership = sc, events, location, leadership
        self._snapshots, self._restart, self._restore = snapshots, restart, restore
        self._began = time.monotonic()
        self._ready = False  # onStandbyReady posted
        self.checkpoint: Checkpoint | None = None
        self._next_warm = 0.0
        self._stop = threading.Event()
        self.lock = threading.Lock()  # held while the tail changes the graph (never during a job)
        self.in_job = threading.Lock()  # held while the tail runs Spark jobs (a stop cancels only then)
        self._follower: CheckpointFollower | None = None  # the directory as last looked at
        self._failing: str | None = None  # the last failure logged, until a look works again
        self._thread = Service("standby-tail", self._run)
        self.preload_state = settings[config.STANDBY_PRELOAD_STATE]

    def start(self) -> None:
        self._thread.start()

    def stop(self, keep_preload: bool = False) -> None:
        """Stop tailing (call with :attr:`lock` held, which the tail holds only while it changes
        the graph, never during a Spark job). Its job under way is cancelled, not waited for,
        except, with ``keep_preload`` (a takeover), a read of state: a takeover starts from that
        state (or applies deltas to it), and its first batch's tasks wait for the partitions
        being read rather than read them again."""
        self._stop.set()
        if not self.in_job.locked():  # (a Py4J call: 45 ms a takeover on two loaded cores)
            return
        sc = self._sc
        sc.cancelJobGroup(self.JOB_GROUP)
        if not keep_preload:
            sc.cancelJobGroup(self.PRELOAD_GROUP)

    def _run(self) -> None:
        self._sc.setJobGroup(self.JOB_GROUP, "hot standby: warm-up", interruptOnCancel=True)
        while not self._stop.is_set():
            try:
                self.poll()
                if not self._ready and not self._stop.is_set():
                    self._ready = True
                    cp = self.checkpoint
                    self._events.post(StreamingListenerStandbyReady(
                        cp.checkpoint_time_ms if cp else None,
                        int((time.monotonic() - self._began) * 1000)))
            except Exception as e:  # noqa: BLE001  a job cancelled by a stop, a store failing, ...
                if not self._stop.is_set():
                    self._failed(e)
            else:
                self._failed(None)
            self._stop.wait(TAIL_EVERY_S)

    def _failed(self, error: BaseException | None) -> None:
        """A look that failed, logged once per distinct message (a standby that cannot read the
        leader's checkpoints must not look healthy), and once when a look works again (None)."""
        text = one_line(error) if error is not None else None
        if text == self._failing:
            return
        if text is not None:
            log.warning("%s: the standby could not read the leader's checkpoints (it tries again every %.1f s): %s",
                        self._location.url, TAIL_EVERY_S, text)
            log.debug("tailing %s", self._location.url, exc_info=error)
        else:
            log.warning("%s: the standby reads the leader's checkpoints again", self._location.url)
        self._failing = text

    def poll(self) -> None:
        now = time.monotonic()
        if now >= self._next_warm:  # the whole warm-up once, then keep the workers alive
            with self.in_job:
                if self._stop.is_set():
                    return
                warm_up(self._sc, light=self._next_warm > 0)
            self._next_warm = now + REWARM_EVERY_S
        with self.lock:
            if self._stop.is_set():
                return
            loaded = self.read_newest(preload=self.preload_state)
        if loaded:  # outside the lock: a takeover goes on beside it
            sc = self._sc
            sc.setJobGroup(self.PRELOAD_GROUP, "hot standby: state preload", interruptOnCancel=True)
            try:
                for rdd in loaded:
                    with self.in_job:
                        if self._stop.is_set():
                            return
                        rdd.count()
            finally:
                sc.setJobGroup(self.JOB_GROUP, "hot standby: warm-up", interruptOnCancel=True)
        with self.lock:  # what the newest look no longer needs, now that it is read
            if not self._stop.is_set():
                self._snapshots.drop_unwanted()

    def read_newest(self, preload: bool, force: bool = False) -> list:
        """Apply the newest checkpoint, when it changed, to the graph (call with :attr:`lock`
        held); with ``preload``, also register the state a takeover from it would start from,
        and return the RDDs that still need reading. A read that fails raises: a takeover
        (``force``) must not start from an older checkpoint (it fails, and is tried again), and
        the tail logs it (a checkpoint being replaced is no failure: the reader falls back)."""
        if self._follower is None:
            self._follower = CheckpointFollower(self._location)
        cp = self._follower.read_if_changed(force)
        seen = self.checkpoint
        if cp is None or (seen is not None and cp.checkpoint_time_ms == seen.checkpoint_time_ms
                          and cp.leader_epoch == seen.leader_epoch and cp.pending_times_ms == seen.pending_times_ms
                          and cp.data.get("state") == seen.data.get("state")):
            return []  # (a batch's completion is written again once its snapshot is)
        # a standby on a new version of the program takes each checkpoint of the old one by its plan
        self._restore(cp, "upgrade" if self._restart.kind == "upgrade" else None)
        self._leadership.min_epoch = max(self._leadership.min_epoch, cp.leader_epoch)  # epochs only grow
        self.checkpoint = cp
        if not preload:
            return []
        first = min([cp.checkpoint_time_ms, *cp.pending_times_ms])
        return self._snapshots.preload(first, cp.checkpoint_time_ms, [cp.data.get("completed_ms")])


def read_state_ahead(sc: SparkContext, generator: JobGenerator, snapshots: StateSnapshots, graph: DStreamGraph,
                     stop: threading.Event) -> None:
    """A takeover's first batch starts from the state of the batch before it, which no job of the
    takeover computes (a committed batch is re-generated without its jobs): generated now, as that
    batch's generation would, and read while the batch is due (``stream.read_ahead``: into the
    executors' cache, or to the driver for a ``mapWithState`` run there), not by its generation.
    A stop gives the reads not done up, and cancels the one under way (:meth:`.standby.Standby.stop`)."""
    given_up = threading.Event()
    try:
        generated = generator.call(_state_ahead, generator, snapshots, graph, given_up)
        try:
            reads = generated.result(READ_AHEAD_WAIT_S)
        except TimeoutError:  # the generation thread is busy: too late to help
            given_up.set()
            reads = [] if generated.cancel() else generated.result()
    except Exception as e:  # noqa: BLE001  (stopped, or the state failed: its batch fails and reports it)
        log.debug("the takeover's state, ahead of its first batch: %s", one_line(e))
        return
    failed: BaseException | None = None
    try:
        sc.setJobGroup(StandbyTail.PRELOAD_GROUP, "takeover: the state its first batch starts from",
                              interruptOnCancel=True)
        while reads:  # each one run, or given up (a batch waiting for it then reads it itself)
            read = reads.pop(0)
            try:
                read(failed is None and not given_up.is_set() and not stop.is_set())
            except Exception as e:  # noqa: BLE001  (the batch reads it itself, and reports a real failure)
                failed = e
                log.debug("reading the takeover's state ahead of its first batch: %s", one_line(e))
    finally:
        for read in reads:  # (a batch must not wait for a read that never comes)
            read(False)


def _state_ahead(generator: JobGenerator, snapshots: StateSnapshots, graph: DStreamGraph,
                 given_up: threading.Event) -> list:
    """On the generation thread, after the re-generated batches: the reads of the state each
    stateful stream's first new batch builds on (none once that batch is generated)."""
    first, reads = generator.timer.first_ms, []
    if first is None or given_up.is_set():
        return []
    try:
        for index in snapshots.by_stream:
            stream = graph.streams[index]
            before = stream.previous_batch_ms(first)
            if first in stream.generated_rdds or not stream.has_state_before(before):
                continue
            rdd = stream.get_or_compute(before)
            reads += [stream.read_ahead(rdd)] if rdd is not None else []
    except BaseException:
        for read in reads:  # (a batch must not wait for a read that never comes)
            read(False)
        raise
    return reads


def open_jvm_connections(sc: SparkContext, scheduler: JobScheduler) -> None:
    """One Py4J call from each thread a takeover runs on: this one, the generator's and the job
    threads. PySpark (pinned-thread mode, its default) gives each Python thread a connection of its
    own to the JVM, opened by its first call: 70-80 ms measured on two loaded cores, which a
    takeover's first batch would otherwise spend on each of its threads."""
    def call() -> None:
        sc._jsc.getLocalProperty("spark.jobGroup.id")

    def on_job_thread(all_started: threading.Barrier) -> None:
        try:
            call()
            all_started.wait()  # (else one thread, idle again, takes the next)
        except Exception as e:  # noqa: BLE001  (a warm-up: the first job opens it, slower)
            log.debug("hot standby: a job thread's JVM connection: %r", e)

    try:
        barrier = threading.Barrier(scheduler.concurrent_jobs, timeout=5)
        call()
        scheduler.generator.call(call)
        scheduler.prestart(lambda: on_job_thread(barrier))
    except Exception as e:  # noqa: BLE001  (a warm-up: the takeover opens them itself, slower)
        log.warning("hot standby: could not open the takeover's JVM connections ahead (%s)", e)


WORKERS_PER_CORE = 8


def warm_up(sc, light: bool = False) -> None:
    """Jobs shaped like a streaming batch's (a text file read, a shuffle, a union, a collect) on
    every core, so that the JVM has loaded and compiled what a batch needs, and
    ``WORKERS_PER_CORE`` Python workers per core with the engine imported, all alive at once: a
    takeover's first batch may recompute a few batches of state in one task, and each step and
    each batch's group runs in a Python worker of its own, nested and streaming into the next (a
    new worker's first task cost 0.2-0.4 s more here). ``light``: only the workers, which Spark
    ends after a minute idle. Its files are temporary ones, outside the checkpoint directory."""
    start_python_workers(sc, WORKERS_PER_CORE)
    if light:
        return
    scratch = tempfile.mkdtemp(prefix="sparkwal-warm-up-")
    try:
        path = os.path.join(scratch, "lines.txt")
        with open(path, "w") as f:
            f.write("\n".join(f"w{i} x" for i in range(64)))
        n = max(2, sc.defaultParallelism)
        words = sc.textFile(path, n).flatMap(str.split).map(lambda w: (w, 1))
        pairs = sc.parallelize([(f"w{i}", 1) for i in range(64)], n)
        words.union(pairs).reduceByKey(lambda a, b: a + b, n).cogroup(pairs, n).collect()
        # what sc.setCheckpointDir does at takeover (its first call took 100 ms cold)
        jpath = sc._jvm.org.apache.hadoop.fs.Path(scratch, "rdds")
        fs = jpath.getFileSystem(sc._jsc.hadoopConfiguration())
        fs.mkdirs(jpath)
        fs.getFileStatus(jpath).getPath().toString()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
