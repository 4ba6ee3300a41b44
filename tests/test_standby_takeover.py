"""A standby that always takes over: its polls of the leadership survive the storage's failures, a
takeover that fails on the storage is given up and tried again, the forced read at takeover
raises, the leadership is renewed from the moment it is taken, a stalled leader gives its
leadership up, and a leader paused past its lease reports the fence, not what failed after it."""

from __future__ import annotations

import errno
import logging
import threading
import time
import types

import pytest

from sparkwal.checkpoint import CheckpointError
from sparkwal.checkpoint.errors import CheckpointMismatchError
from sparkwal.engine.driver import standby, standby_tail
from sparkwal.engine.driver.driver import Driver
from sparkwal.engine.driver import leadership
from sparkwal.engine.driver.leadership import DriverAlreadyActiveError, DriverLeadership
from sparkwal.engine.driver.recovery import RestartFacts
from sparkwal.wal import (StorageLocation, FencedError, LeaderHeldError, ManualClock, StorageUnavailableError, WalError,
                          resolve)
from sparkwal.wal.locks import LeaderInfo


class FailingLead:
    """A storage whose ``lead`` raises ``failures`` one by one, then leads as the real one does."""

    def __init__(self, storage, failures):
        self._storage, self.failures, self.calls = storage, list(failures), 0

    def lead(self, *args, **kwargs):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self._storage.lead(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._storage, name)


def unavailable() -> StorageUnavailableError:
    return StorageUnavailableError("put", "s3://b/ckpt/.leader/epoch-0000000002", 5, 60.2, OSError(errno.EIO, "EIO"))


@pytest.fixture(params=["local", "memory"])
def directory(request, tmp_path):
    return str(tmp_path / "ckpt") if request.param == "local" else f"{request.getfixturevalue('memory_url')}/ckpt"


# ------------------------------------------------------------------ polling the leadership


def test_a_standby_waits_through_failed_polls_then_leads(directory, caplog):
    """S3's 409 between racing standbys reaches s3fs's caller as OSError(EIO); a full disk fails
    writing ``.leader.epoch``; a store past its deadline: each is logged once, and the standby
    polls again and leads. A fenced poll still ends the wait."""
    role = DriverLeadership(directory, None, 3000)
    eio, enospc = OSError(errno.EIO, "Input/output error"), OSError(errno.ENOSPC, "No space left on device")
    role.storage = FailingLead(role.storage, [eio, eio, enospc, unavailable(), WalError("torn leader record")])
    stopped = threading.Event()
    caplog.set_level(logging.WARNING, "sparkwal.engine.driver.leadership")
    lead = role.wait_for(stopped)
    assert lead is not None and lead.epoch == 1 and role.held is lead and role.storage.calls == 6
    failed = [r.getMessage() for r in caplog.records if "polling the leadership failed" in r.getMessage()]
    assert len(failed) == 4  # EIO once, ENOSPC, the unavailable store, the WAL's error
    assert "Input/output error" in failed[0] and "No space left" in failed[1] and "storage unavailable" in failed[2]
    assert sum("polling the leadership works again" in r.getMessage() for r in caplog.records) == 1
    role.release()

    role.storage.failures = [FencedError("epoch 3 was taken")]
    with pytest.raises(FencedError):
        role.wait_for(stopped)


class StepClock(ManualClock):
    """A manual clock that jumps to whatever time it is asked to wait for, and records it."""

    def __init__(self, start_ms: int = 0):
        super().__init__(start_ms)
        self.waited: list[int] = []

    def wait_till_ms(self, target_ms: int, timeout_s: float | None = None) -> int:
        self.waited.append(target_ms)
        self.set_ms(max(target_ms, self.now_ms()))
        return self.now_ms()


def test_take_waits_as_long_as_the_store_says_never_for_the_holders_clock(memory_url):
    """``LeaderHeldError.wait_ms`` decides: the holder's ``expires_ms`` (its wall clock, here in
    2096) does not; ``wait_ms`` None (a renewal since the first look) means a live holder."""
    clock = StepClock(1_000)
    info = LeaderInfo("lease", 1, "pid 1 on elsewhere", 0, True, expires_ms=4 * 10**12)
    role = DriverLeadership(f"{memory_url}/ckpt", None, 3000, clock=clock)
    role.storage = FailingLead(role.storage, [LeaderHeldError("memory://ckpt", info, 250)])
    assert role.take().epoch == 1 and clock.waited == [1_250]
    role.release()

    role.storage.failures = [LeaderHeldError("memory://ckpt", info, 3000), LeaderHeldError("memory://ckpt", info, None)]
    with pytest.raises(DriverAlreadyActiveError, match="pid 1 on elsewhere.*standby=True"):
        role.take()
    assert clock.waited == [1_250, 4_250] and role.held is None


