"""Port of Spark's ReceivedBlockTrackerSuite, case by case, plus SPARK-23991's
failure scenario under random injected WAL failures and a 100,000-block allocation."""

from __future__ import annotations

import os
import random

import pytest

from sparkwal.checkpoint.layout import RECEIVED_BLOCK_METADATA as WAL_DIR
from sparkwal.tracker import (BatchAllocationEvent, BatchCleanupEvent, BlockAdditionEvent,
                     ReceivedBlockInfo, ReceivedBlockTracker, decode_event, encode_event)
from sparkwal.wal import FileBasedWriteAheadLog, ManualClock, RecordHandle
from sparkwal.wal.segment import HEADER, encode_frames, parse_segment_name

STREAM = 1
_ids = iter(range(10**9))


def block_infos(n=5, stream=STREAM):
    return [ReceivedBlockInfo(stream, 10, f"input-{stream}-{next(_ids)}",
                              RecordHandle(f"/wal/log-{i}", i * 100, 10), {"offset": i})
            for i in range(n)]


def make(checkpoint_dir=None, clock=None, recover=False, **kw):
    return ReceivedBlockTracker([STREAM], None if checkpoint_dir is None else str(checkpoint_dir),
                                recover_from_wal=recover, clock=clock or ManualClock(10_000),
                                rolling_interval_s=1, **kw)


def wal_files(checkpoint_dir):
    d = os.path.join(str(checkpoint_dir), WAL_DIR)
    if not os.path.isdir(d):
        return []
    names = [n for n in os.listdir(d) if parse_segment_name(n)]
    return [os.path.join(d, n) for n in sorted(names, key=parse_segment_name)]


def written_events(checkpoint_dir):
    with FileBasedWriteAheadLog(os.path.join(str(checkpoint_dir), WAL_DIR)) as log:
        return [decode_event(r) for r in log.read_all()]


def test_block_addition_and_block_to_batch_allocation():
    tracker = make()
    assert tracker.wal is None  # no checkpoint dir: the WAL is disabled
    assert tracker.get_unallocated_blocks(STREAM) == []
    infos = block_infos()
    assert all(tracker.add_block(b) for b in infos)
    assert tracker.get_unallocated_blocks(STREAM) == infos
    assert tracker.has_unallocated_blocks()

    tracker.allocate_blocks_to_batch(1)
    assert tracker.get_blocks_of_batch_and_stream(1, STREAM) == infos
    assert tracker.get_blocks_of_batch(1) == {STREAM: infos}
    assert tracker.get_unallocated_blocks(STREAM) == []
    assert not tracker.has_unallocated_blocks()

    tracker.allocate_blocks_to_batch(2)  # no blocks: an empty allocation for every stream
    assert tracker.get_blocks_of_batch_and_stream(2, STREAM) == []
    assert tracker.get_blocks_of_batch(2) == {STREAM: []}

    tracker.allocate_blocks_to_batch(1)  # an older batch: no-op, same blocks as before
    assert tracker.get_blocks_of_batch_and_stream(1, STREAM) == infos

    for b in infos:
        tracker.add_block(b)
    tracker.allocate_blocks_to_batch(2)  # already allocated: the new blocks stay unallocated
    assert tracker.get_blocks_of_batch_and_stream(2, STREAM) == []
    assert tracker.get_unallocated_blocks(STREAM) == infos


@pytest.mark.slow
def test_block_allocation_with_many_blocks_recovers(tmp_path):
    """100,000 blocks in one allocation: the WAL holds every addition plus one allocation event
    in a single segment, and the allocation recovers."""
    tracker = make(tmp_path, durability="flush")
    infos = block_infos(100_000)
    for b in infos:
        assert tracker.add_block(b)
    tracker.allocate_blocks_to_batch(1)
    tracker.stop()
    events = written_events(tmp_path)
    assert events == [BlockAdditionEvent(b) for b in infos] + [BatchAllocationEvent(1, {STREAM: infos})]
    assert len(wal_files(tmp_path)) == 1
    recovered = make(tmp_path, recover=True)
    assert recovered.get_blocks_of_batch(1) == {STREAM: infos}
    assert not recovered.has_unallocated_blocks()
    recovered.stop()


