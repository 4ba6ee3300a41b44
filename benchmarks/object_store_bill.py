"""The object-store bill: requests per batch, by kind and by object, of a stateful receiver app
with a hot standby, its checkpoint on S3.

    python -m benchmarks.object_store_bill [--batches 40] [--warmup 15] [--batch 1.0]

A real S3-compatible server (moto, on 127.0.0.1) behind the fault proxy (no faults: it only
counts, engine/apps/fault_proxy.py); the main job (``python -m sparkwal.engine.wordcount --source receiver
--batch 1``: a reliable receiver with its WAL, ``updateStateByKey``, the event log, the UI) with
``--checkpoint s3://...`` and a hot standby of it. After ``--warmup`` batches, every request the
proxy sees in the next ``--batches`` batch intervals is counted: per batch interval by kind (GET,
HEAD, PUT, LIST, DELETE) and by what it was for (leadership, checkpoint, WAL, event log, ...), and
how many batches completed meanwhile (fewer than the intervals: the job fell behind, and the
figures per interval are then what it paid while catching up). What the
receiver's own data WAL costs is counted too: it is written by the executor, also to S3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

CATEGORIES = (("/.leader", "leadership"), ("/receivedBlockMetadata", "block metadata WAL"),
              ("/receivedData", "receiver data WAL"), ("/events", "event log"),
              ("/checkpoint-", "checkpoint files"), ("/state", "state snapshots"),
              ("/code", "program (code) part"))


def category(path: str) -> str:
    """What a request was for, by its object's name (a listing's: its prefix)."""
    from urllib.parse import parse_qs, unquote

    path, _, query = path.partition("?")
    prefix = parse_qs(query).get("prefix")
    if prefix:
        path = "/" + unquote(prefix[0])
    for part, name in CATEGORIES:
        if part in path:
            return name
    return "checkpoint directory listings" if path.endswith("/") else "other"


class Job:
    def __init__(self, args: list[str], env: dict, log_path: str):
        self.batches = 0
        self.events: list[dict] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "sparkwal.engine.wordcount", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True,
                                     start_new_session=True)
        self.changed = threading.Condition()
        self.transcript = open(log_path.replace(".err", ".out"), "w")  # noqa: SIM115
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if self.transcript is not None:
                self.transcript.write(line)
            if line.startswith("{"):
                event = json.loads(line)
                with self.changed:
                    self.events.append(event)
                    self.batches += event.get("event") == "batch_completed"
                    self.changed.notify_all()
        with self.changed:  # ended: waiters see it
            self.changed.notify_all()

    def wait(self, predicate, timeout: float, what: str) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: predicate(self) or self.proc.poll() is not None, timeout):
                raise SystemExit(f"timed out waiting for {what}")
            if not predicate(self):
                raise SystemExit(f"the job ended (exit {self.proc.poll()}) before {what}: "
                                 f"{self.events[-3:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def measure(batches: int, warmup: int, batch_s: float) -> dict:
    import boto3
    import logging

    from moto.server import ThreadedMotoServer

    from sparkwal.engine.apps.fault_proxy import FaultProxy

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = FaultProxy(f"http://{host}:{port}")
    boto3.client("s3", endpoint_url=proxy.url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="bill")
    workdir = tempfile.mkdtemp(prefix="sparkwal-bill-")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", PYTHONUNBUFFERED="1")
    common = ["--dir", workdir, "--batch", str(batch_s), "--json", "--checkpoint", "s3://bill/ckpt",
              "--storage-option", "use_listings_cache=false", "--storage-option",
              "client_kwargs=" + json.dumps({"endpoint_url": proxy.url, "region_name": "us-east-1"})]
    leader = Job([*common, "--source", "receiver", "--files", str(10 * (batches + warmup) + 100),
                  "--seconds", "0"], env, os.path.join(workdir, "leader.err"))
    standby = None
    try:
        leader.wait(lambda j: j.batches >= 2, 300, "the leader's first batches")
        standby = Job([*common, "--standby"], env, os.path.join(workdir, "standby.err"))
        standby.wait(lambda j: any(e.get("event") == "standby" for e in j.events), 300, "the standby")
        leader.wait(lambda j: j.batches >= warmup, 300, "the warm-up batches")
        first_request, first_batch, started = len(proxy.log), leader.batches, time.monotonic()
        time.sleep(batches * batch_s)  # a fixed window: batch intervals, however fast batches run
        measured = max(1, leader.batches - first_batch)
        window = proxy.log[first_request:]
        elapsed = time.monotonic() - started
    finally:
        leader.stop()
        if standby is not None:
            standby.stop()
        proxy.stop()
        server.stop()
    by_kind: dict[str, int] = {}
    by_category: dict[str, dict[str, int]] = {}
    for r in window:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
        kinds = by_category.setdefault(category(r.path), {})
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    intervals = elapsed / batch_s  # per batch interval: what a job keeping up pays per batch
    return {"batch_intervals": round(intervals, 1), "batches_completed": measured,
            "seconds": round(elapsed, 1), "requests": len(window),
            "per_batch": round(len(window) / intervals, 2),
            "per_second": round(len(window) / elapsed, 2),
            "by_kind_per_batch": {k: round(v / intervals, 2) for k, v in sorted(by_kind.items())},
            "by_category_per_batch": {c: {k: round(v / intervals, 2) for k, v in sorted(kinds.items())}
                                      for c, kinds in sorted(by_category.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--batch", type=float, default=1.0)
    args = ap.parse_args(argv)
    r = measure(args.batches, args.warmup, args.batch)
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
