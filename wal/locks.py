"""Locks, leases and epochs: the single writer of a directory and the leader of a checkpoint
directory, on a local filesystem (``flock``) and on object stores (lease objects). How each
works, and what it guarantees, is told in :mod:`wal.storage`; the files are named here."""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from .clock import Clock
from .errors import FencedError, LeaderHeldError, LogLockedError, WalError

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
LEASE_FILE = ".writer.lease"
LEADER_LOCK = ".leader.lock"
LEADER_EPOCH = ".leader.epoch"
LEADER_LEASES = ".leader"


@dataclass(frozen=True)
class WriterInfo:
    """A directory's single-writer lock as an inspector sees it. ``held``: True or False when
    that can be told without taking the lock (a lease's expiry; the kernel's lock table), else
    None."""

    kind: str  # "lock" (an OS lock) or "lease" (an object-store lease)
    holder: str
    held: bool | None
    expires_ms: int | None = None


class Lock(ABC):
    """A held single-writer lock."""

    #: False when the lock cannot be lost while held (an OS lock), so writers need not call
    #: :meth:`check` before each write.
    needs_check: bool = True

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`LogLockedError` if the lock was lost (object-store lease taken over)."""

    @abstractmethod
    def release(self) -> None: ...


@dataclass(frozen=True)
class LeaderInfo:
    """A checkpoint directory's leader as anyone may see it without taking anything. ``held``:
    whether a live leader holds it now (None where that cannot be told)."""

    kind: str  # "lock" (local flock) or "lease" (object store)
    epoch: int
    holder: str  # "pid <pid> on <host>"
    since_ms: int
    held: bool | None
    expires_ms: int | None = None  # a lease's expiry unless renewed
    released: bool = False  # the holder stopped and let it go

    def describe(self) -> str:
        text = f"{self.holder}, epoch {self.epoch}, leading since {iso(self.since_ms)}"
        if self.kind == "lease" and self.expires_ms is not None:
            text += f", lease {'released' if self.released else 'until ' + iso(self.expires_ms)}"
        return text


class Leadership(Lock):
    """A held leadership of a directory at ``epoch``. ``check()`` (cheap, before each write)
    raises :class:`FencedError` once the epoch is no longer current; ``confirm()`` asks the store
    now; ``renew()`` keeps a lease alive (call it every ``renew_every_ms``)."""

    epoch: int
    info: LeaderInfo
    renew_every_ms: int | None = None  # None: nothing to renew

    def confirm(self) -> None:
        self.check()

    def renew(self) -> None:
        self.check()


def iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def holder_description() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def flock_held(dev: int, inode: int) -> bool | None:
    """Whether the file (``dev``, ``inode``) is flock'ed, from Linux's lock table (no lock is
    taken); None where there is no such table."""
    try:
        with open("/proc/locks") as f:
            table = f.read()
    except OSError:
        return None
    key = f"{os.major(dev):02x}:{os.minor(dev):02x}:{inode}"
    return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key
               for fields in (line.split() for line in table.splitlines()))


# ------------------------------------------------------------------ local: flock


class LocalLock(Lock):
    needs_check = False

    def __init__(self, fd: int):
        self._fd = fd

    def check(self) -> None:  # an flock cannot be taken away from a live holder
        pass

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the descriptor drops the flock


class LocalLeadership(Leadership):
    """The flock of ``.leader.lock``: nobody can take it while this process lives, so it is
    never fenced and needs no renewal."""

    needs_check = False

    def __init__(self, fd: int, info: LeaderInfo):
        self._fd, self.info, self.epoch = fd, info, info.epoch

    def check(self) -> None:
        if self._fd < 0:
            raise FencedError(f"leadership epoch {self.epoch} was released")

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def local_lock(storage, directory: str) -> Lock:
    storage.makedirs(directory)
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
        os.close(fd)
        raise LogLockedError(directory, holder) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder_description().encode(), 0)
    return LocalLock(fd)


def local_writer(directory: str) -> WriterInfo | None:
    path = os.path.join(directory, LOCK_FILE)
    try:
        with open(path, "rb") as f:
            holder = f.read(256).decode("utf-8", "replace").strip()
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return WriterInfo("lock", holder, flock_held(st.st_dev, st.st_ino))


def local_lead(storage, directory: str, clock: Clock) -> Leadership:
    storage.makedirs(directory)
    fd = os.open(os.path.join(directory, LEADER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        info = local_leader(storage, directory)
        raise LeaderHeldError(directory, info or LeaderInfo("lock", 0, "unknown", 0, True)) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        last = local_leader(storage, directory)
        info = LeaderInfo("lock", (last.epoch if last else 0) + 1, holder_description(),
                          clock.now_ms(), True)
        storage.put(os.path.join(directory, LEADER_EPOCH), json.dumps(
            {"epoch": info.epoch, "holder": info.holder, "pid": os.getpid(),
             "host": socket.gethostname(), "since_ms": info.since_ms}).encode())
    except BaseException:
        os.close(fd)
        raise
    return LocalLeadership(fd, info)


def local_leader(storage, directory: str) -> LeaderInfo | None:
    try:
        record = json.loads(storage.read_file(os.path.join(directory, LEADER_EPOCH)))
        st = os.stat(os.path.join(directory, LEADER_LOCK))
    except FileNotFoundError:
        return None
    except ValueError:
        raise WalError(f"{os.path.join(directory, LEADER_EPOCH)}: not a leader record") from None
    return LeaderInfo("lock", int(record["epoch"]), str(record.get("holder", "")),
                      int(record.get("since_ms", 0)), flock_held(st.st_dev, st.st_ino))


# ------------------------------------------------------------------ object stores: leases


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
        if now - self._renewed_at >= self.renew_every_ms and self._renew_lock.acquire(blocking=False):
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
