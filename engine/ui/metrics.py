"""The driver's metrics in Prometheus' text format, with prometheus_client.

One registry per driver (never the process-wide default: two contexts in one process, one after
the other, must not share counters). Names follow Prometheus' rules: base units (seconds,
bytes), ``_total`` on counters (prometheus_client appends it to a Counter's name).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import SummaryMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # no "_created" series beside every counter: noise for a dashboard

#: batch timings from 5 ms to 5 min
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _WalSyncs:
    """``sparkwal_wal_sync_seconds{log}``: a summary (count, sum) of each log's durability
    barriers, read from the newest statistics sample."""

    def __init__(self):
        self.logs: dict[str, dict] = {}

    def collect(self):
        family = SummaryMetricFamily("sparkwal_wal_sync_seconds", "Time in WAL durability barriers "
                                     "(fsyncs, object PUTs)", labels=["log"])
        for name, stats in sorted(self.logs.items()):
            family.add_metric([name], count_value=stats.get("syncs", 0), sum_value=stats.get("syncSeconds", 0.0))
        yield family


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.batches_completed = Counter("sparkwal_batches_completed", "Batches completed", registry=r)
        self.batch_processing = Histogram("sparkwal_batch_processing_seconds", "Batch processing time",
                                          buckets=_SECONDS, registry=r)
        self.batch_scheduling_delay = Histogram("sparkwal_batch_scheduling_delay_seconds",
                                                "Batch scheduling delay", buckets=_SECONDS, registry=r)
        self.records_received = Counter("sparkwal_records_received", "Records received, per input stream",
                                        ["stream"], registry=r)
        self.unprocessed_batches = Gauge("sparkwal_unprocessed_batches", "Batches queued or running", registry=r)
        self.output_operations_failed = Counter("sparkwal_output_operations_failed",
                                                "Output operations that raised", registry=r)
        self.checkpoint_write = Histogram("sparkwal_checkpoint_write_seconds", "DStream checkpoint writes",
                                          buckets=_SECONDS, registry=r)
        self.wal_syncs = _WalSyncs()
        r.register(self.wal_syncs)
        self.state_keys = Gauge("sparkwal_state_keys", "Keys in a stateful stream's state", ["stream"], registry=r)
        self.state_snapshot_bytes = Gauge("sparkwal_state_snapshot_bytes", "Bytes of a stream's newest "
                                          "state snapshot", ["stream", "kind"], registry=r)
        self.driver_epoch = Gauge("sparkwal_driver_epoch", "This driver's leadership epoch", registry=r)
        self.driver_restarts = Counter("sparkwal_driver_restarts", "Driver runs on this checkpoint that "
                                       "restarted from it", registry=r)
        self.driver_takeovers = Counter("sparkwal_driver_takeovers", "Driver runs on this checkpoint that "
                                        "took it over as a standby", registry=r)
        self.receiver_up = Gauge("sparkwal_receiver_up", "1 while a stream's receiver runs", ["stream"], registry=r)
        self.event_log_dropped = Gauge("sparkwal_event_log_dropped_events", "Events the event log could not "
                                       "keep up with", registry=r)

    def on_run(self, run: dict, prior_runs: list[dict]) -> None:
        kinds = [r.get("kind") for r in (*prior_runs, run)]
        self.driver_restarts.inc(kinds.count("restart"))
        self.driver_takeovers.inc(kinds.count("takeover"))
        if run.get("epoch") is not None:
            self.driver_epoch.set(run["epoch"])

    def on_submitted(self, record: dict, stream_names: dict) -> None:
        for sid, n in (record.get("inputs") or {}).items():
            self.records_received.labels(stream_names.get(str(sid), str(sid))).inc(int(n))

    def on_batch(self, record: dict, unprocessed: int) -> None:
        self.batches_completed.inc()
        sub, start, end = (record.get(k) for k in ("submissionTime", "processingStartTime", "processingEndTime"))
        if start is not None and end is not None:
            self.batch_processing.observe((end - start) / 1000)
        if start is not None and sub is not None:
            self.batch_scheduling_delay.observe((start - sub) / 1000)
        failed = sum(1 for op in record.get("ops", ()) if op.get("failureReason"))
        if failed:
            self.output_operations_failed.inc(failed)
        self.unprocessed_batches.set(unprocessed)

    def on_sample(self, record: dict) -> None:
        self.wal_syncs.logs = dict(record.get("wal") or {})
        for stream, state in (record.get("state") or {}).items():
            self.state_keys.labels(stream).set(state.get("keys", 0))
            self.state_snapshot_bytes.labels(stream, "full").set(state.get("fullBytes", 0))
            self.state_snapshot_bytes.labels(stream, "delta").set(state.get("deltaBytes", 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
