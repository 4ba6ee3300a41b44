"""Socket word count through a receiver with its WAL on: sparkwal and pyspark.streaming in one run.

    python -m benchmarks.receiver_bench [--seconds 20] [--warmup 10] [--workloads receive,wordcount]
        [--engines sparkwal,sparkwal-noprecompute,pyspark]

For each workload and engine, a fresh app (subprocess, local[2], 1 s batches, checkpoint set,
``spark.streaming.receiver.writeAheadLog.enable=true``) reads ``socketTextStream`` from a TCP server
in this process that sends 10-word lines as fast as they are taken:

* ``receive``: the receiver alone, batches with no job (records/s is what the receiver stored);
* ``wordcount``: flatMap/map/reduceByKey per batch, counted, with backpressure on in both engines
  (``spark.streaming.backpressure.enabled``, initial rate 100,000 lines/s): processing is slower
  than the source, so each engine's PID estimator converges to what it can process per batch, and
  records/s is that rate. (Without a rate, pyspark.streaming's driver runs out of heap within
  ~10 s here; see ``receiver_flow``.)

``sparkwal`` runs with its defaults, under which the receiver runs the word count's ``flatMap``,
``map`` and the map side of ``reduceByKey`` on each block as it stores it
(``spark.sparkwal.receiver.precompute``, docs/receivers.md); ``sparkwal-noprecompute`` turns that off
(every batch reads its blocks in a Spark job, as pyspark.streaming does).

Each app first runs ``--warmup`` seconds (JVM JIT, Python workers, the first jobs), discarded; then
the batches whose time falls in the next ``--seconds`` are measured, alike for both engines: records/s
(records of those batches / the window), processing and scheduling delay (p50, max), and the fraction
of their records that were fsync'd to the receiver WAL before the batch ran. sparkwal stores a block
durably (fsync) before reporting it, and the app counts, per batch, the records of blocks carrying a
WAL handle; Spark's receiver WAL writes with hflush and never fsyncs
(FileBasedWriteAheadLogWriter.scala), so its fraction
is 0 by construction.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from .receiver_flow import FastSource

WORDS_LINE = b"spark stream wal checkpoint batch driver executor record block offset\n"
ENGINES = ("sparkwal", "sparkwal-noprecompute", "pyspark")


def app(args) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster(args.master).setAppName(f"receiver-bench-{args.engine}")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.streaming.receiver.writeAheadLog.enable", args.wal))
    if args.workload == "wordcount":  # both engines converge to what a batch can process
        conf.set("spark.streaming.backpressure.enabled", "true")
        conf.set("spark.streaming.backpressure.initialRate", "100000")
    if args.engine.startswith("sparkwal"):  # off local mode: the executors' workers set up (sparkwal is
        from sparkwal.engine import prepare_conf  # installed in the executors' Python here)

        conf = prepare_conf(conf.setIfMissing("spark.sparkwal.shipCode", "false"))
        if args.engine == "sparkwal-noprecompute":
            conf.set("spark.sparkwal.receiver.precompute", "false")
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    if args.engine.startswith("sparkwal"):
        from sparkwal.engine import StreamingContext, StreamingListener
    else:
        from pyspark.streaming import StreamingContext
        from pyspark.streaming.listener import StreamingListener
    ssc = StreamingContext(sc, 1.0)
    ssc.checkpoint(os.path.join(args.workdir, "ckpt"))

    class Emit(StreamingListener):
        def onBatchCompleted(self, e):
            info = e.batchInfo()
            t = info.batchTime().milliseconds()
            durable = None
            tracker = getattr(ssc, "receivedBlockTracker", None)
            if tracker is not None and not callable(tracker):
                durable = sum(b.num_records or 0 for bs in tracker.get_blocks_of_batch(t).values()
                              for b in bs if b.wal_handle is not None)
            print(json.dumps({"batch_ms": t, "records": info.numRecords(), "durable": durable,
                              "at_ms": int(time.time() * 1000),
                              "processing_ms": info.processingDelay(),
                              "scheduling_ms": info.schedulingDelay()}), flush=True)

    ssc.addStreamingListener(Emit())
    lines = ssc.socketTextStream("127.0.0.1", args.port)
    if args.workload == "wordcount":
        def count(rdd) -> None:
            rdd.count()

        lines.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b).foreachRDD(count)
    else:
        lines.foreachRDD(lambda rdd: None)  # an output so the stream runs; no job touches the data
    print(json.dumps({"started_ms": int(time.time() * 1000)}), flush=True)
    ssc.start()
    ssc.awaitTerminationOrTimeout(args.seconds)
    ssc.stop(stopSparkContext=True, stopGraceFully=False)


def measure(engine: str, workload: str, warmup: float, seconds: float, master: str = "local[2]",
            wal: bool = True, on_started=None) -> dict:
    """One app's run; ``on_started(events, source_port)``, if given, runs in a thread once the
    app started (the executor-kill benchmark kills from there)."""
    source = FastSource(WORDS_LINE)
    workdir = tempfile.mkdtemp(prefix=f"receiver-bench-{engine}-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.receiver_bench", "app", "--engine", engine, "--workload", workload,
         "--port", str(source.port), "--seconds", str(warmup + seconds + 2), "--workdir", workdir,
         "--master", master, "--wal", "true" if wal else "false"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1"))
    events: list[dict] = []
    reader = threading.Thread(target=lambda: [events.append(json.loads(x)) for x in proc.stdout
                                              if x.startswith("{")], daemon=True)
    reader.start()
    if on_started is not None:
        threading.Thread(target=on_started, args=(events, source.port), daemon=True).start()
    try:
        proc.wait(warmup + seconds + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        source.close()
    reader.join(5)
    started = next((e["started_ms"] for e in events if "started_ms" in e), None)
    batches = [e for e in events if "batch_ms" in e and started is not None
               and started + warmup * 1000 < e["batch_ms"] <= started + (warmup + seconds) * 1000]
    note = ""
    if not batches and proc.returncode not in (0, None):
        # the app died before the window (pyspark.streaming's driver runs out of heap here when
        # nothing limits the source): report the rate of the batches it did complete, and when
        done = [e for e in events if "batch_ms" in e and e["records"]]
        if done and started is not None:
            batches = done
            seconds = (done[-1]["batch_ms"] - done[0]["batch_ms"]) / 1000 + 1
            lived_s = round((done[-1]["batch_ms"] - started) / 1000)
            note = f"died (exit {proc.returncode}) {lived_s} s after start; rate before"
    records = sum(b["records"] for b in batches)
    durable = [b["durable"] for b in batches if b["durable"] is not None]
    proc_ms = [b["processing_ms"] for b in batches if b["processing_ms"] is not None]
    sched_ms = [b["scheduling_ms"] for b in batches if b["scheduling_ms"] is not None]
    return {
        "engine": engine, "workload": workload, "batches": len(batches),
        "records_per_s": round(records / seconds),
        "processing_p50_ms": statistics.median(proc_ms) if proc_ms else None,
        "processing_max_ms": max(proc_ms, default=None),
        "scheduling_p50_ms": statistics.median(sched_ms) if sched_ms else None,
        "scheduling_max_ms": max(sched_ms, default=None),
        "fsynced_fraction": (round(sum(durable) / records, 3) if durable and records
                             else (0.0 if engine == "pyspark" else None)),
        "durability": ("receiver WAL off: 2 copies on executors" if not wal else
                       "fsync per block before it is reported" if engine.startswith("sparkwal") else
                       "hflush, never fsync"),
        "note": note, "events": events,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "app":
        ap = argparse.ArgumentParser()
        ap.add_argument("--engine", required=True)
        ap.add_argument("--workload", required=True)
        ap.add_argument("--port", type=int, required=True)
        ap.add_argument("--seconds", type=float, required=True)
        ap.add_argument("--workdir", required=True)
        ap.add_argument("--master", default="local[2]")
        ap.add_argument("--wal", default="true")
        app(ap.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--workloads", default="receive,wordcount")
    ap.add_argument("--engines", default=",".join(ENGINES))
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        print(f"receiver_bench: unknown engine {unknown[0]!r} ({', '.join(ENGINES)})", file=sys.stderr)
        return 2
    print("| workload | engine | records/s | processing p50 / max ms | scheduling p50 / max ms "
          "| fsync'd before processing | durability |")
    print("|---|---|---:|---:|---:|---:|---|")
    rows = []
    for workload in args.workloads.split(","):
        done = {}
        for engine in engines:
            r = done[engine] = measure(engine, workload, args.warmup, args.seconds)
            rows.append(r)
            name = f"{engine} ({r['note']})" if r["note"] else engine
            print(f"| {workload} | {name} | {r['records_per_s']:,} | {r['processing_p50_ms']} / "
                  f"{r['processing_max_ms']} | {r['scheduling_p50_ms']} / {r['scheduling_max_ms']} | "
                  f"{r['fsynced_fraction']} | {r['durability']} |", flush=True)
        for a, b, said in (("sparkwal", "pyspark", "sparkwal / pyspark.streaming"),
                           ("sparkwal", "sparkwal-noprecompute", "sparkwal / sparkwal without precompute")):
            if a in done and b in done and done[b]["records_per_s"]:
                ratio = done[a]["records_per_s"] / done[b]["records_per_s"]
                print(f"| {workload} | {said} | {ratio:.2f} | | | | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
