"""Direct streams: the batch protocol's cost per batch, and direct word count vs textFileStream.

    python -m benchmarks.direct_bench [--batches 200] [--records 400000] [--dir DIR]

1. **Protocol overhead per batch** (no Spark): what the driver adds to every batch with the
   protocol on, measured on the real disk (``--dir``, default a directory under the current one):
   plan the ranges (FileLogSource's incremental scan of 2 growing files), write ``offsets/N``,
   write ``commits/N`` (after the batch), purge beyond 100 batches. Rows: metadata fsync'd (the
   default; durable against a machine crash) and not fsync'd (``spark.sparkwal.batchLog.fsync
   =false``: atomic, survives a process kill, a machine crash may lose the newest entries).
   p50/p95/max over ``--batches`` batches. Target: under 10 ms per batch on a local disk.
2. **Word count records/s**, one SparkContext (local[2]), batches driven by a manual clock so
   both apps get identical batches: the same lines as (a) a direct stream over append-only files
   (FileLogSource, protocol on, fsync'd) and (b) ``textFileStream`` over files moved into a
   directory (one file per partition per batch), both with a checkpoint; each counts words with
   flatMap/map/reduceByKey and collects the result. A warm-up batch for each is discarded.
   Durability of the input: (a) offsets logged before the batch, committed after it (exactly
   once with an idempotent or transactional output); (b) the batch's file list in the DStream
   checkpoint (Spark's at-least-once re-run semantics).
"""

from __future__ import annotations

import argparse
import operator
import os
import shutil
import sys
import tempfile
import threading
import time

from .receiver_bench import WORDS_LINE

LINE = WORDS_LINE.decode().rstrip("\n")


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


def protocol_overhead(directory: str, batches: int, sync: bool, lines_per_batch: int = 500) -> dict:
    from sparkwal.engine.sources import BatchLog, FileLogSource

    shutil.rmtree(directory, ignore_errors=True)
    logdir = os.path.join(directory, "log")
    os.makedirs(logdir)

    class Input:  # what BatchLog needs of a direct input (the planning is timed separately)
        input_id = 0

        def __init__(self):
            self.source = FileLogSource(logdir)

    stream = Input()
    blog = BatchLog(os.path.join(directory, "ckpt"), [stream], sync=sync)
    blog.recover()
    blog.write_initial_offsets(stream, {})
    ends: dict = {}
    costs, plan_costs = [], []
    block = (LINE + "\n") * lines_per_batch
    for i in range(batches):
        for name in ("p0", "p1"):
            with open(os.path.join(logdir, name), "a") as f:
                f.write(block)
        t0 = time.perf_counter()
        latest = stream.source.latest_offsets(stream.source.partitions())
        ranges = [(tp, ends.get(tp, 0), end) for tp, end in latest.items()]
        for tp, a, b in ranges:  # what compute() asks the source for each range
            stream.source.read_hint(tp, a, b)
        ends = dict(latest)
        t1 = time.perf_counter()
        t = (i + 1) * 1000
        blog.log_batch(t, [ends], {})
        blog.batch_done(t, True)
        blog.checkpoint_durable(t)  # commits/N (+ purge)
        t2 = time.perf_counter()
        plan_costs.append((t1 - t0) * 1000)
        costs.append((t2 - t0) * 1000)
    assert blog.statistics().latest_committed == batches - 1
    return {"sync": sync, "batches": batches, "p50_ms": _pct(costs, 0.5), "p95_ms": _pct(costs, 0.95),
            "max_ms": max(costs), "plan_p50_ms": _pct(plan_costs, 0.5),
            "retained": len(blog.offsets.batch_ids())}


