"""The benchmarks' drivers and baselines: time-boxed writer loops, the raw designs sparkwal is
measured against (the physical limit of each path), and Spark's own WAL through a Java harness."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

from crc32c import crc32c

from sparkwal.wal.segment import FRAME_HEADER, FRAME_HEADER_LEN, HEADER_LEN, frame_header

#: Every row's measured pass lasts this long (``--seconds``); each write row runs after a
#: discarded warm-up pass of the same work (for Spark: in the same JVM).
SECONDS = 2.0
WARMUP_SECONDS = 1.0
SAMPLE_EVERY = 16  # one write in 16 is timed for the latency columns (as in the Java harness)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def timed_writes(write, payload, seconds: float, threads: int) -> tuple[int, float, list[float]]:
    """``write(payload, time_ms)`` from ``threads`` threads until ``seconds`` have passed (each
    thread finishes its current run of 16); returns records, wall seconds and the sampled
    latencies (µs). ``payload`` may be a list for ``write_many`` rows: records count its items."""
    per_call = len(payload) if isinstance(payload, list) else 1
    counts = [0] * threads
    lats: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    deadline = [0]

    def worker(t: int) -> None:
        out = lats[t]
        clock, tnow = time.perf_counter_ns, time.time_ns
        start.wait()
        end, n = deadline[0], 0
        while True:
            t0 = clock()
            write(payload, tnow() // 1_000_000)
            t1 = clock()
            out.append((t1 - t0) / 1e3 / per_call)
            for _ in range(SAMPLE_EVERY - 1):
                write(payload, tnow() // 1_000_000)
            n += SAMPLE_EVERY
            if t1 >= end:
                break
        counts[t] = n * per_call

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    deadline[0] = time.perf_counter_ns() + int(seconds * 1e9)
    start.wait()
    for t in ts:
        t.join()
    return sum(counts), time.perf_counter() - t0, [x for xs in lats for x in xs]


def run_writers(write, payload: bytes, count: int, threads: int) -> tuple[float, list[float]]:
    """``count`` writes spread over ``threads`` threads; wall seconds and per-write latencies (µs)."""
    per = [count // threads + (1 if t < count % threads else 0) for t in range(threads)]
    lats: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        out = lats[t]
        clock = time.perf_counter_ns
        start.wait()
        for _ in range(per[t]):
            t0 = clock()
            write(payload)
            out.append((clock() - t0) / 1e3)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, [x for xs in lats for x in xs]


def wake_up_us(rounds: int = 20_000) -> float:
    """One thread waking another through a lock and back, halved: what every blocking group
    commit pays per record at least (a writer must be woken once its record is durable)."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        for _ in range(rounds):
            ping.acquire()
            pong.release()

    t = threading.Thread(target=other)
    t.start()
    t0 = time.perf_counter()
    for _ in range(rounds):
        ping.release()
        pong.acquire()
    secs = time.perf_counter() - t0
    t.join()
    return secs / rounds / 2 * 1e6


class RawGroupCommit:
    """The simplest correct group commit: one thread drains the queue, one write + one fdatasync
    per drained group, then wakes the group's writers. Same frame format as sparkwal."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.queue: list = []
        self.cond = threading.Condition()
        self.syncs = 0
        self.active = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def write(self, data: bytes, time_ms: int = 0) -> None:
        done = threading.Lock()
        done.acquire()
        with self.cond:
            self.queue.append((data, done))
            self.cond.notify()
        done.acquire()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and self.active:
                    self.cond.wait()
                if not self.queue:
                    return
                group, self.queue = self.queue, []
            os.write(self.fd, b"".join(frame_header(d) + d for d, _ in group))
            os.fdatasync(self.fd)
            self.syncs += 1
            for _, done in group:
                done.release()

    def close(self) -> None:
        with self.cond:
            self.active = False
            self.cond.notify()
        self.thread.join()
        os.close(self.fd)


def raw_crc_scan(paths: list[str]) -> tuple[int, int]:
    """Read each file whole and walk its frames checking both CRCs: the floor for read_all."""
    n = nbytes = 0
    unpack = FRAME_HEADER.unpack_from
    for p in paths:
        with open(p, "rb") as f:
            buf = f.read()
        pos, end = HEADER_LEN, len(buf)
        while pos < end:
            length, pcrc, hcrc = unpack(buf, pos)
            if crc32c(buf[pos:pos + 8]) != hcrc:
                raise ValueError("bad header")
            payload = buf[pos + FRAME_HEADER_LEN:pos + FRAME_HEADER_LEN + length]
            if crc32c(payload) != pcrc:
                raise ValueError("bad crc")
            pos += FRAME_HEADER_LEN + length
            n += 1
            nbytes += length
    return n, nbytes


class SparkHarness:
    """Spark's WAL classes through benchmarks/java/SparkWalBench.java (compiled once per run)."""

    def __init__(self, workdir: str):
        self.available = False
        self.note = ""
        javac, java = shutil.which("javac"), shutil.which("java")
        if not javac or not java:
            self.note = "javac/java not found: Spark rows skipped"
            return
        import pyspark

        jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
        src = os.path.join(os.path.dirname(__file__), "java", "SparkWalBench.java")
        self.classes = os.path.join(workdir, "java-classes")
        os.makedirs(self.classes, exist_ok=True)
        res = subprocess.run([javac, "-nowarn", "-cp", jars, "-d", self.classes, src],
                             capture_output=True, text=True)
        if res.returncode != 0:
            self.note = f"javac failed: Spark rows skipped ({res.stderr.strip()[:200]})"
            return
        self.cmd = [java, "-Xmx2g", "-cp", f"{self.classes}{os.pathsep}{jars}", "SparkWalBench"]
        self.available = True

    def run(self, *args) -> dict:
        res = subprocess.run(self.cmd + [str(a) for a in args], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"Spark harness {args[0]} failed: {res.stderr[-800:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])