# ------------------------------------------------------------------ keeping it


def supersede(directory: str) -> None:
    """What a taker does to epoch 1's lease object (conditional on the version it read)."""
    import json

    from sparkwal.wal.leases import lease_path

    storage, path = resolve(directory)
    record = json.loads(storage.read_file(lease_path(storage, path, 1)))
    storage.put(lease_path(storage, path, 1), json.dumps({**record, "superseded_by": 2}).encode())


def test_a_leadership_lost_before_the_stream_runs_fails_its_start_instead_of_fencing(memory_url):
    """Renewed from the moment it is taken: a loss found during a recovery or a takeover is not a
    fence of the driver (nothing runs yet) but the start's error, raised by stream_started."""
    role = DriverLeadership(f"{memory_url}/ckpt", None, 3000)  # renewed every second
    role.take()
    fenced, lost = [], threading.Event()

    def on_fenced(error):  # as the driver's fence does
        if role.record_fence(error):
            fenced.append(error)
        lost.set()

    role.keep(on_fenced)
    supersede(f"{memory_url}/ckpt")
    assert lost.wait(10)  # its next renewal found it
    with pytest.raises(FencedError, match="epoch 2 was taken"):
        role.stream_started()
    assert fenced == [] and role.fenced is None
    role.release()  # a standby's failed takeover: the leadership can be taken again
    again = role.take()
    assert again.epoch >= 2
    role.stream_started()
    role.release()


def let_go(role: DriverLeadership) -> bool:
    """Whether the leader of ``role``'s directory let it go (a lease released, a lock unlocked)."""
    info = role.storage.leader(role.path)
    return info is not None and (info.released or info.held is False)


def test_a_stalled_leader_gives_its_leadership_up_for_a_standby(directory):
    """No batch completed for ``spark.sparkwal.leader.stallIntervals`` batch intervals on the
    driver's clock: the renewal loop fences the driver with the stall named, and releases the
    leadership so that another driver takes it at once (a local lock is kept by the same loop)."""
    batch_clock, progress = ManualClock(100_000), [None]
    watch = leadership.StallWatch(batch_clock, 1000, 3, lambda: progress[0])
    role = DriverLeadership(directory, None, 3000)
    role.take()
    role.stream_started()
    fenced: list[FencedError] = []
    got = threading.Event()

    def on_fenced(error):
        fenced.append(error)
        got.set()

    role.keep(on_fenced, stalled=watch)
    batch_clock.advance(10_000)  # not running yet (progress None): no stall
    progress[0] = batch_clock.now_ms()
    batch_clock.advance(2_999)
    assert not got.wait(1.5)
    other = DriverLeadership(directory, None, 3000)
    assert other.try_take() is None  # still led
    batch_clock.advance(1)
    assert got.wait(10)
    assert len(fenced) == 1
    message = str(fenced[0])
    assert "no batch completed for 3.0 s" in message and "spark.sparkwal.leader.stallIntervals=3" in message
    until(lambda: let_go(other), "the release")  # (just after on_fenced)
    lead = other.try_take()
    assert lead is not None and lead.epoch == 2  # at once: the stalled leader released it
    other.release()
    role.release()


