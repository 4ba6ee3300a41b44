"""What one driver run did, kept in memory and shown as Spark's streaming REST API shows it.

A :class:`RunStatus` is fed the event records of :mod:`sparkwal.checkpoint.event_log` (the live driver's
recorder hands it the same records it writes; ``sparkwal ui`` replays a run's log into one), so
the live page and a dead app's history are built by the same code. It holds at most
``retained_batches`` completed batches (Spark's ``spark.streaming.ui.retainedBatches``) and as
many checkpoint writes and statistics samples: memory stays bounded however long the app runs.

The views return what Spark's ``org.apache.spark.status.api.v1.streaming`` resources return
(``api.scala``: ``StreamingStatistics``, ``ReceiverInfo``, ``BatchInfo``, ``OutputOperationInfo``,
with Spark's field names, dates in its ``yyyy-MM-dd'T'HH:mm:ss.SSS'GMT'`` format and absent
options left out), so a tool written against a pyspark.streaming app's UI reads them unchanged.
"""

from __future__ import annotations

import collections
import threading
import time

QUEUED, PROCESSING, COMPLETED = "QUEUED", "PROCESSING", "COMPLETED"
STATUSES = (QUEUED, PROCESSING, COMPLETED)


def spark_date(ms: int | None) -> str | None:
    """Spark's REST date format (its JacksonMessageWriter): GMT, milliseconds."""
    if ms is None or ms < 0:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}GMT"


def _present(d: dict) -> dict:
    """Spark leaves absent options out of its JSON."""
    return {k: v for k, v in d.items() if v is not None}


def _avg(values: list) -> float | None:
    return sum(values) / len(values) if values else None


def delays(batch: dict) -> tuple[int | None, int | None, int | None]:
    sub, start, end = batch.get("submissionTime"), batch.get("processingStartTime"), batch.get("processingEndTime")
    scheduling = start - sub if start is not None and sub is not None else None
    processing = end - start if end is not None and start is not None else None
    total = scheduling + processing if scheduling is not None and processing is not None else None
    return scheduling, processing, total


def batch_records(batch: dict) -> int:
    return sum(int(n) for n in (batch.get("inputs") or {}).values())


