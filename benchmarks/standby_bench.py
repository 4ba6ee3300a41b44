"""Hot-standby benchmark: how long a killed driver's stream is down, three ways, in one run.

    python -m benchmarks.standby_bench [--takeovers 20] [--restarts 5] [--keys 2000]
                                       [--batch 1.0] [--cost-batches 30]

The app is :mod:`benchmarks.state_app` (a file stream of keys counted with ``updateStateByKey``,
state snapshotted every two batches, a checkpoint on the local disk, ``local[2]``), fed one file of
a tenth of the keys every batch interval (the first file: every key). Rows:

* **sparkwal, hot standby**: a second driver (``getOrCreate(..., standby=True)``) waits beside the
  active one; the active one's process group gets SIGKILL 2-4 s after the standby reported that
  it is hot (``onStandbyReady``) and the active one keeps up again (its newest batch less than a batch interval late:
  both drivers share two cores here); a fresh standby is started after every takeover.
* **sparkwal, cold restart**: SIGKILL (2-4 s after the driver keeps up), then the same app started
  again (``getOrCreate``).
* **pyspark.streaming, cold restart**: the same app on pyspark.streaming, SIGKILL and restart.

Each figure is the time from the SIGKILL to the first batch completed by the new driver that is
newer than every batch completed before the kill (so a re-run of a batch the old driver had
finished does not count). Every engine is warm before its first kill (a batch completed, Python
workers up). Durability is the same in every row: checkpoints and state snapshots on the local
disk, fsync'd by sparkwal, written by Spark's checkpoint code for pyspark.streaming.

* **on S3** (``--s3-takeovers``, default 5): the same takeovers with the checkpoint on moto's S3
  server (a process of its own), a 3 s lease and ``--s3-batch`` batches (default 2 s: on moto here
  a batch's checkpoint, lease and snapshot requests take longer than 1 s, and an active driver
  that falls behind would make a takeover re-run its backlog); measured from the killed driver's
  lease expiry, which a standby must wait
  for there.
* **standby's cost**: the active driver's median batch processing time over ``--cost-batches``
  batches with a standby beside it, against the median of as many before the standby started
  and as many after it was killed (same process, same input).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class App:
    """One driver process of state_app, with its own events file."""

    def __init__(self, workdir: str, engine: str, batch_s: float, standby: bool = False,
                 checkpoint: str | None = None, extra: tuple = (), env: dict | None = None):
        # numbered by the apps started before (the directory's other entries come and go: a SQLite journal)
        started = sum(n.startswith("events-") and n.endswith(".jsonl") for n in os.listdir(workdir))
        self.events_path = os.path.join(workdir, f"events-{started}.jsonl")
        open(self.events_path, "w").close()
        self._events: list[dict] = []
        self._read_to = 0
        env = dict(os.environ, PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1", **(env or {}))
        log = open(self.events_path + ".log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.state_app", "--engine", engine, "--op", "update",
             "--input", os.path.join(workdir, "in"),
             "--checkpoint", checkpoint or os.path.join(workdir, "ckpt"),
             "--batch", str(batch_s), "--events", self.events_path, *(["--standby"] if standby else []),
             *extra],
            cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)

    def events(self) -> list[dict]:
        """Every event so far; only lines written since the last look are read (this process
        polls beside the drivers it measures, on the same cores)."""
        with open(self.events_path) as f:
            f.seek(self._read_to)
            for line in f:
                if not line.endswith("\n"):
                    break
                self._read_to += len(line.encode())
                self._events.append(json.loads(line))
        return self._events

    def wait(self, predicate, timeout: float = 180) -> dict:
        deadline, seen = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            events = self.events()
            for e in events[seen:]:
                if predicate(e):
                    return e
            seen = len(events)
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited with {self.proc.returncode}; see {self.events_path}.log")
            time.sleep(0.01)
        raise TimeoutError(f"no matching event in {timeout} s ({self.events_path})")

    def batches(self) -> list[int]:
        return [e["time_ms"] for e in self.events() if e["event"] == "batch"]

    def kill(self) -> float:
        os.killpg(self.proc.pid, signal.SIGKILL)
        killed = time.time()
        self.proc.wait()
        return killed


class Feeder:
    """One file of keys into ``workdir/in`` every batch interval (the first: every key)."""

    def __init__(self, workdir: str, keys: int, batch_s: float):
        self.dir = os.path.join(workdir, "in")
        os.makedirs(self.dir, exist_ok=True)
        self._keys, self._batch_s = [f"k{i}" for i in range(keys)], batch_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng, i = random.Random(7), 0
        while not self._stop.wait(self._batch_s):
            chosen = self._keys if i == 0 else rng.sample(self._keys, len(self._keys) // 10)
            staged = os.path.join(self.dir, f".f{i:05d}.txt")
            with open(staged, "w") as f:
                f.write("\n".join(chosen) + "\n")
            now = time.time()
            os.utime(staged, (now, now))
            os.rename(staged, os.path.join(self.dir, f"f{i:05d}.txt"))
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _last_batch(apps: list[App]) -> int:
    return max((t for a in apps for t in a.batches()), default=0)


def _steady(active: App, batch_s: float, timeout: float = 60) -> float:
    """Wait until ``active`` keeps up: its newest batch started less than a batch interval late
    (a standby's or a restart's start-up on the same 2 cores puts it behind for a while). Returns
    how late its newest batch started, in seconds: more than a batch interval when it never
    caught up within ``timeout`` (then a takeover re-runs that backlog first)."""
    deadline = time.monotonic() + timeout
    late = float("inf")
    while time.monotonic() < deadline:
        done = [e for e in active.events() if e["event"] == "batch"]
        if done:  # from the clock, not the scheduling delay: the same on every engine
            late = done[-1]["at"] - done[-1]["processing_ms"] / 1000 - done[-1]["time_ms"] / 1000
            if late < batch_s:
                break
        time.sleep(0.1)
    return late


def _due_to_done(app: App, batches: int = 10) -> float:
    """The median time from a batch's time to its completion over ``app``'s newest ``batches``:
    what any batch takes on this machine, the floor of a takeover's first batch (a takeover's
    down time is the wait for its first batch's time, then that batch)."""
    done = [e for e in app.events() if e["event"] == "batch"][-batches:]
    return statistics.median(e["at"] - e["time_ms"] / 1000 for e in done)


