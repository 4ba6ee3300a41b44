"""Record-to-output latency: sparkwal, pyspark.streaming and Structured Streaming in one run.

    python -m benchmarks.latency_bench [--seconds 20] [--warmup 10] [--intervals 100,250,500,1000]
        [--rates 20000] [--pipelines stateless,stateful] [--engines sparkwal,sparkwal-noprecompute,pyspark,structured]
        [--conf KEY=VALUE ...] [--json FILE]

A paced TCP source in this process sends ``--rates`` lines a second (10 words each, stamped with
the wall-clock millisecond they were sent, in slices every 2 ms) to one app at a time, a
subprocess on ``local[3]`` (sparkwal and pyspark.streaming: one slot for the receiver, two for the
batches; Structured Streaming's socket source reads on the driver). Each app runs the same
pipeline:

* ``stateless``: the words of a batch counted (``reduceByKey``; in Structured Streaming a
  ``groupBy().count()`` inside ``foreachBatch``), collected to the driver;
* ``stateful``: running counts: sparkwal's ``mapWithState`` (the keys a batch touched),
  pyspark.streaming's ``updateStateByKey`` (it has no ``mapWithState`` in Python; the keys a batch
  touched are output), Structured Streaming's own streaming aggregation (``outputMode("update")``
  into ``foreachBatch``).

Every line also counts under the key of its send time's 10 ms slot, in the same aggregation as its
words, so a batch's output says how many of its records were sent in each slot (10 ms, not 1 ms: a
stateful engine keeps every key it has seen, and 100 slot keys a second keep that state small beside
the words'; a record's send time is taken as its slot's middle, within 5 ms). When the output is
collected (visible to the app), the app prints one JSON line: that time and those counts. A
record's latency is the time its batch's output became visible minus its send time, measured the
same way for all three. Only records sent inside the window (``--warmup`` seconds after the first
output, for ``--seconds``) count: records out must equal records in.

Fair to the anchor: the source starts pacing after each app's first output (Spark's socket source
fetches row i of a micro-batch from a linked list by position, so a backlog at its start is slow
for a reason that is not its engine); ``spark.sql.shuffle.partitions`` is 2 (its default 200 would
run 200 tasks a batch on two cores); the receivers' block interval is half the batch interval, at
most Spark's 200 ms; each row reports its largest batch. Durability: sparkwal fsyncs each receiver
block before it is reported; pyspark.streaming's receiver WAL (Spark's ``FileBasedWriteAheadLog``)
flushes, never fsyncs; Structured Streaming's socket source keeps no data log (its offsets are
checkpointed, the lines are not).

After the table: Spark's own floor for a short batch of the stateless pipeline (the same RDDs as
one plain PySpark job, warmed, nothing else running: what no engine that runs a Spark job per batch
can go under on this machine), and where the median batch's time went in each sparkwal row (its
``BatchInfo.breakdown`` and its output operation's ``submit``/``tasks``/``collect``, in ms).

``sparkwal`` runs with sparkwal's defaults, ``spark.sparkwal.receiver.precompute`` on among them (the
receiver runs the per-record operations and the map side of ``reduceByKey`` on each block as its
records arrive; docs/receivers.md); ``sparkwal-noprecompute`` turns it off (every batch reads its
blocks in a Spark job); ``sparkwal-precompute`` sets it and one block a batch interval, cut on each
batch time; ``sparkwal-perblock`` (stateless only) outputs each block's counts with ``foreachBlock``
as soon as the block is recorded, before its batch (at least once; docs/receivers.md).

A row keeps up when the median latency of the window's last fifth is within the median of its
first fifth plus one batch interval (a backlog that grows shows as growing latency).
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

WORDS = "spark stream wal checkpoint batch driver executor record block offset"
TS_KEY = "\x00ts:"  # the key each line also counts under: its send time's slot
SLOT_MS = 10
DURABILITY = {"sparkwal": "receiver WAL, fsync per block", "sparkwal-precompute": "receiver WAL, fsync per block",
              "sparkwal-noprecompute": "receiver WAL, fsync per block",
              "sparkwal-perblock": "receiver WAL, fsync per block; each block out at least once",
              "pyspark": "receiver WAL, hflush (no fsync)",
              "structured": "no data log (socket source)"}


# ---------------------------------------------------------------------------- the source (bench side)


class PacedSource:
    """Sends ``rate`` stamped lines a second to the one app connected, from :meth:`go` on."""

    def __init__(self, rate: int):
        self.rate = rate
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sent_ms: list[float] = []  # the send time of every line sent, as its slot's middle
        self.stopped, self.started = threading.Event(), threading.Event()
        self.pacing = threading.Event()  # set once lines flow: started, and an app connected
        threading.Thread(target=self._serve, daemon=True).start()

    def go(self) -> None:
        self.started.set()

    def _serve(self) -> None:
        conns = []
        self.server.settimeout(0.2)
        while not (self.started.is_set() and conns) and not self.stopped.is_set():
            try:
                conns.append(self.server.accept()[0])
            except OSError:
                continue
        if not conns or self.stopped.is_set():
            return
        conn = conns[-1]  # a receiver restarted before the start connects again: the newest
        start, sent = time.monotonic(), 0
        self.pacing.set()
        try:
            while not self.stopped.is_set():
                due = int((time.monotonic() - start) * self.rate)
                if due > sent:
                    now_ms = int(time.time() * 1000)
                    line = f"{now_ms // SLOT_MS} {WORDS}\n".encode()
                    conn.sendall(line * (due - sent))
                    self.sent_ms.extend([now_ms // SLOT_MS * SLOT_MS + SLOT_MS / 2] * (due - sent))
                    sent = due
                self.stopped.wait(0.002)
        except OSError:
            pass
        conn.close()

    def close(self) -> None:
        self.stopped.set()
        self.server.close()


# ---------------------------------------------------------------------------- the apps (subprocess)


_OUT = threading.Lock()


def _line(event: dict) -> None:
    """One JSON line on stdout, whole: with concurrent jobs, outputs and the listener print from
    several threads at once."""
    with _OUT:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def _emit(batch_id, rows) -> None:
    """One batch's output is visible: its time and the counts of its keys (words and send ms)."""
    visible_ms = time.time() * 1000
    stamps = {k[len(TS_KEY):]: v for k, v in rows if isinstance(k, str) and k.startswith(TS_KEY)}
    from benchmarks.latency_bench import _line  # by name: the app runs as __main__, whose functions are pickled whole

    _line({"visible_ms": visible_ms, "batch": batch_id, "rows": len(rows), "stamps": stamps})