def test_a_leader_paused_past_its_lease_reports_the_fence_not_the_storage_error(memory_url):
    """A storage call of a leader woken past its lease fails: the error arrives before the
    renewal thread noticed the lapse. report_error checks the leadership first, so the fence is
    the driver's error (exit status 3), whatever thread wins."""
    clock = ManualClock(0)
    role = DriverLeadership(f"{memory_url}/ckpt", None, 3000, clock=clock)
    role.take()
    role.stream_started()
    clock.advance(3000)  # paused (SIGSTOP) for a whole lease
    posted, cancelled = [], []

    class Paused:
        stopping, error, leadership = False, None, role
        terminated = threading.Event()
        events = types.SimpleNamespace(post=posted.append)
        generator = types.SimpleNamespace(timer=types.SimpleNamespace(stop=lambda: None))
        sc = types.SimpleNamespace(cancelAllJobs=lambda: cancelled.append(True))

        @property
        def fenced(self):
            return role.fenced

        def on_fenced(self, error):
            Driver.on_fenced(self, error)  # type: ignore[arg-type]

        def report_error(self, error, time_ms):
            Driver.report_error(self, error, time_ms)  # type: ignore[arg-type]

    driver = Paused()
    try:
        raise unavailable()
    except StorageUnavailableError as e:  # as a batch reports its error
        driver.report_error(e, 7_000)
    assert isinstance(driver.fenced, FencedError) and driver.error is driver.fenced
    assert driver.terminated.is_set() and cancelled == [True] and len(posted) == 1
    with pytest.raises(FencedError):
        Driver.raise_error(driver)  # type: ignore[arg-type]
    from sparkwal.engine.apps import arguments

    assert not arguments.storage_fault(driver.fenced)  # exit status 3, not 4
    role.release()


# ------------------------------------------------------------------ the standby's takeover


class FakeDriver:
    """The driver's side of a standby, without Spark: its lifecycle steps (``start_active`` raises
    ``failures`` one by one, then starts) and the fakes of the collaborators a Standby and its tail
    are handed (:meth:`standby` and :meth:`tail` build them as the driver does)."""

    def __init__(self, directory: str, failures):
        self.location = StorageLocation.of(directory)
        self.leadership = DriverLeadership(directory, None, 3000)
        self.failures, self.started, self.reported = list(failures), [], []
        self.settings = {standby_tail.config.STANDBY_PRELOAD_STATE: False}
        self.sc = types.SimpleNamespace(setJobGroup=lambda *a, **k: None, cancelJobGroup=lambda g: None)
        self.snapshots = types.SimpleNamespace(drop_unwanted=lambda: None)
        self.events = types.SimpleNamespace(post=lambda e: None)
        self.clock = ManualClock(0)
        self.leader_event, self.active_lock, self.lock = threading.Event(), threading.Lock(), threading.RLock()
        self.restart = RestartFacts()
        self.restored = None

    def standby(self) -> standby.Standby:
        # (its threads' warm-up and the takeover's read of state ahead fail, logged: the batches do them)
        no_scheduler = types.SimpleNamespace(generator=types.SimpleNamespace())
        return standby.Standby(
            self.sc, self.settings, self.clock, self.events, self.location, None, self.snapshots,  # type: ignore[arg-type]
            no_scheduler, self.leadership, self.restart, (b"", []), restore=self.restore,  # type: ignore[arg-type]
            start_active=self.start_active, keep_leadership=self.keep_leadership, report_error=self.report_error,
            locks=(self.active_lock, self.lock), leader_event=self.leader_event)

    def tail(self) -> standby_tail.StandbyTail:
        return standby_tail.StandbyTail(self.sc, self.settings, self.events, self.location,  # type: ignore[arg-type]
                                        self.leadership, self.snapshots, self.restart, self.restore)  # type: ignore[arg-type]

    def restore(self, checkpoint, kind=None):
        self.restored = checkpoint

    def keep_leadership(self):
        self.leadership.keep(lambda e: None)

    def start_active(self, kind=None):
        held = self.leadership.held
        self.started.append(held.epoch if held is not None else None)
        if self.failures:
            self.leadership.release()  # (as start_active's own clean-up does)
            raise self.failures.pop(0)
        self.leadership.stream_started()

    def report_error(self, error, time_ms):
        self.reported.append(error)


