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
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkwal.checkpoint import Checkpoint, CheckpointError
from sparkwal.checkpoint.errors import CheckpointMismatchError, UnsupportedLogVersionError
from sparkwal.base.service import Service
from sparkwal.wal import LeadershipRefusedError, WalError

from ..errors import one_line
from ..listener import StreamingListenerDriverTakeover, StreamingListenerStreamingStarted
from .standby_tail import StandbyTail, open_jvm_connections, read_state_ahead

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkwal.wal import Clock, StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from ..state import StateSnapshots
    from .events import EventBus
    from .leadership import DriverLeadership
    from .recovery import RestartFacts
    from .scheduler import JobScheduler


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
    thread, its tail and whether it still waits (:attr:`waiting`).

    Handed what it reads and runs: the SparkContext, the settings, the clock, the event bus, the
    checkpoint location, the graph, the state snapshots, the job scheduler (its threads warmed,
    its generator's), the leadership (waited for, given up after a failed takeover), the
    restart's facts, and ``program``, the code part prepared (an unpicklable graph fails
    ``start()`` before). The driver's own steps are handed as callables: ``restore`` applies a
    checkpoint tailed, ``start_active`` starts the stream as the leader (under ``locks``, the
    driver's start lock and its lock), ``keep_leadership`` renews it, ``report_error`` ends the
    driver with an error, ``leader_event`` is set once it leads or failed."""

    def __init__(self, sc: SparkContext, settings: StreamingConf, clock: Clock, events: EventBus,
                 location: StorageLocation, graph: DStreamGraph, snapshots: StateSnapshots,
                 scheduler: JobScheduler, leadership: DriverLeadership, restart: RestartFacts,
                 program: tuple[bytes, list[list[str]]], *, restore: Callable[[Checkpoint, str | None], None],
                 start_active: Callable[[str], None], keep_leadership: Callable[[], None],
                 report_error: Callable[[BaseException, int | None], None],
                 locks: tuple[threading.Lock, threading.RLock], leader_event: threading.Event):
        self._sc, self._settings, self._clock, self._events = sc, settings, clock, events
        self._location, self._graph, self._snapshots, self._scheduler = location, graph, snapshots, scheduler
        self._leadership, self._restart, self._locks, self._leader_event = leadership, restart, locks, leader_event
        self._restore, self._start_active = restore, start_active
        self._keep_leadership, self._report_error = keep_leadership, report_error
        holder = leadership.storage.leader(leadership.path)
        log.info("%s is led by %s: this context is a hot standby", location.url,
                 holder.describe() if holder else "another driver")
        self.program = program
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
            self._sc.cancelJobGroup(StandbyTail.PRELOAD_GROUP)

    def _stand_by(self) -> None:
        leadership = self._leadership
        retake_s = RETAKE_AFTER_S
        open_jvm_connections(self._sc, self._scheduler)
        while True:
            tail = self.tail = StandbyTail(self._sc, self._settings, self._events, self._location, leadership,
                                           self._snapshots, self._restart, self._restore)
            tail.start()
            try:
                lead = leadership.wait_for(self._stop)
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
                self._keep_leadership()  # renewed from now on: a long recovery keeps it
                took = self._take_over(tail)
            except BaseException as e:  # noqa: BLE001  (what had started was stopped by start_active)
                started = leadership.started  # the stream ran: no way back to standing by
                self.waiting = True  # stop() then ends it as the standby it still is
                with tail.lock:
                    tail.stop()
                leadership.release()
                if started or not retriable(e):
                    self._fail(e)
                    return
                log.warning("%s: the takeover failed, so this standby gave the leadership up and waits for it "
                            "again in %.0f s: %s", self._location.url, retake_s, one_line(e))
                if self._stop.wait(retake_s):
                    return
                retake_s = min(MAX_RETAKE_S, 2 * retake_s)
                continue
            if took is not None:
                self._announce(*took)
            return

    def _fail(self, error: BaseException) -> None:
        self._report_error(error, None)
        self._leader_event.set()  # awaitLeadership returns, raising the error

    def _take_over(self, tail: StandbyTail) -> tuple[Checkpoint | None, int] | None:
        """Held leadership in hand: resume the stream from the newest checkpoint, as the leader;
        ``(the checkpoint resumed from, ms it took)``, or None when stopped first."""
        began = time.monotonic()
        active_lock, lock = self._locks
        with active_lock, lock, tail.lock:
            tail.stop(keep_preload=True)
            if self._stop.is_set():
                self._leadership.release()
                return None
            tail.read_newest(preload=False, force=True)  # whatever the old leader wrote since the last look
            cp = tail.checkpoint
            self.waiting = False
            self._start_active("takeover")
        if not self._restart.rerun_batch_times:  # (batches re-run with outputs compute their state themselves)
            self._reading = Service("standby-takeover-state", read_state_ahead, self._sc, self._scheduler.generator,
                                    self._snapshots, self._graph, self._stop).start()
        return cp, int((time.monotonic() - began) * 1000)

    def _announce(self, cp: Checkpoint | None, took: int) -> None:
        held = self._leadership.held
        event = StreamingListenerDriverTakeover(held.epoch if held is not None else 0,
                                                cp.checkpoint_time_ms if cp else None,
                                                took, tuple(self._restart.rerun_batch_times))
        log.warning("took over %s at epoch %d in %d ms: resumed from checkpoint %s, re-running %s",
                    self._location.url, event.epoch, took, event.resumed_from_ms, event.rerun_batch_times)
        self._events.post(event)
        self._events.post(StreamingListenerStreamingStarted(self._clock.now_ms()))
        self._leader_event.set()  # after the listeners heard of it: awaitLeadership's callers may look
