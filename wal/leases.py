"""Leases and epochs on object stores: the single writer of a directory (``.writer.lease``) and
the leader of a checkpoint directory (one lease object per epoch under ``.leader/``). How they
work, and what they guarantee, is told in :mod:`sparkwal.wal.storage`."""

from __future__ import annotations

import json
import logging
import threading
import uuid

from .clock import Clock, monotonic_ms
from .errors import FencedError, LeaderHeldError, LeadershipRefusedError, LogLockedError, WalError
from .locks import (LEADER_LEASES, LEASE_FILE, LeaderInfo, Leadership, Lock, WriterInfo, holder_description)

log = logging.getLogger(__name__)


#: the holder stops writing this part of a lease before anyone may take it over: room for clock
#: rates that differ and for its last request to land (each request's timeout is kept below it:
#: :func:`request_timeout_s`)
MARGIN_FRACTION = 5


def margin_ms(lease_ms: int) -> int:
    return lease_ms // MARGIN_FRACTION


def request_timeout_s(lease_ms: int) -> float:
    """The longest a leader's single request may wait for an answer (connect plus read), so that
    a request sent while the lease held ends before the holder's margin does."""
    return margin_ms(lease_ms) / 1000 * 0.9


class Lease(Lock):
    """An object-store lease, ``{"owner", "holder", "expires_ms", "lease_ms"}``, renewed by
    ``check`` with one conditional PUT on the version its holder last wrote (a taker's
    conditional replace makes the renewal fail: the holder learns it lost the lease), trusted on
    the holder's monotonic clock between renewals up to a fifth of a lease before it would lapse,
    and fenced by itself from then on."""

    def __init__(self, storage, path: str, owner: str, clock: Clock, lease_ms: int):
        self._storage, self._path, self._owner = storage, path, owner
        self._clock, self._lease_ms = clock, lease_ms
        self._version: str | None = None
        self._renewed(monotonic_ms(clock))

    def _renewed(self, sent_at: int) -> None:
        self._renewed_at, self._valid_until = sent_at, sent_at + self._lease_ms - margin_ms(self._lease_ms)

    def body(self, released: bool = False) -> bytes:
        now = self._clock.now_ms()
        return json.dumps(
            {"owner": self._owner, "holder": holder_description(), "lease_ms": self._lease_ms,
             "expires_ms": now if released else now + self._lease_ms, "released": released}
        ).encode()

    def take(self, version: str | None) -> bool:
        """Write this lease over the object at ``version`` (None: create it), one conditional PUT."""
        sent_at = monotonic_ms(self._clock)
        self._version = self._storage.put_if_version(self._path, self.body(), version)
        if self._version is None:
            return False
        self._renewed(sent_at)
        return True

    def check(self) -> None:
        now = monotonic_ms(self._clock)
        if now >= self._valid_until:
            raise LogLockedError(self._path, f"its lease lapsed unrenewed since {self._lease_ms} ms "
                                 "(this writer fenced itself)")
        if now - self._renewed_at < self._lease_ms // 3:
            return
        version = self._storage.put_if_version(self._path, self.body(), self._version)
        if version is None:
            current = read_lease(self._storage, self._path)
            holder = current.get("holder", "") if current else "nobody (lease deleted)"
            self._valid_until = now  # never trusted again
            raise LogLockedError(self._path, f"lease lost; now held by {holder}")
        self._version = version
        self._renewed(now)

    def release(self) -> None:
        self._valid_until = 0
        try:  # conditional: a lease already taken over is left to its new holder
            self._storage.put_if_version(self._path, self.body(released=True), self._version)
        except Exception as e:  # noqa: BLE001  a lease that cannot be released simply expires
            log.warning("could not release lease %s: %s", self._path, e)


