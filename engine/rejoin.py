"""A fenced leader started by ``getOrCreate(..., standby=True)`` rejoins as a standby.

A leader is fenced when its leadership lapsed (a pause past its lease: a long GC, a frozen VM, a
machine under heavy CPU load) and another driver took the checkpoint directory over at a newer
epoch. A leader started without ``standby=True`` stops, the fence its error (the main job exits
with status 3). One started with it is a driver its operator wants kept beside the stream, so the
context's waits (``awaitTermination``, ``awaitTerminationOrTimeout``, ``awaitLeadership``) instead:

1. stop the fenced driver as any fenced driver stops (nothing more is written under its epoch:
   the storage seam refuses it, see :mod:`sparkwal.engine.driver.leadership`), wait for its
   cancelled batches to end, unpersist what it cached, and bind its streams to a context of its
   own, so that nothing of it still running reaches the new driver;
2. make a new driver exactly as ``getOrCreate`` made the first (the newest checkpoint's program,
   or ``setupFunc``'s with ``upgrade=True``): nothing the fenced epoch computed (generated RDDs,
   the batch log's view, receivers, cached state, files seen) is carried into it, so nothing of it
   can reach a later takeover;
3. start it: beside the live leader it stands by, warm, tailing the newest checkpoints (and takes
   over when that leader ends); with no live leader it leads.

The context object, its listeners (``addStreamingListener``) and its signal handling stay, so the
program's wait goes on. One rejoin at a time, whichever thread waits. No rejoin, the wait raising
the fence as without ``standby=True`` (the process ends, its supervisor starting it anew): when a
stop was asked for (``stop()``, a signal, a handover), for a leader that gave its leadership up
because its stream stalled (:class:`~sparkwal.engine.driver.leadership.LeaderStalledError`: what
stalled it may still hold the process), when its batches' own code does not end within
``JOBS_END_S`` of their cancellation, or when the new driver cannot be made (the store still down,
the program refused: one error line).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkwal.wal import FencedError

from .driver.leadership import LeaderStalledError
from .errors import one_line

if TYPE_CHECKING:
    from .context import StreamingContext
    from .driver import Driver

log = logging.getLogger(__name__)

#: how long the fence's own steps (on the thread that found it) may take before the rejoin stops the driver
FENCE_SETTLES_S = 5.0
#: how long the fenced driver's running batches may take to end once cancelled (a sink's call
#: that does not end keeps the process's old way: the fence raised, the process ends)
JOBS_END_S = 10.0
#: later than any batch time: the fenced graph forgets (and unpersists) every RDD it generated
_FOREVER_MS = 2**62


class Rejoiner:
    """A context's rejoins (one at a time, none once a stop was asked for): made by
    ``getOrCreate(..., standby=True)`` with ``remake``, which makes a context as it did."""

    def __init__(self, remake: Callable[[], StreamingContext]):
        self._remake = remake
        self._lock = threading.RLock()
        self._stop_requested = False

    def stopping(self) -> None:
        """The context is being stopped: a rejoin under way finishes first, and none follows."""
        with self._lock:
            self._stop_requested = True

    def rejoin(self, current: Callable[[], Driver], driver: Driver, start: Callable[[Driver, Driver], bool]) -> bool:
        """True when the context's driver (``current()``) is no longer ``driver``: replaced now
        (``start(fresh, driver)`` swaps it in and starts it), or by another thread's wait; False
        when ``driver`` stays (not fenced, a stop asked for, a stalled leader, the rejoin failed)."""
        if fence_of(driver) is None:
            return False
        with self._lock:
            if current() is not driver:
                return True
            # a stop under way (a signal, a handover, stop() on another thread) is not undone by a rejoin
            if self._stop_requested or driver.stopping or isinstance(fence_of(driver), LeaderStalledError):
                return False
            fresh = replacement(driver, self._remake)
            return fresh is not None and start(fresh, driver)


def fence_of(driver: Driver) -> BaseException | None:
    """Why ``driver`` lost its leadership: its fence, or a write refused under its epoch (a batch
    may report that before the fence is recorded); None when it did not."""
    error = driver.fenced or driver.error
    return error if isinstance(error, FencedError) else None


def replacement(fenced: Driver, remake: Callable[[], StreamingContext] | None) -> Driver | None:
    """Steps 1 and 2 for ``fenced`` (the context then starts the driver returned, step 3); None when
    it may not rejoin (no ``standby=True``) or the new driver could not be made (logged)."""
    fence = fence_of(fenced)
    if remake is None or not fenced.standby_requested or fence is None:
        return None
    log.warning("%s: this driver was fenced (%s); it stops and rejoins as a standby beside the new leader",
                fenced.checkpoint_dir, one_line(fence))
    listeners = fenced.events.queued_subscribers()  # the program's (addStreamingListener)
    fenced.terminated.wait(FENCE_SETTLES_S)  # the fence's own steps (jobs cancelled, error reported) done
    try:
        fenced.stop(graceful=False)
    except Exception as e:  # noqa: BLE001  (the fence stays the context's error, raised by its wait)
        failed(fenced, e)
        return None
    if not fenced.scheduler.wait_idle(JOBS_END_S):  # a batch's own code still running (a sink's call)
        failed(fenced, RuntimeError(f"its batches {fenced.scheduler.pending_times()} still run after {JOBS_END_S:g} "
                                    "s; the process must end for them to"))
        return None
    for listener in listeners:
        fenced.events.unsubscribe(listener)
    stub = _FencedContext(fenced)  # its streams' late calls reach the fenced driver, never the new one
    fenced.context = stub
    for stream in fenced.graph.streams:
        stream.attach(stub)
    fenced.graph.clear_metadata(_FOREVER_MS)
    fenced.snapshots.release_cached()
    try:
        fresh = remake().driver
    except Exception as e:  # noqa: BLE001  (the fence stays the context's error, raised by its wait)
        failed(fenced, e)
        return None
    for listener in fresh.events.queued_subscribers():  # added again by setupFunc: the program's are carried
        fresh.events.unsubscribe(listener)
    for listener in listeners:
        fresh.events.subscribe(listener, queued=True)
    fresh.request_standby(True, fenced.rejoiner)
    return fresh


class _FencedContext:
    """The context of the fenced driver's streams and callbacks once it was replaced: a stop from
    them (a handover's, a late listener's) stops that driver alone, never the SparkContext."""

    def __init__(self, driver: Driver):
        self.driver, self.sparkContext = driver, driver.sc

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        self.driver.stop(stopGraceFully)


def failed(fenced: Driver, error: BaseException) -> None:
    log.error("%s: the fenced driver could not rejoin as a standby: %s", fenced.checkpoint_dir, one_line(error))
