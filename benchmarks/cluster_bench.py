"""Streaming on a Spark standalone cluster: sparkwal against pyspark.streaming, in one run.

    python -m benchmarks.cluster_bench [--runs 3] [--seconds 20] [--warmup 10]
                                       [--parts receiver,local,kill] [--json FILE]

It starts its own cluster with pyspark's ``spark-class`` (:mod:`sparkwal.engine.apps.standalone`): a master
and two workers of one core and 1 GiB each on 127.0.0.1, the same two cores ``local[2]`` has.
Every figure is the median of ``--runs`` runs per engine (single runs swing by 2x on a shared
machine), the engines alternated run by run (sparkwal first in even runs, pyspark.streaming first
in odd ones) so that neither always runs on a warmer or a busier machine. The apps are
:mod:`benchmarks.receiver_bench`'s (socket word count, 1 s batches, a checkpoint, backpressure on
for the word count); sparkwal's conf goes through ``sparkwal.engine.prepare_conf`` (its executors' Python
workers forked from its daemon and on Unix sockets: sparkwal is installed in the executors'
Python here), pyspark.streaming keeps Spark's defaults.

* ``receiver``: the word count with the receiver WAL on (durability: sparkwal fsyncs each block
  before reporting it; Spark hflushes and never fsyncs) and off (2 copies of each block on
  executors in both); the receiver alone, WAL on.
* ``local``: sparkwal's word count, WAL on, on ``local[2]``: the cluster's throughput against it.
* ``kill``: the word count (WAL on) running; ``--warmup`` seconds in, SIGKILL of the executor
  JVM running the receiver (the one whose process tree holds the source's connection); the time
  from the kill until the first batch due after it with data completes on time (scheduling delay
  under one batch interval), and until the first such batch completes at all.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager

from sparkwal.engine.apps.standalone import StandaloneCluster

from .receiver_bench import measure
from .receiver_flow import processes

ENGINES = ("sparkwal", "pyspark")
#: read by benchmarks.state_app: the master (and extra ``k=v,k=v`` settings) its apps run on
MASTER_ENV, CONF_ENV = "SPARKWAL_BENCH_MASTER", "SPARKWAL_BENCH_CONF"


@contextmanager
def on_standalone(workers: int = 2, cores: int = 1, memory: str = "2g", confs: tuple = ()):
    """A standalone cluster for the state and standby benchmarks (``--standalone``): every
    state_app they start runs on it."""
    with StandaloneCluster(tempfile.mkdtemp(prefix="bench-cluster-"), workers=workers, cores=cores,
                           memory=memory) as cluster:
        os.environ[MASTER_ENV], os.environ[CONF_ENV] = cluster.url, ",".join(confs)
        print(f"standalone cluster {cluster.url}: {workers} workers x {cores} core(s), {memory}", flush=True)
        try:
            yield cluster
        finally:
            os.environ.pop(MASTER_ENV, None)
            os.environ.pop(CONF_ENV, None)


def _order(run: int) -> tuple[str, ...]:
    return ENGINES if run % 2 == 0 else ENGINES[::-1]


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def receiver_part(cluster, runs: int, warmup: float, seconds: float) -> list[dict]:
    rows = []
    for run in range(runs):
        for workload, wal in (("wordcount", True), ("wordcount", False), ("receive", True)):
            for engine in _order(run):
                r = measure(engine, workload, warmup, seconds, master=cluster.url, wal=wal)
                r.pop("events")
                r.update(run=run, wal=wal, master="standalone")
                rows.append(r)
                print(json.dumps({k: r[k] for k in ("run", "workload", "wal", "engine", "records_per_s",
                                                    "scheduling_p50_ms", "note")}), flush=True)
    return rows


def local_part(runs: int, warmup: float, seconds: float) -> list[dict]:
    rows = []
    for run in range(runs):
        r = measure("sparkwal", "wordcount", warmup, seconds, master="local[2]", wal=True)
        r.pop("events")
        r.update(run=run, wal=True, master="local[2]")
        rows.append(r)
        print(json.dumps({k: r[k] for k in ("run", "master", "engine", "records_per_s")}), flush=True)
    return rows


def receiver_executor(executors: list[int], port: int) -> int | None:
    """The executor JVM whose process tree holds the connection to the source at ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # ESTABLISHED
                    inodes.add(f"socket:[{fields[9]}]")
    children: dict[int, list[int]] = {}
    for pid, fields in processes():
        children.setdefault(int(fields[1]), []).append(pid)
    for executor in executors:
        tree, stack = [], [executor]
        while stack:
            tree.append(stack.pop())
            stack.extend(children.get(tree[-1], ()))
        for pid in tree:
            try:
                if inodes & {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}:
                    return executor
            except OSError:
                continue
    return None


