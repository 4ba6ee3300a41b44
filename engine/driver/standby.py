"""A hot-standby driver: waits beside the active one, warm, and takes its stream over.

A context from ``getOrCreate(..., standby=True)`` whose ``start()`` finds a live leader becomes a
standby. Until it leads it writes nothing anywhere (no checkpoint, no WAL, no RDD checkpoint
directory, no output), and keeps itself ready:

* **warm**: its SparkContext and graph exist (built by ``setupFunc`` or from the checkpoint's
  code); a job shaped like a batch warms the JVM, and a chain of cached steps starts
  ``WORKERS_PER_CORE`` Python workers per core with the engine imported, kept alive before Spark's
  idle timeout (1 min) would end them;
* **tailing**, on a thread of its own: it reads the newest DStream checkpoint whenever a newer one
  appears, applies it to its graph (inputs' remembered files, state snapshot references), and
  reads the state a takeover from it would start from into its executors, cached
  (:meth:`sparkwal.engine.state.snapshots.StateSnapshots.preload`: a delta snapshot is applied to the
  state held, only a full one is read whole), so a takeover re-reads only what was written since.
  Listeners get ``onStandbyReady`` once the warm-up and the first of these reads are done;
* **polling** the leadership (:meth:`sparkwal.engine.driver.leadership.DriverLeadership.wait_for`) on another
  thread, so that no job of the tail delays it: every 10 ms on a local directory, at the lease's
  expiry on an object store.

Taking over: the tail stops (a warm-up job under way cancelled; a read of state goes on, as the
takeover's first batch needs it), the newest checkpoint (and the offsets/commits logs, the tracker's
WAL) is read and Spark's restart rule applied, exactly as a cold restart does (every pending or
missed batch re-runs with its logged inputs, committed batches are not output again; the receivers
launch once the first re-run has completed: ``receiver_lifecycle.start_receivers``), then the next
batch runs. When no batch re-runs its outputs (a handover), the state that batch builds on is
generated at once and read while the batch is due (:func:`_read_state`): a committed batch
re-generated runs no job, so that state would wait for the first new batch's generation (0.4-0.8 s
for a ``mapWithState`` run on the driver). Listeners get ``onDriverTakeover``. The leadership is
renewed from the moment it is taken, through the takeover's reads. A standby that loses a race for
the leadership stays a standby; a takeover that fails on the storage (an ``OSError``, a ``WalError``
or ``CheckpointError`` reading it, the new leadership lost) gives the leadership up, logs a warning
and waits again, tailing, to take over later (:func:`retriable`); one the program cannot run (its
graph does not match the checkpoint, ...) stays failed, as does a fenced leader (its context has
stopped).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Protocol

from sparkwal.checkpoint import Checkpoint, CheckpointError, CheckpointFollower
from sparkwal.checkpoint.errors import CheckpointMismatchError, UnsupportedLogVersionError
from sparkwal.base.service import Service
from sparkwal.wal import LeadershipRefusedError, WalError

from .. import config
from ..errors import one_line
from ..cluster import start_python_workers
from ..listener import (StreamingListenerDriverTakeover, StreamingListenerStandbyReady,
                       StreamingListenerStreamingStarted)

from ..host import DriverFacts

if TYPE_CHECKING:
    from ..state import StateSnapshots
    from .events import EventBus
    from .leadership import DriverLeadership
    from .generator import JobGenerator
    from .recovery import RestartFacts
    from .scheduler import JobScheduler


class StandbyHost(DriverFacts, Protocol):
    """What a standby reads and calls of its driver (which hands itself in): to wait, tail, and
    take over through the driver's own ``restore`` and ``start_active``."""

    @property
    def events(self) -> EventBus: ...
    @property
    def snapshots(self) -> StateSnapshots: ...
    @property
    def leadership(self) -> DriverLeadership | None: ...
    @property
    def leader_event(self) -> threading.Event: ...
    @property
    def active_lock(self) -> threading.Lock: ...
    @property
    def lock(self) -> threading.RLock: ...
    @property
    def restart(self) -> RestartFacts: ...
    @property
    def generator(self) -> JobGenerator: ...
    @property
    def scheduler(self) -> JobScheduler: ...
    def current_leader(self): ...
    def prepare_program(self) -> tuple[bytes, list[list[str]]]: ...
    def restore(self, checkpoint: Checkpoint, kind: str | None = None) -> None: ...
    def start_active(self, kind: str | None = None) -> None: ...
    def keep_leadership(self) -> None: ...
    def report_error(self, error: BaseException, time_ms: int | None) -> None: ...

log = logging.getLogger(__name__)

TAIL_EVERY_S = 0.5
REWARM_EVERY_S = 40.0  # Spark stops a Python worker idle for 60 s
#: the wait before waiting for the leadership again after a failed takeover, doubling up to MAX_RETAKE_S
RETAKE_AFTER_S = 1.0
MAX_RETAKE_S = 30.0
READ_AHEAD_WAIT_S = 10.0  # for a takeover's re-generated batches, before reading their state


