"""The context's side of the batch protocol (:mod:`engine.sources.batch_log`): which inputs are
direct, when the offsets/commits logs are kept, planning and logging each batch."""

from __future__ import annotations

import logging

from .sources.batch_log import BatchLog

log = logging.getLogger(__name__)


def direct_inputs(ssc) -> list:
    from .sources.direct import DirectInputDStream

    return [s for s in ssc._graph.inputs if isinstance(s, DirectInputDStream)]


def start_batch_log(ssc) -> None:
    """The offsets/commits logs, read back; then the direct inputs learn where they resume.
    With a checkpoint, ``spark.sparkwal.batchLog.enabled`` decides: ``auto`` (default) when
    the graph has a direct input, ``true`` for every graph (a committed batch's outputs then
    never re-run after a restart, whatever its inputs), ``false`` never (direct inputs then
    re-plan from their initial offsets: at-least-once at best)."""
    mode = ssc._conf.get("spark.sparkwal.batchLog.enabled", "auto").lower()
    if mode not in ("auto", "true", "false"):
        raise ValueError(f"spark.sparkwal.batchLog.enabled must be auto, true or false, got {mode!r}")
    wanted = mode == "true" or (mode == "auto" and bool(direct_inputs(ssc)))
    if ssc._checkpoint_dir is not None and wanted:
        sync = ssc._conf.get("spark.sparkwal.batchLog.fsync", "true").lower() != "false"
        retain = int(ssc._conf.get("spark.sql.streaming.minBatchesToRetain", "100"))
        ssc._batch_log = BatchLog(ssc._checkpoint_dir, direct_inputs(ssc),
                                   storage_options=ssc._storage_options, sync=sync,
                                   retain=retain, on_commit=lambda i, t: on_batch_committed(ssc, i, t),
                                   lock=ssc._lead())
        ssc._batch_log.recover()
    for s in direct_inputs(ssc):
        s.start_planning(ssc._batch_log, ssc._conf, ssc._batch_ms)


def plan_batch(ssc, time_ms: int) -> bool:
    """Steps 1-2 of the batch protocol; False: the batch is committed (skip its jobs)."""
    blog = ssc._batch_log
    if blog is not None and blog.is_committed(time_ms):
        log.info("batch %d (id %d) is committed: its outputs are not run again", time_ms,
                 blog.batch_id(time_ms))
        return False
    if time_ms in ssc._skip_outputs_ms:
        log.info("batch %d completed before the restart: its outputs are not run again", time_ms)
        return False
    ends = [s.plan(time_ms) for s in direct_inputs(ssc)]
    if blog is not None:
        blog.log_batch(time_ms, ends, {})
    return True


def on_batch_committed(ssc, batch_id: int, time_ms: int) -> None:
    from .listener import StreamingListenerBatchCommitted

    ssc._post("onBatchCommitted", StreamingListenerBatchCommitted(batch_id, time_ms))
