"""Engine benchmark: sparkwal's engine and pyspark.streaming running the same apps in one run.

    python -m benchmarks.engine_bench [--batches 20]

Rows (each engine on the same local[2] SparkContext, one after the other):

* ``empty batches``: 0.5 s batches of an empty queue stream with one output operation that runs a
  Spark job (``rdd.count()``); per-batch scheduling + processing delay (the engine's overhead);
* ``word count``: batches of 100,000 lines (10 words each) from a queue stream, counted with
  flatMap/map/reduceByKey and collected, queued faster than they run so they go back to back;
  words per second end to end (wall clock) and per second of the batches' processing time.

* ``recovery``: a stateful word count (file stream, updateStateByKey over a 50,000-word
  vocabulary, state checkpointed every 2 s) runs 1 s batches on a checkpoint for ~12 s and is
  stopped; then the clock runs from calling ``getOrCreate`` on that checkpoint until the first
  batch of the recovered context completes (``getOrCreate`` + ``start`` + re-running the last
  batch), less any wait for that batch's time: a restart with no batch to re-run (sparkwal's stop
  checkpoints the batches that completed) runs its first batch at the next batch time, up to a
  second later, which is the clock, not recovery work (the wait and whether a re-run came first are
  reported beside it). The same process and SparkContext serve both engines, so JVM start-up (the
  same for both, ~4-6 s) is not in the figure: it is the engines' own recovery work.

Figures come from each engine's own listener (batch processing and scheduling delays).
"""

from __future__ import annotations

import argparse
import operator
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time


def _spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkwal too
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName("sparkwal-engine-bench")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1"))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    return sc


class _Collector:
    """Listener for both engines: (batch time, scheduling delay, processing delay, records)."""

    def __init__(self, pyspark_engine: bool):
        self.rows: list[tuple[int, float, float]] = []
        self.completed_at: list[float] = []  # time.monotonic() of each completion
        self.pyspark_engine = pyspark_engine
        self.cond = threading.Condition()

    def add(self, t, sched, proc):
        with self.cond:
            self.rows.append((t, sched, proc))
            self.completed_at.append(time.monotonic())
            self.cond.notify_all()

    def wait(self, n, timeout=180):
        with self.cond:
            return self.cond.wait_for(lambda: len(self.rows) >= n, timeout)


def _listener(collector: _Collector):
    """The same listener code for both engines: only the import differs."""
    if collector.pyspark_engine:
        from pyspark.streaming.listener import StreamingListener
    else:
        from sparkwal.engine import StreamingListener

    class Listener(StreamingListener):
        def onBatchCompleted(self, batchCompleted):
            info = batchCompleted.batchInfo()
            collector.add(info.batchTime().milliseconds(), info.schedulingDelay(), info.processingDelay())
    return Listener()


def _run_job(action):
    """An output function doing ``action(rdd)`` and returning None: pyspark.streaming treats a
    truthy return value of a foreachRDD function as an RDD (and fails the batch otherwise)."""
    def output(rdd) -> None:
        action(rdd)
    return output


def _context_class(engine: str):
    """The engine's StreamingContext: the one import a port changes."""
    if engine == "pyspark.streaming":
        from pyspark.streaming import StreamingContext
    else:
        from sparkwal.engine import StreamingContext
    return StreamingContext


def _context(sc, engine: str, batch: float):
    return _context_class(engine)(sc, batch)


def empty_batches(sc, engine: str, n: int) -> dict:
    ssc = _context(sc, engine, 0.5)
    c = _Collector(engine == "pyspark.streaming")
    ssc.addStreamingListener(_listener(c))
    ssc.queueStream([], default=sc.emptyRDD()).foreachRDD(_run_job(lambda rdd: rdd.count()))
    ssc.start()
    ok = c.wait(n + 2)
    ssc.stop(stopSparkContext=False, stopGraceFully=False)
    ssc.awaitTerminationOrTimeout(10)
    rows = c.rows[2:n + 2]  # skip warm-up batches
    totals = [s + p for _, s, p in rows]
    return {"ok": ok, "p50_ms": statistics.median(totals), "max_ms": max(totals)}


def word_count(sc, engine: str, n: int, lines_per_batch: int = 100_000) -> dict:
    """Batches of ``lines_per_batch`` lines queued faster than they run (0.25 s batches), so they
    go back to back: words/s end to end (wall clock from the 2nd batch's completion to the last's)
    and words/s of the batches' own processing time."""
    words = " ".join(f"w{i % 1000}" for i in range(10))
    data = [sc.parallelize([words] * lines_per_batch, 4) for _ in range(n)]
    ssc = _context(sc, engine, 0.25)
    c = _Collector(engine == "pyspark.streaming")
    ssc.addStreamingListener(_listener(c))
    counts = (ssc.queueStream(data).flatMap(str.split).map(lambda w: (w, 1))
              .reduceByKey(operator.add))
    counts.foreachRDD(_run_job(lambda rdd: rdd.collect()))
    ssc.start()
    ok = c.wait(n)
    ssc.stop(stopSparkContext=False, stopGraceFully=False)
    rows = c.rows[1:n]  # the first batch warms up the workers
    busy_s = sum(p for _, _, p in rows) / 1000
    span_s = c.completed_at[n - 1] - c.completed_at[1]
    return {"ok": ok, "records_per_s": len(rows) * lines_per_batch * 10 / busy_s,
            "end_to_end_per_s": (n - 2) * lines_per_batch * 10 / span_s}


