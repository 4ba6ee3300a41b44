"""StateSnapshots: writing each stateful stream's state as a chain of snapshots, and which of them a checkpoint needs.

At every checkpoint-interval time a stateful stream's state is written (by Spark's tasks; the files'
format is :mod:`sparkwal.checkpoint.state_files`', the checkpoint's entry
:mod:`sparkwal.checkpoint.state_chains`'): a *delta* of the keys changed or removed since the stream's
previous snapshot, or a *full* snapshot when there is none yet, when the chain already holds
``spark.sparkwal.state.deltasPerFull`` deltas (default 10), when its deltas together are as large as
its full snapshot (a restart reads at most about twice the state), or when the state's lineage
reaches back ``spark.sparkwal.state.maxLineageBatches`` batches (default 50).

A full snapshot is then read back, partitioned as before, cached, and served from then on: the
state's lineage ends there (Spark's RDD checkpoint, whose files are read only when the cache is
lost). After a delta the cached state goes on being served: reading the chain back would cost a
whole state's decoding every checkpoint interval. So the lineage reaches back to the last full
snapshot (at most ``deltasPerFull`` intervals, and ``spark.sparkwal.state.maxLineageBatches``
batches), and :meth:`StateSnapshots.floor` keeps the inputs of those batches, which an executor
that loses the cached state recomputes from.

A backlog must not lengthen it: batches are generated on time (as Spark's), each on the state of the
batch before, so batches generated while the one whose full snapshot cuts the lineage waits to run
would reach back past the cut (Spark's RDD checkpoint rewrites the RDDs built on a checkpointed one in
place; a snapshot read back cannot). :meth:`StateSnapshots.generation_waits` names the batches that
would reach back further than the next cut can be due (``maxLineageBatches`` plus an interval): the
generator (:class:`sparkwal.engine.driver.generator.JobGenerator`) holds them until the cut is made (a
soak's driver died of a StackOverflowError, Java deserializing RDDs recursively, with ~160 queued).

A restart, and a hot standby ahead of a takeover, read them back (:mod:`.snapshot_reads`).
Snapshots outside the chains of the three newest are retired, and deleted once two checkpoints taken
after their retirement (a main file and its .bk) are durable: checkpoints are written behind the
batches, and one taken earlier still references them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING


from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.checkpoint.state_chains import SnapshotRef, StreamState, parse_state, state_names
from sparkwal.checkpoint.state_files import read_manifest

from .. import config
from . import versions
from .snapshot_reads import SnapshotReads
from .snapshot_tasks import delete_snapshot, write_snapshot

if TYPE_CHECKING:
    from sparkwal.checkpoint import CheckpointWriter
    from pyspark import SparkContext

    from sparkwal.wal import Leadership

    from ..config import StreamingConf
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)

DELTAS_PER_FULL = config.DELTAS_PER_FULL.default
#: a full snapshot once the lineage reaches back this many batches (``spark.sparkwal.state.maxLineageBatches``)
MAX_LINEAGE_BATCHES = config.MAX_LINEAGE_BATCHES.default
CHAINS_KEPT = 3


class StateSnapshots(SnapshotReads):
    """The state snapshots of one driver, handed what they read: the SparkContext, the settings, the
    batch duration, the graph and the checkpoint location (each replaced by the driver's
    :meth:`use_graph`/:meth:`use_location` before a start), the held lock of the checkpoint directory
    (``held``: fences each snapshot written; its epoch names it) and, at a leader's start, the
    checkpoint writer whose sequence retires old snapshots (:meth:`use_writer`)."""

    def __init__(self, sc: SparkContext, settings: StreamingConf, batch_ms: int, graph: DStreamGraph,
                 held: Callable[[], Leadership | None]):
        super().__init__(sc, graph)
        self._settings, self._batch_ms, self._held = settings, batch_ms, held
        self._writer: CheckpointWriter | None = None
        #: (checkpoints queued when it was retired, URL): see on_checkpoint_written
        self._retired: list[tuple[int, str]] = []
        #: stream name -> the newest snapshots' sizes: "fullBytes", "deltaBytes", and "keys" (as of
        #: the newest full snapshot), for the UI and the metrics
        self.sizes: dict[str, dict[str, int]] = {}
        #: stream index -> the number its snapshots are named by where an upgrade moved it (absent: its index)
        self.slots: dict[int, int] = {}
        #: above every number snapshots were ever named by here: a new state never takes a dropped one's
        self.next_slot = 0
        #: a graceful stop or handover began: each batch left snapshots its state (the next driver re-runs none)
        self.each_batch = False

    deltas_per_full = property(lambda self: self._settings[config.DELTAS_PER_FULL])
    max_lineage_batches = property(lambda self: self._settings[config.MAX_LINEAGE_BATCHES])

    def use_writer(self, writer: CheckpointWriter | None) -> None:
        self._writer = writer

    @property
    def roots(self) -> dict[int, int]:
        """Stream index -> the batch time the lineage of its newest state RDD starts at."""
        out = {}
        for index, stream in enumerate(self._graph.streams):
            if stream.must_checkpoint and stream.generated_rdds:
                start = stream.lineage_start(max(stream.generated_rdds))
                if start is not None:
                    out[index] = start
        return out

    def generation_waits(self, time_ms: int) -> str | None:
        """Why the batch of ``time_ms`` must wait for the batches in flight, or None: a state would reach
        back more than ``maxLineageBatches`` plus an interval, its cutting full snapshot due at a batch
        generated already (see the module's docstring)."""
        if self._checkpoint_dir is None:  # the state is checkpointed locally, cut in place
            return None
        for index, stream in self._stateful():
            if not stream.checkpoint_ms or not stream.is_time_valid(time_ms):
                continue
            start = stream.lineage_start(time_ms - stream.slide_ms)
            bound = self.max_lineage_batches * self._batch_ms + stream.checkpoint_ms
            if start is not None and time_ms - start > bound:
                return (f"the state of {stream.state_name(index)} would reach back to batch {start} "
                        f"({(time_ms - start) // self._batch_ms} batches; at most "
                        f"{bound // self._batch_ms}) until a full snapshot cuts it")
        return None

    def restore(self, data: dict, slots: dict | None = None, starts: dict | None = None,
                next_slot: int | None = None) -> None:
        """From a checkpoint's ``state`` entry, each snapshot located in this directory wherever it was
        written (:mod:`sparkwal.checkpoint.layout`); the ``state_slots`` and ``state_starts`` entries."""
        self.slots = {int(i): int(n) for i, n in (slots or {}).items()}
        self.starts = {int(i): int(t) for i, t in (starts or {}).items()}
        self.next_slot = int(next_slot or 0)
        layout = CheckpointLayout(self._checkpoint_dir)
        elsewhere = layout.written_at(state_names(data))
        if elsewhere is not None:
            log.warning("the checkpoint in %s names its state snapshots under %s, where an older "
                        "sparkwal wrote it: they are read from %s, and nothing under %s is read, "
                        "written or deleted", layout.root, elsewhere, layout.root, elsewhere)
        self.by_stream = parse_state(data, layout)

    def checkpoint_data(self) -> dict:
        layout = CheckpointLayout(self._checkpoint_dir)
        return {str(i): s.to_json(layout) for i, s in self.by_stream.items()}

    def placement_data(self) -> tuple[dict[str, int], dict[str, int], int]:
        """The checkpoint's ``state_slots``, ``state_starts`` (empty but after an upgrade), the next free number."""
        named = [*self.slots.values(), *(i for i in self.by_stream if i not in self.slots)]
        return ({str(i): n for i, n in self.slots.items()},
                {str(i): t for i, t in self.starts.items() if t is not None},
                max([self.next_slot - 1, *named, len(self._graph.streams) - 1]) + 1)

    def carry(self, moved: dict[int, int], new_states: list[int]) -> None:
        """An upgrade: the restored state of the checkpoint's stream ``old`` goes to this graph's ``moved[old]``,
        under the number its snapshots are named by (no other stream's snapshot of the same batch time ever
        replaces one of its chain); the states of ``new_states`` start empty, at the first batch the new
        version runs (:meth:`begin`), under numbers no state of the checkpoint had. After :meth:`restore`."""
        restored, old_slots, old_starts = self.by_stream, self.slots, self.starts
        self.by_stream, self.slots, self.starts = {}, {}, {}
        for old, new in moved.items():
            if old in restored:
                self.by_stream[new] = restored[old]
            self.slots[new] = old_slots.get(old, old)
            if old in old_starts:  # a state an earlier upgrade added keeps its start
                self.starts[new] = old_starts[old]
        fresh = max([*old_slots.values(), *restored, *moved, *self.slots.values(),
                     len(self._graph.streams) - 1, self.next_slot - 1], default=-1) + 1
        for index in new_states:
            self.slots[index], self.starts[index] = fresh, None
            fresh += 1

    def begin(self, first_ms: int) -> None:
        """The states an upgrade added start at ``first_ms``, the first batch the new version runs."""
        for index, start in self.starts.items():
            self.starts[index] = first_ms if start is None else start
            self._graph.streams[index].state_start_ms = self.starts[index]

    def check_directory(self) -> None:
        """Spark's tasks write and read snapshots: a ``memory://`` filesystem (private to a process) cannot
        hold them. A bad ``maxLineageBatches`` fails here, at start, not in a batch."""
        stateful = [s for s in self._graph.streams if s.must_checkpoint]
        if stateful:
            self.max_lineage_batches  # noqa: B018
        if stateful and self._checkpoint_dir is not None and self._checkpoint_dir.startswith("memory://"):
            raise ValueError(
                f"checkpoint directory {self._checkpoint_dir}: {stateful[0]} snapshots its state "
                "from Spark's tasks, which cannot see this process's memory:// filesystem; use a "
                "local or shared directory")

    def _full_due(self, state: StreamState, previous: int | None, rdd, stream, index: int,
                  time_ms: int) -> bool:
        if previous is None:
            return True
        root = stream.lineage_start(time_ms)
        if root is not None and time_ms - root >= self.max_lineage_batches * self._batch_ms:
            return True
        chain = state.chain(previous)
        deltas = chain[1:]
        if len(deltas) >= self.deltas_per_full or sum(r.bytes for r in deltas) >= max(chain[0].bytes, 1):
            return True
        manifest = read_manifest(state.snapshots[previous].url, self._storage_options)
        return (len(manifest["parts"]) != rdd.getNumPartitions() or not manifest.get("partitioned")
                or not stream.state_partitioned(rdd) or versions.written_at(manifest) != stream.state_version)

    def _due(self, time_ms: int):
        """(index, stream, its state RDD at ``time_ms``) of each stream whose snapshot is due."""
        if self._checkpoint_dir is None:
            return
        for index, stream in self._stateful():
            if not stream.checkpoint_ms:
                continue
            if not self.each_batch and (time_ms - stream.zero_time_ms) % stream.checkpoint_ms != 0:
                continue
            rdd = stream.generated_rdds.get(time_ms)
            state = self.by_stream.get(index)
            if rdd is None or (state is not None and time_ms in state.snapshots):
                continue
            yield index, stream, rdd

    def any_due(self, time_ms: int) -> bool:
        return next(self._due(time_ms), None) is not None

    def snapshot_due(self, time_ms: int) -> None:
        """Snapshot the state of stateful streams due at ``time_ms`` (data, our own files:
        referenced by the checkpoint, deleted when retired), then serve it read back."""
        for index, stream, rdd in list(self._due(time_ms)):
            state = self.by_stream.setdefault(index, StreamState(stream.state_name(self.slots.get(index, index))))
            lead = self._held()
            epoch = lead.epoch if lead is not None else None  # in the name: see checkpoint.state_files
            url = (CheckpointLayout(self._checkpoint_dir).state_snapshot(self.slots.get(index, index), time_ms)
                   + (f"-e{epoch}" if epoch is not None else ""))
            previous = max((t for t in state.snapshots if t < time_ms), default=None)
            rows = None
            if not self._full_due(state, previous, rdd, stream, index, time_ms):
                rows = stream.state_delta_rows(rdd, previous, time_ms)
            base = previous if rows is not None else None
            if rows is None:
                rows = stream.state_rows(rdd, time_ms)
            manifest = write_snapshot(rows, url, time_ms=time_ms, base_ms=base,
                                      partitioned=stream.state_partitioned(rdd),
                                      storage_options=self._storage_options, fence=lead,
                                      state_version=stream.state_version)
            state.snapshots[time_ms] = SnapshotRef(time_ms, url, base, sum(p[1] for p in manifest["parts"]))
            self.sizes.setdefault(state.name, {})[
                "fullBytes" if base is None else "deltaBytes"] = state.snapshots[time_ms].bytes
            if base is None:
                self.sizes[state.name]["keys"] = sum(p[0] for p in manifest["parts"])
            if base is None and getattr(rdd, "has_lineage", True):  # a full snapshot ends the lineage (not deltas)
                stream.replace_rdd(time_ms, rdd, self._read(stream, state, time_ms))
            self._retire(state)

    def _retire(self, state: StreamState) -> None:
        newest = sorted(state.snapshots)[-CHAINS_KEPT:]
        needed = {ref.time_ms for t in newest for ref in state.chain(t)}
        for t in sorted(set(state.snapshots) - needed):
            self._retired.append((self._writer.queued, state.snapshots.pop(t).url))

    def on_checkpoint_written(self) -> None:
        """Delete retired snapshots once two checkpoints taken after their retirement are durable
        (the newest and the one before it, which a restart falls back on, no longer reference
        them). Checkpoints are written in the order they are taken, on a thread of their own, and
        may fall behind: one taken before the retirement, which still references the snapshot,
        can be written after it."""
        written = self._writer.last_written_seq
        layout = CheckpointLayout(self._checkpoint_dir)
        keep = []
        for queued_then, path in self._retired:
            if written >= queued_then + 2:
                if not layout.relative(path):  # never: the driver deletes only its own files
                    log.warning("not deleting state snapshot %s: it is outside the checkpoint "
                                "directory %s", path, layout.root)
                    continue
                try:
                    delete_snapshot(path, self._storage_options)
                except Exception as e:  # noqa: BLE001
                    log.warning("could not delete old state snapshot %s: %s", path, e)
            else:
                keep.append((queued_then, path))
        self._retired = keep

    def _stateful(self) -> list[tuple]:
        """(index, stream) of each stateful stream a batch generates: one no output reaches keeps
        no state to snapshot, and must not hold the inputs and checkpoints kept for a restart at its
        zero time (they were kept forever)."""
        generated = {id(s) for s in self._graph.generated_streams()}
        return [(i, s) for i, s in enumerate(self._graph.streams) if s.must_checkpoint and id(s) in generated]

    def floor(self, floor: int) -> int:
        """The oldest batch a restart from a checkpoint re-running ``floor`` onwards may need: a stateful
        stream restarts from its newest snapshot at or before ``floor`` (before it, for mapWithState) and
        recomputes the batches after it from their inputs, which are kept (the snapshot may lag the batches
        by more than the remember duration). The running state's lineage starts at the last full snapshot
        it was read back from (or earlier): an executor that loses the cached state recomputes the batches
        since then from their inputs, kept too."""
        zero = self._graph.zero_time_ms or 0
        for index, stream in self._stateful():
            times = self.by_stream.get(index, StreamState("")).snapshots
            base = max((t for t in times if t < floor or (t == floor and stream.state_is_output)),
                       default=None)
            start = stream.oldest_lineage_start()
            begins = zero if stream.state_start_ms is None else stream.state_start_ms
            floor = min(floor, base if base is not None else begins, begins if start is None else start)
        return floor
