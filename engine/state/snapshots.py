"""StateSnapshots: which state snapshot of each stateful stream a checkpoint references.

A stateful stream's RDD at a checkpoint-interval time is written as a snapshot (the format is
:mod:`engine.snapshot`'s) and read back from then on, so its lineage ends there. Each stream
keeps its two newest snapshots; an older one is deleted once two newer checkpoints (a main file
and its .bk) no longer reference it. A restart loads the newest snapshot at or before its first
re-run batch and recomputes the later batches from their inputs.
"""

from __future__ import annotations

import logging

from ..restart import CheckpointMismatchError
from ..snapshot import SnapshotError, delete_snapshot, read_snapshot, write_snapshot

log = logging.getLogger(__name__)


class StateSnapshots:
    def __init__(self, ssc):
        self._ssc = ssc
        self.by_stream: dict[int, dict[int, str]] = {}  # stream index -> time -> snapshot URL
        self._retired: list[tuple[int, str]] = []  # (checkpoints written then, URL)
        self.checkpoints_written = 0

    def restore(self, data: dict) -> None:
        """From a checkpoint's ``state`` entry."""
        self.by_stream = {int(i): {int(t): p for t, p in times.items()} for i, times in data.items()}

    def checkpoint_data(self) -> dict:
        return {str(i): {str(t): p for t, p in times.items()} for i, times in self.by_stream.items()}

    def check_directory(self) -> None:
        """Snapshots are written and read by Spark's tasks, in other processes: a ``memory://``
        filesystem (private to each process) cannot hold them."""
        ssc = self._ssc
        stateful = [s for s in ssc._graph.streams if s.must_checkpoint]
        if stateful and ssc._checkpoint_dir is not None and ssc._checkpoint_dir.startswith("memory://"):
            raise ValueError(
                f"checkpoint directory {ssc._checkpoint_dir}: {stateful[0]} snapshots its state "
                "from Spark's tasks, which cannot see this process's memory:// filesystem; use a "
                "local or shared directory")

    def load_for_restart(self, first_ms: int, checkpoint_time_ms: int) -> None:
        """Serve each stateful stream's snapshots from the newest at or before ``first_ms``."""
        ssc = self._ssc
        for index, snapshots in self.by_stream.items():
            stream = ssc._graph.streams[index]
            base = max((t for t in snapshots if t <= first_ms), default=min(snapshots, default=0))
            for t in sorted(t for t in snapshots if t >= base):
                path = snapshots[t]
                try:
                    rdd = read_snapshot(ssc._sc, path, ssc._storage_options)
                except SnapshotError as e:
                    raise CheckpointMismatchError(
                        f"{e}; it holds the state of batch {t}, referenced by the checkpoint of batch "
                        f"{checkpoint_time_ms}: the state cannot be restored") from None
                stream.generated_rdds[t] = rdd  # not cached: re-reading a snapshot is cheap

    def snapshot_due(self, time_ms: int) -> None:
        """Save the state RDDs of stateful streams due at ``time_ms`` (data, our own files:
        referenced by the checkpoint, deleted when retired), then read the state from the
        snapshot from now on: its lineage ends there, and an executor that loses the cached
        state recomputes it from the snapshot."""
        ssc = self._ssc
        if ssc._checkpoint_dir is None:
            return
        for index, stream in enumerate(ssc._graph.streams):
            if not stream.must_checkpoint or not stream.checkpoint_ms:
                continue
            if (time_ms - stream.zero_time_ms) % stream.checkpoint_ms != 0:
                continue
            rdd = stream.generated_rdds.get(time_ms)
            times = self.by_stream.setdefault(index, {})
            if rdd is None or time_ms in times:
                continue
            path = f"{ssc._checkpoint_dir.rstrip('/')}/state/{index}-{time_ms}"
            write_snapshot(rdd, path, ssc._storage_options)  # replaces one a killed run left
            # Not cached: reading a snapshot costs about what caching its records would, and a
            # cached RDD cannot be pipelined with the Python function of the job that reads it.
            stream.replace_rdd(time_ms, rdd, read_snapshot(ssc._sc, path, ssc._storage_options))
            times[time_ms] = path
            for old in sorted(times)[:-2]:
                self._retired.append((self.checkpoints_written, times.pop(old)))

    def on_checkpoint_written(self) -> None:
        """Delete retired snapshots once two newer checkpoints no longer reference them."""
        self.checkpoints_written += 1
        keep = []
        for written_then, path in self._retired:
            if self.checkpoints_written >= written_then + 2:
                try:
                    delete_snapshot(path, self._ssc._storage_options)
                except Exception:  # noqa: BLE001
                    log.warning("could not delete old state snapshot %s", path, exc_info=True)
            else:
                keep.append((written_then, path))
        self._retired = keep

    def floor(self, floor: int) -> int:
        """The oldest batch a restart from a checkpoint re-running ``floor`` onwards may need:
        a stateful stream restarts from its newest snapshot at or before ``floor`` and recomputes
        the batches after it from their inputs, so those batches' inputs must be kept (the
        snapshot may lag the batches by more than the remember duration)."""
        ssc = self._ssc
        for index, stream in enumerate(ssc._graph.streams):
            if not stream.must_checkpoint:
                continue
            times = self.by_stream.get(index, {})
            base = max((t for t in times if t <= floor), default=None)
            floor = min(floor, base if base is not None else (ssc._graph.zero_time_ms or 0))
        return floor
