"""The kill-and-restart drill, short: the word count app killed with SIGKILL (driver and JVM)
at random moments loses no record, counts none twice, and its updateStateByKey running totals
survive every kill."""

from __future__ import annotations

import pytest

from engine.drill import run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("upgrade", [False, True], ids=["from-checkpoint", "upgrade"])
def test_short_drill_loses_nothing_and_duplicates_nothing(tmp_path, upgrade):
    """Both recovery paths: the program from the checkpoint (pyspark's getOrCreate contract),
    and code-free with upgrade=True."""
    r = run(kills=2, files=12, batch=1.0, seed=3, workdir=str(tmp_path), upgrade=upgrade)
    assert r["restarts"] == 2
    # each restart took the mode's path ("new" only where the kill came before the first checkpoint)
    assert r["recovery_paths"] == r["recovery_paths_expected"]
    assert set(r["recovery_paths"]) <= {"new", "upgrade" if upgrade else "checkpoint"}
    assert r["files_missing"] == [] and r["records_lost"] == 0
    assert r["duplicate_files"] == 0 and r["words_extra"] == 0 and r["words_lost"] == 0
    assert r["state_mismatches"] == 0 and r["final_totals_exact"]
    assert len(r["recovery_s"]) == 2
