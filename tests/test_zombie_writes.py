"""Late writes of an old leader ("zombies"): a driver paused past its lease, whose PUT lands after a
standby took over at the next epoch. Every reader takes the newest epoch's files over an older
epoch's, whatever their names, and a writer deletes or replaces only its own or older epochs'
files. Pure Python: no SparkContext (a fence here is any object with ``epoch`` and ``check()``,
the zombie's passing: its PUT was sent before it paused)."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from sparkwal.checkpoint import (Checkpoint, CheckpointFollower, CheckpointWriter, CommitLog, CommitMetadata,
                                 OffsetSeq, OffsetSeqLog, OffsetSeqMetadata, read_checkpoint)
from sparkwal.checkpoint.errors import ConcurrentUpdateError
from sparkwal.checkpoint.state_files import part_rows, read_manifest
from sparkwal.engine.sources import BatchLog
from sparkwal.engine.state.snapshot_tasks import DriverParts, write_snapshot
from sparkwal.wal import FencedError


class Fence:
    """A leadership at ``epoch`` that never notices it is over (a zombie's, mid-PUT)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def check(self) -> None:
        pass


def names(d):
    return sorted(n for n in os.listdir(d) if n.startswith("checkpoint-"))


def cp(time_ms: int, epoch: int | None, **data) -> Checkpoint:
    return Checkpoint(time_ms, [], {**({} if epoch is None else {"leader_epoch": epoch}), **data})


def write(directory, *checkpoints: Checkpoint) -> None:
    """What one driver run writes (its own writer: it lists the directory once, first)."""
    w = CheckpointWriter(str(directory))
    for c in checkpoints:
        w.write(c)
    w.stop()


# ------------------------------------------------------------------ DStream checkpoints


def test_inspect_and_copy_take_the_checkpoint_a_restart_takes_not_a_zombies_newer_name(tmp_path):
    from sparkwal.checkpoint.copy import copy_checkpoint
    from sparkwal.checkpoint.inspect import inspect_checkpoint

    source = tmp_path / "source"
    write(source, cp(4000, 2, who="new leader"))
    write(source, cp(5000, 1, who="zombie"))
    assert inspect_checkpoint(str(source)).newest.data["who"] == "new leader"
    copy_checkpoint(str(source), str(tmp_path / "copy"))
    assert read_checkpoint(str(tmp_path / "copy")).data["who"] == "new leader"



def test_a_late_checkpoint_of_an_older_epoch_under_a_higher_name_does_not_win_recovery(tmp_path):
    write(tmp_path, cp(4000, 1, who="old leader"))
    new = CheckpointWriter(str(tmp_path))  # epoch 2 takes over; its first write lists the directory
    new.write(cp(4000, 2, who="new leader"))
    new.flush()
    write(tmp_path, cp(5000, 1, who="zombie"))  # the old leader's PUT, held in a partition, lands
    new.write(cp(4500, 2, who="new leader, next batch"))
    new.stop()
    assert names(tmp_path) == ["checkpoint-4000", "checkpoint-4000.bk", "checkpoint-4500", "checkpoint-5000"]
    assert read_checkpoint(str(tmp_path)) == cp(4500, 2, who="new leader, next batch")


def test_a_late_checkpoint_under_the_new_leaders_own_name_leaves_its_bk_to_recovery(tmp_path):
    """The old leader's last name is the one the new leader writes under (running maximum): a
    late write there moves the new leader's checkpoint to the .bk, which recovery then takes."""
    write(tmp_path, cp(4000, 1, who="old leader"))
    write(tmp_path, cp(3500, 2, who="new leader, re-run"), cp(4000, 2, who="new leader"))
    write(tmp_path, cp(4000, 1, who="zombie"))
    assert names(tmp_path) == ["checkpoint-4000", "checkpoint-4000.bk"]
    assert read_checkpoint(str(tmp_path)) == cp(4000, 2, who="new leader")


def test_checkpoints_without_an_epoch_count_as_epoch_0_and_a_damaged_file_falls_back_to_its_bk(tmp_path):
    write(tmp_path, cp(3000, 1, v="a"), cp(3000, 1, v="b"))
    write(tmp_path, cp(9000, None, who="an earlier release"))
    assert read_checkpoint(str(tmp_path)) == cp(3000, 1, v="b")
    (tmp_path / "checkpoint-3000").write_bytes(b"damaged")
    assert read_checkpoint(str(tmp_path)) == cp(3000, 1, v="a")  # its .bk, not the epoch-0 file
    (tmp_path / "checkpoint-3000.bk").write_bytes(b"damaged")
    assert read_checkpoint(str(tmp_path)) == cp(9000, None, who="an earlier release")


def test_the_new_leaders_retention_keeps_its_newest_file_beside_a_zombies_higher_name(tmp_path):
    """The writer deletes only what it listed or wrote, oldest names first: a zombie's file that
    landed after its listing is not among them, and its own newest name stays the highest it knows."""
    write(tmp_path, cp(1000, 1))
    new = CheckpointWriter(str(tmp_path), keep=4)
    new.write(cp(1000, 2))
    new.flush()
    write(tmp_path, cp(9000, 1, who="zombie"))
    for t in range(1500, 5000, 500):
        new.write(cp(t, 2))
    new.stop()
    assert names(tmp_path) == ["checkpoint-3000", "checkpoint-3500", "checkpoint-4000", "checkpoint-4500",
                               "checkpoint-9000"]
    assert read_checkpoint(str(tmp_path)) == cp(4500, 2)


def test_a_follower_never_returns_an_older_epoch_than_it_has_seen(tmp_path):
    write(tmp_path, cp(4000, 1))
    follower = CheckpointFollower(str(tmp_path))
    assert follower.read_if_changed() == cp(4000, 1)
    write(tmp_path, cp(4000, 2))  # the new leader, under the same name
    assert follower.read_if_changed() == cp(4000, 2)
    write(tmp_path, cp(5000, 1, who="zombie"))
    assert follower.read_if_changed() == cp(4000, 2)
    assert follower.read_if_changed() is None  # nothing changed since
    write(tmp_path, cp(5500, 2))
    assert follower.read_if_changed() == cp(5500, 2)


def test_a_follower_takes_the_newest_epoch_that_exists_not_the_newest_name(tmp_path):
    write(tmp_path, cp(4000, 1))
    first_look_before = CheckpointFollower(str(tmp_path))
    assert first_look_before.read_if_changed() == cp(4000, 1)
    write(tmp_path, cp(4500, 2))
    write(tmp_path, cp(5000, 1, who="zombie"))
    assert names(tmp_path) == ["checkpoint-4000", "checkpoint-4500", "checkpoint-5000"]
    # both landed between two looks, and a follower that looks for the first time
    assert first_look_before.read_if_changed() == cp(4500, 2)
    assert CheckpointFollower(str(tmp_path)).read_if_changed() == cp(4500, 2)


def test_a_followers_look_reads_what_was_written_since_the_last_one_only(tmp_path, monkeypatch):
    write(tmp_path, cp(1000, 1))
    follower = CheckpointFollower(str(tmp_path))
    follower.read_if_changed()
    reads = []
    read_file = follower._storage.read_file
    monkeypatch.setattr(follower._storage, "read_file", lambda path: reads.append(path) or read_file(path))
    writer = CheckpointWriter(str(tmp_path), keep=2)
    for t in (1500, 2000, 2500):
        writer.write(cp(t, 1))
        writer.flush()  # (the older names are retired after each write)
        assert follower.read_if_changed() == cp(t, 1)
        assert reads == [str(tmp_path / f"checkpoint-{t}")]
        reads.clear()
        assert follower.read_if_changed() is None and reads == []
    writer.stop()


# ------------------------------------------------------------------ offsets and commits


def epoch_of_offsets(directory, batch_id: int) -> str:
    return OffsetSeqLog(str(directory / "offsets")).get(batch_id).metadata.conf["sparkwal.leaderEpoch"]


def test_a_late_offsets_file_of_an_older_epoch_is_replaced_by_the_new_leader(tmp_path, caplog):
    zombie = BatchLog(str(tmp_path), [], lock=Fence(1))
    zombie.recover()
    new = BatchLog(str(tmp_path), [], lock=Fence(2))
    new.recover()  # before the zombie's offsets/0 landed
    assert zombie.log_batch(500, [], {}) == 0
    with caplog.at_level(logging.WARNING):
        assert new.log_batch(500, [], {}) == 0
    assert epoch_of_offsets(tmp_path, 0) == "2"
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(tmp_path / "offsets" / "0") in m and "epoch 1" in m and "epoch 2" in m for m in warning)