def kill_part(cluster, runs: int, warmup: float, seconds: float) -> list[dict]:
    rows = []
    for run in range(runs):
        for engine in _order(run):
            killed = {}

            def killer(events, port, killed=killed):
                deadline = time.monotonic() + 120
                while not any("started_ms" in e for e in events) and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(warmup)
                pid = None  # the receiver connects a few seconds after start(), later in some runs
                while pid is None and time.monotonic() < deadline + 60:
                    time.sleep(0.5)
                    if any(e.get("records") for e in events):
                        pid = receiver_executor(cluster.executor_pids(), port)
                if pid is None:
                    return
                killed["at_ms"] = int(time.time() * 1000)
                os.kill(pid, signal.SIGKILL)

            r = measure(engine, "wordcount", warmup, seconds + 30, master=cluster.url, wal=True,
                        on_started=killer)
            events = r.pop("events")
            kill_ms = killed.get("at_ms")
            after = [e for e in events if "batch_ms" in e and kill_ms and e["batch_ms"] >= kill_ms
                     and e["records"]]  # with data: a batch of a receiver not yet back is empty
            on_time = next((e for e in after if (e["scheduling_ms"] or 0) < 1000), None)
            first = min((e["at_ms"] for e in after), default=None)
            row = {"run": run, "engine": engine,
                   "back_on_time_s": round((on_time["at_ms"] - kill_ms) / 1000, 1) if on_time else None,
                   "first_batch_s": round((first - kill_ms) / 1000, 1) if first else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def summary(rows: list[dict], local: list[dict], kills: list[dict]) -> None:
    if rows:
        receiver_summary(rows)
    if local:
        lo = _median([r["records_per_s"] for r in local])
        cl = _median([r["records_per_s"] for r in rows if r["workload"] == "wordcount" and r["wal"]
                      and r["engine"] == "sparkwal"])
        print(f"\nsparkwal word count, WAL on: local[2] {lo:,.0f} lines/s (median of {len(local)})"
              + (f", standalone {cl:,.0f}: {cl / lo:.2f} of local" if cl else ""))
    if kills:
        print("\n| receiver's executor JVM killed | back on time, s (median) | first batch after the kill, s | runs |")
        print("|---|---:|---:|---:|")
        for engine in ENGINES:
            mine = [k for k in kills if k["engine"] == engine]
            print(f"| {engine} | {_median([k['back_on_time_s'] for k in mine])} | "
                  f"{_median([k['first_batch_s'] for k in mine])} | {len(mine)} |")


def receiver_summary(rows: list[dict]) -> None:
    print("\n| workload | receiver WAL | sparkwal lines/s | pyspark.streaming lines/s | ratio | "
          "scheduling p50 ms (sparkwal / pyspark) | runs |")
    print("|---|---|---:|---:|---:|---|---:|")
    for workload, wal in (("wordcount", True), ("wordcount", False), ("receive", True)):
        mine = [r for r in rows if r["workload"] == workload and r["wal"] == wal]
        s = _median([r["records_per_s"] for r in mine if r["engine"] == "sparkwal"])
        p = _median([r["records_per_s"] for r in mine if r["engine"] == "pyspark"])
        ss = _median([r["scheduling_p50_ms"] for r in mine if r["engine"] == "sparkwal"])
        ps = _median([r["scheduling_p50_ms"] for r in mine if r["engine"] == "pyspark"])
        ratio = f"{s / p:.2f}" if s and p else "n/a"
        print(f"| {workload} | {'on' if wal else 'off'} | {s:,.0f} | {p:,.0f} | {ratio} | {ss} / {ps} | "
              f"{len(mine) // 2} |" if s is not None and p is not None else f"| {workload} | {wal} | {s} | {p} | | | |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--parts", default="receiver,local,kill")
    ap.add_argument("--json", help="also write every run's figures here")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if parts - {"receiver", "local", "kill"} or args.runs < 1:
        ap.error(f"--parts takes receiver, local and kill; --runs at least 1 (got {args.parts!r}, {args.runs})")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    rows, local, kills = [], [], []
    with StandaloneCluster(tempfile.mkdtemp(prefix="cluster-bench-"), workers=2) as cluster:
        print(f"standalone cluster {cluster.url}: 2 workers x 1 core, 1 GiB", flush=True)
        if "receiver" in parts:
            rows = receiver_part(cluster, args.runs, args.warmup, args.seconds)
        if "kill" in parts:
            kills = kill_part(cluster, args.runs, args.warmup, args.seconds)
    if "local" in parts:
        local = local_part(args.runs, args.warmup, args.seconds)
    summary(rows, local, kills)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"receiver": rows, "local": local, "kill": kills}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
