"""DStream checkpoints: ``checkpoint-<ms>`` files holding data (never code), newest valid wins.

File layout, format version 1 (integers big-endian)::

    "SWCK" (4 bytes)  version:u16 (=1)  flags:u16 (=0)  body_length:u64  body_crc32c:u32  body

    body = msgpack map {"checkpoint_time_ms": int, "pending_times_ms": [int, ...], "data": map}

``data`` is whatever msgpack-serialisable mapping the engine fills (graph fingerprint, batch
duration, per-stream recovery data, conf): no pickled code, so a checkpoint stays readable after
the program changes or Python is upgraded, and the magic, version and checksum make every
damaged file detectable.

Directory: ``checkpoint-<ms>`` (main) and ``checkpoint-<ms>.bk`` (the previous content of the same
name). Names use the running maximum checkpoint time (SPARK-11740: a late checkpoint of an older
batch must not win recovery under an older name), counting the files already in the directory: a
restarted run re-runs batches older than the newest name an earlier run left (it generated them
ahead), and its checkpoints must replace that file, not hide behind it. So a name can be written
twice; the second write first moves the first to ``.bk``. Both steps are atomic replaces, so at every instant the newest
name or its ``.bk`` is a complete file. Listing accepts regular files matching the exact grammar
only (SPARK-28912).

Which file wins: ``data["leader_epoch"]`` (:data:`LEADER_EPOCH_KEY`) is the leadership epoch of
the driver that wrote it (absent, in an earlier release's files, or None, from a driver not
leading: epoch 0). A reader takes, of the files that verify (mains and ``.bk`` alike), the one of
the highest epoch, then of the highest name, then the main file before its ``.bk``. The name alone
is not enough: a driver that lost its leadership (a "zombie": paused past its lease, its PUT held
in a partition) may land a file after the next leader listed the directory, under a higher name
than the ones that leader goes on writing, or under the very name it writes (moving the new
leader's checkpoint to the ``.bk``). Within one epoch this is the order of the names as before (a
writer's names never go down), so a damaged main file still falls back to its ``.bk``, then to
older names. On an object store the writer's PUTs are conditional as well (on the version it last
wrote or read there; a name it never saw: create only), so a zombie's rewrite of a name (its
``.bk``, then the name) cannot land over what the new leader wrote there since.
"""

from __future__ import annotations

import logging
import queue
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
from crc32c import crc32c

from sparkwal.wal.errors import FencedError
from sparkwal.service import Service
from sparkwal.wal.storage import Lock, Storage, StorageLocation, resolve

from .envelope import open_envelope
from .errors import CheckpointError
from .layout import CHECKPOINT_PREFIX

log = logging.getLogger(__name__)

MAGIC = b"SWCK"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sHHQI")
CHECKPOINT_FILE = re.compile(r"checkpoint-(0|[1-9][0-9]*)(\.bk)?")
#: the key of ``Checkpoint.data`` holding the writing driver's leadership epoch (the engine fills it)
LEADER_EPOCH_KEY = "leader_epoch"


@dataclass(frozen=True)
class Checkpoint:
    checkpoint_time_ms: int
    pending_times_ms: list[int] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        body = msgpack.packb({"checkpoint_time_ms": self.checkpoint_time_ms,
                              "pending_times_ms": list(self.pending_times_ms),
                              "data": self.data}, use_bin_type=True)
        return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body), crc32c(body)) + body

    @classmethod
    def decode(cls, blob: bytes, path: str = "<bytes>") -> Checkpoint:
        """Parse and verify a checkpoint file; CheckpointError says what is wrong with it."""
        _fields, body = open_envelope(blob, path, _HEADER, MAGIC, FORMAT_VERSION, "checkpoint",
                                      length_at=3, crc_at=4)
        try:
            obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
            return cls(int(obj["checkpoint_time_ms"]), [int(t) for t in obj["pending_times_ms"]],
                       obj["data"])
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
            raise CheckpointError(f"{path}: undecodable body ({e})") from None

    @property
    def leader_epoch(self) -> int:
        """The writing driver's leadership epoch; 0 when the file has none."""
        epoch = self.data.get(LEADER_EPOCH_KEY) if isinstance(self.data, dict) else None
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0


