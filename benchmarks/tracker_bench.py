"""Tracker benchmark: block additions per second from concurrent receivers (durable WAL, group
commit) and recovery time of a large WAL.

    python -m benchmarks.tracker_bench [--quick] [--dir DIR]

Rows:

* ``add_block, W threads``: W receiver threads call ``add_block`` (each returns once its event is
  fsync'd; concurrent additions share syncs through the batched WAL);
* ``recovery``: a tracker recovering from a WAL of N events (N-N/100 block additions, an allocation
  after every 100 additions, a cleanup after every 100 allocations), written beforehand.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import time

from sparkwal.checkpoint.layout import RECEIVED_BLOCK_METADATA as WAL_DIR
from sparkwal.tracker import (BatchAllocationEvent, BatchCleanupEvent, BlockAdditionEvent,
                     ReceivedBlockInfo, ReceivedBlockTracker, encode_event)
from sparkwal.wal import FileBasedWriteAheadLog, RecordHandle

from .baselines import run_writers


def add_blocks(root: str, threads: int, per_thread: int) -> dict:
    tracker = ReceivedBlockTracker(range(threads), wal_dir=os.path.join(root, WAL_DIR))
    ids = itertools.count()

    def add(_payload) -> None:
        i = next(ids)
        sid = i % threads
        info = ReceivedBlockInfo(sid, 100, f"input-{sid}-{i}",
                                 RecordHandle(f"{root}/receivedData/{sid}/log-1-2", i * 1000, 990))
        if not tracker.add_block(info):
            raise RuntimeError("add_block failed")

    n = threads * per_thread
    secs, _ = run_writers(add, b"", n, threads)
    stats = tracker.wal.statistics()
    tracker.stop()
    return {"blocks": n, "seconds": secs, "rate": n / secs, "blocks_per_sync": stats.records_written / stats.syncs}


def write_events(root: str, n_events: int) -> int:
    """Write a WAL of ``n_events`` events directly (not timed), like a long-running driver's."""
    log = FileBasedWriteAheadLog(os.path.join(root, WAL_DIR), durability="flush", rolling_interval_s=60)
    batch, pending, allocations, written, t = [], [], 0, 0, 1_000
    i = 0
    while written + len(batch) < n_events:
        info = ReceivedBlockInfo(i % 4, 100, f"input-{i % 4}-{i}",
                                 RecordHandle(f"{root}/receivedData/{i % 4}/log-1-2", i * 1000, 990))
        batch.append(encode_event(BlockAdditionEvent(info)))
        pending.append(info)
        i += 1
        if len(pending) == 99:
            blocks = {s: [b for b in pending if b.stream_id == s] for s in range(4)}
            batch.append(encode_event(BatchAllocationEvent(t, blocks)))
            pending, allocations, t = [], allocations + 1, t + 500
            if allocations % 100 == 0:
                batch.append(encode_event(BatchCleanupEvent([t - 60_000 + k * 500 for k in range(100)])))
        if len(batch) >= 10_000:
            log.write_many(batch, t)
            written, batch = written + len(batch), []
    if batch:
        log.write_many(batch, t)
        written += len(batch)
    log.close()
    return written


def recover(root: str) -> dict:
    t0 = time.perf_counter()
    tracker = ReceivedBlockTracker(range(4), wal_dir=os.path.join(root, WAL_DIR), recover_from_wal=True)
    secs = time.perf_counter() - t0
    batches = len(tracker.allocated_batch_times())
    tracker.stop()
    return {"seconds": secs, "batches": batches}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="bench-out", help="working directory on the disk to measure")
    ap.add_argument("--quick", action="store_true", help="fewer records")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rows = []
    try:
        for threads in (1, 8):
            d = os.path.join(root, f"add-{threads}")
            per = 500 if args.quick else 2000
            r = add_blocks(d, threads, per)
            rows.append(f"| add_block (durable WAL) | {threads} | {r['blocks']:,} | {r['seconds']:.2f} s "
                        f"| {r['rate']:,.0f} blocks/s | {r['blocks_per_sync']:.2f} blocks/sync |")
            print(rows[-1], file=sys.stderr, flush=True)
        n = 200_000 if args.quick else 1_000_000
        d = os.path.join(root, "recovery")
        events = write_events(d, n)
        r = recover(d)
        rows.append(f"| recovery | 1 | {events:,} events | {r['seconds']:.2f} s | "
                    f"{events / r['seconds']:,.0f} events/s | {r['batches']:,} batches recovered |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| workload | threads | size | time | rate | notes |")
    print("|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
