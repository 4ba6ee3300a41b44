"""MetadataLog: one file per batch id, created atomically and never overwritten.

Spark's HDFSMetadataLog semantics on sparkwal's storage seam (:mod:`sparkwal.wal.storage`):

* the file of batch ``N`` is named ``N`` in decimal (no padding, no sign) and starts with a line
  ``v<version>``; listing accepts only regular files whose whole name is such a number, so a
  directory named ``99`` or a temp file is never taken for a batch;
* ``add`` uses the storage's atomic create-if-absent: a batch id is written once, the storage
  decides the winner of concurrent writers, and no reader ever sees a partial file;
* reading checks the version line: malformed or newer versions raise errors naming the file.

Subclasses define ``max_version``, ``serialize`` and ``parse``; the base class stores JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from sparkwal.wal.storage import Storage, StorageLocation, resolve

from .errors import BatchRangeError, MalformedLogError, UnsupportedLogVersionError

T = TypeVar("T")
BATCH_FILE = re.compile(r"0|[1-9][0-9]*")
_VERSION = re.compile(r"v([0-9]+)")


def parse_version(first_line: str, max_version: int, path: str) -> int:
    """Spark's ``validateVersion``: ``v<positive int>`` no newer than ``max_version``."""
    m = _VERSION.fullmatch(first_line.strip())
    version = int(m.group(1)) if m else 0
    if version <= 0:
        raise MalformedLogError(path, f"failed to read correct log version from {first_line!r}")
    if version > max_version:
        raise UnsupportedLogVersionError(path, version, max_version)
    return version


def verify_batch_ids(ids: list[int], start: int | None, end: int | None, where: str = "") -> None:
    """Spark's ``verifyBatchIds``: ``ids`` (sorted) must run from ``start`` to ``end`` without holes."""
    at = f" in {where}" if where else ""
    if start is not None and end is not None and start > end:
        raise BatchRangeError(f"start batch {start} is after end batch {end}{at}")
    if not ids:
        if start is not None or end is not None:
            missing = start if start is not None else end
            raise BatchRangeError(f"batch {missing} doesn't exist{at}")
        return
    if start is not None and ids[0] != start:
        raise BatchRangeError(f"batch {start} doesn't exist{at} (the earliest batch is {ids[0]})")
    if end is not None and ids[-1] != end:
        raise BatchRangeError(f"batch {end} doesn't exist{at} (the latest batch is {ids[-1]})")
    holes = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids))
    if holes:
        raise BatchRangeError(f"batches {holes[:10]} are missing{at} between {ids[0]} and {ids[-1]}")


class MetadataLog(Generic[T]):
    """Batch id -> value, one immutable file per batch in ``path`` (a local path or fsspec URL)."""

    max_version = 1

    def __init__(self, path: str | StorageLocation, storage_options: dict | None = None, *, sync: bool = True,
                 create: bool = True):
        """``sync=False``: entries are not fsync'd (still atomic; a machine crash may lose the
        newest ones, never a process crash). ``create=False``: a reader's view (inspectors, plans):
        the directory is not made, and a missing one reads as an empty log."""
        self.path = str(path)
        self.sync = sync
        self._storage: Storage
        self._storage, self._dir = resolve(path, storage_options)
        if create:
            self._storage.makedirs(self._dir)

    # ---------------------------------------------------------------- format hooks

    def serialize(self, value: T) -> bytes:
        """The whole file for ``value`` (version line included)."""
        return f"v{self.max_version}\n{json.dumps(value, separators=(',', ':'))}".encode()

    def parse(self, version: int, lines: list[str], path: str) -> T:
        """Decode the lines after the version line of ``path``."""
        return json.loads("\n".join(lines))

    # ---------------------------------------------------------------- operations

    def file_path(self, batch_id: int) -> str:
        return self._storage.join(self._dir, str(batch_id))

    def file_url(self, batch_id: int) -> str:
        return self._storage.url(self.file_path(batch_id))

    def add(self, batch_id: int, value: T) -> bool:
        """Write ``value`` as batch ``batch_id``; False (nothing touched) if that batch exists."""
        _check_id(batch_id)
        return self._storage.put_if_absent(self.file_path(batch_id), self.serialize(value),
                                           sync=self.sync)

    def get(self, batch_id: int) -> T | None:
        _check_id(batch_id)
        path = self.file_path(batch_id)
        try:
            data = self._storage.read_file(path)
        except FileNotFoundError:
            return None
        return self.decode(data, self._storage.url(path))

    def decode(self, data: bytes, path: str) -> T:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedLogError(path, f"not UTF-8 text ({e})") from None
        lines = text.split("\n")
        if lines and lines[-1] == "" and len(lines) > 1:
            lines.pop()  # one trailing newline is tolerated
        if not lines or lines == [""]:
            raise MalformedLogError(path, "Incomplete log file: no version line")
        version = parse_version(lines[0], self.max_version, path)
        try:
            return self.parse(version, lines[1:], path)
        except (ValueError, TypeError, KeyError) as e:
            raise MalformedLogError(path, str(e)) from None

    def batch_ids(self) -> list[int]:
        """Every batch id in the log, ascending."""
        return sorted(int(f.name) for f in self._storage.list_files(self._dir)
                      if BATCH_FILE.fullmatch(f.name))

    def get_latest(self) -> tuple[int, T] | None:
        for batch_id in reversed(self.batch_ids()):
            value = self.get(batch_id)
            if value is not None:  # None: purged between listing and reading
                return batch_id, value
        return None

    def get_range(self, start: int | None = None, end: int | None = None) -> list[tuple[int, T]]:
        """Batches ``start..end`` (inclusive, either open), which must all exist contiguously."""
        ids = [i for i in self.batch_ids()
               if (start is None or i >= start) and (end is None or i <= end)]
        verify_batch_ids(ids, start, end, self.path)
        out = []
        for i in ids:
            value = self.get(i)
            if value is None:
                raise BatchRangeError(f"batch {i} doesn't exist in {self.path} (deleted while reading)")
            out.append((i, value))
        return out

    def __iter__(self) -> Iterator[tuple[int, T]]:
        for i in self.batch_ids():
            value = self.get(i)
            if value is not None:
                yield i, value

    def purge(self, threshold: int) -> list[int]:
        """Delete every batch below ``threshold``; returns the ids deleted."""
        return self._delete([i for i in self.batch_ids() if i < threshold])

    def purge_after(self, batch_id: int) -> list[int]:
        """Delete every batch after ``batch_id``; returns the ids deleted."""
        return self._delete([i for i in self.batch_ids() if i > batch_id])

    def _delete(self, ids: list[int]) -> list[int]:
        for i in ids:
            self._storage.delete(self.file_path(i))
            if self._storage.is_local:
                # Hadoop's local filesystem (real Spark) keeps a ".N.crc" beside "N"; Spark
                # cannot write batch N again while it is there
                self._storage.delete(self._storage.join(self._dir, f".{i}.crc"))
        return ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


def _check_id(batch_id: Any) -> None:
    if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
        raise ValueError(f"batch id must be a non-negative int, got {batch_id!r}")
