"""The Streaming page and the batch page, as HTML, titled as Spark's Streaming tab.

Everything that came from user code or data (names, error messages) goes through ``escape``:
an error message ``<script>...`` shows as text. The pages are read-only: no forms, no scripts.
"""

from __future__ import annotations

import time
from html import escape
from urllib.parse import quote

from . import charts
from .status import COMPLETED, PROCESSING, QUEUED, batch_records, delays

STYLE = """body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.4em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.4em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.failed{color:#b00}.note{color:#555}
.banner{background:#fff3cd;padding:.6em;border:1px solid #e0c060}
svg .axis{stroke:#888}svg .series{fill:none;stroke:#2a6fb0;stroke-width:1.5}svg circle{fill:#2a6fb0}
svg .limit{stroke:#c33;stroke-dasharray:4 3}svg .bar{fill:#6a9fd0}svg .tick{font-size:10px;fill:#555}"""


def _ms(value) -> str:
    if value is None:
        return "-"
    return f"{value} ms" if value < 1000 else f"{value / 1000:.1f} s"


def _when(ms) -> str:
    """A batch time as Spark's pages show it (UTC here, said so)."""
    if ms is None:
        return "-"
    return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(ms / 1000)) + (f".{ms % 1000:03d}" if ms % 1000 else "")


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _batch_rows(status, batches: list[tuple[str, dict]], prefix: str) -> list[list[str]]:
    rows = []
    for state, b in sorted(batches, key=lambda sb: -sb[1]["batchTime"]):
        scheduling, processing, total = delays(b)
        ops = b.get("ops") or []
        failures = [op for op in ops if op.get("failureReason")]
        done = sum(1 for op in ops if op.get("endTime") is not None)
        link = f"<a href='{prefix}/streaming/batch/?id={b['batchTime']}'>{escape(_when(b['batchTime']))}</a>"
        outcome = f"{done - len(failures)}/{b.get('numOutputOps', len(ops))}"
        if failures:
            outcome += (f" <span class='failed'>({len(failures)} failed: "
                        f"{escape(failures[0]['failureReason'].splitlines()[0][:200])})</span>")
        rows.append([link, str(batch_records(b)), _ms(scheduling), _ms(processing),
                     _ms(total) if state == COMPLETED else escape(state.lower()), outcome])
    return rows


def streaming_page(view: dict) -> str:
    """``view``: {"status": RunStatus, "recoveries": [...], "prefix": url prefix, "live": bool,
    "standby": None or {...}, "leader": None or {...}, "checkpoint": str or None}."""
    status, prefix = view["status"], view.get("prefix", "")
    run, batch_ms = status.run, status.batch_ms
    stats = status.statistics()
    with status.lock:
        completed = list(status.completed)
        active = [(PROCESSING if b.get("processingStartTime") is not None else QUEUED, b)
                  for b in status.active.values()]
        checkpoints = list(status.checkpoints)[-10:]
        sample = status.samples[-1] if status.samples else None
    name = run.get("appName") or run.get("appId") or "sparkwal"
    body = [f"<h1>Streaming Statistics: {escape(str(name))}</h1>"]
    if view.get("standby"):
        s = view["standby"]
        holder = escape(str(s.get("holder") or "another driver"))
        body.append(f"<p class='banner'>This driver is a <b>standby</b>: {holder} "
                    f"leads this checkpoint at epoch {escape(str(s.get('epoch')))}; its newest checkpoint read is "
                    f"{escape(str(s.get('behind') or '-'))} behind. It takes over if the leader's lease expires.</p>")
    state = "Running" if view.get("live") and not run.get("endTime") else "Ran"
    body.append(f"<p>{state} batches of {_ms(batch_ms)} since {escape(_when(run.get('startTime')))} UTC "
                f"({stats['numTotalCompletedBatches']} completed batches, {stats['numProcessedRecords']} records). "
                f"Driver run: <b>{escape(str(run.get('kind', 'new')))}</b>, epoch {escape(str(run.get('epoch')))}"
                + (f"; <span class='failed'>fenced: {escape(str(run['fenced']))}</span>" if run.get("fenced") else "")
                + "</p>")
    # after an incident, the first thing looked for: which runs there were, and how each ended
    body.append(_recovery_panel(view.get("recoveries") or [], run))
    with status.lock:
        timings = list(status.timings)  # (time, records, scheduling, processing, total), worked out once

    def measure(i):
        return [(t[0], t[i]) for t in timings if t[i] is not None]
    series = {
        "Input Rate": ([(t[0], t[1] * 1000.0 / batch_ms) for t in timings] if batch_ms else [], "records/s", 0),
        "Scheduling Delay": (measure(2), "ms", 0),
        "Processing Time": (measure(3), "ms", batch_ms),
        "Total Delay": (measure(4), "ms", 0),
    }
    rows = []
    for title, (points, unit, limit) in series.items():
        avg = sum(v for _, v in points) / len(points) if points else None
        avg_text = "-" if avg is None else (f"{avg:.2f} {unit}" if unit != "ms" else _ms(int(avg)))
        rows.append([f"<b>{escape(title)}</b><br>Avg: {escape(avg_text)}",
                     charts.timeline(title, points, unit, limit),
                     charts.histogram(title, [v for _, v in points], unit)])
    body.append(_table(["Measure", "Timelines (last batches)", "Histograms"], rows, "stats"))
    streams = status.receivers_view()
    if streams:
        body.append("<h2>Receivers</h2>")
        body.append(_table(["Input", "Status", "Executor", "Avg rate", "Last error"], [
            [escape(r["streamName"]), "ACTIVE" if r.get("isActive") else "INACTIVE",
             escape(str(r.get("executorHost", "-"))),
             "-" if r.get("avgEventRate") is None else f"{r['avgEventRate']:.1f} records/s",
             f"<span class='failed'>{escape(r.get('lastErrorMessage', ''))}</span>"] for r in streams]))
    body.append(f"<h2>Active Batches ({len(active)})</h2>")
    headers = ["Batch Time", "Records", "Scheduling Delay", "Processing Time", "Total Delay / Status",
               "Output Ops: Succeeded/Total"]
    body.append(_table(headers, _batch_rows(status, active, prefix), "active"))
    body.append(f"<h2>Completed Batches (last {len(completed)} out of {stats['numTotalCompletedBatches']})</h2>")
    body.append(_table(headers, _batch_rows(status, [(COMPLETED, b) for b in completed[-100:]], prefix),
                       "completed"))
    body.append(_storage_panel(checkpoints, sample, view))
    return _page(f"{name} - Streaming Statistics", "".join(body))


