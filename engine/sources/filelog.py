"""FileLogSource: a directory of append-only line files as a replayable, partitioned source.

Every regular file in the directory (names starting with "." or "_" excepted: files being
prepared) is one partition, named by its file name; its topic is the directory's last path
component. A record is one complete UTF-8 line without its "\\n" (a "\\r" before it is dropped
too, as Hadoop's line reader does); an unterminated last line is not part of the log until its
newline is written. Offsets are line numbers from 0. Writers may append at any time; rewriting or
truncating a file is data loss (the stream says so).

The driver scans each file once, incrementally (only bytes appended since its last look), and
keeps a sparse index, one (line, byte) pair every ``INDEX_EVERY`` lines: a task then starts
reading at the nearest indexed line instead of the file's start. Works on any fsspec URL.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

from sparkwal.wal import StorageLocation

from ..identity import normal_location
from .protocol import DataLossError, ReplayableSource, SourceError, TopicPartition

log = logging.getLogger(__name__)

INDEX_EVERY = 4096  #: lines between two points of the driver's index
CHUNK = 4 << 20  #: bytes read at a time, by the driver's scan and by tasks


@dataclass
class _Scan:
    """What the driver knows of one file: its complete lines so far and an index into them."""

    lines: int = 0
    bytes: int = 0  #: the byte after the last complete line
    index: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])


class FileLogSource(ReplayableSource):
    """``path``: a directory (local path or fsspec URL) of append-only line files."""

    def __init__(self, path: str, storage_options: dict | None = None):
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty directory path or URL, got {path!r}")
        self.path = path
        self.location = StorageLocation.of(path, storage_options)  # pickled without credentials
        self.topic = posixpath.basename(path.rstrip("/")) or path
        self._scans: dict[str, _Scan] = {}

    @property
    def storage_options(self) -> dict | None:
        return self.location.options

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_scans"] = {}  # the driver's index stays on the driver
        return state

    def __setstate__(self, state: dict) -> None:
        older_options = state.pop("storage_options", None)  # pickled by an older sparkwal
        self.__dict__.update(state)
        if "location" not in state:
            self.location = StorageLocation(self.path, older_options)

    def _storage(self):
        return self.location.resolve()

    def _file(self, name: str) -> str:
        storage, directory = self._storage()
        return storage.join(directory, name)

    def url_of(self, name: str) -> str:
        storage, directory = self._storage()
        return storage.url(storage.join(directory, name))

    # ------------------------------------------------------------------ driver side

    def partitions(self) -> list[TopicPartition]:
        storage, directory = self._storage()
        return [TopicPartition(self.topic, f.name) for f in sorted(storage.list_files(directory),
                                                                  key=lambda f: f.name)
                if not f.name.startswith((".", "_"))]

    def latest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        storage, directory = self._storage()
        sizes = {f.name: f.size for f in storage.list_files(directory)}
        out = {}
        for tp in partitions:
            name = str(tp.partition)
            if name not in sizes:
                self._scans.pop(name, None)
                continue
            out[tp] = self._scan(storage, storage.join(directory, name), name, sizes[name]).lines
        return out

    def _scan(self, storage, path: str, name: str, size: int) -> _Scan:
        scan = self._scans.setdefault(name, _Scan())
        if size < scan.bytes:  # the stream sees its latest offset go backwards and decides
            log.warning("%s shrank to %d bytes, but it held %d complete lines in %d bytes: "
                        "truncated or replaced; scanning it again", storage.url(path), size,
                        scan.lines, scan.bytes)
            scan = self._scans[name] = _Scan()
        pos = scan.bytes
        while pos < size:
            chunk = storage.read_range(path, pos, min(CHUNK, size - pos))
            if not chunk:
                break
            last = chunk.rfind(b"\n")
            if last < 0:
                if len(chunk) < CHUNK:
                    break  # an unterminated line: not part of the log yet
                raise SourceError(f"{storage.url(path)}: a line longer than {CHUNK} bytes at byte {pos}")
            start, lines = 0, scan.lines
            next_point = (lines // INDEX_EVERY + 1) * INDEX_EVERY
            count = chunk.count(b"\n", 0, last + 1)
            while lines + count >= next_point:  # index the lines crossing the next points
                need = next_point - lines
                i = start
                for _ in range(need):
                    i = chunk.index(b"\n", i) + 1
                count -= need
                lines, start = next_point, i
                scan.index.append((lines, pos + i))
                next_point += INDEX_EVERY
            scan.lines = lines + count
            pos = scan.bytes = pos + last + 1
        return scan

    def read_hint(self, partition: TopicPartition, from_offset: int, until_offset: int):
        """(line, byte) to start reading at, and the directory as the driver resolved it: a
        relative path is the driver's (tasks may run in another working directory)."""
        scan = self._scans.get(str(partition.partition))
        best = (0, 0)
        for line, byte in scan.index if scan is not None else ():  # short: a point per 4096 lines
            if line > from_offset:
                break
            best = (line, byte)
        return (*best, self._storage()[1])

    def parse_partition(self, key: str) -> str:
        return key

    def describe(self) -> str:
        return f"FileLogSource({self.path})"

    def identity(self) -> str:
        return f"FileLogSource({normal_location(self.path)})"

    # ------------------------------------------------------------------ task side

    def read(self, partition: TopicPartition, from_offset: int, until_offset: int,
             hint=None) -> Iterator[str]:
        storage, directory = self._storage()
        line, pos, directory = hint if hint is not None and len(hint) == 3 else (*(hint or (0, 0)), directory)
        name = str(partition.partition)
        path = storage.join(directory, name)
        wanted = until_offset - from_offset
        if wanted <= 0:
            return
        rest = b""
        while True:
            try:
                chunk = storage.read_range(path, pos, CHUNK)
            except FileNotFoundError:
                raise DataLossError(f"{storage.url(path)} is gone: lines [{from_offset}, "
                                    f"{until_offset}) cannot be read") from None
            pos += len(chunk)
            data = rest + chunk
            parts = data.split(b"\n")
            rest = parts.pop()
            for raw in parts:
                if line >= from_offset:
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise SourceError(f"{storage.url(path)}: line {line} is not UTF-8 ({e})") from None
                    yield text[:-1] if text.endswith("\r") else text
                    wanted -= 1
                    if wanted == 0:
                        return
                line += 1
            if len(chunk) < CHUNK:
                raise DataLossError(
                    f"{storage.url(path)} has {line} complete lines, so lines [{from_offset}, "
                    f"{until_offset}) cannot be read in full: the file was truncated or replaced")
