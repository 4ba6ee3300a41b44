"""kill -9 while writing checkpoints never leaves an unreadable newest checkpoint or a partial
metadata log entry, and never loses one that was reported durable."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from sparkwal.checkpoint import MetadataLog, read_checkpoint

HERE = os.path.dirname(__file__)


def run_and_kill(directory, start, kind, rng, options=None):
    extra = [json.dumps(options)] if options else []
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "checkpoint_writer_proc.py"),
                             str(directory), str(start), kind, *extra],
                            stdout=subprocess.PIPE, text=True)
    acked = []
    stop_after = rng.randrange(1, 40)
    for line in proc.stdout:
        acked.append(int(line))
        if len(acked) >= stop_after:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return acked


@pytest.fixture(params=["local", "s3"])
def crash_dir(request, tmp_path):
    if request.param == "local":
        return str(tmp_path), None
    url, options = request.getfixturevalue("s3_url")
    return url + "/ckpt", options


@pytest.mark.slow
def test_sigkill_loop_never_leaves_an_unreadable_newest_checkpoint(crash_dir):
    directory, options = crash_dir
    rng = random.Random(11)
    start = 1000
    for _ in range(8):
        acked = run_and_kill(directory, start, "dstream", rng, options)
        cp = read_checkpoint(directory, storage_options=options)  # raises if nothing valid is left
        assert cp is not None and cp.checkpoint_time_ms >= acked[-1]
        assert cp.data["t"] == cp.checkpoint_time_ms and len(cp.data["blob"]) == 200_000
        start = cp.checkpoint_time_ms + 1000


def test_sigkill_loop_never_leaves_a_partial_metadata_entry(tmp_path):
    rng = random.Random(12)
    acked_all = []
    start = 0
    for _ in range(8):
        acked_all += run_and_kill(tmp_path, start, "metadata", rng)
        log = MetadataLog(str(tmp_path))
        ids = log.batch_ids()
        assert set(acked_all) <= set(ids)
        for i in ids:
            assert log.get(i) == {"t": i, "pad": "x" * 100_000}  # complete, never partial
        start = ids[-1] + 1
