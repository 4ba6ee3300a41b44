"""resolve_restart: every rule of Spark's offset/commit pairing
(MicroBatchExecution.populateStartOffsets), gaps and repair."""

from __future__ import annotations

import pytest

from sparkwal.checkpoint import (CommitLog, CommitMetadata, OffsetSeq, OffsetSeqLog, OffsetSeqMetadata,
                        RestartError, plan_repair, repair, resolve_restart)


def logs(tmp_path, offsets=(), commits=(), wm=None):
    o, c = OffsetSeqLog(str(tmp_path / "offsets")), CommitLog(str(tmp_path / "commits"))
    for i in offsets:
        o.add(i, seq(i))
    for i in commits:
        c.add(i, CommitMetadata(wm.get(i, 0) if wm else 0))
    return o, c


def seq(i):
    return OffsetSeq([f'{{"logOffset":{i}}}', None], OffsetSeqMetadata(i * 10, 1000 + i))


def test_fresh_checkpoint_starts_at_batch_zero(tmp_path):
    p = resolve_restart(*logs(tmp_path))
    assert (p.batch_id, p.rerun, p.start_offsets, p.end_offsets) == (0, False, None, None)


def test_batch_zero_logged_but_not_committed_is_rerun(tmp_path):
    p = resolve_restart(*logs(tmp_path, offsets=[0]))
    assert (p.batch_id, p.rerun, p.start_offsets, p.end_offsets) == (0, True, None, seq(0).offsets)
    assert p.metadata.batch_timestamp_ms == 1000  # the re-run uses the same timestamp


def test_latest_batch_committed_resumes_with_the_next(tmp_path):
    p = resolve_restart(*logs(tmp_path, offsets=[0, 1, 2], commits=[0, 1, 2], wm={2: 77}))
    assert (p.batch_id, p.rerun, p.start_offsets, p.end_offsets) == (3, False, seq(2).offsets, None)
    assert p.watermark_ms == 77  # max(offsets watermark 20, commit's next watermark 77)


def test_watermark_never_moves_back(tmp_path):
    p = resolve_restart(*logs(tmp_path, offsets=[0, 1, 2], commits=[0, 1, 2], wm={2: 5}))
    assert p.watermark_ms == 20


def test_uncommitted_latest_batch_reruns_with_identical_offsets(tmp_path):
    p = resolve_restart(*logs(tmp_path, offsets=[0, 1, 2], commits=[0, 1]))
    assert (p.batch_id, p.rerun) == (2, True)
    assert p.start_offsets == seq(1).offsets and p.end_offsets == seq(2).offsets
    assert p.metadata == seq(2).metadata and p.watermark_ms == 20 and not p.warnings
    assert p.rerun_batches == (2,)


def test_no_commit_log_reruns_the_latest_batch(tmp_path):
    """(checkpoint-version-2.3.1-without-commit-log-metadata)"""
    p = resolve_restart(*logs(tmp_path, offsets=[0, 1]))
    assert (p.batch_id, p.rerun, p.start_offsets) == (1, True, seq(0).offsets)
    assert p.rerun_batches == (0, 1)


def test_commit_trailing_by_more_than_one_reruns_with_sparks_warning(tmp_path, caplog):
    p = resolve_restart(*logs(tmp_path, offsets=[0, 1, 2, 3], commits=[0]))
    assert (p.batch_id, p.rerun) == (3, True)
    assert p.warnings == ("Batch completion log latest batch id is 0, which is not trailing "
                          "batchid 3 by one: batches 1..3 are re-run, in order",)
    assert p.rerun_batches == (1, 2, 3)  # every uncommitted batch, not only the last (Spark's)
    assert "not trailing batchid 3" in caplog.text


def test_gap_in_the_offset_log_names_the_missing_file(tmp_path):
    """SPARK-38033: offsets {113257, 113259}, commits {113256, 113257}."""
    o, c = logs(tmp_path, offsets=[113257, 113259], commits=[113256, 113257])
    with pytest.raises(RestartError) as err:
        resolve_restart(o, c)
    msg = str(err.value)
    assert "batch 113258 doesn't exist" in msg
    assert str(tmp_path / "offsets" / "113258") in msg and "repair" in msg
    plan = plan_repair(o, c)
    assert plan.delete == (str(tmp_path / "offsets" / "113259"),)
    repair(o, c)
    p = resolve_restart(o, c)
    assert (p.batch_id, p.rerun, p.start_offsets) == (113258, False, seq(113257).offsets)


def test_commit_log_ahead_of_offset_log(tmp_path):
    o, c = logs(tmp_path, offsets=[0, 1], commits=[0, 1, 2, 3])
    with pytest.raises(RestartError, match="commit log is ahead of the offset log"):
        resolve_restart(o, c)
    plan = plan_repair(o, c)
    assert plan.commits_after == (2, 3) and plan.offsets_after == ()
    repair(o, c)
    p = resolve_restart(o, c)  # batches 2, 3 re-planned from batch 1's offsets: at-least-once
    assert (p.batch_id, p.rerun, p.start_offsets) == (2, False, seq(1).offsets)


def test_commits_without_any_offsets(tmp_path):
    o, c = logs(tmp_path, commits=[0, 1])
    with pytest.raises(RestartError, match="offset log was lost"):
        resolve_restart(o, c)
    repair(o, c)
    assert resolve_restart(o, c).batch_id == 0


def test_repair_keeps_an_uncommitted_batch_that_can_rerun(tmp_path):
    o, c = logs(tmp_path, offsets=[0, 1, 2, 5], commits=[0, 1])
    plan = plan_repair(o, c)
    assert plan.offsets_after == (5,)  # batch 2 has offsets 1 before it: it can re-run
    repair(o, c)
    p = resolve_restart(o, c)
    assert (p.batch_id, p.rerun, p.end_offsets) == (2, True, seq(2).offsets)


def test_repair_of_a_healthy_checkpoint_changes_nothing(tmp_path):
    o, c = logs(tmp_path, offsets=[0, 1, 2], commits=[0, 1])
    assert plan_repair(o, c).delete == ()
    before = resolve_restart(o, c)
    repair(o, c)
    assert resolve_restart(o, c) == before


def test_repair_refuses_when_no_committed_offset_remains(tmp_path):
    o, c = logs(tmp_path, offsets=[4, 5], commits=[0, 1, 2, 3, 4, 5])
    o.purge(5)
    c.purge_after(2)  # commit 2 survives, offsets 2 does not
    with pytest.raises(RestartError, match="cannot repair"):
        plan_repair(o, c)
