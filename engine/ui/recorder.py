"""The driver's events, recorded: one listener turns each into an event record
(:mod:`sparkwal.checkpoint.event_log`'s format) and hands it to the run's status (the page and the REST
API), its metrics and, for a driver with a checkpoint, its event log.

It runs on the threads that post (the scheduler's, the checkpoint writer's, the receiver
tracker's), so it only builds small dicts and queues them; the event log writes them from a
thread of its own.
"""

from __future__ import annotations

import logging
import time

from ..listener import StreamingListener

log = logging.getLogger(__name__)

MAX_TEXT = 4096  #: longest error message or name kept (a record's size stays bounded)
SAMPLE_EVERY_S = 2.0  #: storage statistics are sampled after a batch at most this often


def _text(value) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def op_record(op) -> dict:
    return {"id": op.output_op_id, "name": _text(op.op_name), "description": _text(op.op_name),
            "startTime": op.start_time_ms if op.start_time_ms >= 0 else None,
            "endTime": op.end_time_ms if op.end_time_ms >= 0 else None,
            "failureReason": _text(op.failure) if op.failure else None,
            "jobIds": list(getattr(op, "job_ids", ()) or ()),
            "breakdown": dict(getattr(op, "breakdown", None) or {})}


def batch_record(info, now_ms: int) -> dict:
    return {"event": "batch", "time": now_ms, "batchTime": info.batch_time_ms,
            "submissionTime": info.submission_time_ms,
            "processingStartTime": info.processing_start_time_ms,
            "processingEndTime": info.processing_end_time_ms,
            "inputs": {str(k): v.num_records for k, v in info.stream_id_to_input_info.items()},
            "numOutputOps": len(info.output_operation_infos),
            "ops": [op_record(op) for _, op in sorted(info.output_operation_infos.items())],
            "breakdown": dict(getattr(info, "breakdown", None) or {}),
            "paths": {_text(str(k)): _text(str(v)) for k, v in (getattr(info, "paths", None) or {}).items()}}


