"""Engine benchmark: sparkwal's engine and pyspark.streaming running the same apps in one run.

    python -m benchmarks.engine_bench [--batches 20]

Rows (each engine on the same local[2] SparkContext, one after the other):

* ``empty batches``: 0.5 s batches of an empty queue stream with one output operation that runs a
  Spark job (``rdd.count()``); per-batch scheduling + processing delay (the engine's overhead);
* ``word count``: batches of 100,000 lines (10 words each) from a queue stream, counted with
  flatMap/map/reduceByKey and collected; records per second of processing time.

Figures come from each engine's own listener (batch processing and scheduling delays).
Recovery time against pyspark.streaming's ``getOrCreate`` is not measured yet.
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import sys
import threading


def _spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
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
        self.pyspark_engine = pyspark_engine
        self.cond = threading.Condition()

    def add(self, t, sched, proc):
        with self.cond:
            self.rows.append((t, sched, proc))
            self.cond.notify_all()

    def wait(self, n, timeout=180):
        with self.cond:
            return self.cond.wait_for(lambda: len(self.rows) >= n, timeout)


def _listener(collector: _Collector):
    if collector.pyspark_engine:
        from pyspark.streaming.listener import StreamingListener

        class L(StreamingListener):
            def onBatchCompleted(self, batchCompleted):
                info = batchCompleted.batchInfo()
                collector.add(info.batchTime().milliseconds(), info.schedulingDelay(),
                              info.processingDelay())
        return L()
    from engine import StreamingListener

    class M(StreamingListener):
        def onBatchCompleted(self, batchCompleted):
            info = batchCompleted.batchInfo()
            collector.add(info.batch_time_ms, info.scheduling_delay_ms, info.processing_delay_ms)
    return M()


def _context(sc, engine: str, batch: float):
    if engine == "pyspark.streaming":
        from pyspark.streaming import StreamingContext
    else:
        from engine import StreamingContext
    return StreamingContext(sc, batch)


def empty_batches(sc, engine: str, n: int) -> dict:
    ssc = _context(sc, engine, 0.5)
    c = _Collector(engine == "pyspark.streaming")
    ssc.addStreamingListener(_listener(c))
    ssc.queueStream([], default=sc.emptyRDD()).foreachRDD(lambda rdd: rdd.count())
    ssc.start()
    ok = c.wait(n + 2)
    ssc.stop(stopSparkContext=False, stopGraceFully=False)
    ssc.awaitTerminationOrTimeout(10)
    rows = c.rows[2:n + 2]  # skip warm-up batches
    totals = [s + p for _, s, p in rows]
    return {"ok": ok, "p50_ms": statistics.median(totals), "max_ms": max(totals)}


def word_count(sc, engine: str, n: int, lines_per_batch: int = 100_000) -> dict:
    words = " ".join(f"w{i % 1000}" for i in range(10))
    data = [sc.parallelize([words] * lines_per_batch, 4) for _ in range(n)]
    ssc = _context(sc, engine, 1.0)
    c = _Collector(engine == "pyspark.streaming")
    ssc.addStreamingListener(_listener(c))
    counts = (ssc.queueStream(data).flatMap(str.split).map(lambda w: (w, 1))
              .reduceByKey(operator.add))
    counts.foreachRDD(lambda rdd: rdd.collect())
    ssc.start()
    ok = c.wait(n)
    ssc.stop(stopSparkContext=False, stopGraceFully=False)
    rows = c.rows[1:n]  # the first batch warms up the workers
    busy_s = sum(p for _, _, p in rows) / 1000
    return {"ok": ok, "records_per_s": len(rows) * lines_per_batch * 10 / busy_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=4, help="runs per engine, alternating which goes first")
    args = ap.parse_args(argv)
    sc = _spark()
    out = ["| workload | engine | figure (median of runs alternating the engines) |", "|---|---|---|"]
    engines = ("sparkwal", "pyspark.streaming")
    empty = {e: [] for e in engines}
    wc = {e: [] for e in engines}
    for rep in range(args.reps):
        order = engines if rep % 2 == 0 else engines[::-1]
        for engine in order:
            empty[engine].append(empty_batches(sc, engine, args.batches))
            wc[engine].append(word_count(sc, engine, max(6, args.batches // 2)))
            print(f"rep {rep + 1} {engine}: {empty[engine][-1]} {wc[engine][-1]}", file=sys.stderr, flush=True)
    for engine in engines:
        p50 = statistics.median(r["p50_ms"] for r in empty[engine])
        worst = max(r["max_ms"] for r in empty[engine])
        out.append(f"| empty 0.5 s batches, one count() job | {engine} | p50 {p50:.0f} ms per batch "
                   f"(worst {worst:.0f} ms) |")
    for engine in engines:
        rate = statistics.median(r["records_per_s"] for r in wc[engine])
        out.append(f"| word count, 1M words per batch | {engine} | {rate:,.0f} words/s of processing time |")
    ratio = (statistics.median(r["records_per_s"] for r in wc["sparkwal"])
             / statistics.median(r["records_per_s"] for r in wc["pyspark.streaming"]))
    out.append(f"| word count throughput, sparkwal / pyspark.streaming | | {ratio:.2f} (goal >= 1) |")
    print("\n".join(out))
    sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
