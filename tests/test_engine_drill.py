"""The kill-and-restart drill, short: the word count app killed with SIGKILL (driver and JVM)
at random moments loses no record, counts none twice, and its updateStateByKey running totals
survive every kill."""

from __future__ import annotations

import pytest

from sparkwal.engine.apps.drill import run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("upgrade", [False, True], ids=["from-checkpoint", "upgrade"])
@pytest.mark.driver
def test_short_drill_loses_nothing_and_duplicates_nothing(tmp_path, upgrade):
    """Both recovery paths: the program from the checkpoint (pyspark's getOrCreate contract),
    and code-free with upgrade=True."""
    r = run(kills=1, files=12, batch=1.0, seed=3, workdir=str(tmp_path), upgrade=upgrade)
    assert r["restarts"] == 1
    # each restart took the mode's path ("new" only where the kill came before the first checkpoint)
    assert r["recovery_paths"] == r["recovery_paths_expected"]
    assert set(r["recovery_paths"]) <= {"new", "upgrade" if upgrade else "checkpoint"}
    assert r["files_missing"] == [] and r["records_lost"] == 0
    assert r["duplicate_files"] == 0 and r["words_extra"] == 0 and r["words_lost"] == 0
    assert r["state_mismatches"] == 0 and r["final_totals_exact"]
    assert len(r["recovery_s"]) == 1


def events_of(workdir, *args) -> list[dict]:
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sparkwal.engine.wordcount", "--dir", str(workdir), "--json",
                          *map(str, args)], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    assert out.returncode == 0, out.stderr[-2000:]
    # Spark's start-up lines stay out of the way (the main job's quiet log4j configuration)
    assert "log4j" not in out.stderr and "NativeCodeLoader" not in out.stderr, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.driver
def test_the_main_job_reports_its_batches_and_what_a_restart_recovered(tmp_path):
    # a graceful stop that waits for the batches due (a busy machine's first batch took 11 s)
    patient = ("--conf", "spark.streaming.gracefulStopTimeout=120s")
    first = events_of(tmp_path, "--files", 2, "--seconds", 4, *patient)
    assert first[0] == {"event": "context", "recovery": "new"}
    assert sum(e["records"] for e in first if e["event"] == "batch_completed") == 6  # 3 lines a file
    assert first[-1]["event"] == "stopped" and first[-1]["records"] == 6 and first[-1]["rerun_batches"] == 0
    again = events_of(tmp_path, "--files", 3, "--seconds", 4, *patient)
    assert again[0] == {"event": "context", "recovery": "checkpoint"}
    stopped = again[-1]
    assert stopped["rerun_batches"], "the batches due while the app was down are re-run"
    rerun = stopped["rerun"]  # a count and a range, not every batch time
    assert rerun["count"] == stopped["rerun_batches"] and rerun["first_ms"] <= rerun["last_ms"]
    assert stopped["records"] == 3 and stopped["outputs"] == 3  # the third file, counted once
    # the state it resumed with (the words of the first two files), and where it ended (all three)
    from sparkwal.engine.apps.wordcount_data import expected_counts

    resumed = next(e for e in again if e["event"] == "resumed")
    assert resumed["counted"] == sum(expected_counts([0, 1]).values()) and resumed["as_of_ms"] < rerun["first_ms"]
    assert next(e for e in again if e["event"] == "totals")["counted"] == sum(expected_counts([0, 1, 2]).values())


def test_the_main_jobs_restart_line_says_what_it_catches_up_on(capsys):
    """A restart's line, for a person: the batch times it catches up on, not a re-run that reads
    like a failure (what a restart's falling behind is: tests/test_operability.py)."""
    from types import SimpleNamespace

    from sparkwal.engine.apps.progress import recovered

    t0 = 1_796_366_204_000
    ssc = SimpleNamespace(batchLog=None, receivedBlockTracker=None, rerun_batch_times=[t0 + i * 1000 for i in range(9)],
                          skipped_batch_times=[t0 - 1000])
    recovered(ssc, False, 1.0)
    line = capsys.readouterr().out.strip()
    assert line.startswith("recovered: catching up 9 batch times (") and "missed while stopped (9 s of input)" in line
    assert line.endswith("; 1 batch(es) done before the stop not output again"), line
