"""What an empty batch costs: sparkwal (with and without its empty-batch shortcut) and
pyspark.streaming, 100 ms batches of a socket receiver that receives nothing, in one run.

    python -m benchmarks.empty_batch_bench [--seconds 15] [--interval-ms 100]

Each app (a subprocess on ``local[3]``, receiver WAL on) counts words per batch (``flatMap``,
``map``, ``reduceByKey`` into two partitions, ``collect``), the issue's "empty batch with two
tasks". The source accepts the receiver's connection and sends nothing. Reported: the batches'
processing time (p50, p95) after 5 s of warm-up, and, for sparkwal, the median batch's breakdown.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.latency_bench import flat_breakdown


def app(args) -> None:
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[3]").setAppName("empty-batches").set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.streaming.receiver.writeAheadLog.enable", "true")
            .set("spark.sparkwal.emptyBatch.shortcut", "true" if args.engine == "sparkwal" else "false"))
    if args.engine == "pyspark":
        from pyspark.streaming import StreamingContext
        from pyspark.streaming.listener import StreamingListener
    else:
        from sparkwal import StreamingContext, StreamingListener
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    ssc = StreamingContext(sc, args.interval_ms / 1000)
    ssc.checkpoint(args.workdir)

    class Batches(StreamingListener):
        def onBatchCompleted(self, e):
            info = e.batchInfo()
            phases = flat_breakdown(info) if engine_is_sparkwal else {}  # (pyspark.streaming's has none)
            print(json.dumps({"processing_ms": info.processingDelay(), "records": info.numRecords(),
                              "breakdown": phases}), flush=True)

    engine_is_sparkwal = args.engine != "pyspark"
    ssc.addStreamingListener(Batches())
    ssc.socketTextStream("127.0.0.1", args.port).flatMap(str.split).map(lambda w: (w, 1)) \
        .reduceByKey(lambda a, b: a + b, 2).foreachRDD(lambda rdd: rdd.collect())
    ssc.start()
    ssc.awaitTermination()


def measure(engine: str, interval_ms: int, seconds: float) -> dict:
    server = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(4)), daemon=True).start()

    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.empty_batch_bench", "app", "--engine", engine,
         "--interval-ms", str(interval_ms), "--port", str(server.getsockname()[1]),
         "--workdir", tempfile.mkdtemp(prefix="empty-batches-")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))
    events: list[dict] = []
    threading.Thread(target=lambda: events.extend(json.loads(line) for line in proc.stdout
                                                  if line.startswith("{")), daemon=True).start()
    deadline = time.monotonic() + 120
    while not events and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(5)  # warm-up
    warm = len(events)
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    server.close()
    window = [e for e in events[warm:] if e["records"] == 0 and e["processing_ms"] >= 0]
    times = sorted(e["processing_ms"] for e in window)
    if not times:
        return {"engine": engine, "batches": 0}
    median = sorted(window, key=lambda e: e["processing_ms"])[len(window) // 2]
    return {"engine": engine, "batches": len(times), "p50": statistics.median(times),
            "p95": times[int(0.95 * len(times))], "breakdown": median["breakdown"]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "app":
        ap = argparse.ArgumentParser()
        for name, kind in (("--engine", str), ("--interval-ms", int), ("--port", int), ("--workdir", str)):
            ap.add_argument(name, type=kind, required=True)
        app(ap.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--interval-ms", type=int, default=100)
    args = ap.parse_args(argv)
    print("| engine | empty batches | processing p50 ms | p95 ms | median batch's breakdown (ms) |")
    print("|---|---:|---:|---:|---|")
    for engine in ("sparkwal", "sparkwal-no-shortcut", "pyspark"):
        r = measure(engine, args.interval_ms, args.seconds)
        phases = ", ".join(f"{k} {v:g}" for k, v in (r.get("breakdown") or {}).items()) or "-"
        print(f"| {engine} | {r['batches']} | {r.get('p50')} | {r.get('p95')} | {phases} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
