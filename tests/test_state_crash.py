"""Delta chains under SIGKILL: an app counting 60,000 lines over 50,000 keys with mapWithState and
updateStateByKey, snapshotted every batch, is killed at random moments (mid-batch, mid-snapshot,
mid-checkpoint) and restarted each time; both states must end exact. The second run is a new version
of the program (an upgrade: every stream moved, mapWithState repartitioned from 4 to 6, updateStateByKey
at state version 2 migrating the counts), killed during its first batch; the last run is that version
again."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from sparkwal.checkpoint import read_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KEYS, PER_FILE, FILES = 50_000, 20_000, 3
#: the oldest PySpark sparkwal supports, in a virtualenv of its own: the README's test command makes it
#: (``.venv35``, PySpark 3.5.0) before the suite runs; SPARKWAL_OLDEST_PYSPARK_PYTHON names another
OLDEST_PYSPARK_PYTHON = os.environ.get("SPARKWAL_OLDEST_PYSPARK_PYTHON", os.path.join(ROOT, ".venv35", "bin", "python"))


def start(workdir, version: int = 1, *more: str, rate: int = 5000, python: str = sys.executable) -> subprocess.Popen:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT, STATE_CRASH_RATE=str(rate))
    err = open(os.path.join(workdir, "app.log"), "a")
    return subprocess.Popen([python, os.path.join(HERE, "state_crash_app.py"), str(workdir),
                             str(PER_FILE * FILES), str(version), *more], stdout=subprocess.DEVNULL, stderr=err,
                            env=env, start_new_session=True)


def write_log(log) -> Counter:
    log.mkdir()
    expected: Counter = Counter()
    for f in range(FILES):
        keys = [f"k{(f * PER_FILE + j) * 7 % KEYS}" for j in range(PER_FILE)]
        (log / f"p{f}").write_text("".join(k + "\n" for k in keys))
        expected.update(keys)
    return expected


def wait_for(path, proc, what: str) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, f"{what} exited with {proc.returncode} (see app.log)"
        assert time.monotonic() < deadline, f"{what}: no {path.name} in 120 s"
        time.sleep(0.02)


def snapshots_written(workdir) -> int:
    state = os.path.join(workdir, "ckpt", "state")
    return sum(n.endswith(".manifest") for n in os.listdir(state)) if os.path.isdir(state) else 0


@pytest.mark.driver
def test_state_is_exact_after_sigkills_at_random_points_of_delta_chains(tmp_path):
    import json

    expected = write_log(tmp_path / "log")
    rng = random.Random(17)
    for version in (1, 2):
        proc = start(tmp_path, version)
        try:
            if version == 1:  # wait for this run's first snapshots, then kill it at a random moment
                seen = snapshots_written(tmp_path)
                deadline = time.monotonic() + 120
                while snapshots_written(tmp_path) < seen + 2 and time.monotonic() < deadline:
                    assert proc.poll() is None, f"run {version} exited with {proc.returncode} (see app.log)"
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 1.5))
            else:  # the upgrade, killed during its first batch (0.5 s batches; it re-runs the one cut short)
                wait_for(tmp_path / f"started-{proc.pid}", proc, "the upgrade")
                time.sleep(rng.uniform(0.0, 0.5))
            assert proc.poll() is None and not (tmp_path / "final.json").exists(), "finished too early"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    proc = start(tmp_path, 2)
    assert proc.wait(timeout=300) == 0, "the last run failed (see app.log)"
    final = json.loads((tmp_path / "final.json").read_text())
    assert final["m"] == dict(expected), "mapWithState's state differs"
    assert final["u"] == dict(expected), "updateStateByKey's state differs"
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "ckpt" / "state").glob("*.manifest")]
    assert {m["kind"] for m in manifests} == {"full", "delta"}
    data = read_checkpoint(str(tmp_path / "ckpt")).data
    assert data["state_slots"], "the upgrade did not move the states"
    newest = {index: chain["snapshots"][max(chain["snapshots"], key=int)]["url"]
              for index, chain in data["state"].items()}
    read = {index: json.loads((tmp_path / "ckpt" / f"{url}.manifest").read_text()) for index, url in newest.items()}
    assert sorted((m.get("state_version", 1), m["num_partitions"]) for m in read.values()) == [(1, 6), (2, 2)]


@pytest.mark.driver
def test_a_standby_on_the_new_version_and_the_newest_pyspark_takes_over_by_a_handover_with_every_state_exact(
        tmp_path):
    """Version 1 runs on the oldest PySpark sparkwal supports (3.5); version 2, on the newest, waits
    as a hot standby beside it (``upgrade=True, standby=True``), taking each of its checkpoints by the
    upgrade's plan; ``sparkwal checkpoint handover`` asks version 1 to finish its batches and give the
    leadership up (it exits by itself); version 2 takes over with the states moved, repartitioned and
    migrated, and ends exact."""
    import json

    import pyspark

    assert os.access(OLDEST_PYSPARK_PYTHON, os.X_OK), (
        f"{OLDEST_PYSPARK_PYTHON}: no Python with PySpark 3.5 (the README's test command makes .venv35 first)")
    expected = write_log(tmp_path / "log")
    old = start(tmp_path, 1, rate=1000, python=OLDEST_PYSPARK_PYTHON)  # 20 s of lines: both versions run batches
    new = None
    try:
        seen = 0
        deadline = time.monotonic() + 120
        while snapshots_written(tmp_path) < seen + 2 and time.monotonic() < deadline:
            assert old.poll() is None, f"version 1 exited with {old.returncode} (see app.log)"
            time.sleep(0.05)
        new = start(tmp_path, 2, "standby", rate=1000)
        wait_for(tmp_path / f"started-{new.pid}", new, "the standby")
        assert (tmp_path / f"started-{old.pid}").read_text().startswith("3.5.")
        assert (tmp_path / f"started-{new.pid}").read_text() == pyspark.__version__
        assert not (tmp_path / f"leads-{new.pid}").exists() and not (tmp_path / "final.json").exists()
        handed = subprocess.run([sys.executable, "-m", "sparkwal", "checkpoint", "handover", str(tmp_path / "ckpt"),
                                 "--json", "--timeout", "120"], capture_output=True, text=True, timeout=180,
                                env=dict(os.environ, PYTHONPATH=ROOT))
        assert handed.returncode == 0, handed.stdout + handed.stderr
        said = json.loads(handed.stdout)
        assert said["ok"] and said["to_epoch"] > said["from_epoch"]
        assert old.wait(timeout=120) == 0, "version 1 did not stop by itself (see app.log)"
    finally:
        if old.poll() is None:
            os.killpg(old.pid, signal.SIGKILL)
            old.wait()
    assert new.wait(timeout=300) == 0, "the new version failed (see app.log)"
    assert (tmp_path / f"leads-{new.pid}").exists()
    final = json.loads((tmp_path / "final.json").read_text())
    assert final["m"] == dict(expected) and final["u"] == dict(expected)
    data = read_checkpoint(str(tmp_path / "ckpt")).data
    assert data["state_slots"] and {r["state_version"] for r in data["identities"].values()} == {1, 2}
    assert "took over" in (tmp_path / "app.log").read_text()
