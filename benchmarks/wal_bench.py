"""WAL benchmark harness: sparkwal's log, raw baselines and Spark's own WAL, measured in one run.

    python -m benchmarks.wal_bench [--quick] [--dir DIR] [--json OUT]

Every row runs on the same disk (``--dir``, default ``./bench-out``) in the same process run, and
prints one table plus the target ratios of issue #2. Rows:

* ``raw fsync/record``: ``os.write`` + ``fdatasync`` per record, the physical limit of one writer
  (writing the same bytes as the log: a segment header, then framed records);
* ``sparkwal durable``: ``FileBasedWriteAheadLog.write``, fsync'd per record;
* ``sparkwal flush``: the opt-out mode (survives a process crash, not a power loss);
* ``spark FileBased``: Spark's ``FileBasedWriteAheadLog`` via a small Java harness compiled against
  pyspark's jars (it hflushes to the page cache and never fsyncs); skipped when ``javac`` is missing;
* group commit at 8 and 64 writer threads: ``sparkwal batched`` (``BatchedWriteAheadLog``), a
  ``raw group`` baseline (writers hand records to one thread that does one write + one fsync per
  drained group, the simplest correct design), and Spark's ``BatchedWriteAheadLog``;
Rows that fsync run 5 times (3 with ``--quick``), alternating with the row they are compared to;
the median run is reported and the "runs" column shows the spread (fsync latency on shared disks
drifts by tens of percent within seconds).

* ``read_all`` after reopen against a raw CRC-checked scan and Spark's ``readAll``; 1000 random
  ``read(handle)``; ``clean`` of 200 segments.

Reads run on a warm page cache for every implementation alike.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from crc32c import crc32c

from wal import BatchedWriteAheadLog, FileBasedWriteAheadLog
from wal.segment import FRAME_HEADER, FRAME_HEADER_LEN, HEADER_LEN, frame_header
from wal.segment import HEADER as SEGMENT_HEADER

SIZES = (200, 1024, 16384)
MIB = 1 << 20


@dataclass
class Row:
    workload: str
    size: int
    impl: str
    threads: int
    records: int
    seconds: float
    p50_us: float | None = None
    p99_us: float | None = None
    records_per_sync: float | None = None
    durability: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_s(self) -> float:
        return self.rate * self.size / MIB


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


# ------------------------------------------------------------------------------ drivers


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


# ------------------------------------------------------------------------------ workloads


class Bench:
    def __init__(self, root: str, quick: bool):
        self.root = root
        self.quick = quick
        self.rows: list[Row] = []
        self.spark = SparkHarness(root)
        self.reps = 3 if quick else 5
        self._n = 0

    def fresh_dir(self, name: str) -> str:
        self._n += 1
        d = os.path.join(self.root, f"{self._n:02d}-{name}")
        shutil.rmtree(d, ignore_errors=True)
        return d

    def counts(self, size: int) -> tuple[int, int, int]:
        """(records for fsync-per-record rows, single-thread fast rows, group-commit rows)."""
        scale = 0.25 if self.quick else 1.0
        budget = int(256 * MIB * scale)
        return (int(4000 * scale), min(int(100_000 * scale), budget // size),
                min(int(20_000 * scale), budget // size))

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(f"  {row.workload:<12} {row.size:>6} B  {row.impl:<22} {row.threads:>3}T "
              f"{row.rate:>12,.0f} rec/s", file=sys.stderr, flush=True)
        return row

    def write_rows(self, size: int) -> None:
        payload = random.Random(size).randbytes(size)
        n_sync, n_fast, n_group = self.counts(size)
        now = lambda: time.time_ns() // 1_000_000  # noqa: E731

        def raw_fsync() -> Row:
            # the same bytes the log writes (a segment header, then frames), so that the rows
            # compare code, not how a 16 KiB record happens to align with 4 KiB pages
            d = self._mk(self.fresh_dir("raw-fsync"))
            fd = os.open(os.path.join(d, "raw"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, SEGMENT_HEADER)
            frame = frame_header(payload) + payload

            def raw_write(_):
                os.write(fd, frame)
                os.fdatasync(fd)

            secs, lat = run_writers(raw_write, payload, n_sync, 1)
            os.close(fd)
            return Row("write", size, "raw fsync/record", 1, n_sync, secs, pct(lat, .5),
                       pct(lat, .99), 1.0, "fsync")

        def sparkwal_single(impl: str, durability: str, n: int):
            def run() -> Row:
                log = FileBasedWriteAheadLog(self.fresh_dir(impl.split()[1]), durability=durability)
                secs, lat = run_writers(lambda p: log.write(p, now()), payload, n, 1)
                st = log.statistics()
                log.close()
                return Row("write", size, impl, 1, n, secs, pct(lat, .5), pct(lat, .99),
                           st.records_written / st.syncs if st.syncs else None, durability)
            return run

        def raw_group(threads: int, n: int):
            def run() -> Row:
                d = self._mk(self.fresh_dir(f"raw-group-{threads}"))
                raw = RawGroupCommit(os.path.join(d, "raw"))
                secs, lat = run_writers(lambda p: raw.write(p, now()), payload, n, threads)
                raw.close()
                return Row("write", size, "raw group commit", threads, n, secs, pct(lat, .5),
                           pct(lat, .99), n / raw.syncs, "fsync")
            return run

        def batched(threads: int, n: int):
            def run() -> Row:
                log = BatchedWriteAheadLog(FileBasedWriteAheadLog(self.fresh_dir(f"batched-{threads}")))
                secs, lat = run_writers(lambda p: log.write(p, now()), payload, n, threads)
                st = log.statistics()
                log.close()
                return Row("write", size, "sparkwal batched", threads, n, secs, pct(lat, .5),
                           pct(lat, .99), st.records_written / st.syncs, "fsync")
            return run

        self.interleaved([raw_fsync, sparkwal_single("sparkwal durable", "fsync", n_sync)])
        self.add(sparkwal_single("sparkwal flush (opt-out)", "flush", n_fast)())
        if self.spark.available:
            r = self.spark.run("write", self.fresh_dir("spark-single"), size, n_fast, 1, "false")
            self.add(Row("write", size, "spark FileBased", 1, n_fast, r["seconds"], r["p50_us"],
                         r["p99_us"], None, "page cache (hflush, no fsync)"))
        for threads in (8, 64):
            n = max(n_group, threads * 50)
            self.interleaved([raw_group(threads, n), batched(threads, n)])
            if self.spark.available:
                r = self.spark.run("write", self.fresh_dir(f"spark-batched-{threads}"), size, n,
                                   threads, "true")
                self.add(Row("write", size, "spark Batched", threads, n, r["seconds"], r["p50_us"],
                             r["p99_us"], None, "page cache (hflush, no fsync)"))

    def interleaved(self, contenders) -> None:
        """fsync latency on shared disks drifts by tens of percent within seconds: run the
        contenders of one comparison alternately, ``reps`` times, and keep each one's median run."""
        runs: list[list[Row]] = [[] for _ in contenders]
        for _ in range(self.reps):
            for i, run in enumerate(contenders):
                runs[i].append(run())
        for rs in runs:
            rs.sort(key=lambda r: r.rate)
            row = rs[len(rs) // 2]
            row.extra["runs_rec_s"] = [round(r.rate) for r in rs]
            self.add(row)

    @staticmethod
    def _mk(d: str) -> str:
        os.makedirs(d, exist_ok=True)
        return d

    def read_rows(self, size: int) -> None:
        payload = random.Random(size).randbytes(size)
        n = min(200_000 if not self.quick else 50_000, (256 * MIB if not self.quick else 64 * MIB) // size)
        d = self.fresh_dir(f"read-{size}")
        with FileBasedWriteAheadLog(d, durability="flush", rolling_interval_s=3600) as log:
            handles = log.write_batch([payload] * 1000, 1)
            for i in range(1, n // 1000):
                log.write_batch([payload] * 1000, 1 + i)
            paths = log.segment_paths()
        raw_crc_scan(paths)  # warm the page cache for every reader alike

        log = FileBasedWriteAheadLog(d)
        t0 = time.perf_counter()
        count = sum(1 for _ in log.read_all())
        self.add(Row("read_all", size, "sparkwal", 1, count, time.perf_counter() - t0))
        t0 = time.perf_counter()
        count, _ = raw_crc_scan(paths)
        self.add(Row("read_all", size, "raw CRC-checked scan", 1, count, time.perf_counter() - t0))

        rng = random.Random(1)
        for h in rng.sample(handles, 100):
            log.read(h)
        rounds = []
        for _ in range(3):  # three rounds of 1000 reads; the median round is reported
            lat = []
            for _ in range(1000):
                h = handles[rng.randrange(len(handles))]
                t0 = time.perf_counter_ns()
                log.read(h)
                lat.append((time.perf_counter_ns() - t0) / 1e3)
            rounds.append(lat)
        rounds.sort(key=lambda xs: pct(xs, .5))
        lat = rounds[1]
        self.add(Row("random read", size, "sparkwal", 1, 1000, sum(lat) / 1e6, pct(lat, .5),
                     pct(lat, .99)))
        log.close()

        if self.spark.available:
            sd = self.fresh_dir(f"spark-read-{size}")
            self.spark.run("write", sd, size, n, 1, "false")
            r = self.spark.run("readall", sd)
            self.add(Row("read_all", size, "spark readAll", 1, r["records"], r["seconds"]))
            r = self.spark.run("random", self.fresh_dir(f"spark-random-{size}"), size, 1000, 1000)
            self.add(Row("random read", size, "spark read", 1, 1000, 0.0, r["p50_us"], r["p99_us"]))

    def clean_row(self) -> None:
        d = self.fresh_dir("clean")
        segments = 200
        with FileBasedWriteAheadLog(d, rolling_interval_s=1, durability="flush") as log:
            for i in range(segments + 1):
                log.write(b"x" * 200, i * 2000)
            t0 = time.perf_counter()
            log.clean(segments * 2000, wait_for_completion=True)
            secs = time.perf_counter() - t0
            deleted = log.statistics().segments_deleted
        self.add(Row("clean", 0, "sparkwal", 1, deleted, secs))


# ------------------------------------------------------------------------------ report


def find(rows, workload, impl, size, threads=1):
    for r in rows:
        if (r.workload, r.impl, r.size, r.threads) == (workload, impl, size, threads):
            return r
    return None


def targets(rows: list[Row]) -> list[tuple[str, str, bool | None]]:
    out = []

    def ratio(label, a, b, goal, key=lambda r: r.rate):
        if a is None or b is None:
            out.append((label, "n/a", None))
            return
        v = key(a) / key(b)
        out.append((label, f"{v:.2f} (goal >= {goal})", v >= goal))

    for size in SIZES:
        ratio(f"group commit 64 writers vs raw group commit, {size} B",
              find(rows, "write", "sparkwal batched", size, 64),
              find(rows, "write", "raw group commit", size, 64), 0.85)
    for size in SIZES:
        r = find(rows, "write", "sparkwal batched", size, 8)
        raw = find(rows, "write", "raw group commit", size, 8)
        if r:
            out.append((f"records per sync at 8 writers, {size} B",
                        f"{r.records_per_sync:.2f} (goal >= 7; raw group commit "
                        f"{raw.records_per_sync:.2f})" if raw else f"{r.records_per_sync:.2f}",
                        r.records_per_sync >= 7))
    for size in SIZES:
        ratio(f"durable per record vs raw fsync per record, {size} B",
              find(rows, "write", "sparkwal durable", size), find(rows, "write", "raw fsync/record", size),
              0.90)
    ratio("opt-out (flush) vs Spark single writer, 200 B",
          find(rows, "write", "sparkwal flush (opt-out)", 200), find(rows, "write", "spark FileBased", 200),
          0.80)
    for size in (200, 16384):
        ratio(f"read_all vs raw CRC-checked scan, {size} B", find(rows, "read_all", "sparkwal", size),
              find(rows, "read_all", "raw CRC-checked scan", size), 0.75)
    ratio("read_all MB/s vs Spark readAll, 16384 B", find(rows, "read_all", "sparkwal", 16384),
          find(rows, "read_all", "spark readAll", 16384), 1.0)
    for size in (200, 16384):
        r = find(rows, "random read", "sparkwal", size)
        if r:
            out.append((f"random read p50, {size} B", f"{r.p50_us:.2f} us (goal < 5 us)", r.p50_us < 5))
    return out


def spread(r: Row) -> str:
    runs = r.extra.get("runs_rec_s")
    return "-".join(f"{x / 1000:.1f}" for x in (runs[0], runs[-1])) if runs else ""


def render(rows: list[Row], note: str) -> str:
    def f(x, fmt):
        return "" if x is None else format(x, fmt)

    lines = ["| workload | size | implementation | threads | records/s | MB/s | p50 µs | p99 µs "
             "| records/sync | durability | runs (k rec/s) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        rate = "" if r.workload == "random read" else f"{r.rate:,.0f}"
        mb = "" if r.workload in ("random read", "clean") else f"{r.mb_s:,.1f}"
        if r.workload == "clean":
            rate = f"{r.rate:,.0f} segments/s"
        lines.append(f"| {r.workload} | {r.size or ''} | {r.impl} | {r.threads} | {rate} | {mb} | "
                     f"{f(r.p50_us, '.1f')} | {f(r.p99_us, '.1f')} | {f(r.records_per_sync, '.2f')} | "
                     f"{r.durability} | {spread(r)} |")
    lines.append("")
    lines.append("| target | measured | met |")
    lines.append("|---|---|---|")
    for label, value, ok in targets(rows):
        lines.append(f"| {label} | {value} | {'yes' if ok else ('n/a' if ok is None else 'NO')} |")
    if note:
        lines.append(f"\nNote: {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="bench-out", help="working directory on the disk to measure")
    ap.add_argument("--quick", action="store_true", help="a quarter of the records (about 1 minute)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    bench = Bench(root, args.quick)
    print(f"sparkwal WAL benchmark in {root} ({os.cpu_count()} CPUs)", file=sys.stderr)
    try:
        for size in SIZES:
            bench.write_rows(size)
        for size in (200, 16384):
            bench.read_rows(size)
        bench.clean_row()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(render(bench.rows, bench.spark.note))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in bench.rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