def _checkpoint_files(storage: Storage, directory: str) -> list[tuple[int, bool, str]]:
    """(time, is_main, path), oldest first; at equal time the .bk sorts before the main file."""
    out = []
    for f in storage.list_files(directory):
        m = CHECKPOINT_FILE.fullmatch(f.name)
        if m:
            out.append((int(m.group(1)), m.group(2) is None, f.path))
    out.sort()
    return out


#: how readers order checkpoint files: (leader epoch, name's time, main file): the highest wins
_Rank = tuple[int, int, bool]


def checkpoint_rank(checkpoint: Checkpoint, time_ms: int, main: bool) -> _Rank:
    """Where a verified checkpoint file ranks among a directory's (the highest is the one a
    restart takes; ``time_ms`` and ``main`` from its name)."""
    return (checkpoint.leader_epoch, time_ms, main)


def _best(storage: Storage, files: list[tuple[int, bool, str]]
          ) -> tuple[tuple[_Rank, Checkpoint] | None, list[str]]:
    """Of ``files`` ``(time, is_main, path)``, the checkpoint that ranks highest, with its rank
    (None: no file verifies), and what is wrong with each file that does not."""
    best: tuple[_Rank, Checkpoint] | None = None
    failed = []
    for time_ms, main, file_path in reversed(files):
        url = storage.url(file_path)
        try:
            checkpoint = Checkpoint.decode(storage.read_file(file_path), url)
        except FileNotFoundError:
            failed.append(f"{url}: deleted while reading")
            continue
        except CheckpointError as e:
            failed.append(str(e))
            continue
        rank = checkpoint_rank(checkpoint, time_ms, main)
        if best is None or rank > best[0]:
            best = (rank, checkpoint)
    return best, failed


def _choose(storage: Storage, path: str, directory: str | StorageLocation) -> tuple[_Rank, Checkpoint] | None:
    """What :func:`read_checkpoint` takes (with its rank), each file that does not verify logged."""
    files = _checkpoint_files(storage, path)
    best, failed = _best(storage, files)
    for reason in failed:
        log.warning("skipping checkpoint file: %s", reason)
    if best is None:
        if failed:
            raise CheckpointError(f"no valid checkpoint in {directory}; tried: " + "; ".join(failed))
        return None
    (epoch, time_ms, _main), _checkpoint = best
    if epoch > 0 and any(t > time_ms for t, _m, _p in files):
        log.warning("%s: taking leader epoch %d's checkpoint-%d over files named after later times (of "
                    "older epochs: late writes of a driver that had lost the leadership, or damaged)",
                    storage.url(path), epoch, time_ms)
    return best


def read_checkpoint(directory: str | StorageLocation, *, storage_options: dict | None = None) -> Checkpoint | None:
    """The checkpoint a restart takes: of the files that verify, the one of the newest leader
    epoch, then of the newest name, then a main file before its ``.bk`` (see the module's
    docstring). Every file is read (at most the writer's ``keep``, unless late writes of an old
    leader added some). None if there is none; CheckpointError naming every file tried if none
    is valid."""
    storage, path = resolve(directory, storage_options)
    best = _choose(storage, path, directory)
    return None if best is None else best[1]


