"""Fencing in the storage seam (wal/locks.py, wal/leases.py, wal/retry.py): no two leaders, and no
write of a leader whose leadership is over. Each test is a way two drivers led at once, or an
old leader's write landed after a takeover, before this was closed."""

from __future__ import annotations

import errno
import json
import os

import pytest
from fsspec.implementations.local import LocalFileSystem

from sparkwal.wal import FencedError, LeadershipRefusedError, LogLockedError, ManualClock, resolve
from sparkwal.wal import locks
from sparkwal.wal.leases import lease_lock, lease_path
from sparkwal.wal.retry import RetryPolicy, call
from sparkwal.wal.storage import LEADER_EPOCH, LEADER_LOCK, FsspecStorage

# ------------------------------------------------------------------ local: the flock's file


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_leader_whose_lock_file_is_deleted_or_replaced_fences_itself(tmp_path, how):
    directory = str(tmp_path / "ckpt")
    old_storage, path = resolve(directory)
    old = old_storage.lead(path)
    lock_file = os.path.join(path, LEADER_LOCK)
    if how == "deleted":  # an operator, a temp cleaner, rsync --delete from a backup
        os.unlink(lock_file)
    else:
        spare = os.path.join(path, "spare")
        open(spare, "w").close()
        os.replace(spare, lock_file)
    with pytest.raises(FencedError, match=f"epoch 1 is over: its lock file .* was {how}"):
        old.renew()  # the renewal thread's look (every 500 ms), before anyone else leads
    standby_storage, _ = resolve(directory)
    new = standby_storage.lead(path)  # flocks the new inode: it leads
    assert new.epoch == 2
    with pytest.raises(FencedError, match="epoch 1 is over: its lock file .* was (deleted|replaced)"):
        old.check()
    with pytest.raises(FencedError):
        old_storage.put(os.path.join(path, "checkpoint-1000"), b"zombie")  # every write checks
    assert not os.path.exists(os.path.join(path, "checkpoint-1000"))
    new.check()
    standby_storage.put(os.path.join(path, "checkpoint-1000"), b"leader")
    new.release()


def test_local_epochs_only_grow_when_a_record_is_deleted(tmp_path):
    storage, path = resolve(str(tmp_path / "ckpt"))
    storage.lead(path).release()
    storage.lead(path).release()
    os.unlink(os.path.join(path, LEADER_EPOCH))  # the lock file keeps a copy of the record
    third = storage.lead(path)
    assert third.epoch == 3
    third.release()
    os.unlink(os.path.join(path, LEADER_EPOCH))
    os.unlink(os.path.join(path, LEADER_LOCK))
    # both gone: the caller knows the newest checkpoint was written at epoch 7
    assert storage.lead(path, min_epoch=7).epoch == 8