def _keys(line: str) -> list:
    ts, _, text = line.partition(" ")
    return [(w, 1) for w in text.split()] + [(TS_KEY + ts, 1)]


def _running_total(key, value, state):
    total = (state.get() if state.exists() else 0) + (value or 0)
    state.update(total)
    return key, total


def _touched_total(new_values, old):
    """updateStateByKey's running count; a key the batch did not touch is dropped, so that the
    whole state is what the batch touched (every line holds every word: only the send-time
    slots go, once output, as they would time out of a real app's state)."""
    n = sum(new_values)
    return (old or 0) + n if n else None


def flat_breakdown(info) -> dict:
    """A sparkwal BatchInfo's breakdown with each output operation's, as ``op<id>.<phase>``."""
    phases = dict(info.breakdown)
    for op_id, op in sorted(info.outputOperationInfos().items()):
        phases.update({f"op{op_id}.{k}": v for k, v in op.breakdown.items()})
    return phases


def dstream_app(args) -> None:
    from pyspark import SparkConf, SparkContext

    conf = _conf(SparkConf(), args).set("spark.streaming.receiver.writeAheadLog.enable", "true")
    if args.engine == "sparkwal-precompute":  # one block a batch, cut on its time
        conf.set("spark.sparkwal.receiver.precompute", "true")
        conf.set("spark.streaming.blockInterval", f"{min(200, args.interval_ms)}ms")
    elif args.engine == "sparkwal-noprecompute":
        conf.set("spark.sparkwal.receiver.precompute", "false")
    if not any(c.startswith("spark.streaming.blockInterval=") for c in args.conf) and not conf.contains(
            "spark.streaming.blockInterval"):
        conf.set("spark.streaming.blockInterval", f"{min(200, args.interval_ms // 2)}ms")
    engine_is_sparkwal = args.engine.startswith("sparkwal")
    if engine_is_sparkwal:
        from sparkwal import StreamingContext, StreamingListener
        from sparkwal.engine import StateSpec
    else:
        from pyspark.streaming import StreamingContext
        from pyspark.streaming.listener import StreamingListener
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    ssc = StreamingContext(sc, args.interval_ms / 1000)
    ssc.checkpoint(os.path.join(args.workdir, "ckpt"))

    class Delays(StreamingListener):
        def onBatchCompleted(self, e):
            info = e.batchInfo()
            phases = flat_breakdown(info) if engine_is_sparkwal else {}  # (pyspark.streaming's has none)
            from benchmarks.latency_bench import _line

            _line({"batch_ms": info.batchTime().milliseconds(), "records": info.numRecords(),
                   "processing_ms": info.processingDelay(), "scheduling_ms": info.schedulingDelay(),
                   "breakdown": phases})

    ssc.addStreamingListener(Delays())
    counts = ssc.socketTextStream("127.0.0.1", args.port).flatMap(_keys).reduceByKey(lambda a, b: a + b)
    if args.pipeline == "stateful" and engine_is_sparkwal:
        counts = counts.mapWithState(StateSpec.function(_running_total))
    elif args.pipeline == "stateful":
        counts = counts.updateStateByKey(_touched_total)
    if args.engine == "sparkwal-perblock":  # each block's counts out as soon as it is recorded
        counts.foreachBlock(lambda t, rdd: _emit(int(t.timestamp() * 1000), rdd.collect()))
    else:
        counts.foreachRDD(lambda t, rdd: _emit(int(t.timestamp() * 1000), rdd.collect()))
    ssc.start()
    if args.engine == "sparkwal-perblock":  # (no batch output: tell the bench it runs)
        _emit(0, [])
    ssc.awaitTerminationOrTimeout(args.seconds)
    ssc.stop(stopSparkContext=True, stopGraceFully=False)


