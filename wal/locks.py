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
from .errors import FencedError, LeaderHeldError, LeadershipRefusedError, LogLockedError, WalError

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
LEASE_FILE = ".writer.lease"
LEADER_LOCK = ".leader.lock"
LEADER_EPOCH = ".leader.epoch"
LEADER_LEASES = ".leader"
#: ``{"epoch": e, "requested_ms": t}``: ``sparkwal checkpoint handover`` asks the leader at epoch
#: ``e`` to finish its batches, write its checkpoint and give the leadership up (to a standby)
LEADER_HANDOVER = ".leader.handover"


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
    now; ``renew()`` keeps a lease alive, or looks at the lock again (call it every
    ``renew_every_ms``); ``remaining_ms()`` bounds a write: how long the leadership surely holds
    (None: while this process lives), FencedError once it does not."""

    epoch: int
    info: LeaderInfo
    renew_every_ms: int | None = None  # None: nothing to renew

    def confirm(self) -> None:
        self.check()

    def renew(self) -> None:
        self.check()

    def remaining_ms(self) -> int | None:
        self.check()
        return None

    def store_refused(self, error: BaseException) -> None:
        """A request of this leadership's storage was answered with a transient error by the store
        (told by :func:`sparkwal.wal.retry.call` before it looks at :meth:`remaining_ms` again): a
        lapse that follows is the storage's doing, not a taker's. Nothing to note for a lock file."""


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
    """The flock of ``.leader.lock``: nobody can take it while this process lives, so long as the
    lock file stays the one locked. A deleted or replaced lock file (an operator, a temp cleaner,
    ``rsync --delete``) lets another driver flock a new inode and lead: every check compares the
    held descriptor's file with the path's (``fstat`` against ``stat``, microseconds), and a
    leader whose lock file is gone or replaced fences itself. ``renew()`` (every
    ``renew_every_ms``) looks again when no write does."""

    renew_every_ms = 500

    def __init__(self, fd: int, info: LeaderInfo, path: str, storage=None):
        self._fd, self.info, self.epoch, self._path = fd, info, info.epoch, path
        self._storage = storage  # whose writes it bounds while held
        self._fenced: str | None = None

    def check(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        fd = self._fd
        if fd < 0:
            raise FencedError(f"leadership epoch {self.epoch} was released")
        try:
            lost = lock_file_lost(fd, self._path)
        except OSError:  # released (its descriptor closed) while looking
            raise FencedError(f"leadership epoch {self.epoch} was released") from None
        if lost is None and self._fd != fd:
            lost = "it was released"
        if lost is not None:
            self._fenced = f"{os.path.dirname(self._path)}: leadership epoch {self.epoch} is over: {lost}"
            log.error("%s", self._fenced)
            raise FencedError(self._fenced)

    def release(self) -> None:
        # (the storage's fence stays: the writes of this released leadership are refused from now)
        _HELD_FDS.discard(self._fd)
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


#: the descriptors of the leader locks this process holds: a child forked without exec (a
#: user's multiprocessing) closes them, or it would hold the flock after its parent died
_HELD_FDS: set[int] = set()


def _close_held_in_child() -> None:
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


def lock_file_lost(fd: int, path: str) -> str | None:
    """Why the file locked through ``fd`` is no longer the lock at ``path`` (None: it is)."""
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return f"its lock file {path} was deleted, so another driver may lock a new one"
    if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        return f"its lock file {path} was replaced, so another driver may hold the new one"
    return None


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


#: file systems whose ``flock`` is not a lock between machines (NFS under ``nolock`` or
#: ``local_lock=flock``, an NFSv4 client cut off past its lease, SMB, FUSE mounts of remote stores)
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "lustre", "afs", "ncpfs", "glusterfs", "gpfs",
    "beegfs", "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.juicefs",
    "fuse.mountpoint-s3", "fuse.goofys", "fuse.blobfuse", "fuse.blobfuse2", "fuse.cephfs"})
#: the mount table read to find a directory's file system (Linux)
MOUNTINFO = "/proc/self/mountinfo"


def filesystem_type(directory: str) -> str | None:
    """The type of the file system holding ``directory`` (or its nearest existing parent), from
    the mount table; None where there is none to read."""
    try:
        with open(MOUNTINFO) as f:
            table = f.read()
    except OSError:
        return None
    path = os.path.realpath(directory)
    best, kind = -1, None
    for line in table.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        mount = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        after = line.split(" - ", 1)[1].split(" ")
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best:  # the innermost (of equals, the last: mounted on top)
            best, kind = len(mount), after[0]
    return kind


def _epoch_record(data: bytes) -> int:
    try:
        return int(json.loads(data)["epoch"])
    except (ValueError, KeyError, TypeError):
        return 0


def local_lead(storage, directory: str, clock: Clock, *, min_epoch: int = 0,
               network_filesystem_ok: bool = False) -> Leadership:
    kind = filesystem_type(directory)
    if kind in NETWORK_FILESYSTEMS and not network_filesystem_ok:
        raise LeadershipRefusedError(
            f"{directory} is on a network file system ({kind}), where flock is not a lock between machines, "
            "so two drivers could lead it at once: put the checkpoint on a local disk or an object store "
            "(s3://...), or set spark.sparkwal.leader.allowNetworkFilesystem=true if nothing else ever "
            "starts a driver on it")
    storage.fence = None  # a storage writes for one leadership at a time: the one taken now
    storage.makedirs(directory)
    path = os.path.join(directory, LEADER_LOCK)
    for _ in range(10):  # the file flocked must still be the one at the path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = local_leader(storage, directory)
            raise LeaderHeldError(directory, info or LeaderInfo("lock", 0, "unknown", 0, True)) from None
        except BaseException:
            os.close(fd)
            raise
        if lock_file_lost(fd, path) is None:
            break
        os.close(fd)  # deleted or replaced between the open and the flock: lock the new one
    else:
        raise LeadershipRefusedError(f"{path} keeps being replaced while it is locked: something else "
                                     "is removing the checkpoint directory's files")
    try:
        # the epochs taken so far, from both records (a temp cleaner may delete one), never below
        # what the caller knows was used (the newest checkpoint's epoch)
        last = _epoch_record(os.pread(fd, 4096, 0))
        record = local_leader(storage, directory)
        last = max(last, record.epoch if record else 0)
        if last < min_epoch:
            log.warning("%s: the leader's epoch records say %d but epoch %d wrote the checkpoint "
                        "(the records were deleted?): leading at epoch %d", directory, last, min_epoch,
                        min_epoch + 1)
            last = min_epoch
        info = LeaderInfo("lock", last + 1, holder_description(), clock.now_ms(), True)
        body = json.dumps({"epoch": info.epoch, "holder": info.holder, "pid": os.getpid(),
                           "host": socket.gethostname(), "since_ms": info.since_ms}).encode()
        storage.put(os.path.join(directory, LEADER_EPOCH), body)
        os.ftruncate(fd, 0)
        os.pwrite(fd, body, 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    lead = LocalLeadership(fd, info, path, storage)
    _HELD_FDS.add(fd)
    storage.fence = lead  # every write of this storage checks the lock file from now on
    return lead


def local_leader(storage, directory: str) -> LeaderInfo | None:
    path = os.path.join(directory, LEADER_EPOCH)
    try:
        data = storage.read_file(path)
    except FileNotFoundError:  # the lock file's copy of the record (newer releases write both)
        try:
            with open(os.path.join(directory, LEADER_LOCK), "rb") as f:
                data = f.read(4096)
        except FileNotFoundError:
            return None
        if not data:
            return None
    try:
        st = os.stat(os.path.join(directory, LEADER_LOCK))
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
        return LeaderInfo("lock", int(record["epoch"]), str(record.get("holder", "")),
                          int(record.get("since_ms", 0)), flock_held(st.st_dev, st.st_ino))
    except (ValueError, KeyError, TypeError):
        raise WalError(f"{path}: not a leader record") from None


def local_seed_epoch(storage, directory: str, epoch: int, holder: str, clock: Clock) -> None:
    """The epoch record a leader after ``epoch`` reads, beside an unlocked lock file."""
    storage.makedirs(directory)
    with open(os.path.join(directory, LEADER_LOCK), "ab"):
        pass
    storage.put(os.path.join(directory, LEADER_EPOCH), json.dumps(
        {"epoch": epoch, "holder": holder, "pid": 0, "host": "", "since_ms": clock.now_ms()}).encode())
