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
import re
import struct
import time
from dataclasses import dataclass, field

import msgpack
from crc32c import crc32c

from sparkwal.wal.storage import Storage, StorageLocation, resolve

from .envelope import open_envelope
from .errors import CheckpointError

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


def checkpoint_files(storage: Storage, directory: str) -> list[tuple[int, bool, str]]:
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
    files = checkpoint_files(storage, path)
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
    for _time, _main, file_path in checkpoint_files(storage, path):
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
