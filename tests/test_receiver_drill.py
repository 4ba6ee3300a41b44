"""Receivers under real kills (SIGKILL), with a reliable receiver whose source only forgets what
was acknowledged: every acknowledged line is counted, none is lost, and the only duplicates are
lines the source had to send again. Executor kills use local-cluster (separate executor JVMs)."""

from __future__ import annotations

import pytest

from sparkwal.engine.apps.receiver_drill import run

pytestmark = pytest.mark.slow


def _check(r: dict) -> None:
    assert r["records_lost"] == 0, r["lost_ids"]
    assert r["unknown_ids"] == []
    assert r["lines_acked"] == r["lines_offered"] > 0
    assert r["duplicates"] <= r["lines_resent"], "a duplicate that the source never re-sent"
    assert r["words_exact"] and r["state_mismatches"] == 0
    assert r["ok"]


@pytest.mark.compat
@pytest.mark.driver
def test_executor_jvm_and_python_worker_kills_on_local_cluster(tmp_path):
    """The receiver's executor JVM, then its Python worker (now on the other executor): each time
    the receiver comes back and the counts stay exact (the driver's kill: the test below)."""
    r = run(kills=2, lines=160, batch=1.0, seed=4, workdir=str(tmp_path), master="local-cluster[2,1,1024]",
            kinds=("executor", "worker"), cycle=True, lines_per_s=20, min_gap_s=3, max_gap_s=4)
    _check(r)
    assert {k: v["kills"] for k, v in r["kills_by_kind"].items()} == {"executor": 1, "worker": 1}
    assert all("recovery_s" in k for k in r["kill_log"]), r["kill_log"]  # a receiver registered again


@pytest.mark.driver
def test_driver_kills_resume_from_the_wal_on_local(tmp_path):
    """Blocks in the receiver WAL but in no batch yet when the driver dies are processed after the
    restart, and re-run batches get the same blocks (outputs are replaced, never doubled)."""
    r = run(kills=1, lines=200, batch=1.0, seed=9, workdir=str(tmp_path), kinds=("driver",),
            lines_per_s=25, min_gap_s=3, max_gap_s=5)
    _check(r)
    assert r["restarts"] == 1