def test_an_offsets_file_of_the_same_epoch_still_conflicts_and_of_a_newer_one_fences(tmp_path):
    a, b = BatchLog(str(tmp_path), [], lock=Fence(2)), BatchLog(str(tmp_path), [], lock=Fence(2))
    a.recover()
    b.recover()
    a.log_batch(500, [], {})
    with pytest.raises(ConcurrentUpdateError, match="Concurrent update"):
        b.log_batch(500, [], {})
    zombie = BatchLog(str(tmp_path), [], lock=Fence(1))
    zombie.recover()
    new = BatchLog(str(tmp_path), [], lock=Fence(3))
    new.recover()
    new.log_batch(1000, [], {})
    with pytest.raises(FencedError, match="epoch 3"):
        zombie.log_batch(1000, [], {})  # this writer is the zombie
    assert epoch_of_offsets(tmp_path, 1) == "3"


def test_a_late_commit_of_an_older_epoch_does_not_commit_the_new_leaders_batch(tmp_path):
    zombie = BatchLog(str(tmp_path), [], lock=Fence(1))
    zombie.recover()
    new = BatchLog(str(tmp_path), [], lock=Fence(2))
    new.recover()
    zombie.log_batch(500, [], {})
    new.log_batch(500, [], {})  # replaces the zombie's offsets/0
    zombie.batch_done(500, True)
    zombie.checkpoint_durable(500)  # the zombie's commits/0 of ITS batch 0 lands
    assert CommitLog(str(tmp_path / "commits")).batch_ids() == [0]
    restarted = BatchLog(str(tmp_path), [], lock=Fence(3))
    restarted.recover()
    assert not restarted.is_committed(500) and restarted.rerun_times == [500]
    # and the new leader, committing its batch 0, replaces the zombie's commit
    new.batch_done(500, True)
    new.checkpoint_durable(500)
    assert CommitLog(str(tmp_path / "commits")).get(0).leader_epoch == 2
    restarted = BatchLog(str(tmp_path), [], lock=Fence(3))
    restarted.recover()
    assert restarted.is_committed(500) and restarted.rerun_times == []