def test_a_network_file_system_is_refused_with_one_line(tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    assert locks.filesystem_type(str(directory)) is not None  # this machine's table reads
    table = tmp_path / "mountinfo"
    table.write_text("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                     f"97 22 0:53 / {tmp_path} rw,relatime shared:50 - nfs4 server:/export rw,vers=4.2\n")
    monkeypatch.setattr(locks, "MOUNTINFO", str(table))
    storage, path = resolve(str(directory))
    with pytest.raises(LeadershipRefusedError, match=r"ckpt is on a network file system \(nfs4\).*"
                       r"spark.sparkwal.leader.allowNetworkFilesystem") as refused:
        storage.lead(path)
    assert "\n" not in str(refused.value)
    assert not directory.exists()  # refused before writing anything
    storage.lead(path, network_filesystem_ok=True).release()


# ------------------------------------------------------------------ object stores


def test_a_store_without_a_conditional_write_is_refused(tmp_path):
    storage = FsspecStorage(LocalFileSystem())  # read, compare, then write: not one request
    with pytest.raises(LeadershipRefusedError, match="file:// has no conditional write"):
        storage.lead(str(tmp_path / "ckpt"))


def test_lease_epochs_only_grow_when_leader_objects_are_lost(memory_url):
    storage, path = resolve(f"{memory_url}/ckpt")
    for _ in range(5):
        storage.lead(path, lease_ms=3000).release()
    with pytest.raises(FencedError, match="released"):
        storage.put(f"{path}/checkpoint-1000", b"after its release")
    operator, _ = resolve(f"{memory_url}/ckpt")  # (the released leadership's storage writes no more)
    for epoch in (3, 4, 5):  # what a listing might miss, or a clean-up might delete
        operator.delete(lease_path(storage, path, epoch))
    with pytest.raises(LeadershipRefusedError, match="newest leader object is epoch 0, but epoch 5 was taken"):
        storage.lead(path, lease_ms=3000)
    fresh, fresh_path = resolve(f"{memory_url}/other")
    with pytest.raises(LeadershipRefusedError, match="epoch 4 was taken"):
        fresh.lead(fresh_path, lease_ms=3000, min_epoch=4)  # the checkpoint says epoch 4 wrote it


def test_the_writers_lease_is_conditional_and_fences_itself_once_it_lapses(memory_url):
    storage, path = resolve(f"{memory_url}/wal")
    clock = ManualClock(0)
    holder = storage.lock(path, clock=clock, lease_ms=3000)
    clock.advance(2400)  # a fifth of the lease before it lapses: no write may start
    with pytest.raises(LogLockedError, match="lapsed"):
        holder.check()
    clock.advance(700)
    # two takers read the same expired lease; the one whose conditional replace comes second loses
    first_reader, _ = resolve(f"{memory_url}/wal")
    stale = storage.read_versioned(f"{path}/.writer.lease")

    class StaleRead:  # the second taker's read happened before the first taker's replace
        def __getattr__(self, name):
            return getattr(first_reader, name)

        def read_versioned(self, p):
            return stale
    taker = lease_lock(first_reader, path, clock, 3000)
    with pytest.raises(LogLockedError, match="contended|locked"):
        lease_lock(StaleRead(), path, clock, 3000)
    taker.check()
    clock.advance(1000)
    taker.check()  # renewed: one conditional PUT on its own version
    assert json.loads(storage.read_file(f"{path}/.writer.lease"))["owner"] == taker._owner


def test_a_retried_write_stops_at_the_leases_validity_and_says_fenced(memory_url):
    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(0)
    lead = storage.lead(path, clock=clock, lease_ms=3000)
    attempts = []

    def put():  # the store keeps timing out (a partition holds the leader's requests)
        attempts.append(clock.now_ms())
        raise TimeoutError("read timed out")

    def sleep(seconds):
        clock.advance(int(seconds * 1000) + 1)
    with pytest.raises(FencedError, match="epoch 1 is over"):
        call("put", f"{path}/checkpoint-1000", put, policy=RetryPolicy(deadline_s=60), sleep=sleep,
             monotonic=lambda: clock.now_ms() / 1000, fence=lead)
    assert attempts and max(attempts) < 2400  # no attempt after the holder's margin began
    with pytest.raises(FencedError):
        storage.put(f"{path}/checkpoint-2000", b"late")  # nor a later write of this storage


# ------------------------------------------------------------------ the driver's settings


def driver_with(directory, restored_epoch=None, storage_options=None, **settings):
    from types import SimpleNamespace

    from sparkwal.checkpoint import Checkpoint
    from sparkwal.engine import config

    conf = {config.LEASE_TIMEOUT: 30_000, config.LEADER_NETWORK_FS: False,
            config.HANDOVER_TEARDOWN_WAIT: 10_000}
    conf.update({getattr(config, k): v for k, v in settings.items()})
    restored = None if restored_epoch is None else Checkpoint(1000, [], {"leader_epoch": restored_epoch})
    return SimpleNamespace(settings=conf, storage_options=storage_options, location=directory, restored=restored)


def test_a_driver_leads_above_its_checkpoints_epoch_and_as_its_settings_say(tmp_path, monkeypatch):
    from sparkwal.engine.driver.leadership import for_driver

    role = for_driver(driver_with(str(tmp_path / "fresh"), restored_epoch=7))  # its epoch records were lost
    assert role.take().epoch == 8
    role.release()
    table = tmp_path / "mountinfo"
    table.write_text(f"97 22 0:53 / {tmp_path} rw - nfs4 server:/export rw\n")
    monkeypatch.setattr(locks, "MOUNTINFO", str(table))
    with pytest.raises(LeadershipRefusedError, match="nfs4"):
        for_driver(driver_with(str(tmp_path / "nfs"))).take()
    role = for_driver(driver_with(str(tmp_path / "nfs"), LEADER_NETWORK_FS=True))
    assert role.take().epoch == 1
    role.release()


def test_a_request_timeout_longer_than_the_lease_allows_is_refused_in_one_line(memory_url):
    from sparkwal.engine.driver.leadership import LeaseSettingsError, for_driver

    options = {"config_kwargs": {"read_timeout": 10}}
    with pytest.raises(LeaseSettingsError, match=r"config_kwargs.read_timeout=10 s .* "
                       r"spark.streaming.driver.leaseTimeout=30s .* at most 5.40 s") as refused:
        for_driver(driver_with(f"{memory_url}/ckpt", storage_options=options))
    assert "\n" not in str(refused.value)
    for_driver(driver_with(f"{memory_url}/ckpt", storage_options=options, LEASE_TIMEOUT=60_000))  # 10.8 s: fine


def test_two_standbys_racing_the_loser_is_told_held_not_refused(memory_url):
    """A takes the next epoch (creating its object, then raising the mark) just before B reads the
    high-water mark: B sees A's lease, held, and goes on standing by (it listed after reading the
    mark; listing first, it saw a mark above its listing and refused for good)."""
    holder, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(0)
    holder.lead(path, clock=clock, lease_ms=3000).release()
    a, _ = resolve(f"{memory_url}/ckpt")

    class RacedByA:
        def __getattr__(self, name):
            return getattr(storage_b, name)

        def read_versioned(self, p):
            if p.endswith("high-water"):
                a.lead(path, clock=clock, lease_ms=3000)  # A wins the race just before B reads the mark
            return storage_b.read_versioned(p)
    storage_b, _ = resolve(f"{memory_url}/ckpt")
    from sparkwal.wal import LeaderHeldError
    from sparkwal.wal.leases import lease_lead

    with pytest.raises(LeaderHeldError, match="epoch 2"):
        lease_lead(RacedByA(), path, clock, 3000)


def test_a_child_forked_without_exec_does_not_keep_the_leaders_lock(tmp_path):
    storage, path = resolve(str(tmp_path / "ckpt"))
    lead = storage.lead(path)
    hold_read, hold_write = os.pipe()
    ready_read, ready_write = os.pipe()
    child = os.fork()
    if child == 0:  # a user's multiprocessing worker: it lives on after its parent lets go
        os.close(hold_write)
        os.write(ready_write, b"r")  # (the fork's hooks have run)
        os.read(hold_read, 1)
        os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"r"
        lead.release()  # the driver dies or stops
        again, _ = resolve(str(tmp_path / "ckpt"))
        assert again.lead(path).epoch == 2  # the child holds nothing
    finally:
        os.close(hold_write)
        os.waitpid(child, 0)


def test_a_leader_paused_with_its_renewal_held_says_fenced_not_storage(memory_url):
    """The renewal under way when the process was paused (held in the network) has no answer:
    that is a fence (exit 3), not a storage fault (4), which is a store answering with errors."""
    import threading

    from sparkwal.engine.apps.arguments import storage_fault

    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(0)
    lead = storage.lead(path, clock=clock, lease_ms=3000)
    held, sent = threading.Event(), threading.Event()
    real = storage.put_if_version

    def held_put(*args, **kwargs):
        sent.set()
        held.wait(10)
        return real(*args, **kwargs)
    storage.put_if_version = held_put
    clock.advance(1000)
    def renew():
        try:
            lead.renew()
        except FencedError:
            pass
    renewer = threading.Thread(target=renew)
    renewer.start()
    assert sent.wait(10)
    clock.advance(2000)  # paused past its margin, the renewal still held
    with pytest.raises(FencedError, match="no answer yet") as fenced:
        lead.check()
    assert not storage_fault(fenced.value)
    held.set()
    renewer.join(10)
    storage.put_if_version = lambda *a, **k: pytest.fail("a fenced leader sent a renewal")
    with pytest.raises(FencedError, match="no answer yet"):
        lead.renew()  # fenced for good: the same reason, and no renewal is even sent


def _s3_error(code: str, status: int) -> OSError:
    """The error s3fs raises for an S3 answer ``status``/``code`` (its own translation of botocore's)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    return translate_boto_error(ClientError({"Error": {"Code": code, "Message": code},
                                             "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"))


@pytest.mark.parametrize("answer, pause_ms, storage_named", [
    (lambda: _s3_error("SlowDown", 503), 0, True),  # an outage up to the lapse: the store refuses
    (lambda: _s3_error("InternalError", 500), 0, True),
    (lambda: _s3_error("SlowDown", 503), 1500, False),  # a storm, then a pause: fenced
    (lambda: _s3_error("GatewayTimeout", 504), 0, False),  # a proxy whose store did not answer
    (lambda: OSError(errno.ETIMEDOUT, "Read timed out"), 0, False),  # no answer: a partition or a pause
])
def test_a_lease_that_lapses_while_the_store_refuses_requests_says_storage_not_fenced(memory_url, answer, pause_ms,
                                                                                      storage_named):
    """An outage (every request answered 503) outlasting a leader's lease ends it with the storage's
    exit status (4), also when no renewal has failed yet (one may still be retrying): the store's
    refusals within a renewal's interval of the lapse name the cause. Requests that had no answer,
    and refusals older than that (a storm ridden out, then a pause), do not: fenced (3)."""
    from sparkwal.engine.apps.arguments import storage_fault

    storage, path = resolve(f"{memory_url}/ckpt")
    clock = ManualClock(0)
    lead = storage.lead(path, clock=clock, lease_ms=3000)  # valid until 2400, renewed every 1000
    storage.policy = RetryPolicy(deadline_s=0.05, first_backoff_s=0.01, max_backoff_s=0.01)
    real_cat = storage.fs.cat_file

    def refused(*args, **kwargs):
        raise answer()
    storage.fs.cat_file = refused
    clock.advance(2400 - 200 - pause_ms)
    with pytest.raises(Exception, match="still failing"):
        storage.read_file(storage.join(path, "offsets-1"))  # each attempt answered (or not) so
    storage.fs.cat_file = real_cat
    clock.advance(200 + pause_ms)  # the lapse: 200 ms after the last answer, or a pause later
    with pytest.raises(FencedError) as fenced:
        lead.check()
    assert ("the store answered with errors: " in str(fenced.value)) is storage_named, fenced.value
    assert storage_fault(fenced.value) is storage_named

