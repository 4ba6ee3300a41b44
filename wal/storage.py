"""The one storage seam of sparkwal: URL -> backend, append + fsync, atomic create-if-absent, locks.

Everything sparkwal persists (WAL segments, metadata logs, checkpoints) goes through a
:class:`Storage`. ``resolve(url)`` picks the backend:

* a plain path or ``file://`` URL -> :class:`LocalStorage`, straight ``os`` calls (so ``fsync`` means
  what it says and random reads are a cached-fd ``pread``);
* any other URL -> :class:`FsspecStorage` over the fsspec filesystem registered for that protocol
  (``memory://``, ``s3://``, ... or a test double registered by a test).

Guarantees of ``put_if_absent`` (atomic create-if-absent: never overwrites, never shows a partial
file, the storage decides the winner of a race):

===================  ==========================================================================
backend              how
===================  ==========================================================================
local filesystem     temp file in the same dir, fsync, ``os.link`` (fails if the name exists),
                     unlink temp, fsync the directory
S3 (s3fs)            one PUT with ``If-None-Match: *`` (AWS S3, MinIO and moto honour it)
memory://            check-and-store under a process-wide lock (process-local by nature)
other fsspec stores  the backend's ``pipe_file(mode="create")``; fsspec documents its default as
                     check-then-write, i.e. *not* atomic: a warning is logged once per backend
===================  ==========================================================================

Append (WAL segments) exists on the local filesystem and ``memory://``; object stores have no
append, so logs there write one object per write (``close_file_after_write``).

Locks (single-writer fencing): local -> ``flock`` on ``<dir>/.writer.lock``, released by the OS when
the holder dies; elsewhere -> a lease object ``<dir>/.writer.lease`` created with ``put_if_absent``,
renewed by the holder and taken over by another writer only once it has expired.

Leadership (``lead``: one driver per checkpoint directory, numbered by an epoch that only grows)
is the same lock with a number:

* local: ``flock`` on ``<dir>/.leader.lock`` (the kernel releases it the instant its holder dies:
  no timeout), then the epoch, one more than the last, recorded in ``<dir>/.leader.epoch``
  (``{"epoch", "holder", "pid", "host", "since_ms"}``, replaced atomically). An flock cannot be
  taken from a live holder, so a local leader is never fenced while it lives.
* object stores: one lease object per epoch, ``<dir>/.leader/epoch-<epoch, 10 digits>`` holding
  ``{"epoch", "owner", "holder", "since_ms", "expires_ms", "released"}``. Taking over is one
  ``put_if_absent`` of the next epoch's object, allowed once the newest one expired (or was
  released); the holder renews its own object every third of the lease, and stops writing
  (fences itself) a fifth of the lease before it would expire unrenewed, or as soon as it sees
  a newer epoch.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from .append_files import (
    CAN_MAP,
    AppendFile,
    FsspecAppendFile,
    LocalAppendFile,
    MappedAppendFile,
    fsync_dir,
)
from .clock import SYSTEM_CLOCK, Clock
from .errors import FencedError, LeaderHeldError, LogLockedError, WalError

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
LEASE_FILE = ".writer.lease"
LEADER_LOCK = ".leader.lock"
LEADER_EPOCH = ".leader.epoch"
LEADER_LEASES = ".leader"


@dataclass(frozen=True)
class FileInfo:
    name: str
    path: str
    size: int
    mtime_ms: int | None = None  #: last modification, whole ms (None: the backend does not say)


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
        text = f"{self.holder}, epoch {self.epoch}, leading since {_iso(self.since_ms)}"
        if self.kind == "lease" and self.expires_ms is not None:
            text += f", lease {'released' if self.released else 'until ' + _iso(self.expires_ms)}"
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


def _iso(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


class Storage(ABC):
    supports_append: bool = True
    is_local: bool = False
    #: True when ``put_if_absent`` is atomic against other processes.
    atomic_create: bool = True

    @abstractmethod
    def join(self, directory: str, name: str) -> str: ...

    @abstractmethod
    def url(self, path: str) -> str:
        """A URL for ``path`` that ``resolve`` maps back to this backend (for messages, handles)."""

    @abstractmethod
    def list_files(self, directory: str) -> list[FileInfo]:
        """Regular files directly in ``directory`` (no dirs); ``[]`` if it does not exist."""

    def list_dirs(self, directory: str) -> list[str]:
        """Names of the sub-directories of ``directory`` (FileNotFoundError if it is missing)."""
        raise NotImplementedError

    @abstractmethod
    def makedirs(self, directory: str) -> None: ...

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def size(self, path: str) -> int: ...

    @abstractmethod
    def create_append(self, path: str, *, mapped: bool = False) -> AppendFile:
        """Create ``path`` exclusively (FileExistsError if present) for appending; its directory
        entry is durable on return. ``mapped``: appends may be copied into a shared memory map
        of space reserved ahead (see ``MappedAppendFile``); backends without one ignore it."""

    @abstractmethod
    def put_if_absent(self, path: str, data: bytes, *, sync: bool = True) -> bool:
        """Atomically create ``path`` holding ``data``; False (nothing touched) if it exists.
        ``sync=False`` skips the fsyncs where the backend has them (the file still appears
        whole or not at all, but a machine crash may lose it: for measurements and metadata
        a caller can afford to re-create)."""

    @abstractmethod
    def put(self, path: str, data: bytes) -> None:
        """Atomically create or replace ``path`` with ``data``; durable on return."""

    @abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at end of file)."""


    @abstractmethod
    def open_read(self, path: str) -> BinaryIO:
        """A binary file object for one sequential read of ``path``."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove ``path``; a missing file is not an error."""

    @abstractmethod
    def truncate(self, path: str, size: int) -> None:
        """Durably cut a closed file back to ``size`` bytes."""

    @abstractmethod
    def lock(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 60_000) -> Lock:
        """Take the single-writer lock of ``directory`` or raise :class:`LogLockedError` at once."""

    def writer(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> WriterInfo | None:
        """Who holds (or last held) ``directory``'s single-writer lock, found without taking it
        (inspectors never lock); None when no writer ever locked it."""
        return None

    def lead(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 30_000) -> Leadership:
        """Become ``directory``'s leader at the next epoch, or raise :class:`LeaderHeldError`
        at once (naming the holder) while a live leader holds it."""
        raise NotImplementedError

    def leader(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> LeaderInfo | None:
        """``directory``'s current (or last) leader, found without taking anything; None when no
        driver ever led it."""
        return None

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release cached resources (open read handles); nothing to release by default."""


def _holder_description() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


# --------------------------------------------------------------------------------------------
# Local filesystem
# --------------------------------------------------------------------------------------------


class _LocalLock(Lock):
    needs_check = False

    def __init__(self, fd: int):
        self._fd = fd

    def check(self) -> None:  # an flock cannot be taken away from a live holder
        pass

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the descriptor drops the flock


class _LocalLeadership(Leadership):
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


class _ReadFd:
    """A cached read descriptor, closed once evicted (``retired``) and no reader uses it, so a
    reader can never ``pread`` a descriptor number the OS has already handed to another file.

    ``users`` is a list used as a counter: ``append``/``pop`` are atomic under the GIL, so a
    reader registers without taking a lock (a reader appends, then checks ``retired``; a retirer
    sets ``retired``, then checks ``users``: one of the two always sees the other)."""

    __slots__ = ("fd", "users", "retired", "closed")

    def __init__(self, fd: int):
        self.fd, self.users, self.retired, self.closed = fd, [], False, False


class LocalStorage(Storage):
    """Plain ``os`` calls. Random reads go through a small cache of open descriptors + ``pread``."""

    is_local = True
    _MAX_READ_FDS = 64

    def __init__(self) -> None:
        self._read_fds: OrderedDict[str, _ReadFd] = OrderedDict()
        self._fd_lock = threading.Lock()
    def join(self, directory: str, name: str) -> str:
        return os.path.join(directory, name)

    def url(self, path: str) -> str:
        return path

    def list_files(self, directory: str) -> list[FileInfo]:
        out = []
        try:
            entries = os.scandir(directory)
        except FileNotFoundError:
            return []
        with entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        st = entry.stat()
                        out.append(FileInfo(entry.name, entry.path, st.st_size, st.st_mtime_ns // 1_000_000))
                except FileNotFoundError:
                    continue
        return out

    def list_dirs(self, directory: str) -> list[str]:
        with os.scandir(directory) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]

    def makedirs(self, directory: str) -> None:
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            fsync_dir(os.path.dirname(os.path.abspath(directory)))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def create_append(self, path: str, *, mapped: bool = False) -> AppendFile:
        mapped = mapped and CAN_MAP
        flags = os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | (os.O_RDWR if mapped else os.O_WRONLY | os.O_APPEND)
        fd = os.open(path, flags, 0o644)
        try:
            fsync_dir(os.path.dirname(path))
        except BaseException:
            os.close(fd)
            raise
        return MappedAppendFile(path, fd) if mapped else LocalAppendFile(path, fd)

    def _write_temp(self, path: str, data: bytes, sync: bool = True) -> str:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
            if sync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def put_if_absent(self, path: str, data: bytes, *, sync: bool = True) -> bool:
        if os.path.lexists(path):
            return False
        tmp = self._write_temp(path, data, sync)
        try:
            os.link(tmp, path)  # atomic, and refuses to replace an existing name
        except FileExistsError:
            return False
        finally:
            _unlink_quietly(tmp)
        if sync:
            fsync_dir(os.path.dirname(path))
        return True

    def put(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        fsync_dir(os.path.dirname(path))

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb", buffering=0)

    def _acquire_fd(self, path: str) -> _ReadFd:
        entry = self._read_fds.get(path)  # the hot path: no lock (see _ReadFd)
        if entry is not None:
            entry.users.append(None)
            if not entry.retired:
                return entry
            self._release_fd(entry)  # evicted meanwhile: back out, open it anew
        with self._fd_lock:
            entry = self._read_fds.get(path)
            if entry is None:
                entry = _ReadFd(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                self._read_fds[path] = entry
                if len(self._read_fds) > self._MAX_READ_FDS:  # evict the oldest opened
                    self._retire(self._read_fds.popitem(last=False)[1])
            entry.users.append(None)
            return entry

    def _release_fd(self, entry: _ReadFd) -> None:
        entry.users.pop()
        if entry.retired:
            with self._fd_lock:
                self._close_if_unused(entry)

    @staticmethod
    def _close_if_unused(entry: _ReadFd) -> None:
        """Call with ``_fd_lock`` held."""
        if not entry.users and not entry.closed:
            entry.closed = True
            os.close(entry.fd)

    def _retire(self, entry: _ReadFd) -> None:
        """Call with ``_fd_lock`` held."""
        entry.retired = True
        self._close_if_unused(entry)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        entry = self._acquire_fd(path)
        try:
            return os.pread(entry.fd, length, offset)
        finally:
            self._release_fd(entry)

    def _forget_fd(self, path: str) -> None:
        with self._fd_lock:
            entry = self._read_fds.pop(path, None)
            if entry is not None:
                self._retire(entry)

    def delete(self, path: str) -> None:
        self._forget_fd(path)
        _unlink_quietly(path)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 60_000) -> Lock:
        self.makedirs(directory)
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
        os.pwrite(fd, _holder_description().encode(), 0)
        return _LocalLock(fd)

    def writer(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> WriterInfo | None:
        path = os.path.join(directory, LOCK_FILE)
        try:
            with open(path, "rb") as f:
                holder = f.read(256).decode("utf-8", "replace").strip()
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return WriterInfo("lock", holder, _flock_held(st.st_dev, st.st_ino))

    def lead(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 30_000) -> Leadership:
        self.makedirs(directory)
        fd = os.open(os.path.join(directory, LEADER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = self.leader(directory, clock=clock)
            raise LeaderHeldError(directory, info or LeaderInfo("lock", 0, "unknown", 0, True)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            last = self.leader(directory, clock=clock)
            info = LeaderInfo("lock", (last.epoch if last else 0) + 1, _holder_description(),
                              clock.now_ms(), True)
            self.put(os.path.join(directory, LEADER_EPOCH), json.dumps(
                {"epoch": info.epoch, "holder": info.holder, "pid": os.getpid(),
                 "host": socket.gethostname(), "since_ms": info.since_ms}).encode())
        except BaseException:
            os.close(fd)
            raise
        return _LocalLeadership(fd, info)

    def leader(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> LeaderInfo | None:
        try:
            record = json.loads(self.read_file(os.path.join(directory, LEADER_EPOCH)))
            st = os.stat(os.path.join(directory, LEADER_LOCK))
        except FileNotFoundError:
            return None
        except ValueError:
            raise WalError(f"{os.path.join(directory, LEADER_EPOCH)}: not a leader record") from None
        return LeaderInfo("lock", int(record["epoch"]), str(record.get("holder", "")),
                          int(record.get("since_ms", 0)), _flock_held(st.st_dev, st.st_ino))

    def close(self) -> None:
        with self._fd_lock:
            for entry in self._read_fds.values():
                self._retire(entry)
            self._read_fds.clear()


def _flock_held(dev: int, inode: int) -> bool | None:
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


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------------------------
# Any fsspec filesystem
# --------------------------------------------------------------------------------------------

_memory_lock = threading.Lock()
_warned_non_atomic: set[str] = set()


class _Lease(Lock):
    """An object-store lease: ``{"owner", "holder", "expires_ms"}`` renewed by ``check``."""

    def __init__(self, storage: FsspecStorage, path: str, owner: str, clock: Clock, lease_ms: int):
        self._storage, self._path, self._owner = storage, path, owner
        self._clock, self._lease_ms = clock, lease_ms
        self._renewed_at = clock.now_ms()

    def body(self) -> bytes:
        return json.dumps(
            {"owner": self._owner, "holder": _holder_description(),
             "expires_ms": self._clock.now_ms() + self._lease_ms}
        ).encode()

    def check(self) -> None:
        now = self._clock.now_ms()
        if now - self._renewed_at < self._lease_ms // 3:
            return
        current = self._storage._read_lease(self._path)
        if current is None or current.get("owner") != self._owner:
            holder = current.get("holder", "") if current else "nobody (lease deleted)"
            raise LogLockedError(self._path, f"lease lost; now held by {holder}")
        self._storage.put(self._path, self.body())
        self._renewed_at = now

    def release(self) -> None:
        try:
            current = self._storage._read_lease(self._path)
            if current is not None and current.get("owner") == self._owner:
                self._storage.delete(self._path)
        except Exception:  # a lease that cannot be released simply expires
            log.warning("could not release lease %s", self._path, exc_info=True)


class FsspecStorage(Storage):
    def __init__(self, fs: fsspec.AbstractFileSystem):
        self.fs = fs
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self.protocol = protocols[0]
        self._is_memory = isinstance(fs, MemoryFileSystem)
        self._is_s3 = type(fs).__name__ == "S3FileSystem"
        self.supports_append = self._is_memory or isinstance(fs, LocalFileSystem)
        self.atomic_create = self._is_memory or self._is_s3

    def join(self, directory: str, name: str) -> str:
        return f"{directory.rstrip('/')}/{name}"

    def url(self, path: str) -> str:
        return f"{self.protocol}://{path.lstrip('/') if self.protocol != 'memory' else path}"

    def list_files(self, directory: str) -> list[FileInfo]:
        self.fs.invalidate_cache(directory)
        try:
            entries = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            if e.get("type") != "file":
                continue
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            out.append(FileInfo(name, self.join(directory, name), int(e.get("size") or 0), _mtime_ms(e)))
        return out

    def list_dirs(self, directory: str) -> list[str]:
        self.fs.invalidate_cache(directory)
        return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(directory, detail=True)
                if e.get("type") == "directory"]

    def makedirs(self, directory: str) -> None:
        if self._is_memory or isinstance(self.fs, LocalFileSystem):
            self.fs.makedirs(directory, exist_ok=True)
        # object stores have no directories

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return self.fs.exists(path)

    def size(self, path: str) -> int:
        self.fs.invalidate_cache(path)
        return int(self.fs.size(path))

    def create_append(self, path: str, *, mapped: bool = False) -> AppendFile:
        if not self.supports_append:
            raise WalError(f"{self.url(path)}: this store has no append")
        with _memory_lock:
            if self.fs.exists(path):
                raise FileExistsError(path)
            f = self.fs.open(path, "ab")
        return FsspecAppendFile(path, f)

    def put_if_absent(self, path: str, data: bytes, *, sync: bool = True) -> bool:
        if self._is_memory:
            with _memory_lock:
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, bytes(data))
                return True
        if not self.atomic_create and self.protocol not in _warned_non_atomic:
            _warned_non_atomic.add(self.protocol)
            log.warning("%s:// has no atomic create-if-absent; concurrent writers may race", self.protocol)
        try:
            self.fs.pipe_file(path, bytes(data), mode="create")
        except FileExistsError:
            return False
        except OSError as e:  # some clients surface HTTP 412 as a generic OSError
            if "412" in str(e) or "pre-condition" in str(e).lower() or "precondition" in str(e).lower():
                return False
            raise
        finally:
            self.fs.invalidate_cache(path)
        return True

    def put(self, path: str, data: bytes) -> None:
        if self._is_memory:
            with _memory_lock:
                self.fs.pipe_file(path, bytes(data))
            return
        self.fs.pipe_file(path, bytes(data))
        self.fs.invalidate_cache(path)

    def read_file(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return bytes(self.fs.cat_file(path, start=offset, end=offset + length))

    def open_read(self, path: str) -> BinaryIO:
        return io.BytesIO(self.read_file(path))  # objects are read whole: one GET

    def delete(self, path: str) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        finally:
            self.fs.invalidate_cache(path)

    def truncate(self, path: str, size: int) -> None:
        self.put(path, self.read_range(path, 0, size))

    def _read_lease(self, path: str) -> dict | None:
        try:
            return json.loads(self.read_file(path))
        except FileNotFoundError:
            return None
        except ValueError:
            return {"owner": "?", "holder": "unreadable lease", "expires_ms": 0}

    def writer(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> WriterInfo | None:
        lease = self._read_lease(self.join(directory, LEASE_FILE))
        if lease is None:
            return None
        expires = int(lease.get("expires_ms", 0))
        return WriterInfo("lease", str(lease.get("holder", "")), expires > clock.now_ms(), expires)

    def _lease_path(self, directory: str, epoch: int) -> str:
        return self.join(self.join(directory, LEADER_LEASES), f"epoch-{epoch:010d}")

    def _leader_epochs(self, directory: str) -> list[int]:
        out = []
        for f in self.list_files(self.join(directory, LEADER_LEASES)):
            if f.name.startswith("epoch-") and f.name[6:].isdigit():
                out.append(int(f.name[6:]))
        return sorted(out)

    def _lease_info(self, record: dict, epoch: int, clock: Clock) -> LeaderInfo:
        expires, released = int(record.get("expires_ms", 0)), bool(record.get("released"))
        return LeaderInfo("lease", epoch, str(record.get("holder", "")), int(record.get("since_ms", 0)),
                          not released and expires > clock.now_ms(), expires, released)

    def leader(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> LeaderInfo | None:
        epochs = self._leader_epochs(directory)
        if not epochs:
            return None
        record = self._read_lease(self._lease_path(directory, epochs[-1])) or {"holder": "deleted lease"}
        return self._lease_info(record, epochs[-1], clock)

    def lead(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 30_000) -> Leadership:
        self.makedirs(directory)
        current = self.leader(directory, clock=clock)
        if current is not None and current.held:
            raise LeaderHeldError(self.url(directory), current)
        epoch = (current.epoch if current else 0) + 1
        lease = _EpochLease(self, directory, epoch, clock, lease_ms)
        if not self.put_if_absent(self._lease_path(directory, epoch), lease.body()):
            winner = self.leader(directory, clock=clock) or current
            raise LeaderHeldError(self.url(directory), winner)
        if current is not None:
            log.warning("%s: took over leadership at epoch %d from %s", self.url(directory), epoch,
                        current.describe())
        for old in self._leader_epochs(directory)[:-3]:  # the newest few stay, for inspectors
            self.delete(self._lease_path(directory, old))
        return lease

    def lock(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 60_000) -> Lock:
        self.makedirs(directory)
        path = self.join(directory, LEASE_FILE)
        lease = _Lease(self, path, uuid.uuid4().hex, clock, lease_ms)
        for _ in range(2):
            if self.put_if_absent(path, lease.body()):
                return lease
            current = self._read_lease(path)
            if current is None:
                continue  # released in between: try again
            if current.get("expires_ms", 0) > clock.now_ms():
                raise LogLockedError(self.url(directory), current.get("holder", ""))
            log.warning("taking over expired lease %s of %s", path, current.get("holder"))
            self.delete(path)
        raise LogLockedError(self.url(directory), "lease contended")


class _EpochLease(Leadership):
    """An object-store leadership: the lease object of one epoch, renewed by its owner."""

    def __init__(self, storage: FsspecStorage, directory: str, epoch: int, clock: Clock, lease_ms: int):
        self._storage, self._dir, self.epoch = storage, directory, epoch
        self._path = storage._lease_path(directory, epoch)
        self._owner, self._clock, self._lease_ms = uuid.uuid4().hex, clock, lease_ms
        self.renew_every_ms = max(1, lease_ms // 3)
        now = clock.now_ms()
        self._since, self._renewed_at = now, now
        #: the holder stops writing a fifth of a lease before others may take it over
        self._valid_until = now + lease_ms - lease_ms // 5
        self._fenced: str | None = None
        self._renew_lock = threading.Lock()
        self.info = LeaderInfo("lease", epoch, _holder_description(), now, True, now + lease_ms)

    def body(self, released: bool = False) -> bytes:
        now = self._clock.now_ms()
        return json.dumps({"epoch": self.epoch, "owner": self._owner, "holder": _holder_description(),
                           "since_ms": self._since, "expires_ms": now if released else now + self._lease_ms,
                           "released": released}).encode()

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
            self._fence(f"its lease was last renewed at {_iso(self._renewed_at)} and lapses "
                        f"at {_iso(self._renewed_at + self._lease_ms)}")
        if now - self._renewed_at >= self.renew_every_ms:
            self.renew()

    def confirm(self) -> None:
        self._renew(force=False)

    def renew(self) -> None:
        self._renew(force=True)

    def _renew(self, force: bool) -> None:
        """Ask the store: fenced if a newer epoch exists or the object is not ours; renewed when
        ``force`` (or due)."""
        with self._renew_lock:
            if self._fenced is not None:
                raise FencedError(self._fenced)
            now = self._clock.now_ms()
            if now >= self._valid_until:
                self._fence(f"its lease lapsed (last renewed at {_iso(self._renewed_at)})")
            newest = self._storage._leader_epochs(self._dir)
            if newest and newest[-1] > self.epoch:
                taker = self._storage._read_lease(self._storage._lease_path(self._dir, newest[-1])) or {}
                self._fence(f"epoch {newest[-1]} was taken by {taker.get('holder', 'another driver')}")
            current = self._storage._read_lease(self._path)
            if current is None or current.get("owner") != self._owner:
                self._fence("its lease object was replaced or deleted")
            if force or now - self._renewed_at >= self.renew_every_ms:
                self._storage.put(self._path, self.body())
                self._renewed_at = now
                self._valid_until = now + self._lease_ms - self._lease_ms // 5

    def release(self) -> None:
        if self._fenced is not None:
            return
        self._fenced = f"leadership epoch {self.epoch} was released"
        try:
            current = self._storage._read_lease(self._path)
            if current is not None and current.get("owner") == self._owner:
                self._storage.put(self._path, self.body(released=True))
        except Exception:  # a lease that cannot be released simply expires
            log.warning("could not release lease %s", self._path, exc_info=True)


def _mtime_ms(entry: dict) -> int | None:
    """An fsspec listing entry's modification time in ms: ``mtime`` (local, memory: seconds or a
    datetime), ``LastModified`` (S3), ``updated``/``last_modified`` (GCS, Azure)."""
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        value = entry.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1000)
        if isinstance(value, (int, float)):
            return int(value * 1000)
        if isinstance(value, str):
            from datetime import datetime

            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
            except ValueError:
                continue
    return None


def parse_storage_options(pairs: list[str] | None) -> dict | None:
    """``["key=value", ...]`` (command lines' ``--storage-option``) as fsspec options; a value that
    looks like JSON (``{...}``, ``[...]``, true/false) is decoded. ValueError names a bad pair."""
    options: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option takes key=value, got {pair!r}")
        options[key] = json.loads(value) if value[:1] in "{[" or value in ("true", "false") else value
    return options or None


def resolve(url: str, storage_options: dict | None = None) -> tuple[Storage, str]:
    """Map a path or URL to ``(storage, path inside that storage)``."""
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://"):] if url.startswith("file://") else url
        if storage_options:
            raise ValueError(f"storage_options given for local path {url!r}")
        return LocalStorage(), os.path.abspath(path)
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return FsspecStorage(fs), path.rstrip("/") or "/"
