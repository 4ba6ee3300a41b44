"""kill -9 of a driver adding and allocating blocks loses no acknowledged block, duplicates none."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

from sparkwal.tracker import ReceivedBlockTracker

HERE = os.path.dirname(__file__)


def placement(tr):
    where = [b.block_id for t in tr.allocated_batch_times() for s in (0, 1)
             for b in tr.get_blocks_of_batch_and_stream(t, s)]
    return where + [b.block_id for s in (0, 1) for b in tr.get_unallocated_blocks(s)]


def test_sigkill_loses_no_acknowledged_block(tmp_path):
    rng = random.Random(21)
    acked: set[str] = set()
    for round_no in range(5):
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "tracker_proc.py"),
                                 str(tmp_path), f"r{round_no}"], stdout=subprocess.PIPE, text=True)
        want = rng.randrange(50, 600)
        for n, line in enumerate(proc.stdout, 1):
            acked.add(line.strip())
            if n >= want:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        tracker = ReceivedBlockTracker([0, 1], str(tmp_path), recover_from_wal=True)
        blocks = placement(tracker)
        tracker.stop()
        assert len(blocks) == len(set(blocks)), "a block is in two places"
        missing = acked - set(blocks)
        assert not missing, f"acknowledged blocks lost: {sorted(missing)[:5]}"
