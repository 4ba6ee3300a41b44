"""``faulty+file://``: a local filesystem that fails on command, for storage-fault tests and drills.

A local path given as ``faulty+file:///data/app/checkpoint`` is the plain local storage
(:class:`sparkwal.wal.backends.LocalStorage`) with faults injected at its system calls, as a failing disk
would: EIO or ENOSPC on ``create`` (a new file), ``write``, ``fsync`` and ``rename`` (the step that
makes an atomic write visible), and a disk that is **full** (ENOSPC on every create, write and
fsync) until space is freed. A write that fails writes part of its bytes first, as a real one
may. Reads, listings and deletes never fail (deleting is how space is freed).

The faults are read from a control file, ``.disk-faults.json``, in the directory or the nearest
directory above it that has one when the storage is resolved (so a test, a drill or an operator
can fill and free the disk of a running app, its executors' Python workers included)::

    {"full": true}                                        # until the file says otherwise
    {"fail": {"fsync": {"errno": "EIO", "times": 2}}}     # the next 2 fsyncs, in each process

The file is read again whenever it changes (its modification time and size). Each process
counts its own injected faults (:func:`injected`). Never used unless named by its URL.
"""

from __future__ import annotations

import errno
import json
import os
import threading

from .append_files import AppendFile
from .backends import LocalStorage

CONTROL_FILE = ".disk-faults.json"
SCHEME = "faulty+file://"
OPERATIONS = ("create", "write", "fsync", "rename")
_lock = threading.Lock()
_injected: dict[str, int] = {}


def injected() -> dict[str, int]:
    """Faults injected in this process so far, by ``<operation>:<errno name>``."""
    with _lock:
        return dict(_injected)


def find_control_file(path: str) -> str | None:
    directory = os.path.abspath(path)
    while True:
        candidate = os.path.join(directory, CONTROL_FILE)
        if os.path.exists(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


class DiskFaults:
    """The control file's plan, re-read when it changes; :meth:`check` raises the planned fault."""

    def __init__(self, control_file: str | None):
        self.control_file = control_file
        self._seen: tuple | None = None
        self._full = False
        self._planned: dict[str, list] = {}  # operation -> [errno number, times left]

    def _refresh(self) -> None:
        if self.control_file is None:
            return
        try:
            st = os.stat(self.control_file)
        except FileNotFoundError:
            self._seen, self._full, self._planned = None, False, {}
            return
        if self._seen == (st.st_mtime_ns, st.st_size):
            return
        self._seen = (st.st_mtime_ns, st.st_size)
        try:
            with open(self.control_file) as f:
                plan = json.load(f) or {}
        except (OSError, ValueError):
            return  # being rewritten: the next call reads it
        self._full = bool(plan.get("full"))
        self._planned = {}
        for op, spec in (plan.get("fail") or {}).items():
            if op in OPERATIONS:
                self._planned[op] = [getattr(errno, str(spec.get("errno", "EIO"))), int(spec.get("times", 1))]

    def check(self, operation: str, path: str) -> None:
        with _lock:
            self._refresh()
            number = None
            if self._full and operation != "rename":
                number = errno.ENOSPC
            elif operation in self._planned and self._planned[operation][1] > 0:
                self._planned[operation][1] -= 1
                number = self._planned[operation][0]
            if number is None:
                return
            key = f"{operation}:{errno.errorcode[number]}"
            _injected[key] = _injected.get(key, 0) + 1
        raise OSError(number, f"{os.strerror(number)} (injected on {operation})", path)


class _FaultyAppendFile(AppendFile):
    def __init__(self, inner: AppendFile, faults: DiskFaults):
        self._inner, self._faults, self.path = inner, faults, inner.path

    @property
    def size(self) -> int:
        return self._inner.size

    @size.setter
    def size(self, value: int) -> None:
        self._inner.size = value

    def append(self, data: bytes) -> int:
        try:
            self._faults.check("write", self.path)
        except OSError:
            if len(data) > 1:  # a failing write may leave part of its bytes
                self._inner.append(bytes(data[: len(data) // 2]))
            raise
        return self._inner.append(data)

    def sync(self) -> None:
        self._faults.check("fsync", self.path)
        self._inner.sync()

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def close(self) -> None:
        self._inner.close()


class FaultyLocalStorage(LocalStorage):
    """:class:`LocalStorage` with the faults of the control file above ``root``."""

    def __init__(self, root: str):
        super().__init__()
        self.faults = DiskFaults(find_control_file(root))

    def url(self, path: str) -> str:
        return SCHEME + path

    def create_append(self, path: str, *, mapped: bool = False) -> AppendFile:
        self.faults.check("create", path)
        return _FaultyAppendFile(super().create_append(path, mapped=False), self.faults)

    def put_if_absent(self, path: str, data: bytes, *, sync: bool = True) -> bool:
        self._before_put(path, sync)
        return super().put_if_absent(path, data, sync=sync)

    def put(self, path: str, data: bytes) -> None:
        self._before_put(path, True)
        super().put(path, data)

    def _before_put(self, path: str, sync: bool) -> None:
        for op in ("create", "write", "fsync", "rename") if sync else ("create", "write", "rename"):
            self.faults.check(op, path)
