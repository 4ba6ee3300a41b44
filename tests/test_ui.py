"""The streaming UI of a live driver: Spark's REST API, the pages, /metrics, the event log.

The shared SparkContext runs with spark.ui.enabled=false (Spark's own UI off in tests); these
tests are about the UI, so they turn the key on for their contexts (conftest's ``ui_enabled``).
Batches run on a manual clock: each advance makes one batch, which the test waits for.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from browser import browser_dom
from sparkwal.checkpoint.event_log import EventLogWriter, read_events, read_runs
from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.ui import Catalog
from sparkwal.wal import ManualClock

BATCH_MS = 500
ROOT = Path(__file__).resolve().parents[1]


class Batches(StreamingListener):
    def __init__(self):
        self.infos = []
        self._cond = threading.Condition()

    def onBatchCompleted(self, batchCompleted):
        with self._cond:
            self.infos.append(batchCompleted.batchInfo())
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float = 60) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.infos) >= n, timeout), f"{len(self.infos)} of {n} batches"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get_json(url: str):
    status, body = get(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


class App:
    """A queue stream of 10-record RDDs with two outputs; the second raises on the batches given."""

    def __init__(self, sc, checkpoint=None, failing=()):
        self.clock, self.done = ManualClock(0), Batches()
        self.ssc = StreamingContext(sc, BATCH_MS / 1000, clock=self.clock)
        if checkpoint:
            self.ssc.checkpoint(str(checkpoint))
        self.counted = counted = []  # the closures hold no App (they are pickled into the checkpoint)
        stream = self.ssc.queueStream([sc.parallelize(range(10)) for _ in range(50)])
        stream.foreachRDD(lambda t, rdd: counted.append(rdd.count()))

        def maybe_fail(t, rdd):
            if int(t.timestamp() * 1000) in failing:
                raise ValueError("<script>alert(1)</script> in batch")
        stream.foreachRDD(maybe_fail)
        self.ssc.addStreamingListener(self.done)
        self.ssc.start()

    def run_batches(self, n: int) -> None:
        for i in range(n):
            self.clock.advance(BATCH_MS)
            self.done.wait_for(len(self.done.infos) + 1)

    def api(self, path: str):
        app_id = self.ssc.sparkContext.applicationId
        return get_json(f"{self.ssc.uiWebUrl}/api/v1/applications/{app_id}/streaming/{path}")


def test_ui_web_url_is_none_when_the_ui_is_disabled(spark_context):
    ssc = StreamingContext(spark_context, 0.5, clock=ManualClock(0))
    ssc.queueStream([spark_context.parallelize([1])]).foreachRDD(lambda rdd: None)
    ssc.start()
    try:
        assert ssc.uiWebUrl is None
    finally:
        ssc.stop(stopSparkContext=False)


@pytest.mark.compat
def test_rest_api_pages_and_metrics_agree_with_the_listener(ui_enabled, tmp_path):
    app = App(ui_enabled, tmp_path / "cp", failing={1500})
    try:
        app.run_batches(4)
        url, app_id = app.ssc.uiWebUrl, ui_enabled.applicationId
        apps = get_json(f"{url}/api/v1/applications")
        assert [a["id"] for a in apps] == [app_id] and apps[0]["attempts"][0]["completed"] is False

        stats = app.api("statistics")
        assert stats["batchDuration"] == BATCH_MS and stats["numTotalCompletedBatches"] == 4
        assert stats["numRetainedCompletedBatches"] == 4 and stats["numActiveBatches"] == 0
        assert stats["startTime"].endswith("GMT")

        batches = app.api("batches")
        assert [b["batchId"] for b in batches] == [2000, 1500, 1000, 500]  # newest first, as Spark
        assert {b["status"] for b in batches} == {"COMPLETED"}
        failed = app.api("batches/1500")
        assert failed["numFailedOutputOps"] == 1 and failed["numTotalOutputOps"] == 2
        assert failed["firstFailureReason"] == "ValueError: <script>alert(1)</script> in batch"
        ops = app.api("batches/1500/operations")
        assert [op["outputOpId"] for op in ops] == [0, 1]
        assert ops[0]["jobIds"] and "failureReason" not in ops[0]
        assert app.api("batches/1500/operations/1")["failureReason"].startswith("ValueError")
        assert app.api("batches?status=COMPLETED") == batches and app.api("batches?status=QUEUED") == []
        listener = {i.batch_time_ms: i for i in app.done.infos}
        for b in batches:  # the REST API's delays are the listener's
            assert b["processingTime"] == listener[b["batchId"]].processing_delay_ms
            assert b["schedulingDelay"] == listener[b["batchId"]].scheduling_delay_ms
        for b in batches:  # where each batch's time went: the listener's phases, as the API shows them
            phases = listener[b["batchId"]].breakdown
            assert b["breakdown"] == phases, b
            assert {"generation", "blockAllocation", "graph", "commit"} <= set(phases)
            assert min(phases.values()) >= 0 and phases["generation"] >= phases["graph"]
        spark_op = listener[1500].output_operation_infos[0]  # its Spark job: submit, tasks, collect
        assert set(spark_op.breakdown) == {"submit", "tasks", "collect"}
        assert min(spark_op.breakdown.values()) >= 0 and ops[0]["breakdown"] == spark_op.breakdown
        assert app.api("receivers") == []
        runs = app.api("recoveries")
        assert [(r["kind"], r["epoch"]) for r in runs] == [("new", 1)]
        assert runs[0]["firstNewBatch"] == 500

        status, page = get(f"{url}/streaming/")
        assert status == 200
        for title in ("Input Rate", "Scheduling Delay", "Processing Time", "Total Delay", "Active Batches",
                      "Completed Batches", "Recoveries", "Checkpoints"):
            assert title in page
        assert page.count("<svg") == 8 and "<script>" not in page
        assert "Leadership" in page and "<td>the leader</td>" in page
        status, batch_page = get(f"{url}/streaming/batch/?id=1500")
        assert status == 200 and "&lt;script&gt;alert(1)&lt;/script&gt;" in batch_page and "<script>" not in batch_page
        assert "Where the time went" in batch_page and "blockAllocation" in batch_page
        dom = browser_dom(f"{url}/streaming/batch/?id=1500", tmp_path)  # as a browser shows it: text, not a script
        assert "ValueError: &lt;script&gt;alert(1)&lt;/script&gt; in batch" in dom and "<script" not in dom
        assert "Failed" in dom and "Output Operations" in dom

        status, text = get(f"{url}/metrics")
        assert status == 200
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("sparkwal_batches_completed_total", ())] == len(app.done.infos) == 4
        assert samples[("sparkwal_output_operations_failed_total", ())] == 1
        assert samples[("sparkwal_batch_processing_seconds_count", ())] == 4
        assert samples[("sparkwal_batch_processing_seconds_sum", ())] == pytest.approx(
            sum(i.processing_delay_ms for i in app.done.infos) / 1000)
        assert samples[("sparkwal_driver_epoch", ())] == 1
        assert samples[("sparkwal_driver_restarts_total", ())] == 0
        assert samples[("sparkwal_unprocessed_batches", ())] == 0
        served = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        queried = set(re.findall(r"sparkwal_[a-z_]+", (ROOT / "docs" / "grafana-dashboard.json").read_text()))
        suffixes = ("_bucket", "_sum", "_count")
        assert {q for q in queried if q not in served and not (q.endswith(suffixes) and q.rsplit("_", 1)[0] in served)
                and q.removesuffix("_total") not in served} == set()  # the docs' dashboard asks for what is served

        storage = app.ssc.driver.leadership.storage  # a failing store: the page says so, not "no leader"
        real_leader = storage.leader
        storage.leader = lambda path: (_ for _ in ()).throw(OSError(5, "Input/output error <b>"))
        try:
            app.run_batches(1)  # (a page is rendered again on a new batch)
            status, page = get(f"{url}/streaming/")
        finally:
            storage.leader = real_leader
        assert status == 200
        assert "the leadership could not be read (OSError: [Errno 5] Input/output error &lt;b&gt;)" in page
        app.run_batches(1)
        assert "<td>the leader</td>" in get(f"{url}/streaming/")[1]
        assert app.counted == [10] * 6  # the failing output did not stop the app
    finally:
        app.ssc.stop(stopSparkContext=False)
    events = list(read_events(read_runs(str(tmp_path / "cp" / "events"))[0]["path"]))
    assert [e["batchTime"] for e in events if e["event"] == "batch"] == [500, 1000, 1500, 2000, 2500, 3000]
    assert events[-1]["event"] == "stopped"


GARBAGE = [b"\x00\xff" * 50 + b"\r\n\r\n", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
           b"POST /api/v1/applications HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
           b"GET /api/v1/applications/../../etc/passwd HTTP/1.1\r\n\r\n",
           b"GET /streaming/batch/?id=99999999999999999999999 HTTP/1.1\r\n\r\n",
           b"GET /streaming/batch/?id=%3Cscript%3E HTTP/1.1\r\n\r\n",
           b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",
           b"BREW /pot HTTP/1.1\r\n\r\n",
           b"GET /api/v1/applications/x/streaming/batches/1/operations/a/b HTTP/1.1\r\n\r\n",
           b"GET /streaming/?" + b"&a=1" * 500 + b" HTTP/1.1\r\n\r\n", b"GET http://evil/ HTTP/1.1\r\n\r\n", b""]


def _send(host: str, port: int, data: bytes) -> int | None:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    if not reply:
        return None
    return int(reply.split(b" ", 2)[1])


def test_garbage_at_the_port_gets_4xx_and_the_counts_stay_exact(ui_enabled):
    app = App(ui_enabled)
    try:
        host, port = app.ssc.uiWebUrl.removeprefix("http://").rsplit(":", 1)
        statuses = []
        for i, data in enumerate(GARBAGE * 2):
            statuses.append(_send(host, int(port), data))
            if i % 4 == 0:
                app.run_batches(1)
        assert all(s is None or 300 <= s < 500 for s in statuses), statuses
        for path in ("/api/v1/applications/nope/streaming/statistics", "/streaming/batch/?id=1",
                     "/streaming/batch/", "/api/v1/applications/x/streaming/batches/abc", "/nothing"):
            assert 400 <= get(app.ssc.uiWebUrl + path)[0] < 500, path
        n = len(app.done.infos)
        assert app.counted == [10] * n and app.api("statistics")["numTotalCompletedBatches"] == n
    finally:
        app.ssc.stop(stopSparkContext=False)


@pytest.mark.slow
def test_the_event_log_keeps_the_newest_batches_and_every_run_on_any_store(storage_url):
    """Three runs of 100 batches each, retention 20: every run stays, the newest 20 batches stay,
    older segments go; a history catalog (what ``sparkwal ui`` serves) reads it back."""
    root, options = storage_url
    events = f"{root}/cp/events"
    for run in range(3):
        prior = read_runs(events, options)

        def prior_times(prior=prior):
            return [e["batchTime"] for r in prior for e in read_events(r["path"], options) if e["event"] == "batch"]

        writer = EventLogWriter(events, {"kind": "restart" if run else "new", "appId": f"app-{run}",
                                         "startTime": 1_000_000 + run * 100_000, "epoch": run + 1,
                                         "batchDuration": 100},
                                storage_options=options, retained_batches=20, prior_runs=[r["path"] for r in prior],
                                # read on the writer's thread (a takeover's) or by the caller
                                prior_batch_times=prior_times if run == 2 else prior_times())
        for i in range(100):
            t = 1_000_000 + run * 100_000 + i * 100
            writer.append({"event": "batch", "time": t, "batchTime": t, "inputs": {"0": 1}, "ops": []})
            assert writer.flush()  # one write per batch, as a running driver's
        writer.update_run(endTime=t + 50)
        writer.close()
    runs = read_runs(events, options)
    assert [r["kind"] for r in runs] == ["new", "restart", "restart"]  # every run kept
    kept = [e["batchTime"] for r in runs for e in read_events(r["path"], options) if e["event"] == "batch"]
    assert kept[-20:] == [1_200_000 + i * 100 for i in range(80, 100)]  # the newest 20
    assert 20 <= len(kept) <= 40, len(kept)  # older segments deleted (at most ~10% + a segment more)

    catalog = Catalog(events, storage_options=options)
    assert [a["id"] for a in catalog.applications()] == ["app-2", "app-1", "app-0"]
    assert all(a["attempts"][0]["completed"] for a in catalog.applications())
    _, newest = catalog.find("app-2")
    assert newest.statistics()["numRetainedCompletedBatches"] == len([t for t in kept if t >= 1_200_000])
    assert [r.get("downtimeMs") for r in catalog.recoveries()] == [None, 100_000 - 9_900 - 50, 100_000 - 9_900 - 50]


def test_where_each_stream_ran_reaches_the_rest_api_and_the_batch_page_escaped():
    """BatchInfo.paths (where each receiver stream's and state's work ran) as the recorder keeps it,
    the REST API's batch shows it and the batch page lists it, as text."""
    from sparkwal.engine.ui.pages import batch_page
    from sparkwal.engine.ui.recorder import batch_record
    from sparkwal.engine.ui.status import RunStatus
    from sparkwal.tracker import BatchInfo

    paths = {"receiverStream at app.py:3": "precomputed", "mapWithState at <b>app.py</b>:5": "driver"}
    info = BatchInfo(1500, {}, 1500, 1510, 1520, {}, {"generation": 1.0}, paths)
    status = RunStatus({"batchDuration": 500, "streams": []})
    status.apply(batch_record(info, 1530))
    [view] = status.batches_view()
    assert view["paths"] == paths
    page = batch_page({"status": status}, 1500)
    assert page is not None and "Where each stream ran" in page and "<b>" not in page
    assert "mapWithState at &lt;b&gt;app.py&lt;/b&gt;:5" in page and "precomputed" in page