def wordcount(directory: str, records: int, batches: int) -> list[dict]:
    from pyspark import SparkConf, SparkContext

    from sparkwal.engine import StreamingContext, StreamingListener
    from sparkwal.engine.sources import FileLogSource
    from sparkwal.wal import ManualClock

    conf = (SparkConf().setMaster("local[2]").setAppName("direct-bench")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    per_batch = records // batches
    rows = []
    for kind in ("direct", "textFileStream"):
        base = os.path.join(directory, kind)
        shutil.rmtree(base, ignore_errors=True)
        indir = os.path.join(base, "in")
        os.makedirs(indir)
        clock = ManualClock(0)
        done: dict[int, float] = {}
        cond = threading.Condition()
        counted: dict[int, int] = {}

        class Done(StreamingListener):
            def onBatchCompleted(self, e):
                with cond:
                    done[e.batchInfo().batch_time_ms] = time.perf_counter()
                    cond.notify_all()

        ssc = StreamingContext(sc, 1.0, clock=clock)
        ssc.checkpoint(os.path.join(base, "ckpt"))
        if kind == "direct":
            stream = ssc.directStream(FileLogSource(indir))
        else:
            stream = ssc.textFileStream(indir)

        def count(t, rdd, counted=counted):
            counted[int(t.timestamp() * 1000)] = sum(n for _, n in rdd.collect())

        stream.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(operator.add).foreachRDD(count)
        ssc.addStreamingListener(Done())
        ssc.start()
        block = (LINE + "\n") * (per_batch // 2)
        started = None
        for i in range(batches + 1):  # batch 0 warms up (JIT, Python workers)
            for p in ("p0", "p1"):
                if kind == "direct":
                    with open(os.path.join(indir, p), "a") as f:
                        f.write(block)
                else:
                    tmp = os.path.join(base, f".{p}-{i}")
                    with open(tmp, "w") as f:
                        f.write(block)
                    os.utime(tmp, (clock.now_ms() / 1000 + 0.5,) * 2)
                    os.replace(tmp, os.path.join(indir, f"{p}-{i}"))
            if i == 1:
                started = time.perf_counter()
            clock.advance(1000)
            t = clock.now_ms()
            with cond:
                assert cond.wait_for(lambda t=t: t in done, 300), f"{kind}: batch {t} not done"
        elapsed = time.perf_counter() - started
        ssc.stop(stopSparkContext=False)
        words = sum(counted.get((i + 1) * 1000, 0) for i in range(1, batches + 1))
        expected = batches * (per_batch // 2) * 2 * len(LINE.split())
        assert words == expected, f"{kind}: counted {words} words, expected {expected}"
        lines = batches * (per_batch // 2) * 2
        rows.append({"app": kind, "lines": lines, "seconds": elapsed, "lines_per_s": lines / elapsed,
                     "durability": ("offsets fsync'd before, commit after: exactly once with the sink"
                                    if kind == "direct" else "file list in the checkpoint: at-least-once")})
    sc.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=200, help="protocol batches measured")
    ap.add_argument("--records", type=int, default=400_000, help="word count: lines in all")
    ap.add_argument("--wc-batches", type=int, default=10, help="word count: batches measured")
    ap.add_argument("--dir", help="work directory on the disk to measure (default: under .)")
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    directory = args.dir or tempfile.mkdtemp(prefix=".direct-bench-", dir=".")
    try:
        print("batch protocol overhead per batch (plan + offsets/N + commits/N + purge), local disk:")
        for sync in (True, False):
            protocol_overhead(os.path.join(directory, "warm"), 20, sync)  # warm the code paths
            r = protocol_overhead(os.path.join(directory, "proto"), args.batches, sync)
            label = "fsync'd metadata" if sync else "metadata not fsync'd"
            print(f"  {label:22s} p50 {r['p50_ms']:6.2f} ms  p95 {r['p95_ms']:6.2f} ms  "
                  f"max {r['max_ms']:6.2f} ms  (planning alone p50 {r['plan_p50_ms']:.2f} ms; "
                  f"{r['retained']} batches retained)")
        print(f"word count, local[2], {args.wc_batches} batches of {args.records // args.wc_batches} lines:")
        rows = wordcount(os.path.join(directory, "wc"), args.records, args.wc_batches)
        for r in rows:
            print(f"  {r['app']:15s} {r['lines_per_s']:10,.0f} lines/s  ({r['lines']:,} lines in "
                  f"{r['seconds']:.1f} s; {r['durability']})")
        ratio = rows[0]["lines_per_s"] / rows[1]["lines_per_s"]
        print(f"  direct / textFileStream: {ratio:.2f}x")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
