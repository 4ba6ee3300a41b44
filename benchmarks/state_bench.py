"""State at scale: a stateful word count at 100k, 1M and 3M keys, sparkwal's ``updateStateByKey``
and ``mapWithState`` side by side with pyspark.streaming's ``updateStateByKey``, in one run.

    python -m benchmarks.state_bench [--keys 100000,1000000,3000000] [--batches 6] [--restarts 3]

Each contender is :mod:`benchmarks.state_app` in its own process group on ``local[2]``, fed the
same files: a first batch with every key, then batches with a fixed random 10% (or 1%) of the
keys, each moved in once the previous batch has completed (a batch's processing time is its own).
The state is snapshotted every two batches (pyspark.streaming: an RDD checkpoint, full each
time, LZ4 as Spark compresses it; sparkwal: an Arrow IPC chain, durability of both: the files
are written, not fsync'd). Figures per contender:

* processing per batch after the first: median and max (the first batch, every key, apart);
* bytes per snapshot: pyspark.streaming's checkpoint of the state; sparkwal's full snapshot and
  its median delta (of those based on a snapshot after the first batch with data: a delta over
  that batch holds every key);
* restart: a batch between two snapshots completes; half a second before the next batch falls
  due, with that batch's file already moved in, SIGKILL of the app's process group; then the clock
  from the kill to that batch completed by the restarted app (JVM start, ``getOrCreate``, reading
  the state, re-computing the batches since the snapshot, the new batch). Killing at the same
  place in the batch interval in every contender keeps the wait for the next batch time out of
  the figure (killed right after its batch, a faster engine would wait longer for the next one).
  ``--restarts`` kills (3 by default) one after another, each after one more batch: the median,
  and the range (one restart swings by a third on this machine, pyspark.streaming's more when it
  re-runs its last batch);
* peak memory (proportional set size, so that pages a forked Python worker shares with the
  daemon it was forked from count once) of the driver's Python, the JVM, and the Python workers
  (the worker daemon and its forks, which PySpark puts in a process group of their own).
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
import time

from .receiver_flow import processes


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTENDERS = [  # (label, engine, op, fraction of keys touched per batch[, the app's --conf settings])
    ("pyspark.streaming updateStateByKey, 10%", "pyspark", "update", 0.10),
    ("sparkwal updateStateByKey, 10%", "sparkwal", "update", 0.10),
    ("sparkwal mapWithState, 10%", "sparkwal", "map", 0.10),
    ("sparkwal updateStateByKey, 1%", "sparkwal", "update", 0.01),
    ("sparkwal mapWithState, 1%", "sparkwal", "map", 0.01),
    ("sparkwal, no state: the batch's shuffle alone, 10%", "sparkwal", "shuffle", 0.10),
    ("sparkwal mapWithState and its stateSnapshots() each batch, 10%", "sparkwal", "map-snapshots", 0.10),
    ("sparkwal mapWithState, no state host (state.host=false), 10%", "sparkwal", "map", 0.10,
     ("spark.sparkwal.state.host=false",)),
    ("sparkwal, the state's shape in PySpark's cache with no state in it, 10%", "sparkwal", "structure", 0.10),
    ("sparkwal, a state out of Spark's cache run by host processes, nothing recovering it, 10%", "sparkwal", "hosted",
     0.10),
]
BOUNDS = ("structure", "hosted")  # rows with no state a restart could recover: no restarts
MEMORY_EVERY_S = 1.0
BATCH_SECONDS = {100_000: 2.0, 1_000_000: 20.0, 3_000_000: 10.0}


def _tree(pgid: int) -> list[int]:
    """The processes of group ``pgid`` and all their descendants: PySpark's worker daemon puts
    itself and the workers it forks in a process group of their own."""
    children: dict[int, list[int]] = {}
    members = []
    for pid, fields in processes():
        children.setdefault(int(fields[1]), []).append(pid)
        if int(fields[2]) == pgid:
            members.append(pid)
    seen, stack = set(members), list(members)
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return sorted(seen)


def _pss(pid: int) -> int:
    """Proportional set size: a forked worker's pages shared with the daemon count once in all."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _memory_by_kind(pgid: int) -> dict[str, int]:
    out = {"driver": 0, "jvm": 0, "workers": 0}
    for pid in _tree(pgid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            pss = _pss(pid)
        except OSError:
            continue
        kind = "jvm" if b"java" in cmd.split(b" ")[0] else ("driver" if b"state_app" in cmd else "workers")
        out[kind] += pss
    return out


class Run:
    """One contender's app process: start, feed, wait for batches, kill."""

    def __init__(self, workdir: str, engine: str, op: str, batch_s: float, confs: tuple[str, ...] = ()):
        self.workdir, self.engine, self.op, self.batch_s = workdir, engine, op, batch_s
        self.confs = confs
        self.input = os.path.join(workdir, "in")
        self.ckpt = os.path.join(workdir, "ckpt")
        self.events = os.path.join(workdir, "events.jsonl")
        os.makedirs(self.input, exist_ok=True)
        self.peak = {"driver": 0, "jvm": 0, "workers": 0}
        self._next_sample = 0.0
        self.proc: subprocess.Popen | None = None
        self._seen = 0

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1")
        log = open(os.path.join(self.workdir, "app.log"), "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.state_app", "--engine", self.engine, "--op", self.op,
             "--input", self.input, "--checkpoint", self.ckpt, "--batch", str(self.batch_s),
             "--events", self.events, *(a for c in self.confs for a in ("--conf", c))],
            cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)

    def _events(self) -> list[dict]:
        try:
            with open(self.events) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def wait_for(self, predicate, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.engine}/{self.op} exited with {self.proc.returncode}; see "
                                   f"{self.workdir}/app.log")
            if time.monotonic() >= self._next_sample:  # reading smaps costs CPU: once a second
                self._next_sample = time.monotonic() + MEMORY_EVERY_S
                for k, v in _memory_by_kind(self.proc.pid).items():
                    self.peak[k] = max(self.peak[k], v)
            events = self._events()
            for e in events[self._seen:]:
                if predicate(e):
                    self._seen = events.index(e) + 1
                    return e
            time.sleep(0.1)
        raise TimeoutError(f"{self.engine}/{self.op}: no matching event in {timeout} s ({self.workdir})")

    def move_in(self, path: str) -> int:
        """Move one batch's file in (mtime: now); return that time in ms."""
        target = os.path.join(self.input, os.path.basename(path))
        staged = os.path.join(self.input, "." + os.path.basename(path))  # hidden: not read yet
        shutil.copyfile(path, staged)
        now = time.time()
        os.utime(staged, (now, now))
        os.rename(staged, target)
        return int(now * 1000)

    def processed(self, moved_ms: int, timeout: float) -> dict:
        # the first batch whose time is at or after the file's mtime reads it (pyspark.streaming
        # reports no record counts for file streams)
        return self.wait_for(lambda e: e["event"] == "batch" and e["time_ms"] >= moved_ms, timeout)

    def feed(self, path: str, records: int, timeout: float) -> dict:
        """Move one batch's file in; return the event of the batch that processed it."""
        return self.processed(self.move_in(path), timeout)

    def kill(self) -> float:
        """SIGKILL the app's process group; return the wall-clock time of the kill."""
        at = time.time()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return at


