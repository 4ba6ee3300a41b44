"""Restarting a context from its checkpoint and its batch log. Spark's restart rule:
``JobGenerator.restart`` (streaming/src/main/scala/org/apache/spark/streaming/scheduler/
JobGenerator.scala); the batch log's, ``MicroBatchExecution.populateStartOffsets``.

A restored context re-runs its checkpoint's pending batches, every batch time from the
checkpoint time up to the restart time, and every batch the offset log holds uncommitted; a
fresh context whose directory holds an offset log (a driver killed before its first checkpoint)
re-runs the logged uncommitted batches. Committed batches never run their outputs again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sparkwal.base.times import batch_name
from sparkwal.checkpoint import Checkpoint
from sparkwal.checkpoint.errors import CheckpointMismatchError

from .. import config
from ..upgrade_plan import UpgradePlan
from . import upgrade

if TYPE_CHECKING:
    from sparkwal.tracker import ReceivedBlockTracker
    from sparkwal.wal import StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from ..sources.batch_log import BatchLog
    from ..state import StateSnapshots
    from .checkpointing import Checkpointing
    from .timer import RecurringTimer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPlan:
    """What a start does with the batches before its first new one: ``first_ms`` (the first new
    batch time), ``regenerate`` (every earlier batch time generated again, in order), of which
    ``rerun_batch_times`` run their outputs and ``skipped_batch_times`` do not (committed, or
    completed before the checkpoint was written); ``skip_outputs_ms``: batch times whose outputs
    are skipped whenever they are generated."""
    first_ms: int
    regenerate: tuple[int, ...] = ()
    rerun_batch_times: tuple[int, ...] = ()
    skipped_batch_times: tuple[int, ...] = ()
    skip_outputs_ms: frozenset[int] = frozenset()
    #: missed batch times whose input the first new batch takes instead
    #: (``spark.sparkwal.recovery.coalesceDowntime``): not generated at all
    coalesced_batch_times: tuple[int, ...] = ()


@dataclass
class RestartFacts:
    """What this driver's start did with an earlier run's batches, and what its stop left for the
    next (``StreamingContext.recovery``, ``rerun_batch_times``, ...): ``kind`` is "new" (built by
    the program), "checkpoint" (rebuilt from a checkpoint, code included), "upgrade" (the program's
    graph, the checkpoint's data) or "takeover" (a standby's)."""

    kind: str = "new"
    rerun_batch_times: list[int] = field(default_factory=list)
    skipped_batch_times: list[int] = field(default_factory=list)
    coalesced_batch_times: list[int] = field(default_factory=list)
    batches_left_for_restart: list[int] = field(default_factory=list)

    def took(self, plan: RestartPlan) -> None:
        """The start followed ``plan``."""
        self.rerun_batch_times = list(plan.rerun_batch_times)
        self.skipped_batch_times = list(plan.skipped_batch_times)
        self.coalesced_batch_times = list(plan.coalesced_batch_times)


def _first_difference(old: str, new: str) -> str:
    a, b = old.split("; "), new.split("; ")
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"stream {i} was {x!r}, is now {y!r}"
    if len(a) != len(b):
        return f"the checkpoint has {len(a)} streams, this program {len(b)}"
    return "the fingerprint differs"


class CheckpointRestore:
    """Applying a checkpoint's data to the graph a driver runs and its state snapshots, before the
    start (the driver hands in its collaborators; the restart rule then takes it from there)."""

    def __init__(self, graph: DStreamGraph, snapshots: StateSnapshots, settings: StreamingConf, batch_ms: int,
                 location: StorageLocation):
        self.graph, self.snapshots, self.settings, self.batch_ms = graph, snapshots, settings, batch_ms
        self.location = location

    def apply(self, checkpoint: Checkpoint, kind: str | None = None, said: UpgradePlan | None = None
              ) -> UpgradePlan | None:
        """Apply ``checkpoint``'s data to the graph and the state snapshots; the driver records it as
        the checkpoint it restarts from. The graph must be the checkpoint's, unless ``kind`` is
        "upgrade": then a changed graph takes what the plan carries (returned; None: the graph is the
        checkpoint's), or the upgrade is refused, naming every loss. ``said``: the plan already logged."""
        data, graph = checkpoint.data, self.graph
        refused = batch_change_refusal(graph, self.batch_ms, self.location.url, data.get("batch_ms"), kind)
        if refused is not None:
            raise CheckpointMismatchError(refused)
        plan = None
        if data.get("fingerprint") != graph.fingerprint():
            difference = _first_difference(data.get("graph", ""), graph.describe())
            if kind != "upgrade":
                raise CheckpointMismatchError(
                    f"the DStream graph changed since the checkpoint in {self.location.url} was "
                    f"written: {difference}. {self._by_identity(data)}"
                    "Restore the original graph, or start from a new checkpoint directory")
            plan = upgrade.apply(graph, self.batch_ms, self.settings, self.location, checkpoint, difference, said)
        elif isinstance(data.get("input_ids"), list):  # the same graph, which an upgrade may have renumbered
            graph.keep_input_ids([int(i) for i in data["input_ids"]])
        for s in graph.inputs:
            s.restore(data.get("inputs", {}).get(str(s.input_id), {}))
        next_ids = data.get("next_ids") or {}
        graph.next_input_id = max(graph.next_input_id, int(next_ids.get("input", 0)))
        self.snapshots.restore(data.get("state", {}), data.get("state_slots"), data.get("state_starts"),
                               next_ids.get("state"))
        if plan is not None:
            upgrade.carry_state(graph, self.snapshots, plan)
        for first_new, last in data.get("downtimes", []):  # (checkpoints before issue 44 have none)
            graph.coalesce_downtime(last, first_new)
        graph.batch_grid_from_ms = data.get("batch_grid_from_ms")
        log.info("restored checkpoint of batch %d (pending %s)", checkpoint.checkpoint_time_ms,
                 checkpoint.pending_times_ms)
        return plan

    def _by_identity(self, data: dict) -> str:
        """What ``getOrCreate(..., upgrade=True)`` would make of the checkpoint's inputs and states
        (engine/driver/upgrade.py), for a checkpoint that recorded them."""
        try:
            plan = upgrade.plan_for(self.graph, self.batch_ms, self.settings, data)
        except Exception as e:  # noqa: BLE001  a damaged record explains nothing; the refusal stands, saying so
            return f"(Its streams' identities cannot be read: {e}.) "
        if plan is None:
            return ""
        said = "; ".join(plan.lines())
        said = said if len(said) <= 2000 else f"{said[:2000]}…"
        return f"An upgrade (getOrCreate(..., upgrade=True) with this program) would match them by identity: {said}. "


def batch_change_refusal(graph: DStreamGraph, batch_ms: int, checkpoint_dir: str | None, old_ms: int | None,
                         kind: str | None) -> str | None:
    """Why a checkpoint in ``checkpoint_dir`` written at a batch duration of ``old_ms`` cannot run
    ``graph`` at ``batch_ms``, or None. Only an upgrade changes it, and only where every state kept is
    exact whatever the batches are: a key's value in ``updateStateByKey`` and ``mapWithState`` (its
    timeouts count time, not batches) does not depend on how its records were cut into batches; a
    window's state does (it holds slices of the old duration and subtracts them as they leave), as does
    a stream sliding over several batches."""
    if old_ms is None or old_ms == batch_ms:
        return None
    change = (f"the checkpoint in {checkpoint_dir} was written with a batch duration of {old_ms} ms, "
              f"this program uses {batch_ms} ms")
    if kind != "upgrade":
        return f"{change}: a batch duration changes only in an upgrade (getOrCreate(..., upgrade=True))"
    s, windowed = _spanning_batches(graph, batch_ms)
    if s is None:
        return None
    if windowed:
        return (f"{change}, and {s} is windowed: its state holds slices of the old batches (a batch duration "
                "changes only where each state is kept per key: updateStateByKey, mapWithState)")
    return f"{change}, and {s} slides every {s.slide_ms} ms: a batch duration change needs every stream at it"


def _spanning_batches(graph: DStreamGraph, batch_ms: int) -> tuple:
    """(the first stream that spans several batches, whether it is a window), or (None, False)."""
    for s in graph.generated_streams():  # (a stream no output reaches never runs)
        if getattr(s, "window_ms", None) is not None or s.slide_ms != batch_ms:
            return s, getattr(s, "window_ms", None) is not None
    return None, False


class RestartRule:
    """Which batches a start runs again and from when it runs new ones, over the collaborators the
    driver hands in at its start: the graph, the state snapshots, the checkpoints, the job generator's
    timer, the batch log and the block tracker (None: not checkpointing, no receivers)."""

    def __init__(self, graph: DStreamGraph, snapshots: StateSnapshots, checkpointing: Checkpointing,
                 timer: RecurringTimer, batch_log: BatchLog | None, block_tracker: ReceivedBlockTracker | None,
                 settings: StreamingConf, batch_ms: int, checkpoint_dir: str | None):
        self.graph, self.snapshots, self.checkpointing, self.timer = graph, snapshots, checkpointing, timer
        self.batch_log, self.block_tracker = batch_log, block_tracker
        self.settings, self.batch_ms, self.checkpoint_dir = settings, batch_ms, checkpoint_dir

    def restart(self, cp: Checkpoint) -> RestartPlan:
        """Spark's restart rule, from checkpoint ``cp``: re-run the pending batches and every batch
        time from the checkpoint time up to the restart time, plus every logged uncommitted batch.
        Committed batches among them do not run their outputs again."""
        graph = self.graph
        zero = cp.data["zero_time_ms"]
        changed = cp.data.get("batch_ms") != self.batch_ms  # an upgrade to another batch duration: a new grid
        if changed:
            zero, graph.batch_grid_from_ms = self._new_batch_grid(cp), cp.checkpoint_time_ms
        # the batches up to the last one of an old batch duration are complete: none is generated again
        since = max(zero, graph.batch_grid_from_ms or zero)
        self._check_batch_log_agrees(cp, zero, since)
        graph.start(zero)
        if changed:
            self.checkpointing.write_on_new_grid(cp.checkpoint_time_ms)
        restart_ms = self.timer.restart_time(zero)
        down = list(range(cp.checkpoint_time_ms, restart_ms, self.batch_ms))
        logged = self.batch_log.rerun_times if self.batch_log is not None else []
        # (a stream's first checkpoint is of its zero time, before its first batch: not a batch)
        # (a downtime an earlier restart coalesced has no batch times: they ran as its first new batch)
        times = sorted({t for t in [*cp.pending_times_ms, *down, *logged]
                        if since < t < restart_ms and not graph.coalesced(t)})
        coalesced: list[int] = []
        if self.settings[config.COALESCE_DOWNTIME]:
            times, coalesced = self._coalesce_downtime(cp, times, logged, restart_ms)
        plan = self._rerun(cp, times, restart_ms)
        self._check_rerun_inputs(plan.rerun_batch_times)  # (committed batches run no job: read nothing)
        self.snapshots.load_for_restart(times[0] if times else restart_ms, cp.checkpoint_time_ms, restart_ms,
                                        plan.skipped_batch_times)
        # the states an upgrade added hold what the new version outputs: from its first re-run batch
        self.snapshots.begin(plan.rerun_batch_times[0] if plan.rerun_batch_times else restart_ms)
        return replace(plan, coalesced_batch_times=tuple(coalesced))

    def fresh_start(self) -> RestartPlan:
        """A context made by the program. If the checkpoint directory's offset log has batches
        (a driver killed before its first DStream checkpoint), the logged uncommitted ones re-run
        with their logged ranges and times, and batch ids continue."""
        first = self.timer.start_time()
        blog = self.batch_log
        if blog is None or blog.latest_logged_id() < 0:
            self.graph.start(first - self.batch_ms)
            return RestartPlan(first)
        anchor = (blog.rerun_times or blog.logged_times()[-1:])[0]
        zero = anchor - self.batch_ms
        self.graph.start(zero)
        return self._rerun(None, list(blog.rerun_times), self.timer.restart_time(zero))

    def why_not_coalesced(self) -> str | None:
        """Why this program's missed batches cannot run as one, or None."""
        s, windowed = _spanning_batches(self.graph, self.batch_ms)
        if s is not None:
            return f"{s} is windowed (each window needs its own batches)" if windowed else \
                f"{s} slides every {s.slide_ms} ms, not every batch"
        for s in self.graph.generated_streams():
            if getattr(s, "timeout_ms", None) is not None:
                return f"{s} has a state timeout (keys are timed out batch by batch)"
        return None

    def _check_rerun_inputs(self, times_ms) -> None:
        """Before anything runs: what the re-run batches read again must be there (a checkpoint copy does not
        carry a file stream's input files): :meth:`InputDStream.check_inputs_present`, one line naming it."""
        for stream in self.graph.inputs:
            stream.check_inputs_present(list(times_ms), self.checkpoint_dir)

    def _new_batch_grid(self, cp: Checkpoint) -> int:
        """The zero time of the new batch duration's grid (an upgrade that changes it): one new batch
        before the last batch the old version completed, ``cp``'s, so that batch is on the grid, its
        state (snapshotted at a graceful stop or a handover) the one the first new batch builds on.
        Refused, in one line, while batches of the old duration are left to re-run (a kill, not a
        stop) or a state's newest snapshot is older than that batch."""
        blog, snapshots = self.batch_log, self.snapshots
        allocated = self.block_tracker.last_allocated_batch_ms if self.block_tracker is not None else None
        # logged, or given receiver blocks, after the checkpoint (a kill before its generation's checkpoint)
        logged = blog.logged_times() if blog is not None else []
        later = [t for t in [*logged, allocated or 0] if t > cp.checkpoint_time_ms]
        left = sorted({*cp.pending_times_ms, *(blog.rerun_times if blog is not None else []), *later})
        change = f"the batch duration changes from {cp.data.get('batch_ms')} ms to {self.batch_ms} ms"
        if left or cp.data.get("completed_ms") != cp.checkpoint_time_ms:
            raise CheckpointMismatchError(
                f"{change}, but the checkpoint in {self.checkpoint_dir} leaves batches of the old duration to "
                f"re-run ({left or [cp.checkpoint_time_ms]}): stop the old version gracefully (SIGTERM with "
                "spark.streaming.stopGracefullyOnShutdown, or sparkwal checkpoint handover), which completes them, "
                "then start this one")
        for index, stream in enumerate(self.graph.streams):
            if not stream.must_checkpoint or snapshots.starts.get(index, -1) is None:
                continue  # (a state this upgrade adds starts empty; one no output reaches has no identity: added)
            times = snapshots.by_stream[index].snapshots if index in snapshots.by_stream else {}
            if max(times, default=None) != cp.checkpoint_time_ms:
                raise CheckpointMismatchError(
                    f"{change}, but the newest snapshot of {stream} is of batch {max(times, default=None)}, not of "
                    f"the last batch ({cp.checkpoint_time_ms}): its state would be recomputed at the old duration; "
                    "stop the old version gracefully with this sparkwal (it snapshots the last batch), then start "
                    "this one")
        log.warning("%s: the new batches run at %d ms from %s on", change, self.batch_ms,
                    batch_name(cp.checkpoint_time_ms))
        return cp.checkpoint_time_ms - self.batch_ms

    def _coalesce_downtime(self, cp: Checkpoint, times: list[int], logged: list[int],
                           restart_ms: int) -> tuple[list[int], list[int]]:
        """``(times to regenerate, times coalesced)``: the checkpoint's own, pending and logged batch
        times still run as they were (their outputs and ranges are fixed); the batch times after them,
        missed while the driver was down, are not generated, and the first new batch takes their input
        (Structured Streaming's way after downtime), and stateful streams build its state on the last
        batch's. Only where the program allows it: no window, every stream at the batch's slide, state
        without timeouts (a key's timeout counts batches); otherwise Spark's rule, said in one line."""
        refused = self.why_not_coalesced()
        if refused is not None:
            log.warning("spark.sparkwal.recovery.coalesceDowntime: re-running every missed batch as "
                        "Spark does: %s", refused)
            return times, []
        # (a batch given receiver blocks after the checkpoint, its driver killed before the checkpoint of its
        # generation, runs as it was: coalesced, its blocks would be in no batch)
        allocated = self.block_tracker.last_allocated_batch_ms if self.block_tracker is not None else None
        last = max([cp.checkpoint_time_ms, *cp.pending_times_ms, *logged, allocated or 0])
        kept, coalesced = [t for t in times if t <= last], [t for t in times if t > last]
        if coalesced:
            self.graph.coalesce_downtime(last, restart_ms)
            log.info("restarting: the %d batch times missed from %d to %d run as the batch of %d "
                     "(spark.sparkwal.recovery.coalesceDowntime)", len(coalesced), coalesced[0], coalesced[-1],
                     restart_ms)
        return kept, coalesced

    def _rerun(self, cp: Checkpoint | None, times: list[int], restart: int) -> RestartPlan:
        """The plan that regenerates ``times`` (committed ones skip their jobs, as does the batch of
        a checkpoint written after all its outputs succeeded), then starts new batches at ``restart``."""
        blog = self.batch_log
        completed = cp.data.get("completed_ms") if cp is not None else None
        # with a batch log, its commits say which batches completed
        skip_outputs = frozenset({completed}) if blog is None and completed is not None else frozenset()
        skipped = tuple(t for t in times if (blog is not None and blog.is_committed(t)) or t in skip_outputs)
        rerun_times = tuple(t for t in times if t not in set(skipped))
        log.info("restarting: re-running batches %s (committed, outputs not re-run: %s), then new "
                 "batches from %d", list(rerun_times), list(skipped), restart)
        return RestartPlan(restart, tuple(times), rerun_times, skipped, skip_outputs)

    def _check_batch_log_agrees(self, cp: Checkpoint, zero: int, since: int) -> None:
        """The offset log must hold every batch the checkpoint saw logged, those after ``since`` on its
        batch grid (a new batch duration's grid begins after the old batches)."""
        blog = self.batch_log
        if blog is None:
            return
        expected = cp.data.get("batch_log_latest", -1)
        if blog.latest_logged_id() < expected:
            raise CheckpointMismatchError(
                f"the checkpoint of batch {cp.checkpoint_time_ms} in {self.checkpoint_dir} was "
                f"written after batch id {expected} was logged, but {blog.offsets.path} ends at "
                f"{blog.latest_logged_id()}: the offset log was lost or restored from an older "
                "copy; restore it (or start from a new checkpoint directory)")
        for t in blog.logged_times():
            if t > since and (t - zero) % self.batch_ms:
                raise CheckpointMismatchError(
                    f"{blog.offsets.file_url(blog.batch_id(t))} logs batch time {t}, which is not "
                    f"on this checkpoint's batch grid (zero time {zero}, {self.batch_ms} ms)")
