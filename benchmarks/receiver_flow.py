"""Flow control under a source faster than processing: memory and delays, side by side.

    python -m benchmarks.receiver_flow [--seconds 60] [--engine sparkwal,pyspark]
                                       [--backpressure] [--max-unprocessed BYTES] [--json]

A TCP line server in this process sends lines as fast as the receiver takes them (loopback, no
rate setting). The app (a subprocess in its own process group, local[2], 1 s batches, receiver
WAL on under a checkpoint) reads them with ``socketTextStream`` and does 25 µs of Python work
per line (by the clock), so processing is several times slower than receiving. Sampled every second: the
resident memory of the app's whole process group (driver, JVM, Python workers), and from the
app's listener each batch's records, processing and scheduling delay (and, for sparkwal, the
receiver tracker's bytes received but not yet processed).

sparkwal bounds that data (``spark.streaming.receiver.maxUnprocessedBytes``, 256 MiB by default)
by answering a receiver's ``AddBlock`` only once batches catch up, so the receiver's bounded
queue fills, ``store()`` blocks and TCP pushes back on the source. ``--backpressure`` turns on
``spark.streaming.backpressure.enabled`` (PID rate estimator) in both engines, ``--initial-rate``
its ``initialRate`` (without one the first batches take whatever arrived while the app started).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

LINE = b"the quick brown fox jumps over the lazy dog 0123456789\n"


def _slow(line: str, seconds: float = 25e-6) -> str:
    """25 µs of Python work per line, by the clock (a loop of fixed length costs twice as much on
    a machine half as fast, and the flow test's capacity with it)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass
    return line


# --------------------------------------------------------------------------- the app (subprocess)

def app(args) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName(f"receiver-flow-{args.engine}")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.streaming.receiver.writeAheadLog.enable", "true")
            .set("spark.streaming.backpressure.enabled", str(args.backpressure).lower()))
    if args.max_unprocessed:
        conf.set("spark.streaming.receiver.maxUnprocessedBytes", str(args.max_unprocessed))
    if args.initial_rate:
        conf.set("spark.streaming.backpressure.initialRate", str(args.initial_rate))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    if os.environ.get("RECEIVER_FLOW_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.engine == "sparkwal":
        from sparkwal.engine import StreamingContext, StreamingListener
    else:
        from pyspark.streaming import StreamingContext
        from pyspark.streaming.listener import StreamingListener

    ssc = StreamingContext(sc, 1.0)
    ssc.checkpoint(os.path.join(args.workdir, "ckpt"))

    class Emit(StreamingListener):
        def onBatchCompleted(self, e):
            info = e.batchInfo()
            event = {"event": "batch", "records": info.numRecords(), "processing_ms": info.processingDelay(),
                     "scheduling_ms": info.schedulingDelay(), "at": time.time()}
            tracker = getattr(ssc, "receiverTracker", None)
            if tracker is not None:
                s = tracker.statistics()
                event.update(unprocessed_bytes=s.unprocessed_bytes, max_unprocessed_bytes=s.max_unprocessed_bytes,
                             add_block_waits=s.add_block_waits)
            print(json.dumps(event), flush=True)

    ssc.addStreamingListener(Emit())
    def count(rdd) -> None:  # pyspark.streaming's foreachRDD wants None back
        rdd.count()

    ssc.socketTextStream("127.0.0.1", args.port).map(_slow).foreachRDD(count)
    ssc.start()
    ssc.awaitTerminationOrTimeout(args.seconds)
    ssc.stop(stopSparkContext=True, stopGraceFully=False)


# --------------------------------------------------------------------------- the harness

class FastSource:
    """Sends lines to whoever connects, as fast as they are taken."""

    def __init__(self, line: bytes = LINE):
        self.chunk = line * ((1 << 20) // len(line))
        self.line_len = len(line)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.bytes_sent = 0
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn):
        try:
            while not self.stopped.is_set():
                conn.sendall(self.chunk)
                self.bytes_sent += len(self.chunk)
        except OSError:
            pass
        conn.close()

    def close(self):
        self.stopped.set()
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()


def stat_fields(pid) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: [state, ppid, pgrp, ...]."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def processes():
    """``(pid, stat_fields(pid))`` of every process still there to read."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                yield int(pid), stat_fields(pid)
            except OSError:
                continue


def group_rss(pgid: int) -> list[tuple[int, bytes]]:
    """(resident bytes, command line) of every process in the process group ``pgid``."""
    out = []
    for pid, fields in processes():
        try:
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            out.append((int(fields[21]) * os.sysconf("SC_PAGE_SIZE"), cmd))
        except (OSError, ValueError, IndexError):
            continue
    return out


def group_rss_bytes(pgid: int) -> int:
    return sum(rss for rss, _ in group_rss(pgid))


def measure(engine: str, seconds: float, backpressure: bool, max_unprocessed: int | None,
            initial_rate: int | None = None) -> dict:
    source = FastSource()
    workdir = tempfile.mkdtemp(prefix=f"receiver-flow-{engine}-")
    cmd = [sys.executable, "-m", "benchmarks.receiver_flow", "app", "--engine", engine, "--port",
           str(source.port), "--seconds", str(seconds), "--workdir", workdir]
    if backpressure:
        cmd.append("--backpressure")
    if max_unprocessed:
        cmd += ["--max-unprocessed", str(max_unprocessed)]
    if initial_rate:
        cmd += ["--initial-rate", str(initial_rate)]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    batches: list[dict] = []
    threading.Thread(target=lambda: [batches.append(json.loads(x)) for x in proc.stdout
                                     if x.startswith("{")], daemon=True).start()
    rss: list[tuple[float, int]] = []
    began = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - began < seconds + 60:
            rss.append((time.monotonic() - began, group_rss_bytes(proc.pid)))
            time.sleep(1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        source.close()
        shutil.rmtree(workdir, ignore_errors=True)  # the app's checkpoint: nothing reads it afterwards
    elapsed = time.monotonic() - began
    mib = 1 << 20
    third = max(1, len(rss) // 3)
    records = sum(b["records"] for b in batches)
    last = batches[-5:]
    return {
        "engine": engine, "backpressure": backpressure, "seconds": round(elapsed, 1),
        "exit_code": proc.returncode, "batches": len(batches),
        "source_lines_per_s": round(source.bytes_sent / len(LINE) / elapsed),
        "processed_records_per_s": round(records / max(1, len(batches))),
        "rss_max_first_third_mib": round(max(r for _, r in rss[:third]) / mib) if rss else None,
        "rss_max_last_third_mib": round(max(r for _, r in rss[-third:]) / mib) if rss else None,
        "rss_max_mib": round(max(r for _, r in rss) / mib) if rss else None,
        "last_batches_records": [b["records"] for b in last],
        "batches_records": [b["records"] for b in batches],
        "batches_scheduling_ms": [b["scheduling_ms"] for b in batches],
        "batches_processing_ms": [b["processing_ms"] for b in batches],
        "last_batches_processing_ms": [b["processing_ms"] for b in last],
        "last_batches_scheduling_ms": [b["scheduling_ms"] for b in last],
        "max_unprocessed_mib": round(max((b.get("max_unprocessed_bytes", 0) for b in batches), default=0) / mib, 1),
        "add_block_waits": max((b.get("add_block_waits", 0) for b in batches), default=0),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "app":
        ap = argparse.ArgumentParser()
        ap.add_argument("--engine", choices=["sparkwal", "pyspark"], required=True)
        ap.add_argument("--port", type=int, required=True)
        ap.add_argument("--seconds", type=float, required=True)
        ap.add_argument("--workdir", required=True)
        ap.add_argument("--backpressure", action="store_true")
        ap.add_argument("--max-unprocessed", type=int)
        ap.add_argument("--initial-rate", type=int)
        app(ap.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--engine", default="sparkwal,pyspark")
    ap.add_argument("--backpressure", action="store_true")
    ap.add_argument("--max-unprocessed", type=int)
    ap.add_argument("--initial-rate", type=int, help="spark.streaming.backpressure.initialRate")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for engine in args.engine.split(","):
        r = measure(engine, args.seconds, args.backpressure, args.max_unprocessed, args.initial_rate)
        print(json.dumps(r) if args.json else
              f"{engine:9} bp={args.backpressure!s:5} exit={r['exit_code']} batches={r['batches']} "
              f"source {r['source_lines_per_s']:,} lines/s, processed {r['processed_records_per_s']:,} "
              f"records/batch | RSS max first/last third {r['rss_max_first_third_mib']}/"
              f"{r['rss_max_last_third_mib']} MiB (max {r['rss_max_mib']}) | last batches records "
              f"{r['last_batches_records']} scheduling {r['last_batches_scheduling_ms']} ms | "
              f"unprocessed max {r['max_unprocessed_mib']} MiB, AddBlock waits {r['add_block_waits']}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