def _down_time(new: App, killed: float, last: int) -> float:
    first = new.wait(lambda e: e["event"] == "batch" and e["time_ms"] > last)
    return first["at"] - killed


def takeovers(n: int, keys: int, batch_s: float, seed: int = 1, checkpoint: str | None = None,
              extra: tuple = (), env: dict | None = None, lease_expiry_ms=None) -> dict:
    """``n`` takeovers by hot standbys (see the module docstring). ``lease_expiry_ms``: called
    right after each kill, the killed driver's lease expiry (an object store's checkpoint)."""
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix="standby-bench-")
    feeder = Feeder(workdir, keys, batch_s)
    start = lambda standby: App(workdir, "sparkwal", batch_s, standby, checkpoint, extra, env)  # noqa: E731
    apps = [start(False)]
    down, took, after, late = [], [], [], []
    waited, first_batch, steady = [], [], []  # down = waited + first_batch (see _due_to_done)
    try:
        apps[0].wait(lambda e: e["event"] == "batch")
        active = apps[0]
        for _ in range(n):
            standby = start(True)
            apps.append(standby)
            standby.wait(lambda e: e["event"] == "hot")
            late.append(_steady(active, batch_s))
            time.sleep(rng.uniform(2, 4))
            last = _last_batch(apps)
            killed = active.kill()
            expiry = lease_expiry_ms() if lease_expiry_ms is not None else None
            steady.append(_due_to_done(active))
            first = standby.wait(lambda e: e["event"] == "batch" and e["time_ms"] > last)
            down.append(first["at"] - killed)
            due = max(killed, first["time_ms"] / 1000)  # a re-run batch was due before the kill
            waited.append(due - killed)
            first_batch.append(first["at"] - due)
            if expiry is not None:
                after.append(first["at"] - expiry / 1000)
            took.append(standby.wait(lambda e: e["event"] == "takeover")["took_ms"])
            active = standby
    finally:
        feeder.stop()
        for a in apps:
            if a.proc.poll() is None:
                a.kill()
    shutil.rmtree(workdir, ignore_errors=True)  # kept for a post-mortem when something failed
    return {"down_s": down, "took_ms": took, "after_lease_s": after, "late_s": late, "waited_s": waited,
            "first_batch_s": first_batch, "steady_s": steady}


