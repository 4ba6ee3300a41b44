"""The storage backends behind :func:`sparkwal.wal.storage.resolve`: :class:`LocalStorage` (plain ``os``
calls) and :class:`FsspecStorage` (any fsspec filesystem), both implementing :class:`Storage`.
Their atomic writes are :mod:`sparkwal.wal.atomic`'s, their locks :mod:`sparkwal.wal.locks`'; the guarantees are
listed in :mod:`sparkwal.wal.storage`."""

from __future__ import annotations

import io
import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from . import atomic, leases, locks, retry
from .append_files import (
    CAN_MAP,
    AppendFile,
    FsspecAppendFile,
    LocalAppendFile,
    MappedAppendFile,
    fsync_dir,
)
from .clock import SYSTEM_CLOCK, Clock
from .errors import WalError
from .read_fds import ReadFds
from .locks import LeaderInfo, Leadership, Lock, WriterInfo


@dataclass(frozen=True)
class FileInfo:
    name: str
    path: str
    size: int
    mtime_ms: int | None = None  #: last modification, whole ms (None: the backend does not say)


class Storage(ABC):
    supports_append: bool = True
    is_local: bool = False
    #: True when ``put_if_absent`` is atomic against other processes.
    atomic_create: bool = True
    #: True when ``put_if_version`` is one conditional request (a lease can be held safely)
    conditional_writes: bool = False
    #: the leadership this storage writes for, set by :meth:`lead`: while it is set every
    #: ``put``, ``put_if_absent`` and ``delete`` checks it first, and on a remote store each
    #: attempt does and the retries stop where it could lapse (:func:`sparkwal.wal.retry.call`)
    fence: Leadership | None = None

    def check_fence(self) -> None:
        """FencedError if this storage writes for a leadership that is over."""
        fence = self.fence
        if fence is not None:
            fence.remaining_ms()

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

    def read_versioned(self, path: str) -> tuple[bytes, str] | None:
        """``(bytes, version)`` of an object store's object, in one request; None if absent."""
        raise NotImplementedError(f"{self.url(path)}: no versioned objects on this storage")

    def put_if_version(self, path: str, data: bytes, version: str | None, *, fenced: bool = False) -> str | None:
        """Replace ``path`` only if it is still at ``version`` (None: create it only if absent),
        in one conditional request; the new version, or None if the condition failed.
        ``fenced``: a data write, bounded by :attr:`fence` as ``put`` is (the lease's own
        requests are not: they carry their own conditions)."""
        raise NotImplementedError(f"{self.url(path)}: no versioned objects on this storage")

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

    def lead(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 30_000, min_epoch: int = 0,
             network_filesystem_ok: bool = False) -> Leadership:
        """Become ``directory``'s leader at the next epoch, or raise :class:`LeaderHeldError`
        at once (naming the holder) while a live leader holds it. ``min_epoch``: an epoch the
        caller knows was taken (the newest checkpoint's): the epoch taken is above it.
        :class:`LeadershipRefusedError` where leading cannot be made safe (see
        :mod:`sparkwal.wal.storage`). From then on this storage's writes are bounded by it
        (:attr:`fence`)."""
        raise NotImplementedError

    def leader(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> LeaderInfo | None:
        """``directory``'s current (or last) leader, found without taking anything; None when no
        driver ever led it."""
        return None

    def request_handover(self, directory: str, epoch: int, requested_ms: int) -> None:
        """Ask ``directory``'s leader at ``epoch`` to hand its leadership over (a request file:
        :data:`sparkwal.wal.locks.LEADER_HANDOVER`); a leader of another epoch never reads it as its own."""
        record = {"epoch": epoch, "requested_ms": requested_ms}
        self.put(self.join(directory, locks.LEADER_HANDOVER), json.dumps(record).encode())

    def handover_requested(self, directory: str, epoch: int) -> bool:
        """Whether a handover of ``directory``'s leadership at ``epoch`` is asked for."""
        try:
            record = json.loads(self.read_file(self.join(directory, locks.LEADER_HANDOVER)))
        except (FileNotFoundError, ValueError):  # none, or half a request: none
            return False
        return isinstance(record, dict) and record.get("epoch") == epoch

    def withdraw_handover(self, directory: str, epoch: int) -> None:
        """Take back the request of a handover at ``epoch`` (one of another epoch stays)."""
        if self.handover_requested(directory, epoch):
            self.delete(self.join(directory, locks.LEADER_HANDOVER))

    def seed_epoch(self, directory: str, epoch: int, holder: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        """Make ``directory``'s next leader start after ``epoch``, with no leader holding it now
        (a checkpoint's copy goes on numbering where its original was: the files that carry an
        epoch in their names never clash). ``directory`` must never have been led."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release cached resources (open read handles); nothing to release by default."""


# ------------------------------------------------------------------ local filesystem


class LocalStorage(Storage):
    """Plain ``os`` calls. Random reads go through a small cache of open descriptors + ``pread``."""

    is_local = True

    def __init__(self) -> None:
        self._read_fds = ReadFds()

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

    def put_if_absent(self, path: str, data: bytes, *, sync: bool = True) -> bool:
        self.check_fence()
        return atomic.local_put_if_absent(path, data, sync)

    def put(self, path: str, data: bytes) -> None:
        self.check_fence()
        atomic.local_put(path, data)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb", buffering=0)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return self._read_fds.pread(path, length, offset)

    def delete(self, path: str) -> None:
        self.check_fence()
        self._read_fds.forget(path)
        atomic.unlink_quietly(path)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 60_000) -> Lock:
        return locks.local_lock(self, directory)

    def writer(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> WriterInfo | None:
        return locks.local_writer(directory)

    def lead(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 30_000, min_epoch: int = 0,
             network_filesystem_ok: bool = False) -> Leadership:
        return locks.local_lead(self, directory, clock, min_epoch=min_epoch,
                                network_filesystem_ok=network_filesystem_ok)

    def leader(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> LeaderInfo | None:
        return locks.local_leader(self, directory)

    def seed_epoch(self, directory: str, epoch: int, holder: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        locks.local_seed_epoch(self, directory, epoch, holder, clock)

    def close(self) -> None:
        self._read_fds.close()


# ------------------------------------------------------------------ any fsspec filesystem


class FsspecStorage(Storage):
    def __init__(self, fs: fsspec.AbstractFileSystem, policy: retry.RetryPolicy | None = None):
        self.fs, self.policy = fs, policy  # policy: of the retries of its calls (None: the default)
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self.protocol = protocols[0]
        self.is_memory = isinstance(fs, MemoryFileSystem)
        self.is_s3 = type(fs).__name__ == "S3FileSystem"
        if self.is_s3:  # one attempt per call: the seam's loop retries, within its deadline
            fs.retries = 1
        self.supports_append = self.is_memory or isinstance(fs, LocalFileSystem)
        self.atomic_create = self.is_memory or self.is_s3
        self.conditional_writes = self.is_memory or self.is_s3

    def join(self, directory: str, name: str) -> str:
        return f"{directory.rstrip('/')}/{name}"

    def url(self, path: str) -> str:
        return f"{self.protocol}://{path.lstrip('/') if self.protocol != 'memory' else path}"

    def retrying(self, operation: str, path: str, fn, *, bounded: bool = False):
        """``fn()`` under :mod:`sparkwal.wal.retry`'s policy: transient faults retried until the
        deadline; ``bounded`` (a write): each attempt within :attr:`fence`'s validity. Every call of
        a leading storage (the lease's renewals too) tells its leadership of the errors the store
        answered with."""
        return retry.call(operation, self.url(path), fn, policy=self.policy, fence=self.fence if bounded else None,
                          refused=self.fence.store_refused if self.fence is not None else None)

    def list_files(self, directory: str) -> list[FileInfo]:
        self.fs.invalidate_cache(directory)
        try:
            entries = self.retrying("list", directory, lambda: self.fs.ls(directory, detail=True))
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            if e.get("type") != "file":
                continue
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            out.append(FileInfo(name, self.join(directory, name), int(e.get("size") or 0), mtime_ms(e)))
        return out

    def list_dirs(self, directory: str) -> list[str]:
        self.fs.invalidate_cache(directory)
        entries = self.retrying("list", directory, lambda: self.fs.ls(directory, detail=True))
        return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"]

    def makedirs(self, directory: str) -> None:
        if self.is_memory or isinstance(self.fs, LocalFileSystem):
            self.fs.makedirs(directory, exist_ok=True)
        # object stores have no directories

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return self.retrying("exists", path, lambda: self.fs.exists(path))

    def size(self, path: str) -> int:
        self.fs.invalidate_cache(path)
        return int(self.retrying("size", path, lambda: self.fs.size(path)))

    def create_append(self, path: str, *, mapped: bool = False) -> AppendFile:
        if not self.supports_append:
            raise WalError(f"{self.url(path)}: this store has no append")
        with atomic.MEMORY_LOCK:
            if self.fs.exists(path):
                raise FileExistsError(path)
            f = self.fs.open(path, "ab")
        return FsspecAppendFile(path, f)

    def put_if_absent(self, path: str, data: bytes, *, sync: bool = True) -> bool:
        self.check_fence()
        return atomic.object_put_if_absent(self, path, data)

    def put(self, path: str, data: bytes) -> None:
        self.check_fence()
        atomic.object_put(self, path, data)

    def read_file(self, path: str) -> bytes:  # start=0: s3fs then skips a HEAD before its GET
        return bytes(self.retrying("read", path, lambda: self.fs.cat_file(path, start=0)))

    def read_versioned(self, path: str) -> tuple[bytes, str] | None:
        return atomic.object_read_versioned(self, path)

    def put_if_version(self, path: str, data: bytes, version: str | None, *, fenced: bool = False) -> str | None:
        if fenced:
            self.check_fence()
        return atomic.object_put_if_version(self, path, data, version, bounded=fenced)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return bytes(self.retrying("read", path, lambda: self.fs.cat_file(path, start=offset, end=offset + length)))

    def open_read(self, path: str) -> BinaryIO:
        return io.BytesIO(self.read_file(path))  # objects are read whole: one GET

    def delete(self, path: str) -> None:
        self.check_fence()
        try:
            self.retrying("delete", path, lambda: self.fs.rm_file(path), bounded=True)
        except FileNotFoundError:  # also a retried delete whose first try took effect
            pass
        finally:
            self.fs.invalidate_cache(path)

    def truncate(self, path: str, size: int) -> None:
        self.put(path, self.read_range(path, 0, size))

    def writer(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> WriterInfo | None:
        return leases.lease_writer(self, directory, clock)

    def leader(self, directory: str, *, clock: Clock = SYSTEM_CLOCK) -> LeaderInfo | None:
        return leases.lease_leader(self, directory, clock)

    def seed_epoch(self, directory: str, epoch: int, holder: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        leases.lease_seed_epoch(self, directory, epoch, holder, clock)

    def lead(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 30_000, min_epoch: int = 0,
             network_filesystem_ok: bool = False) -> Leadership:
        return leases.lease_lead(self, directory, clock, lease_ms, min_epoch=min_epoch)

    def lock(self, directory: str, *, clock: Clock = SYSTEM_CLOCK, lease_ms: int = 60_000) -> Lock:
        return leases.lease_lock(self, directory, clock, lease_ms)


def mtime_ms(entry: dict) -> int | None:
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
