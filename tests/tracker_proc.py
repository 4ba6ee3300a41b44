"""Subprocess for crash tests: 4 threads add blocks to a recovered tracker while the main thread
allocates batches; each block id is printed once add_block returned True.

usage: python tracker_proc.py CHECKPOINT_DIR TAG
"""

import sys
import threading
import time

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from sparkwal.tracker import ReceivedBlockInfo, ReceivedBlockTracker  # noqa: E402

checkpoint_dir, tag = sys.argv[1], sys.argv[2]
tracker = ReceivedBlockTracker([0, 1], checkpoint_dir, recover_from_wal=True)
out = threading.Lock()


def receiver(n):
    i = 0
    while True:
        block_id = f"input-{n % 2}-{tag}-{n}-{i}"
        if tracker.add_block(ReceivedBlockInfo(n % 2, 1, block_id)):
            with out:
                sys.stdout.write(block_id + "\n")
                sys.stdout.flush()
        i += 1


for n in range(4):
    threading.Thread(target=receiver, args=(n,), daemon=True).start()
last = tracker.last_allocated_batch_ms or 0
while True:
    time.sleep(0.005)
    last = max(last + 1, time.time_ns() // 1_000_000)
    tracker.allocate_blocks_to_batch(last)