class CheckpointFollower:
    """Reads a directory's newest checkpoint again only when it changed (a standby's look every
    half second: one listing, and reads only when a file's name, size or time moved).

    A look reads the newest main file and the files new or changed since the last look (in
    steady state, the newest only); it takes the one that ranks highest as :func:`read_checkpoint`
    ranks them. It falls back to :func:`read_checkpoint`'s full choice on its first look, when the
    newest file is a ``.bk`` (its main being replaced) or does not verify, and when what it would
    return ranks below what it returned last: a late write of an older leader epoch never
    replaces a newer epoch's checkpoint, whether the follower saw that one or not."""

    def __init__(self, directory: str | StorageLocation, storage_options: dict | None = None):
        self.directory, self._options = directory, storage_options
        self._storage, self._path = resolve(directory, storage_options)
        self._seen: dict[str, tuple] | None = None  # path -> (size, mtime) of every file at the last look
        self._rank: _Rank | None = None  # of the checkpoint returned last

    def read_if_changed(self, force: bool = False) -> Checkpoint | None:
        """The newest valid checkpoint if a checkpoint file was written since the last call (or
        ``force``: read it anyway), else None."""
        entries = sorted((int(m.group(1)), m.group(2) is None, f) for f in self._storage.list_files(self._path)
                         if (m := CHECKPOINT_FILE.fullmatch(f.name)))
        seen = {f.path: (f.size, f.mtime_ms) for _t, _m, f in entries}
        checkpoint = self._look(entries, seen, force)
        self._seen = seen  # (not after an error: the next look tries again)
        return checkpoint

    def _look(self, entries: list, seen: dict[str, tuple], force: bool) -> Checkpoint | None:
        if self._seen is None:  # the first look
            return self._full_choice()
        fresh = [(t, m, f.path) for t, m, f in entries if self._seen.get(f.path) != seen[f.path]]
        returned_gone = self._rank is not None and all((t, m) != self._rank[1:] for t, m, _f in entries)
        if not fresh and not returned_gone and not force:
            return None  # nothing written (older files retired at most)
        if not entries or not entries[-1][1]:  # none, or the newest main being replaced
            return self._full_choice()
        newest_time, _main, newest = entries[-1]
        try:
            checkpoint = Checkpoint.decode(self._storage.read_file(newest.path), self._storage.url(newest.path))
        except (FileNotFoundError, CheckpointError):
            return self._full_choice()  # being replaced, or damaged: the reader's fallbacks
        best = ((checkpoint.leader_epoch, newest_time, True), checkpoint)
        other, _failed = _best(self._storage, [e for e in fresh if e[2] != newest.path])
        if other is not None and other[0] > best[0]:
            best = other
        if self._rank is not None and best[0] < self._rank:
            return self._full_choice()  # an older epoch's late write (or the newest files set aside)
        self._rank = best[0]
        return best[1]

    def _full_choice(self) -> Checkpoint | None:
        best = _choose(self._storage, self._path, self.directory)
        self._rank = None if best is None else best[0]
        return None if best is None else best[1]


def set_aside_damaged(directory: str, storage_options: dict | None = None, apply: bool = False
                      ) -> list[tuple[str, str, str | None]]:
    """``(file, what is wrong, where it was moved)`` for every checkpoint file of ``directory``
    that fails its checks; with ``apply`` each is moved aside to ``<name>.damaged-<ms>`` (which
    no reader takes for a checkpoint), never deleted, so that the newest good file is the one a
    restart reads (it would skip a damaged one anyway) and a verification passes. The caller
    makes sure no driver is writing the directory."""
    storage, path = resolve(directory, storage_options)
    out = []
    for _time, _main, file_path in _checkpoint_files(storage, path):
        try:
            data = storage.read_file(file_path)
            Checkpoint.decode(data, storage.url(file_path))
            continue
        except FileNotFoundError:
            continue
        except CheckpointError as e:
            reason = str(e)
        aside = None
        if apply:
            aside = f"{file_path}.damaged-{time.time_ns() // 1_000_000}"
            storage.put(aside, data)
            storage.delete(file_path)
            aside = storage.url(aside)
        out.append((storage.url(file_path), reason, aside))
    return out


@dataclass(frozen=True)
class CheckpointWriterStatistics:
    written: int
    failed_attempts: int
    queued: int
    latest_time_ms: int


