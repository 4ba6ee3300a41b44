"""The same log on memory:// and on s3:// (a real S3-compatible server on 127.0.0.1)."""

from __future__ import annotations

import pytest

from sparkwal.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog, LogLockedError, ManualClock, WalError


@pytest.fixture(params=["memory", "s3"])
def backend(request):
    if request.param == "memory":
        return request.getfixturevalue("memory_url") + "/wal", {}, False
    url, options = request.getfixturevalue("s3_url")
    return url + "/wal", options, True


def test_write_read_reopen_clean(backend):
    url, options, object_store = backend
    kw = dict(storage_options=options, rolling_interval_s=1, close_file_after_write=object_store)
    with FileBasedWriteAheadLog(url, **kw) as log:
        handles = [log.write(f"r{i}".encode(), 1000 * i) for i in range(10)]
        assert [log.read(h) for h in handles] == [f"r{i}".encode() for i in range(10)]
    with FileBasedWriteAheadLog(url, **kw) as log:
        assert list(log.read_all()) == [f"r{i}".encode() for i in range(10)]
        log.clean(5000, wait_for_completion=True)
        left = list(log.read_all())
        assert b"r9" in left and b"r0" not in left
        log.write(b"more", 20_000)
    with FileBasedWriteAheadLog(url, **kw) as log:
        assert list(log.read_all()) == left + [b"more"]


def test_group_commit(backend):
    url, options, object_store = backend
    log = BatchedWriteAheadLog(FileBasedWriteAheadLog(
        url, storage_options=options, close_file_after_write=object_store))
    handles = log.wrapped.write_many([b"a", b"b", b"c"], 5)
    assert [log.read(h) for h in handles] == [b"a", b"b", b"c"]
    assert log.statistics().syncs == 1
    log.close()


def test_an_object_store_log_publishes_each_write_as_an_object_and_cannot_be_told_to_append(s3_url):
    url, options = s3_url
    with pytest.raises(WalError, match="close_file_after_write=True"):
        FileBasedWriteAheadLog(url + "/wal", storage_options=options, close_file_after_write=False)
    log = FileBasedWriteAheadLog(url + "/wal", storage_options=options)  # chosen for this store
    log.write(b"one", 1)
    log.write(b"two", 2)
    log.close()
    assert list(FileBasedWriteAheadLog(url + "/wal", storage_options=options).read_all()) == [b"one", b"two"]


def test_lease_fences_a_second_writer_and_expires(backend):
    url, options, object_store = backend
    clock = ManualClock(1_000_000)
    kw = dict(storage_options=options, close_file_after_write=object_store, clock=clock, lease_s=30)
    first = FileBasedWriteAheadLog(url, **kw)
    first.write(b"first", 1)
    second = FileBasedWriteAheadLog(url, **kw)
    if object_store:
        with pytest.raises(LogLockedError, match="held by pid"):
            second.write(b"second", 2)
        clock.advance(31_000)  # the first writer stopped renewing: its lease expires
        second.write(b"second", 2)
        with pytest.raises(LogLockedError, match="lapsed"):
            first.write(b"stale writer", 3)  # fenced by itself once its lease lapsed: no more writes
        second.close()
        with FileBasedWriteAheadLog(url, **kw) as log:
            assert list(log.read_all()) == [b"first", b"second"]
    else:  # memory:// is process-local: the same lease object protects it
        with pytest.raises(LogLockedError):
            second.write(b"second", 2)
        first.close()
        second.write(b"second", 2)
        second.close()
