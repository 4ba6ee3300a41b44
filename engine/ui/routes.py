"""What each URL of the UI answers: Spark's streaming REST API, the pages and ``/metrics``.

``respond(catalog, target)`` maps a request target to (status, content type, body) and never
raises for any input: unknown paths and bad ids are 404, bad query values 400 (Spark's resources
match ids with ``\\d+``, so ``batches/abc`` is a 404 there as here).

    /api/v1/applications[/{appId}]
    /api/v1/applications/{appId}/streaming/statistics | receivers | receivers/{streamId}
        | batches[?status=QUEUED|PROCESSING|COMPLETED] | batches/{batchId}
        | batches/{batchId}/operations | batches/{batchId}/operations/{outputOpId}
        | recoveries                                  (sparkwal's: every driver run)
    /streaming/  /streaming/batch/?id={batchTimeMs}    (the newest or live run)
    /history/{appId}/streaming/[batch/?id=...]         (any run, as Spark's history server)
    /metrics                                           (a live driver's, Prometheus' text format)
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import parse_qs, urlsplit

from . import metrics as metrics_module
from . import pages
from .status import STATUSES

JSON = "application/json"
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
MAX_TARGET = 2048
_API = re.compile(r"/api/v1/applications(?:/([^/]+)(?:/streaming(/.*)?)?)?/?")
_HISTORY = re.compile(r"/history/([^/]+)(/streaming/.*)")
_DIGITS = re.compile(r"\d{1,18}")


def _json(value) -> tuple[int, str, bytes]:
    return 200, JSON, json.dumps(value, indent=2).encode()


def _not_found(what: str) -> tuple[int, str, bytes]:
    return 404, TEXT, f"{what}\n".encode()


def respond(catalog, target: str) -> tuple[int, str, bytes]:
    if len(target) > MAX_TARGET:
        return 414, TEXT, b"request target too long\n"
    try:
        parts = urlsplit(target)
        query = parse_qs(parts.query, max_num_fields=20)
    except ValueError as e:
        return 400, TEXT, f"bad request: {e}\n".encode()
    path = parts.path
    if path in ("", "/"):
        return 302, "/streaming/", b""
    if path == "/metrics":
        if catalog.metrics is None:
            return _not_found("no metrics here: /metrics is served by a running driver")
        return 200, metrics_module.CONTENT_TYPE, catalog.metrics.render()
    m = _API.fullmatch(path)
    if m:
        return _api(catalog, m.group(1), m.group(2), query)
    m = _HISTORY.fullmatch(path)
    if m:
        return _page(catalog, m.group(1), m.group(2), query, prefix=f"/history/{m.group(1)}")
    if path.startswith("/streaming"):
        app = catalog.default_app()
        if app is None:
            return _not_found("no driver run recorded yet")
        return _page(catalog, app, path, query, prefix="")
    return _not_found(f"unknown path: {path}")


def _api(catalog, app_id, rest, query):
    if app_id is None:
        return _json(catalog.applications())
    found = catalog.find(app_id)
    if found is None:
        return _not_found(f"unknown app: {app_id}")
    if rest is None:
        return _json(next(a for a in catalog.applications() if a["id"] == app_id))
    _, status = found
    if rest.strip("/") == "recoveries":  # every run's: not this run's to version
        return _json(catalog.recoveries())
    return catalog.cached(("api", app_id, rest, tuple(sorted((k, tuple(v)) for k, v in query.items()))),
                          (id(status), status.version), lambda: _streaming_api(catalog, status, rest, query))


def _streaming_api(catalog, status, rest, query):
    steps = [s for s in rest.split("/") if s]
    if steps == ["statistics"]:
        return _json(status.statistics())
    if steps and steps[0] == "receivers" and len(steps) <= 2:
        receivers = status.receivers_view()
        if len(steps) == 1:
            return _json(receivers)
        if not _DIGITS.fullmatch(steps[1]):
            return _not_found(f"unknown receiver: {steps[1]}")
        match = [r for r in receivers if r["streamId"] == int(steps[1])]
        return _json(match[0]) if match else _not_found(f"unknown receiver: {steps[1]}")
    if steps and steps[0] == "batches" and len(steps) <= 4:
        return _batches(status, steps[1:], query)
    return _not_found(f"unknown path: {rest}")


def _batches(status, steps, query):
    if not steps:
        wanted = query.get("status") or list(STATUSES)
        bad = [s for s in wanted if s not in STATUSES]
        if bad:
            return 400, TEXT, f"unknown status {bad[0]!r}; one of {', '.join(STATUSES)}\n".encode()
        return _json(status.batches_view(tuple(wanted)))
    if not all(_DIGITS.fullmatch(s) for s in steps[::2]) or (len(steps) > 1 and steps[1] != "operations"):
        return _not_found(f"unknown path: batches/{'/'.join(steps)}")
    batch_id = int(steps[0])
    if len(steps) == 1:
        view = status.batch_view(batch_id)
        return _json(view) if view is not None else _not_found(f"unknown batch: {batch_id}")
    ops = status.operations_view(batch_id)
    if ops is None:
        return _not_found(f"unknown batch: {batch_id}")
    if len(steps) == 2:
        return _json(ops)
    if len(steps) == 3:
        match = [op for op in ops if op["outputOpId"] == int(steps[2])]
        return _json(match[0]) if match else _not_found(f"unknown output operation: {steps[2]}")
    return _not_found("unknown path")


def _page(catalog, app_id, path, query, prefix):
    found = catalog.find(app_id)
    if found is None:
        return _not_found(f"unknown app: {app_id}")
    _, status = found
    # a live page shows the time (a standby's lag): it is rendered again at least every second
    return catalog.cached(("page", app_id, path, tuple(query.get("id") or ())),
                          (id(status), status.version, int(time.monotonic())),
                          lambda: _render_page(catalog, status, path, query, prefix))


def _render_page(catalog, status, path, query, prefix):
    live = catalog.live is not None and status is catalog.live
    view = {"status": status, "prefix": prefix, "live": live, "recoveries": catalog.recoveries(),
            **(catalog.extras() if live else {})}
    if path in ("/streaming", "/streaming/"):
        return 200, HTML, pages.streaming_page(view).encode()
    if path in ("/streaming/batch", "/streaming/batch/"):
        ids = query.get("id") or []
        if len(ids) != 1 or not _DIGITS.fullmatch(ids[0]):
            return 400, TEXT, b"a batch page needs ?id=<batch time in ms>\n"
        html = pages.batch_page(view, int(ids[0]))
        return (200, HTML, html.encode()) if html is not None else _not_found(f"unknown batch: {ids[0]}")
    return _not_found(f"unknown path: {path}")

