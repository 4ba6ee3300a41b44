"""Leases and epochs on object stores: the single writer of a directory (``.writer.lease``) and
the leader of a checkpoint directory (one lease object per epoch under ``.leader/``). How they
work, and what they guarantee, is told in :mod:`sparkwal.wal.storage`."""

from __future__ import annotations

import json
import logging
import threading
import uuid

from .clock import Clock
from .errors import FencedError, LeaderHeldError, LogLockedError
from .locks import (LEADER_LEASES, LEASE_FILE, LeaderInfo, Leadership, Lock, WriterInfo, holder_description,
                    iso)

log = logging.getLogger(__name__)


class Lease(Lock):
    """An object-store lease: ``{"owner", "holder", "expires_ms"}`` renewed by ``check``."""

    def __init__(self, storage, path: str, owner: str, clock: Clock, lease_ms: int):
        self._storage, self._path, self._owner = storage, path, owner
        self._clock, self._lease_ms = clock, lease_ms
        self._renewed_at = clock.now_ms()

    def body(self) -> bytes:
        return json.dumps(
            {"owner": self._owner, "holder": holder_description(),
             "expires_ms": self._clock.now_ms() + self._lease_ms}
        ).encode()

    def check(self) -> None:
        now = self._clock.now_ms()
        if now - self._renewed_at < self._lease_ms // 3:
            return
        current = read_lease(self._storage, self._path)
        if current is None or current.get("owner") != self._owner:
            holder = current.get("holder", "") if current else "nobody (lease deleted)"
            raise LogLockedError(self._path, f"lease lost; now held by {holder}")
        self._storage.put(self._path, self.body())
        self._renewed_at = now

    def release(self) -> None:
        try:
            current = read_lease(self._storage, self._path)
            if current is not None and current.get("owner") == self._owner:
                self._storage.delete(self._path)
        except Exception as e:  # a lease that cannot be released simply expires
            log.warning("could not release lease %s: %s", self._path, e)


