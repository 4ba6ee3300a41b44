"""The storage seam on every backend (port of Spark SQL's CheckpointFileManagerSuite)."""

from __future__ import annotations

import os

import pytest

from sparkwal.checkpoint import CommitLog, CommitMetadata, OffsetSeq, OffsetSeqLog, OffsetSeqMetadata, resolve_restart
from sparkwal.wal.storage import resolve


@pytest.fixture
def store(storage_url):
    base, options = storage_url
    storage, root = resolve(base, options)
    return storage, root


def test_mkdirs_list_create_atomic_open_delete_exists(store):
    storage, root = store
    d = storage.join(root, "dir")
    storage.makedirs(d)
    f = storage.join(d, "file")
    assert not storage.exists(f)
    assert storage.put_if_absent(f, b"one")
    assert storage.exists(f) and storage.read_file(f) == b"one"
    assert not storage.put_if_absent(f, b"two")  # create-if-absent never overwrites
    assert storage.read_file(f) == b"one"
    storage.put(f, b"three")  # atomic replace does
    assert storage.read_file(f) == b"three"
    assert [i.name for i in storage.list_files(d)] == ["file"]  # no temp or .crc files left
    assert storage.read_range(f, 1, 3) == b"hre"
    storage.delete(f)
    assert not storage.exists(f)
    storage.delete(f)  # deleting twice is fine
    with pytest.raises(FileNotFoundError):
        storage.read_file(f)
    assert storage.list_files(storage.join(root, "missing")) == []


def test_listing_shows_regular_files_only(store):
    storage, root = store
    storage.makedirs(storage.join(root, "sub"))
    storage.put(storage.join(root, "a"), b"1")
    storage.put(storage.join(root, "sub/b"), b"2")  # "sub" is a directory (or prefix)
    assert [i.name for i in storage.list_files(root)] == ["a"]


def test_local_atomic_create_leaves_no_temp_files(tmp_path):
    storage, root = resolve(str(tmp_path))
    for _ in range(20):
        storage.put_if_absent(os.path.join(root, "x"), b"data")
        storage.put(os.path.join(root, "y"), b"data")
    assert sorted(os.listdir(tmp_path)) == ["x", "y"]


def test_offsets_commits_and_restart_on_every_backend(storage_url):
    base, options = storage_url
    offsets = OffsetSeqLog(f"{base}/offsets", storage_options=options)
    commits = CommitLog(f"{base}/commits", storage_options=options)
    for i in range(3):
        assert offsets.add(i, OffsetSeq([str(i)], OffsetSeqMetadata(0, 100 + i)))
    commits.add(0, CommitMetadata(0))
    commits.add(1, CommitMetadata(5))
    assert not offsets.add(2, OffsetSeq(["other"], None))
    p = resolve_restart(offsets, commits)
    assert (p.batch_id, p.rerun, p.start_offsets, p.end_offsets) == (2, True, ["1"], ["2"])
    assert offsets.get(2).metadata.batch_timestamp_ms == 102