def test_recovery_ignores_a_late_offsets_file_of_an_older_epoch_after_a_newer_one(tmp_path):
    zombie = BatchLog(str(tmp_path), [], lock=Fence(1))
    zombie.recover()
    zombie.log_batch(500, [], {})
    new = BatchLog(str(tmp_path), [], lock=Fence(2))
    new.recover()
    new.log_batch(1000, [], {})  # then the new leader dies, and the zombie's offsets/2 lands
    late = OffsetSeq([], OffsetSeqMetadata(0, 1500, {"sparkwal.leaderEpoch": "1"}))
    assert OffsetSeqLog(str(tmp_path / "offsets")).add(2, late)
    restarted = BatchLog(str(tmp_path), [], lock=Fence(3))
    restarted.recover()
    assert restarted.latest_logged_id() == 1 and restarted.rerun_times == [500, 1000]
    assert restarted.log_batch(1500, [], {}) == 2  # the late file is replaced
    assert epoch_of_offsets(tmp_path, 2) == "3"


def test_a_commit_records_its_epoch_in_a_field_spark_ignores(tmp_path):
    log = CommitLog(str(tmp_path))
    log.add(0, CommitMetadata(0, leader_epoch=7))
    log.add(1, CommitMetadata(0))
    assert (tmp_path / "0").read_bytes() == b'v1\n{"nextBatchWatermarkMs":0,"sparkwal.leaderEpoch":7}'
    assert (tmp_path / "1").read_bytes() == b'v1\n{"nextBatchWatermarkMs":0}'
    assert log.get(0).leader_epoch == 7 and log.get(1).leader_epoch is None
    assert log.get(0) == CommitMetadata(0, leader_epoch=7)


# ------------------------------------------------------------------ state snapshots


def snapshot(url, epoch: int, value) -> dict:
    rows = DriverParts(SimpleNamespace(environment={}), [[("k", value, 1000, False)]])
    return write_snapshot(rows, url, time_ms=1000, base_ms=None, partitioned=False, fence=Fence(epoch))


def test_a_zombies_snapshot_of_a_batch_leaves_the_new_leaders_snapshot_of_it(tmp_path):
    state = tmp_path / "state"
    new = f"{state}/0-1000-e2"
    snapshot(new, 2, "new leader's")
    snapshot(f"{state}/0-1000-e1", 1, "zombie's")
    manifest = read_manifest(new)
    assert manifest["leader_epoch"] == 2
    assert list(part_rows(new, 0, manifest)) == [("k", "new leader's", 1000, False)]
    # a newer leader still replaces what older epochs (and a killed run of its own) left of the batch
    snapshot(f"{state}/0-1000-e3", 3, "newest")
    assert sorted(p.name for p in state.iterdir()) == ["0-1000-e3.manifest", "0-1000-e3.part-00000"]


@pytest.mark.slow
def test_a_late_rewrite_of_an_old_leader_cannot_land_over_the_new_leaders_files(memory_url):
    """On an object store each checkpoint PUT is conditional on the version its writer last wrote
    or read: the old leader's second write of a name (its .bk, then the name), held in the network
    while the new leader rewrote both, finds them changed and lands nowhere."""
    url = f"{memory_url}/ckpt"
    old = CheckpointWriter(url)
    old.write(cp(2000, 1, who="old leader"))
    old.flush()  # the old leader knows its file's version
    new = CheckpointWriter(url)
    new.write(cp(2000, 2, who="new leader, re-run"))  # rewrites the name: the old one goes to .bk
    new.write(cp(2000, 2, who="new leader, its snapshot written"))
    new.flush()
    old.write(cp(2000, 1, who="zombie"))  # the held pair lands now
    with pytest.raises(Exception, match="another driver writes checkpoints here"):
        old.stop()
    assert read_checkpoint(url).data["who"] == "new leader, its snapshot written"
    new.stop()
