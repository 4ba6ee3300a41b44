"""A checkpoint moves, and a copy never harms its original: what a checkpoint names inside itself
is named relative to it, so a driver on a copy (made by hand, or by ``sparkwal checkpoint copy``,
also while the original's driver runs, also to S3 and back) reads, writes and deletes only its own
files and restarts with its state exact, while the original stays byte for byte as it was."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from sparkwal.checkpoint import Checkpoint, read_checkpoint
from sparkwal.checkpoint.copy import CopyError, copy_checkpoint
from sparkwal.engine import StreamingContext
from test_engine_recovery import Completed, put_file
from test_engine_state import SnapshotApp, words_at
from sparkwal.wal import ManualClock


def digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and the SHA-256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def expected_totals(last_ms: int) -> list:
    c = Counter()
    for t in range(500, last_ms + 1, 500):
        c.update(words_at(t).split())
    return sorted(c.items())


def run_batches(app: SnapshotApp, ckpt, start_ms: int, last_ms: int, *, upgrade: bool, options=None) -> None:
    """``app`` (re)started on ``ckpt`` half a batch after ``start_ms``, one input file per batch
    up to ``last_ms``, then stopped."""
    app.ckpt, app.options = ckpt, options
    clock, done = ManualClock(start_ms + 200), Completed()
    ssc = StreamingContext.getOrCreate(str(ckpt), app.setup(clock, done), upgrade=upgrade,
                                       storage_options=options)
    ssc.start()
    for t in range(start_ms + 500, last_ms + 1, 500):
        put_file(app.indir, f"{t}.txt", words_at(t), t - 100)
        clock.set_ms(t)
        done.wait_for(t)
    ssc.stop(stopSparkContext=False)
    ssc.awaitTerminationOrTimeout(0)


@pytest.fixture
def original(spark_context, tmp_path):
    """A stateful app's checkpoint after batch 3000, its state in snapshots (full and deltas)."""
    app = SnapshotApp(spark_context, tmp_path)
    run_batches(app, tmp_path / "ckpt", 0, 3000, upgrade=False)
    assert list((tmp_path / "ckpt" / "state").glob("*.manifest"))
    return app


@pytest.mark.slow
def test_a_driver_on_a_hand_made_copy_never_touches_the_original(original, tmp_path):
    before = digest(original.ckpt)
    copy = tmp_path / "copy"
    shutil.copytree(original.ckpt, copy)
    # enough batches on the copy that its earliest snapshots are retired and deleted
    run_batches(original, copy, 3000, 8000, upgrade=True)
    assert digest(tmp_path / "ckpt") == before
    assert original.totals[8000] == expected_totals(8000)
    copied = {Path(n).name for n in before if n.endswith(".manifest")}
    assert copied - {p.name for p in (copy / "state").glob("*.manifest")}  # the copy deleted its own
    # and the original still restarts, its state whole
    original.totals.clear()
    run_batches(original, tmp_path / "ckpt", 3000, 3500, upgrade=True)
    assert original.totals[3500] == expected_totals(3500)


def test_a_moved_checkpoint_restarts_where_it_is(original, tmp_path):
    moved = tmp_path / "elsewhere" / "ckpt"
    moved.parent.mkdir()
    os.rename(original.ckpt, moved)
    run_batches(original, moved, 3000, 4000, upgrade=True)
    assert original.totals[4000] == expected_totals(4000)
    names = [r["url"] for s in read_checkpoint(str(moved)).data["state"].values() for r in s["snapshots"].values()]
    assert names and all(n.startswith("state/") for n in names)  # relative: the checkpoint moves


def absolute_names(ckpt: Path) -> None:
    """Rewrite every checkpoint file of ``ckpt`` as sparkwal wrote it before names were
    relative: each state snapshot by its absolute path."""
    for f in ckpt.glob("checkpoint-*"):
        cp = Checkpoint.decode(f.read_bytes())
        for stream in cp.data["state"].values():
            for ref in stream["snapshots"].values():
                ref["url"] = str(ckpt / ref["url"])
        f.write_bytes(Checkpoint(cp.checkpoint_time_ms, cp.pending_times_ms, cp.data).encode())


def test_an_older_checkpoint_with_absolute_names_recovers_in_place(original, tmp_path):
    absolute_names(original.ckpt)
    run_batches(original, original.ckpt, 3000, 5000, upgrade=True)
    assert original.totals[5000] == expected_totals(5000)


@pytest.mark.slow
def test_a_copy_of_an_older_checkpoint_reads_its_own_files_and_says_so(original, tmp_path, caplog):
    home = original.ckpt
    absolute_names(home)
    before = digest(home)
    copy = tmp_path / "copy"
    shutil.copytree(home, copy)
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine"):
        run_batches(original, copy, 3000, 8000, upgrade=True)
    assert digest(home) == before  # not one snapshot of the original deleted
    assert original.totals[8000] == expected_totals(8000)
    said = [r.getMessage() for r in caplog.records if "where an older sparkwal wrote it" in r.getMessage()]
    assert said and f"under {home}," in said[0] and f"read from {copy}," in said[0]


