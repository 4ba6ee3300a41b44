"""``sparkwal ui CHECKPOINT`` and ``sparkwal status CHECKPOINT``: a checkpoint's event log, for a
running or a dead app, without Spark.

``ui`` serves the same REST API and pages as a live driver (every driver run is an application,
with its batches) until SIGINT or SIGTERM; ``status`` prints the summary: each run, the newest
run's batches and delays, and its last checkpoint. Exit statuses, as every sparkwal command's: 0
done, 1 a problem (no such directory, no event log in it, a storage error, a port in use), 2 a
usage error (a bad argument).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from sparkwal.base.times import batch_name, clock_time

OK, FAILED, USAGE = 0, 1, 2


def _parser(prog: str, verb: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory: a local path or an fsspec URL")
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[],
                   help="an fsspec storage option (repeatable)")
    if verb == "ui":
        p.add_argument("--port", type=int, default=None, help="the port (default: the first free from 4050; 0: any)")
        p.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
        p.add_argument("--json", action="store_true", help="print the address as a JSON line")
    else:
        p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _open(args, prog: str):
    """The catalog of the checkpoint's runs, or an exit status after one clear line."""
    from sparkwal.checkpoint.event_log import read_runs
    from sparkwal.checkpoint.layout import CheckpointLayout
    from sparkwal.wal.storage import parse_storage_options, resolve

    from ..ui.catalog import Catalog

    try:
        options = parse_storage_options(args.storage_option)
        storage, root = resolve(args.checkpoint, options)
        if not storage.exists(root):
            print(f"{prog}: no checkpoint directory at {args.checkpoint}", file=sys.stderr)
            return FAILED
        events = CheckpointLayout(args.checkpoint).events
        runs = read_runs(events, options)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return USAGE
    except Exception as e:  # noqa: BLE001 (one line, not a traceback)
        print(f"{prog}: cannot read {args.checkpoint}: {e}", file=sys.stderr)
        return FAILED
    if not runs:
        print(f"{prog}: {args.checkpoint} holds no event log (no driver ran on it since sparkwal recorded "
              "runs, or spark.sparkwal.eventLog.enabled was false)", file=sys.stderr)
        return FAILED
    return Catalog(events, storage_options=options)


def serve(argv: list[str], prog: str = "sparkwal ui") -> int:
    from ..ui.server import UiServer

    args = _parser(prog, "ui").parse_args(argv)
    if args.port is not None and not 0 <= args.port <= 65535:
        print(f"{prog}: --port must be 0-65535, got {args.port}", file=sys.stderr)
        return USAGE
    catalog = _open(args, prog)
    if isinstance(catalog, int):
        return catalog
    try:
        server = UiServer(catalog, args.host, args.port)
    except OSError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return FAILED
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = f"http://{args.host}:{server.port}"
    if args.json:
        print(json.dumps({"event": "ui", "url": url, "checkpoint": args.checkpoint}), flush=True)
    else:
        print(f"serving {url}/streaming/ for {args.checkpoint} (Ctrl-C stops)", flush=True)
    stop.wait()
    server.stop()
    return OK


def status(argv: list[str], prog: str = "sparkwal status") -> int:
    args = _parser(prog, "status").parse_args(argv)
    catalog = _open(args, prog)
    if isinstance(catalog, int):
        return catalog
    runs = catalog.runs()
    app = catalog.app_ids(runs)[-1]
    _, newest = catalog.find(app)
    summary = {"checkpoint": args.checkpoint, "runs": catalog.recoveries(), "newest": {
        "appId": app, "statistics": newest.statistics(),
        "lastBatches": newest.batches_view()[:5],
        "lastCheckpoint": newest.checkpoints[-1] if newest.checkpoints else None}}
    if args.json:
        print(json.dumps(summary))
        return OK
    stats = summary["newest"]["statistics"]
    print(f"{args.checkpoint}: {len(runs)} driver run(s)")
    for r in summary["runs"]:
        print(f"  {r.get('startTime')}  {r.get('kind'):8} epoch {r.get('epoch')}"
              + (f", after {r['downtimeMs'] / 1000:.1f} s down" if r.get("downtimeMs") is not None else "")
              + (f", re-ran {len(r['rerunBatches'])} batch(es)" if r.get("rerunBatches") else "")
              + (f", upgraded to a changed program: {'; '.join(r['upgradePlan'])}" if r.get("upgradePlan") else "")
              + (f", fenced: {r['fenced']}" if r.get("fenced") else "")
              + (f", ended {r['endTime']}" if r.get("endTime") else "")
              + (", running" if r.get("ended") == "running" else "")
              + (f", KILLED: no end recorded, last heard of {_when(r.get('lastEventTime') or r.get('startTimeEpoch'))}"
                 if r.get("ended") == "killed" else ""))
    print(f"newest run {app}: {stats['numTotalCompletedBatches']} batches completed, "
          f"{stats['numProcessedRecords']} records; avg processing {stats.get('avgProcessingTime', '-')} ms, "
          f"scheduling delay {stats.get('avgSchedulingDelay', '-')} ms")
    for b in summary["newest"]["lastBatches"]:
        failed = f", {b['numFailedOutputOps']} failed: {b.get('firstFailureReason')}" if b["numFailedOutputOps"] else ""
        print(f"  {batch_name(b['batchId'])}: {b['status']}, {b['inputSize']} records, "
              f"{b.get('processingTime', '-')} ms{failed}")
    last = summary["newest"]["lastCheckpoint"]
    if last:
        print(f"last checkpoint: {batch_name(last['checkpointTime'])} (epoch {last['epoch']}), "
              f"written in {last['tookMs']} ms")
    return OK


def _when(ms: int | None) -> str:
    return "-" if ms is None else clock_time(ms)


def main(argv: list[str], prog: str) -> int:
    verb, rest = argv[0], argv[1:]
    try:
        return serve(rest, prog) if verb == "ui" else status(rest, prog)
    except Exception as e:  # noqa: BLE001 (a damaged log, a storage error: one line, not a traceback)
        print(f"{prog}: {type(e).__name__}: {e}", file=sys.stderr)
        return FAILED
