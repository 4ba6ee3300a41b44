"""The hot-standby driver: one leader per checkpoint directory with an epoch (wal/storage.py),
a standby that writes nothing while it waits and takes the stream over exactly, a second driver
without ``standby`` refused, and fencing of a driver whose leadership is gone."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from engine import DriverAlreadyActiveError, StreamingContext, StreamingListener
from engine.drill import AppRun, check_outputs, start_input, wait_until_counted
from wal import FencedError, FileBasedWriteAheadLog, LeaderHeldError, ManualClock, resolve


# ------------------------------------------------------------------ leadership (wal/storage.py)


def test_local_leadership_is_an_os_lock_with_a_growing_epoch(tmp_path):
    storage, path = resolve(str(tmp_path / "ckpt"))
    assert storage.leader(path) is None
    first = storage.lead(path)
    assert first.epoch == 1 and first.info.holder == f"pid {os.getpid()} on {os.uname().nodename}"
    with pytest.raises(LeaderHeldError, match=rf"pid {os.getpid()} .*epoch 1") as caught:
        storage.lead(path)  # a second open file description conflicts, even in one process
    assert caught.value.info.epoch == 1
    seen = storage.leader(path)  # an inspector: takes nothing
    assert seen.held is True and seen.epoch == 1
    first.release()
    assert storage.leader(path).held is False
    second = storage.lead(path)
    assert second.epoch == 2
    second.check()  # a live holder's lock cannot be taken: never fenced
    second.release()
    with pytest.raises(FencedError):
        second.check()


def test_an_object_store_lease_is_taken_over_only_once_expired_and_fences_its_old_holder(memory_url):
    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(1_000_000)
    old = storage.lead(path, clock=clock, lease_ms=3000)
    assert old.epoch == 1 and old.renew_every_ms == 1000
    with pytest.raises(LeaderHeldError, match="epoch 1.*lease until") as caught:
        storage.lead(path, clock=clock, lease_ms=3000)
    assert caught.value.info.expires_ms == 1_003_000
    clock.advance(1500)
    old.check()  # due: renewed, so the lease now runs until 1_004_500
    clock.advance(2000)
    with pytest.raises(LeaderHeldError):
        storage.lead(path, clock=clock, lease_ms=3000)
    clock.advance(1001)  # 1_004_501: expired, as the holder stopped renewing (paused, dead)
    new = storage.lead(path, clock=clock, lease_ms=3000)
    assert new.epoch == 2 and storage.leader(path, clock=clock).epoch == 2
    with pytest.raises(FencedError, match="epoch 1"):
        old.check()  # it lapsed before anyone could take it over: fenced by itself
    with pytest.raises(FencedError):
        old.confirm()
    new.confirm()
    new.release()
    assert storage.leader(path, clock=clock).released
    assert storage.lead(path, clock=clock, lease_ms=3000).epoch == 3  # a released lease: at once


def test_a_holder_that_sees_a_newer_epoch_is_fenced(memory_url):
    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(0)
    old = storage.lead(path, clock=clock, lease_ms=30_000)
    # another driver took epoch 2 (say, after a clock jump on its machine): one conditional create
    storage.put_if_absent(storage._lease_path(path, 2), b'{"epoch": 2, "holder": "pid 7 on elsewhere", '
                          b'"expires_ms": 99999999}')
    with pytest.raises(FencedError, match="epoch 2 was taken by pid 7 on elsewhere"):
        old.confirm()
    with pytest.raises(FencedError):
        old.check()


def test_the_wal_writes_under_the_drivers_leadership_and_stops_once_it_is_lost(memory_url):
    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(0)
    lead = storage.lead(path, clock=clock, lease_ms=3000)
    wal = FileBasedWriteAheadLog(f"{memory_url}/ckpt/receivedBlockMetadata", clock=clock, lock=lead)
    wal.write(b"one", 0)
    assert not storage.exists(f"{path}/receivedBlockMetadata/.writer.lease")  # no lock of its own
    clock.advance(2500)  # past the point where the holder stops writing
    with pytest.raises(FencedError):
        wal.write(b"two", 2500)
    assert [bytes(r) for r in FileBasedWriteAheadLog(f"{memory_url}/ckpt/receivedBlockMetadata").read_all()] == [b"one"]


# ------------------------------------------------------------------ drivers


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def wait(cond, timeout: float, what: str, app: AppRun | None = None):
    deadline = time.monotonic() + timeout
    while not cond():
        if app is not None and app.proc.poll() is not None:
            raise AssertionError(f"the app exited (status {app.proc.returncode}) waiting for {what}")
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.05)


class Takeovers(StreamingListener):
    def __init__(self):
        self.events = []

    def onDriverTakeover(self, driverTakeover):
        self.events.append(driverTakeover)


def test_a_standby_writes_nothing_while_it_waits_then_takes_over_exactly(spark_context, tmp_path):
    """The main job runs as the active driver in a subprocess; this process tries a second
    driver (refused), then runs a standby, which takes over when the active one is killed."""
    workdir = tmp_path / "app"
    (workdir / "input").mkdir(parents=True)
    ckpt = workdir / "checkpoint"
    stop, stop_input = threading.Event(), threading.Event()
    generator, generated = start_input(str(workdir / "input"), 14, 1.0, stop, stop_input)
    active = AppRun(str(workdir), 1.0)
    standby = None
    try:
        wait(lambda: len(active.batches()) >= 2, 120, "batches of the active driver", active)
        os.killpg(active.proc.pid, signal.SIGSTOP)  # paused: its files stay as they are
        before = tree(ckpt)

        second = StreamingContext(spark_context, 1.0)
        second.textFileStream(str(workdir / "input")).foreachRDD(lambda rdd: None)
        second.checkpoint(str(ckpt))
        with pytest.raises(DriverAlreadyActiveError, match=rf"pid {active.proc.pid} .*epoch 1.*standby=True"):
            second.start()
        second.stop(stopSparkContext=False)
        assert tree(ckpt) == before

        standby = StreamingContext.getOrCreate(str(ckpt), lambda: pytest.fail("setup must not run"),
                                               standby=True)
        takeovers = Takeovers()
        standby.addStreamingListener(takeovers)
        standby.start()
        assert standby.isStandby() and standby.leaderEpoch is None
        assert not standby.awaitLeadership(2.0)  # the paused driver still leads
        assert tree(ckpt) == before  # byte-identical: the standby wrote nothing

        os.killpg(active.proc.pid, signal.SIGCONT)
        done = len(active.batches())
        wait(lambda: len(active.batches()) > done, 60, "a batch after the pause", active)
        active.kill()
        assert standby.awaitLeadership(60)
        assert not standby.isStandby() and standby.leaderEpoch == 2 and standby.recovery == "takeover"
        [event] = takeovers.events
        assert event.epoch == 2 and event.rerun_batch_times == tuple(standby.rerun_batch_times)
        generator.join()
        wait_until_counted(str(workdir), generated)
    finally:
        stop.set()
        if active.proc.poll() is None:
            os.killpg(active.proc.pid, signal.SIGCONT)
            active.kill()
        if standby is not None:
            standby.stop(stopSparkContext=False)
    result = check_outputs(str(workdir), generated[0], [active])
    assert result["files_missing"] == [] and result["duplicate_files"] == 0
    assert result["words_lost"] == 0 and result["words_extra"] == 0
    assert result["state_mismatches"] == 0 and result["final_totals_exact"], result


def test_getorcreate_standby_needs_a_checkpoint_directory(spark_context):
    with pytest.raises(ValueError, match="standby=True needs a checkpoint directory"):
        StreamingContext.getOrCreate(None, lambda: StreamingContext(spark_context, 1.0), standby=True)
