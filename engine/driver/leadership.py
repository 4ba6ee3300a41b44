"""The driver's leadership of its checkpoint directory: taking it, waiting for it, keeping it.

One driver leads a checkpoint directory at a time, at an epoch that only grows (the lock and the
epoch live in :meth:`sparkwal.wal.Storage.lead`). The leader writes every log under the directory (DStream
checkpoints, offsets and commits, the tracker's WAL, state snapshot manifests) under that one
leadership, so no second, longer lock can hold a takeover up.

* A driver started without ``standby`` takes the leadership at ``start()``. A live holder makes
  ``start()`` fail with :class:`DriverAlreadyActiveError` naming it, having written nothing; an
  object-store lease that may belong to a dead holder is waited out first (as long as the store's
  ``LeaderHeldError.wait_ms`` says, logging the holder), and the start fails only if the holder
  renewed it meanwhile (``wait_ms`` None).
* A standby polls for it: every 10 ms on a local directory (the kernel frees a dead holder's lock
  at once), and on an object store when the store says the lease may have lapsed (``wait_ms`` of
  :class:`sparkwal.wal.LeaderHeldError`). A poll that fails on the storage (an ``OSError``, a
  :class:`sparkwal.wal.WalError` such as :class:`sparkwal.wal.StorageUnavailableError`) is logged
  once per kind of failure and tried again after a short backoff: a standby is there for when the
  store, and so the leader's lease, comes back.
* The leader renews its leadership on a thread (an object store's lease every third of
  ``spark.streaming.driver.leaseTimeout``, default 30s; a local lock is looked at again) from the
  moment it takes it, so that a long recovery keeps it. When renewal shows it lost the leadership,
  or it could not renew in time, the context is fenced: it stops at once and ``awaitTermination``
  raises :class:`sparkwal.wal.FencedError`. A loss before the stream runs (during a recovery or a
  takeover) is raised by :meth:`DriverLeadership.stream_started` instead: the start fails.
* A leader alive but stalled (no batch completed for ``spark.sparkwal.leader.stallIntervals`` batch
  intervals, :class:`StallWatch`) gives its leadership up for a standby and stops as fenced.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable

from sparkwal.base.service import Service
from sparkwal.wal import (SYSTEM_CLOCK, Clock, FencedError, LeaderHeldError, Leadership, LeadershipRefusedError,
                          StorageLocation, WalError, resolve)

from .. import config
from ..errors import EngineError, one_line
from . import handover
from sparkwal.wal.leases import margin_ms, request_timeout_s

log = logging.getLogger(__name__)


LOCAL_POLL_S = 0.01
#: a standby's wait after a poll of the leadership failed on the storage, doubling up to MAX_POLL_S
FAILED_POLL_S = 0.05
MAX_POLL_S = 1.0
#: how often a stall is looked for (spark.sparkwal.leader.stallIntervals)
STALL_CHECK_S = 1.0
#: how often a leader looks for ``sparkwal checkpoint handover``'s request (after a batch)
HANDOVER_LOOK_S = 1.0


class DriverAlreadyActiveError(EngineError, RuntimeError):
    """Another live driver leads this checkpoint directory (start it with ``standby=True`` to
    wait for it instead); ``leader`` (a ``sparkwal.wal.storage.LeaderInfo``) says which."""

    def __init__(self, message: str, leader=None):
        super().__init__(message)
        self.leader = leader


class DriverLeadership:
    """Leadership of ``directory`` for one context (a role: take, wait, keep, give up)."""

    def __init__(self, directory: str | StorageLocation, storage_options: dict | None, lease_ms: int,
                 clock: Clock | None = None):
        self.storage, self.path = resolve(directory, storage_options)
        self.url = str(directory)
        self.location = StorageLocation.of(directory, storage_options)
        self.lease_ms = lease_ms
        self._clock = clock or SYSTEM_CLOCK  # leases run on real time, whatever drives batches
        self._stop = threading.Event()
        self._renewer: Service | None = None
        self.held: Leadership | None = None
        self.fenced: BaseException | None = None  # why the leadership was lost (first cause)
        self._fence_lock = threading.Lock()
        self.started = False  # the stream runs under it (stream_started): a loss now fences the driver
        self._lost: BaseException | None = None  # a loss before that, which stream_started raises
        #: the newest epoch known to have written the checkpoint: the epoch taken is above it
        self.min_epoch = 0
        #: spark.sparkwal.leader.allowNetworkFilesystem
        self.network_filesystem_ok = False
        self._next_handover_look = 0.0
        self.handing_over = False  # a handover was asked for: the stream stops gracefully
        #: spark.sparkwal.handover.teardownWait, in seconds
        self.teardown_wait_s = 0.0

    def record_fence(self, error: BaseException) -> bool:
        """Note that the leadership is lost, because of ``error``; True the first time only, and
        only once the stream runs (before, :meth:`stream_started` raises it: the start fails)."""
        with self._fence_lock:
            if not self.started:
                self._lost = self._lost or error
                return False
            if self.fenced is not None:
                return False
            self.fenced = error
            return True

    def stream_started(self) -> None:
        """The stream is about to run under the leadership: raise the loss a renewal or a write
        found since it was taken (a recovery or a takeover then fails), else a loss fences from now."""
        with self._fence_lock:
            if self._lost is not None:
                raise self._lost
            self.started = True

    def _lead(self) -> Leadership:
        with self._fence_lock:  # a new leadership: nothing lost or started under it yet
            self.started, self._lost = False, None
        self.held = self.storage.lead(self.path, clock=self._clock, lease_ms=self.lease_ms, min_epoch=self.min_epoch,
                                      network_filesystem_ok=self.network_filesystem_ok)
        return self.held

    def try_take(self) -> Leadership | None:
        try:
            return self._lead()
        except LeaderHeldError:
            return None

    def take(self) -> Leadership:
        """Take it now, waiting out a lease that may be a dead holder's (as long as the store's
        ``wait_ms`` says); raise :class:`DriverAlreadyActiveError` while a live driver holds it."""
        while True:
            try:
                return self._lead()
            except LeaderHeldError as e:
                info, wait_ms = e.info, e.wait_ms
                if wait_ms is None:  # a live process's lock, or a lease renewed since first seen
                    raise DriverAlreadyActiveError(
                        f"{self.url} is the checkpoint directory of a running driver: {info.describe()}. "
                        "Stop it first, or start this one with getOrCreate(..., standby=True) to take "
                        "over when it stops; nothing was written", info) from None
                log.warning("%s: waiting up to %d ms for the lease of %s to lapse (a dead driver's lease "
                            "stays until then)", self.url, wait_ms, info.describe())
                self._clock.wait_till_ms(self._clock.now_ms() + max(1, wait_ms))

    def wait_for(self, stopped: threading.Event, on_poll: Callable[[], None] | None = None
                 ) -> Leadership | None:
        """Block until this process leads (the leadership) or ``stopped`` is set (None). A poll
        that fails on the storage (OSError, WalError: S3's 409 between racing standbys, a full
        disk, a store unavailable past its deadline) is logged once per kind and tried again
        after a short backoff; a FencedError or a refused leadership ends the wait."""
        failing: set[str] = set()  # the kinds of failure logged since the last poll that worked
        backoff_s = FAILED_POLL_S
        while not stopped.is_set():
            try:
                lead: Leadership | None = self._lead()
            except LeaderHeldError as e:
                lead, held = None, e
            except (FencedError, LeadershipRefusedError):
                raise
            except (OSError, WalError) as e:  # (StorageUnavailableError is a WalError)
                if failure_kind(e) not in failing:
                    failing.add(failure_kind(e))
                    log.warning("%s: waiting as a standby; polling the leadership failed, trying again: %s",
                                self.url, one_line(e))
                stopped.wait(backoff_s)
                backoff_s = min(MAX_POLL_S, 2 * backoff_s)
                continue
            if failing:
                log.warning("%s: polling the leadership works again", self.url)
                failing.clear()
                backoff_s = FAILED_POLL_S
            if lead is not None:
                return lead
            if on_poll is not None:
                on_poll()
            stopped.wait(self._poll_delay_s(held))
        return None

    def _poll_delay_s(self, held: LeaderHeldError) -> float:
        """How long before the next poll: 10 ms on a local directory; on an object store when
        the lease may have lapsed (from 10 ms to 1 s; 1 s while its holder is known alive)."""
        if self.storage.is_local:
            return LOCAL_POLL_S
        wait_ms = held.wait_ms
        return MAX_POLL_S if wait_ms is None else min(MAX_POLL_S, max(0.01, wait_ms / 1000))

    def keep(self, on_fenced: Callable[[FencedError], None], stalled: Callable[[], str | None] | None = None
             ) -> None:
        """Renew the leadership on a thread until :meth:`release`; ``on_fenced`` once it is lost.
        With ``stalled`` (a :class:`StallWatch`), a stall it reports gives the leadership up:
        ``on_fenced`` with a FencedError naming the stall, then the lease is released (a standby
        takes it at once). Calling it again while it keeps does nothing."""
        lead = self.held
        if lead is None or self._renewer is not None or (lead.renew_every_ms is None and stalled is None):
            return
        every_s = lead.renew_every_ms / 1000 if lead.renew_every_ms is not None else float("inf")
        stop = self._stop = threading.Event()

        def renew() -> None:
            due = time.monotonic() + every_s
            while True:
                wait_s = due - time.monotonic()
                if stop.wait(max(0.0, wait_s if stalled is None else min(wait_s, STALL_CHECK_S))):
                    return
                stall = stalled() if stalled is not None else None
                if stall is not None:
                    on_fenced(LeaderStalledError(f"{self.url}: {stall}: this driver gave its leadership up "
                                                 "for a standby to take over"))
                    # a request sent just before is answered, or abandoned, within this
                    stop.wait(request_timeout_s(self.lease_ms))
                    lead.release()
                    return
                if time.monotonic() < due:
                    continue
                due = time.monotonic() + every_s
                try:
                    lead.renew()
                except FencedError as e:
                    on_fenced(e)
                    return
                except Exception as e:  # noqa: BLE001  a failed renewal is retried; the lapse fences
                    log.warning("could not renew the lease of %s: %s", self.url, e)

        self._renewer = Service("leader-lease", renew).start()

    def confirm(self, on_fenced: Callable[[FencedError], None]) -> None:
        """Before a batch's jobs (its inputs logged): its epoch must be the current one (an
        object-store lease: valid on this driver's clock, renewed first if due, see wal.locks; a
        local lock is current while held). A loss found here calls ``on_fenced`` first, then raises."""
        if self.fenced is not None:
            raise self.fenced
        if self.held is not None:
            try:
                self.held.confirm()
            except FencedError as e:
                on_fenced(e)
                raise

    def lost_before(self, error: BaseException, on_fenced: Callable[[FencedError], None]) -> bool:
        """Before ``error`` (a batch's) is reported: when the leadership is lost (a driver paused past
        its lease whose storage call failed on waking), call ``on_fenced`` first, so that the fence
        is the driver's error, not what failed after it; True when it did (``error`` is then only
        logged). The check makes no request (a store that just failed would only hold the report up)."""
        if self.held is None or isinstance(error, FencedError) or self.fenced is not None:
            return False
        try:
            self.held.remaining_ms()  # (the check without a request: a lapse on this driver's clock)
            return False
        except FencedError as e:
            e.__context__ = None  # raised while ``error`` was handled, not because of it (exit status 3, not 4)
            on_fenced(e)
        except Exception:  # noqa: BLE001  the check could not tell: the error stands as it is
            return False
        return self.fenced is not None  # (not running yet: the start fails with the error)

    def take_handover_request(self) -> bool:
        """After a batch: whether ``sparkwal checkpoint handover`` asks this leader to hand over, the
        first time only (:attr:`handing_over` from then on)."""
        if self.handing_over or not self.handover_requested():
            return False
        self.handing_over = True
        return True

    def handover_requested(self) -> bool:
        """Whether ``sparkwal checkpoint handover`` asks this leader to hand over (the request is
        looked at once a second at most: one read, after a batch)."""
        now = time.monotonic()
        if self.held is None or now < self._next_handover_look:
            return False
        self._next_handover_look = now + HANDOVER_LOOK_S
        try:
            return self.storage.handover_requested(self.path, self.held.epoch)
        except Exception as e:  # noqa: BLE001 (a failed look is no request; the next batch looks again)
            log.warning("%s: could not look for a handover request: %s", self.url, one_line(e))
            return False

    def release(self, await_successor: bool = False) -> None:
        """Give the leadership up (a standby's failed takeover may take it again later); with
        ``await_successor``, a handover's (:attr:`handing_over`) then waits for the new leader's
        first batch (:func:`.handover.await_successor`)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self.held is not None:
            epoch = self.held.epoch
            self.held.release()
            self.held = None
            if await_successor and self.handing_over:
                handover.await_successor(self.location, epoch, self.teardown_wait_s)


def failure_kind(error: BaseException) -> str:
    """A failure's kind, logged once while it lasts: its type and its errno."""
    code = getattr(error, "errno", None)
    return type(error).__name__ if code is None else f"{type(error).__name__}({errno.errorcode.get(code, code)})"


class StallWatch:
    """A leader alive but making no progress: no batch completed for ``intervals`` batch
    intervals (``spark.sparkwal.leader.stallIntervals``) while batches were due. ``progress()`` is
    when, on ``clock`` (the driver's), the last batch completed, or the first one fell due; None
    while none is due (not running yet, stopping). Called, it says the stall, or None."""

    def __init__(self, clock: Clock, batch_ms: int, intervals: int, progress: Callable[[], int | None]):
        self._clock, self.batch_ms, self.intervals, self._progress = clock, batch_ms, intervals, progress

    def __call__(self) -> str | None:
        since = self._progress()
        if since is None:
            return None
        idle_ms = self._clock.now_ms() - since
        if idle_ms < self.intervals * self.batch_ms:
            return None
        return (f"no batch completed for {idle_ms / 1000:.1f} s while batches were due "
                f"({config.LEADER_STALL_INTERVALS.key}={self.intervals}, batches of {self.batch_ms} ms)")


class LeaderStalledError(EngineError, FencedError):
    """A leader whose stream stalled gave its leadership up (``spark.sparkwal.leader.stallIntervals``):
    it ends, even when started with ``standby=True``, so that its process starts anew."""


class LeaseSettingsError(EngineError, ValueError):
    """Settings that would let a leader's request land after its lease could be taken over."""


def for_driver(driver) -> DriverLeadership:
    """``driver``'s leadership of its checkpoint directory, from its settings, above the epoch of
    the checkpoint it restores; :class:`LeaseSettingsError` when a request may outlast the lease's
    margin (a storage option ``config_kwargs.read_timeout`` set longer than the lease allows)."""
    lease_ms = driver.settings[config.LEASE_TIMEOUT]
    read_timeout = ((driver.storage_options or {}).get("config_kwargs") or {}).get("read_timeout")
    if read_timeout is not None and float(read_timeout) > request_timeout_s(lease_ms):
        raise LeaseSettingsError(
            f"the storage option config_kwargs.read_timeout={read_timeout} s is longer than "
            f"spark.streaming.driver.leaseTimeout={lease_ms / 1000:g}s allows: a leader stops writing "
            f"{margin_ms(lease_ms) / 1000:g} s before its lease may be taken over, so a request may wait at most "
            f"{request_timeout_s(lease_ms):.2f} s for its answer; lower the one or raise the other")
    role = DriverLeadership(driver.location, None, lease_ms)
    role.min_epoch = driver.restored.leader_epoch if driver.restored is not None else 0
    role.network_filesystem_ok = driver.settings[config.LEADER_NETWORK_FS]
    role.teardown_wait_s = driver.settings[config.HANDOVER_TEARDOWN_WAIT] / 1000
    return role
