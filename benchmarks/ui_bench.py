"""Observability benchmark: what the events, the event log, the UI and the metrics cost, in one run.

    python -m benchmarks.ui_bench [--runs 3] [--seconds 30] [--quick]

Rows:

* ``main job, everything on / off``: the main job (``python -m sparkwal.engine.wordcount``, 0.5 s batches,
  its bundled generator, a local checkpoint) run as a subprocess with its defaults (UI, metrics,
  event log on) and with ``spark.ui.enabled=false`` + ``spark.sparkwal.eventLog.enabled=false``,
  alternating, ``--runs`` times each; per run the median processing time of its batches that read
  one file (the first 2, warm-up, left out), as the job's own ``batch_completed`` events report it. The
  cost is the difference of the medians of runs. Durability: the same in both (checkpoints and
  state fsync'ed; the event log is flushed to the OS, not fsync'ed).
* ``paired, one SparkContext``: the same comparison without two JVMs' and two generators' noise:
  one process, one SparkContext (so Spark's own UI and listeners are alike in both), contexts
  alternating off/on (``--rounds`` pairs, which goes first alternating too), each running 20
  batches of the main job's kind (20,000 lines of 10 words, reduceByKey, updateStateByKey, a
  checkpoint) back to back on a manual clock; the median of the rounds' differences.
* ``recorder CPU per batch``: the events of one batch (submitted, started, 2 output operations
  started and completed, completed, a checkpoint written) posted through the driver's EventBus to
  the recorder with its metrics and a local event log, 5000 times: the driver's CPU per batch, and
  that as a share of a 0.5 s batch. No Spark: this is the part of the first row's difference that
  the recording itself costs, measured without the noise of Spark jobs.
* ``REST and page response``: a live app (local[2], a manual clock advanced 0.5 s every 0.5 s while
  measured, so batches keep completing) with 1000 retained batches, run for real; each endpoint
  asked ``--requests`` times over HTTP on 127.0.0.1 (``served``: what a client waits, the UI's
  render cache included, which holds a view until the next event), and each time rendered again
  in-process with nothing cached (``rendered``: the worst case, a view asked for right after a
  batch): p50 and p99.
* ``memory``: Python heap held by a run's status and metrics (tracemalloc) after 5000 batches of the
  main job's shape, at retainedBatches 1000 and 100.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
OFF = ["--conf", "spark.ui.enabled=false", "--conf", "spark.sparkwal.eventLog.enabled=false"]


def main_job_run(on: bool, seconds: float) -> list[int]:
    work = tempfile.mkdtemp(prefix="ui-bench-")
    try:
        args = [sys.executable, "-m", "sparkwal.engine.wordcount", "--dir", work, "--json", "--batch", "0.5",
                "--seconds", str(seconds), "--files", str(int(seconds * 2)), "--conf", "spark.sparkwal.ui.port=0"]
        out = subprocess.run(args + ([] if on else OFF), capture_output=True, text=True, env=ENV, cwd=ROOT,
                             timeout=seconds + 120)
        if out.returncode != 0:
            raise SystemExit(f"the main job failed: {out.stderr[-500:]}")
        events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        # batches that read one file each: a batch with none does a fraction of the work, and how
        # many of each a run gets depends on timing (a median over both flips between them)
        return [e["processing_ms"] for e in events if e.get("event") == "batch_completed" and e["files"] == 1][2:]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main_job_rows(runs: int, seconds: float) -> dict:
    medians = {True: [], False: []}
    for i in range(runs * 2):
        on = i % 2 == 1
        medians[on].append(statistics.median(main_job_run(on, seconds)))
        print(f"  main job run {i + 1}/{runs * 2} ({'on' if on else 'off'}): p50 {medians[on][-1]:.0f} ms",
              flush=True)
    off, on = statistics.median(medians[False]), statistics.median(medians[True])
    return {"off_ms": off, "on_ms": on, "cost_pct": 100 * (on - off) / off,
            "runs_off": medians[False], "runs_on": medians[True]}


def _spark_context():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    sc = SparkContext.getOrCreate(SparkConf().setMaster("local[2]").setAppName("ui-bench")
                                  .set("spark.driver.host", "127.0.0.1").set("spark.sparkwal.ui.port", "0")
                                  .set("spark.ui.showConsoleProgress", "false"))
    sc.setLogLevel("ERROR")
    return sc


def paired_rows(rounds: int, batches: int = 20) -> dict:
    """One SparkContext; per round a context with everything off, then one with everything on
    (its driver's conf changed before start), each running the main job's kind of batch (words
    counted with reduceByKey, running totals with updateStateByKey, a checkpoint) back to back on a
    manual clock: the median processing time of each, and the round's difference. Spark's own UI is
    the same in both (one SparkContext): the difference is sparkwal's recording, log, UI and metrics."""
    import operator

    from sparkwal.engine import StreamingContext, StreamingListener
    from sparkwal.wal import ManualClock

    sc = _spark_context()
    lines = sc.parallelize([f"{i} " + " ".join(f"w{(i * 7 + k) % 500}" for k in range(10)) for i in range(20_000)], 4)
    lines.cache().count()

    def run(on: bool) -> float:
        work = tempfile.mkdtemp(prefix="ui-bench-ab-")
        done, cond = [], threading.Condition()

        started: dict[int, float] = {}

        class Times(StreamingListener):  # wall time: the batch times are the manual clock's
            def onBatchStarted(self, e):
                started[e.batchInfo().batch_time_ms] = time.perf_counter()

            def onBatchCompleted(self, e):
                took = (time.perf_counter() - started[e.batchInfo().batch_time_ms]) * 1000
                with cond:
                    done.append(took)
                    cond.notify_all()
        clock = ManualClock(0)
        live = sc._jsc.sc().conf()  # the driver reads its settings when it is made
        live.set("spark.ui.enabled", "true" if on else "false")
        live.set("spark.sparkwal.eventLog.enabled", "true" if on else "false")
        ssc = StreamingContext(sc, 0.5, clock=clock)
        ssc.checkpoint(os.path.join(work, "cp"))
        words = ssc.queueStream([], default=lines).flatMap(str.split).map(lambda w: (w, 1))
        words.reduceByKey(operator.add).updateStateByKey(lambda new, old: sum(new) + (old or 0)).foreachRDD(
            lambda rdd: rdd.count())
        ssc.addStreamingListener(Times())
        ssc.start()
        try:
            for i in range(batches):
                clock.advance(500)
                with cond:
                    cond.wait_for(lambda: len(done) > i, 120)
        finally:
            ssc.stop(stopSparkContext=False)
            shutil.rmtree(work, ignore_errors=True)
        return statistics.median(done[3:])

    run(True)  # warm-up: JIT, Python workers, caches
    diffs, offs, ons = [], [], []
    for r in range(rounds):
        first_on = r % 2 == 1  # alternate which goes first
        a = run(first_on)
        b = run(not first_on)
        on, off = (a, b) if first_on else (b, a)
        ons.append(on)
        offs.append(off)
        diffs.append(100 * (on - off) / off)
        print(f"  paired round {r + 1}/{rounds}: off {off:.0f} ms, on {on:.0f} ms ({diffs[-1]:+.1f}%)", flush=True)
    return {"off_ms": statistics.median(offs), "on_ms": statistics.median(ons), "cost_pct": statistics.median(diffs),
            "diffs": diffs}


def recorder_cpu(batches: int = 5000) -> dict:
    from sparkwal.engine.driver.events import EventBus
    from sparkwal.engine.listener import (StreamingListenerBatchCompleted, StreamingListenerBatchStarted,
                                 StreamingListenerBatchSubmitted, StreamingListenerCheckpointWritten,
                                 StreamingListenerOutputOperationCompleted, StreamingListenerOutputOperationStarted)
    from sparkwal.checkpoint.event_log import EventLogWriter
    from sparkwal.engine.ui.metrics import Metrics
    from sparkwal.engine.ui.recorder import Recorder
    from sparkwal.engine.ui.status import RunStatus
    from sparkwal.tracker import BatchInfo
    from sparkwal.tracker.input_info import OutputOperationInfo, StreamInputInfo
    from sparkwal.wal import ManualClock

    work = tempfile.mkdtemp(prefix="ui-bench-log-")
    try:
        run = {"kind": "new", "appId": "bench", "startTime": 0, "epoch": 1, "batchDuration": 500,
               "streams": [{"id": 0, "name": "File Stream [0]", "receiver": False}]}
        status, metrics = RunStatus(run, 1000), Metrics()
        writer = EventLogWriter(os.path.join(work, "events"), run, retained_batches=1000)
        clock = ManualClock(0)
        bus = EventBus()
        bus.subscribe(Recorder(status, metrics, writer, clock=clock))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(batches):
            t = (i + 1) * 500
            inputs = {0: StreamInputInfo(0, 30, {"files": 1})}
            ops = {k: OutputOperationInfo(t, k, "foreachRDD", t + 1, t + 200, None, (2 * i + k,)) for k in (0, 1)}
            bus.post(StreamingListenerBatchSubmitted(BatchInfo(t, inputs, t)))
            bus.post(StreamingListenerBatchStarted(BatchInfo(t, inputs, t, t + 1)))
            for k in (0, 1):
                bus.post(StreamingListenerOutputOperationStarted(OutputOperationInfo(t, k, "foreachRDD", t + 1)))
                bus.post(StreamingListenerOutputOperationCompleted(ops[k]))
            bus.post(StreamingListenerBatchCompleted(BatchInfo(t, inputs, t, t + 1, t + 200, ops)))
            bus.post(StreamingListenerCheckpointWritten(t, 1, 3))
        writer.flush(60)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        writer.close()
        per_batch_us = cpu / batches * 1e6  # the writer thread's CPU included (process time)
        return {"batches": batches, "cpu_us_per_batch": per_batch_us, "share_of_0_5s_pct": per_batch_us / 5000,
                "wall_us_per_batch": wall / batches * 1e6, "log_bytes": writer.statistics().bytes_written}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rest_latency(requests: int) -> dict:
    from sparkwal.engine import StreamingContext, StreamingListener
    from sparkwal.wal import ManualClock

    sc = _spark_context()
    work = tempfile.mkdtemp(prefix="ui-bench-rest-")
    done, cond = [0], threading.Condition()

    class Count(StreamingListener):
        def onBatchCompleted(self, e):
            with cond:
                done[0] += 1
                cond.notify_all()

    clock = ManualClock(0)
    ssc = StreamingContext(sc, 0.5, clock=clock)
    ssc.checkpoint(os.path.join(work, "cp"))
    rdd = sc.parallelize(range(100), 2).cache()
    ssc.queueStream([], default=rdd).foreachRDD(lambda r: r.count())
    ssc.addStreamingListener(Count())
    ssc.start()
    try:
        began = time.monotonic()
        for i in range(1000):
            clock.advance(500)
            with cond:
                cond.wait_for(lambda: done[0] > i, 60)
        fill_s = time.monotonic() - began
        stop = threading.Event()

        def keep_running():
            while not stop.wait(0.5):  # the app at its own pace: a 0.5 s batch every 0.5 s
                clock.advance(500)
        ticker = threading.Thread(target=keep_running, daemon=True)
        ticker.start()
        base, app = ssc.uiWebUrl, sc.applicationId
        api = f"{base}/api/v1/applications/{app}/streaming"
        newest = json.loads(urllib.request.urlopen(f"{api}/batches").read())[0]["batchId"]
        paths = {"statistics": f"{api}/statistics", "batches (1000)": f"{api}/batches",
                 "batches/{id}": f"{api}/batches/{newest}", "operations": f"{api}/batches/{newest}/operations",
                 "page /streaming/": f"{base}/streaming/", "batch page": f"{base}/streaming/batch/?id={newest}",
                 "/metrics": f"{base}/metrics"}
        from sparkwal.engine.ui import Catalog
        from sparkwal.engine.ui.routes import respond

        live = ssc.driver.observer.status

        def pct(times, q):
            times = sorted(times)
            return times[min(len(times) - 1, int(len(times) * q))]
        rows = {}
        for name, url in paths.items():
            urllib.request.urlopen(url).read()  # warm
            served, rendered = [], []
            for _ in range(requests):
                t0 = time.perf_counter()
                body = urllib.request.urlopen(url).read()
                served.append((time.perf_counter() - t0) * 1000)
                target = url.removeprefix(base)
                fresh = Catalog(None, live=live, metrics=ssc.driver.observer.metrics)  # nothing cached
                t0 = time.perf_counter()
                respond(fresh, target)
                rendered.append((time.perf_counter() - t0) * 1000)
            rows[name] = {"p50_ms": pct(served, 0.5), "p99_ms": pct(served, 0.99), "bytes": len(body),
                          "render_p50_ms": pct(rendered, 0.5), "render_p99_ms": pct(rendered, 0.99)}
        stats = json.loads(urllib.request.urlopen(f"{api}/statistics").read())
        stop.set()
        ticker.join()
        return {"retained": stats["numRetainedCompletedBatches"], "completed": stats["numTotalCompletedBatches"],
                "fill_s": fill_s, "rows": rows}
    finally:
        ssc.stop(stopSparkContext=False)
        shutil.rmtree(work, ignore_errors=True)


def memory(retained: int, batches: int = 5000) -> int:
    from sparkwal.engine.ui.metrics import Metrics
    from sparkwal.engine.ui.status import RunStatus

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    status, metrics = RunStatus({"batchDuration": 500, "streams": [{"id": 0, "name": "File Stream [0]"}]},
                                retained), Metrics()
    for i in range(batches):
        t = (i + 1) * 500
        record = {"event": "batch", "time": t + 200, "batchTime": t, "submissionTime": t, "processingStartTime": t + 1,
                  "processingEndTime": t + 200, "inputs": {"0": 30}, "numOutputOps": 2,
                  "ops": [{"id": k, "name": "foreachRDD", "description": "foreachRDD", "startTime": t + 1,
                           "endTime": t + 200, "failureReason": None, "jobIds": [2 * i + k]} for k in (0, 1)]}
        status.apply(record)
        status.apply({"event": "checkpoint", "time": t + 210, "checkpointTime": t, "epoch": 1, "tookMs": 3})
        metrics.on_batch(record, 0)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del status, metrics
    return held


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the cost of events, event log, UI and metrics")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10, help="paired in-process rounds")
    ap.add_argument("--quick", action="store_true", help="1 run each, 15 s, 50 requests")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.seconds, args.requests, args.rounds = 1, 15, 50, 2
    print("main job, everything on / off (0.5 s batches):", flush=True)
    job = main_job_rows(args.runs, args.seconds)
    cpu = recorder_cpu()
    mem = {r: memory(r) for r in (1000, 100)}
    print("paired in one process (0.5 s batches of the main job's kind, back to back):", flush=True)
    paired = paired_rows(args.rounds)
    rest = rest_latency(args.requests)
    print("\n| row | figure |\n|---|---|")
    for side in ("off", "on"):
        runs = ", ".join(f"{x:.0f}" for x in job[f"runs_{side}"])
        print(f"| main job batch processing p50, {side} | {job[f'{side}_ms']:.0f} ms (runs {runs}) |")
    print(f"| cost, end to end | {job['cost_pct']:+.1f}% |")
    print(f"| paired, one SparkContext: batch processing p50 off / on | {paired['off_ms']:.0f} ms / "
          f"{paired['on_ms']:.0f} ms |")
    print(f"| cost, paired (median of {args.rounds} rounds' differences) | {paired['cost_pct']:+.1f}% "
          f"(rounds {', '.join(f'{d:+.1f}' for d in paired['diffs'])}) |")
    print(f"| recorder CPU per batch (7 events, metrics, event log) | {cpu['cpu_us_per_batch']:.0f} µs "
          f"= {cpu['share_of_0_5s_pct']:.3f}% of a 0.5 s batch |")
    print(f"| memory, retainedBatches 1000 / 100 (5000 batches fed) | {mem[1000] / 1e6:.2f} MB / "
          f"{mem[100] / 1e6:.2f} MB |")
    print(f"\nREST and pages, {rest['retained']} retained of {rest['completed']} batches, app running "
          f"(1000 batches filled in {rest['fill_s']:.0f} s):\n\n| endpoint | served p50 ms | served p99 ms | "
          "rendered, no cache, p50 ms | p99 ms | bytes |\n|---|---:|---:|---:|---:|---:|")
    for name, r in rest["rows"].items():
        print(f"| {name} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['render_p50_ms']:.1f} | "
              f"{r['render_p99_ms']:.1f} | {r['bytes']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