class Recorder(StreamingListener):
    """``sample``: a function returning the driver's storage statistics (a ``statistics``
    record's ``wal`` and ``state``), called after batches, at most every ``SAMPLE_EVERY_S``."""

    def __init__(self, status, metrics=None, writer=None, *, clock, sample=None):
        self.status = status
        self.metrics = metrics
        self.writer = writer
        self._clock = clock
        self._sample = sample
        self._last_sample = float("-inf")
        self._rerun: set[int] = set()
        self._first_new_batch = None
        self._names = {str(s["id"]): s.get("name") or str(s["id"]) for s in status.run.get("streams", ())}

    def log_to(self, writer) -> None:
        """Write the durable records to ``writer`` (the run's event log) from now on."""
        self.writer = writer

    def expect_reruns(self, batch_times) -> None:
        """Batches a restart re-runs: the run's ``firstNewBatch`` is the first one after them."""
        self._rerun = set(batch_times)

    def _record(self, record: dict, durable: bool = True) -> None:
        self.status.apply(record)
        if durable and self.writer is not None:
            self.writer.append(record)

    def onBatchSubmitted(self, batchSubmitted) -> None:
        info = batchSubmitted.batchInfo()
        record = batch_record(info, self._clock.now_ms())
        record["event"] = "submitted"
        self._record(record, durable=False)
        if self.metrics is not None:
            self.metrics.on_submitted(record, self._names)
            self.metrics.unprocessed_batches.set(len(self.status.active))

    def onBatchStarted(self, batchStarted) -> None:
        info = batchStarted.batchInfo()
        self._record({"event": "started", "batchTime": info.batch_time_ms,
                      "processingStartTime": info.processing_start_time_ms}, durable=False)

    def onOutputOperationStarted(self, outputOperationStarted) -> None:
        op = outputOperationStarted.outputOperationInfo()
        self._record({"event": "op", "batchTime": op.batch_time_ms, "op": op_record(op)}, durable=False)

    def onOutputOperationCompleted(self, outputOperationCompleted) -> None:
        self.onOutputOperationStarted(outputOperationCompleted)

    def onBatchCompleted(self, batchCompleted) -> None:
        info = batchCompleted.batchInfo()
        record = batch_record(info, self._clock.now_ms())
        self._record(record)
        if self.metrics is not None:
            self.metrics.on_batch(record, len(self.status.active))
        if self._first_new_batch is None and info.batch_time_ms not in self._rerun:
            self._first_new_batch = info.batch_time_ms
            self.status.run["firstNewBatch"] = info.batch_time_ms
            if self.writer is not None:
                self.writer.update_run(firstNewBatch=info.batch_time_ms)
        self.sample()

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._sample is None or (not force and now - self._last_sample < SAMPLE_EVERY_S):
            return
        self._last_sample = now
        try:
            stats = self._sample()
        except Exception:
            log.debug("could not sample the driver's statistics", exc_info=True)
            return
        record = {"event": "statistics", "time": self._clock.now_ms(), **stats}
        self._record(record)
        if self.metrics is not None:
            self.metrics.on_sample(record)
            if self.writer is not None:
                self.metrics.event_log_dropped.set(self.writer.statistics().dropped)

    def onCheckpointWritten(self, checkpointWritten) -> None:
        e = checkpointWritten
        self._record({"event": "checkpoint", "time": self._clock.now_ms(), "checkpointTime": e.checkpoint_time_ms,
                      "epoch": e.epoch, "tookMs": e.took_ms, "bytes": e.bytes})
        if self.metrics is not None:
            self.metrics.checkpoint_write.observe(e.took_ms / 1000)

    def _receiver(self, kind: str, event) -> None:
        r = event.receiverInfo()
        self._record({"event": "receiver", "time": self._clock.now_ms(), "kind": kind, "streamId": r.stream_id,
                      "name": _text(r.name_), "active": bool(r.active_), "executorId": _text(r.executor_id_),
                      "host": _text(r.location_), "lastErrorTime": r.last_error_time_ms,
                      "lastErrorMessage": _text(r.last_error_message), "lastError": _text(r.last_error)})
        if self.metrics is not None:
            self.metrics.receiver_up.labels(self._names.get(str(r.stream_id), str(r.stream_id))).set(
                1 if r.active_ else 0)

    def onReceiverStarted(self, receiverStarted) -> None:
        self._receiver("started", receiverStarted)

    def onReceiverError(self, receiverError) -> None:
        self._receiver("error", receiverError)

    def onReceiverStopped(self, receiverStopped) -> None:
        self._receiver("stopped", receiverStopped)

    def onBacklog(self, backlog) -> None:
        self._record({"event": "backlog", "time": self._clock.now_ms(), "state": backlog.state,
                      "schedulingDelay": backlog.scheduling_delay_ms, "backlog": backlog.backlog})

    def onDriverRestarted(self, driverRestarted) -> None:
        e = driverRestarted
        self._record({"event": "restarted", "time": self._clock.now_ms(), "recovery": e.recovery,
                      "checkpointTime": e.checkpoint_time_ms, "rerunBatches": list(e.rerun_batch_times),
                      "skippedBatches": list(e.skipped_batch_times)})

    def onDriverTakeover(self, driverTakeover) -> None:
        e = driverTakeover
        self._record({"event": "takeover", "time": self._clock.now_ms(), "epoch": e.epoch,
                      "resumedFrom": e.resumed_from_ms, "tookMs": e.took_ms})
        if self.writer is not None:
            self.writer.update_run(takeoverMs=e.took_ms)

    def onDriverFenced(self, driverFenced) -> None:
        self._record({"event": "fenced", "time": self._clock.now_ms(), "reason": _text(driverFenced.reason)})
        if self.writer is not None:
            self.writer.update_run(fenced=_text(driverFenced.reason))

    def stopped(self) -> None:
        """The driver stopped (not posted as an event: recorded last)."""
        now = self._clock.now_ms()
        self.sample(force=True)
        self._record({"event": "stopped", "time": now})
        if self.writer is not None:
            self.writer.update_run(endTime=now)
