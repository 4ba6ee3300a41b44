"""Checkpoints written by earlier sparkwal releases still recover, their programs pickled by the
module paths of their time:

* ``fixtures/pre_move`` (made by ``fixtures/make_pre_move_checkpoints.py`` at commit 5caa667),
  before the engine moved into rooms (issue 31): ``engine.wordcount``'s functions, the DStream
  classes of ``engine.dstream``, ``engine.inputs`` and ``engine.state``;
* ``fixtures/pre_package`` (made by ``fixtures/make_pre_package_checkpoints.py`` at commit
  08f1519), while the rooms were the top-level packages ``engine``, ``wal``, ``checkpoint`` and
  ``tracker`` (before ``sparkwal.*``, issue 42), state snapshots named relative to the checkpoint.

A program's module names are translated to ``sparkwal.*`` when it is read, and the old paths inside
the engine still resolve. Each set holds the main job's checkpoint and a stateful app's; both are
recovered here and run one new batch on top of their state.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sparkwal.checkpoint import read_checkpoint
from sparkwal.engine import StreamingContext
from test_engine_recovery import Completed
from sparkwal.wal import ManualClock

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = ["pre_move", "pre_package"]


def put_file(directory: str, name: str, text: str, mtime_ms: int) -> None:
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.utime(tmp, (mtime_ms / 1000, mtime_ms / 1000))
    os.replace(tmp, os.path.join(directory, name))


def recover(tmp_path, monkeypatch, release: str, name: str):
    """The fixture's copy in tmp_path (its programs use relative paths), recovered on a manual
    clock half a batch after its checkpoint: returns the context, the clock, the listener and the
    checkpoint's time."""
    shutil.copytree(FIXTURES / release / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    checkpoint = f"{name}/checkpoint"
    cp_ms = read_checkpoint(checkpoint).checkpoint_time_ms
    clock = ManualClock(cp_ms + 500)

    def setup():
        raise AssertionError("the checkpoint was not recovered: setupFunc ran")
    # the fixtures were written by an application of their own name, not this suite's SparkContext's
    ssc = StreamingContext.getOrCreate(checkpoint, setup, clock=clock, allow_other_app=True)
    assert ssc.recovery == "checkpoint"
    done = Completed()
    ssc.addStreamingListener(done)
    return ssc, clock, done, cp_ms


def main_job_batch(ssc, clock, done, n: int, batch_ms: int) -> dict:
    """Run ``ssc`` (the main job, recovered) for the batch of ``batch_ms``, file ``n`` arriving
    before it: that batch's output."""
    from sparkwal.engine.wordcount import file_lines

    try:
        ssc.start()
        put_file("wordcount/input", f"f{n:06d}.txt", "\n".join(file_lines(n)) + "\n", batch_ms - 100)
        clock.set_ms(batch_ms)
        done.wait_for(batch_ms)
    finally:
        ssc.stop(stopSparkContext=False)
    return json.loads(Path(f"wordcount/output/batch-{batch_ms}.json").read_text())


@pytest.mark.parametrize("release", RELEASES)
def test_the_main_jobs_earlier_checkpoint_recovers_with_its_totals(spark_context, tmp_path, monkeypatch, release):
    from sparkwal.engine.wordcount import expected_counts

    ssc, clock, done, cp_ms = recover(tmp_path, monkeypatch, release, "wordcount")
    out = main_job_batch(ssc, clock, done, 3, cp_ms + 1000)
    assert out["files"] == ["f3"]
    assert out["totals"] == expected_counts(range(4))  # the fixture counted files 0-2
    # the recovered program, checkpointed again in today's layout, recovers too
    clock = ManualClock(cp_ms + 1500)
    ssc = StreamingContext.getOrCreate("wordcount/checkpoint", lambda: None, clock=clock)
    done = Completed()
    ssc.addStreamingListener(done)
    out = main_job_batch(ssc, clock, done, 4, cp_ms + 2000)
    assert out["files"] == ["f4"] and out["totals"] == expected_counts(range(5))


@pytest.mark.parametrize("release", RELEASES)
def test_a_stateful_apps_earlier_checkpoint_recovers_its_state_and_window(spark_context, tmp_path,
                                                                          monkeypatch, release):
    ssc, clock, done, cp_ms = recover(tmp_path, monkeypatch, release, "stateful")
    try:
        ssc.start()
        put_file("stateful/input", "2.txt", "a d\n", cp_ms + 900)
        clock.set_ms(cp_ms + 1000)
        done.wait_for(cp_ms + 1000)
    finally:
        ssc.stop(stopSparkContext=False)

    def output(kind):
        return dict(map(tuple, json.loads(Path(f"stateful/{kind}/batch-{cp_ms + 1000}.json").read_text())))
    assert output("totals") == {"a": 2, "b": 2, "c": 2, "d": 1}  # updateStateByKey: 'a b', 'b c c', 'a d'
    assert output("mapped") == {"a": 2, "d": 1}  # mapWithState's running count of the keys seen
    assert output("window")["a"] == 1 and output("window")["d"] == 1
