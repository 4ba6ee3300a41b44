"""Files moved in right after ``start()``: does each engine's file stream read them?

    python -m benchmarks.file_stream_race [--trials 8] [--batch 1.0] [--lines 100]

A side-by-side correctness loop (issue 15), both engines on one local[2] SparkContext, trials
alternated: each trial makes a fresh context with ``textFileStream(d)`` (``newFilesOnly=True``)
and a ``foreachRDD`` counting lines, calls ``start()``, and at once writes one file of
``--lines`` lines into ``d`` (a temp name, then ``os.replace``); it then waits for three batches
to complete and records how many lines the stream saw. A trial passes when it saw exactly
``--lines``: none lost, none twice. Prints one table row per engine and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading

from .engine_bench import _context, _spark

ENGINES = ("sparkwal", "pyspark.streaming")


class _BatchCounter:
    """Lines seen and batches run, counted by the output function itself (works in both engines)."""

    def __init__(self):
        self.lines = 0
        self.batches = 0
        self.cond = threading.Condition()

    def output(self, rdd) -> None:
        n = rdd.count()
        with self.cond:
            self.lines += n
            self.batches += 1
            self.cond.notify_all()

    def wait_batches(self, n: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.batches >= n, timeout)


def _write_file(directory: str, lines: int) -> None:
    tmp = os.path.join(directory, ".incoming.tmp")
    with open(tmp, "w") as f:
        f.writelines(f"line {i}\n" for i in range(lines))
    os.replace(tmp, os.path.join(directory, "data.txt"))


def trial(sc, engine: str, batch: float, lines: int) -> int:
    """Lines the stream saw of one file written right after start()."""
    directory = tempfile.mkdtemp(prefix="sparkwal-race-")
    try:
        ssc = _context(sc, engine, batch)
        counter = _BatchCounter()
        ssc.textFileStream(directory).foreachRDD(lambda rdd: counter.output(rdd))
        ssc.start()
        _write_file(directory, lines)
        if not counter.wait_batches(3, timeout=30 * batch + 30):
            raise RuntimeError(f"{engine}: three batches did not complete")
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
        return counter.lines
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--batch", type=float, default=1.0, help="batch duration, seconds")
    parser.add_argument("--lines", type=int, default=100)
    args = parser.parse_args(argv)
    sc = _spark()
    seen: dict[str, list[int]] = {e: [] for e in ENGINES}
    for _ in range(args.trials):
        for engine in ENGINES:
            seen[engine].append(trial(sc, engine, args.batch, args.lines))
    print(f"| engine | trials | file read exactly once | lost | read twice |   ({args.batch} s batches)")
    print("|---|---|---|---|---|")
    result = {}
    for engine, counts in seen.items():
        exact = sum(c == args.lines for c in counts)
        lost = sum(c < args.lines for c in counts)
        twice = sum(c > args.lines for c in counts)
        print(f"| {engine} | {len(counts)} | {exact} | {lost} | {twice} |")
        result[engine] = {"trials": len(counts), "exact": exact, "lost": lost, "duplicated": twice,
                          "lines_seen": counts}
    print(json.dumps({"event": "file_stream_race", "lines": args.lines, "batch_s": args.batch,
                      "engines": result}))
    sc.stop()
    return 0 if all(r["exact"] == r["trials"] for r in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