def s3_takeovers(n: int, keys: int, batch_s: float, lease_s: float = 3.0, seed: int = 1) -> dict:
    """Takeovers with the checkpoint on S3 (moto's server on 127.0.0.1): the standby may take
    over only once the killed driver's lease has expired. Measured: the lease's expiry (read
    from the store right after the kill, as ``sparkwal checkpoint inspect`` shows it) to the
    first newer batch completed by the new driver."""
    import boto3

    from sparkwal.wal.storage import parse_storage_options, resolve

    server, host, port = _moto_process()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="standby-bench")
    pairs = ["use_listings_cache=false",
             "client_kwargs=" + json.dumps({"endpoint_url": endpoint, "region_name": "us-east-1"})]
    extra = (*(a for p in pairs for a in ("--storage-option", p)),
             "--conf", f"spark.streaming.driver.leaseTimeout={int(lease_s * 1000)}ms")
    url = "s3://standby-bench/ckpt"
    os.environ.update(creds)
    storage, path = resolve(url, parse_storage_options(pairs))
    try:
        r = takeovers(n, keys, batch_s, seed, url, extra, creds,
                      lambda: storage.leader(path).expires_ms)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    return {**r, "lease_s": lease_s}


def _moto_process() -> tuple[subprocess.Popen, str, int]:
    """moto's S3 server in a process of its own: in this one it would share a GIL with the
    polling of the drivers' events, and answer the drivers late."""
    import socket

    from sparkwal.engine.apps.standalone import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, "127.0.0.1", port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start on 127.0.0.1:{port}") from None
            time.sleep(0.1)


def cold_restarts(engine: str, n: int, keys: int, batch_s: float, seed: int = 1) -> dict:
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix=f"restart-bench-{engine}-")
    feeder = Feeder(workdir, keys, batch_s)
    apps = [App(workdir, engine, batch_s)]
    down = []
    try:
        apps[0].wait(lambda e: e["event"] == "batch")
        for _ in range(n):
            _steady(apps[-1], batch_s)
            time.sleep(rng.uniform(2, 4))
            last = _last_batch(apps)
            killed = apps[-1].kill()
            apps.append(App(workdir, engine, batch_s))
            down.append(_down_time(apps[-1], killed, last))
    finally:
        feeder.stop()
        for a in apps:
            if a.proc.poll() is None:
                a.kill()
    shutil.rmtree(workdir, ignore_errors=True)
    return {"down_s": down}


def standby_cost(batches: int, keys: int, batch_s: float) -> dict:
    """The active driver's median processing time alone, then with a standby beside it, then
    alone again once the standby is killed (both "alone" phases count: the machine's drift
    over the run falls on both sides)."""
    workdir = tempfile.mkdtemp(prefix="standby-cost-")
    feeder = Feeder(workdir, keys, batch_s)
    active = App(workdir, "sparkwal", batch_s)
    standby = None
    try:
        active.wait(lambda e: e["event"] == "batch")
        start = len(active.batches())
        active.wait(lambda e: len(active.batches()) >= start + 2 * batches, 60 + 4 * batches * batch_s)
        processing = [e["processing_ms"] for e in active.events() if e["event"] == "batch"]
        alone = processing[start + batches:start + 2 * batches]
        standby = App(workdir, "sparkwal", batch_s, standby=True)
        standby.wait(lambda e: e["event"] == "hot")
        time.sleep(10 * batch_s)  # its start-up and warm-up over: the standby as it runs for hours
        _steady(active, batch_s)
        start = len(active.batches())
        active.wait(lambda e: len(active.batches()) >= start + batches, 60 + 4 * batches * batch_s)
        beside = [e["processing_ms"] for e in active.events() if e["event"] == "batch"][start:start + batches]
        standby.kill()
        start = len(active.batches())
        active.wait(lambda e: len(active.batches()) >= start + 10 + batches, 60 + 4 * batches * batch_s)
        alone += [e["processing_ms"] for e in active.events() if e["event"] == "batch"][start + 10:start + 10 + batches]
    finally:
        feeder.stop()
        for a in (active, standby):
            if a is not None and a.proc.poll() is None:
                a.kill()
    shutil.rmtree(workdir, ignore_errors=True)
    return {"alone_ms": statistics.median(alone), "with_standby_ms": statistics.median(beside)}


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


