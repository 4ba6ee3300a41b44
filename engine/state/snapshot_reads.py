"""SnapshotReads: the state snapshots read back, by a restart and by a hot standby ahead of a takeover.

A restart reads each stream's newest usable snapshot (:meth:`SnapshotReads._restart_times`) and
recomputes the later batches from their inputs. A standby reads the state a takeover would start
from while it waits (:meth:`SnapshotReads.preload`), applying each new delta to what it holds.
Which snapshots exist, and their writing, are :class:`sparkwal.engine.state.snapshots.StateSnapshots`',
which extends this class; the files' format is :mod:`sparkwal.checkpoint.state_files`'.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from pyspark import RDD, SparkContext, StorageLevel

from sparkwal.checkpoint.errors import CheckpointMismatchError
from sparkwal.checkpoint.state_chains import StreamState

from .snapshot_tasks import ChainOnDriver, SnapshotError, apply_delta, chain_on_driver, read_chain

if TYPE_CHECKING:
    from sparkwal.wal import StorageLocation

    from ..graph import DStreamGraph


class SnapshotReads:
    """Reads of one driver's state snapshots, handed the SparkContext and the graph, and the
    checkpoint location once it is set (:meth:`use_graph` and :meth:`use_location` replace them
    before a start)."""

    def __init__(self, sc: SparkContext, graph: DStreamGraph):
        self._sc, self._graph = sc, graph
        self._location: StorageLocation | None = None
        self.by_stream: dict[int, StreamState] = {}  # stream index -> its snapshots
        #: stream index -> the first batch time of a state an upgrade added (None: set at its start)
        self.starts: dict[int, int | None] = {}
        #: a standby's state read ahead of a takeover: (stream index, batch time) -> (chain's newest URL, RDD)
        self._preloaded: dict[tuple[int, int], tuple[str, RDD]] = {}
        self._wanted: set[tuple[int, int]] = set()  # what the newest preload needs
        self._unpersist_later: tuple[int, list] = (0, [])  # (batch time, RDDs): load_for_restart

    def use_graph(self, graph: DStreamGraph) -> None:
        self._graph = graph

    def use_location(self, location: StorageLocation | None) -> None:
        """The checkpoint directory (None: no checkpointing; the state is checkpointed locally)."""
        self._location = location

    @property
    def _checkpoint_dir(self) -> str | None:
        return self._location.url if self._location is not None else None

    @property
    def _storage_options(self) -> dict | None:
        return self._location.options if self._location is not None else None

    def _read(self, stream, state: StreamState, time_ms: int, checkpoint_time_ms: int | None = None):
        try:
            rows, partitioned = read_chain(self._sc, state.chain(time_ms), self._storage_options,
                                           (stream.state_version, stream.state_migrate, state.name))
        except SnapshotError as e:
            if checkpoint_time_ms is None:
                raise
            raise CheckpointMismatchError(
                f"{e}; it holds the state of batch {time_ms}, referenced by the checkpoint of batch "
                f"{checkpoint_time_ms}: the state cannot be restored") from None
        return self._cached(stream.state_from_rows(rows, partitioned), stream, state, time_ms)

    def _cached(self, rdd, stream, state: StreamState, time_ms: int):
        """``rdd``, the state at snapshot ``time_ms``, cached; the driver may read its chain itself."""
        chain_on_driver(rdd, self._on_driver(stream, state, time_ms))
        return rdd.persist(StorageLevel.MEMORY_ONLY)

    def _on_driver(self, stream, state: StreamState, time_ms: int) -> ChainOnDriver:  # (driver_state.py)
        return ChainOnDriver(state.chain(time_ms), self._storage_options, stream.state_version)

    def _restart_times(self, index: int, state: StreamState, first_ms: int, checkpoint_time_ms: int,
                       committed: Collection[int] = ()) -> list[int]:
        """The snapshot times a restart re-running ``first_ms`` onwards serves ``index``'s state from: the
        newest at or before ``first_ms`` and every later one (before it for mapWithState, whose re-run batches
        call the function again, but at a ``committed`` one, not re-run, that nothing else remembers, when
        none is before it: a graceful stop in the first checkpoint interval snapshots only its last batch)."""
        stream = self._graph.streams[index]
        times = sorted(state.snapshots)
        usable = [t for t in times if t < first_ms or (t == first_ms and stream.state_is_output)]
        start = self.starts.get(index)
        if not usable and start is not None and first_ms <= start:  # added by an upgrade: empty before it
            return []
        if not usable and times:
            if not stream.state_is_output and not (times[0] == first_ms and first_ms in committed
                                                   and not self._records_remembered(stream)):
                raise CheckpointMismatchError(
                    f"{stream}: the oldest state snapshot the checkpoint of batch "
                    f"{checkpoint_time_ms} references is of batch {times[0]}, not before the "
                    f"first batch to re-run ({first_ms}): the state cannot be restored")
            usable = times[:1]
        if not usable:
            return []
        return [t for t in times if t >= usable[-1]] if stream.state_is_output else usable[-1:]

    def _records_remembered(self, stream) -> bool:
        """Whether a stream on ``stream`` keeps an RDD past its batch (a window, ``remember``)."""
        return any(stream in s.dependencies and (s.remember_ms is None or s.remember_ms > s.slide_ms)
                   for s in self._graph.generated_streams())

    def _records_used_later(self, stream) -> bool:
        """Whether a batch's records of ``stream`` may be read by a later batch: a stream after it
        (at any depth) remembers its RDDs past their batch or keeps a state, which a restart may
        work out again from that batch's records."""
        after, seen, generated = [stream], set(), self._graph.generated_streams()
        while after:
            current = after.pop()
            for s in generated:
                if current in s.dependencies and id(s) not in seen:
                    if s.must_checkpoint or s.remember_ms is None or s.remember_ms > s.slide_ms:
                        return True
                    seen.add(id(s))
                    after.append(s)
        return False

    def _load(self, index: int, state: StreamState, t: int, checkpoint_time_ms: int):
        """The state of ``index`` at snapshot ``t``: the standby's preloaded RDD of that snapshot (or of
        its chain, the deltas since applied to it), else read now (cached, made by its first job)."""
        url = state.snapshots[t].url
        preloaded = self._preloaded.get((index, t))
        if preloaded is not None and preloaded[0] == url:
            return preloaded[1]
        stream = self._graph.streams[index]
        advanced = self._advance(stream, index, state, t) if self._preloaded else None
        return advanced if advanced is not None else self._read(stream, state, t, checkpoint_time_ms)

    def load_for_restart(self, first_ms: int, checkpoint_time_ms: int, new_ms: int, committed: Collection[int] = ()):
        """Serve each stateful stream's state from its newest usable snapshot, and hand each committed re-generated
        batch its own. ``new_ms``: the first new batch time (a standby's preloaded state is kept until then)."""
        for index, state in self.by_stream.items():
            stream = self._graph.streams[index]
            later = self._restart_times(index, state, first_ms, checkpoint_time_ms, committed)
            for t in later:
                stream.serve_state(t, self._load(index, state, t, checkpoint_time_ms))
            stream.state_snapshotted({t: self._on_driver(stream, state, t)
                                      for t in state.snapshots if t in committed and t not in later},
                                     self._records_used_later(stream))
        # the rest of a standby's preloaded state is unpersisted once the first new batch is
        # done: until then the state served may be a delta applied to it, not computed yet
        # (a batch re-run for its generation only computes nothing)
        rest = [rdd for _url, rdd in self._preloaded.values()]
        self._unpersist_later = (new_ms, rest)
        self._preloaded.clear()

    def preload(self, first_ms: int, checkpoint_time_ms: int, committed: Collection[int] = ()) -> list:
        """A standby: the state a takeover re-running ``first_ms`` onwards would start from, read
        into RDDs cached in this driver's executors (the caller materialises the returned new ones
        now, so that the takeover's first batch finds them there, then calls
        :meth:`drop_unwanted`). A delta whose base is held already is applied to it, partition by
        partition (:func:`sparkwal.engine.state.snapshot_tasks.apply_delta`): the standby reads only the keys changed
        since its last look, and the whole state only at a full snapshot."""
        self._wanted, new = set(), []
        for index, state in self.by_stream.items():
            for t in self._restart_times(index, state, first_ms, checkpoint_time_ms, committed):
                self._wanted.add((index, t))
                url = state.snapshots[t].url
                if self._preloaded.get((index, t), (None,))[0] == url:
                    continue
                rdd = self._load(index, state, t, checkpoint_time_ms)
                rdd.setName(f"sparkwal standby: state of stream {index} at {t}")
                self._preloaded[(index, t)] = (url, rdd)
                new.append(rdd)
        return new

    def _advance(self, stream, index: int, state: StreamState, t: int):
        """The state at delta ``t`` from preloaded state of its chain and the deltas after it
        (:func:`sparkwal.engine.state.snapshot_tasks.apply_delta`), or None when none of its chain is held."""
        chain = state.chain(t)
        for start in range(len(chain) - 2, -1, -1):
            held = self._preloaded.get((index, chain[start].time_ms))
            if held is not None and held[0] == chain[start].url:
                break
        else:
            return None
        rdd = held[1]
        for before, ref in zip(chain[start:], chain[start + 1:]):
            if not stream.state_partitioned(rdd):
                return None
            rows = apply_delta(self._sc, stream.state_rows(rdd, before.time_ms), ref,
                               rdd.getNumPartitions(), self._storage_options, stream.state_version)
            if rows is None:
                return None
            rdd = stream.state_from_rows(rows, True)
        return self._cached(rdd, stream, state, t)

    def drop_unwanted(self) -> None:
        """After the newest preload was materialised: forget the state it no longer needs."""
        self._drop_preloaded(keep=self._wanted)

    def _drop_preloaded(self, keep: set) -> None:
        """Forget preloaded state outside ``keep``; unpersist what no stream serves."""
        for key in [k for k in self._preloaded if k not in keep]:
            _url, rdd = self._preloaded.pop(key)
            stream = self._graph.streams[key[0]]
            if stream.generated_rdds.get(key[1]) is not rdd:
                rdd.unpersist(blocking=False)

    def release_cached(self) -> None:
        """Unpersist a standby's preloaded state and what a takeover kept of it (a driver replaced)."""
        rdds = [rdd for _url, rdd in self._preloaded.values()] + self._unpersist_later[1]
        self._preloaded.clear()
        self._unpersist_later = (0, [])
        for rdd in rdds:
            rdd.unpersist(blocking=False)

    def on_batch_done(self, time_ms: int) -> None:
        """Unpersist a standby's preloaded state that no stream serves, once the first new batch
        after the takeover is done (see :meth:`load_for_restart`)."""
        due, rdds = self._unpersist_later
        if rdds and time_ms >= due:
            self._unpersist_later = (0, [])
            served = [r for s in self._graph.streams for r in list(s.generated_rdds.values())]
            for rdd in rdds:
                if not any(rdd is r for r in served):
                    rdd.unpersist(blocking=False)
