"""Storage faults at the object store's boundary (engine/apps/fault_proxy.py in front of moto): what
the storage seam absorbs, and how an ambiguous write is resolved."""

from __future__ import annotations

import pytest
from sparkwal.engine.apps.fault_proxy import FaultProxy

from sparkwal.wal import FileBasedWriteAheadLog

pytestmark = pytest.mark.s3


def options(endpoint: str) -> dict:
    return {"key": "testing", "secret": "testing", "use_listings_cache": False,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


@pytest.mark.parametrize("fault", ["503", "500", "reset_before", "reset_after"])
@pytest.mark.slow
def test_transient_faults_on_every_segment_put_lose_and_double_nothing(s3_url, s3_endpoint, fault):
    """Every WAL write on an object store is one conditional create; each fault hits one of them.
    A reset after the store took the PUT makes the client's retry answer "already exists": read
    back, it is the log's own segment, so the record is not written a second time."""
    url, _ = s3_url
    proxy = FaultProxy(s3_endpoint, seed=5)
    try:
        wal = FileBasedWriteAheadLog(f"{url}/wal", close_file_after_write=True, storage_options=options(proxy.url))
        for i in range(12):
            if i % 3 == 1:
                proxy.plan("PUT", "/wal/log-", fault)
            wal.write(b"record %d" % i, 1000 + i)
        wal.close()
        injected = [r for r in proxy.log if r.fault == fault]
        assert len(injected) == 4, proxy.log
    finally:
        proxy.stop()
    reader = FileBasedWriteAheadLog(f"{url}/wal", close_file_after_write=True, storage_options=options(s3_endpoint))
    assert list(reader.read_all()) == [b"record %d" % i for i in range(12)]  # each once, in order


def test_the_seam_retries_transient_faults_with_bounded_jittered_backoff_until_its_deadline():
    """wal.retry on its own, with an injected clock: what is retried, how long it waits, when it
    gives up, and what it counts."""
    import errno
    import random

    from sparkwal.wal import RetryPolicy, StorageUnavailableError, retry_statistics
    from sparkwal.wal.retry import call, is_transient

    now, pauses = [0.0], []

    def sleep(s):
        pauses.append(s)
        now[0] += s

    def flaky(failures, error):
        left = [failures]

        def fn():
            now[0] += 0.01
            if left[0]:
                left[0] -= 1
                raise error
            return "done"
        return fn

    policy = RetryPolicy(deadline_s=10, first_backoff_s=0.1, max_backoff_s=1.0)
    before = retry_statistics()
    assert call("read", "s3://b/k", flaky(6, OSError(errno.EBUSY, "SlowDown")), policy=policy,
                sleep=sleep, monotonic=lambda: now[0], rng=random.Random(3)) == "done"
    assert len(pauses) == 6 and all(0 <= p <= min(1.0, 0.1 * 2 ** i) for i, p in enumerate(pauses))
    after = retry_statistics()
    assert (after.retries - before.retries, after.recovered - before.recovered) == (6, 1)

    pauses.clear()
    with pytest.raises(StorageUnavailableError) as caught:
        call("put", "s3://b/checkpoint-1000", flaky(10**6, ConnectionResetError(errno.ECONNRESET, "reset by peer")),
             policy=policy, sleep=sleep, monotonic=lambda: now[0], rng=random.Random(3))
    e = caught.value
    assert str(e).startswith("storage unavailable: put s3://b/checkpoint-1000 still failing after ")
    assert "reset by peer" in str(e) and e.attempts == len(pauses) + 1 and e.elapsed_s >= 10
    assert sum(pauses) <= 10 and retry_statistics().gave_up == after.gave_up + 1

    for permanent in (FileNotFoundError("gone"), PermissionError("denied"), OSError(errno.ENOSPC, "full"),
                      ValueError("bad")):
        assert not is_transient(permanent)
        with pytest.raises(type(permanent)):
            call("read", "s3://b/k", flaky(1, permanent), policy=policy, sleep=sleep, monotonic=lambda: now[0])
    assert is_transient(OSError(errno.EREMOTEIO, "InternalError")) and is_transient(TimeoutError())


def test_a_store_that_stays_unavailable_stops_the_write_with_the_named_error_and_leaves_nothing_half_written(
        s3_url, s3_endpoint):
    from sparkwal.wal import RetryPolicy, StorageUnavailableError, set_default_policy

    url, _ = s3_url
    proxy = FaultProxy(s3_endpoint, seed=1)
    slow = {**options(proxy.url), "config_kwargs": {"retries": {"max_attempts": 1}}}
    try:
        wal = FileBasedWriteAheadLog(f"{url}/wal", storage_options=slow)
        wal.write(b"before", 1000)
        proxy.rates["503"] = 1.0  # from now on the store throttles every request
        set_default_policy(RetryPolicy(deadline_s=1.0, first_backoff_s=0.05, max_backoff_s=0.2))
        with pytest.raises(StorageUnavailableError, match=r"storage unavailable: create s3://.*/wal/log-.* "
                           r"still failing after \d+ attempts in .*; last error: .*"):
            wal.write(b"after", 2000)
        assert sum(r.fault == "503" for r in proxy.log) >= 2
    finally:
        set_default_policy(RetryPolicy())
        proxy.stop()
    reader = FileBasedWriteAheadLog(f"{url}/wal", storage_options=options(s3_endpoint))
    assert list(reader.read_all()) == [b"before"]


@pytest.mark.slow
def test_a_delayed_lease_renewal_fences_the_old_driver_before_a_standby_takes_over(s3_url, s3_endpoint):
    """The holder's renewal hangs in the store (the proxy holds it 4 s; the lease is 3 s): its
    checks fence it a fifth of a lease after the renewal before it was sent, and it writes
    nothing more. The renewal lands late, still conditional on the version it was sent for: the
    taker, which must see the object unchanged for a whole lease on its own clock, sees it
    change and waits a whole lease from then. No moment has two writers."""
    import threading
    import time

    from sparkwal.wal import FencedError, LeaderHeldError, resolve
    from sparkwal.wal.leases import lease_path

    def now_ms():
        return time.monotonic_ns() // 1_000_000

    url, _ = s3_url
    proxy = FaultProxy(s3_endpoint, seed=3, delay_s=4.0)
    try:
        held_storage, path = resolve(f"{url}/ckpt", options(proxy.url))
        old = held_storage.lead(path, lease_ms=3000)
        proxy.plan("PUT", "/ckpt/.leader/epoch-0000000001", "delay")
        renewal = {}

        def renew():
            renewal["sent"] = now_ms()
            try:
                old.renew()
            except FencedError as e:
                renewal["fenced"] = str(e)
            renewal["answered"] = now_ms()
        renewer = threading.Thread(target=renew)
        renewer.start()
        fenced_at = None
        while fenced_at is None:
            try:
                old.check()  # a writer's check: never waits for the renewal under way
                time.sleep(0.02)
            except FencedError:
                fenced_at = now_ms()
        with pytest.raises(FencedError):
            held_storage.put(f"{path}/checkpoint-1000", b"late")  # a zombie's write: refused here
        taker_storage, _ = resolve(f"{url}/ckpt", options(s3_endpoint))
        while True:
            try:
                new = taker_storage.lead(path, lease_ms=3000)
                break
            except LeaderHeldError:
                time.sleep(0.05)
        took_over_at = now_ms()
        renewer.join(10)
    finally:
        proxy.stop()
    assert fenced_at - renewal["sent"] < 2400 + 100  # a fifth of the lease before it could lapse
    assert new.epoch == 2
    (late,) = [r for r in proxy.log if r.fault == "delay"]
    assert late.status == 200  # landed before any takeover, on the version it was sent for
    assert took_over_at - renewal["answered"] >= 3000 - 100  # a whole lease after it changed
    with pytest.raises(FencedError):
        old.check()  # fenced it stays
    record = taker_storage.read_file(lease_path(taker_storage, path, 1)).decode()
    assert '"superseded_by": 2' in record
    assert not taker_storage.exists(f"{path}/checkpoint-1000")


@pytest.mark.compat
@pytest.mark.driver
def test_a_full_disk_stops_the_job_with_one_line_and_a_restart_resumes_once_space_is_back(tmp_path):
    """The main job with its checkpoint on a local disk that fills up (faulty+file://: ENOSPC on
    every create, write and fsync until freed): it stops with exit status 4 and one last line
    naming the disk; with space back, a restart resumes from its checkpoint and every
    input file is counted exactly once."""
    import json

    from sparkwal.engine.apps.drill_runs import AppRun, check_outputs, wait_until_counted
    from sparkwal.engine.apps.wordcount_data import write_input_file

    workdir, control = tmp_path / "app", tmp_path / ".disk-faults.json"
    (workdir / "input").mkdir(parents=True)
    (workdir / "output").mkdir()
    control.write_text("{}")
    args = ("--checkpoint", f"faulty+file://{tmp_path}/ckpt", "--conf", "spark.ui.enabled=false")
    first = AppRun(str(workdir), 0.5, extra_args=args)
    runs = [first]
    try:
        for i in range(3):
            write_input_file(str(workdir / "input"), i)
        wait_until_counted(str(workdir), [3], 120)
        control.write_text(json.dumps({"full": True}))
        assert first.proc.wait(60) == 4
        log = (workdir / "logs" / "app-0.log").read_text()
        # the job's own last word is one line, and no trace above it (a task that hit the full
        # disk first had its Python worker's trace printed by Spark's executor)
        last = log.strip().splitlines()[-1]
        assert "Traceback" not in log and "\tat " not in log, log
        assert last.startswith("sparkwal-wordcount: the storage failed, the job stopped (a restart resumes "
                               "from the checkpoint): ") and "No space left on device" in last

        control.write_text("{}")  # space freed
        for i in range(3, 6):
            write_input_file(str(workdir / "input"), i)
        second = AppRun(str(workdir), 0.5, extra_args=args)
        runs.append(second)
        wait_until_counted(str(workdir), [6], 120)
        second.terminate()
        assert second.proc.returncode == 0 and second.recovery == "checkpoint"
    finally:
        for r in runs:
            if r.proc.poll() is None:
                r.kill()
    result = check_outputs(str(workdir), 6, runs)
    assert result["ok"], result


def test_an_ambiguous_conditional_create_is_ours_once_read_back_not_a_second_commit(s3_url, s3_endpoint):
    """The store takes the PUT, the answer is lost (reset after forwarding), the client retries and
    hears 'exists'. A batch's commit and a new leadership epoch are each settled by reading the
    object back: the commit is ours (True, one file, not 'another writer committed it'), the
    epoch is ours (no 'led by another driver' against a lease this process just wrote)."""
    from sparkwal.checkpoint import CommitLog, CommitMetadata

    from sparkwal.wal import resolve

    url, _ = s3_url
    proxy = FaultProxy(s3_endpoint, seed=9)
    try:
        commits = CommitLog(f"{url}/ckpt/commits", options(proxy.url))
        proxy.plan("PUT", "/ckpt/commits/7", "reset_after")
        assert commits.add(7, CommitMetadata(1000)) is True
        assert commits.add(7, CommitMetadata(2000)) is False  # a real second commit is refused
        storage, path = resolve(f"{url}/ckpt", options(proxy.url))
        proxy.plan("PUT", "/ckpt/.leader/epoch-0000000001", "reset_after")
        lead = storage.lead(path, lease_ms=30_000)
        assert lead.epoch == 1
        lead.renew()  # its version is the one it wrote: the renewal's If-Match holds
        faults = [r for r in proxy.log if r.fault == "reset_after"]
    finally:
        proxy.stop()
    assert len(faults) == 2
    reader = CommitLog(f"{url}/ckpt/commits", options(s3_endpoint))
    assert reader.get(7).next_batch_watermark_ms == 1000 and reader.batch_ids() == [7]


def test_the_storage_deadline_reaches_the_executors_python_workers(spark_context):
    """spark.sparkwal.storage.deadline bounds every storage call of the app, also those made in
    tasks (a receiver's WAL, state snapshot parts): the Spark conf does not reach a Python
    worker, so the driver hands the deadline to them in their environment."""
    from sparkwal.engine import StreamingContext
    from sparkwal.wal.retry import default_policy

    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.sparkwal.storage.deadline", "7s")
    try:
        StreamingContext(spark_context, 1.0)
        in_tasks = spark_context.parallelize(range(4), 2).map(lambda _: default_policy().deadline_s).collect()
    finally:
        live_conf.remove("spark.sparkwal.storage.deadline")
        StreamingContext(spark_context, 1.0)  # the default again, for the tests after this one
    assert default_policy().deadline_s == 60.0
    assert in_tasks == [7.0] * 4
