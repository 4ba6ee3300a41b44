"""One storage location (issue 43, item 3): a URL with its options, its retry policy and its
storage, resolved once; storage injectable as an object; picklable for tasks, without credentials."""

from __future__ import annotations

import logging
import pickle

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from sparkwal.checkpoint import Checkpoint, CheckpointWriter, read_checkpoint
from sparkwal.wal import (FileBasedWriteAheadLog, RetryPolicy, StorageLocation, StorageUnavailableError,
                          resolve)
from sparkwal.wal.retry import default_policy
from sparkwal.wal.storage import FsspecStorage


def test_a_location_resolves_once_and_its_children_share_its_storage(memory_url):
    root = StorageLocation(memory_url)
    storage, path = root.resolve()
    assert root.resolve()[0] is storage and resolve(root) == (storage, path)
    child = root.child("receivedBlockMetadata", "log-1")
    assert child.storage is storage and child.path == f"{path}/receivedBlockMetadata/log-1"
    assert str(child) == f"{memory_url}/receivedBlockMetadata/log-1"
    with pytest.raises(ValueError, match="a location that has its own"):
        resolve(root, {"anon": True})
    with pytest.raises(TypeError, match="non-empty string"):
        StorageLocation("")


class _Unreachable(MemoryFileSystem):
    """A store that never answers: every listing and read is a reset connection."""
    protocol = "unreachable"

    def ls(self, path, detail=True, **kwargs):
        raise ConnectionResetError("reset by peer")

    def cat_file(self, path, start=None, end=None, **kwargs):
        raise ConnectionResetError("reset by peer")


def test_a_store_handed_in_is_used_with_the_locations_retry_policy():
    """httpx's transport seam: a test hands the store in. Its calls are retried under the
    location's policy (a 0.3 s deadline), not the process default (60 s)."""
    store = FsspecStorage(_Unreachable(), RetryPolicy(deadline_s=0.3, first_backoff_s=0.01, max_backoff_s=0.05))
    with pytest.raises(ValueError, match="unreachable://ckpt: fsspec does not know this protocol"):
        StorageLocation("unreachable://ckpt", storage=store)
    location = StorageLocation("unreachable://ckpt", storage=store, path="/ckpt")
    assert location.path == "/ckpt" and default_policy().deadline_s == 60.0
    with pytest.raises(StorageUnavailableError, match=r"list unreachable://ckpt still failing after \d+ attempts"):
        read_checkpoint(location)


def test_a_wal_and_a_checkpoint_writer_work_on_a_handed_in_store(tmp_path):
    memory = FsspecStorage(MemoryFileSystem())
    location = StorageLocation("memory://handed-in", storage=memory)
    wal = FileBasedWriteAheadLog(location.child("wal"))
    handle = wal.write(b"record", 1000)
    assert wal.read(handle) == b"record"
    wal.close()
    writer = CheckpointWriter(location)
    writer.write(Checkpoint(500, [], {"k": 1}))
    writer.stop()
    assert read_checkpoint(location).data == {"k": 1}
    assert any(info.name == "checkpoint-500" for info in memory.list_files(location.path))
    assert not any(p.name for p in tmp_path.iterdir())  # nothing on the local disk


def test_a_pickled_location_travels_without_credentials_or_storage(caplog):
    policy = RetryPolicy(deadline_s=7.0)
    location = StorageLocation("s3://bucket/ckpt", {"endpoint_url": "http://127.0.0.1:9", "key": "AKIA",
                                                    "secret": "s3cr3t", "client_kwargs": {"region_name": "x",
                                                                                    "aws_session_token": "T0K"}},
                               policy=policy)
    assert "s3cr3t" not in repr(location) and "***" in repr(location)
    with caplog.at_level(logging.WARNING, logger="sparkwal.wal.location"):
        data = pickle.dumps(location)
    assert b"s3cr3t" not in data and b"AKIA" not in data and b"T0K" not in data
    assert ("client_kwargs.aws_session_token, key, secret look like credentials and are not sent to tasks"
            in caplog.text)
    copy = pickle.loads(data)
    assert copy.url == location.url and copy.policy == policy
    assert copy.options == {"endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"region_name": "x"}}


def test_a_drivers_retry_policy_is_the_default_only_while_it_runs(spark_context, live_settings, tmp_path):
    """Constructing a context no longer changes the storage deadline of the one running: the
    policy of a driver (spark.sparkwal.storage.deadline) is the process default from its start
    to its stop, and its checkpoint location carries it."""
    from sparkwal import StreamingContext

    live_settings({"spark.sparkwal.storage.deadline": "9s"})
    ssc = StreamingContext(spark_context, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    ssc.queueStream([[1]]).foreachRDD(lambda rdd: rdd.count())
    assert default_policy().deadline_s == 60.0  # constructed, not started
    assert ssc.driver.location.policy.deadline_s == 9.0
    ssc.start()
    try:
        assert default_policy().deadline_s == 9.0
        live_settings({"spark.sparkwal.storage.deadline": "2s"})
        StreamingContext(spark_context, 0.5)  # another context, not started: changes nothing
        assert default_policy().deadline_s == 9.0
    finally:
        ssc.stop(stopSparkContext=False)
    assert default_policy().deadline_s == 60.0


def test_a_checkpoint_layout_over_a_location_hands_its_store_to_every_log():
    """The layout names paths by the location's URL; :meth:`CheckpointLayout.at` makes each a
    location on the root's store (here one handed in, seen by nothing else), which the offset
    log and the block tracker's WAL then write to."""
    from sparkwal.checkpoint import OffsetSeq, OffsetSeqLog
    from sparkwal.checkpoint.layout import CheckpointLayout
    from sparkwal.tracker import ReceivedBlockTracker

    store = FsspecStorage(MemoryFileSystem())
    root = StorageLocation("memory://layout-at", storage=store)
    layout = CheckpointLayout(root)
    assert layout.root == "memory://layout-at" and layout == CheckpointLayout("memory://layout-at")
    offsets = layout.at(layout.offsets)
    assert isinstance(offsets, StorageLocation) and offsets.storage is store
    assert CheckpointLayout("/data/ckpt").at("/data/ckpt/offsets") == "/data/ckpt/offsets"
    with pytest.raises(ValueError, match="memory://elsewhere/x is not under memory://layout-at"):
        root.at("memory://elsewhere/x")
    assert OffsetSeqLog(offsets).add(0, OffsetSeq(['{"a":1}']))
    tracker = ReceivedBlockTracker([0], wal_dir=layout.at(layout.block_metadata))
    tracker.cleanup_old_batches(1000)
    tracker.stop()
    assert [f.name for f in store.list_files(offsets.path)] == ["0"]
    assert store.list_files(f"{root.path}/receivedBlockMetadata")  # the tracker's WAL segment