def _batches_text(times: list[int]) -> str:
    """A count and a range, never every batch time (a restart may re-run hundreds)."""
    if not times:
        return "-"
    if len(times) == 1:
        return _when(times[0])
    return f"{len(times)} ({_when(min(times))} .. {_when(max(times))})"


def _recovery_panel(recoveries: list[dict], shown: dict) -> str:
    """Every run, oldest first, each but the one shown linked to its own page."""
    def ended(r):
        if r.get("ended") == "fenced" or r.get("fenced"):
            return f"<span class='failed'>fenced: {escape(str(r.get('fenced')))}</span>"
        if r.get("endTimeEpoch"):
            return "stopped " + escape(_when(r["endTimeEpoch"]))
        if r.get("ended") == "running":
            return "running"
        return ("<span class='failed'>killed</span> (no end recorded; last heard of "
                + escape(_when(r.get("lastEventTime") or r.get("startTimeEpoch"))) + ")")

    def started(r):
        text = escape(_when(r.get("startTimeEpoch")))
        if r.get("id") is None or r.get("startTimeEpoch") == shown.get("startTime"):
            return text
        return f"<a href='/history/{quote(str(r['id']), safe='')}/streaming/'>{text}</a>"
    def kind(r):
        plan = r.get("upgradePlan")
        if not plan:
            return escape(str(r.get("kind")))
        return (f"{escape(str(r.get('kind')))} (upgrade)<ul class='plan'>"
                + "".join(f"<li>{escape(str(line))}</li>" for line in plan) + "</ul>")
    rows = [[kind(r), escape(str(r.get("epoch"))), started(r),
             _ms(r.get("downtimeMs")), escape(_batches_text(r.get("rerunBatches") or [])),
             escape(_when(r.get("firstNewBatch"))), ended(r)] for r in recoveries]
    return ("<h2>Recoveries</h2><p class='note'>Every run of a driver on this checkpoint, oldest first "
            "(times in UTC); each earlier run links to its own page.</p>"
            + _table(["Kind", "Epoch", "Started", "Downtime", "Re-ran batches", "First new batch", "Ended"],
                     rows, "recoveries"))