class EpochLease(Leadership):
    """An object-store leadership: the lease object of one epoch, renewed by its owner with one
    conditional PUT (``If-Match`` the version it last wrote). A taker first supersedes the
    lapsed object (conditional on the version it read), so a renewal that comes too late finds
    the object changed and fences its sender; between renewals the holder trusts its lease on
    its own monotonic clock, from when the renewal was sent, up to a fifth of a lease before it
    expires: confirming costs no request. While it holds, it bounds every write of its storage
    (:meth:`remaining_ms`: each attempt checked, the retries of each capped)."""

    def __init__(self, storage, directory: str, epoch: int, clock: Clock, lease_ms: int):
        self._storage, self._dir, self.epoch = storage, directory, epoch
        self._path = lease_path(storage, directory, epoch)
        self._owner, self._clock, self._lease_ms = uuid.uuid4().hex, clock, lease_ms
        self.renew_every_ms = max(1, lease_ms // 3)
        now = monotonic_ms(clock)
        self._since, self._renewed_at = clock.now_ms(), now
        #: the holder stops writing a fifth of a lease before others may take it over
        self._valid_until = now + lease_ms - margin_ms(lease_ms)
        self._version: str | None = None  # of the object as this holder last wrote it
        self._renew_error: BaseException | None = None  # why the last renewal failed, if it did
        #: the newest error the store answered a request with, and when (this holder's clock)
        self._refused: tuple[BaseException, int] | None = None
        self._fenced: str | None = None
        self._renew_lock = threading.Lock()
        self.info = LeaderInfo("lease", epoch, holder_description(), self._since, True, self._since + lease_ms)

    def body(self, released: bool = False) -> bytes:
        now = self._clock.now_ms()  # wall times, for people and inspectors; nobody decides on them
        return json.dumps({"epoch": self.epoch, "owner": self._owner, "holder": holder_description(),
                           "since_ms": self._since, "expires_ms": now if released else now + self._lease_ms,
                           "lease_ms": self._lease_ms, "released": released}).encode()

    def create(self) -> bool:
        """Take this epoch: create its object if absent (one conditional PUT)."""
        sent_at = monotonic_ms(self._clock)
        self._version = self._storage.put_if_version(self._path, self.body(), None)
        if self._version is None:
            return False
        self._renewed_at, self._valid_until = sent_at, sent_at + self._lease_ms - margin_ms(self._lease_ms)
        return True

    def _fence(self, reason: str) -> None:
        if self._fenced is None:
            self._fenced = f"{self._storage.url(self._dir)}: leadership epoch {self.epoch} is over: {reason}"
            log.error("%s", self._fenced)
        raise FencedError(self._fenced)

    def _lapsed(self, now: int, in_flight: bool = False) -> None:
        self._fence(f"its lease was last renewed {now - self._renewed_at} ms ago and may be taken over "
                    f"{self._lease_ms} ms after that{self._why_not_renewed(in_flight)}")

    def remaining_ms(self) -> int | None:
        """How long this holder may still write (no request, no renewal); FencedError once none."""
        if self._fenced is not None:
            raise FencedError(self._fenced)
        now = monotonic_ms(self._clock)
        if now >= self._valid_until:
            self._lapsed(now, in_flight=self._renew_lock.locked())
        return self._valid_until - now

    def check(self) -> None:
        self.remaining_ms()
        now = monotonic_ms(self._clock)
        if now - self._renewed_at >= (self.renew_every_ms or 0) and self._renew_lock.acquire(blocking=False):
            try:  # due, and no renewal under way (a slow one never stalls the checks: they fence)
                self._renew()
            finally:
                self._renew_lock.release()

    def confirm(self) -> None:
        """Current, on this holder's clock (renewed first if due); FencedError if not."""
        self.check()

    def renew(self) -> None:
        """One conditional PUT of the lease object: fenced if it is no longer the version this
        holder wrote (superseded by a taker, or deleted)."""
        with self._renew_lock:
            self._renew()

    def _renew(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        sent_at = monotonic_ms(self._clock)
        if sent_at >= self._valid_until:
            self._lapsed(sent_at)
        try:
            version = self._storage.put_if_version(self._path, self.body(), self._version)
        except FencedError:
            raise
        except Exception as e:
            self._renew_error = e
            raise
        self._renew_error = None
        if version is None:
            current = read_lease(self._storage, self._path) or {}
            taker = current.get("superseded_by")
            self._fence(f"epoch {taker} was taken by another driver" if taker else
                        "its lease object was replaced or deleted")
        self._version = version
        if self._fenced is None:  # validity counts from the send: a slow answer shortens it
            self._renewed_at, self._valid_until = sent_at, sent_at + self._lease_ms - margin_ms(self._lease_ms)

    def store_refused(self, error: BaseException) -> None:
        self._refused = (error, monotonic_ms(self._clock))

    def _why_not_renewed(self, in_flight: bool = False) -> str:
        """A lapse's cause when the store would not take the renewals: a storage fault, not a taker."""
        error, refused = self._renew_error, self._refused
        if error is None and refused is not None and monotonic_ms(self._clock) - refused[1] <= self.renew_every_ms:
            # the store answered a request with errors within a renewal's interval of the lapse (an
            # outage: the store is there and refuses); an older refusal (a storm, then a pause) is no cause
            return f"; the store answered with errors: {' '.join(str(refused[0]).split())[:300]}"
        if error is None and in_flight:  # the store has not answered the renewal under way
            # (not "renewing it failed": a renewal held while this process was paused is no
            # storage fault; one the store answered with errors is)
            return "; its renewal under way has had no answer yet"
        return "" if error is None else f"; renewing it failed: {' '.join(str(error).split())[:300]}"

    def release(self) -> None:
        # (the storage's fence stays: the writes of this released leadership are refused from now)
        if self._fenced is not None:
            return
        self._fenced = f"leadership epoch {self.epoch} was released"
        try:
            self._storage.put_if_version(self._path, self.body(released=True), self._version)
        except Exception as e:  # noqa: BLE001  a lease that cannot be released simply expires
            log.warning("could not release lease %s: %s", self._path, e)


def read_lease(storage, path: str) -> dict | None:
    try:
        return _parse_lease(storage.read_file(path))
    except FileNotFoundError:
        return None


def _parse_lease(data: bytes) -> dict:
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    return record if isinstance(record, dict) else {"owner": "?", "holder": "unreadable lease", "expires_ms": 0}


def lease_writer(storage, directory: str, clock: Clock) -> WriterInfo | None:
    lease = read_lease(storage, storage.join(directory, LEASE_FILE))
    if lease is None:
        return None
    expires = int(lease.get("expires_ms", 0))
    return WriterInfo("lease", str(lease.get("holder", "")), expires > clock.now_ms(), expires)


def lease_path(storage, directory: str, epoch: int) -> str:
    return storage.join(storage.join(directory, LEADER_LEASES), f"epoch-{epoch:010d}")


def leader_epochs(storage, directory: str) -> list[int]:
    out = []
    for f in storage.list_files(storage.join(directory, LEADER_LEASES)):
        if f.name.startswith("epoch-") and f.name[6:].isdigit():
            out.append(int(f.name[6:]))
    return sorted(out)


def lease_info(record: dict, epoch: int, clock: Clock) -> LeaderInfo:
    expires, released = int(record.get("expires_ms", 0)), bool(record.get("released"))
    return LeaderInfo("lease", epoch, str(record.get("holder", "")), int(record.get("since_ms", 0)),
                      not released and expires > clock.now_ms(), expires, released)


def lease_leader(storage, directory: str, clock: Clock) -> LeaderInfo | None:
    epochs = leader_epochs(storage, directory)
    if not epochs:
        return None
    record = read_lease(storage, lease_path(storage, directory, epochs[-1])) or {"holder": "deleted lease"}
    return lease_info(record, epochs[-1], clock)


HIGH_WATER = "high-water"  # under .leader/: the newest epoch ever taken, read without a listing


def _sighting_wait(storage, path: str, version: str, record: dict, clock: Clock, lease_ms: int) -> int | None:
    """How long before the lease object at ``path`` (now at ``version``) may be taken over: a
    taker must have seen it unchanged for a whole lease on its own monotonic clock (the holder's
    wall clock, and so ``expires_ms``, decides nothing). None: it changed since this process
    first saw it (its holder renews it: alive)."""
    sightings = storage.__dict__.setdefault("_lease_sightings", {})
    now = monotonic_ms(clock)
    lease = max(lease_ms, int(record.get("lease_ms") or 0))  # the holder's lease if longer
    seen = sightings.get(path)
    if seen is None or seen[0] != version:
        sightings[path] = (version, now)
        return lease if seen is None else None
    wait = max(0, seen[1] + lease - now)
    if "lease_ms" not in record:  # an earlier release's holder: it trusts its lease on its wall clock
        wait = max(wait, int(record.get("expires_ms", 0)) + 1 - clock.now_ms())
    return wait


def _high_water(storage, directory: str) -> tuple[int, str | None]:
    found = storage.read_versioned(storage.join(storage.join(directory, LEADER_LEASES), HIGH_WATER))
    if found is None:
        return 0, None
    try:
        return int(json.loads(found[0])["epoch"]), found[1]
    except (ValueError, KeyError, TypeError):
        return 0, found[1]


def lease_lead(storage, directory: str, clock: Clock, lease_ms: int, *, min_epoch: int = 0) -> Leadership:
    if not getattr(storage, "conditional_writes", False):
        raise LeadershipRefusedError(
            f"{storage.url(directory)}: {storage.protocol}:// has no conditional write that sparkwal uses "
            "(S3's If-Match and If-None-Match), so two drivers could lead it at once: put the checkpoint "
            "on S3 (or a store that speaks its API) or on a local disk")
    storage.fence = None  # a storage writes for one leadership at a time: the one taken now
    storage.makedirs(directory)
    # the mark before the listing: a taker creates its epoch's object before it raises the mark, so
    # a mark above the listing's newest means objects were lost, not a takeover under way
    high, high_version = _high_water(storage, directory)
    epochs = leader_epochs(storage, directory)
    newest = epochs[-1] if epochs else 0
    if max(high, min_epoch) > newest:  # epochs only grow: a lost record must not restart them
        raise LeadershipRefusedError(
            f"{storage.url(directory)}: its newest leader object is epoch {newest}, but epoch "
            f"{max(high, min_epoch)} was taken ({'the high-water mark' if high > newest else 'the checkpoint'} "
            f"says so): leader objects under {LEADER_LEASES}/ were deleted or a listing missed them; a "
            "driver may still lead it. Stop every driver of this checkpoint, then restore the objects "
            f"or write {LEADER_LEASES}/epoch-{max(high, min_epoch):010d} with \"released\": true")
    current = None
    if epochs:
        path = lease_path(storage, directory, newest)
        found = storage.read_versioned(path)
        record = _parse_lease(found[0]) if found else {"holder": "deleted lease"}
        current = lease_info(record, newest, clock)
        if found is not None and not record.get("released") and not record.get("superseded_by"):
            wait = _sighting_wait(storage, path, found[1], record, clock, lease_ms)
            if wait is None or wait > 0:
                raise LeaderHeldError(storage.url(directory), current, wait)
        if found is not None and not record.get("superseded_by"):  # its holder's renewals now fail
            superseded = json.dumps({**record, "superseded_by": newest + 1}).encode()
            if storage.put_if_version(path, superseded, found[1]) is None:  # renewed meanwhile
                raise LeaderHeldError(storage.url(directory), lease_leader(storage, directory, clock) or current)
    lease = EpochLease(storage, directory, newest + 1, clock, lease_ms)
    if not lease.create():
        winner = lease_leader(storage, directory, clock) or current
        raise LeaderHeldError(storage.url(directory), winner)
    if current is not None:
        log.warning("%s: took over leadership at epoch %d from %s", storage.url(directory), lease.epoch,
                    current.describe())
    try:  # the epoch is taken: what follows only keeps records, and must not orphan it
        mark = json.dumps({"epoch": lease.epoch}).encode()
        if storage.put_if_version(storage.join(storage.join(directory, LEADER_LEASES), HIGH_WATER), mark,
                                  high_version) is None:
            log.warning("%s: the leader high-water mark changed while epoch %d was taken", storage.url(directory),
                        lease.epoch)
        for old in leader_epochs(storage, directory)[:-3]:  # the newest few stay, for inspectors
            storage.delete(lease_path(storage, directory, old))
    except (OSError, WalError) as e:
        log.warning("%s: leading at epoch %d, but its records could not be kept up to date: %s",
                    storage.url(directory), lease.epoch, e)
    storage.fence = lease  # every write of this storage is bounded by the lease from now on
    return lease


def lease_lock(storage, directory: str, clock: Clock, lease_ms: int) -> Lock:
    """The single-writer lease of ``directory``: created if absent, or taken over from a holder
    whose lease expired (on the holders' wall clocks: the writer lease has no standby polling
    it) by a conditional replace of the version read, so that of two takers one wins and the
    old holder's next renewal fails."""
    storage.makedirs(directory)
    path = storage.join(directory, LEASE_FILE)
    lease = Lease(storage, path, uuid.uuid4().hex, clock, lease_ms)
    for _ in range(2):
        found = storage.read_versioned(path)
        if found is not None:
            current = _parse_lease(found[0])
            if current.get("expires_ms", 0) > clock.now_ms() and not current.get("released"):
                raise LogLockedError(storage.url(directory), current.get("holder", ""))
            if not current.get("released"):
                log.warning("taking over expired lease %s of %s", path, current.get("holder"))
        if lease.take(found[1] if found else None):
            return lease
    raise LogLockedError(storage.url(directory), "lease contended")


def lease_seed_epoch(storage, directory: str, epoch: int, holder: str, clock: Clock) -> None:
    """Epoch ``epoch``'s lease object, released: the next leader takes ``epoch + 1`` at once."""
    now = clock.now_ms()
    body = json.dumps({"epoch": epoch, "owner": "", "holder": holder, "since_ms": now,
                       "expires_ms": now, "released": True}).encode()
    storage.put_if_absent(lease_path(storage, directory, epoch), body)
    storage.put_if_absent(storage.join(storage.join(directory, LEADER_LEASES), HIGH_WATER),
                          json.dumps({"epoch": epoch}).encode())