VOCABULARY = 50_000


def _write_words_file(directory: str, i: int, rng: random.Random, lines: int = 2_000) -> None:
    tmp = os.path.join(directory, f".{i}.tmp")
    with open(tmp, "w") as f:
        for _ in range(lines):
            f.write(" ".join(f"w{rng.randrange(VOCABULARY)}" for _ in range(10)) + "\n")
    os.replace(tmp, os.path.join(directory, f"{i:05d}.txt"))


def recovery(sc, engine: str, warm_batches: int = 12) -> dict:
    """Seconds from getOrCreate on an existing checkpoint to the first completed batch."""
    StreamingContext = _context_class(engine)  # noqa: N806
    workdir = tempfile.mkdtemp(prefix="sparkwal-recovery-bench-")
    indir, ckpt = os.path.join(workdir, "in"), os.path.join(workdir, "ckpt")
    os.makedirs(indir)

    def setup():
        ssc = StreamingContext(sc, 1.0)
        ssc.checkpoint(ckpt)
        pairs = ssc.textFileStream(indir).flatMap(str.split).map(lambda w: (w, 1))
        totals = pairs.updateStateByKey(lambda vs, s: sum(vs) + (s or 0))
        totals.checkpoint(2.0)
        totals.foreachRDD(_run_job(lambda rdd: rdd.count()))
        return ssc

    try:
        first = _Collector(engine == "pyspark.streaming")
        ssc = StreamingContext.getOrCreate(ckpt, setup)
        ssc.addStreamingListener(_listener(first))
        ssc.start()
        rng = random.Random(1)
        for i in range(warm_batches):
            _write_words_file(indir, i, rng)
            first.wait(i + 1)
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
        ssc.awaitTerminationOrTimeout(10)

        again = _Collector(engine == "pyspark.streaming")
        began, began_wall = time.monotonic(), time.time()
        ssc = StreamingContext.getOrCreate(ckpt, setup)
        created = time.monotonic()
        ssc.addStreamingListener(_listener(again))
        ssc.start()
        ok = again.wait(1)
        done = again.completed_at[0] if ok else float("nan")
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
        ssc.awaitTerminationOrTimeout(10)
        # a restart with no batch to re-run waits for its next batch time: not recovery work
        waited = max(0.0, again.rows[0][0] / 1000 - began_wall) if ok else 0.0
        return {"ok": ok, "recovery_s": done - began - waited, "waited_s": waited,
                "rerun": ok and again.rows[0][0] / 1000 < began_wall, "get_or_create_s": created - began}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=4, help="runs per engine, alternating which goes first")
    ap.add_argument("--recovery-reps", type=int, default=4, help="recovery runs per engine (<= reps)")
    args = ap.parse_args(argv)
    sc = _spark()
    out = ["| workload | engine | figure (median of runs alternating the engines) |", "|---|---|---|"]
    engines = ("sparkwal", "pyspark.streaming")
    empty = {e: [] for e in engines}
    wc = {e: [] for e in engines}
    rec = {e: [] for e in engines}
    for rep in range(args.reps):
        order = engines if rep % 2 == 0 else engines[::-1]
        for engine in order:
            empty[engine].append(empty_batches(sc, engine, args.batches))
            wc[engine].append(word_count(sc, engine, max(6, args.batches // 2)))
            if rep < args.recovery_reps:
                rec[engine].append(recovery(sc, engine))
            print(f"rep {rep + 1} {engine}: {empty[engine][-1]} {wc[engine][-1]} "
                  f"{rec[engine][-1] if rep < args.recovery_reps else ''}", file=sys.stderr, flush=True)
    for engine in engines:
        p50 = statistics.median(r["p50_ms"] for r in empty[engine])
        worst = max(r["max_ms"] for r in empty[engine])
        out.append(f"| empty 0.5 s batches, one count() job | {engine} | p50 {p50:.0f} ms per batch "
                   f"(worst {worst:.0f} ms) |")
    for key, what in (("end_to_end_per_s", "words/s end to end (batches back to back)"),
                      ("records_per_s", "words/s of processing time")):
        for engine in engines:
            rate = statistics.median(r[key] for r in wc[engine])
            out.append(f"| word count, 1M words per batch | {engine} | {rate:,.0f} {what} |")
    ratio = (statistics.median(r["end_to_end_per_s"] for r in wc["sparkwal"])
             / statistics.median(r["end_to_end_per_s"] for r in wc["pyspark.streaming"]))
    out.append(f"| word count end to end, sparkwal / pyspark.streaming | | {ratio:.2f} (goal >= 1) |")
    for engine in engines:
        r = statistics.median(x["recovery_s"] for x in rec[engine])
        g = statistics.median(x["get_or_create_s"] for x in rec[engine])
        w = statistics.median(x["waited_s"] for x in rec[engine])
        reruns = sum(x["rerun"] for x in rec[engine])
        out.append(f"| recovery, stateful word count | {engine} | {r:.2f} s of work to the first batch "
                   f"(getOrCreate {g:.2f} s; {w:.2f} s more waiting for its batch time; a re-run batch "
                   f"first in {reruns} of {len(rec[engine])} runs) |")
    ratio = (statistics.median(x["recovery_s"] for x in rec["sparkwal"])
             / statistics.median(x["recovery_s"] for x in rec["pyspark.streaming"]))
    out.append(f"| recovery time, sparkwal / pyspark.streaming | | {ratio:.2f} (goal <= 0.5) |")
    print("\n".join(out))
    sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