def retriable(error: BaseException) -> bool:
    """Whether a takeover that failed with ``error`` is tried again: the storage failed (or the
    leadership just taken was lost), not the program (which cannot run the checkpoint)."""
    return isinstance(error, (OSError, WalError, CheckpointError)) and not isinstance(
        error, (LeadershipRefusedError, CheckpointMismatchError, UnsupportedLogVersionError))


class Standby:
    """A started driver standing by (under ``Driver.active_lock``): its program prepared, a
    thread waiting for the leadership and tailing the leader's checkpoints meanwhile. Owns its
    thread, its tail and whether it still waits (:attr:`waiting`)."""

    def __init__(self, driver: StandbyHost):
        holder = driver.current_leader()
        log.info("%s is led by %s: this context is a hot standby", driver.checkpoint_dir,
                 holder.describe() if holder else "another driver")
        self._driver = driver
        self.program = driver.prepare_program()  # (an unpicklable graph fails start() here too)
        self.waiting = True  # False once it took over
        self.tail: _Tail | None = None  # the UI shows how far behind it is
        self._stop = threading.Event()
        self._thread = Service("standby", self._stand_by)
        self._reading: Service | None = None  # a takeover's read of state (_read_state)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop waiting (a takeover under way finishes first), and a takeover's read of state."""
        self._stop.set()
        self._thread.join()
        if self._reading is not None and self._reading.is_alive():
            self._driver.sc.cancelJobGroup(_Tail.PRELOAD_GROUP)

    def _stand_by(self) -> None:
        driver = self._driver
        retake_s = RETAKE_AFTER_S
        open_jvm_connections(driver)
        while True:
            tail = self.tail = _Tail(driver)
            tail.start()
            try:
                lead = driver.leadership.wait_for(self._stop)
            except BaseException as e:  # noqa: BLE001
                with tail.lock:
                    tail.stop()
                self._fail(e)
                return
            if lead is None:  # stopped while waiting
                with tail.lock:
                    tail.stop()
                return
            try:
                driver.keep_leadership()  # renewed from now on: a long recovery keeps it
                took = self._take_over(tail)
            except BaseException as e:  # noqa: BLE001  (what had started was stopped by start_active)
                started = driver.leadership.started  # the stream ran: no way back to standing by
                self.waiting = True  # stop() then ends it as the standby it still is
                with tail.lock:
                    tail.stop()
                driver.leadership.release()
                if started or not retriable(e):
                    self._fail(e)
                    return
                log.warning("%s: the takeover failed, so this standby gave the leadership up and waits for it "
                            "again in %.0f s: %s", driver.checkpoint_dir, retake_s, one_line(e))
                if self._stop.wait(retake_s):
                    return
                retake_s = min(MAX_RETAKE_S, 2 * retake_s)
                continue
            if took is not None:
                self._announce(*took)
            return

    def _fail(self, error: BaseException) -> None:
        self._driver.report_error(error, None)
        self._driver.leader_event.set()  # awaitLeadership returns, raising the error

    def _take_over(self, tail: _Tail) -> tuple[Checkpoint | None, int] | None:
        """Held leadership in hand: resume the stream from the newest checkpoint, as the leader;
        ``(the checkpoint resumed from, ms it took)``, or None when stopped first."""
        driver = self._driver
        began = time.monotonic()
        with driver.active_lock, driver.lock, tail.lock:
            tail.stop(keep_preload=True)
            if self._stop.is_set():
                driver.leadership.release()
                return None
            tail.read_newest(preload=False, force=True)  # whatever the old leader wrote since the last look
            cp = tail.checkpoint
            self.waiting = False
            driver.start_active(kind="takeover")
        if not driver.restart.rerun_batch_times:  # (batches re-run with outputs compute their state themselves)
            self._reading = Service("standby-takeover-state", _read_state, driver, self._stop).start()
        return cp, int((time.monotonic() - began) * 1000)

    def _announce(self, cp: Checkpoint | None, took: int) -> None:
        driver = self._driver
        event = StreamingListenerDriverTakeover(driver.leader_epoch or 0, cp.checkpoint_time_ms if cp else None,
                                                took, tuple(driver.restart.rerun_batch_times))
        log.warning("took over %s at epoch %d in %d ms: resumed from checkpoint %s, re-running %s",
                    driver.checkpoint_dir, event.epoch, took, event.resumed_from_ms, event.rerun_batch_times)
        driver.events.post(event)
        driver.events.post(StreamingListenerStreamingStarted(driver.clock.now_ms()))
        driver.leader_event.set()  # after the listeners heard of it: awaitLeadership's callers may look