@pytest.mark.slow
def test_checkpoint_copy_to_s3_and_back_restarts_exact(original, tmp_path, s3_url):
    base, options = s3_url
    home = original.ckpt
    before = digest(home)
    up = copy_checkpoint(str(home), f"{base}/backup", destination_options=options)
    assert up.problems == [] and up.checkpoint_time_ms == 3000 and up.files > 3
    back = tmp_path / "restored"
    down = copy_checkpoint(f"{base}/backup", str(back), source_options=options)
    assert down.problems == [] and down.checkpoint_time_ms == 3000
    assert digest(home) == before
    run_batches(original, back, 3000, 4500, upgrade=True)
    assert original.totals[4500] == expected_totals(4500)
    # the copy on S3 restarts in place too
    original.totals.clear()
    run_batches(original, f"{base}/backup", 3000, 3500, upgrade=True, options=options)
    assert original.totals[3500] == expected_totals(3500)


@pytest.mark.slow
def test_checkpoint_copy_of_a_running_driver_recovers_to_a_completed_batch(spark_context, tmp_path):
    """Copies taken while batches run, state snapshots are written and old ones deleted: each
    restarts from the batch its checkpoint names, with its totals exact from there on."""
    app = SnapshotApp(spark_context, tmp_path)
    app.ckpt = tmp_path / "ckpt"
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock, done))
    ssc.start()
    copies, stop = [], threading.Event()

    def feed():
        for t in range(500, 5001, 500):
            put_file(app.indir, f"{t}.txt", words_at(t), t - 100)
            clock.set_ms(t)
            done.wait_for(t)
        stop.set()

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        while not stop.is_set() or len(copies) < 2:
            dst = tmp_path / f"copy{len(copies)}"
            report = copy_checkpoint(str(app.ckpt), str(dst))
            assert report.problems == []
            copies.append((dst, report.checkpoint_time_ms))
    finally:
        feeder.join()
        ssc.stop(stopSparkContext=False)
        ssc.awaitTerminationOrTimeout(0)
    assert len({t for _, t in copies}) > 1  # the copies saw the stream move on
    for dst, time_ms in copies[-2:]:
        app.totals.clear()
        run_batches(app, dst, 5000, 5500, upgrade=True)
        assert app.totals[5500] == expected_totals(5500), f"the copy of batch {time_ms}"


def test_a_copy_starts_again_when_the_driver_deletes_what_it_needs(original, tmp_path, monkeypatch):
    """A snapshot the checkpoint names, deleted by the driver's clean-up before it was copied."""
    from sparkwal.wal.backends import LocalStorage

    real, gone = LocalStorage.read_file, []

    def read_file(self, path):
        if path.endswith(".manifest") and not gone:
            gone.append(path)
            raise FileNotFoundError(path)
        return real(self, path)

    monkeypatch.setattr(LocalStorage, "read_file", read_file)
    report = copy_checkpoint(str(original.ckpt), str(tmp_path / "copy"), sleep=lambda s: None)
    assert gone and report.attempts == 2 and report.problems == []


def sparkwal(*args, expect: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sparkwal", *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == expect, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.mark.slow
def test_the_copy_command_says_what_it_copied_and_refuses_what_it_cannot(original, tmp_path):
    out = sparkwal("checkpoint", "copy", original.ckpt, tmp_path / "c1", expect=0).stdout
    assert out.startswith(f"OK: copied {original.ckpt} to {tmp_path / 'c1'}")
    assert "a restart resumes from the checkpoint of batch" in out
    # what a copy does not carry: the inputs, named as the checkpoint knows them
    assert f"NOT COPIED: the inputs its program reads (files:{original.indir} (stream 0))" in out, out
    sparkwal("checkpoint", "verify", tmp_path / "c1", expect=0)
    for src, dst, why in [
        (tmp_path / "missing", tmp_path / "c2", "no such checkpoint directory"),
        (original.indir, tmp_path / "c2", "is not a sparkwal checkpoint"),
        (original.ckpt, tmp_path / "c1", "is not empty"),
        (original.ckpt, original.ckpt / "inside", "overlap"),
    ]:
        text = sparkwal("checkpoint", "copy", src, dst, expect=1)
        assert why in text.stdout + text.stderr and "Traceback" not in text.stderr
        assert len((text.stdout + text.stderr).strip().splitlines()) == 1
        assert why in sparkwal("checkpoint", "copy", src, dst, "--json", expect=1).stdout
    assert not (original.ckpt / "inside").exists() and not (tmp_path / "c2").exists()


def test_copy_error_is_a_checkpoint_error():
    from sparkwal.checkpoint import CheckpointError

    assert issubclass(CopyError, CheckpointError)