def _storage_panel(checkpoints: list[dict], sample: dict | None, view: dict) -> str:
    parts = ["<h2>Checkpoints</h2>"]
    if checkpoints:
        last = checkpoints[-1]
        parts.append(f"<p>Last good: batch {escape(_when(last.get('checkpointTime')))} "
                     f"(epoch {escape(str(last.get('epoch')))}), written in {_ms(last.get('tookMs'))}.</p>")
        parts.append(_table(["Checkpoint of", "Epoch", "Write took", "Bytes"], [
            [escape(_when(c.get("checkpointTime"))), escape(str(c.get("epoch"))), _ms(c.get("tookMs")),
             f"{c.get('bytes', 0):,}"]
            for c in reversed(checkpoints)], "checkpoints"))
    else:
        parts.append("<p class='note'>No checkpoint written by this run.</p>")
    wal = (sample or {}).get("wal") or {}
    if wal:
        parts.append("<h2>Write-ahead logs</h2>")
        columns = ["Log", "Syncs", "Avg sync", "Records per sync", "Bytes", "Segments", "Torn tails repaired"]
        parts.append(_table(columns, [
            [escape(name), str(s.get("syncs", 0)),
             f"{1000 * s.get('syncSeconds', 0) / s['syncs']:.2f} ms" if s.get("syncs") else "-",
             f"{s.get('records', 0) / s['syncs']:.1f}" if s.get("syncs") else "-",
             f"{s.get('bytes', 0):,}", str(s.get("segments", 0)), str(s.get("tornTails", 0))]
            for name, s in sorted(wal.items())], "wal"))
    state = (sample or {}).get("state") or {}
    if state:
        parts.append("<h2>State</h2>")
        parts.append(_table(["Stream", "Keys", "Full snapshot bytes", "Delta bytes"], [
            [escape(name), f"{s['keys']:,}" if "keys" in s else "-", f"{s['fullBytes']:,}" if "fullBytes" in s else "-",
             f"{s['deltaBytes']:,}" if "deltaBytes" in s else "-"]
            for name, s in sorted(state.items())], "state"))
    leader = view.get("leader")
    if leader:
        parts.append("<h2>Leadership</h2>")
        parts.append(_table(["Epoch", "Holder", "This driver"], [[
            escape(str(leader.get("epoch"))), escape(str(leader.get("holder", "-"))),
            escape(str(leader.get("role", "-")))]], "leadership"))
        parts.append("<p class='note'>A standby writes nothing to the checkpoint while it waits, so the "
                     "leader cannot list it: its own page shows how far behind it is.</p>")
    return "".join(parts)


def _ms_fraction(ms) -> str:
    return escape(f"{float(ms):.1f} ms") if isinstance(ms, (int, float)) else "-"


def _op_phases(phases: dict) -> str:
    """An operation's Spark job split (``submit``, ``tasks``, ``collect``), or "-"."""
    if not phases:
        return "-"
    return " / ".join(_ms_fraction(phases.get(name)) for name in ("submit", "tasks", "collect"))


def batch_page(view: dict, batch_id: int) -> str | None:
    status, prefix = view["status"], view.get("prefix", "")
    found = status.find_batch(batch_id)
    if found is None:
        return None
    state, b = found
    scheduling, processing, total = delays(b)
    when = _when(batch_id) + " UTC"
    spark_ui = view.get("spark_ui")
    body = [f"<h1>Details of batch at {escape(when)}</h1><ul>",
            f"<li>Batch Duration: {_ms(status.batch_ms)}</li><li>Input data size: {batch_records(b)} records</li>",
            f"<li>Scheduling delay: {_ms(scheduling)}</li><li>Processing time: {_ms(processing)}</li>",
            f"<li>Total delay: {_ms(total)}</li><li>Status: {escape(state)}</li></ul>",
            f"<p><a href='{prefix}/streaming/'>Back to Streaming Statistics</a></p>"]
    phases = b.get("breakdown") or {}
    if phases:
        body.append("<h2>Where the time went (driver)</h2>")
        body.append(_table(["Phase", "Duration"], [[escape(str(name)), _ms_fraction(ms)]
                                                   for name, ms in phases.items()], "breakdown"))
    paths = b.get("paths") or {}
    if paths:
        body.append("<h2>Where each stream ran</h2>")
        body.append(_table(["Stream", "Path"], [[escape(str(s)), escape(str(p))] for s, p in paths.items()], "paths"))
    rows = []
    for op in sorted(b.get("ops") or [], key=lambda o: o["id"]):
        start, end = op.get("startTime"), op.get("endTime")
        jobs = ", ".join(
            f"<a href='{escape(spark_ui)}/jobs/job/?id={int(j)}'>{int(j)}</a>" if spark_ui else str(int(j))
            for j in op.get("jobIds") or [])
        failed = op.get("failureReason")
        rows.append([str(op["id"]), escape(op.get("description") or op.get("name", "")),
                     _ms(end - start) if start is not None and end is not None else "-",
                     ("<span class='failed'>Failed</span>" if failed
                      else "Succeeded" if end is not None else "Running"),
                     jobs or "-", _op_phases(op.get("breakdown") or {}),
                     f"<pre class='failed'>{escape(failed)}</pre>" if failed else ""])
    body.append("<h2>Output Operations</h2>")
    body.append(_table(["Output Op Id", "Description", "Output Op Duration", "Status", "Job Id",
                        "Submit / tasks / collect", "Error"], rows, "operations"))
    return _page(f"Batch {when}", "".join(body))
