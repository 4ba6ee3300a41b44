"""The context's DStream checkpoints: what each one holds, and what follows once one is durable.

A checkpoint's ``data`` (the file format itself is :mod:`sparkwal.checkpoint.checkpoint_file`'s)::

    {"fingerprint", "graph": the graph's identity and description (a restart must match it),
     "identities": {stream index: {"identity", "uid", "kind", "ambiguous", "input_id", "window_ms",
     "slide_ms"}} of each input and stateful operator an output reaches: what an upgrade knows it by
     (:mod:`sparkwal.engine.identity`),
     "batch_ms", "zero_time_ms", "inputs": {input id: the input's own data (files seen, ...)},
     "input_ids": [the inputs' ids in the order the program made them (an upgrade may have renumbered them)],
     "state": {stream index: its state snapshots}, "batch_log_latest": the newest logged batch id
     (-1: no batch log), "code": the program's code part, "conf": the SparkConf pairs,
     "completed_ms": the checkpoint's batch time when it was written after every output of that
     batch succeeded (a restart then regenerates that batch without outputting it again), else
     None, "leader_epoch": the writing driver's leadership epoch (None: not leading),
     "floor_ms": the oldest batch time a restart from it may need (its blocks, logged batches
     and received data are kept from there; ``sparkwal checkpoint copy`` copies from there),
     "downtimes": [[first new batch time, the last batch time before it], ...] of downtimes a
     restart coalesced (``spark.sparkwal.recovery.coalesceDowntime``) after the floor,
     "batch_grid_from_ms": after an upgrade that changed the batch duration, the last batch of the
     old one (the batches up to it are complete, on the old grid; absent: none changed it),
     and after an upgrade to a changed graph (:mod:`sparkwal.engine.driver.upgrade`):
     "next_ids": {"input": above every input id given here, "state": above every snapshot number},
     "state_slots": {stream index: the number its snapshots are named by, where not its index},
     "state_starts": {stream index: the first batch time of a state the upgrade added},
     "batch_log_lines": [the input id of each line of an offsets entry that does not name them]}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkwal.checkpoint import Checkpoint, CheckpointError
from sparkwal.checkpoint.code import delete_code_parts_except
from sparkwal.checkpoint.checkpoint_file import CHECKPOINT_FILE, LEADER_EPOCH_KEY

from ..identity import identities
from .breakdown import RecentDurations

if TYPE_CHECKING:
    from sparkwal.checkpoint import CheckpointWriter
    from sparkwal.wal import StorageLocation

    from ..graph import DStreamGraph
    from ..sources.batch_log import BatchLog
    from ..state import StateSnapshots
    from .scheduler import JobScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointedRun:
    """What a start made that each checkpoint holds or is written through: the writer (None: no
    checkpoint directory), the graph run, the batch log, the program's code part and conf pairs, and
    the scheduler (its pending batches go in each checkpoint; blocks are cleaned up once one is durable)."""

    writer: CheckpointWriter | None
    location: StorageLocation | None  #: the checkpoint directory
    graph: DStreamGraph
    batch_log: BatchLog | None
    code_name: str | None
    conf_pairs: list[list[str]]
    scheduler: JobScheduler


class Checkpointing:
    """The driver's DStream checkpoints: writes them (through the driver's
    :class:`~sparkwal.checkpoint.CheckpointWriter`) and, once each is durable, cleans up behind
    it. Owns what that takes: the clean-up floor of every write in flight, how many were written,
    and whether earlier runs' code parts are gone (Spark's ``JobGenerator`` owns its checkpoint
    writer and what follows a write the same way)."""

    def __init__(self, batch_ms: int, snapshots: StateSnapshots, leader_epoch: Callable[[], int | None]):
        self._batch_ms, self._snapshots, self._leader_epoch = batch_ms, snapshots, leader_epoch
        self._run: CheckpointedRun | None = None  # handed at start
        #: checkpoint time -> (oldest batch it may re-run, when it was handed to the writer), per write
        self._floors: dict[int, list[tuple[int, float]]] = {}
        self._floors_lock = threading.Lock()  # not the driver's lock: stop() holds that while the writer ends
        self.written = 0
        self.succeeded_ms = -1  #: the newest batch whose outputs all succeeded (its checkpoint says so)
        self._code_parts_cleaned = False
        self.write_ms = RecentDurations()  #: batch time -> how long its first checkpoint took to write
        self._identities: dict[str, dict] | None = None  # the graph's, once it started (it is fixed then)

    def start(self, run: CheckpointedRun) -> None:
        """What the start made that each checkpoint holds or is written through (before the first)."""
        self._run = run

    def batch_succeeded(self, time_ms: int) -> None:
        """Every output of batch ``time_ms`` succeeded: its completion's checkpoint says so."""
        self.succeeded_ms = max(self.succeeded_ms, time_ms)

    def on_written(self, time_ms: int) -> int:
        """Once a checkpoint is durable, forget the block allocations no restart from it can need
        (older than its pending batches and the remember duration), and delete retired state
        snapshots once two newer checkpoints (a main file and its .bk) no longer reference them.
        Returns how long the checkpoint took to write, in ms (from its hand-over to the writer)."""
        run = self._started()
        with self._floors_lock:
            floor, handed = self._floors[time_ms].pop(0)
            if not self._floors[time_ms]:
                del self._floors[time_ms]
        floor = min(floor, time_ms - run.graph.max_remember_ms())
        try:  # runs on the checkpoint writer's thread, which must not die of it
            run.scheduler.cleanup_old_blocks(floor)
        except Exception as e:  # noqa: BLE001
            log.warning("could not clean up block metadata after checkpoint %d: %s", time_ms, e)
        if run.batch_log is not None:  # step 5 of the batch protocol may follow
            run.batch_log.checkpoint_durable(time_ms, floor)
        self.written += 1
        if run.code_name and not self._code_parts_cleaned and run.writer is not None \
                and self.written >= run.writer.keep:
            try:
                self._code_parts_cleaned = self._delete_unused_code_parts()
            except Exception as e:  # noqa: BLE001
                log.warning("could not delete old code parts in %s: %s", run.location.url if run.location else None, e)
        self._snapshots.on_checkpoint_written()
        took_ms = (time.monotonic() - handed) * 1000
        self.write_ms.record(time_ms, round(took_ms, 1))
        return int(took_ms)

    def checkpoint_batch(self, time_ms: int, clear_later: bool) -> None:
        """The checkpoint of ``time_ms``: at its generation, and at its completion (``clear_later``).
        A completion that snapshots state is written twice: first at once (the batch is done; its
        state is still the previous snapshot's chain plus its lineage), then with the snapshot, which
        takes a Spark job. A driver killed during that job thus re-runs no batch it had completed
        (each write at one time replaces the previous, kept as the ``.bk``)."""
        if self._run is None or self._run.writer is None:
            return
        if clear_later and self._snapshots.any_due(time_ms):
            self._write(time_ms, clear_later)
            self._snapshots.snapshot_due(time_ms)
        self._write(time_ms, clear_later)

    def write_on_new_grid(self, last_ms: int) -> None:
        """An upgrade that changed the batch duration: the old version's last batch, complete,
        checkpointed again on the new grid (batch duration, zero time) before any new batch is
        logged, durable before the start returns: a kill from here on restarts as this version."""
        self.batch_succeeded(last_ms)
        self._write(last_ms, True)
        self._writer().flush()

    def write_first(self, first_ms: int) -> None:
        """A new stream's first checkpoint, of the time before its first batch, durable before
        ``start()`` returns: a driver killed before its first batch's checkpoint then restarts from
        where the stream began (its inputs' start, every batch since re-run) instead of starting a
        new stream, which would miss what arrived meanwhile."""
        self._write(first_ms - self._batch_ms, False)
        self._writer().flush()  # bounded: each storage call has its deadline (wal.retry)

    def _started(self) -> CheckpointedRun:
        assert self._run is not None, "a checkpoint before the start handed its parts"
        return self._run

    def _writer(self) -> CheckpointWriter:
        writer = self._started().writer
        assert writer is not None, "a checkpoint written without a checkpoint directory"
        return writer

    def _write(self, time_ms: int, clear_later: bool) -> None:
        run, snapshots = self._started(), self._snapshots
        graph = run.graph
        pending = run.scheduler.pending_times()
        floor = min(snapshots.floor(min([time_ms, *pending])), time_ms - graph.max_remember_ms())
        data = {
            "fingerprint": graph.fingerprint(),
            "graph": graph.describe(),
            "identities": self._graph_identities(),
            "batch_ms": self._batch_ms,
            "zero_time_ms": graph.zero_time_ms,
            "inputs": {str(s.input_id): s.checkpoint_data() for s in graph.inputs},
            "input_ids": graph.input_ids_by_creation(),
            "state": snapshots.checkpoint_data(),
            **self._placement(),
            "batch_log_latest": run.batch_log.latest_logged_id() if run.batch_log is not None else -1,
            "code": run.code_name,
            "conf": run.conf_pairs,
            # the checkpoint of a batch whose outputs all succeeded says so: a restart from it
            # (which re-runs the checkpoint's own batch, as Spark's does) skips its outputs
            "completed_ms": time_ms if clear_later and time_ms == self.succeeded_ms else None,
            LEADER_EPOCH_KEY: self._leader_epoch(),
            "floor_ms": floor,
            "downtimes": graph.downtimes_since(floor),
            **({"batch_grid_from_ms": graph.batch_grid_from_ms} if graph.batch_grid_from_ms is not None else {}),
        }
        with self._floors_lock:
            self._floors.setdefault(time_ms, []).append((floor, time.monotonic()))
        self._writer().write(Checkpoint(time_ms, pending, data))

    def _placement(self) -> dict:
        """Where an upgrade put things (``next_ids`` always; the others after an upgrade)."""
        run = self._started()
        slots, starts, next_slot = self._snapshots.placement_data()
        out: dict[str, object] = {"next_ids": {"input": run.graph.next_input_id, "state": next_slot}}
        if slots:
            out["state_slots"] = slots
        if starts:
            out["state_starts"] = starts
        blog = run.batch_log
        earlier = blog.legacy_ids if blog is not None else None
        if earlier is not None and blog is not None and earlier != [s.input_id for s in blog.inputs]:
            out["batch_log_lines"] = earlier
        return out

    def _graph_identities(self) -> dict[str, dict]:
        if self._identities is None:
            try:
                self._identities = {str(i): ident.record() for i, ident in identities(self._started().graph).items()}
            except Exception:  # advisory (an upgrade then needs the checkpoint's own graph): never a failed write
                log.warning("the streams' identities could not be recorded in the checkpoint", exc_info=True)
                self._identities = {}
        return self._identities

    def _delete_unused_code_parts(self) -> bool:
        """Delete earlier runs' code parts once no checkpoint file left names one (True: done). A
        file name says nothing: an earlier run that fell behind may have left checkpoints named after
        later batch times than this run's, which then outlive this run's first ones."""
        run = self._started()
        location = run.location
        assert location is not None
        storage, root = location.resolve()
        named = set()
        for info in storage.list_files(root):
            if CHECKPOINT_FILE.fullmatch(info.name):
                try:
                    named.add(Checkpoint.decode(storage.read_file(info.path), info.path).data.get("code"))
                except (FileNotFoundError, CheckpointError):
                    return False  # replaced or retired meanwhile: look again after the next one
        if named - {run.code_name}:
            return False
        delete_code_parts_except(location, run.code_name)
        return True
