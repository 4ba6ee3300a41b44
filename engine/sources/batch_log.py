"""The batch protocol: Spark's offset and commit logs drive the engine's batches.

Every batch of a context with a checkpoint gets a batch id (0, 1, 2, ... in batch-time order,
continued across restarts) and goes through these steps, in this order:

1. **plan**: each direct input plans its ranges (:meth:`DirectInputDStream.plan`);
2. **offsets/<id>** is written durably (atomic create-if-absent, fsync'd unless
   ``spark.sparkwal.batchLog.fsync`` is false) before any of the batch's jobs exist;
3. **jobs** run: the batch's output operations;
4. the **DStream checkpoint** of a time at or after the batch's is durable (the one queued when
   the batch was generated: it lists the batch as pending, with the state snapshots a restart
   needs). Written concurrently with 3;
5. **commits/<id>**, once 3 succeeded for every output and 4 holds, and only after
   ``commits/<id-1>``: the commit log is always a prefix of the offset log;
6. old entries are purged: both logs keep ``spark.sql.streaming.minBatchesToRetain`` (100)
   batches, and never one a restart from a restorable checkpoint (the latest durable one, or
   the one before it, which a restart falls back to) could re-run or recompute, nor the entry
   before it (where that batch's ranges start).

A restart (any crash point above) resumes from what the files say: every logged batch without
a commit re-runs, in order, with exactly its logged ranges and original batch time (Spark
re-runs only the last); a committed batch never runs its outputs again (its RDDs are still
recomputed from the logged ranges when later state needs them); new batches start where the last
logged one ended, with the next id. Step 4 before 5 means a commit never outruns the DStream
checkpoint, so the state of a committed batch is always recoverable; with no DStream checkpoint
at all there is no commit, and every logged batch re-runs on fresh state.

On-disk format (readable by Spark's tooling and :mod:`checkpoint`'s readers):

* ``offsets/<id>``: :class:`sparkwal.checkpoint.OffsetSeq` version 1: the metadata line
  ``{"batchWatermarkMs":0,"batchTimestampMs":<batch time ms>,"conf":{...}}``, then one line per
  direct input (input order): the batch's END offset of every partition the input knows, as
  Spark's Kafka source writes them: ``{"<topic>":{"<partition>":<offset>,...}}``. The conf's
  ``sparkwal.inputIds`` (:data:`INPUT_IDS_FIELD`, ``"0,2"``) names the input id of each line, so
  that an entry stays readable by a new version whose graph has other direct inputs (an entry
  without it, an earlier release's, has a line per direct input of the graph that wrote it: the
  restored checkpoint's ``direct_inputs``, else this graph's). A batch's
  range of a partition starts at the previous entry's offset (batch 0, or an input the previous
  entry has no line for, one an upgrade added: the input's initial offsets), else (a partition new
  in the batch) at the source's earliest offset. An input a logged entry has no line for has no
  range in that batch. A batch whose
  previous entry is gone cannot be recomputed: an error naming the file, never a wider range.
* ``sources/<input id>/0``: ``v1`` and the same JSON: where the input started (Spark's Kafka
  source keeps its initial offsets there too).
* ``commits/<id>``: :class:`sparkwal.checkpoint.CommitMetadata` version 1, ``{"nextBatchWatermarkMs":0}``.

Both carry the writing driver's leadership epoch (the offsets' conf ``sparkwal.leaderEpoch``, a
field of the commit's JSON: :mod:`sparkwal.checkpoint.offsets`), so that a late write of a driver
that lost its leadership (a *zombie*: paused past its lease, its PUT held in a partition, landing
after the next leader took over) cannot pass for the current leader's:

* **writing** ``offsets/<id>`` or ``commits/<id>`` over an existing file of an older epoch (or of
  none) replaces it, with a warning: the leader owns the directory. One of the same epoch is a
  concurrent update (:class:`ConcurrentUpdateError`, as Spark's), one of a newer epoch means this
  driver is the zombie (:class:`FencedError`);
* **recovering**, the offsets files count in id order while their epochs do not go down: one of an
  older epoch than the batch before it, and every later one, is a zombie's (not logged; the batch
  is logged again, replacing it). A commit counts only if its epoch is at least its batch's
  offsets' (a zombie's commit of its own batch, whose offsets the next leader replaced, does
  not), a commit without an epoch as before; the newest commit that counts is the last batch
  committed (normally the newest commit: one read).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from dataclasses import dataclass

from sparkwal.checkpoint import CommitLog, CommitMetadata, MetadataLog, OffsetSeq, OffsetSeqLog, OffsetSeqMetadata
from sparkwal.checkpoint.errors import ConcurrentUpdateError
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.checkpoint.offsets import LEADER_EPOCH_FIELD, offsets_epoch
from sparkwal.checkpoint.resume import resolve_restart
from sparkwal.wal import FencedError, StorageLocation

from .protocol import OffsetRange, TopicPartition

log = logging.getLogger(__name__)

#: the DStream checkpoints a restart may take: the newest durable one and the one before it (the
#: newest's ``.bk``, or the previous name's file), which it falls back to when the newest does not
#: verify (:mod:`sparkwal.checkpoint.checkpoint_file`)
RESTORABLE_CHECKPOINTS = 2
#: an offsets entry's conf: the input id of each of its lines, comma-separated
INPUT_IDS_FIELD = "sparkwal.inputIds"


def offsets_json(ends: dict[TopicPartition, int]) -> str:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(ends, key=lambda tp: (tp.topic, str(tp.partition))):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(ends[tp])
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def parse_offsets_json(text: str | None, source, where: str) -> dict[TopicPartition, int]:
    if text is None:
        return {}
    try:
        obj = json.loads(text)
        return {TopicPartition(topic, source.parse_partition(p)): int(o)
                for topic, parts in obj.items() for p, o in parts.items()}
    except (ValueError, AttributeError, TypeError) as e:
        raise ValueError(f"{where}: offsets {text[:120]!r} are not {{topic: {{partition: offset}}}} "
                         f"JSON ({e})") from None


@dataclass(frozen=True)
class BatchLogStatistics:
    latest_batch_id: int  #: -1: none yet
    latest_committed: int  #: -1: none yet
    offsets_written: int
    commits_written: int
    purged: int


class _InitialLog(MetadataLog[str]):
    def serialize(self, value: str) -> bytes:
        return f"v1\n{value}".encode()

    def parse(self, version: int, lines: list[str], path: str) -> str:
        return "\n".join(lines)


class BatchLog:
    """The offsets/commits pair of one context (see the module docstring for the protocol)."""

    def __init__(self, directory: str | StorageLocation, inputs: list, *, storage_options: dict | None = None,
                 sync: bool = True, retain: int = 100, on_commit=None, lock=None,
                 legacy_ids: list[int] | None = None):
        if retain < 1:
            raise ValueError(f"minBatchesToRetain must be >= 1, got {retain}")
        self.directory = str(directory)
        self._layout = CheckpointLayout(directory)  # a location's logs share its storage and retry policy
        self.offsets = OffsetSeqLog(self._layout.at(self._layout.offsets), storage_options, sync=sync)
        self.commits = CommitLog(self._layout.at(self._layout.commits), storage_options, sync=sync)
        self._options, self._sync = storage_options, sync
        self.inputs = list(inputs)  # the direct inputs, in input order
        #: the input ids of the lines of an entry that does not name them (an earlier release's)
        self.legacy_ids = [s.input_id for s in self.inputs] if legacy_ids is None else list(legacy_ids)
        self.retain = retain
        self._on_commit = on_commit  # (batch_id, time_ms) after each commit file
        self._fence = lock  # the driver's leadership: no offsets or commit once it is lost
        self._lock = threading.Lock()
        self._ids: dict[int, int] = {}  # batch time -> id, of logged batches
        self._times: dict[int, int] = {}  # id -> batch time
        self._ends: dict[int, dict[int, dict]] = {}  # id -> input id -> end offsets (parsed lazily)
        self._raw: dict[int, OffsetSeq] = {}
        self._next_id = 0
        self._committed = -1  # the highest id of the commit log's prefix
        self._done: dict[int, bool] = {}  # id -> outputs succeeded, awaiting its commit
        self._durable_ms = -1  # the latest DStream checkpoint time known durable
        #: the floors (oldest batch time a restart may need; None: none) of the restorable DStream
        #: checkpoints, newest last: purges keep every batch from the oldest on
        self._floors: deque[int | None] = deque(maxlen=RESTORABLE_CHECKPOINTS)
        self._offsets_written = self._commits_written = self._purged = 0
        self.rerun_times: list[int] = []  # logged, uncommitted: a restart re-runs them

    # ------------------------------------------------------------------ restart

    def recover(self) -> None:
        """Read the logs: ids and times of the logged batches, the last commit, what re-runs."""
        resolve_restart(self.offsets, self.commits)  # Spark's rules: refuses logs it cannot resume from
        newest_epoch = 0
        for i in self.offsets.batch_ids():
            entry = self.offsets.get(i)
            if entry is None:
                continue
            if not isinstance(entry, OffsetSeq) or entry.metadata is None:
                raise ValueError(f"{self.offsets.file_url(i)} is not a DStream batch (OffsetSeq v1 "
                                 "with metadata); this checkpoint belongs to another kind of query")
            ids = self._line_ids(entry, i)
            if len(entry.offsets) != len(ids):
                raise ValueError(
                    f"{self.offsets.file_url(i)} has offsets of {len(entry.offsets)} direct inputs, "
                    f"and {len(ids)} are known to have written it ({ids}): the graph changed since it was "
                    "written (recover it with getOrCreate(..., upgrade=True) and the program that wrote it)")
            epoch = offsets_epoch(entry)
            if epoch < newest_epoch:
                log.warning("%s was written at leader epoch %d after batch %d at epoch %d: a late write of a "
                            "driver that had lost the leadership; batches from %d are logged again",
                            self.offsets.file_url(i), epoch, i - 1, newest_epoch, i)
                break
            newest_epoch = epoch
            t = entry.metadata.batch_timestamp_ms
            self._ids[t], self._times[i], self._raw[i] = i, t, entry
        ids = sorted(self._times)
        self._next_id = ids[-1] + 1 if ids else 0
        self._committed = self._counted_commit(self._next_id - 1)
        rerun = [i for i in ids if i > self._committed]  # (resolve_restart checked there is no hole)
        self.rerun_times = [self._times[i] for i in rerun]
        if ids:  # the checkpoint restarted from stays restorable until two newer ones are durable
            self._floors.append(self._times[ids[0]])  # (its floor unknown here: protect every batch)
            log.info("batch log: batches %d..%d logged, committed up to %d, re-running %s",
                     ids[0], ids[-1], self._committed, rerun)

    def _counted_commit(self, last_logged: int) -> int:
        """The newest commit that counts (-1: none), looking from the newest down: one of a batch
        not logged, or of an older epoch than its batch's offsets, does not (see the module's
        docstring)."""
        for i in reversed(self.commits.batch_ids()):
            commit = self.commits.get(i) if i <= last_logged else None
            if commit is None:
                continue
            offsets = self._raw.get(i)
            theirs = offsets_epoch(offsets) if offsets is not None else 0
            if commit.leader_epoch is None or commit.leader_epoch >= theirs:
                return i
            log.warning("%s was written at leader epoch %d for the batch that epoch %d logged again: a late "
                        "write of a driver that had lost the leadership; batch %d is not committed",
                        self.commits.file_url(i), commit.leader_epoch, theirs, i)
        return -1

    def latest_logged_id(self) -> int:
        return self._next_id - 1

    def logged_times(self) -> list[int]:
        return sorted(self._ids)

    def is_committed(self, time_ms: int) -> bool:
        i = self._ids.get(time_ms)
        return i is not None and i <= self._committed

    def batch_id(self, time_ms: int) -> int | None:
        return self._ids.get(time_ms)

    def _line_ids(self, entry: OffsetSeq, batch_id: int) -> list[int]:
        """The input id of each line of ``entry`` (see the module's docstring)."""
        named = entry.metadata.conf.get(INPUT_IDS_FIELD) if entry.metadata is not None else None
        if named is None:
            return self.legacy_ids
        try:
            return [int(v) for v in named.split(",")] if named else []
        except ValueError:
            raise ValueError(f"{self.offsets.file_url(batch_id)}: {INPUT_IDS_FIELD} is {named!r}, not input ids "
                             "separated by commas") from None

    def _input_ends(self, batch_id: int, stream) -> dict[TopicPartition, int] | None:
        """``stream``'s end offsets in logged batch ``batch_id``; None: the entry has no line for it."""
        ends = self._ends.setdefault(batch_id, {})
        if stream.input_id not in ends:
            entry = self._raw[batch_id]
            ids = self._line_ids(entry, batch_id)
            if stream.input_id not in ids:
                return None
            text = entry.offsets[ids.index(stream.input_id)]
            ends[stream.input_id] = parse_offsets_json(text, stream.source, self.offsets.file_url(batch_id))
        return ends[stream.input_id]

    def latest_ends(self, stream) -> dict[TopicPartition, int] | None:
        """Where ``stream`` resumes planning: its end offsets in the last logged batch (None: none,
        or that batch was logged before an upgrade added it)."""
        if self._next_id == 0:
            return None
        return self._input_ends(self._next_id - 1, stream)

    def logged_ranges(self, stream, time_ms: int):
        """(ranges, ends) of ``stream`` in the logged batch at ``time_ms``; None if not logged."""
        i = self._ids.get(time_ms)
        if i is None:
            return None
        ends = self._input_ends(i, stream)
        if ends is None:  # logged before an upgrade added the input: nothing of it in this batch
            return [], {}
        if i - 1 in self._times:
            starts = self._input_ends(i - 1, stream)  # None: logged before an upgrade added the input
        elif i != 0:  # never from the input's start: that would widen the batch over earlier ones
            raise ValueError(f"batch {i} (time {time_ms}) cannot be recomputed: "
                             f"{self.offsets.file_url(i - 1)} (its start offsets) is missing (purged)")
        else:
            starts = None
        if starts is None:  # the input's first batch starts where the input started
            starts = self.initial_offsets(stream)
            if starts is None:
                raise ValueError(f"batch {i} (time {time_ms}) cannot be recomputed: "
                                 f"{self._initial_log(stream).file_url(0)} (its start offsets) is missing")
        missing = [tp for tp in ends if tp not in starts]  # new in batch i: from the source's earliest
        if missing:
            starts = {**starts, **stream.source.earliest_offsets(missing)}
        ranges = [OffsetRange(tp.topic, tp.partition, starts.get(tp, 0), end)
                  for tp, end in sorted(ends.items(), key=lambda kv: (kv[0].topic, str(kv[0].partition)))]
        return ranges, ends

    def _initial_log(self, stream) -> _InitialLog:
        return _InitialLog(self._layout.at(self._layout.source_start(stream.input_id)), self._options,
                           sync=self._sync)

    def initial_offsets(self, stream) -> dict[TopicPartition, int] | None:
        log_ = self._initial_log(stream)
        text = log_.get(0)
        return None if text is None else parse_offsets_json(text, stream.source, log_.file_url(0))

    def write_initial_offsets(self, stream, offsets: dict[TopicPartition, int]) -> None:
        self._initial_log(stream).add(0, offsets_json(offsets))

    # ------------------------------------------------------------------ running

    def log_batch(self, time_ms: int, ends: list[dict[TopicPartition, int]], conf: dict[str, str]) -> int:
        """Step 2: the batch's id, its offsets durable on return (a logged batch keeps its id)."""
        with self._lock:
            if time_ms in self._ids:
                return self._ids[time_ms]
            i = self._next_id
            if self._fence is not None:
                self._fence.check()
                conf = {**conf, LEADER_EPOCH_FIELD: str(self._fence.epoch)}
            conf = {**conf, INPUT_IDS_FIELD: ",".join(str(s.input_id) for s in self.inputs)}
            entry = OffsetSeq([offsets_json(e) for e in ends], OffsetSeqMetadata(0, time_ms, conf))
            if not self.offsets.add(i, entry):
                existing = self.offsets.get(i)
                if not self._replaces(self.offsets, i, None if existing is None else offsets_epoch(existing)):
                    raise ConcurrentUpdateError(
                        f"Concurrent update to the log: {self.offsets.file_url(i)} exists. Multiple "
                        f"streaming contexts are writing batch {i} of {self.directory}")
                self.offsets.replace(i, entry)
            self._ids[time_ms], self._times[i], self._raw[i] = i, time_ms, entry
            self._ends[i] = {s.input_id: dict(e) for s, e in zip(self.inputs, ends)}
            self._next_id = i + 1
            self._offsets_written += 1
            return i

    def _replaces(self, log_: MetadataLog, i: int, theirs: int | None) -> bool:
        """Whether this writer replaces batch ``i`` of ``log_``, which exists, written at leader
        epoch ``theirs`` (None: unknown, gone meanwhile): yes when that is older than this
        writer's (a late write of a driver that lost the leadership; this one owns the directory),
        no when it is the same; FencedError when it is newer (this writer is the late one)."""
        if self._fence is None or theirs is None:
            return False
        mine = self._fence.epoch
        if theirs > mine:
            raise FencedError(f"{log_.file_url(i)} was written at leader epoch {theirs}; this driver leads "
                              f"epoch {mine}, which is over: another driver took {self.directory} over")
        if theirs < mine:
            log.warning("%s was written at leader epoch %d, late (that driver had lost the leadership): "
                        "replaced by epoch %d's", log_.file_url(i), theirs, mine)
        return theirs < mine

    def batch_done(self, time_ms: int, succeeded: bool) -> None:
        """Step 3 ended (every output succeeded, or not: a failed batch is never committed)."""
        with self._lock:
            i = self._ids.get(time_ms)
            if i is None or i <= self._committed:
                return
            self._done[i] = succeeded
            self._flush()

    def checkpoint_durable(self, time_ms: int, protect_from_ms: int | None = None) -> None:
        """Step 4: the DStream checkpoint of ``time_ms`` is durable; a restart from it may need
        batches from ``protect_from_ms`` on (None: none). They are kept whatever ``retain`` says
        while the checkpoint is restorable: the newest, or the one before (a restart falls back to
        it when the newest does not verify: its ``.bk``, or the name before)."""
        with self._lock:
            self._durable_ms = max(self._durable_ms, time_ms)
            self._floors.append(protect_from_ms)
            self._flush()

    def _protected_from_ms(self) -> int | None:
        """The oldest batch time a restorable DStream checkpoint may need (None: none): the minimum
        of their floors, not the newest's. Purges keep that batch and its predecessor's offsets."""
        floors = [f for f in self._floors if f is not None]
        return min(floors) if floors else None

    def _flush(self) -> None:
        committed = []
        while self._done.get(self._committed + 1) and self._times[self._committed + 1] <= self._durable_ms:
            i = self._committed + 1
            if self._fence is not None:
                self._fence.check()
            del self._done[i]
            commit = CommitMetadata(0, leader_epoch=None if self._fence is None else self._fence.epoch)
            if not self.commits.add(i, commit):  # else a re-run of a committed batch, but for:
                existing = self.commits.get(i)
                if existing is not None and existing.leader_epoch is not None and \
                        self._replaces(self.commits, i, existing.leader_epoch):
                    self.commits.replace(i, commit)
            self._committed = i
            self._commits_written += 1
            committed.append(i)
        if committed:
            self._purge()
            if self._on_commit is not None:
                for i in committed:
                    self._on_commit(i, self._times[i])

    def _purge(self) -> None:
        threshold = self._committed - self.retain + 1
        floor = self._protected_from_ms()
        if floor is not None:
            protected = [i for i, t in self._times.items() if t >= floor]
            if protected:
                threshold = min(threshold, min(protected) - 1)  # keep the start offsets too
        if threshold <= 0 or min(self._times, default=threshold) >= threshold:
            return
        for i in [i for i in self._times if i < threshold]:
            t = self._times.pop(i)
            self._ids.pop(t, None)
            self._ends.pop(i, None)
            self._raw.pop(i, None)
        self._purged += len(self.offsets.purge(threshold))
        self.commits.purge(threshold)

    def statistics(self) -> BatchLogStatistics:
        with self._lock:
            return BatchLogStatistics(self._next_id - 1, self._committed, self._offsets_written,
                                      self._commits_written, self._purged)
