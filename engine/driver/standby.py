"""A hot-standby driver: waits beside the active one, warm, and takes its stream over.

A context from ``getOrCreate(..., standby=True)`` whose ``start()`` finds a live leader becomes a
standby. Until it leads it writes nothing anywhere (no checkpoint, no WAL, no RDD checkpoint
directory, no output), and keeps itself ready:

* **warm**: its SparkContext and graph exist (built by ``setupFunc`` or from the checkpoint's
  code); a job shaped like a batch warms the JVM, and a chain of cached steps starts
  ``standby_tail.WORKERS_PER_CORE`` Python workers per core with the engine imported, kept alive before Spark's
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
generated at once and read while the batch is due (:func:`.standby_tail.read_state_ahead`): a committed batch
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
import threading
import time
from typing import TYPE_CHECKING, Protocol

from sparkwal.checkpoint import Checkpoint, CheckpointError
from sparkwal.checkpoint.errors import CheckpointMismatchError, UnsupportedLogVersionError
from sparkwal.base.service import Service
from sparkwal.wal import LeadershipRefusedError, WalError

from ..errors import one_line
from ..host import DriverFacts
from ..listener import StreamingListenerDriverTakeover, StreamingListenerStreamingStarted
from .standby_tail import StandbyTail, open_jvm_connections, read_state_ahead

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

#: the wait before waiting for the leadership again after a failed takeover, doubling up to MAX_RETAKE_S
RETAKE_AFTER_S = 1.0
MAX_RETAKE_S = 30.0


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
        self.tail: StandbyTail | None = None  # the UI shows how far behind it is
        self._stop = threading.Event()
        self._thread = Service("standby", self._stand_by)
        self._reading: Service | None = None  # a takeover's read of state (read_state_ahead)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop waiting (a takeover under way finishes first), and a takeover's read of state."""
        self._stop.set()
        self._thread.join()
        if self._reading is not None and self._reading.is_alive():
            self._driver.sc.cancelJobGroup(StandbyTail.PRELOAD_GROUP)

    def _stand_by(self) -> None:
        driver = self._driver
        retake_s = RETAKE_AFTER_S
        open_jvm_connections(driver)
        while True:
            tail = self.tail = StandbyTail(driver)
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

    def _take_over(self, tail: StandbyTail) -> tuple[Checkpoint | None, int] | None:
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
            self._reading = Service("standby-takeover-state", read_state_ahead, driver, self._stop).start()
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
