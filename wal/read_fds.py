"""The local storage's cache of open read descriptors: random reads are a ``pread`` on a
descriptor kept open (up to ``capacity``, the oldest opened evicted first), and a descriptor is
closed only once no reader uses it."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict


class _ReadFd:
    """A cached read descriptor, closed once evicted (``retired``) and no reader uses it, so a
    reader can never ``pread`` a descriptor number the OS has already handed to another file.

    ``users`` is a list used as a counter: ``append``/``pop`` are atomic under the GIL, so a
    reader registers without taking a lock (a reader appends, then checks ``retired``; a retirer
    sets ``retired``, then checks ``users``: one of the two always sees the other)."""

    __slots__ = ("fd", "users", "retired", "closed")

    def __init__(self, fd: int):
        self.fd, self.retired, self.closed = fd, False, False
        self.users: list = []


class ReadFds:
    def __init__(self, capacity: int = 64) -> None:
        self._capacity = capacity
        self._fds: OrderedDict[str, _ReadFd] = OrderedDict()
        self._lock = threading.Lock()

    def pread(self, path: str, length: int, offset: int) -> bytes:
        entry = self._acquire(path)
        try:
            return os.pread(entry.fd, length, offset)
        finally:
            self._release(entry)

    def forget(self, path: str) -> None:
        """``path`` is deleted: its descriptor closes once its readers are done."""
        with self._lock:
            entry = self._fds.pop(path, None)
            if entry is not None:
                self._retire(entry)

    def close(self) -> None:
        with self._lock:
            for entry in self._fds.values():
                self._retire(entry)
            self._fds.clear()

    def _acquire(self, path: str) -> _ReadFd:
        entry = self._fds.get(path)  # the hot path: no lock (see _ReadFd)
        if entry is not None:
            entry.users.append(None)
            if not entry.retired:
                return entry
            self._release(entry)  # evicted meanwhile: back out, open it anew
        with self._lock:
            entry = self._fds.get(path)
            if entry is None:
                entry = _ReadFd(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                self._fds[path] = entry
                if len(self._fds) > self._capacity:  # evict the oldest opened
                    self._retire(self._fds.popitem(last=False)[1])
            entry.users.append(None)
            return entry

    def _release(self, entry: _ReadFd) -> None:
        entry.users.pop()
        if entry.retired:
            with self._lock:
                self._close_if_unused(entry)

    @staticmethod
    def _close_if_unused(entry: _ReadFd) -> None:
        """Call with the lock held."""
        if not entry.users and not entry.closed:
            entry.closed = True
            os.close(entry.fd)

    def _retire(self, entry: _ReadFd) -> None:
        """Call with the lock held."""
        entry.retired = True
        self._close_if_unused(entry)
