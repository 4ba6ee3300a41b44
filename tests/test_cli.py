"""The ``sparkwal`` command driven as a user would: a subprocess, its exit status and its output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from sparkwal.engine import StreamingListener
from sparkwal.tracker import ReceivedBlockInfo, ReceivedBlockTracker
from sparkwal.wal import FileBasedWriteAheadLog


def sparkwal(*args, expect: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sparkwal", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == expect, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def as_json(proc) -> dict:
    return json.loads(proc.stdout)


class OnBatch(StreamingListener):
    def __init__(self, callback):
        self.callback = callback

    def onBatchCompleted(self, batchCompleted):
        self.callback()


def make_log(directory, n: int = 30) -> list[bytes]:
    records = [b"record %d " % i * 5 for i in range(n)]
    with FileBasedWriteAheadLog(str(directory), rolling_interval_s=1) as log:
        for i, r in enumerate(records):
            log.write(r, i * 100)
    return records


def test_the_console_script_is_installed_with_help_on_every_level():
    script = os.path.join(os.path.dirname(sys.executable), "sparkwal")
    for args in ([], ["wal"], ["wal", "repair"], ["checkpoint", "inspect"]):
        out = subprocess.run([script, *args, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "usage: sparkwal" in out.stdout


def test_usage_errors_exit_2():
    sparkwal("bogus", expect=2)
    sparkwal("wal", "inspect", expect=2)
    assert "key=value" in sparkwal("wal", "inspect", "/tmp", "--storage-option", "x", expect=2).stderr


def test_wal_inspect_and_verify_a_healthy_log_and_see_a_live_writer(tmp_path):
    make_log(tmp_path)
    report = as_json(sparkwal("wal", "inspect", tmp_path, "--json", expect=0))
    assert report["records"] == 30 and len(report["segments"]) == 3
    assert [s["records"] for s in report["segments"]] == [11, 11, 8]
    assert report["writer"]["kind"] == "lock" and report["writer"]["held"] is False
    assert as_json(sparkwal("wal", "verify", tmp_path, "--json", expect=0))["ok"]
    with FileBasedWriteAheadLog(str(tmp_path), rolling_interval_s=1) as live:
        live.write(b"live", 10_000)
        report = as_json(sparkwal("wal", "inspect", tmp_path, "--json", expect=0))
        assert report["writer"]["held"] is True and f"pid {os.getpid()}" in report["writer"]["holder"]
        out = sparkwal("wal", "repair", tmp_path, "--yes", expect=1).stdout  # a writer runs: refused
        assert "locked" in out


def test_records_of_a_tracker_log_are_decoded(tmp_path):
    tracker = ReceivedBlockTracker([0], str(tmp_path))
    assert tracker.add_block(ReceivedBlockInfo(0, 7, "input-0-1"))
    tracker.allocate_blocks_to_batch(1000)
    tracker.stop()
    report = as_json(sparkwal("wal", "inspect", tmp_path / "receivedBlockMetadata", "--records", "--json",
                              expect=0))
    events = [r["event"]["type"] for r in report["record_list"]]
    assert events == ["BlockAdditionEvent", "BatchAllocationEvent"]
    assert "input-0-1" in json.dumps(report["record_list"][0])


def test_a_damaged_segment_is_named_and_set_aside_only_with_yes(tmp_path):
    make_log(tmp_path)
    first = sorted(p for p in os.listdir(tmp_path) if p.startswith("log-"))[1]
    path = tmp_path / first
    data = bytearray(path.read_bytes())
    data[8 + 12 + 20] ^= 0x01  # inside the first record's payload
    path.write_bytes(bytes(data))
    out = sparkwal("wal", "verify", tmp_path, expect=1).stdout
    assert f"{path} at byte offset 8: payload checksum mismatch" in out
    plan = sparkwal("wal", "repair", tmp_path, expect=1).stdout
    assert "set aside damaged segment" in plan and "only with --yes" in plan
    assert path.read_bytes() == bytes(data)  # nothing changed
    done = as_json(sparkwal("wal", "repair", tmp_path, "--yes", "--json", expect=0))
    assert done["applied"] and open(done["moved_aside"][0], "rb").read() == bytes(data)
    assert as_json(sparkwal("wal", "verify", tmp_path, "--json", expect=0))["records"] == 19


def test_a_torn_tail_is_reported_and_cut(tmp_path):
    make_log(tmp_path)
    newest = tmp_path / sorted(p for p in os.listdir(tmp_path) if p.startswith("log-"))[-1]
    size = newest.stat().st_size
    with open(newest, "ab") as f:
        f.write(b"\x00\x00\x01\x00half a frame")
    report = as_json(sparkwal("wal", "verify", tmp_path, "--json", expect=0))
    assert report["torn_tails"] == [{"file": str(newest), "offset": size, "torn_bytes": 16}]
    assert "cut torn tail" in sparkwal("wal", "repair", tmp_path, expect=0).stdout
    assert newest.stat().st_size == size
    assert as_json(sparkwal("wal", "verify", tmp_path, "--json", expect=0))["torn_tails"] == []


@pytest.mark.slow
def test_a_structured_streaming_checkpoint_and_a_damaged_copy(spark_context, tmp_path):
    from test_real_spark_checkpoint import run_query
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    src.mkdir()
    (src / "a.json").write_text('{"word":"a"}\n')
    run_query(spark, src, ckpt)
    report = as_json(sparkwal("checkpoint", "inspect", ckpt, "--json", expect=0))
    assert report["kind"] == "structured streaming" and report["metadata"]["id"]
    assert report["offsets"]["ids"] == [0] and report["commits"]["ids"] == [0]
    assert report["restart"]["batch_id"] == 1 and not report["restart"]["rerun"]
    assert report["sources"] == ["0"]
    text = sparkwal("checkpoint", "inspect", ckpt, expect=0).stdout
    assert "a restart resumes at batch 1" in text and "\nsources: 1: sources/0/\n" in text  # one source, not "0"

    damaged = tmp_path / "damaged"
    shutil.copytree(ckpt, damaged)
    os.remove(damaged / "offsets" / "0")  # SPARK-38033's shape: a commit without its offsets
    out = sparkwal("checkpoint", "verify", damaged, expect=1).stdout
    assert "FAILED" in out and "commits has batches 0" in out
    plan = sparkwal("checkpoint", "repair", damaged, expect=1).stdout
    assert "drop commits 0" in plan and (damaged / "commits" / "0").exists()
    sparkwal("checkpoint", "repair", damaged, "--yes", expect=0)
    assert not (damaged / "commits" / "0").exists()
    assert as_json(sparkwal("checkpoint", "verify", damaged, "--json", expect=0))["ok"]


def test_a_sparkwal_app_checkpoint_and_a_damaged_code_part(spark_context, tmp_path):
    from sparkwal.engine import StreamingContext

    ckpt = tmp_path / "ckpt"
    ssc = StreamingContext(spark_context, 0.5)
    ssc.checkpoint(str(ckpt))
    ssc.queueStream([[1]], default=[0]).map(lambda x: (x, 1)).updateStateByKey(
        lambda vs, s: sum(vs) + (s or 0)).pprint()
    done = threading.Event()
    ssc.addStreamingListener(OnBatch(done.set))
    ssc.start()
    assert done.wait(60)
    ssc.stop(stopSparkContext=False, stopGraceFully=True)  # its checkpoint is written by now
    report = as_json(sparkwal("checkpoint", "inspect", ckpt, "--json", expect=0))
    assert report["kind"] == "sparkwal" and report["newest"]["data"]["batch_ms"] == 500
    assert report["code_parts"] == [report["newest"]["data"]["code"]]
    text = sparkwal("checkpoint", "inspect", ckpt, expect=0).stdout
    assert "program: code-" in text and "StateDStream" in text
    assert "streams known by: queue (stream 0), updateStateByKey(queue) (stream 2)" in text

    code = ckpt / report["code_parts"][0]
    code.write_bytes(code.read_bytes()[:-1] + b"!")
    out = sparkwal("checkpoint", "verify", ckpt, expect=1).stdout
    assert f"{code}: checksum mismatch" in out


@pytest.mark.parametrize("area, verb", [("wal", "inspect"), ("wal", "verify"), ("wal", "repair"),
                                        ("checkpoint", "inspect"), ("checkpoint", "verify"),
                                        ("checkpoint", "repair"), ("checkpoint", "state")])
def test_a_missing_or_wrong_path_is_a_problem_named_never_ok_and_nothing_is_created(tmp_path, area, verb):
    missing = tmp_path / "no" / "such"
    for extra in ([], ["--yes"]) if verb == "repair" else ([],):
        proc = sparkwal(area, verb, missing, *extra, expect=1)
        assert "OK" not in proc.stdout and str(missing) in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "no").exists()  # repair made no directory, no lock
    report = as_json(sparkwal(area, verb, missing, "--json", expect=1))
    assert report["ok"] is False and str(missing) in report["error"]
    regular = tmp_path / "a-file"
    regular.write_text("x")
    assert f"not a directory: {regular}" in sparkwal(area, verb, regular, expect=1).stderr


def _checkpoint_with_a_damaged_file_and_log(tmp_path):
    from sparkwal.checkpoint import Checkpoint, CheckpointWriter

    ckpt = tmp_path / "ckpt"
    writer = CheckpointWriter(str(ckpt))
    for t in (1000, 2000, 3000):
        writer.write(Checkpoint(t, [], {"batch_ms": 1000}))
    writer.stop()
    newest = ckpt / "checkpoint-3000"
    newest.write_bytes(newest.read_bytes()[:-1] + b"!")  # a flipped byte: checksum mismatch
    log_dir = ckpt / "receivedBlockMetadata"
    make_log(log_dir)
    sealed = log_dir / sorted(p for p in os.listdir(log_dir) if p.startswith("log-"))[0]
    data = bytearray(sealed.read_bytes())
    data[8 + 12 + 3] ^= 0x01
    sealed.write_bytes(bytes(data))
    return ckpt, newest, sealed


def test_inspect_and_verify_agree_on_a_damaged_checkpoint_and_its_logs(tmp_path):
    ckpt, newest, sealed = _checkpoint_with_a_damaged_file_and_log(tmp_path)
    for verb in ("inspect", "verify"):
        out = sparkwal("checkpoint", verb, ckpt, expect=1).stdout
        assert f"{newest}: checksum mismatch" in out and f"{sealed} at byte offset 8" in out
    sparkwal("wal", "inspect", ckpt / "receivedBlockMetadata", expect=1)  # the same exit status


def test_checkpoint_repair_sets_damaged_files_aside_so_verify_passes(tmp_path):
    from sparkwal.checkpoint import read_checkpoint

    ckpt, newest, sealed = _checkpoint_with_a_damaged_file_and_log(tmp_path)
    damaged = newest.read_bytes()
    plan = sparkwal("checkpoint", "repair", ckpt, expect=1).stdout
    assert f"set aside damaged checkpoint file: {newest}" in plan and "set aside damaged segment" in plan
    assert "only with --yes" in plan and newest.read_bytes() == damaged  # nothing changed
    done = as_json(sparkwal("checkpoint", "repair", ckpt, "--yes", "--json", expect=0))
    assert done["applied"] and open(done["checkpoint_files"][0]["moved_to"], "rb").read() == damaged
    assert not newest.exists() and as_json(sparkwal("checkpoint", "verify", ckpt, "--json", expect=0))["ok"]
    assert read_checkpoint(str(ckpt)).checkpoint_time_ms == 2000  # a restart reads the newest good one
    assert "nothing to repair" in sparkwal("checkpoint", "repair", ckpt, "--yes", expect=0).stdout


def test_checkpoint_repair_refuses_while_a_driver_leads(tmp_path):
    from sparkwal.wal import resolve

    ckpt, newest, _ = _checkpoint_with_a_damaged_file_and_log(tmp_path)
    storage, root = resolve(str(ckpt))
    lead = storage.lead(root)
    try:
        out = sparkwal("checkpoint", "repair", ckpt, "--yes", expect=1).stdout
        assert "a running driver leads it" in out and newest.exists()
    finally:
        lead.release()


def test_sparkwal_runs_the_apps_with_their_own_arguments():
    """``sparkwal run wordcount`` and ``sparkwal drill`` are the apps' own command lines (their
    checks and exit statuses); a missing or unknown app is one line naming the apps, status 2."""
    for args, says in ((["run"], "an app to run is missing; apps: wordcount"),
                       (["run", "wordcont"], "unknown app 'wordcont'; apps: wordcount"),
                       (["run", "wordcount", "--batch", "0"], "argument --batch: must be a positive"),
                       (["drill", "--kills", "x"], "argument --kills")):
        proc = sparkwal(*args, expect=2)
        assert says in proc.stderr and "Traceback" not in proc.stderr
    assert "--source" in sparkwal("run", "wordcount", "--help", expect=0).stdout
