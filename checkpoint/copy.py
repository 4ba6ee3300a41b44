"""``sparkwal checkpoint copy``: a consistent copy of a sparkwal checkpoint, also of one a driver
is writing meanwhile (no lock taken, nothing paused, nothing written to the source).

The copy holds the source's newest readable DStream checkpoint, C, and everything a restart from
it reads, taken in the order the driver writes them, so that every file copied is at least as new
as what the files copied before it need:

1. the source's logs are listed, then C is read (a driver writes a batch's blocks and offsets
   before the checkpoint that needs them, so the logs listed hold everything C needs);
2. the block tracker's WAL (``receivedBlockMetadata/``), then the receivers' WALs (a block is in
   its receiver's WAL before the tracker records it), the offsets and commits logs and the
   direct inputs' starts, the newest segment of each WAL without a torn or preallocated tail;
3. the state snapshots C's chains are made of, and the code part C names;
4. the event logs (a record: copied as found);
5. the leadership epoch: the copy's first driver takes the epoch after every one the copy names,
   so the files that carry an epoch in their names never clash (:meth:`sparkwal.wal.Storage.seed_epoch`);
6. the copy's record of its source, ``copied-from.json`` (below);
7. C itself, last: until it is there, the copy recovers nothing.

What C names is named relative to the checkpoint (:mod:`sparkwal.checkpoint.layout`), so the copy reads
its own files wherever it is. A driver running meanwhile deletes what no newer checkpoint needs:
if something C needs (a log file reaching its ``floor_ms``, a snapshot, the code part) is deleted
before it was copied, C is no longer whole in the source and the copy starts again from the then
newest checkpoint, up to ``attempts`` times. The copy is verified at the end as ``checkpoint
verify`` would. The destination must be a new (or empty) directory, neither inside the source
nor containing it. Files are read whole, one at a time (a WAL segment is bounded by its roll).

A copy is a fork: a driver started on it leads a new epoch of the copy's directory, not of the
source's, so nothing fences it against a driver on the source, and both would read the same inputs
(the same Kafka topics, the same files) and write the same sinks. The copy says so
(:attr:`CopyReport.fork`, when a live driver led the source while it was copied) and records where
it came from in ``copied-from.json`` (:data:`sparkwal.checkpoint.layout.COPIED_FROM`), one JSON
object::

    {"source": "<the source's URL>", "copied_ms": <when, ms since the epoch>,
     "checkpoint_time_ms": <C's batch time, or null>, "epoch": <the epoch seeded>,
     "source_leader": "<the source's live leader as LeaderInfo.describe() gives it, or null>"}

No credentials are recorded. :func:`live_source` reads it: a driver starting on the copy looks at
the source's leader (taking nothing) and refuses to start while a live one holds it, unless
``spark.sparkwal.copy.allowLiveSource`` is true (:mod:`sparkwal.engine.context`). A copy made from
a copy records its own source only; deleting the record detaches the copy from its source.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkwal.wal.inspect import segment_bytes
from sparkwal.wal.segment import SEGMENT_NAME
from sparkwal.wal.location import resolve_url
from sparkwal.wal.retry import RetryPolicy
from sparkwal.wal.storage import LeaderInfo, Storage, resolve

from . import layout
from .checkpoint_file import CHECKPOINT_FILE, Checkpoint, checkpoint_rank
from .code import CODE_FILE
from .errors import CheckpointError
from .offsets import OffsetSeqLog
from .state_chains import parse_state
from .state_files import snapshot_files

#: the logs a restart from C reads, in the order they are copied (see the module's docstring)
LOGS = (layout.RECEIVED_BLOCK_METADATA, layout.RECEIVED_DATA, layout.OFFSETS, layout.COMMITS, layout.SOURCES)
_SKIPPED = re.compile(r"\..*\.tmp|\.writer\.lock|\.writer\.lease|.*\.damaged-\d+")
_EPOCH = re.compile(r"-e(\d+)(?:$|[./])")
#: how long :func:`live_source` keeps trying a source store that fails transiently
SOURCE_CHECK_DEADLINE_S = 10.0

log = logging.getLogger(__name__)


class CopyError(CheckpointError):
    """The copy could not be made (the message says why, naming the source or the destination)."""


@dataclass(frozen=True)
class CopyReport:
    source: str
    destination: str
    checkpoint_time_ms: int | None  #: the batch the copy's restart starts from (None: no DStream checkpoint)
    files: int
    bytes: int
    attempts: int
    trimmed_bytes: int = 0  #: torn or preallocated WAL tails left out
    problems: list[str] = field(default_factory=list)  #: what verifying the copy found
    #: the live driver that led the source while it was copied (``LeaderInfo.describe()``); None: none did
    source_leader: str | None = None
    #: when ``source_leader`` is set: the copy is a fork of a running stream, said in one sentence
    fork: str | None = None
    copied_from: str = ""  #: the copy's record of its source (``copied-from.json``)


class _Race(CopyError):
    """Something C needs went from the source before it was copied."""


@dataclass
class _File:
    rel: str  # path relative to the root, "/"-separated
    path: str
    size: int


def _walk(storage: Storage, root: str, rel: str = "") -> list[_File]:
    here = storage.join(root, rel) if rel else root
    try:
        files = [_File(f"{rel}/{f.name}" if rel else f.name, f.path, f.size) for f in storage.list_files(here)]
        for d in storage.list_dirs(here):
            files += _walk(storage, root, f"{rel}/{d}" if rel else d)
    except FileNotFoundError:
        return []
    return files


def _is_sparkwal_checkpoint(top: set[str]) -> bool:
    return any(CHECKPOINT_FILE.fullmatch(n) or CODE_FILE.fullmatch(n) for n in top) or bool(
        {layout.OFFSETS, layout.RECEIVED_BLOCK_METADATA} & top)


class _Copier:
    def __init__(self, src: str, dst: str, src_options: dict | None, dst_options: dict | None):
        self.src_url, self.dst_url, self.src_options = src, dst, src_options
        self.src, self.src_root = resolve(src, src_options)
        self.dst, self.dst_root = resolve(dst, dst_options)
        self.files = self.bytes = self.trimmed = 0
        self.epochs: set[int] = set()

    def put(self, rel: str, data: bytes) -> None:
        target = self.dst.join(self.dst_root, rel)
        self.dst.makedirs(target.rpartition("/")[0])
        self.dst.put(target, data)
        self.files, self.bytes = self.files + 1, self.bytes + len(data)
        self.epochs.update(int(m.group(1)) for m in _EPOCH.finditer(rel))

    def read(self, f: _File, needed: bool) -> bytes | None:
        """``f``'s bytes; gone meanwhile: a race when C needs it, else None."""
        try:
            return self.src.read_file(f.path)
        except FileNotFoundError:
            if needed:
                raise _Race(f"{self.src.url(f.path)} was deleted while it was copied") from None
            return None

    def attempt(self) -> tuple[Checkpoint, bytes] | None:
        """One try: the logs, then what the newest checkpoint names; that checkpoint and its
        bytes (None: the source has none), or :class:`_Race`."""
        listed = [f for f in _walk(self.src, self.src_root)
                  if f.rel.split("/", 1)[0] in LOGS and not _SKIPPED.fullmatch(f.rel.rsplit("/", 1)[-1])]
        newest = _newest_checkpoint(self.src, self.src_root)
        floor = newest[0].data.get("floor_ms", 0) if newest is not None else 0
        copied: set[str] = set()
        times: dict[int, int] = {}  # offsets id -> batch time, of the offsets copied
        for log in LOGS:
            now = [f for f in _walk(self.src, self.src_root, log) if not _SKIPPED.fullmatch(f.rel.rsplit("/", 1)[-1])]
            last: dict[str, str] = {}  # each WAL directory's newest segment
            for f in now:
                if SEGMENT_NAME.fullmatch(f.rel.rsplit("/", 1)[-1]):
                    directory = f.rel.rpartition("/")[0]
                    last[directory] = max(last.get(directory, f.rel), f.rel, key=_segment_start)
            for f in now:
                if SEGMENT_NAME.fullmatch(f.rel.rsplit("/", 1)[-1]):
                    try:
                        data, cut = segment_bytes(self.src, f.path, f.rel in last.values())
                    except FileNotFoundError:
                        continue  # listed now, gone before it was read: judged below, with the rest
                    self.trimmed += cut
                else:
                    data = self.read(f, needed=False)
                    if data is None:
                        continue
                if log == layout.OFFSETS and f.rel.rsplit("/", 1)[-1].isdigit():
                    times[int(f.rel.rsplit("/", 1)[-1])] = _batch_time(data, f.path)
                self.put(f.rel, data)
                copied.add(f.rel)
        for f in listed:
            if f.rel not in copied and _needed(f.rel, floor, times):
                raise _Race(f"{self.src.url(f.path)}, which the checkpoint copied needs, was deleted "
                            "by the driver's clean-up before it was copied")
        if newest is None:
            return None
        self._copy_named(newest[0])
        self._copy_events()
        return newest

    def _copy_named(self, cp: Checkpoint) -> None:
        """The state snapshots and the code part ``cp`` names."""
        where = layout.CheckpointLayout(self.src.url(self.src_root))
        for stream in parse_state(cp.data.get("state", {}), where).values():
            for ref in stream.snapshots.values():
                names = snapshot_files(ref.url, self.src_options)
                if not any(n.endswith(".manifest") for n in names):
                    raise _Race(f"state snapshot {ref.url}, which the checkpoint copied names, is gone")
                for path in names:
                    rel = where.relative(self.src.url(path))
                    data = self.read(_File(rel, path, 0), needed=True)
                    self.put(rel, data)
        code = cp.data.get("code")
        if code:
            self.put(code, self.read(_File(code, self.src.join(self.src_root, code), 0), needed=True))

    def _copy_events(self) -> None:
        for f in _walk(self.src, self.src_root, layout.EVENTS):
            name = f.rel.rsplit("/", 1)[-1]
            if _SKIPPED.fullmatch(name):
                continue
            try:
                data, cut = (segment_bytes(self.src, f.path, True) if SEGMENT_NAME.fullmatch(name)
                             else (self.src.read_file(f.path), 0))
            except FileNotFoundError:
                continue  # older runs' records, retired meanwhile
            self.trimmed += cut
            self.put(f.rel, data)


