"""BatchedWriteAheadLog: group commit, Spark's batching rules, shutdown (Spark's
streaming/src/main/scala/org/apache/spark/streaming/util/BatchedWriteAheadLog.scala)."""

from __future__ import annotations

import threading

import pytest

from concurrency import run_concurrently
from sparkwal.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog, WalError, WriteAheadLog


class GatedLog(WriteAheadLog):
    """A real FileBasedWriteAheadLog whose group writes can be held at a gate."""

    def __init__(self, log_dir):
        self.inner = FileBasedWriteAheadLog(str(log_dir))
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls: list[tuple[list[bytes], int]] = []
        self.closed = False

    def write(self, data, time_ms):
        return self.write_many([data], time_ms)[0]

    def write_many(self, records, time_ms):
        self.calls.append((list(records), time_ms))
        self.entered.set()
        self.gate.wait()
        return self.inner.write_many(records, time_ms)

    def read(self, handle):
        return self.inner.read(handle)

    def read_all(self):
        return self.inner.read_all()

    def clean(self, thresh_time_ms, wait_for_completion=False):
        self.inner.clean(thresh_time_ms, wait_for_completion)

    def close(self):
        self.closed = True
        self.inner.close()

    def statistics(self):
        return self.inner.statistics()


def wait_for(predicate, timeout=10.0):
    done = threading.Event()
    while not predicate():
        if done.wait(0.001) or timeout <= 0:
            raise AssertionError("condition not reached")
        timeout -= 0.001


def in_thread(fn, *args):
    result = {}

    def run():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_eight_threads_share_syncs(tmp_path):
    log = BatchedWriteAheadLog(FileBasedWriteAheadLog(str(tmp_path)))
    per_thread = 60
    results: dict[int, list] = {}

    def writer(t):
        results[t] = [(f"{t}-{i}".encode(), log.write(f"{t}-{i}".encode(), i)) for i in range(per_thread)]

    run_concurrently(writer, [(t,) for t in range(8)])
    stats = log.statistics()
    assert stats.records_written == 8 * per_thread
    assert stats.syncs <= stats.records_written / 2, stats  # groups of 2+ on average
    for recs in results.values():
        for data, handle in recs:
            assert log.read(handle) == data
    assert sorted(log.read_all()) == sorted(d for recs in results.values() for d, _ in recs)
    log.close()


def test_group_is_written_at_its_newest_time_sorted_by_time(tmp_path):
    """(Spark: name log with the highest timestamp of aggregated entries.)"""
    gated = GatedLog(tmp_path)
    log = BatchedWriteAheadLog(gated)
    gated.gate.clear()
    first, _ = in_thread(log.write, b"3", 3)
    assert gated.entered.wait(10)
    others = [in_thread(log.write, str(t).encode(), t) for t in (5, 8, 12, 10)]
    wait_for(lambda: log.statistics().queued_records == 4)
    gated.gate.set()
    for t, _ in [(first, None)] + others:
        t.join()
    assert gated.calls[0] == ([b"3"], 3)
    assert gated.calls[1] == ([b"5", b"8", b"10", b"12"], 12)
    assert [r["value"] for _, r in others] and all("error" not in r for _, r in others)
    log.close()


def test_shutdown_properly(tmp_path):
    gated = GatedLog(tmp_path)
    log = BatchedWriteAheadLog(gated)
    h = log.write(b"x", 1)
    log.close()
    assert gated.closed
    with pytest.raises(WalError, match="close\\(\\) was called"):
        log.write(b"late", 2)
    with FileBasedWriteAheadLog(str(tmp_path)) as reader:
        assert reader.read(h) == b"x"


def test_close_writes_what_is_queued(tmp_path):
    gated = GatedLog(tmp_path)
    log = BatchedWriteAheadLog(gated)
    gated.gate.clear()
    first = in_thread(log.write, b"1", 1)
    assert gated.entered.wait(10)
    queued = [in_thread(log.write, str(t).encode(), t) for t in (2, 3)]
    wait_for(lambda: log.statistics().queued_records == 2)
    closer = in_thread(log.close)
    gated.gate.set()  # the blocked write finishes; close then flushes the queued ones
    closer[0].join()
    for t, r in [first] + queued:
        t.join()
        assert "error" not in r
    with FileBasedWriteAheadLog(str(tmp_path)) as reader:
        assert list(reader.read_all()) == [b"1", b"2", b"3"]