def until(condition, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(standby_tail, "warm_up", lambda sc, light=False: None)
    monkeypatch.setattr(standby, "RETAKE_AFTER_S", 0.05)
    monkeypatch.setattr(standby_tail, "TAIL_EVERY_S", 0.01)


def stand_by(tmp_path, failures) -> tuple[FakeDriver, standby.Standby]:
    directory = str(tmp_path / "ckpt")
    storage, path = resolve(directory)
    holder = storage.lead(path)  # the leader
    driver = FakeDriver(directory, failures)
    role = driver.standby()
    role.start()
    time.sleep(0.1)
    holder.release()  # it dies
    return driver, role


def test_a_takeover_that_fails_on_the_storage_gives_up_the_leadership_and_takes_over_again(tmp_path, quick, caplog):
    caplog.set_level(logging.WARNING, "sparkwal.engine.driver.standby")
    driver, role = stand_by(tmp_path, [unavailable(), FencedError("epoch 3 was taken"), OSError(errno.EIO, "EIO")])
    assert driver.leader_event.wait(20)
    role.stop()
    assert driver.reported == [] and driver.started == [2, 3, 4, 5] and not role.waiting
    assert driver.leadership.held is not None and driver.leadership.held.epoch == 5
    failed = [r.getMessage() for r in caplog.records if "the takeover failed" in r.getMessage()]
    assert len(failed) == 3 and "storage unavailable" in failed[0] and "epoch 3 was taken" in failed[1]
    driver.leadership.release()


def test_a_takeover_the_program_cannot_run_stays_failed_after_a_storage_failure(tmp_path, quick):
    mismatch = CheckpointMismatchError("the DStream graph changed since the checkpoint was written")
    driver, role = stand_by(tmp_path, [unavailable(), mismatch])
    assert driver.leader_event.wait(20)
    role.stop()
    assert driver.reported == [mismatch] and driver.started == [2, 3] and role.waiting
    assert driver.leadership.held is None  # given up


def test_the_takeovers_read_raises_and_the_tail_warns_once(tmp_path, quick, caplog):
    """A takeover must not start from an older checkpoint because the newest could not be read;
    while tailing, such a failure is a warning (once), so a standby that cannot read looks it."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "checkpoint-1000").write_bytes(b"not a checkpoint")
    driver = FakeDriver(str(directory), [])
    tail = driver.tail()
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        tail.read_newest(preload=False, force=True)
    caplog.set_level(logging.WARNING, "sparkwal.engine.driver.standby")

    def messages() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "sparkwal.engine.driver.standby"]

    tail.start()
    until(lambda: messages(), "a warning")
    time.sleep(0.3)  # some 20 looks more
    (directory / "checkpoint-1000").unlink()
    until(lambda: len(messages()) > 1, "the line saying it reads again")
    with tail.lock:
        tail.stop()
    seen = messages()
    assert len(seen) == 2, seen
    assert "could not read the leader's checkpoints" in seen[0] and "no valid checkpoint" in seen[0]
    assert "reads the leader's checkpoints again" in seen[1]


# ------------------------------------------------------------------ a driver


GATE = threading.Event()  # (the graph is pickled: its function must be this module's)


def block(rdd) -> None:
    GATE.wait(30)


@pytest.mark.slow
def test_a_leader_keeps_its_lease_through_a_long_recovery_and_gives_it_up_once_stalled(
        spark_context, memory_url, monkeypatch):
    """The lease (2 s, renewed every 0.67 s) is renewed from the moment it is taken: a recovery
    of 2.5 s keeps it. Then a batch that never ends: two batch intervals later on the driver's
    clock the leader fences itself naming the stall, and its lease is free at once."""
    from sparkwal.engine import StreamingContext
    from sparkwal.engine.driver import recovery

    clock = ManualClock(0)
    GATE.clear()
    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.streaming.driver.leaseTimeout", "2s")
    live_conf.set("spark.sparkwal.leader.stallIntervals", "2")
    try:
        ssc = StreamingContext(spark_context, 1.0, clock=clock)
    finally:
        live_conf.remove("spark.streaming.driver.leaseTimeout")
        live_conf.remove("spark.sparkwal.leader.stallIntervals")
    ssc.checkpoint(f"{memory_url}/ckpt")
    ssc.queueStream([[1], [2]]).foreachRDD(block)
    slow = recovery.RestartRule.fresh_start
    monkeypatch.setattr(recovery.RestartRule, "fresh_start", lambda rule: (time.sleep(2.5), slow(rule))[1])
    ssc.start()
    try:
        assert ssc.driver.fenced is None and not ssc.awaitTerminationOrTimeout(0.6)
        clock.advance(1000)  # batch 1000 runs, and never ends
        clock.advance(1999)
        assert not ssc.awaitTerminationOrTimeout(1.2)
        clock.advance(1)
        with pytest.raises(FencedError, match=r"no batch completed for 2\.0 s.*stallIntervals=2"):
            ssc.awaitTermination(10)
        other = DriverLeadership(f"{memory_url}/ckpt", None, 2000)
        until(lambda: let_go(other), "the release")  # released, not lapsed (a lease of 2 s)
        assert other.try_take() is not None  # a standby takes it at once
        other.release()
    finally:
        GATE.set()
        ssc.stop(stopSparkContext=False)
