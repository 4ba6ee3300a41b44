"""A program knows its checkpoint: the main job and the drills refuse a checkpoint another program
wrote (recovering it would run that program on that program's inputs) with one line naming both,
exit status 2, before any JVM; through the API, recovering a checkpoint whose ``spark.app.name`` is
not the running context's is refused naming both (an upgrade, which runs the caller's code, warns),
unless allowed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkwal.checkpoint import Checkpoint
from sparkwal.engine import StreamingContext
from test_engine_state import SnapshotApp
from sparkwal.wal import ManualClock

ROOT = Path(__file__).resolve().parent.parent


def foreign_checkpoint(directory: Path, app_name: str, graph: str) -> None:
    directory.mkdir(parents=True)
    data = {"conf": [["spark.app.name", app_name], ["spark.master", "local[2]"]], "graph": graph,
            "batch_ms": 1000, "code": None, "state": {}, "inputs": {}}
    (directory / "checkpoint-1000").write_bytes(Checkpoint(1000, [], data).encode())


PORTED = "0:FileInputDStream(slide=1000 directory=/tmp/app/in)<-[]; 1:StateDStream(slide=1000)<-[0]"
RECEIVER_JOB = "0:ReceiverInputDStream(slide=1000)<-[]; 1:TransformedDStream(slide=1000)<-[0]"


def run(module: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("module, args, graph, name, theirs", [
    ("sparkwal.engine.wordcount", [], PORTED, "ported", "'ported' (spark.app.name), reading FileInputDStream"),
    ("sparkwal.engine.wordcount", ["--source", "filelog"], RECEIVER_JOB, "sparkwal-wordcount",
     "the main job with --source receiver"),
    ("sparkwal.engine.drill", ["--mode", "direct"], PORTED, "ported", "'ported' (spark.app.name)"),
], ids=["another-app", "another-mode", "drill"])
def test_the_main_job_and_the_drill_refuse_another_programs_checkpoint(tmp_path, module, args, graph, name, theirs):
    foreign_checkpoint(tmp_path / "work" / "checkpoint", name, graph)
    before = sorted(p.name for p in (tmp_path / "work").rglob("*"))
    proc = run(module, "--dir", tmp_path / "work", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and theirs in lines[0] and "not of this one, the main job with --source" in lines[0]
    assert "SparkContext" not in proc.stderr and proc.stdout == ""  # before any JVM or batch
    assert sorted(p.name for p in (tmp_path / "work").rglob("*")) == before  # nothing made


@pytest.mark.driver
def test_the_main_job_takes_its_own_checkpoint(tmp_path):
    """The check lets the main job's own checkpoint through (here, one it cannot recover: the
    refusal is not what stops it)."""
    foreign_checkpoint(tmp_path / "work" / "checkpoint", "sparkwal-wordcount",
                       "0:FileInputDStream(slide=1000 directory=input)<-[]")
    proc = run("sparkwal.engine.wordcount", "--dir", tmp_path / "work", "--seconds", "1", "--files", "0")
    assert "another program" not in proc.stderr
    assert proc.returncode == 1 and "could not start" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.driver
def test_a_checkpoint_that_does_not_verify_is_not_taken_for_another_programs(tmp_path):
    """The look before the start leaves an unreadable checkpoint to the start, which names it."""
    (tmp_path / "work" / "checkpoint").mkdir(parents=True)
    (tmp_path / "work" / "checkpoint" / "checkpoint-1000").write_bytes(b"not a checkpoint")
    proc = run("sparkwal.engine.wordcount", "--dir", tmp_path / "work", "--seconds", "1", "--files", "0")
    assert "another program" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "could not start" in last and "checkpoint-1000" in last, proc.stderr


def billings_checkpoint(spark_context, tmp_path) -> SnapshotApp:
    app = SnapshotApp(spark_context, tmp_path)
    ssc = StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(0), _noop()))
    ssc.start()
    ssc.stop(stopSparkContext=False)
    for f in app.ckpt.glob("checkpoint-*"):  # as if written by an application named "billing"
        cp = Checkpoint.decode(f.read_bytes())
        cp.data["conf"] = [kv for kv in cp.data["conf"] if kv[0] != "spark.app.name"] + [["spark.app.name", "billing"]]
        f.write_bytes(cp.encode())
    return app


def test_get_or_create_refuses_to_run_another_applications_program_unless_allowed(spark_context, tmp_path, caplog):
    from sparkwal.engine import AnotherApplicationError

    app = billings_checkpoint(spark_context, tmp_path)
    setup_ran = []
    with pytest.raises(AnotherApplicationError) as refused:
        StreamingContext.getOrCreate(str(app.ckpt), lambda: setup_ran.append(1))
    assert str(app.ckpt) in str(refused.value) and "'billing'" in str(refused.value)
    assert f"'{spark_context.appName}'" in str(refused.value) and "allow_other_app=True" in str(refused.value)
    assert setup_ran == [] and StreamingContext.getActive() is None  # nothing made, nothing started
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine"):
        ssc = StreamingContext.getOrCreate(str(app.ckpt), lambda: setup_ran.append(1), allow_other_app=True)
    assert ssc.recovery == "checkpoint" and setup_ran == []  # the checkpoint's program, as asked
    assert any("'billing'" in r.getMessage() and "as allowed" in r.getMessage() for r in caplog.records)


def test_get_or_create_warns_when_an_upgrade_takes_another_applications_checkpoint(spark_context, tmp_path, caplog):
    app = billings_checkpoint(spark_context, tmp_path)
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine"):
        again = StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(0), _noop()), upgrade=True)
    assert again.recovery == "upgrade"
    said = [r.getMessage() for r in caplog.records if "was written by application" in r.getMessage()]
    assert len(said) == 1 and "'billing'" in said[0] and f"'{spark_context.appName}'" in said[0]


def test_a_program_in_a_layout_this_sparkwal_does_not_read_is_refused_naming_both(spark_context, tmp_path):
    from pyspark import cloudpickle

    from sparkwal.checkpoint import write_code
    from sparkwal.engine import ProgramVersionError

    app = SnapshotApp(spark_context, tmp_path)
    ssc = StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(0), _noop()))
    ssc.start()
    ssc.stop(stopSparkContext=False)
    later = write_code(str(app.ckpt), cloudpickle.dumps({"version": 99}))  # as a later sparkwal's layout
    for f in app.ckpt.glob("checkpoint-*"):
        cp = Checkpoint.decode(f.read_bytes())
        cp.data["code"] = later
        f.write_bytes(cp.encode())
    with pytest.raises(ProgramVersionError, match=r"ckpt: the checkpoint's program has version 99; this sparkwal "
                                                  r"reads version \d+") as refused:
        StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(0), _noop()))
    assert isinstance(refused.value, ValueError) and refused.value.version == 99  # (a ValueError before)


def _noop():
    from sparkwal.engine import StreamingListener

    return StreamingListener()