def test_recovery_removes_only_allocated_blocks_from_the_received_queue(tmp_path):
    clock = ManualClock(10_000)
    batch_time = clock.now_ms()
    tracker1 = make(tmp_path, clock)
    assert tracker1.wal is not None
    allocated, unallocated = block_infos(), block_infos()
    for b in allocated + unallocated:
        tracker1.wal.write(encode_event(BlockAdditionEvent(b)), clock.now_ms())
    tracker1.wal.write(encode_event(BatchAllocationEvent(batch_time, {STREAM: allocated})),
                       clock.now_ms())
    tracker1.stop()
    tracker2 = make(tmp_path, clock, recover=True)
    assert tracker2.get_blocks_of_batch(batch_time) == {STREAM: allocated}
    assert tracker2.get_unallocated_blocks(STREAM) == unallocated
    tracker2.stop()


def test_block_allocation_does_not_lose_blocks_when_its_log_write_fails(faulty, memory_url):
    """SPARK-23991: a failed BatchAllocationEvent write leaves the blocks queued."""
    url = memory_url.replace("memory://", "faulty://")
    tracker1 = make(url)
    infos1 = block_infos()
    for b in infos1:
        tracker1.add_block(b)
    assert tracker1.allocate_blocks_to_batch(1)
    infos2 = block_infos()
    for b in infos2:
        tracker1.add_block(b)
    assert tracker1.get_unallocated_blocks(STREAM) == infos2
    faulty.fail("write", times=3)  # every attempt of the allocation's write fails
    assert not tracker1.allocate_blocks_to_batch(2)
    assert tracker1.get_unallocated_blocks(STREAM) == infos2
    assert tracker1.get_blocks_of_batch_and_stream(2, STREAM) == []
    assert tracker1.allocate_blocks_to_batch(3)
    assert tracker1.get_blocks_of_batch_and_stream(3, STREAM) == infos2
    assert tracker1.get_unallocated_blocks(STREAM) == []
    tracker1.stop()
    tracker2 = make(url, recover=True)
    assert tracker2.get_blocks_of_batch_and_stream(1, STREAM) == infos1
    assert tracker2.get_blocks_of_batch_and_stream(2, STREAM) == []
    assert tracker2.get_blocks_of_batch_and_stream(3, STREAM) == infos2
    assert tracker2.get_unallocated_blocks(STREAM) == []
    tracker2.stop()


def test_recovery_and_cleanup_with_write_ahead_logs(tmp_path):
    clock = ManualClock(10_000)

    def increment_time():  # twice the rolling interval: every step opens a new segment
        clock.advance(2000)

    tracker1 = make(tmp_path, clock)
    infos1 = block_infos()
    for b in infos1:
        tracker1.add_block(b)
    assert tracker1.get_unallocated_blocks(STREAM) == infos1
    tracker1.stop()
    assert written_events(tmp_path) == [BlockAdditionEvent(b) for b in infos1]
    assert len(wal_files(tmp_path)) == 1
    increment_time()

    no_recovery = make(tmp_path, clock, recover=False)  # recovery off: starts empty
    assert no_recovery.get_unallocated_blocks(STREAM) == []
    no_recovery.stop()

    tracker2 = make(tmp_path, clock, recover=True)
    unallocated = tracker2.get_unallocated_blocks(STREAM)
    assert unallocated == infos1
    assert all(not b.is_block_id_valid for b in unallocated)
    batch_time1 = clock.now_ms()
    tracker2.allocate_blocks_to_batch(batch_time1)
    assert tracker2.get_blocks_of_batch_and_stream(batch_time1, STREAM) == infos1
    assert tracker2.get_blocks_of_batch(batch_time1) == {STREAM: infos1}
    increment_time()
    batch_time2 = clock.now_ms()
    infos2 = block_infos()
    for b in infos2:
        tracker2.add_block(b)
    tracker2.allocate_blocks_to_batch(batch_time2)
    assert tracker2.get_blocks_of_batch_and_stream(batch_time2, STREAM) == infos2
    tracker2.stop()
    assert written_events(tmp_path) == (
        [BlockAdditionEvent(b) for b in infos1] + [BatchAllocationEvent(batch_time1, {STREAM: infos1})]
        + [BlockAdditionEvent(b) for b in infos2] + [BatchAllocationEvent(batch_time2, {STREAM: infos2})])

    increment_time()
    tracker3 = make(tmp_path, clock, recover=True)
    assert tracker3.get_blocks_of_batch_and_stream(batch_time1, STREAM) == infos1
    assert tracker3.get_blocks_of_batch_and_stream(batch_time2, STREAM) == infos2
    assert tracker3.get_unallocated_blocks(STREAM) == []

    oldest = wal_files(tmp_path)[0]
    increment_time()
    tracker3.cleanup_old_batches(batch_time2, wait_for_completion=True)
    assert tracker3.get_blocks_of_batch_and_stream(batch_time1, STREAM) == []
    tracker3.stop()
    assert written_events(tmp_path)[-1] == BatchCleanupEvent([batch_time1])
    assert oldest not in wal_files(tmp_path)

    increment_time()
    tracker4 = make(tmp_path, clock, recover=True)
    assert tracker4.get_unallocated_blocks(STREAM) == []
    assert tracker4.get_blocks_of_batch_and_stream(batch_time1, STREAM) == []
    assert tracker4.get_blocks_of_batch_and_stream(batch_time2, STREAM) == infos2
    tracker4.stop()


