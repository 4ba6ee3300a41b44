"""The context's side of the batch protocol (:mod:`sparkwal.engine.sources.batch_log`): which inputs are
direct, when the offsets/commits logs are kept, planning and logging each batch."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from .. import config
from ..listener import StreamingListenerBatchCommitted
from ..sources.batch_log import BatchLog
from ..sources.direct import DirectInputDStream
from . import upgrade

from ..host import DriverFacts

if TYPE_CHECKING:
    from sparkwal.checkpoint import Checkpoint
    from sparkwal.wal import Leadership

    from ..upgrade_plan import UpgradePlan

    from .events import EventBus

log = logging.getLogger(__name__)


class BatchesHost(DriverFacts, Protocol):
    """What the batch protocol reads of the driver (which hands itself in; nothing here changes it)."""

    @property
    def events(self) -> EventBus: ...
    @property
    def batch_log(self) -> BatchLog | None: ...
    @property
    def restored(self) -> Checkpoint | None: ...
    @property
    def upgrade_plan(self) -> UpgradePlan | None: ...
    def lead(self) -> Leadership | None: ...


def direct_inputs(driver: BatchesHost) -> list:
    return [s for s in driver.graph.inputs if isinstance(s, DirectInputDStream)]


def start_batch_log(driver: BatchesHost) -> BatchLog | None:
    """The offsets/commits logs, read back; then the direct inputs learn where they resume.
    With a checkpoint, ``spark.sparkwal.batchLog.enabled`` decides: ``auto`` (default) when
    the graph has a direct input, ``true`` for every graph (a committed batch's outputs then
    never re-run after a restart, whatever its inputs), ``false`` never (direct inputs then
    re-plan from their initial offsets: at-least-once at best)."""
    mode = driver.settings[config.BATCH_LOG]
    wanted = mode == "true" or (mode == "auto" and bool(direct_inputs(driver)))
    blog = None
    if driver.checkpoint_dir is not None and wanted:
        sync = driver.settings[config.BATCH_LOG_FSYNC]
        retain = driver.settings[config.MIN_BATCHES_TO_RETAIN]
        blog = BatchLog(driver.location, direct_inputs(driver), sync=sync,
                        retain=retain, on_commit=lambda i, t: on_batch_committed(driver, i, t),
                        lock=driver.lead(),
                        legacy_ids=upgrade.earlier_line_ids(driver.restored, driver.upgrade_plan is not None))
        blog.recover()
    for s in direct_inputs(driver):
        s.start_planning(blog, driver.settings, driver.batch_ms)
    return blog


class BatchPlanner:
    """Steps 1-2 of the batch protocol for one run (each batch's ranges planned and logged before
    its jobs) and its commit once done: what the job generator and scheduler call
    (:class:`.generator.BatchSteps`). ``skip_outputs_ms``: batch times a restart regenerates
    without outputs (:attr:`.recovery.RestartPlan.skip_outputs_ms`)."""

    def __init__(self, batch_log: BatchLog | None, inputs: list[DirectInputDStream],
                 skip_outputs_ms: frozenset[int] | set[int] = frozenset()):
        self.batch_log, self.inputs, self.skip_outputs_ms = batch_log, list(inputs), frozenset(skip_outputs_ms)

    def plan(self, time_ms: int) -> bool:
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

    def batch_done(self, time_ms: int, info, ok: bool) -> None:
        """Batch ``time_ms`` ran (``ok``: every output succeeded): commit it, and tell the direct inputs."""
        if self.batch_log is not None:
            self.batch_log.batch_done(time_ms, ok)
        for s in self.inputs:
            s.on_batch_completed(info)


def on_batch_committed(driver: BatchesHost, batch_id: int, time_ms: int) -> None:
    driver.events.post(StreamingListenerBatchCommitted(batch_id, time_ms))
