"""Flow control with a source faster than processing (python -m benchmarks.receiver_flow, short):
memory stays bounded with no rate setting, and backpressure converges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
MIB = 1 << 20


def flow(*args) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.receiver_flow", "--engine", "sparkwal", "--json",
                          *map(str, args)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.driver
def test_with_no_rate_setting_unprocessed_data_is_bounded_and_the_source_pushed_back():
    r = flow("--seconds", 20, "--max-unprocessed", 16 * MIB)
    assert r["exit_code"] == 0 and r["batches"] >= 10
    assert r["add_block_waits"] >= 1, "the bound never engaged: the source was not faster"
    # at most the bound plus one block (100,000 lines of ~55 bytes pickled: under 8 MiB)
    assert r["max_unprocessed_mib"] <= 16 + 8
    assert r["rss_max_last_third_mib"] <= r["rss_max_first_third_mib"] * 1.5 + 100, r


@pytest.mark.driver
def test_backpressure_converges_to_what_a_batch_can_process():
    """An initial rate about twice what a batch can process (about 35,000 lines with one core for the
    job): a backlog forms, the PID estimator lowers the receiver's rate below capacity until it
    drains, then settles near capacity. (At 50,000, 1.4 times capacity, the backlog once peaked at
    997 ms: too close to the line this test draws.)"""
    r = flow("--seconds", 30, "--backpressure", "--initial-rate", 70000)
    assert r["exit_code"] == 0 and r["batches"] >= 24
    records, scheduling = r["batches_records"], r["batches_scheduling_ms"]
    assert max(records[:8]) > 40000, r  # the initial rate at work
    assert max(scheduling) > 1000, r  # ... more than a batch can process: a backlog formed
    assert max(scheduling[-6:]) < 1000, r  # drained: the receivers were slowed down
    assert 12000 < sum(records[-6:]) / 6 < 40000, r  # and run near what a batch can process
