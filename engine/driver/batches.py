"""The context's side of the batch protocol (:mod:`sparkwal.engine.sources.batch_log`): which inputs are
direct, when the offsets/commits logs are kept, planning and logging each batch."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import config
from ..listener import StreamingListenerBatchCommitted
from ..sources.batch_log import BatchLog
from ..sources.direct import DirectInputDStream
from . import upgrade

if TYPE_CHECKING:
    from sparkwal.checkpoint import Checkpoint
    from sparkwal.wal import Leadership, StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from .events import EventBus

log = logging.getLogger(__name__)


def direct_inputs(graph: DStreamGraph) -> list[DirectInputDStream]:
    return [s for s in graph.inputs if isinstance(s, DirectInputDStream)]


def start_batch_log(settings: StreamingConf, location: StorageLocation | None, graph: DStreamGraph, batch_ms: int,
                    lock: Leadership | None, restored: Checkpoint | None, upgraded: bool,
                    events: EventBus) -> BatchLog | None:
    """The offsets/commits logs in checkpoint directory ``location`` (None: none), read back; then
    the direct inputs of ``graph`` learn where they resume. With a checkpoint,
    ``spark.sparkwal.batchLog.enabled`` decides: ``auto`` (default) when the graph has a direct
    input, ``true`` for every graph (a committed batch's outputs then never re-run after a restart,
    whatever its inputs), ``false`` never (direct inputs then re-plan from their initial offsets:
    at-least-once at best). ``lock``: the leadership its writes are made under; ``restored``,
    ``upgraded``: the checkpoint restarted from, and whether an upgrade changed its graph."""
    mode = settings[config.BATCH_LOG]
    inputs = direct_inputs(graph)
    blog = None
    if location is not None and (mode == "true" or (mode == "auto" and bool(inputs))):
        blog = BatchLog(location, inputs, sync=settings[config.BATCH_LOG_FSYNC],
                        retain=settings[config.MIN_BATCHES_TO_RETAIN],
                        on_commit=lambda i, t: events.post(StreamingListenerBatchCommitted(i, t)),
                        lock=lock, legacy_ids=upgrade.earlier_line_ids(restored, upgraded))
        blog.recover()
    for s in inputs:
        s.start_planning(blog, settings, batch_ms)
    return blog


class BatchPlanner:
    """Steps 1-2 of the batch protocol for one run (each batch's ranges planned and logged before
    its jobs) and its commit once done: what the job generator and scheduler call
    (:class:`.generator.BatchSteps`). ``skip_outputs_ms``: batch times a restart regenerates
    without outputs (:attr:`.recovery.RestartPlan.skip_outputs_ms`)."""

    def __init__(self, batch_log: BatchLog | None, inputs: list[DirectInputDStream],
                 skip_outputs_ms: frozenset[int] | set[int] = frozenset()):
        self.batch_log, self.inputs, self.skip_outputs_ms = batch_log, list(inputs), frozenset(skip_outputs_ms)

    def plan_batch(self, time_ms: int) -> bool:
        """Plan and log batch ``time_ms``; False: it is committed (skip its jobs)."""
        blog = self.batch_log
        if blog is not None and blog.is_committed(time_ms):
            log.info("batch %d (id %d) is committed: its outputs are not run again", time_ms,
                     blog.batch_id(time_ms))
            return False
        if time_ms in self.skip_outputs_ms:
            log.info("batch %d completed before the restart: its outputs are not run again", time_ms)
            return False
        ends = [s.plan(time_ms) for s in self.inputs]
        if blog is not None:
            blog.log_batch(time_ms, ends, {})
        return True

    def batch_ran(self, time_ms: int, info, ok: bool) -> None:
        """Batch ``time_ms`` ran (``ok``: every output succeeded): commit it, and tell the direct inputs."""
        if self.batch_log is not None:
            self.batch_log.batch_done(time_ms, ok)
        for s in self.inputs:
            s.on_batch_completed(info)
