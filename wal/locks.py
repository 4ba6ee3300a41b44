"""Locks and epochs: the single writer of a directory and the leader of a checkpoint directory, on
a local filesystem (``flock``), and what every lock and leadership offers (the object stores'
lease objects are :mod:`sparkwal.wal.leases`'). How each works, and what it guarantees, is told in
:mod:`sparkwal.wal.storage`; the files are named here."""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
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


def local_seed_epoch(storage, directory: str, epoch: int, holder: str, clock: Clock) -> None:
    """The epoch record a leader after ``epoch`` reads, beside an unlocked lock file."""
    storage.makedirs(directory)
    with open(os.path.join(directory, LEADER_LOCK), "ab"):
        pass
    storage.put(os.path.join(directory, LEADER_EPOCH), json.dumps(
        {"epoch": epoch, "holder": holder, "pid": 0, "host": "", "since_ms": clock.now_ms()}).encode())