def test_fail_everything_in_queue_during_shutdown(tmp_path):
    """(Spark: fail everything in queue during shutdown.) The wrapped write hangs, so close gives
    up after the batching timeout and fails every queued write instead of hanging with it."""
    gated = GatedLog(tmp_path)
    log = BatchedWriteAheadLog(gated, batching_timeout_s=0.5)
    gated.gate.clear()
    in_thread(log.write, b"stuck", 1)
    assert gated.entered.wait(10)
    queued = [in_thread(log.write, str(t).encode(), t) for t in (2, 3, 4)]
    wait_for(lambda: log.statistics().queued_records == 3)
    log.close()
    for t, r in queued:
        t.join()
        assert isinstance(r.get("error"), WalError), r
    assert not gated.closed  # the stuck writer still owns the wrapped log
    gated.gate.set()


def test_timeout_waiting_for_a_group_is_reported(tmp_path):
    """A writer gives up after the batching timeout: a record inside a stuck group write may
    still become durable; one still queued behind it is withdrawn and never written."""
    gated = GatedLog(tmp_path)
    log = BatchedWriteAheadLog(gated, batching_timeout_s=0.2)
    gated.gate.clear()
    with pytest.raises(WalError, match="not confirmed within 0.2 s .it may still become durable"):
        log.write(b"first", 1)
    with pytest.raises(WalError, match="not confirmed within 0.2 s .withdrawn"):
        log.write(b"queued", 2)
    assert log.statistics().queued_records == 0
    gated.gate.set()
    log.close()
    with FileBasedWriteAheadLog(str(tmp_path)) as reader:
        assert list(reader.read_all()) == [b"first"]


def test_write_many_goes_into_one_group_with_a_handle_per_record(tmp_path):
    gated = GatedLog(tmp_path)
    log = BatchedWriteAheadLog(gated)
    handles = log.write_many([b"a", b"bb", b"ccc"], 7)
    assert gated.calls == [([b"a", b"bb", b"ccc"], 7)]
    assert [log.read(h) for h in handles] == [b"a", b"bb", b"ccc"]
    assert log.write_many([], 8) == []
    log.close()


def test_many_short_lingers_never_break_the_wake_up_protocol(tmp_path):
    """Writers arriving while the writer thread's linger times out must neither be lost nor
    release the wake-up lock twice (a RuntimeError in the caller)."""
    log = BatchedWriteAheadLog(FileBasedWriteAheadLog(str(tmp_path), durability="flush"),
                               max_linger_s=0.00005)

    def writer(t):
        for i in range(300):
            log.write(b"%d-%d" % (t, i), i)

    run_concurrently(writer, [(t,) for t in range(6)])
    assert log.statistics().records_written == 1800
    log.close()


class InterruptedLog(GatedLog):
    """Its next group write raises ``interrupt`` (as a signal handler's ``sys.exit`` would)."""

    def __init__(self, log_dir, interrupt):
        super().__init__(log_dir)
        self.interrupt = interrupt

    def write_many(self, records, time_ms):
        if self.interrupt is not None:
            interrupt, self.interrupt = self.interrupt, None
            raise interrupt
        return super().write_many(records, time_ms)


def test_a_failed_group_write_fails_its_writers_and_the_next_group_is_written(tmp_path):
    log = BatchedWriteAheadLog(InterruptedLog(tmp_path, OSError("disk full")), batching_timeout_s=5)
    with pytest.raises(WalError, match="group write at time 1 failed: disk full"):
        log.write(b"lost", 1)
    log.write(b"kept", 2)
    log.close()
    with FileBasedWriteAheadLog(str(tmp_path)) as reader:
        assert list(reader.read_all()) == [b"kept"]


@pytest.mark.parametrize("interrupt", [SystemExit(3), KeyboardInterrupt()])
def test_an_interrupt_in_a_group_write_ends_the_writer_and_every_later_write_fails_at_once(tmp_path, interrupt):
    """A SystemExit or KeyboardInterrupt is not a write error to carry on after: the writer thread
    ends, its group's writer fails naming it, a later write fails at once (not after its batching
    timeout, not written by a thread that should have stopped), and close still closes the log."""
    wrapped = InterruptedLog(tmp_path, interrupt)
    log = BatchedWriteAheadLog(wrapped, batching_timeout_s=30)
    with pytest.raises(WalError, match="group write at time 1 failed") as failed:
        log.write(b"interrupted", 1)
    assert repr(interrupt) in str(failed.value)
    t, result = in_thread(log.write, b"later", 2)
    t.join(10)
    assert not t.is_alive()
    assert isinstance(result.get("error"), WalError), result
    assert f"ended on {interrupt!r}" in str(result["error"])
    log.close()
    assert wrapped.closed
    with FileBasedWriteAheadLog(str(tmp_path)) as reader:
        assert list(reader.read_all()) == []
