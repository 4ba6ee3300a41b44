"""A mapWithState state held on the driver (``spark.sparkwal.state.driverMaxKeys``, after receivers
that precompute a ``reduceByKey``) under SIGKILL: the driver is killed at random moments, with
every line offered so far acknowledged (stored in the receiver WAL) but not all processed, and
restarted; the state must end exact: restored from the snapshots the driver wrote, the batches
since re-run from the WAL (in the executors), then held on the driver again."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

from sparkwal.engine.receiver.acked_lines import AckedLineSource

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECRET = "driver-state-crash-secret"
KEYS, PER_PHASE, PHASES = 300, 3000, 3


def start(workdir, port: int, total: int) -> subprocess.Popen:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT, DRIVER_STATE_SECRET=SECRET)
    err = open(os.path.join(workdir, "app.log"), "a")
    return subprocess.Popen([sys.executable, os.path.join(HERE, "driver_state_crash_app.py"), str(workdir),
                             str(port), str(total)], stdout=subprocess.DEVNULL, stderr=err, env=env,
                            start_new_session=True)


def snapshots_written(workdir) -> int:
    state = os.path.join(workdir, "ckpt", "state")
    return sum(n.endswith(".manifest") for n in os.listdir(state)) if os.path.isdir(state) else 0


def offer_phase(source: AckedLineSource, phase: int, expected: Counter) -> None:
    """Offer a phase's lines in steps over about 3 s (several batches take them), and wait until
    every one is acknowledged: stored in the receiver WAL, so none may be lost."""
    first = phase * PER_PHASE
    for step in range(0, PER_PHASE, 300):
        lines = [f"r{i} k{(i * 7) % KEYS}" for i in range(first + step, first + step + 300)]
        source.offer(lines)
        expected.update(line.split()[1] for line in lines)
        time.sleep(0.3)  # paced like a source, not a clock the app could be handed
    assert source.wait_acked(first + PER_PHASE, 120), f"phase {phase}'s lines were not acknowledged"


def wait_for(what: str, ready, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the app exited with {proc.returncode} waiting for {what} (see app.log)"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def test_a_driver_held_state_is_exact_after_sigkills_at_random_moments(tmp_path):
    total = PER_PHASE * PHASES
    source = AckedLineSource(SECRET)
    expected: Counter = Counter()
    rng = random.Random(23)
    try:
        for phase in range(PHASES):
            connections = source.statistics().connections
            proc = start(tmp_path, source.address[1], total)
            try:
                wait_for("receiver connection", lambda: source.statistics().connections > connections, proc)
                seen = snapshots_written(tmp_path)
                offer_phase(source, phase, expected)
                if phase == PHASES - 1:
                    assert proc.wait(timeout=180) == 0, "the last run failed (see app.log)"
                    break
                wait_for("two state snapshots", lambda: snapshots_written(tmp_path) >= seen + 2, proc)
                time.sleep(rng.uniform(0.0, 0.6))  # the newest acknowledged lines are not all processed yet
                assert proc.poll() is None and not (tmp_path / "final.json").exists(), "finished too early"
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        source.close()
    assert source.statistics().lines_resent == 0  # every line was acknowledged before each kill
    final = json.loads((tmp_path / "final.json").read_text())
    assert final == dict(expected), "the state differs"
    batches = [json.loads(line) for line in (tmp_path / "batches.jsonl").read_text().splitlines()]
    runs: dict[int, list[bool]] = {}  # a run's batches with records, in order: held on the driver or not
    for b in batches:
        runs.setdefault(b["run"], []).append(b["on_driver"])
    places = list(runs.values())
    # the first run held the state on the driver; a restart re-ran batches in the executors (a run
    # killed early may have completed none); the last run ended with the state back on the driver
    assert all(places[0]) and not all(map(all, places)) and places[-1][-1], runs
