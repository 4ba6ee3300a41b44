"""The nemesis drill, short and seeded: the main job with its checkpoint on S3 behind the fault
proxy, struck once by each nemesis (a SIGKILL, a storm of 5xx/resets/delays it must absorb, an
outage longer than its storage deadline it must stop on with status 4 and resume after); nothing
lost, nothing counted twice, the running state exact. The 100-fault run: docs/storage-faults.md."""

from __future__ import annotations

import pytest

from engine.apps.nemesis_drill import run

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def test_a_kill_a_storm_and_an_outage_lose_nothing_and_count_nothing_twice(tmp_path):
    r = run(faults=3, files=30, batch=1.0, seed=1, workdir=str(tmp_path))
    assert sorted(r["nemeses"]) == ["kill", "outage", "storm"], r
    assert r["kills"] == 1 and r["storms"] == 1 and r["outages"] == 1
    assert r["clean_stops"] == 1 and r["unclean_stops"] == 0, r["unclean"]
    assert r["faulted_requests"] >= 5 and {"503"} <= set(r["faults_injected"])
    assert r["files_missing"] == [] and r["records_lost"] == 0 and r["records_doubled"] == 0
    assert r["words_lost"] == 0 and r["words_extra"] == 0 and r["state_mismatches"] == 0
    assert r["final_totals_exact"] and r["ok"], r
