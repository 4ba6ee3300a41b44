"""How bytes are appended to a WAL segment on each kind of storage (the seam is
:mod:`sparkwal.wal.storage`, which creates these): plain ``os.write`` on a local file, copies into a memory
map of space reserved ahead (local, ``Durability.FLUSH``), or a file object of an fsspec store."""

from __future__ import annotations

import mmap
import os
from abc import ABC, abstractmethod
from typing import Any


class AppendFile(ABC):
    """An exclusively created file that grows by appends; ``size`` is the next write's offset."""

    path: str
    size: int
    #: A shared memory map of the file when appends may be stored into it directly: bytes
    #: ``[size, capacity)`` are reserved (then ``size`` is updated by the caller); else None.
    map: mmap.mmap | None = None
    capacity = 0

    @abstractmethod
    def append(self, data: bytes) -> int:
        """Write ``data`` at the end (the OS has it on return); return the offset it starts at."""

    @abstractmethod
    def sync(self) -> None:
        """Make everything appended so far durable (fsync on a local filesystem)."""

    @abstractmethod
    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (used to drop a partially failed write)."""

    @abstractmethod
    def close(self) -> None: ...

    def fileno(self) -> int | None:
        """The OS descriptor appends may go to directly (``os.write``, then ``size`` updated by
        the caller), or None when appends must go through :meth:`append`."""
        return None


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalAppendFile(AppendFile):
    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd
        self.size = 0

    def append(self, data: bytes) -> int:
        offset = self.size
        written = os.write(self._fd, data)
        if written != len(data):  # a short write: finish it (a failure leaves size at the cut)
            view = memoryview(data)
            try:
                while written < len(view):
                    written += os.write(self._fd, view[written:])
            finally:
                self.size += written
            return offset
        self.size += written
        return offset

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def fileno(self) -> int | None:
        return self._fd

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        os.fdatasync(self._fd)
        self.size = size

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


#: Mapped appends need space that is really allocated (``posix_fallocate``): a store into a
#: mapped hole on a full disk kills the process with SIGBUS, an allocation fails with ENOSPC.
CAN_MAP = hasattr(os, "posix_fallocate")


class MappedAppendFile(AppendFile):
    """Appends copied into a shared memory map of the file (``mmap``), for logs whose writes only
    need the OS to have the bytes (``Durability.FLUSH``): the bytes are in the page cache, where
    they survive the process (even ``kill -9``), as soon as the copy ends, as after ``write(2)``,
    without a system call per record.

    Space is reserved ahead with ``posix_fallocate`` (so a full disk fails an append with ENOSPC
    instead of a later SIGBUS), ``FIRST_STEP`` bytes first, then as much again as the file holds,
    at most ``STEP`` at a time: a log of a few records reserves little, a busy one grows in large
    steps. Until the file is closed it is longer than its records: zeros follow them. Readers treat
    the zeros of the newest segment as reserved space (``ScanResult.preallocated``), not damage,
    and a writer that opens the log after a crash cuts them off; ``close`` cuts the file to its
    size and syncs that, so a sealed segment never ends in zeros."""

    FIRST_STEP = 64 << 10
    STEP = 8 << 20

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd
        self.size = 0
        self.capacity = 0
        self.map: mmap.mmap | None = None

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more bytes."""
        need = self.size + n
        if need <= self.capacity:
            return
        new = max(need, self.capacity + min(self.STEP, max(self.FIRST_STEP, self.capacity)))
        new = -(-new // mmap.PAGESIZE) * mmap.PAGESIZE
        os.posix_fallocate(self._fd, self.capacity, new - self.capacity)
        if self.map is None:
            self.map = mmap.mmap(self._fd, new)
        else:
            self.map.resize(new)
        self.capacity = new

    def append(self, data: bytes) -> int:
        offset = self.size
        self.reserve(len(data))
        end = offset + len(data)
        assert self.map is not None  # reserve() made it
        self.map[offset:end] = data
        self.size = end
        return offset

    def sync(self) -> None:
        if self.map is not None:
            self.map.flush()
        os.fdatasync(self._fd)

    def truncate(self, size: int) -> None:
        """Forget the bytes past ``size`` (cut off on ``close``, which follows: the writer
        abandons a file after a failed append)."""
        self.size = size

    def close(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            if self.map is not None:
                self.map.close()
                self.map = None
            os.ftruncate(fd, self.size)
            os.fdatasync(fd)
        finally:
            os.close(fd)


class FsspecAppendFile(AppendFile):
    def __init__(self, path: str, f: Any):
        self.path = path
        self._f = f
        self.size = 0

    def append(self, data: bytes) -> int:
        offset = self.size
        self._f.write(data)
        self.size += len(data)
        return offset

    def sync(self) -> None:
        self._f.flush()
        fileno = getattr(self._f, "fileno", None)
        if fileno is not None:
            try:
                os.fsync(fileno())
            except (OSError, ValueError, AttributeError, NotImplementedError, TypeError):
                pass  # in-memory or remote file objects have no descriptor to sync

    def truncate(self, size: int) -> None:
        self._f.truncate(size)
        self._f.seek(size)
        self.size = size

    def close(self) -> None:
        self._f.close()