def structured_app(args) -> None:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.config(conf=_conf(SparkConf(), args)).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    lines = (spark.readStream.format("socket").option("host", "127.0.0.1").option("port", args.port).load())
    parts = F.split("value", " ")
    keys = lines.select(F.explode(F.concat(F.slice(parts, 2, 64), F.array(F.concat(F.lit(TS_KEY), parts[0]))))
                        .alias("key"))
    if args.pipeline == "stateful":
        def batch(df, batch_id):
            _emit(batch_id, [(r[0], r[1]) for r in df.collect()])

        query = keys.groupBy("key").count().writeStream.outputMode("update")
    else:
        def batch(df, batch_id):
            _emit(batch_id, [(r[0], r[1]) for r in df.groupBy("key").count().collect()])

        query = keys.writeStream
    running = (query.foreachBatch(batch).trigger(processingTime="0 seconds")
               .option("checkpointLocation", os.path.join(args.workdir, "ckpt")).start())
    running.awaitTermination(args.seconds)
    running.stop()
    spark.stop()


def floor_app(args) -> None:
    """Spark's own floor for one batch of the stateless pipeline: the same RDDs (two partitions of
    ``--lines`` stamped lines, ``flatMap``, ``reduceByKey``, ``collect``) built and run as a plain
    PySpark job, again and again on a warmed context with the same conf and nothing else running
    (no receiver, no WAL, no streaming engine); Python workers over Unix sockets where the Spark
    has them, as sparkwal sets them. Prints the p50 and p99 of a job's time, from building its
    RDDs to its results in the driver."""
    from pyspark import SparkConf, SparkContext

    conf = _conf(SparkConf(), args)
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    from sparkwal.engine.cluster import unix_sockets_for_workers  # as sparkwal's start() sets it

    unix_sockets_for_workers(sc)
    half = [f"{int(time.time() * 1000) // SLOT_MS} {WORDS}"] * max(1, args.lines // 2)
    times = []
    for n in range(40 + 100):
        start = time.perf_counter()
        sc.parallelize([half, half], 2).flatMap(lambda part: part).flatMap(_keys) \
            .reduceByKey(lambda a, b: a + b).collect()
        if n >= 40:  # warmed
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    print(json.dumps({"floor_lines": args.lines, "p50": round(statistics.median(times), 1),
                      "p99": round(times[int(0.99 * len(times))], 1)}), flush=True)
    sc.stop()


def spark_floor(lines: int) -> dict | None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.latency_bench", "app", "--engine", "floor", "--pipeline", "stateless",
         "--interval-ms", "0", "--port", "0", "--workdir", tempfile.gettempdir(), "--seconds", "0",
         "--lines", str(lines)],
        capture_output=True, text=True, timeout=600, start_new_session=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"floor_lines"')]
    return found[0] if found else None