def _sleep_until(wall: float) -> None:
    time.sleep(max(0.0, wall - time.time()))


def kill_before_due(run: Run, last_batch_ms: int, path: str, batch_s: float) -> tuple[float, int]:
    """Kill ``run`` half a second before its next batch falls due, with that batch's file moved in a
    second before: the restarted driver owes that batch at once, whichever engine it is and however
    long its previous batch took, so the figure is the restart's own work, not a wait for the clock.
    Returns (kill time, the file's mtime in ms)."""
    due = last_batch_ms / 1000 + batch_s
    while due - time.time() < 1.5:  # too close (a slow previous batch): the next batch time
        due += batch_s
    _sleep_until(due - 1.0)
    moved_ms = run.move_in(path)
    _sleep_until(due - 0.5)
    return run.kill(), moved_ms


def batch_files(cache: str, keys: int, fraction: float, batches: int) -> list[tuple[str, int]]:
    """The same files for every contender: batch 0 every key, then ``fraction`` of them."""
    rng = random.Random(keys * 1000 + int(fraction * 100))
    names = [f"k{i}" for i in range(keys)]
    out = []
    for b in range(batches):
        path = os.path.join(cache, f"{keys}-{fraction}-{b:03d}.txt")
        chosen = names if b == 0 else rng.sample(names, max(1, int(keys * fraction)))
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as f:
                f.write("\n".join(chosen) + "\n")
            os.rename(path + ".tmp", path)
        out.append((path, len(chosen)))
    return out


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def snapshot_bytes(run: Run, first_data_ms: int) -> dict:
    """The largest full snapshot, and the median delta among those based on a snapshot taken
    after the first batch with data (a delta over that batch holds every key, not a fraction)."""
    if run.engine == "pyspark":  # <ckpt>/<uuid>/rdd-<id>/part-*: one directory per RDD checkpoint
        sizes = [_dir_bytes(os.path.join(d, r)) for d, rs, _ in os.walk(run.ckpt) for r in rs
                 if r.startswith("rdd-")]
        return {"full": max(sizes, default=0), "delta": None}
    fulls, deltas = [], []
    state = os.path.join(run.ckpt, "state")
    for name in os.listdir(state) if os.path.isdir(state) else []:
        if name.endswith(".manifest"):
            with open(os.path.join(state, name)) as f:
                m = json.load(f)
            size = sum(p[1] for p in m["parts"])
            if m["kind"] == "full":
                fulls.append(size)
            elif m["base_ms"] >= first_data_ms:
                deltas.append(size)
    return {"full": max(fulls, default=None), "delta": statistics.median(deltas) if deltas else None}


