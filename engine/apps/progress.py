"""The main job's progress: one line per batch for people, or JSON-line events for tools
(``--json``), and what a restart recovered and a run did (:mod:`sparkwal.engine.apps.wordcount`)."""

from __future__ import annotations

import json
import sys
import threading
import time

from sparkwal.engine import StreamingListener

_EMIT_LOCK = threading.Lock()


def emit(event: dict, json_events: bool, text: str) -> None:
    line = json.dumps(event, sort_keys=True) if json_events else text
    with _EMIT_LOCK:  # listeners print from several threads: one whole line at a time
        sys.stdout.write(line + "\n")
        sys.stdout.flush()



class Progress(StreamingListener):
    """One line per batch, as Spark's UI would show it (the same records as the Streaming
    page); totals for the summary. ``batch_s``: the batch duration; ``files``: the input is a
    file stream (its files are counted too)."""

    def __init__(self, json_events: bool, batch_s: float, files: bool):
        self.json_events, self.batch_s, self.show_files = json_events, batch_s, files
        self.batches = self.records = self.files = 0
        self.processing_ms: list[int] = []

    def onReceiverStarted(self, started):
        r = started.receiverInfo()
        emit({"event": "receiver_started", "stream_id": r.streamId(), "executor_id": r.executorId(),
              "host": r.location(), "worker_pid": r.worker_pid}, self.json_events,
             f"receiver {r.streamId()} ({r.name()}) started on executor {r.executorId()} ({r.location()})")

    def onReceiverStopped(self, stopped):
        r = stopped.receiverInfo()
        emit({"event": "receiver_stopped", "stream_id": r.streamId(), "executor_id": r.executorId(),
              "error": r.lastError()}, self.json_events,
             f"receiver {r.streamId()} stopped on executor {r.executorId()}"
             + (f": {r.lastErrorMessage()}" if r.lastError() else ""))

    def onDriverTakeover(self, takeover):
        emit({"event": "takeover", "epoch": takeover.epoch, "resumed_from_ms": takeover.resumed_from_ms,
              "took_ms": takeover.took_ms, "rerun_batches": len(takeover.rerun_batch_times),
              "rerun": times(list(takeover.rerun_batch_times))},
             self.json_events, f"took over the stream at epoch {takeover.epoch} in {takeover.took_ms} ms"
             + (f", re-running {len(takeover.rerun_batch_times)} batches" if takeover.rerun_batch_times
                else ""))

    def onBacklog(self, backlog):
        if self.json_events:  # for people, the engine's warning line says it (on stderr)
            emit({"event": backlog.state, "scheduling_delay_ms": backlog.scheduling_delay_ms,
                  "backlog": backlog.backlog, "batch_ms": backlog.batch_time_ms}, True, "")

    def onBatchCommitted(self, committed):
        if self.json_events:  # for tools only: the progress line shows completed batches
            emit({"event": "batch_committed", "batch_id": committed.batchId(),
                  "batch_ms": committed.batchTime()}, True, "")

    def onBatchCompleted(self, batchCompleted):
        info = batchCompleted.batchInfo()
        files = sum(len(i.metadata.get("files", [])) for i in info.stream_id_to_input_info.values())
        records = info.num_records
        self.batches, self.records, self.files = self.batches + 1, self.records + records, self.files + files
        self.processing_ms.append(info.processing_delay_ms or 0)
        emit({"event": "batch_completed", "batch_ms": info.batch_time_ms, "files": files,
              "records": records, "scheduling_ms": info.scheduling_delay_ms,
              "processing_ms": info.processing_delay_ms},
             self.json_events,
             f"batch {clock(info.batch_time_ms)}: "
             + (f"{files} files, " if self.show_files else "")
             + f"{records} records "
             f"({records / self.batch_s:.0f}/s) | scheduling {info.scheduling_delay_ms} ms, "
             f"processing {info.processing_delay_ms} ms")


def say_context(ssc, json_events: bool) -> None:
    """Which context the started job runs: new, recovered with its program, or upgraded."""
    described = {"new": "a new context (no checkpoint)",
                 "checkpoint": "recovered from the checkpoint (program and state)",
                 "upgrade": "this program's graph with the checkpoint's data (upgrade)"}
    emit({"event": "context", "recovery": ssc.recovery}, json_events, f"context: {described[ssc.recovery]}")


def clock(ms: int) -> str:
    """A batch time as the wall-clock time Spark's UI shows."""
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def times(times_ms: list[int]) -> dict:
    """A list of batch times as a JSON event gives it: a count and a range (a restart after
    hours down re-runs thousands)."""
    return {"count": len(times_ms), "first_ms": min(times_ms, default=None),
            "last_ms": max(times_ms, default=None)}


def recovered(ssc, json_events: bool, batch_s: float) -> None:
    """What a restart recovered, in a user's terms: the batch times it catches up on (missed while
    it was down, or not done before it stopped), committed batches skipped, logged offsets and WAL
    blocks replayed (nothing for a new context with nothing logged). The engine's "catching up" line
    then says when it is back on time."""
    from sparkwal.engine.dstream import describe_times

    blog, tracker = ssc.batchLog, ssc.receivedBlockTracker
    reran, skipped = ssc.rerun_batch_times, ssc.skipped_batch_times
    event = {"event": "recovered", "rerun_batches": len(reran), "rerun": times(reran),
             "committed_batches_skipped": len(skipped),
             "logged_batches_replayed": len(blog.rerun_times) if blog is not None else 0,
             "blocks_replayed": tracker.recovered_block_additions if tracker is not None else 0}
    if not any(event[k] for k in ("rerun_batches", "committed_batches_skipped", "blocks_replayed")):
        return
    span_s = (max(reran) - min(reran)) / 1000 + batch_s if reran else 0.0
    text = ((f"recovered: catching up {describe_times(reran).replace('batches', 'batch times', 1)} missed while "
             f"stopped ({span_s:.0f} s of input)" if reran else "recovered: no batch to catch up")
            + (f", {event['logged_batches_replayed']} of them with their logged offsets"
               if event["logged_batches_replayed"] else "")
            + (f"; {len(skipped)} batch(es) done before the stop not output again" if skipped else "")
            + (f"; {event['blocks_replayed']} received blocks replayed from the WAL"
               if event["blocks_replayed"] else ""))
    emit(event, json_events, text)


def summary(ssc, p, json_events: bool, outputs: int, out_dir: str, signal_name: str | None) -> None:
    from sparkwal.engine.dstream import describe_times

    reran, left = ssc.rerun_batch_times, ssc.batches_left_for_restart
    p50 = sorted(p.processing_ms)[len(p.processing_ms) // 2] if p.processing_ms else 0
    emit({"event": "stopped", "outputs": outputs, "batches": p.batches, "records": p.records,
          "files": p.files, "rerun_batches": len(reran), "rerun": times(reran),
          "left_for_restart": times(left), "signal": signal_name, "processing_p50_ms": p50},
         json_events,
         (f"stopped on {signal_name}" if signal_name else "stopped")
         + f" after {p.batches} batches: {p.files} files, {p.records} records, processing "
         f"p50 {p50} ms" + (f"; the restart re-ran {describe_times(reran)}" if reran else "")
         + (f"; {describe_times(left)} left for the next restart (graceful stop timeout)" if left else "")
         + f"; {outputs} batch outputs in {out_dir}")