def _segment_start(rel: str) -> int:
    m = SEGMENT_NAME.fullmatch(rel.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else -1


def _batch_time(data: bytes, path: str) -> int:
    try:
        entry = OffsetSeqLog.__new__(OffsetSeqLog).decode(data, path)
    except (CheckpointError, ValueError):
        return 0
    return entry.metadata.batch_timestamp_ms if entry.metadata is not None else 0


def _needed(rel: str, floor: int, times: dict[int, int]) -> bool:
    """Whether a log file listed before C was read, and gone before it was copied, is one a
    restart from C reads: a WAL segment that ends at or after C's floor; an offsets or commits
    entry unless a newer one copied is of a batch before the floor."""
    name = rel.rsplit("/", 1)[-1]
    m = SEGMENT_NAME.fullmatch(name)
    if m:
        return int(m.group(2)) >= floor
    if name.isdigit() and rel.split("/", 1)[0] in (layout.OFFSETS, layout.COMMITS):
        return not any(i > int(name) and 0 < t < floor for i, t in times.items())
    return True


def _newest_checkpoint(storage: Storage, root: str) -> tuple[Checkpoint, bytes] | None:
    """The DStream checkpoint file a restart takes (of those that read and verify, the highest
    :func:`checkpoint_rank`: a late write of an old leader does not win), and its bytes."""
    files = sorted(((int(m.group(1)), m.group(2) is None, f.path) for f in storage.list_files(root)
                    if (m := CHECKPOINT_FILE.fullmatch(f.name))), reverse=True)
    best = None
    for t, main, path in files:
        try:
            raw = storage.read_file(path)
            checkpoint = Checkpoint.decode(raw, storage.url(path))
        except (FileNotFoundError, CheckpointError):
            continue
        if best is None or checkpoint_rank(checkpoint, t, main) > best[0]:
            best = (checkpoint_rank(checkpoint, t, main), checkpoint, raw)
    return None if best is None else (best[1], best[2])


def copy_checkpoint(source: str, destination: str, *, source_options: dict | None = None,
                    destination_options: dict | None = None, attempts: int = 5,
                    retry_wait_s: float = 0.5, sleep: Callable[[float], None] = time.sleep) -> CopyReport:
    """Copy the checkpoint in ``source`` to ``destination`` (paths or fsspec URLs, each with its
    own storage options); see the module's docstring. Raises :class:`CopyError`."""
    from .inspect import inspect_checkpoint

    copier = _Copier(source, destination, source_options, destination_options)
    src, dst = copier.src, copier.dst
    if not src.exists(copier.src_root):
        raise CopyError(f"no such checkpoint directory: {source}")
    top = {f.name for f in src.list_files(copier.src_root)} | set(src.list_dirs(copier.src_root))
    if not _is_sparkwal_checkpoint(top):
        raise CopyError(f"{source} is not a sparkwal checkpoint (no checkpoint files, code parts, "
                        "offsets or block metadata in it)")
    src_url, dst_url = src.url(copier.src_root), dst.url(copier.dst_root)
    inside = layout.CheckpointLayout(src_url).relative(dst_url)
    if inside is not None or layout.CheckpointLayout(dst_url).relative(src_url) is not None:
        raise CopyError(f"{destination} and {source} overlap: copy a checkpoint to a directory of its own")
    if dst.exists(copier.dst_root) and (dst.list_files(copier.dst_root) or dst.list_dirs(copier.dst_root)):
        raise CopyError(f"{destination} is not empty: a checkpoint is copied into a new directory")
    live = _live_leader(src, copier.src_root)
    why = ""
    for attempt in range(1, attempts + 1):
        try:
            newest = copier.attempt()
            break
        except _Race as e:
            why = str(e)
            _empty(dst, copier.dst_root)
            copier.files = copier.bytes = copier.trimmed = 0
            copier.epochs.clear()
            sleep(retry_wait_s * attempt)
    else:
        raise CopyError(f"could not copy {source}: the driver writing it kept deleting what its newest "
                        f"checkpoint needed ({attempts} attempts; the last: {why})")
    leader = src.leader(copier.src_root)
    live = live or (leader if leader is not None and leader.held else None)
    epoch = max([*copier.epochs, leader.epoch if leader is not None else 0, 0])
    if epoch:
        dst.seed_epoch(copier.dst_root, epoch, f"a copy of {src_url} (no driver)")
    time_ms = newest[0].checkpoint_time_ms if newest is not None else None
    record = {"source": src_url, "copied_ms": int(time.time() * 1000), "checkpoint_time_ms": time_ms,
              "epoch": epoch, "source_leader": live.describe() if live is not None else None}
    copier.put(layout.COPIED_FROM, json.dumps(record, sort_keys=True).encode())
    if newest is not None:
        copier.put(f"{layout.CHECKPOINT_PREFIX}{time_ms}", newest[1])
    report = inspect_checkpoint(dst_url, destination_options, verify_state=True)
    fork = None
    if live is not None:
        fork = (f"a driver led {src_url} while it was copied ({live.describe()}): {dst_url} is a fork of that "
                "stream; a driver started on the copy while that one runs would consume the same inputs and "
                "write the same sinks, so it refuses to start while the source has a live leader (unless "
                "spark.sparkwal.copy.allowLiveSource=true)")
    return CopyReport(src_url, dst_url, time_ms, copier.files, copier.bytes, attempt, copier.trimmed,
                      list(report.problems), live.describe() if live is not None else None, fork,
                      dst.url(dst.join(copier.dst_root, layout.COPIED_FROM)))


def _live_leader(storage: Storage, root: str) -> LeaderInfo | None:
    leader = storage.leader(root)
    return leader if leader is not None and leader.held else None


def read_copy_record(url: str, storage_options: dict | None = None) -> dict | None:
    """The record ``checkpoint copy`` left in the checkpoint directory ``url`` (see the module's
    docstring); None when it holds none (not a copy, or one made by hand)."""
    storage, root = resolve(url, storage_options)
    path = storage.join(root, layout.COPIED_FROM)
    try:
        record = json.loads(storage.read_file(path))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise CopyError(f"{storage.url(path)}: not a copy's record ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("source"), str):
        raise CopyError(f"{storage.url(path)}: not a copy's record (no source named)")
    return record


def live_source(url: str, storage_options: dict | None = None) -> tuple[str, LeaderInfo] | None:
    """When the checkpoint directory ``url`` is a copy whose source a live driver leads now: the
    source's URL and that leader, looked at without taking anything. None when ``url`` is no copy,
    or nobody leads its source now; also when the source cannot be looked at (gone, another
    machine's path, a store not reachable with ``storage_options``, which are the copy's and are
    used for a source of the same protocol only): one WARNING then says it could not be checked."""
    try:
        record = read_copy_record(url, storage_options)
    except CopyError as e:
        log.warning("%s; where the checkpoint was copied from is not known, so whether a driver still runs "
                    "there could not be checked", e)
        return None
    if record is None:
        return None
    source = record["source"]
    if layout.CheckpointLayout(url).relative(source) == "":
        return None  # the copy was moved back where its source was
    options = storage_options if _protocol(source) == _protocol(url) else None
    why = None
    try:
        storage, root = resolve_url(source, options, RetryPolicy(deadline_s=SOURCE_CHECK_DEADLINE_S))
        if not storage.exists(root):
            why = "it does not exist here"
        else:
            leader = storage.leader(root)
            if leader is not None and leader.held is None:
                why = "its leader's lock cannot be read from here"
            elif leader is not None and leader.held:
                return source, leader
    except Exception as e:  # noqa: BLE001  the check must not stop a driver: it says so instead
        why = f"{type(e).__name__}: {e}".splitlines()[0]
    if why is not None:
        log.warning("%s is a copy of %s, whose leader could not be checked (%s): if a driver still runs "
                    "on %s, a driver on the copy consumes the same inputs and writes the same sinks",
                    url, source, why, source)
    return None


def fork_refusal(url: str, storage_options: dict | None, allowed: bool) -> tuple[str, str, LeaderInfo] | None:
    """Before a driver leads the checkpoint directory ``url`` (or writes anything there): when it is
    a copy whose source a live driver leads (:func:`live_source`), the one line that refuses its
    start, the source's URL and its leader; with ``allowed``, one warning instead (and None)."""
    found = live_source(url, storage_options)
    if found is None:
        return None
    source, leader = found
    if allowed:
        log.warning("%s is a copy of %s, which a live driver leads (%s): this driver starts anyway "
                    "(spark.sparkwal.copy.allowLiveSource), and both consume the same inputs and write "
                    "the same sinks", url, source, leader.describe())
        return None
    return (f"{url} is a copy of {source}, which a live driver still leads ({leader.describe()}): a driver on "
            "the copy would consume the same inputs and write the same sinks (the copy is a fork). Stop the "
            f"driver of {source} first, or set spark.sparkwal.copy.allowLiveSource=true (getOrCreate(..., "
            "allow_live_source=True)) to run both; nothing was written", source, leader)


def _protocol(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def _empty(storage: Storage, root: str) -> None:
    """Remove what a failed attempt copied (the destination was empty before)."""
    for f in _walk(storage, root):
        storage.delete(f.path)