class RunStatus:
    """One driver run: its ``run.json`` fields, its batches, receivers and storage samples."""

    def __init__(self, run: dict, retained_batches: int = 1000):
        self.run = dict(run)
        self.retained_batches = retained_batches
        self.lock = threading.Lock()
        self.completed: collections.deque = collections.deque(maxlen=retained_batches)
        #: per completed batch, worked out once (a completed batch never changes): its REST view,
        #: and (batch time, records, scheduling delay, processing time, total delay)
        self.completed_views: collections.deque = collections.deque(maxlen=retained_batches)
        self.timings: collections.deque = collections.deque(maxlen=retained_batches)
        self.active: dict[int, dict] = {}  # batch time -> the batch, submitted or running
        self.checkpoints: collections.deque = collections.deque(maxlen=retained_batches)
        self.samples: collections.deque = collections.deque(maxlen=retained_batches)
        self.receivers: dict[int, dict] = {}
        self.backlog: dict | None = None
        self.total_completed = self.total_received = self.total_processed = 0
        self.failed_output_ops = 0
        self.last_event_ms: int | None = None
        self.version = 0  #: counts the records applied: a view rendered at one version stays right until the next

    # ------------------------------------------------------------------ feeding

    def apply(self, record: dict) -> None:
        kind = record.get("event")
        with self.lock:
            self.version += 1
            t = record.get("time")
            if isinstance(t, int):
                self.last_event_ms = t if self.last_event_ms is None else max(self.last_event_ms, t)
            if kind == "batch":
                self.active.pop(record["batchTime"], None)
                self.completed.append(record)
                self.completed_views.append(self._batch_view(COMPLETED, record))
                self.timings.append((record["batchTime"], batch_records(record), *delays(record)))
                self.total_completed += 1
                self.total_processed += batch_records(record)
                self.failed_output_ops += sum(1 for op in record.get("ops", ()) if op.get("failureReason"))
                if record.get("replayed"):  # a history's batches were never seen submitted
                    self.total_received += batch_records(record)
            elif kind == "submitted":  # live only: not in the log
                self.active[record["batchTime"]] = record
                self.total_received += batch_records(record)
            elif kind == "started":
                batch = self.active.get(record["batchTime"])
                if batch is not None:
                    batch["processingStartTime"] = record["processingStartTime"]
            elif kind == "op":
                batch = self.active.get(record["batchTime"])
                if batch is not None:
                    ops = {op["id"]: op for op in batch.get("ops", ())}
                    ops[record["op"]["id"]] = record["op"]
                    batch["ops"] = [ops[k] for k in sorted(ops)]
            elif kind == "checkpoint":
                self.checkpoints.append(record)
            elif kind == "statistics":
                self.samples.append(record)
            elif kind == "receiver":
                self.receivers[record["streamId"]] = record
            elif kind == "backlog":
                self.backlog = record
            elif kind == "takeover":
                self.run["takeoverMs"] = record.get("tookMs")
            elif kind == "fenced":
                self.run["fenced"] = record.get("reason")
            elif kind == "stopped":
                self.run["endTime"] = record.get("time")

    # ------------------------------------------------------------------ Spark's views

    @property
    def batch_ms(self) -> int:
        return int(self.run.get("batchDuration") or 0)

    def _all_batches(self) -> list[tuple[str, dict]]:
        running = [(PROCESSING if b.get("processingStartTime") is not None else QUEUED, b)
                   for b in self.active.values()]
        return [(COMPLETED, b) for b in self.completed] + running

    def receiver_streams(self) -> list[dict]:
        return [s for s in self.run.get("streams", ()) if s.get("receiver")]

    def statistics(self) -> dict:
        with self.lock:
            timings = [t[2:] for t in self.timings] + [delays(b) for b in self.active.values()]
            records = [t[1] for t in self.timings] + [batch_records(b) for b in self.active.values()]
            rate = [n * 1000.0 / self.batch_ms for n in records] if self.batch_ms else []
            active = sum(1 for r in self.receivers.values() if r.get("active"))
            n_receivers = len(self.receiver_streams())

            def avg_ms(i):
                values = [d[i] for d in timings if d[i] is not None]
                return int(sum(values) // len(values)) if values else None

            return _present({
                "startTime": spark_date(self.run.get("startTime")),
                "batchDuration": self.batch_ms,
                "numReceivers": n_receivers,
                "numActiveReceivers": active,
                "numInactiveReceivers": n_receivers - active,
                "numTotalCompletedBatches": self.total_completed,
                "numRetainedCompletedBatches": len(self.completed),
                "numActiveBatches": len(self.active),
                "numProcessedRecords": self.total_processed,
                "numReceivedRecords": self.total_received,
                "avgInputRate": _avg(rate),
                "avgSchedulingDelay": avg_ms(0),
                "avgProcessingTime": avg_ms(1),
                "avgTotalDelay": avg_ms(2),
            })

    def receivers_view(self) -> list[dict]:
        with self.lock:
            batches = sorted((b for _, b in self._all_batches()), key=lambda b: b["batchTime"])
            out = []
            for stream in sorted(self.receiver_streams(), key=lambda s: s["id"]):
                sid = stream["id"]
                rates = [[b["batchTime"], int((b.get("inputs") or {}).get(str(sid), 0)) * 1000.0 / self.batch_ms]
                         for b in batches] if self.batch_ms else []
                info = self.receivers.get(sid)
                error_time = info.get("lastErrorTime", -1) if info else -1
                out.append(_present({
                    "streamId": sid,
                    "streamName": (info or {}).get("name") or stream.get("name") or f"Stream-{sid}",
                    "isActive": info.get("active") if info else None,
                    "executorId": info.get("executorId") if info else None,
                    "executorHost": info.get("host") if info else None,
                    "lastErrorTime": spark_date(error_time) if error_time is not None and error_time >= 0 else None,
                    "lastErrorMessage": (info or {}).get("lastErrorMessage") or None,
                    "lastError": (info or {}).get("lastError") or None,
                    "avgEventRate": _avg([r for _, r in rates]),
                    "eventRates": rates,
                }))
            return out

    def _batch_view(self, status: str, b: dict) -> dict:
        ops = b.get("ops") or []
        failures = [op["failureReason"] for op in ops if op.get("failureReason")]
        scheduling, processing, total = delays(b)
        done = [op for op in ops if op.get("endTime") is not None and op["endTime"] >= 0]
        return _present({
            "batchId": b["batchTime"],
            "batchTime": spark_date(b["batchTime"]),
            "status": status,
            "batchDuration": self.batch_ms,
            "inputSize": batch_records(b),
            "schedulingDelay": scheduling,
            "processingTime": processing,
            "totalDelay": total,
            "numActiveOutputOps": sum(1 for op in ops if op.get("startTime") is not None and op not in done),
            "numCompletedOutputOps": sum(1 for op in done if not op.get("failureReason")),
            "numFailedOutputOps": len(failures),
            "numTotalOutputOps": b.get("numOutputOps", len(ops)),
            "firstFailureReason": failures[0] if failures else None,
            "breakdown": b.get("breakdown") or None,
            "paths": b.get("paths") or None,
        })

    def batches_view(self, statuses=STATUSES) -> list[dict]:
        with self.lock:
            views = list(self.completed_views) if COMPLETED in statuses else []
            views += [self._batch_view(s, b) for s, b in self._all_batches()[len(self.completed):] if s in statuses]
        return sorted(views, key=lambda v: -v["batchId"])

    def find_batch(self, batch_id: int) -> tuple[str, dict] | None:
        with self.lock:
            for status, b in self._all_batches():
                if b["batchTime"] == batch_id:
                    return status, b
        return None

    def batch_view(self, batch_id: int) -> dict | None:
        found = self.find_batch(batch_id)
        return None if found is None else self._batch_view(*found)

    def operations_view(self, batch_id: int) -> list[dict] | None:
        found = self.find_batch(batch_id)
        if found is None:
            return None
        return [operation_view(op) for op in sorted(found[1].get("ops") or [], key=lambda o: o["id"])]

    def totals(self) -> dict:
        """Plain counters for the metrics and the terminal summary."""
        with self.lock:
            return {"completed": self.total_completed, "received": self.total_received,
                    "processed": self.total_processed, "active": len(self.active),
                    "failedOutputOps": self.failed_output_ops}


def operation_view(op: dict) -> dict:
    start, end = op.get("startTime"), op.get("endTime")
    end = end if end is not None and end >= 0 else None
    start = start if start is not None and start >= 0 else None
    return _present({
        "outputOpId": op["id"],
        "name": op.get("name", ""),
        "description": op.get("description") or op.get("name", ""),
        "startTime": spark_date(start),
        "endTime": spark_date(end),
        "duration": end - start if start is not None and end is not None else None,
        "failureReason": op.get("failureReason") or None,
        "jobIds": list(op.get("jobIds") or []),
        "breakdown": op.get("breakdown") or None,
    })


def recoveries(runs: list[dict], last_event_ms: dict, endings: list[str] | None = None,
               ids: list[str] | None = None) -> list[dict]:
    """sparkwal's ``.../streaming/recoveries``: every run of a driver on this checkpoint, oldest
    first. ``downtimeMs``: from the previous run's last recorded event (or its recorded end) to this
    run's start (None for the first run); ``ended``: running, stopped, fenced or killed (no end
    recorded: ``lastEventTime`` is when it was last heard of); ``id``: its application id, whose
    page is ``/history/<id>/streaming/``."""
    out, previous = [], None
    for i, run in enumerate(runs):
        prev_last = None
        if previous is not None:  # its last event, its recorded end, or at least its start
            seen = [t for t in (last_event_ms.get(previous.get("path")), previous.get("endTime")) if t is not None]
            prev_last = max(seen) if seen else previous.get("startTime")
        out.append(_present({
            "appId": run.get("appId"),
            "kind": run.get("kind", "new"),
            "epoch": run.get("epoch"),
            "startTime": spark_date(run.get("startTime")),
            "startTimeEpoch": run.get("startTime"),
            "checkpointTime": run.get("checkpointTime"),
            "firstNewBatch": run.get("firstNewBatch"),
            "rerunBatches": list(run.get("rerunBatches") or []),
            "skippedBatches": list(run.get("skippedBatches") or []),
            "upgradePlan": [str(line) for line in run.get("upgradePlan") or []][:100] or None,
            "takeoverMs": run.get("takeoverMs"),
            "downtimeMs": (run["startTime"] - prev_last) if prev_last is not None and run.get("startTime") else None,
            "endTime": spark_date(run.get("endTime")),
            "endTimeEpoch": run.get("endTime"),
            "fenced": run.get("fenced"),
            "error": run.get("error"),
            "ended": endings[i] if endings else None,
            "lastEventTime": last_event_ms.get(run.get("path")),
            "id": ids[i] if ids else None,
        }))
        previous = run
    return out
