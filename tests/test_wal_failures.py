"""Injected I/O failures (faulty:// filesystem): retries on fresh segments, nothing acknowledged lost,
no garbage left between valid records."""

from __future__ import annotations

import pytest

from sparkwal.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog, WalError
from sparkwal.wal.segment import iter_segment, parse_segment_name


def open_log(url, **kw):
    return FileBasedWriteAheadLog(url.replace("memory://", "faulty://"), **kw)


def strict_scan(faulty, url):
    """Read every segment as a sealed one: any garbage between records would raise."""
    fs = faulty()
    root = "/" + url.split("://", 1)[1]
    out = []
    def start(e):
        return parse_segment_name(e["name"].rsplit("/", 1)[1]) or (0, 0)

    for info in sorted(fs.ls(root, detail=True), key=start):
        name = info["name"].rsplit("/", 1)[1]
        if parse_segment_name(name):
            with fs.open(info["name"], "rb") as f:
                out += list(iter_segment(f, info["name"], newest=False))
    return out


@pytest.mark.parametrize("op,partial", [("write", 0), ("write", 5), ("write", 13), ("flush", 0)])
def test_failed_write_is_retried_on_a_fresh_segment(faulty, memory_url, op, partial):
    log = open_log(memory_url, max_failures=3, durability="fsync")
    acked = [log.write(f"r{i}".encode(), 1000 + i) for i in range(3)]
    faulty.fail(op, times=2, partial=partial)
    h = log.write(b"survivor", 2000)
    assert log.read(h) == b"survivor"
    stats = log.statistics()
    assert stats.write_failures == 2
    assert h.path != acked[0].path  # retried on a fresh segment
    assert [log.read(a) for a in acked] == [b"r0", b"r1", b"r2"]
    log.close()
    assert strict_scan(faulty, memory_url) == [b"r0", b"r1", b"r2", b"survivor"]


@pytest.mark.parametrize("max_failures", [1, 2])
def test_failure_after_the_last_retry_is_raised_and_the_log_keeps_working(faulty, memory_url,
                                                                         max_failures):
    log = open_log(memory_url, max_failures=max_failures)
    log.write(b"before", 1)
    faulty.fail("write", times=max_failures, partial=7)
    with pytest.raises(WalError, match=f"failed after {max_failures} attempt") as err:
        log.write(b"lost", 2)
    assert isinstance(err.value.__cause__, OSError)
    log.write(b"after", 3)
    assert list(log.read_all()) == [b"before", b"after"]
    log.close()
    assert strict_scan(faulty, memory_url) == [b"before", b"after"]


def test_segment_creation_failure_is_retried(faulty, memory_url):
    log = open_log(memory_url, max_failures=3, rolling_interval_s=1)
    log.write(b"a", 1000)
    faulty.fail("open", times=2)
    log.write(b"b", 5000)  # needs a new segment: creation fails twice, then works
    assert list(log.read_all()) == [b"a", b"b"]
    log.close()


def test_close_after_write_put_failure_is_retried(faulty, memory_url):
    log = open_log(memory_url, close_file_after_write=True, max_failures=3)
    faulty.fail("pipe", times=2)
    log.write(b"one", 1)
    assert list(log.read_all()) == [b"one"]
    assert log.statistics().write_failures == 2
    log.close()


def test_deletion_failures_are_logged_never_fatal(faulty, memory_url, caplog):
    log = open_log(memory_url, rolling_interval_s=1)
    for t in range(0, 10_000, 1000):
        log.write(str(t).encode(), t)
    faulty.fail("rm", times=2)
    log.clean(6000, wait_for_completion=True)
    stats = log.statistics()
    assert stats.delete_failures == 2 and stats.segments_deleted >= 1
    assert "could not delete WAL segment" in caplog.text
    log.write(b"still writable", 20_000)
    log.close()


def test_batched_log_surfaces_the_wrapped_failure(faulty, memory_url):
    """(Spark: failures in wrappedLog get bubbled up.)"""
    log = BatchedWriteAheadLog(open_log(memory_url, max_failures=1))
    faulty.fail("write", times=1)
    with pytest.raises(WalError) as err:
        log.write(b"x", 1)
    assert "injected write failure" in str(err.value.__cause__)
    assert log.read(log.write(b"y", 2)) == b"y"
    log.close()


def _local_records(directory) -> list[bytes]:
    """Every record of a local log, each segment read as a sealed one (garbage would raise)."""
    out = []
    for path in sorted(directory.iterdir(), key=lambda p: parse_segment_name(p.name) or (0, 0)):
        if parse_segment_name(path.name):
            with open(path, "rb") as f:
                out += list(iter_segment(f, str(path), newest=False))
    return out


class _Injected:
    """Makes the local fast path's next system call fail as told, once."""

    def __init__(self, real, how: str):
        self.real, self.how, self.fired = real, how, False

    def __call__(self, fd, data=None):
        if self.fired:
            return self.real(fd) if data is None else self.real(fd, data)
        self.fired = True
        if self.how == "short":  # the kernel took only part of the frame
            if isinstance(data, bytes):
                return self.real(fd, data[:5])
            return self.real(fd, [b"".join(data)[:5]])
        raise OSError(5, "Input/output error (injected)")


@pytest.mark.parametrize("call,how,size", [("_os_write", "short", 100), ("_os_write", "eio", 100),
                                           ("_os_writev", "short", 8000), ("_os_writev", "eio", 8000),
                                           ("_os_fdatasync", "eio", 100)])
def test_the_local_fast_path_cuts_a_failed_write_and_retries(tmp_path, monkeypatch, caplog, call, how,
                                                             size):
    import sparkwal.wal.file_log as file_log

    log = FileBasedWriteAheadLog(str(tmp_path), durability="fsync")
    acked = [log.write(bytes([i]) * size, 1000 + i) for i in range(3)]  # opens the fast path
    monkeypatch.setattr(file_log, call, _Injected(getattr(file_log, call), how))
    survivor = log.write(b"s" * size, 1003)
    assert getattr(file_log, call).fired
    assert log.read(survivor) == b"s" * size and survivor.path != acked[0].path
    assert log.statistics().write_failures == 1
    assert ("Input/output error (injected)" if how == "eio" else "short write") in caplog.text
    log.write(b"after", 1004)
    log.close()
    assert _local_records(tmp_path) == [bytes([i]) * size for i in range(3)] + [b"s" * size, b"after"]


def test_write_many_is_one_write_and_one_sync_with_a_handle_per_record(tmp_path):
    log = FileBasedWriteAheadLog(str(tmp_path))
    records = [b"x" * n for n in (0, 1, 200, 5000)]
    handles = log.write_many(records, 1)
    assert [log.read(h) for h in handles] == records
    stats = log.statistics()
    assert (stats.writes, stats.syncs, stats.records_written) == (1, 1, 4)
    assert log.write_batch([b"alias"], 2)[0].length == 5  # the earlier name still works
    log.close()