class EpochLease(Leadership):
    """An object-store leadership: the lease object of one epoch, renewed by its owner with one
    conditional PUT (``If-Match`` the version it last wrote). A taker first supersedes the
    expired object (conditional on the version it read), so a renewal that comes too late finds
    the object changed and fences its sender; between renewals the holder trusts its lease on
    its own clock, up to a fifth of a lease before it expires: confirming costs no request."""

    def __init__(self, storage, directory: str, epoch: int, clock: Clock, lease_ms: int):
        self._storage, self._dir, self.epoch = storage, directory, epoch
        self._path = lease_path(storage, directory, epoch)
        self._owner, self._clock, self._lease_ms = uuid.uuid4().hex, clock, lease_ms
        self.renew_every_ms = max(1, lease_ms // 3)
        now = clock.now_ms()
        self._since, self._renewed_at = now, now
        #: the holder stops writing a fifth of a lease before others may take it over
        self._valid_until = now + lease_ms - lease_ms // 5
        self._version: str | None = None  # of the object as this holder last wrote it
        self._renew_error: BaseException | None = None  # why the last renewal failed, if it did
        self._fenced: str | None = None
        self._renew_lock = threading.Lock()
        self.info = LeaderInfo("lease", epoch, holder_description(), now, True, now + lease_ms)

    def body(self, released: bool = False, now: int | None = None) -> bytes:
        now = self._clock.now_ms() if now is None else now
        return json.dumps({"epoch": self.epoch, "owner": self._owner, "holder": holder_description(),
                           "since_ms": self._since, "expires_ms": now if released else now + self._lease_ms,
                           "released": released}).encode()

    def create(self) -> bool:
        """Take this epoch: create its object if absent (one conditional PUT)."""
        self._version = self._storage.put_if_version(self._path, self.body(now=self._since), None)
        return self._version is not None

    def _fence(self, reason: str) -> None:
        if self._fenced is None:
            self._fenced = f"{self._storage.url(self._dir)}: leadership epoch {self.epoch} is over: {reason}"
            log.error("%s", self._fenced)
        raise FencedError(self._fenced)

    def check(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        now = self._clock.now_ms()
        if now >= self._valid_until:
            self._fence(f"its lease was last renewed at {iso(self._renewed_at)} and lapses "
                        f"at {iso(self._renewed_at + self._lease_ms)}"
                        f"{self._why_not_renewed(in_flight=self._renew_lock.locked())}")
        if now - self._renewed_at >= (self.renew_every_ms or 0) and self._renew_lock.acquire(blocking=False):
            try:  # due, and no renewal under way (a slow one never stalls the checks: they fence)
                self._renew()
            finally:
                self._renew_lock.release()

    def confirm(self) -> None:
        """Current, on this holder's clock (renewed first if due); FencedError if not."""
        self.check()

    def renew(self) -> None:
        """One conditional PUT of the lease object: fenced if it is no longer the version this
        holder wrote (superseded by a taker, or deleted)."""
        with self._renew_lock:
            self._renew()

    def _renew(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        sent_at = self._clock.now_ms()
        if sent_at >= self._valid_until:
            self._fence(f"its lease lapsed (last renewed at {iso(self._renewed_at)}){self._why_not_renewed()}")
        try:
            version = self._storage.put_if_version(self._path, self.body(now=sent_at), self._version)
        except Exception as e:
            self._renew_error = e
            raise
        self._renew_error = None
        if version is None:
            current = read_lease(self._storage, self._path) or {}
            taker = current.get("superseded_by")
            self._fence(f"epoch {taker} was taken by another driver" if taker else
                        "its lease object was replaced or deleted")
        self._version = version
        if self._fenced is None:  # validity counts from the send: a slow answer shortens it
            self._renewed_at, self._valid_until = sent_at, sent_at + self._lease_ms - self._lease_ms // 5

    def _why_not_renewed(self, in_flight: bool = False) -> str:
        """A lapse's cause when the store would not take the renewals: a storage fault, not a taker."""
        error = self._renew_error
        if error is None and in_flight:  # the store has not answered the renewal under way
            return "; renewing it failed: its renewal has had no answer from the storage yet"
        return "" if error is None else f"; renewing it failed: {' '.join(str(error).split())[:300]}"

    def release(self) -> None:
        if self._fenced is not None:
            return
        self._fenced = f"leadership epoch {self.epoch} was released"
        try:
            self._storage.put_if_version(self._path, self.body(released=True), self._version)
        except Exception as e:  # a lease that cannot be released simply expires
            log.warning("could not release lease %s: %s", self._path, e)


def read_lease(storage, path: str) -> dict | None:
    try:
        return _parse_lease(storage.read_file(path))
    except FileNotFoundError:
        return None


def _parse_lease(data: bytes) -> dict:
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    return record if isinstance(record, dict) else {"owner": "?", "holder": "unreadable lease", "expires_ms": 0}


def lease_writer(storage, directory: str, clock: Clock) -> WriterInfo | None:
    lease = read_lease(storage, storage.join(directory, LEASE_FILE))
    if lease is None:
        return None
    expires = int(lease.get("expires_ms", 0))
    return WriterInfo("lease", str(lease.get("holder", "")), expires > clock.now_ms(), expires)


def lease_path(storage, directory: str, epoch: int) -> str:
    return storage.join(storage.join(directory, LEADER_LEASES), f"epoch-{epoch:010d}")


def leader_epochs(storage, directory: str) -> list[int]:
    out = []
    for f in storage.list_files(storage.join(directory, LEADER_LEASES)):
        if f.name.startswith("epoch-") and f.name[6:].isdigit():
            out.append(int(f.name[6:]))
    return sorted(out)


def lease_info(record: dict, epoch: int, clock: Clock) -> LeaderInfo:
    expires, released = int(record.get("expires_ms", 0)), bool(record.get("released"))
    return LeaderInfo("lease", epoch, str(record.get("holder", "")), int(record.get("since_ms", 0)),
                      not released and expires > clock.now_ms(), expires, released)


def lease_leader(storage, directory: str, clock: Clock) -> LeaderInfo | None:
    epochs = leader_epochs(storage, directory)
    if not epochs:
        return None
    record = read_lease(storage, lease_path(storage, directory, epochs[-1])) or {"holder": "deleted lease"}
    return lease_info(record, epochs[-1], clock)


def lease_lead(storage, directory: str, clock: Clock, lease_ms: int) -> Leadership:
    storage.makedirs(directory)
    epochs = leader_epochs(storage, directory)
    current = None
    if epochs:
        path = lease_path(storage, directory, epochs[-1])
        found = storage.read_versioned(path)
        record = _parse_lease(found[0]) if found else {"holder": "deleted lease"}
        current = lease_info(record, epochs[-1], clock)
        if current.held:
            raise LeaderHeldError(storage.url(directory), current)
        if found is not None and not record.get("superseded_by"):  # its holder's renewals now fail
            superseded = json.dumps({**record, "superseded_by": epochs[-1] + 1}).encode()
            if storage.put_if_version(path, superseded, found[1]) is None:  # renewed meanwhile
                raise LeaderHeldError(storage.url(directory), lease_leader(storage, directory, clock) or current)
    lease = EpochLease(storage, directory, (current.epoch if current else 0) + 1, clock, lease_ms)
    if not lease.create():
        winner = lease_leader(storage, directory, clock) or current
        raise LeaderHeldError(storage.url(directory), winner)
    if current is not None:
        log.warning("%s: took over leadership at epoch %d from %s", storage.url(directory), lease.epoch,
                    current.describe())
    for old in leader_epochs(storage, directory)[:-3]:  # the newest few stay, for inspectors
        storage.delete(lease_path(storage, directory, old))
    return lease


def lease_lock(storage, directory: str, clock: Clock, lease_ms: int) -> Lock:
    storage.makedirs(directory)
    path = storage.join(directory, LEASE_FILE)
    lease = Lease(storage, path, uuid.uuid4().hex, clock, lease_ms)
    for _ in range(2):
        if storage.put_if_absent(path, lease.body()):
            return lease
        current = read_lease(storage, path)
        if current is None:
            continue  # released in between: try again
        if current.get("expires_ms", 0) > clock.now_ms():
            raise LogLockedError(storage.url(directory), current.get("holder", ""))
        log.warning("taking over expired lease %s of %s", path, current.get("holder"))
        storage.delete(path)
    raise LogLockedError(storage.url(directory), "lease contended")


def lease_seed_epoch(storage, directory: str, epoch: int, holder: str, clock: Clock) -> None:
    """Epoch ``epoch``'s lease object, released: the next leader takes ``epoch + 1`` at once."""
    now = clock.now_ms()
    body = json.dumps({"epoch": epoch, "owner": "", "holder": holder, "since_ms": now,
                       "expires_ms": now, "released": True}).encode()
    storage.put_if_absent(lease_path(storage, directory, epoch), body)
