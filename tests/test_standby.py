"""The hot-standby driver: one leader per checkpoint directory with an epoch (wal/storage.py),
a standby that writes nothing while it waits and takes the stream over exactly, a second driver
without ``standby`` refused, and fencing of a driver whose leadership is gone."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sparkwal.engine import DriverAlreadyActiveError, StreamingContext, StreamingListener
from sparkwal.engine.apps.drill_runs import AppRun, check_outputs, start_input, wait_until_counted
from sparkwal.wal import FencedError, FileBasedWriteAheadLog, LeaderHeldError, ManualClock, resolve
from sparkwal.wal.leases import lease_path


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


def test_an_object_store_lease_is_taken_over_only_once_seen_unchanged_for_a_whole_lease(memory_url):
    """The taker decides on its own monotonic clock, never on the holder's ``expires_ms``: it must
    see the lease object unchanged for a whole lease; a renewal since its first look means alive."""
    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(1_000_000)
    old = storage.lead(path, clock=clock, lease_ms=3000)
    assert old.epoch == 1 and old.renew_every_ms == 1000
    taker, _ = resolve(f"{memory_url}/ckpt")  # another driver's
    with pytest.raises(LeaderHeldError, match="epoch 1.*lease until") as caught:
        taker.lead(path, clock=clock, lease_ms=3000)
    assert caught.value.wait_ms == 3000  # first seen now: a whole lease from here
    clock.advance(1500)
    old.check()  # due: renewed, a new version of its object
    with pytest.raises(LeaderHeldError) as caught:
        taker.lead(path, clock=clock, lease_ms=3000)
    assert caught.value.wait_ms is None  # it changed since the first look: its holder lives
    clock.advance(2999)
    with pytest.raises(LeaderHeldError) as caught:
        taker.lead(path, clock=clock, lease_ms=3000)
    assert caught.value.wait_ms == 1
    with pytest.raises(FencedError, match="epoch 1"):
        old.check()  # it stopped writing a fifth of a lease before anyone could take over
    clock.advance(1)
    new = taker.lead(path, clock=clock, lease_ms=3000)
    assert new.epoch == 2 and storage.leader(path, clock=clock).epoch == 2
    with pytest.raises(FencedError):
        old.confirm()
    new.confirm()
    new.release()
    assert storage.leader(path, clock=clock).released
    assert taker.lead(path, clock=clock, lease_ms=3000).epoch == 3  # a released lease: at once


def test_a_holder_whose_lease_was_superseded_is_fenced_at_its_next_renewal(memory_url):
    storage, path = resolve(f"{memory_url}/ckpt")
    old = storage.lead(path, clock=ManualClock(0), lease_ms=30_000)
    # another driver, whose own clock saw the object unchanged for a whole lease (its holder
    # paused), took epoch 2: it superseded epoch 1's object (conditional on the version it
    # read), then created epoch 2's
    taker, taker_clock = resolve(f"{memory_url}/ckpt")[0], ManualClock(10**9)
    with pytest.raises(LeaderHeldError):
        taker.lead(path, clock=taker_clock, lease_ms=30_000)
    taker_clock.advance(30_000)
    new = taker.lead(path, clock=taker_clock, lease_ms=30_000)
    assert new.epoch == 2 and "superseded_by" in storage.read_file(lease_path(storage, path, 1)).decode()
    with pytest.raises(FencedError, match="epoch 2 was taken by another driver"):
        old.renew()  # one conditional PUT: the object is no longer the version it wrote
    with pytest.raises(FencedError):
        old.check()


def test_a_driver_that_loses_its_directory_says_so_on_its_event_bus_and_stops(spark_context, memory_url):
    """Another driver takes epoch 2 of the checkpoint directory (its clock jumped): this driver's
    next renewal fails, it is fenced, posts ``onDriverFenced`` and ends with the error."""
    fenced, clock = [], ManualClock(0)

    class Fenced(StreamingListener):
        def onDriverFenced(self, event):
            fenced.append(event)

    live_conf = spark_context._jsc.sc().conf()  # a short lease: renewals every second
    live_conf.set("spark.streaming.driver.leaseTimeout", "3s")
    try:
        ssc = StreamingContext(spark_context, 1.0, clock=clock)
    finally:
        live_conf.remove("spark.streaming.driver.leaseTimeout")
    ssc.checkpoint(f"{memory_url}/ckpt")
    ssc.queueStream([[1], [2], [3]]).foreachRDD(lambda rdd: rdd.count())
    ssc.addStreamingListener(Fenced())
    ssc.start()
    try:
        assert ssc.leaderEpoch == 1
        storage, path = resolve(f"{memory_url}/ckpt")
        # a taker superseded epoch 1's object and created epoch 2's (as lease_lead does)
        record = json.loads(storage.read_file(lease_path(storage, path, 1)))
        storage.put(lease_path(storage, path, 1), json.dumps({**record, "superseded_by": 2}).encode())
        storage.put(lease_path(storage, path, 2), json.dumps({**record, "epoch": 2}).encode())
        with pytest.raises(FencedError, match="epoch 2 was taken by another driver"):
            ssc.awaitTermination(30)
        assert ssc.driver.events.wait_until_empty(30)  # heard on the listener bus's thread
        assert len(fenced) == 1 and "epoch 2" in fenced[0].reason
    finally:
        ssc.stop(stopSparkContext=False)


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


class WaitingClock(ManualClock):
    """A manual clock that tells when someone waits on it."""

    def __init__(self, start_ms: int = 0):
        super().__init__(start_ms)
        self.waiting = threading.Event()

    def wait_till_ms(self, target_ms: int, timeout_s: float | None = None) -> int:
        self.waiting.set()
        return super().wait_till_ms(target_ms, timeout_s)


@pytest.mark.parametrize("holder", ["dead", "alive"])
def test_a_driver_waits_out_a_lease_and_fails_only_if_its_holder_renews_it(memory_url, holder):
    from sparkwal.engine.driver.leadership import DriverLeadership

    clock = WaitingClock(0)
    storage, path = resolve(f"{memory_url}/ckpt")
    old = storage.lead(path, clock=clock, lease_ms=3000)
    role = DriverLeadership(f"{memory_url}/ckpt", None, 3000, clock=clock)
    outcome = {}

    def take():
        try:
            outcome["lead"] = role.take()
        except DriverAlreadyActiveError as e:
            outcome["error"] = e

    taker = threading.Thread(target=take)
    taker.start()
    assert clock.waiting.wait(10)  # it found the lease unexpired and waits for its expiry
    if holder == "alive":
        clock.advance(1000)
        old.renew()  # now until 4000
    clock.advance(3001 - clock.now_ms())
    taker.join(10)
    if holder == "dead":
        assert outcome["lead"].epoch == 2
    else:
        assert "epoch 1" in str(outcome["error"]) and "standby=True" in str(outcome["error"])
        old.check()


def test_sparkwal_shows_the_leader_without_taking_anything(tmp_path):
    import json
    import subprocess
    import sys

    storage, path = resolve(str(tmp_path / "ckpt"))
    lead = storage.lead(path)
    try:
        out = subprocess.run([sys.executable, "-m", "sparkwal", "checkpoint", "inspect", path, "--json"],
                             capture_output=True, text=True, timeout=120)
        human = subprocess.run([sys.executable, "-m", "sparkwal", "checkpoint", "inspect", path],
                               capture_output=True, text=True, timeout=120)
    finally:
        lead.release()
    leader = json.loads(out.stdout)["leader"]
    assert leader["epoch"] == 1 and leader["held"] is True and leader["holder"] == lead.info.holder
    assert f"leader: active; epoch 1, pid {os.getpid()}" in human.stdout
    again = storage.lead(path)  # the inspector took nothing
    assert again.epoch == 2
    again.release()


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


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        out[int(stat.parent.name)] = (int(fields[1]), int(fields[2]))
    return out


def pause_app(pgid: int, timeout: float = 10) -> list[int]:
    """SIGSTOP an app's process group and every process below it (PySpark's Python workers run in
    process groups of their own, and write state snapshot parts), then wait until every thread
    of them has stopped: a thread inside a system call (a rename, an fsync) finishes that call
    first, so the files only stay as they are once all are stopped (zombies, which write nothing,
    are left as they are). Returns the pids, for :func:`resume`."""
    pids: set[int] = set()
    while True:  # stopping a parent stops it forking; look again until no new one appears
        procs = _processes()
        found = {pid for pid, (_, group) in procs.items() if group == pgid}
        grew = True
        while grew:
            below = {pid for pid, (parent, _) in procs.items() if parent in found} - found
            found |= below
            grew = bool(below)
        if found <= pids:
            break
        for pid in found - pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        pids |= found
    running: list[str] = []

    def all_stopped() -> bool:
        running.clear()
        for pid in pids:
            for stat in Path(f"/proc/{pid}/task").glob("[0-9]*/stat"):
                try:
                    state = stat.read_text().rsplit(")", 1)[1].split()[0]
                except OSError:  # a thread that ended meanwhile
                    continue
                if state not in "tTZX":
                    running.append(f"{pid}/{stat.parent.name} {state}")
        return not running

    deadline = time.monotonic() + timeout
    while not all_stopped():
        assert time.monotonic() < deadline, f"app {pgid} not stopped: {running[:5]}"
        time.sleep(0.01)
    return sorted(pids)


def resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def preloaded_state(sc) -> list[str]:
    """Names of the RDDs with cached partitions that a standby read ahead of a takeover."""
    return [i.name() for i in sc._jsc.sc().getRDDStorageInfo()
            if i.numCachedPartitions() > 0 and "sparkwal standby: state" in (i.name() or "")]


class Takeovers(StreamingListener):
    def __init__(self):
        self.events, self.ready = [], []

    def onDriverTakeover(self, driverTakeover):
        self.events.append(driverTakeover)

    def onStandbyReady(self, standbyReady):
        self.ready.append(standbyReady)


@pytest.mark.compat
@pytest.mark.driver
def test_a_standby_writes_nothing_while_it_waits_then_takes_over_exactly(ui_enabled, tmp_path, monkeypatch):
    """The main job runs as the active driver in a subprocess; this process tries a second
    driver (refused), then runs a standby, which takes over when the active one is killed. The
    standby's page says it is one while it waits; after the takeover, the record shows both runs.
    The standby runs where the main job runs (its program names its files relative to its work
    directory, as ``--standby`` runs it)."""
    spark_context = ui_enabled
    workdir = tmp_path / "app"
    (workdir / "input").mkdir(parents=True)
    monkeypatch.chdir(workdir)
    ckpt = workdir / "checkpoint"
    stop, stop_input = threading.Event(), threading.Event()
    generator, generated = start_input(str(workdir / "input"), 14, 1.0, stop, stop_input)
    active = AppRun(str(workdir), 1.0)
    standby, paused = None, []
    try:
        wait(lambda: len(active.batches()) >= 2, 120, "batches of the active driver", active)
        paused = pause_app(active.proc.pid)  # paused: its files stay as they are
        before = tree(ckpt)

        second = StreamingContext(spark_context, 1.0)
        second.textFileStream(str(workdir / "input")).foreachRDD(lambda rdd: None)
        second.checkpoint(str(ckpt))
        with pytest.raises(DriverAlreadyActiveError, match=rf"pid {active.proc.pid} .*epoch 1.*standby=True"):
            second.start()
        second.stop(stopSparkContext=False)
        assert tree(ckpt) == before

        standby = StreamingContext.getOrCreate(str(ckpt), lambda: pytest.fail("setup must not run"),
                                               standby=True, allow_other_app=True)  # the main job's
        takeovers = Takeovers()
        standby.addStreamingListener(takeovers)
        standby.start()
        assert standby.isStandby() and standby.leaderEpoch is None
        assert not standby.awaitLeadership(2.0)  # the paused driver still leads
        page = urllib.request.urlopen(f"{standby.uiWebUrl}/streaming/", timeout=10).read().decode()
        assert "<b>standby</b>" in page and f"pid {active.proc.pid}" in page and "epoch 1" in page
        assert tree(ckpt) == before  # byte-identical: the standby wrote nothing

        resume(paused)
        done = len(active.batches())
        wait(lambda: len(active.batches()) > done, 60, "a batch after the pause", active)
        # hot: once the active driver has snapshotted its state (every 10 s), the standby holds it
        # cached in its own executors before any takeover
        wait(lambda: preloaded_state(spark_context), 60, "the state preloaded by the standby")
        wait(lambda: takeovers.ready, 60, "onStandbyReady")
        [ready] = takeovers.ready
        assert ready.checkpoint_time_ms is not None and ready.took_ms > 0
        assert standby.isStandby()
        active.kill()
        assert standby.awaitLeadership(60)
        assert not standby.isStandby() and standby.leaderEpoch == 2 and standby.recovery == "takeover"
        wait(lambda: takeovers.events, 60, "onDriverTakeover")  # heard on the listener bus's thread
        [event] = takeovers.events
        assert event.epoch == 2 and event.rerun_batch_times == tuple(standby.rerun_batch_times)
        api = f"{standby.uiWebUrl}/api/v1/applications/{spark_context.applicationId}/streaming"
        runs = json.loads(urllib.request.urlopen(f"{api}/recoveries", timeout=10).read())
        assert [(r["kind"], r["epoch"]) for r in runs] == [("new", 1), ("takeover", 2)]
        assert runs[1]["downtimeMs"] >= 0 and runs[1]["rerunBatches"] == list(standby.rerun_batch_times)
        generator.join()
        wait_until_counted(str(workdir), generated)
    finally:
        stop.set()
        resume(paused)
        if active.proc.poll() is None:
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


@pytest.mark.slow
@pytest.mark.driver
def test_a_takeover_after_a_kill_loses_nothing_and_counts_nothing_twice(tmp_path):
    """The drill's standby mode, CI's share: the active driver's process group killed once at a
    random moment and the standby takes over; every file counted once, the running state exact.
    Longer runs by hand (docs/standby.md)."""
    from sparkwal.engine.apps.standby_drill import run

    r = run(kills=1, files=14, batch=1.0, seed=5, workdir=str(tmp_path), gap_s=(1.5, 4.0))
    assert r["kills"] == 1 and r["takeovers"] == 1 and r["failures"] == [], r
    assert r["files_missing"] == [] and r["duplicate_files"] == 0
    assert r["words_lost"] == 0 and r["words_extra"] == 0
    assert r["state_mismatches"] == 0 and r["final_totals_exact"] and r["ok"]
    assert len(r["recovery_s"]) == 1


@pytest.mark.slow
@pytest.mark.driver
def test_on_s3_a_paused_leader_is_fenced_or_rejoins_as_a_standby_and_a_killed_one_is_taken_over(tmp_path, s3_url):
    import json

    bucket, options = s3_url
    endpoint = options["client_kwargs"]["endpoint_url"]
    workdir = tmp_path / "app"
    (workdir / "input").mkdir(parents=True)
    args = ("--checkpoint", f"{bucket}/ckpt", "--conf", "spark.streaming.driver.leaseTimeout=3s",
            "--storage-option", "use_listings_cache=false", "--storage-option",
            "client_kwargs=" + json.dumps({"endpoint_url": endpoint, "region_name": "us-east-1"}))
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    stop, stop_input = threading.Event(), threading.Event()
    generator, generated = start_input(str(workdir / "input"), 20, 1.0, stop, stop_input)
    runs = [AppRun(str(workdir), 1.0, extra_args=args, env=env)]
    try:
        first = runs[0]
        wait(lambda: len(first.batches()) >= 2, 120, "batches of the first driver", first)
        second = AppRun(str(workdir), 1.0, extra_args=(*args, "--standby"), env=env)
        runs.append(second)
        wait(second.standby_seen.is_set, 120, "the standby", second)
        os.killpg(first.proc.pid, signal.SIGSTOP)  # a long GC, a frozen VM: its lease runs out
        paused = time.monotonic()
        wait(second.took_over.is_set, 60, "a takeover", second)
        # the lease was renewed at most a third of it (1 s) before the pause: not taken before
        assert time.monotonic() - paused >= 2.0
        done = len(second.batches())
        wait(lambda: len(second.batches()) > done, 60, "a batch of the new leader", second)
        os.killpg(first.proc.pid, signal.SIGCONT)
        assert first.proc.wait(60) == 3  # fenced: it exits, having written nothing more
        first.reader.join(5)
        assert first.fenced is not None and "epoch 1" in first.fenced["message"]

        # a leader started with --standby (getOrCreate(..., standby=True)) is paused in turn: fenced,
        # it rejoins as the new leader's standby, and takes the stream over again when that one dies
        third = AppRun(str(workdir), 1.0, extra_args=(*args, "--standby"), env=env)
        runs.append(third)
        wait(third.standby_seen.is_set, 120, "the next standby", third)
        os.killpg(second.proc.pid, signal.SIGSTOP)
        wait(third.took_over.is_set, 60, "the second takeover", third)
        assert third.takeover["epoch"] == 3
        done = len(third.batches())
        wait(lambda: len(third.batches()) > done, 60, "a batch of the third leader", third)
        os.killpg(second.proc.pid, signal.SIGCONT)
        wait(lambda: second.rejoined is not None, 120, "the fenced leader rejoining as a standby", second)
        assert second.proc.poll() is None and "epoch 2" in second.rejoined["message"] and second.rejoined["standby"]
        third.kill()
        wait(second.took_over.is_set, 60, "the takeover by the driver that rejoined", second)
        assert second.takeover["epoch"] == 4
        generator.join()
        wait_until_counted(str(workdir), generated, 90)
        second.terminate()
    finally:
        stop.set()
        for r in runs:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGCONT)
                r.kill()
    result = check_outputs(str(workdir), generated[0], runs)
    assert result["files_missing"] == [] and result["duplicate_files"] == 0
    assert result["state_mismatches"] == 0 and result["final_totals_exact"], result


@pytest.mark.slow
@pytest.mark.driver
def test_a_direct_stream_stays_exactly_once_across_takeovers(tmp_path):
    from sparkwal.engine.apps import direct_drill

    r = direct_drill.run(kills=1, batch=1.0, seed=11, workdir=str(tmp_path), standby=True)
    assert r["kills"] == 1 and r["lines_appended"] > 0
    assert r["records_lost"] == 0 and r["duplicates"] == 0 and r["words_exact"] and r["ok"], r


@pytest.mark.slow
@pytest.mark.driver
def test_a_reliable_receiver_loses_nothing_acknowledged_across_takeovers(tmp_path):
    from sparkwal.engine.apps import receiver_drill

    r = receiver_drill.run(1, 240, 1.0, 13, str(tmp_path), kinds=("driver",), standby=True,
                           min_gap_s=2.0, max_gap_s=4.0)
    assert r["kills"] == 1 and r["lines_acked"] == r["lines_offered"]
    assert r["records_lost"] == 0 and r["duplicates_within_resent"] and r["words_exact"], r
    assert r["state_mismatches"] == 0 and r["ok"]
