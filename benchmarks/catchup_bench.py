"""Catching up after downtime: from a restart to batches back on time, Spark's way and coalesced.

    python -m benchmarks.catchup_bench [--down 60] [--intervals 1000,100] [--rate 2000] [--up 15]

A writer in this process appends ``--rate`` stamped lines a second to a FileLogSource partition for
the whole run. A sparkwal app (a subprocess, ``local[3]``, a checkpoint) counts each batch's lines
from a direct stream over it (offsets and commits logged, fsync'd). After ``--up`` seconds of
batches the app is killed with SIGKILL (its process group); ``--down`` seconds later it starts
again from its checkpoint, while the writer goes on. Each row measures, from the restart's launch:

* **first batch**: the first batch completed after the restart (the JVM's start is part of it);
* **missed done**: the first new batch (due after the restart) completed, so every batch time missed
  while down has run (or was coalesced);
* **back on time**: the first batch due after the restart whose scheduling delay is under one
  batch interval, with every batch after it on time for ``--settle`` seconds (the rows stop
  there, or at ``--limit`` seconds);
* the batches run and the records read in between, and the largest batch.

Rows: each batch interval with Spark's rule (every missed batch time runs, one at a time; a batch
with no input costs nearly nothing: ``spark.sparkwal.emptyBatch.shortcut``) and with
``spark.sparkwal.recovery.coalesceDowntime=true`` (the missed input runs as one batch). Durability:
the same in both (the offset log is fsync'd before a batch runs, its commit after).
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

WORDS = "spark stream wal checkpoint batch driver executor record block offset"


class Writer:
    """Appends ``rate`` lines a second to ``path``, in slices every 10 ms, until stopped."""

    def __init__(self, path: str, rate: int):
        self.path, self.rate, self.written = path, rate, 0
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        start = time.monotonic()
        with open(self.path, "a") as f:
            while not self.stopped.is_set():
                due = int((time.monotonic() - start) * self.rate)
                if due > self.written:
                    stamp = int(time.time() * 1000)
                    f.write("".join(f"{stamp} {WORDS}\n" for _ in range(due - self.written)))
                    f.flush()
                    self.written = due
                time.sleep(0.01)


def app(args) -> None:
    from pyspark import SparkConf, SparkContext

    from sparkwal import StreamingContext, StreamingListener
    from sparkwal.engine.sources import FileLogSource

    conf = (SparkConf().setMaster("local[3]").setAppName("catchup").set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.sparkwal.recovery.coalesceDowntime", "true" if args.coalesce else "false"))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")

    class Batches(StreamingListener):
        def onBatchCompleted(self, e):
            info = e.batchInfo()
            print(json.dumps({"batch_ms": info.batchTime().milliseconds(), "records": info.numRecords(),
                              "scheduling_ms": info.schedulingDelay(), "processing_ms": info.processingDelay(),
                              "done_ms": time.time() * 1000}), flush=True)

    def create():
        ssc = StreamingContext(sc, args.interval_ms / 1000)
        ssc.checkpoint(os.path.join(args.workdir, "ckpt"))
        stream = ssc.directStream(FileLogSource(os.path.join(args.workdir, "log")))
        stream.map(lambda line: 1).reduce(lambda a, b: a + b).foreachRDD(lambda rdd: rdd.collect())
        return ssc

    ssc = StreamingContext.getOrCreate(os.path.join(args.workdir, "ckpt"), create)
    ssc.addStreamingListener(Batches())
    ssc.start()
    print(json.dumps({"started_ms": time.time() * 1000, "coalesced": len(ssc.coalesced_batch_times),
                      "rerun": len(ssc.rerun_batch_times)}), flush=True)
    ssc.awaitTermination()


def _launch(workdir: str, interval_ms: int, coalesce: bool):
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.catchup_bench", "app", "--workdir", workdir,
         "--interval-ms", str(interval_ms), *(["--coalesce"] if coalesce else [])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))
    events: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return proc, events


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def row(interval_ms: int, coalesce: bool, args) -> dict:
    workdir = tempfile.mkdtemp(prefix="catchup-")
    os.makedirs(os.path.join(workdir, "log"))
    writer = Writer(os.path.join(workdir, "log", "p0"), args.rate)
    try:
        proc, events = _launch(workdir, interval_ms, coalesce)
        deadline = time.monotonic() + 120
        while not any("batch_ms" in e for e in events) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(args.up)
        _kill(proc)
        time.sleep(args.down)
        launched_ms = time.time() * 1000
        proc, events = _launch(workdir, interval_ms, coalesce)
        try:
            return _watch(events, launched_ms, interval_ms, coalesce, args)
        finally:
            _kill(proc)
    finally:
        writer.stopped.set()


def _watch(events: list[dict], launched_ms: float, interval_ms: int, coalesce: bool, args) -> dict:
    """Waits until batches are back on time (or ``--limit``) and sums up the row."""
    result = {"interval_ms": interval_ms, "rule": "coalesced" if coalesce else "Spark's (every missed batch)"}
    end = time.monotonic() + args.limit
    back = None
    while time.monotonic() < end:
        time.sleep(0.2)
        started = next((e for e in events if "started_ms" in e), None)
        batches = [e for e in events if "batch_ms" in e]
        if started is None or not batches:
            continue
        late = [e for e in batches if e["batch_ms"] >= started["started_ms"] - interval_ms]
        for i, e in enumerate(late):
            if e["scheduling_ms"] < interval_ms and all(x["scheduling_ms"] < interval_ms for x in late[i:]):
                if late[-1]["done_ms"] - e["done_ms"] >= args.settle * 1000:
                    back = e
                break
        if back is not None:
            break
    started = next((e for e in events if "started_ms" in e), {})
    batches = [e for e in events if "batch_ms" in e]
    until = [e for e in batches if back is None or e["done_ms"] <= back["done_ms"]]
    result.update({
        "missed_batches_rerun": started.get("rerun"), "coalesced": started.get("coalesced"),
        "first_batch_s": round((batches[0]["done_ms"] - launched_ms) / 1000, 1) if batches else None,
        "missed_done_s": next((round((e["done_ms"] - launched_ms) / 1000, 1) for e in batches
                               if started and e["batch_ms"] >= started["started_ms"]), None),
        "back_on_time_s": round((back["done_ms"] - launched_ms) / 1000, 1) if back else None,
        "batches_until_back": len(until), "records_until_back": sum(e["records"] for e in until),
        "largest_batch": max((e["records"] for e in until), default=0)})
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "app":
        ap = argparse.ArgumentParser()
        ap.add_argument("--workdir", required=True)
        ap.add_argument("--interval-ms", type=int, required=True)
        ap.add_argument("--coalesce", action="store_true")
        app(ap.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--down", type=float, default=60)
    ap.add_argument("--up", type=float, default=15)
    ap.add_argument("--intervals", default="1000,100")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=5, help="seconds every batch must stay on time")
    ap.add_argument("--limit", type=float, default=90, help="seconds a row waits to be back on time")
    args = ap.parse_args(argv)
    print(f"{args.down:g} s down, {args.rate:,} lines/s written throughout; times from the restart's launch")
    print("| batch ms | rule | missed batch times re-run | coalesced | first batch s | missed done s | back on time s "
          "| batches until then | records until then | largest batch |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for interval in (int(i) for i in args.intervals.split(",")):
        for coalesce in (False, True):
            r = row(interval, coalesce, args)
            back = r["back_on_time_s"] if r["back_on_time_s"] is not None else f"not within {args.limit:g}"
            print(f"| {interval} | {r['rule']} | {r['missed_batches_rerun']} | {r['coalesced']} | "
                  f"{r['first_batch_s']} | {r['missed_done_s']} | {back} | {r['batches_until_back']:,} | "
                  f"{r['records_until_back']:,} | {r['largest_batch']:,} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