class _Tail:
    """The newest checkpoint seen, applied to the graph ahead of a takeover, on a thread of its
    own (its Spark jobs never delay the leadership polling), with its jobs in job groups that a
    takeover or a stop cancels."""

    JOB_GROUP = "sparkwal-standby"
    PRELOAD_GROUP = "sparkwal-standby-preload"

    def __init__(self, driver: StandbyHost):
        self._driver = driver
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
        self.preload_state = driver.settings[config.STANDBY_PRELOAD_STATE]

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
        sc = self._driver.sc
        sc.cancelJobGroup(self.JOB_GROUP)
        if not keep_preload:
            sc.cancelJobGroup(self.PRELOAD_GROUP)

    def _run(self) -> None:
        self._driver.sc.setJobGroup(self.JOB_GROUP, "hot standby: warm-up", interruptOnCancel=True)
        while not self._stop.is_set():
            try:
                self.poll()
                if not self._ready and not self._stop.is_set():
                    self._ready = True
                    cp = self.checkpoint
                    self._driver.events.post(StreamingListenerStandbyReady(
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
                        self._driver.checkpoint_dir, TAIL_EVERY_S, text)
            log.debug("tailing %s", self._driver.checkpoint_dir, exc_info=error)
        else:
            log.warning("%s: the standby reads the leader's checkpoints again", self._driver.checkpoint_dir)
        self._failing = text

    def poll(self) -> None:
        now = time.monotonic()
        if now >= self._next_warm:  # the whole warm-up once, then keep the workers alive
            with self.in_job:
                if self._stop.is_set():
                    return
                warm_up(self._driver.sc, light=self._next_warm > 0)
            self._next_warm = now + REWARM_EVERY_S
        with self.lock:
            if self._stop.is_set():
                return
            loaded = self.read_newest(preload=self.preload_state)
        if loaded:  # outside the lock: a takeover goes on beside it
            sc = self._driver.sc
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
                self._driver.snapshots.drop_unwanted()

    def read_newest(self, preload: bool, force: bool = False) -> list:
        """Apply the newest checkpoint, when it changed, to the graph (call with :attr:`lock`
        held); with ``preload``, also register the state a takeover from it would start from,
        and return the RDDs that still need reading. A read that fails raises: a takeover
        (``force``) must not start from an older checkpoint (it fails, and is tried again), and
        the tail logs it (a checkpoint being replaced is no failure: the reader falls back)."""
        driver = self._driver
        if self._follower is None:
            self._follower = CheckpointFollower(driver.location)
        cp = self._follower.read_if_changed(force)
        seen = self.checkpoint
        if cp is None or (seen is not None and cp.checkpoint_time_ms == seen.checkpoint_time_ms
                          and cp.leader_epoch == seen.leader_epoch and cp.pending_times_ms == seen.pending_times_ms
                          and cp.data.get("state") == seen.data.get("state")):
            return []  # (a batch's completion is written again once its snapshot is)
        # a standby on a new version of the program takes each checkpoint of the old one by its plan
        driver.restore(cp, "upgrade" if driver.restart.kind == "upgrade" else None)
        driver.leadership.min_epoch = max(driver.leadership.min_epoch, cp.leader_epoch)  # epochs only grow
        self.checkpoint = cp
        if not preload:
            return []
        first = min([cp.checkpoint_time_ms, *cp.pending_times_ms])
        return driver.snapshots.preload(first, cp.checkpoint_time_ms, [cp.data.get("completed_ms")])


def _read_state(driver: StandbyHost, stop: threading.Event) -> None:
    """A takeover's first batch starts from the state of the batch before it, which no job of the
    takeover computes (a committed batch is re-generated without its jobs): generated now, as that
    batch's generation would, and read while the batch is due (``stream.read_ahead``: into the
    executors' cache, or to the driver for a ``mapWithState`` run there), not by its generation.
    A stop gives the reads not done up, and cancels the one under way (:meth:`Standby.stop`)."""
    given_up = threading.Event()
    try:
        generated = driver.generator.call(_state_ahead, driver, given_up)
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
        driver.sc.setJobGroup(_Tail.PRELOAD_GROUP, "takeover: the state its first batch starts from",
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


def _state_ahead(driver: StandbyHost, given_up: threading.Event) -> list:
    """On the generation thread, after the re-generated batches: the reads of the state each
    stateful stream's first new batch builds on (none once that batch is generated)."""
    first, reads = driver.generator.timer.first_ms, []
    if first is None or given_up.is_set():
        return []
    try:
        for index in driver.snapshots.by_stream:
            stream = driver.graph.streams[index]
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


def open_jvm_connections(driver: StandbyHost) -> None:
    """One Py4J call from each thread a takeover runs on: this one, the generator's and the job
    threads. PySpark (pinned-thread mode, its default) gives each Python thread a connection of its
    own to the JVM, opened by its first call: 70-80 ms measured on two loaded cores, which a
    takeover's first batch would otherwise spend on each of its threads."""
    def call() -> None:
        driver.sc._jsc.getLocalProperty("spark.jobGroup.id")

    def on_job_thread(all_started: threading.Barrier) -> None:
        try:
            call()
            all_started.wait()  # (else one thread, idle again, takes the next)
        except Exception as e:  # noqa: BLE001  (a warm-up: the first job opens it, slower)
            log.debug("hot standby: a job thread's JVM connection: %r", e)

    try:
        barrier = threading.Barrier(driver.scheduler.concurrent_jobs, timeout=5)
        call()
        driver.generator.call(call)
        driver.scheduler.prestart(lambda: on_job_thread(barrier))
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