class CheckpointWriter:
    """Writes checkpoints on one background thread, in submission order.

    ``write`` encodes on the caller's thread and queues; when the queue (``queue_size``) is full it
    waits up to ``put_timeout_s`` and then raises rather than block forever or drop silently. A
    failed write is retried ``max_attempts`` times; if it still fails, the error is reported to
    ``on_error`` and raised by the next ``write`` and by ``stop``. ``on_written(time_ms)`` runs after
    each checkpoint is durable (the engine cleans its WAL from there). ``lock``: the driver's
    leadership of the directory; a write is refused (FencedError, not retried) once it is lost.
    """

    def __init__(self, directory: str | StorageLocation, *, keep: int = 10, storage_options: dict | None = None,
                 max_attempts: int = 3, queue_size: int = 1000, put_timeout_s: float = 10.0,
                 on_written: Callable[[int], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None, lock: Lock | None = None):
        if keep < 2:
            raise ValueError(f"keep must be >= 2 (a checkpoint and its .bk), got {keep}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.directory = directory
        self._storage, self._dir = resolve(directory, storage_options)
        self._keep = keep
        self.keep = keep  #: checkpoint files kept (mains and .bk together)
        self._max_attempts = max_attempts
        self._put_timeout = put_timeout_s
        self._on_written = on_written
        self._on_error = on_error
        self._lock = lock
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._latest = -1
        self.last_written_bytes = 0  #: the size of the newest checkpoint written
        #: checkpoints queued so far, and the number in that order of the last one written (all
        #: are written in order): a checkpoint queued after some moment is durable once
        #: ``last_written_seq`` passes ``queued`` as it was then
        self.queued = 0
        self.last_written_seq = 0
        self._written = 0
        self._failed_attempts = 0
        self._error: BaseException | None = None
        self._stopped = False
        #: what this writer knows of its directory, so that a write costs no listing and no read
        #: (it leads the directory: nobody else writes checkpoints there): the checkpoint files'
        #: paths, listed once, then kept up to date; the last file written and its bytes
        self._files: list[tuple[int, bool, str]] | None = None
        self._last_written: tuple[str, bytes] | None = None
        self._versions: dict[str, str] = {}  # on object stores: the version of each file it wrote
        self._progress = threading.Condition()  # notified when a checkpoint is written or fails
        self._thread = Service("CheckpointWriter", self._run).start()

    def write(self, checkpoint: Checkpoint) -> None:
        """Queue ``checkpoint`` (its number in order is :attr:`queued` after the call)."""
        self._raise_if_failed()
        if self._stopped:
            raise CheckpointError(f"{self.directory}: write after stop()")
        blob = checkpoint.encode()
        try:
            self._queue.put((checkpoint.checkpoint_time_ms, blob, self.queued + 1), timeout=self._put_timeout)
            self.queued += 1
        except queue.Full:
            raise CheckpointError(
                f"{self.directory}: {self._queue.qsize()} checkpoints are waiting to be written; "
                f"checkpoint {checkpoint.checkpoint_time_ms} not queued within "
                f"{self._put_timeout} s (storage too slow?)") from None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far is durable (not for ``on_written``, which runs
        after); raises if a checkpoint failed, or :class:`CheckpointError` after ``timeout``
        seconds."""
        wanted = self.queued
        with self._progress:
            done = self._progress.wait_for(
                lambda: self.last_written_seq >= wanted or self._error is not None, timeout)
        self._raise_if_failed()
        if not done:
            raise CheckpointError(f"{self.directory}: checkpoint {wanted} not written within {timeout} s")

    def stop(self, timeout: float | None = None) -> None:
        """Write everything queued, then stop the thread; raises if a checkpoint failed."""
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
        if not self._thread.join(timeout):
            raise CheckpointError(f"{self.directory}: checkpoint writer did not finish in {timeout} s")
        self._raise_if_failed()

    def statistics(self) -> CheckpointWriterStatistics:
        return CheckpointWriterStatistics(self._written, self._failed_attempts, self._queue.qsize(),
                                          self._latest)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CheckpointError(f"{self.directory}: writing a checkpoint failed: {self._error}"
                                  ) from self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._write_one(*item)
            finally:
                with self._progress:
                    self._progress.notify_all()

    def _write_one(self, time_ms: int, blob: bytes, seq: int) -> None:
        path = self._storage.join(self._dir, f"{CHECKPOINT_PREFIX}{max(self._latest, time_ms)}")
        for attempt in range(1, self._max_attempts + 1):
            try:
                if self._lock is not None:
                    self._lock.check()
                if self._files is None:
                    self._storage.makedirs(self._dir)
                    self._files = _checkpoint_files(self._storage, self._dir)
                    # an earlier run's newest name too: see the module's docstring
                    self._latest = max([self._latest, *(t for t, _main, _p in self._files)])
                self._latest = max(self._latest, time_ms)
                path = self._storage.join(self._dir, f"{CHECKPOINT_PREFIX}{self._latest}")
                previous = self._previous(path)
                if previous is not None:
                    self._put(path + ".bk", previous)
                    self._note(path + ".bk")
                self._put(path, blob)
                self._note(path)
                self._last_written = (path, blob)
                break
            except FencedError as e:  # another driver leads now: nothing more may be written
                self._error = e
                if self._on_error is not None:
                    self._on_error(e)
                return
            except Exception as e:  # noqa: BLE001
                self._failed_attempts += 1
                log.warning("writing checkpoint %s failed (attempt %d of %d): %s",
                            path, attempt, self._max_attempts, e)
                if attempt == self._max_attempts:
                    log.error("checkpoint %s NOT written after %d attempts", path, attempt)
                    self._error = e
                    if self._on_error is not None:
                        self._on_error(e)
                    return
        self._written += 1
        self.last_written_bytes = len(blob)  # read by on_written (the same thread)
        with self._progress:  # durable: flush() returns, whatever on_written does next
            self.last_written_seq = seq
            self._progress.notify_all()
        self._retain()
        if self._on_written is not None:
            self._on_written(time_ms)

    def _put(self, path: str, blob: bytes) -> None:
        """Write ``path``; on a store with conditional writes, only over the version this writer
        last wrote or read there (none: only if absent), so that a late write of an old leader,
        held in the network, cannot land over what this one wrote since: it finds the object
        changed. A condition that fails means another driver writes here: FencedError."""
        if not self._storage.conditional_writes:  # a local disk: its leader cannot be paused and replaced
            self._storage.put(path, blob)
            return
        if path in self._versions:
            version = self._versions[path]
        elif all(p != path for _t, _m, p in self._files or ()):  # not there when listed: create it
            version = None
        else:
            found = self._storage.read_versioned(path)
            version = found[1] if found is not None else None
        new = self._storage.put_if_version(path, blob, version, fenced=True)
        if new is None:
            raise FencedError(f"{self._storage.url(path)} changed since this writer wrote or read it: "
                              "another driver writes checkpoints here")
        self._versions[path] = new

    def _previous(self, path: str) -> bytes | None:
        """What ``path`` holds now (to keep as its ``.bk``): known without a read when this
        writer wrote it last or it is not there."""
        if self._last_written is not None and self._last_written[0] == path:
            return self._last_written[1]
        if all(p != path for _t, _m, p in self._files or ()):
            return None
        try:
            return self._storage.read_file(path)
        except FileNotFoundError:
            return None

    def _note(self, path: str) -> None:
        m = CHECKPOINT_FILE.fullmatch(path.rsplit("/", 1)[-1])
        if m is None or self._files is None:
            return
        entry = (int(m.group(1)), m.group(2) is None, path)
        if entry not in self._files:
            self._files.append(entry)
            self._files.sort()

    def _retain(self) -> None:
        files = self._files or []
        for entry in files[:max(0, len(files) - self._keep)]:
            try:
                self._storage.delete(entry[2])
                files.remove(entry)
                self._versions.pop(entry[2], None)
            except Exception as e:  # noqa: BLE001  tried again after the next write
                log.warning("could not delete old checkpoint %s: %s", entry[2], e)