def test_cleanup_is_logged_even_when_nothing_is_cleaned_and_needs_a_past_threshold(tmp_path):
    clock = ManualClock(50_000)
    tracker = make(tmp_path, clock)
    tracker.cleanup_old_batches(1000, wait_for_completion=True)
    with pytest.raises(ValueError, match="before the current time"):
        tracker.cleanup_old_batches(50_000)
    tracker.stop()
    assert written_events(tmp_path) == [BatchCleanupEvent([])]


def write_segment(checkpoint_dir, t, events):
    d = os.path.join(str(checkpoint_dir), WAL_DIR)
    os.makedirs(d, exist_ok=True)
    frames, _ = encode_frames([encode_event(e) for e in events])
    with open(os.path.join(d, f"log-{t}-{t + 1000}"), "wb") as f:
        f.write(HEADER + frames)


def test_parallel_file_deletion_is_robust_to_deletion_errors(tmp_path):
    """Old segments that should have been deleted (or come back) never change what recovers."""
    blocks = block_infos()
    batch1, batch2, batch3 = blocks[:1], blocks[1:3], blocks[3:]
    t = [i * 1000 for i in range(5)]
    write_segment(tmp_path, t[0], [BatchCleanupEvent([t[0]])])
    alloc1 = BatchAllocationEvent(t[1], {STREAM: batch1})
    write_segment(tmp_path, t[1], [BlockAdditionEvent(b) for b in batch1] + [alloc1])
    write_segment(tmp_path, t[2], [BatchCleanupEvent([t[1]])])
    alloc2 = BatchAllocationEvent(t[3], {STREAM: batch2})
    write_segment(tmp_path, t[3], [BlockAdditionEvent(b) for b in batch2] + [alloc2])
    write_segment(tmp_path, t[4], [BlockAdditionEvent(b) for b in batch3])
    assert len(wal_files(tmp_path)) == 5

    def same(base, other):
        for time in (t[3], t[1], t[0]):
            assert other.get_blocks_of_batch_and_stream(time, STREAM) == \
                base.get_blocks_of_batch_and_stream(time, STREAM)
        assert other.get_unallocated_blocks(STREAM) == base.get_unallocated_blocks(STREAM)

    base = make(tmp_path, ManualClock(t[4]), recover=True)
    assert base.get_blocks_of_batch_and_stream(t[3], STREAM) == batch2
    assert base.get_blocks_of_batch_and_stream(t[1], STREAM) == []  # cleaned by the t[2] event
    assert base.get_unallocated_blocks(STREAM) == batch3
    base.cleanup_old_batches(t[3], wait_for_completion=True)
    names = [os.path.basename(f) for f in wal_files(tmp_path)]
    # segments ending before t[3] are gone; the cleanup event went to a new segment
    assert names[:3] == ["log-2000-3000", "log-3000-4000", "log-4000-5000"] and len(names) == 4
    same(base, make(tmp_path, ManualClock(t[4]), recover=True))
    write_segment(tmp_path, t[0], [BatchCleanupEvent([t[0]])])  # an old file comes back
    same(base, make(tmp_path, ManualClock(t[4]), recover=True))
    write_segment(tmp_path, t[1], [BlockAdditionEvent(b) for b in batch1] + [alloc1])
    same(base, make(tmp_path, ManualClock(t[4]), recover=True))


