"""Where blocks live: the receiver WAL (read back by handle anywhere) and executor-local files."""

from __future__ import annotations

import os

import pytest

from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.engine.receiver.blocks import (BlockReadError, LocalBlockHandler, WalBlockHandler, read_local_block,
                                    read_wal_block, receiver_wal_dir, serialize_block)
from sparkwal.wal import ManualClock


def located(checkpoint_dir, handle) -> list:
    """A handle as the driver hands it to a task: its segment, named relative to the checkpoint
    directory by the receiver, located there."""
    return [CheckpointLayout(str(checkpoint_dir)).locate(handle.path), handle.offset, handle.length]


def test_a_block_in_the_receiver_wal_is_read_back_by_handle(tmp_path):
    clock = ManualClock(10_000)
    handler = WalBlockHandler(str(tmp_path), 3, clock=clock, rolling_interval_s=1)
    handles = []
    for i in range(4):
        handles.append(handler.store(f"input-3-{clock.now_ms()}-x", serialize_block([i, "é", (i, i)])))
        clock.advance(2_000)
    wal_dir = receiver_wal_dir(str(tmp_path), 3)
    assert all(h.path.startswith("receivedData/3/log-") for h in handles)  # relative: the checkpoint moves
    assert read_wal_block(wal_dir, None, 3, "b2", located(tmp_path, handles[2])) == [2, "é", (2, 2)]
    handler.cleanup_old_blocks(14_000)  # the segments of the first two blocks end before it
    handler.close()
    assert read_wal_block(wal_dir, None, 3, "b3", located(tmp_path, handles[3])) == [3, "é", (3, 3)]
    with pytest.raises(BlockReadError, match=r"block b0 of stream 3 .*write-ahead log record"):
        read_wal_block(wal_dir, None, 3, "b0", located(tmp_path, handles[0]))


def test_each_leadership_epoch_has_its_own_receiver_wal_and_cleans_the_earlier_ones(tmp_path):
    """A receiver of a fenced driver (epoch 1) still holding its WAL's lock neither blocks the new
    receiver (epoch 2) nor writes where the new driver reads; the earlier blocks stay readable by
    handle until the new receiver's cleanup passes them, and an epoch-less log is cleaned too."""
    clock = ManualClock(10_000)
    plain = WalBlockHandler(str(tmp_path), 3, clock=clock, rolling_interval_s=1)
    h0 = plain.store("input-3-10000-x", serialize_block(["plain"]))
    plain.close()
    stale = WalBlockHandler(str(tmp_path), 3, clock=clock, rolling_interval_s=1, epoch=1)
    h1 = stale.store("input-3-10000-y", serialize_block(["old"]))  # keeps its lock: never closed
    other_stream = WalBlockHandler(str(tmp_path), 4, clock=clock, epoch=1)
    other_stream.store("input-4-10000-z", serialize_block(["other"]))
    clock.advance(5_000)
    new = WalBlockHandler(str(tmp_path), 3, clock=clock, rolling_interval_s=1, epoch=2)
    h2 = new.store("input-3-15000-z", serialize_block(["new"]))  # not held up by epoch 1's lock
    assert os.path.dirname(located(tmp_path, h1)[0]) == receiver_wal_dir(str(tmp_path), 3, 1)
    assert os.path.dirname(located(tmp_path, h2)[0]) == receiver_wal_dir(str(tmp_path), 3, 2)
    reader_dir = receiver_wal_dir(str(tmp_path), 3, 2)
    assert read_wal_block(reader_dir, None, 3, "x", located(tmp_path, h0)) == ["plain"]  # any epoch's, by handle
    new.cleanup_old_blocks(12_000)
    assert not os.path.exists(h0.path) and not os.path.exists(h1.path)
    with pytest.raises(BlockReadError, match="block y of stream 3"):
        read_wal_block(reader_dir, None, 3, "y", located(tmp_path, h1))
    assert read_wal_block(reader_dir, None, 3, "z", located(tmp_path, h2)) == ["new"]
    assert os.listdir(receiver_wal_dir(str(tmp_path), 4, 1))  # another stream's log is left alone
    new.close()
    stale.close()
    other_stream.close()


def test_a_damaged_wal_block_is_an_error_naming_block_stream_and_record(tmp_path):
    handler = WalBlockHandler(str(tmp_path), 0)
    handle = handler.store("input-0-1-x", serialize_block(list(range(100))))
    handler.close()
    with open(located(tmp_path, handle)[0], "r+b") as f:
        f.seek(handle.offset + 20)
        f.write(b"\xff")
    with pytest.raises(BlockReadError, match=r"block input-0-1-x of stream 0 .*" + str(handle.offset)):
        read_wal_block(receiver_wal_dir(str(tmp_path), 0), None, 0, "input-0-1-x", located(tmp_path, handle))


def test_local_blocks_are_stored_cleaned_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    handler = LocalBlockHandler("app-1", 2)
    handler.store("input-2-1000-a", serialize_block(["x"]))
    handler.store("input-2-3000-a", serialize_block(["y"]))
    assert read_local_block("app-1", 2, "input-2-1000-a") == ["x"]
    handler.cleanup_old_blocks(2000)
    with pytest.raises(BlockReadError,
                       match="input-2-1000-a of stream 2 could not be read \\(not in this executor's .*writeAheadLog"):
        read_local_block("app-1", 2, "input-2-1000-a")
    path = os.path.join(handler.directory, "input-2-3000-a")
    with open(path, "r+b") as f:
        f.seek(-2, os.SEEK_END)
        byte = f.read(1)
        f.seek(-2, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BlockReadError, match="damaged or not this application's"):
        read_local_block("app-1", 2, "input-2-3000-a")


def test_blocks_of_a_batch_still_kept_are_never_below_the_cleanup_threshold():
    """A backlog: batch 3000 waits while a checkpoint of batch 5000 cleans up to 3000. Its blocks
    were cut before 3000, so a batch-time threshold alone would delete them before it runs;
    unallocated blocks (reported late) are kept as well."""
    from sparkwal.tracker import ReceivedBlockInfo, ReceivedBlockTracker

    from sparkwal.engine.receiver.blocks import oldest_kept_block_ms

    tracker = ReceivedBlockTracker([0])
    for block_id in ("input-0-1500-a", "input-0-2200-a", "input-0-2600-a"):
        tracker.add_block(ReceivedBlockInfo(0, 1, block_id))
    tracker.allocate_blocks_to_batch(2000)  # takes 1500 .. 2600 (reported before it was cut)
    tracker.add_block(ReceivedBlockInfo(0, 1, "input-0-2900-a"))
    tracker.allocate_blocks_to_batch(3000)
    assert oldest_kept_block_ms(tracker, 2000) == 1500  # batch 2000 is kept: all its blocks
    assert oldest_kept_block_ms(tracker, 3000) == 2900  # batch 2000 goes, 3000's block stays
    tracker.add_block(ReceivedBlockInfo(0, 1, "input-0-1000-late"))  # unallocated, cut long ago
    assert oldest_kept_block_ms(tracker, 3000) == 1000
    assert oldest_kept_block_ms(ReceivedBlockTracker([0]), 3000) == 3000  # nothing kept