def _warn_if_behind(name: str, r: dict, batch_s: float) -> None:
    """Say so when the active driver never kept up before a kill: the new driver then re-runs
    that backlog first, and the row measures it, not the takeover."""
    behind = [x for x in r.get("late_s", ()) if x >= batch_s]
    if behind:
        print(f"  ({name}: before {len(behind)} of {len(r['late_s'])} kills the active driver never kept "
              f"up within 60 s: its newest batch started {statistics.median(behind):.1f} s late (median); "
              f"those figures include re-running that backlog)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--takeovers", type=int, default=20)
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--keys", type=int, default=2_000)
    ap.add_argument("--batch", type=float, default=1.0)
    ap.add_argument("--cost-batches", type=int, default=30)
    ap.add_argument("--s3-takeovers", type=int, default=5)
    ap.add_argument("--s3-batch", type=float, default=2.0)
    ap.add_argument("--standalone", action="store_true",
                    help="every driver on a standalone cluster this benchmark starts (2 workers x 2 "
                    "cores, 2 GiB; each driver takes 2 cores, so a standby has executors of its own)")
    args = ap.parse_args(argv)
    if args.standalone:
        from .cluster_bench import on_standalone

        with on_standalone(cores=2, confs=("spark.cores.max=2", "spark.executor.memory=900m")):
            return _run(args)
    return _run(args)


def _run(args) -> int:
    rows = [("sparkwal, hot standby", takeovers(args.takeovers, args.keys, args.batch)),
            ("sparkwal, cold restart (getOrCreate)", cold_restarts("sparkwal", args.restarts, args.keys, args.batch)),
            ("pyspark.streaming, cold restart (getOrCreate)",
             cold_restarts("pyspark", args.restarts, args.keys, args.batch))]
    print(f"kill -9 of the driver's process group to the first newer batch completed "
          f"({args.keys} keys, updateStateByKey, {args.batch} s batches, "
          f"{os.environ.get('SPARKWAL_BENCH_MASTER', 'local[2]')}, local checkpoint)")
    print("| driver recovery | kills | p50 | p95 | max | the takeover itself (p50) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        d = r["down_s"]
        took = f"{statistics.median(r['took_ms']):.0f} ms" if r.get("took_ms") else "-"
        print(f"| {name} | {len(d)} | {pct(d, .5):.2f} s | {pct(d, .95):.2f} s | {max(d):.2f} s | {took} |",
              flush=True)
        if r.get("first_batch_s"):
            print(f"  ({name}: the wait for the first batch's time p50 {pct(r['waited_s'], .5):.2f} s, then that "
                  f"batch to its completion p50 {pct(r['first_batch_s'], .5):.2f} s; the active driver's own "
                  f"batches, time to completion, p50 {pct(r['steady_s'], .5):.2f} s before the kills)", flush=True)
        _warn_if_behind(name, r, args.batch)
    if args.s3_takeovers:
        r = s3_takeovers(args.s3_takeovers, args.keys, args.s3_batch)
        a, d = r["after_lease_s"], r["down_s"]
        print(f"on S3 (moto on 127.0.0.1, {r['lease_s']:.0f} s lease, {args.s3_batch} s batches), {len(a)} "
              f"takeovers: the killed "
              f"driver's lease expiry to the first newer batch p50 {pct(a, .5):.2f} s, p95 "
              f"{pct(a, .95):.2f} s, max {max(a):.2f} s (kill to it: p50 {pct(d, .5):.2f} s)", flush=True)
        _warn_if_behind("on S3", r, args.s3_batch)
    cost = standby_cost(args.cost_batches, args.keys, args.batch)
    print(f"the active driver's batch processing time: alone {cost['alone_ms']:.0f} ms (median of "
          f"{args.cost_batches} batches before the standby and as many after it), with a standby "
          f"beside it {cost['with_standby_ms']:.0f} ms (median of {args.cost_batches}) "
          f"({cost['with_standby_ms'] / cost['alone_ms'] - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