def test_injected_wal_failures_never_lose_or_duplicate_a_block(faulty, memory_url):
    """Random WAL write failures during additions and allocations: memory and the recovered state
    agree exactly, every acknowledged block is in exactly one place, no refused one anywhere."""
    url = memory_url.replace("memory://", "faulty://")
    rng = random.Random(5)
    clock = ManualClock(1000)
    tracker = make(url, clock)
    acked, refused = [], []
    for _ in range(300):
        if rng.random() < 0.15:
            faulty.fail("write", times=3)
        if rng.random() < 0.2:
            tracker.allocate_blocks_to_batch(clock.now_ms())
            clock.advance(500)
        else:
            (b,) = block_infos(1)
            (acked if tracker.add_block(b) else refused).append(b.block_id)
        faulty.plan.clear()
    assert refused and acked  # both paths exercised

    def placement(tr):
        where = [b.block_id for t in tr.allocated_batch_times()
                 for b in tr.get_blocks_of_batch_and_stream(t, STREAM)]
        return where + [b.block_id for b in tr.get_unallocated_blocks(STREAM)]

    live = placement(tracker)
    assert sorted(live) == sorted(acked) and len(set(live)) == len(live)
    snapshot = {t: tracker.get_blocks_of_batch(t) for t in tracker.allocated_batch_times()}
    tracker.stop()
    recovered = make(url, clock, recover=True)
    assert placement(recovered) == live
    assert {t: recovered.get_blocks_of_batch(t) for t in recovered.allocated_batch_times()} == snapshot
    recovered.stop()


def test_event_encoding_round_trips_and_rejects_unknown_versions():
    import msgpack

    from sparkwal.tracker import EventFormatError

    infos = block_infos(3) + [ReceivedBlockInfo(2, None, "input-2-x")]
    for event in (BlockAdditionEvent(infos[0]), BatchAllocationEvent(7, {1: infos[:3], 2: infos[3:]}),
                  BatchCleanupEvent([1, 2, 3])):
        assert decode_event(encode_event(event)) == event
    with pytest.raises(EventFormatError, match="version 9"):
        decode_event(msgpack.packb([9, 1, []]))
    with pytest.raises(EventFormatError):
        decode_event(b"\xc1garbage")
    with pytest.raises(ValueError):
        ReceivedBlockInfo(1, -1, "bad")


def test_recovery_restores_the_garbage_collector_state(tmp_path):
    import gc

    tracker = make(tmp_path)
    tracker.add_block(block_infos(1)[0])
    tracker.stop()
    assert gc.isenabled()
    make(tmp_path, recover=True).stop()
    assert gc.isenabled()
    gc.disable()
    try:
        make(tmp_path, recover=True).stop()
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_tracker_on_every_backend(storage_url):
    """On object stores the tracker's WAL writes one object per group (no append)."""
    base, options = storage_url
    clock = ManualClock(10_000)
    tracker = ReceivedBlockTracker([STREAM], base, clock=clock, storage_options=options)
    infos = block_infos(4)
    for b in infos[:3]:
        assert tracker.add_block(b)
    assert tracker.allocate_blocks_to_batch(10_000)
    assert tracker.add_block(infos[3])
    tracker.stop()
    recovered = ReceivedBlockTracker([STREAM], base, clock=clock, storage_options=options,
                                     recover_from_wal=True)
    assert recovered.get_blocks_of_batch(10_000) == {STREAM: infos[:3]}
    assert recovered.get_unallocated_blocks(STREAM) == infos[3:]
    recovered.stop()


def test_the_tracker_logs_where_spark_does_and_takes_a_wal_directory_as_a_keyword(tmp_path):
    """Spark's ``ReceivedBlockTracker(..., checkpointDirOption)``: the WAL at
    ``<checkpoint_dir>/receivedBlockMetadata``, the name the checkpoint layout lists; or a WAL
    directory of the caller's (``wal_dir=``), not both."""
    from sparkwal.checkpoint.layout import CheckpointLayout

    tracker = ReceivedBlockTracker([STREAM], checkpoint_dir=str(tmp_path))
    assert tracker.add_block(block_infos(1)[0])
    tracker.stop()
    assert os.listdir(CheckpointLayout(str(tmp_path)).block_metadata)
    other = ReceivedBlockTracker([STREAM], wal_dir=str(tmp_path / "elsewhere"))
    assert other.add_block(block_infos(1)[0])
    other.stop()
    assert os.listdir(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="not both"):
        ReceivedBlockTracker([STREAM], str(tmp_path), wal_dir=str(tmp_path / "x"))