def measure(keys: int, label: str, engine: str, op: str, fraction: float, batches: int, cache: str,
            restarts: int = 1, confs: tuple[str, ...] = ()) -> dict:
    batch_s = BATCH_SECONDS.get(keys, 8.0)
    restarts = 0 if op in BOUNDS else restarts
    files = batch_files(cache, keys, fraction, batches + 2 * restarts)
    workdir = tempfile.mkdtemp(prefix=f"state-{engine}-{op}-")
    run = Run(workdir, engine, op, batch_s, confs)
    timeout = 60 + keys / 5_000
    restart_s = []
    try:
        run.start()
        run.wait_for(lambda e: e["event"] == "started", 120)
        # warm-up: an empty batch completes (JVM and Python workers up)
        run.wait_for(lambda e: e["event"] == "batch", 120)
        done = [run.feed(path, n, timeout) for path, n in files[:batches]]
        for i in range(batches, batches + 2 * restarts, 2):
            # a batch after the last snapshot, then SIGKILL just before the next batch falls due:
            # the restart re-computes the state since the snapshot and runs that batch
            fed = run.feed(*files[i], timeout)
            killed, moved_ms = kill_before_due(run, fed["time_ms"], files[i + 1][0], batch_s)
            run.start()
            restart_s.append(run.processed(moved_ms, timeout + 120)["at"] - killed)
    finally:
        if run.proc is not None and run.proc.poll() is None:
            run.kill()
    later = [e["processing_ms"] / 1000 for e in done[1:]]
    result = {"label": label, "keys": keys, "batch_s": batch_s, "first_s": done[0]["processing_ms"] / 1000,
              "median_s": statistics.median(later), "max_s": max(later),
              "restart_s": statistics.median(restart_s) if restart_s else None, "restarts_s": restart_s,
              "snapshot": snapshot_bytes(run, done[0]["time_ms"]),
              "peak_mib": {k: v // 2**20 for k, v in run.peak.items()},
              "batches": done}  # (each batch's event: where its time went, for --json)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def _spread(seconds: list[float]) -> str:
    """The median, and the range when there are several ("-" for none: ``--restarts 0``)."""
    if not seconds:
        return "-"
    mid = f"{statistics.median(seconds):.1f} s"
    return mid if len(seconds) < 2 else f"{mid} ({min(seconds):.1f}-{max(seconds):.1f} s)"


def _mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default="100000,1000000,3000000")
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--only", default="", help="comma-separated contender numbers (1-based)")
    p.add_argument("--restarts", type=int, default=3, help="kills per contender (the median is shown)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--standalone", action="store_true",
                   help="run every contender on a standalone cluster this benchmark starts (2 workers "
                   "x 1 core, 2 GiB; executors of 1.5 GiB) instead of local[2]")
    args = p.parse_args(argv)
    if args.restarts < 0 or args.batches < 2:
        p.error("--restarts must be 0 or more, --batches 2 or more (the first batch, every key, is apart)")
    if args.standalone:
        from .cluster_bench import on_standalone

        with on_standalone(confs=("spark.executor.memory=1500m",)):
            return _run(args)
    return _run(args)


def _run(args) -> int:
    cache = tempfile.mkdtemp(prefix="state-bench-input-")
    chosen = [c for i, c in enumerate(CONTENDERS, 1) if not args.only or str(i) in args.only.split(",")]
    results = []
    try:
        for keys in (int(k) for k in args.keys.split(",")):
            print(f"\n{keys:,} keys, {BATCH_SECONDS.get(keys, 8.0)} s batches, {args.batches} batches, "
                  "snapshots every 2 batches", flush=True)
            print("| contender | first batch | later batches median (max) | snapshot full | delta | "
                  "restart | peak PSS driver/JVM/workers |", flush=True)
            print("|---|---|---|---|---|---|---|", flush=True)
            for label, engine, op, fraction, *confs in chosen:
                r = measure(keys, label, engine, op, fraction, args.batches, cache, args.restarts,
                            confs[0] if confs else ())
                results.append(r)
                m = r["peak_mib"]
                print(f"| {label} | {r['first_s']:.2f} s | {r['median_s']:.2f} s ({r['max_s']:.2f} s) | "
                      f"{_mib(r['snapshot']['full'])} | {_mib(r['snapshot']['delta'])} | "
                      f"{_spread(r['restarts_s'])} | {m['driver']}/{m['jvm']}/{m['workers']} MiB |", flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