def _conf(conf, args):
    for setting in args.conf:
        key, _, value = setting.partition("=")
        conf.set(key, value)
    return (conf.setMaster("local[3]").setAppName(f"latency-{args.engine}-{args.pipeline}")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1"))


# ---------------------------------------------------------------------------- one row


def measure(engine: str, pipeline: str, interval_ms: int, rate: int, warmup: float, seconds: float,
            conf: tuple[str, ...] = ()) -> dict:
    source = PacedSource(rate)
    workdir = tempfile.mkdtemp(prefix=f"latency-{engine}-")
    drain = 5 + 3 * interval_ms / 1000
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.latency_bench", "app", "--engine", engine, "--pipeline", pipeline,
         "--interval-ms", str(interval_ms), "--port", str(source.port), "--workdir", workdir,
         "--seconds", str(warmup + seconds + drain + 60), *(f"--conf={c}" for c in conf)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1"))
    events: list[dict] = []
    first_output = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))
                if "visible_ms" in events[-1]:
                    first_output.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not first_output.wait(120):
            return {"engine": engine, "pipeline": pipeline, "interval_ms": interval_ms, "rate": rate,
                    "error": "no output within 120 s"}
        source.go()  # (an app's first output may come before its receiver connects)
        if not source.pacing.wait(60):
            return {"engine": engine, "pipeline": pipeline, "interval_ms": interval_ms, "rate": rate,
                    "error": "the app did not connect to the source within 60 s of its first output"}
        go_ms = time.time() * 1000
        window = (go_ms + warmup * 1000, go_ms + (warmup + seconds) * 1000)
        time.sleep(warmup + seconds + drain)
    finally:
        source.close()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return summarize(engine, pipeline, interval_ms, rate, events, source.sent_ms, window)


