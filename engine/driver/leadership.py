"""The driver's leadership of its checkpoint directory: taking it, waiting for it, keeping it.

One driver leads a checkpoint directory at a time, at an epoch that only grows (the lock and the
epoch live in :meth:`sparkwal.wal.Storage.lead`). The leader writes every log under the directory (DStream
checkpoints, offsets and commits, the tracker's WAL, state snapshot manifests) under that one
leadership, so no second, longer lock can hold a takeover up.

* A driver started without ``standby`` takes the leadership at ``start()``. A live holder makes
  ``start()`` fail with :class:`DriverAlreadyActiveError` naming it, having written nothing; an
  object-store lease that may belong to a dead holder is waited out first (logging the holder and
  the expiry), and the start fails only if the holder keeps renewing it.
* A standby polls for it: every 10 ms on a local directory (the kernel frees a dead holder's lock
  at once), and at the expiry of the holder's lease on an object store.
* The leader renews its lease (object stores) on a thread every third of
  ``spark.streaming.driver.leaseTimeout`` (default 30s); when renewal shows it lost the leadership,
  or it could not renew in time, the context is fenced: it stops at once and
  ``awaitTermination`` raises :class:`sparkwal.wal.FencedError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sparkwal.service import Service
from sparkwal.wal import (SYSTEM_CLOCK, Clock, FencedError, LeaderHeldError, Leadership,
                          StorageLocation, StorageUnavailableError, resolve)

from ..listener import StreamingListenerDriverFenced
from ..errors import EngineError

from ..host import DriverFacts

if TYPE_CHECKING:
    from .events import EventBus
    from .scheduler import JobGenerator

log = logging.getLogger(__name__)


class FencingHost(DriverFacts, Protocol):
    """What fencing reads and calls of the driver (which hands itself in; the leadership records
    the fence itself)."""

    @property
    def events(self) -> EventBus: ...
    @property
    def generator(self) -> JobGenerator: ...
    @property
    def leadership(self) -> DriverLeadership | None: ...
    @property
    def fenced(self) -> BaseException | None: ...
    def lead(self) -> Leadership | None: ...
    def report_error(self, error: BaseException, time_ms: int | None) -> None: ...

LOCAL_POLL_S = 0.01


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
        self.lease_ms = lease_ms
        self._clock = clock or SYSTEM_CLOCK  # leases run on real time, whatever drives batches
        self._stop = threading.Event()
        self._renewer: Service | None = None
        self.held: Leadership | None = None
        self.fenced: BaseException | None = None  # why the leadership was lost (first cause)
        self._fence_lock = threading.Lock()

    def record_fence(self, error: BaseException) -> bool:
        """Note that the leadership is lost, because of ``error``; True the first time only."""
        with self._fence_lock:
            if self.fenced is not None:
                return False
            self.fenced = error
            return True

    def try_take(self) -> Leadership | None:
        try:
            self.held = self.storage.lead(self.path, clock=self._clock, lease_ms=self.lease_ms)
            return self.held
        except LeaderHeldError:
            return None

    def take(self) -> Leadership:
        """Take it now, waiting out a lease that may be a dead holder's; raise
        :class:`DriverAlreadyActiveError` while a live driver holds it."""
        seen_expiry = None
        while True:
            try:
                self.held = self.storage.lead(self.path, clock=self._clock, lease_ms=self.lease_ms)
                return self.held
            except LeaderHeldError as e:
                info = e.info
                if info.kind != "lease" or info.expires_ms is None or (
                        seen_expiry is not None and info.expires_ms > seen_expiry):
                    raise DriverAlreadyActiveError(
                        f"{self.url} is the checkpoint directory of a running driver: {info.describe()}. "
                        "Stop it first, or start this one with getOrCreate(..., standby=True) to take "
                        "over when it stops; nothing was written", info) from None
                seen_expiry = info.expires_ms
                log.warning("%s: waiting for the lease of %s to expire (a dead driver's lease stays "
                            "until then)", self.url, info.describe())
                self._clock.wait_till_ms(info.expires_ms + 1)

    def wait_for(self, stopped: threading.Event, on_poll: Callable[[], None] | None = None
                 ) -> Leadership | None:
        """Block until this process leads (the leadership) or ``stopped`` is set (None). A store
        that is unavailable (each call already retried to its deadline) is waited out: a standby
        is there for when the store, and so the leader's lease, comes back."""
        unavailable: StorageUnavailableError | None = None
        while not stopped.is_set():
            try:
                lead = self.try_take()
                if lead is not None:
                    return lead
                if on_poll is not None:
                    on_poll()
                if self.storage.is_local:
                    stopped.wait(LOCAL_POLL_S)
                    continue
                info = self.storage.leader(self.path, clock=self._clock)
            except StorageUnavailableError as e:
                if unavailable is None:
                    log.warning("%s: waiting as a standby while the store is unavailable (%s)", self.url, e)
                unavailable = e
                stopped.wait(1.0)
                continue
            if unavailable is not None:
                log.warning("%s: the store answers again; still waiting as a standby", self.url)
                unavailable = None
            wait_ms = 250 if info is None or info.expires_ms is None else (
                min(1000, max(10, info.expires_ms + 1 - self._clock.now_ms())))
            stopped.wait(wait_ms / 1000)
        return None

    def keep(self, on_fenced: Callable[[FencedError], None]) -> None:
        """Renew the lease on a thread until :meth:`release`; ``on_fenced`` once it is lost."""
        lead = self.held
        if lead is None or lead.renew_every_ms is None:
            return
        every_s = lead.renew_every_ms / 1000

        def renew() -> None:
            while not self._stop.wait(every_s):
                try:
                    lead.renew()
                except FencedError as e:
                    on_fenced(e)
                    return
                except Exception as e:  # noqa: BLE001  a failed renewal is retried; the lapse fences
                    log.warning("could not renew the lease of %s: %s", self.url, e)

        self._renewer = Service("leader-lease", renew).start()

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.held is not None:
            self.held.release()
            self.held = None


def fence(driver: FencingHost, error: BaseException) -> None:
    """``driver``'s leadership is lost: stop running and writing at once (self-fencing); the error
    ends ``awaitTermination``."""
    if driver.leadership is None or not driver.leadership.record_fence(error):
        return
    log.error("this driver was fenced and stops: %s", error)
    driver.events.post(StreamingListenerDriverFenced(str(error)))
    driver.generator.timer.stop()
    try:
        driver.sc.cancelAllJobs()
    except Exception:  # noqa: BLE001
        log.warning("could not cancel the running jobs", exc_info=True)
    driver.report_error(error, None)


def confirm_leadership(driver: FencingHost) -> None:
    """Before a batch's jobs (its inputs logged): its epoch must be the current one (an
    object-store lease: valid on this driver's clock, renewed first if due, see wal.locks; a
    local lock is current while held)."""
    if driver.fenced is not None:
        raise driver.fenced
    lead = driver.lead()
    if lead is not None:
        try:
            lead.confirm()
        except FencedError as e:
            fence(driver, e)
            raise
