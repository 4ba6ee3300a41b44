"""A copy of a live checkpoint is a fork: ``sparkwal checkpoint copy`` says so and records where the
copy came from (``copied-from.json``), and a driver started on the copy refuses, in one line naming
both directories and the source's driver and having written nothing, while a live driver leads the
source; ``spark.sparkwal.copy.allowLiveSource`` (or ``getOrCreate(..., allow_live_source=True)``)
lets it start, as does the source's driver stopping. A source that cannot be looked at is one
warning, never a refusal."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkwal.checkpoint import OffsetSeq, OffsetSeqLog, OffsetSeqMetadata
from sparkwal.checkpoint.copy import copy_checkpoint, live_source
from sparkwal.engine.config import ALLOW_LIVE_SOURCE, StreamingConf
from sparkwal.engine.context import CopySourceActiveError, StreamingContext
from sparkwal.engine.errors import EngineError
from sparkwal.wal import resolve


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def source(tmp_path) -> Path:
    """A small sparkwal checkpoint (one batch's offsets, no Spark needed)."""
    src = tmp_path / "src"
    OffsetSeqLog(str(src / "offsets")).add(0, OffsetSeq(['{"0":5}'], OffsetSeqMetadata(0, 1000)))
    return src


@pytest.fixture
def led(source):
    """The source led by this process (a local flock: a live leader), released after the test."""
    storage, path = resolve(str(source))
    lead = storage.lead(path)
    yield lead
    lead.release()


def sparkwal(*args, expect: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sparkwal", *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == expect, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def test_the_copy_of_a_led_checkpoint_says_it_is_a_fork_and_records_its_source(source, led, tmp_path):
    out = sparkwal("checkpoint", "copy", source, tmp_path / "c1", expect=0).stdout.strip().splitlines()
    assert out[0].startswith(f"OK: copied {source} to {tmp_path / 'c1'}")
    assert len(out) == 2 and out[1].startswith("FORK: ") and led.info.describe() in out[1]
    assert "fork" in out[1] and "same inputs" in out[1] and "spark.sparkwal.copy.allowLiveSource" in out[1]
    data = json.loads(sparkwal("checkpoint", "copy", source, tmp_path / "c2", "--json", expect=0).stdout)
    assert data["ok"] and data["source"] == str(source) and data["files"] >= 2  # the existing fields stay
    assert data["source_leader"] == led.info.describe() and "is a fork" in data["fork"]
    assert data["copied_from"] == str(tmp_path / "c2" / "copied-from.json")
    record = json.loads((tmp_path / "c2" / "copied-from.json").read_text())
    assert record["source"] == str(source) and record["source_leader"] == led.info.describe()
    assert record["epoch"] == led.epoch and record["checkpoint_time_ms"] is None


def test_the_copy_of_a_stopped_checkpoint_records_its_source_and_names_no_fork(source, tmp_path):
    report = copy_checkpoint(str(source), str(tmp_path / "copy"))
    assert report.problems == [] and report.fork is None and report.source_leader is None
    record = json.loads((tmp_path / "copy" / "copied-from.json").read_text())
    assert record["source"] == str(source) and record["source_leader"] is None
    out = sparkwal("checkpoint", "copy", source, tmp_path / "c1", expect=0).stdout
    assert "FORK" not in out and len(out.strip().splitlines()) == 1
    data = json.loads(sparkwal("checkpoint", "copy", source, tmp_path / "c2", "--json", expect=0).stdout)
    assert data["fork"] is None and data["source_leader"] is None


def test_the_check_finds_the_sources_live_leader_and_only_while_it_leads(source, tmp_path):
    storage, path = resolve(str(source))
    copy = tmp_path / "copy"
    copy_checkpoint(str(source), str(copy))
    assert live_source(str(copy)) is None  # nobody leads the source
    lead = storage.lead(path)
    try:
        found = live_source(str(copy))
        assert found is not None and found[0] == str(source) and found[1].describe() == lead.info.describe()
        assert live_source(str(source)) is None  # the source is no copy
    finally:
        lead.release()
    assert live_source(str(copy)) is None


@pytest.mark.parametrize("how", ["deleted", "another machine's", "damaged record"])
def test_a_source_that_cannot_be_looked_at_is_a_warning_not_a_refusal(source, led, tmp_path, caplog, how):
    copy = tmp_path / "copy"
    copy_checkpoint(str(source), str(copy))
    record = copy / "copied-from.json"
    if how == "deleted":
        led.release()
        for p in sorted(source.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        source.rmdir()
    elif how == "another machine's":
        record.write_text(json.dumps({**json.loads(record.read_text()), "source": "/elsewhere/ckpt"}))
    else:
        record.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="sparkwal.checkpoint.copy"):
        assert live_source(str(copy)) is None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "could not be checked" in said[0] and str(copy) in said[0]


def test_the_setting_is_declared_off_by_default():
    assert StreamingConf({})[ALLOW_LIVE_SOURCE] is False
    assert StreamingConf({ALLOW_LIVE_SOURCE.key: "true"})[ALLOW_LIVE_SOURCE] is True
    assert issubclass(CopySourceActiveError, EngineError)


def setup_on(sc, ckpt: Path):
    def setup():
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(str(ckpt))
        ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
        return ssc
    return setup


def test_a_driver_on_a_copy_of_a_led_checkpoint_refuses_until_allowed_or_the_source_stops(
        spark_context, source, led, tmp_path, live_settings, caplog):
    copy = tmp_path / "copy"
    copy_checkpoint(str(source), str(copy))
    before = digest(copy)
    ssc = StreamingContext.getOrCreate(str(copy), setup_on(spark_context, copy))
    with pytest.raises(CopySourceActiveError) as refused:
        ssc.start()
    text = str(refused.value)
    assert len(text.splitlines()) == 1 and f"{copy} is a copy of {source}" in text
    assert led.info.describe() in text and "spark.sparkwal.copy.allowLiveSource=true" in text
    assert refused.value.source == str(source) and refused.value.leader.epoch == led.epoch
    assert digest(copy) == before  # nothing written in the copy
    assert ssc.currentLeader() is None and not ssc.isStandby()

    for allowed in ("keyword", "setting"):
        if allowed == "setting":
            live_settings({ALLOW_LIVE_SOURCE.key: "true"})
        ssc = StreamingContext.getOrCreate(str(copy), setup_on(spark_context, copy),
                                           allow_live_source=allowed == "keyword")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparkwal.checkpoint.copy"):
            ssc.start()
        assert ssc.leaderEpoch > led.epoch  # the copy's own epochs, after the source's
        ssc.stop(stopSparkContext=False)
        said = [r.getMessage() for r in caplog.records if "starts anyway" in r.getMessage()]
        assert len(said) == 1 and f"{copy} is a copy of {source}" in said[0], allowed
    live_settings({ALLOW_LIVE_SOURCE.key: "false"})

    led.release()  # the source's driver stopped: the copy starts
    ssc = StreamingContext.getOrCreate(str(copy), setup_on(spark_context, copy))
    ssc.start()
    ssc.stop(stopSparkContext=False)
    assert os.path.exists(copy / "copied-from.json")