def summarize(engine, pipeline, interval_ms, rate, events, sent_ms, window) -> dict:
    lo, hi = window
    sent = sum(1 for t in sent_ms if lo <= t < hi)
    latencies: list[tuple[float, float]] = []  # (send ms, latency ms), one per record
    totals: dict[str, int] = {}  # stateful outputs give running totals: this batch's records are the rise
    largest = 0
    for e in events:
        if "visible_ms" not in e:
            continue
        lines = 0
        for ts, count in e["stamps"].items():
            previous = totals.get(ts, 0) if pipeline == "stateful" else 0
            new = count - previous if count >= previous else count  # (a total dropped from state)
            totals[ts] = count
            lines += new
            t = int(ts) * SLOT_MS + SLOT_MS / 2
            if lo <= t < hi and new > 0:
                latencies.extend([(t, e["visible_ms"] - t)] * new)
        largest = max(largest, lines)
    latencies.sort()
    values = sorted(v for _, v in latencies)
    fifth = max(1, len(latencies) // 5)
    first = statistics.median(v for _, v in latencies[:fifth]) if latencies else None
    last = statistics.median(v for _, v in latencies[-fifth:]) if latencies else None
    delays = [e for e in events if "batch_ms" in e and lo <= e["batch_ms"] < hi]

    def pct(p: float):
        return round(values[min(len(values) - 1, int(p * len(values)))]) if values else None

    return {"engine": engine, "pipeline": pipeline, "interval_ms": interval_ms, "rate": rate,
            "records_in": sent, "records_out": len(values), "p50": pct(0.50), "p95": pct(0.95),
            "p99": pct(0.99), "max": round(values[-1]) if values else None,
            "keeps_up": bool(values) and last <= first + interval_ms,
            "processing_p50_ms": statistics.median(d["processing_ms"] for d in delays) if delays else None,
            "median_batch": median_batch(delays),
            "largest_batch": largest, "durability": DURABILITY[engine]}


def median_batch(delays: list[dict]) -> dict | None:
    """The batch of median processing time in the window: its processing and scheduling delay
    and where its time went (sparkwal's breakdown; pyspark.streaming reports none)."""
    timed = sorted((d for d in delays if d.get("processing_ms") is not None and d["processing_ms"] >= 0),
                   key=lambda d: d["processing_ms"])
    if not timed:
        return None
    d = timed[len(timed) // 2]
    return {"batch_ms": d["batch_ms"], "records": d["records"], "processing_ms": d["processing_ms"],
            "scheduling_ms": d["scheduling_ms"], "breakdown": d.get("breakdown") or {}}


def breakdown_line(row: dict) -> str | None:
    batch = row.get("median_batch")
    if "floor" in row:
        return None
    if not batch or not batch["breakdown"]:
        return None
    phases = ", ".join(f"{k} {v:g}" for k, v in batch["breakdown"].items())
    return (f"- {row['engine']} {row['pipeline']} {row['interval_ms']} ms at {row['rate']:,} lines/s, median batch "
            f"({batch['records']:,} records, processing {batch['processing_ms']} ms, scheduling delay "
            f"{batch['scheduling_ms']} ms): {phases} (ms)")


# ---------------------------------------------------------------------------- the table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "app":
        ap = argparse.ArgumentParser()
        for name, kind in (("--engine", str), ("--pipeline", str), ("--interval-ms", int), ("--port", int),
                           ("--workdir", str), ("--seconds", float)):
            ap.add_argument(name, type=kind, required=True)
        ap.add_argument("--conf", action="append", default=[])
        ap.add_argument("--lines", type=int, default=0)
        args = ap.parse_args(argv[1:])
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the bench has what it needs
        {"structured": structured_app, "floor": floor_app}.get(args.engine, dstream_app)(args)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--intervals", default="100,250,500,1000")
    ap.add_argument("--rates", default="20000")
    ap.add_argument("--pipelines", default="stateless,stateful")
    ap.add_argument("--engines", default="sparkwal,sparkwal-noprecompute,pyspark,structured")
    ap.add_argument("--json", help="also write every row here")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark conf setting for the sparkwal and pyspark.streaming apps (repeatable)")
    args = ap.parse_args(argv)
    unknown = [e for e in args.engines.split(",") if e not in DURABILITY]
    if unknown:
        print(f"latency_bench: unknown engine {unknown[0]!r} ({', '.join(DURABILITY)})", file=sys.stderr)
        return 2
    print("| pipeline | batch ms | lines/s | engine | records in / out | p50 | p95 | p99 | max ms | keeps up "
          "| processing p50 ms | largest batch | durability |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|")
    rows = []
    for pipeline in args.pipelines.split(","):
        for rate in (int(r) for r in args.rates.split(",")):
            for n, interval in enumerate(int(i) for i in args.intervals.split(",")):
                for engine in args.engines.split(","):
                    if engine == "structured" and n:
                        continue  # its trigger is 0 s, whatever the interval: one row per pipeline and rate
                    if engine == "sparkwal-perblock" and pipeline != "stateless":
                        continue  # foreachBlock: the rows of a block's records alone
                    r = measure(engine, pipeline, interval, rate, args.warmup, args.seconds,
                                tuple(args.conf) if engine != "structured" else ())
                    rows.append(r)
                    if "error" in r:
                        print(f"| {pipeline} | {interval} | {rate:,} | {engine} | {r['error']} |", flush=True)
                        continue
                    proc = r["processing_p50_ms"]
                    shown = "trigger 0" if engine == "structured" else interval
                    print(f"| {pipeline} | {shown} | {rate:,} | {engine} | {r['records_in']:,} / "
                          f"{r['records_out']:,} | {r['p50']} | {r['p95']} | {r['p99']} | {r['max']} | "
                          f"{'yes' if r['keeps_up'] else 'no'} | {'' if proc is None else proc} | "
                          f"{r['largest_batch']:,} | {r['durability']} |", flush=True)
    floors = []
    if "stateless" in args.pipelines.split(","):
        for rate in (int(r) for r in args.rates.split(",")):
            for interval in (int(i) for i in args.intervals.split(",")):
                if interval <= 250:
                    floor = spark_floor(rate * interval // 1000)
                    if floor is not None:
                        floors.append(floor)
                        print(f"\nSpark's floor, one {interval} ms batch at {rate:,} lines/s as a plain PySpark job "
                              f"({floor['floor_lines']:,} lines, flatMap, reduceByKey, collect; warmed, nothing "
                              f"else running): p50 {floor['p50']} ms, p99 {floor['p99']} ms", flush=True)
    rows.extend({"floor": f} for f in floors)
    lines = [line for line in map(breakdown_line, rows) if line]
    if lines:
        print("\nWhere the median batch's time went:")
        print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
