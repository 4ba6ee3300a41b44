"""A mapWithState state held on the driver (``spark.sparkwal.state.driverMaxKeys``, after receivers
that precompute a ``reduceByKey``) under SIGKILL: the driver is killed at random moments, with
every line offered so far acknowledged (stored in the receiver WAL) but not all processed, and
restarted; the state must end exact: restored from the snapshots the driver wrote, the batches
since re-run from the WAL (in the executors), then held on the driver again. The first kill comes
inside a batch with records (held by the app's test hook), so a re-run is certain, not left to timing.
The last run takes over from a hot standby by a handover (``sparkwal checkpoint handover``) while
lines keep coming: the state its first batch builds on is read ahead to the driver by the takeover."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from sparkwal.engine.receiver.acked_lines import AckedLineSource

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECRET = "driver-state-crash-secret"
KEYS, PER_PHASE, PHASES = 300, 3000, 4


def start(workdir, port: int, total: int, *more: str) -> subprocess.Popen:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT, DRIVER_STATE_SECRET=SECRET)
    err = open(os.path.join(workdir, "app.log"), "a")
    return subprocess.Popen([sys.executable, os.path.join(HERE, "driver_state_crash_app.py"), str(workdir),
                             str(port), str(total), *more], stdout=subprocess.DEVNULL, stderr=err, env=env,
                            start_new_session=True)


def snapshots_written(workdir) -> int:
    state = os.path.join(workdir, "ckpt", "state")
    return sum(n.endswith(".manifest") for n in os.listdir(state)) if os.path.isdir(state) else 0


def offer_lines(source: AckedLineSource, first: int, end: int, expected: Counter) -> None:
    """Offer lines [first, end) in steps of 300, 0.3 s apart (several batches take them), and wait
    until every one is acknowledged: stored in the receiver WAL, so none may be lost."""
    for step in range(first, end, 300):
        lines = [f"r{i} k{(i * 7) % KEYS}" for i in range(step, min(step + 300, end))]
        source.offer(lines)
        expected.update(line.split()[1] for line in lines)
        time.sleep(0.3)  # paced like a source, not a clock the app could be handed
    assert source.wait_acked(end, 120), f"lines up to {end} were not acknowledged"


def wait_for(what: str, ready, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the app exited with {proc.returncode} waiting for {what} (see app.log)"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def hand_over(workdir, source: AckedLineSource, leader: subprocess.Popen, total: int, lines: tuple[int, int],
              expected: Counter) -> subprocess.Popen:
    """Start a hot standby, offer ``lines`` (the last phase's) while ``sparkwal checkpoint handover``
    moves the leadership to it; the leader must exit by itself. Returns the standby."""
    standby = start(workdir, source.address[1], total, "standby")
    try:
        wait_for("the standby", (workdir / f"started-{standby.pid}").exists, standby)
        feeding = threading.Thread(target=offer_lines, args=(source, *lines, expected))
        feeding.start()
        try:
            handed = subprocess.run([sys.executable, "-m", "sparkwal", "checkpoint", "handover", str(workdir / "ckpt"),
                                     "--timeout", "120"], capture_output=True, text=True, timeout=180,
                                    env=dict(os.environ, PYTHONPATH=ROOT))
        finally:
            feeding.join()
        assert handed.returncode == 0, handed.stdout + handed.stderr
        assert leader.wait(timeout=120) == 0, "the leader did not stop by itself (see app.log)"
    except BaseException:
        os.killpg(standby.pid, signal.SIGKILL)
        standby.wait()
        raise
    return standby


@pytest.mark.driver
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
                first, end = phase * PER_PHASE, (phase + 1) * PER_PHASE
                if phase == PHASES - 2:  # a standby takes over by a handover, the last phase's lines coming
                    offer_lines(source, first, end, expected)
                    resent = source.statistics().lines_resent  # every line was acknowledged before each kill
                    proc = hand_over(tmp_path, source, proc, total, (end, total), expected)
                    assert proc.wait(timeout=180) == 0, "the standby that took over failed (see app.log)"
                    break
                held = phase == 0  # the first kill comes inside a batch with records, so one is re-run
                offer_lines(source, first, end - 300 if held else end, expected)
                wait_for("two state snapshots", lambda: snapshots_written(tmp_path) >= seen + 2, proc)
                if held:
                    (tmp_path / "hold").touch()
                    offer_lines(source, end - 300, end, expected)
                    wait_for("a batch held", (tmp_path / "held").exists, proc)
                else:
                    time.sleep(rng.uniform(0.0, 0.6))  # the newest acknowledged lines may not all be processed
                assert proc.poll() is None and not (tmp_path / "final.json").exists(), "finished too early"
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                for name in ("hold", "held"):
                    (tmp_path / name).unlink(missing_ok=True)
    finally:
        source.close()
    assert "took over" in (tmp_path / "app.log").read_text()
    assert resent == 0  # (the receiver stopped by the handover may leave lines in flight: sent again)
    final = json.loads((tmp_path / "final.json").read_text())
    assert final == dict(expected), "the state differs"
    batches = [json.loads(line) for line in (tmp_path / "batches.jsonl").read_text().splitlines()]
    runs: dict[int, list[bool]] = {}  # a run's batches with records, in order: held on the driver or not
    for b in batches:
        runs.setdefault(b["run"], []).append(b["on_driver"])
    places = list(runs.values())
    # the first run held the state on the driver; the restart after the held batch re-ran it in the
    # executors; the run that took over ended with the state back on the driver
    assert all(places[0]) and not all(places[1]) and places[-1][-1], runs
