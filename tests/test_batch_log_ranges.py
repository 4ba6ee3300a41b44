"""A logged batch's ranges are never widened: batch 0 starts at the input's initial offsets, every
later batch at its predecessor's logged ends, and a batch whose start is gone (purged) is refused
with the missing file named. Purges keep what any restorable DStream checkpoint needs: the oldest
floor of the newest checkpoint and the one a restart falls back to (its .bk), not the newest's."""

from __future__ import annotations

import pytest

from sparkwal.checkpoint import OffsetSeqLog
from sparkwal.engine.sources import BatchLog, FileLogSource, OffsetRange, TopicPartition

A, B = TopicPartition("log", "a"), TopicPartition("log", "b")


class _Input:
    input_id = 0

    def __init__(self, path):
        self.source = FileLogSource(str(path))


def _log(blog: BatchLog, ends: dict[int, int], *, done: bool = True) -> None:
    """Log a batch per ``time -> end offset of log/a`` (and mark it done)."""
    for t, end in ends.items():
        blog.log_batch(t, [{A: end}], {})
        if done:
            blog.batch_done(t, True)


def _offset_ids(tmp_path) -> list[int]:
    return OffsetSeqLog(str(tmp_path / "ckpt" / "offsets")).batch_ids()


def _started(tmp_path, retain: int, initial: int = 0) -> tuple[BatchLog, _Input]:
    one = _Input(tmp_path / "log")
    blog = BatchLog(str(tmp_path / "ckpt"), [one], retain=retain)
    blog.recover()
    blog.write_initial_offsets(one, {A: initial})
    return blog, one


def test_a_batch_whose_predecessor_was_purged_is_refused_not_widened(tmp_path):
    blog, one = _started(tmp_path, retain=2)
    _log(blog, {500: 10, 1000: 20, 1500: 30, 2000: 40, 2500: 50})
    blog.checkpoint_durable(2500)  # commits 0..4; retain=2 purges 0..2
    assert _offset_ids(tmp_path) == [3, 4]
    assert blog.logged_ranges(one, 2500) == ([OffsetRange("log", "a", 40, 50)], {A: 50})
    with pytest.raises(ValueError, match=r"batch 3 \(time 2000\) cannot be recomputed: .*offsets/2\b"):
        blog.logged_ranges(one, 2000)  # not [0, 40): the initial offsets are batch 0's start only

    restarted = BatchLog(str(tmp_path / "ckpt"), [one], retain=2)
    restarted.recover()
    assert restarted.logged_times() == [2000, 2500]
    with pytest.raises(ValueError, match=r"batch 3 \(time 2000\).*offsets/2 \(its start offsets\) is missing"):
        restarted.logged_ranges(one, 2000)
    assert restarted.logged_ranges(one, 2500)[0] == [OffsetRange("log", "a", 40, 50)]


def test_batch_zero_starts_at_the_initial_offsets_and_a_new_partition_at_the_earliest(tmp_path):
    blog, one = _started(tmp_path, retain=100, initial=2)
    blog.log_batch(500, [{A: 5}], {})
    blog.log_batch(1000, [{A: 7, B: 3}], {})  # log/b appeared in batch 1
    assert blog.logged_ranges(one, 500)[0] == [OffsetRange("log", "a", 2, 5)]
    assert blog.logged_ranges(one, 1000)[0] == [OffsetRange("log", "a", 5, 7), OffsetRange("log", "b", 0, 3)]


def test_batch_zero_without_its_initial_offsets_is_refused(tmp_path):
    one = _Input(tmp_path / "log")
    blog = BatchLog(str(tmp_path / "ckpt"), [one])
    blog.recover()
    blog.log_batch(500, [{A: 5}], {})  # sources/0/0 was never written (or was lost)
    with pytest.raises(ValueError, match=r"batch 0 \(time 500\) cannot be recomputed: .*sources/0/0"):
        blog.logged_ranges(one, 500)


def test_purges_keep_what_the_older_of_two_restorable_checkpoints_needs(tmp_path):
    blog, one = _started(tmp_path, retain=2)
    _log(blog, {t: t // 50 for t in range(500, 4001, 500)})  # ids 0..7, log/a ends 10, 20, ..., 80
    blog.checkpoint_durable(2000, 1000)  # a restart from it recomputes from batch 1 (time 1000)
    blog.checkpoint_durable(4000, 3500)  # the newest needs less, but the one before is its .bk
    assert _offset_ids(tmp_path) == list(range(8))  # batch 1 and its start, batch 0, kept
    assert blog.logged_ranges(one, 1000)[0] == [OffsetRange("log", "a", 10, 20)]
    _log(blog, {4500: 90})
    blog.checkpoint_durable(4500, 3500)  # the checkpoint of 2000 is no longer restorable
    assert _offset_ids(tmp_path) == [5, 6, 7, 8]  # retain=2 beyond batch 6 (3500) and its start
    assert blog.logged_ranges(one, 3500)[0] == [OffsetRange("log", "a", 60, 70)]


def test_a_restart_keeps_its_checkpoints_batches_until_two_newer_checkpoints_are_durable(tmp_path):
    blog, one = _started(tmp_path, retain=2)
    _log(blog, {500: 10, 1000: 20, 1500: 30, 2000: 40})
    blog.checkpoint_durable(2000, 500)
    assert _offset_ids(tmp_path) == [0, 1, 2, 3]
    restarted = BatchLog(str(tmp_path / "ckpt"), [one], retain=2)  # from that checkpoint (floor 500)
    restarted.recover()
    _log(restarted, {2500: 50, 3000: 60})
    restarted.checkpoint_durable(3000, 3000)  # its .bk is the checkpoint restarted from
    assert _offset_ids(tmp_path) == [0, 1, 2, 3, 4, 5]
    assert restarted.logged_ranges(one, 500)[0] == [OffsetRange("log", "a", 0, 10)]
    _log(restarted, {3500: 70})
    restarted.checkpoint_durable(3500, 3000)
    assert _offset_ids(tmp_path) == [4, 5, 6]
