"""The one storage seam of sparkwal: URL -> backend, append + fsync, atomic create-if-absent, locks.

Everything sparkwal persists (WAL segments, metadata logs, checkpoints) goes through a
:class:`Storage`, and every guarantee of the seam is listed here, once. By job:
:mod:`sparkwal.wal.backends` (the two backends), :mod:`sparkwal.wal.atomic` (fsync, atomic create and replace),
:mod:`sparkwal.wal.locks` (locks, epochs), :mod:`sparkwal.wal.leases` (their object-store leases),
:mod:`sparkwal.wal.append_files` (appends and their fsync).
``resolve(url)`` picks the backend:

* a plain path or ``file://`` URL -> :class:`LocalStorage`, straight ``os`` calls (so ``fsync`` means
  what it says and random reads are a cached-fd ``pread``);
* ``faulty+file://`` + a local path -> the local storage failing on command, for fault tests and
  drills (:mod:`sparkwal.wal.disk_faults`);
* any other URL -> :class:`FsspecStorage` over the fsspec filesystem registered for that protocol
  (``memory://``, ``s3://``, ... or a test double registered by a test).

Guarantees of ``put_if_absent`` (atomic create-if-absent: never overwrites, never shows a partial
file, the storage decides the winner of a race):

===================  ==========================================================================
backend              how
===================  ==========================================================================
local filesystem     temp file in the same dir, fsync, ``os.link`` (fails if the name exists),
                     unlink temp, fsync the directory
S3 (s3fs)            one PUT with ``If-None-Match: *`` (AWS S3, MinIO and moto honour it)
memory://            check-and-store under a process-wide lock (process-local by nature)
other fsspec stores  the backend's ``pipe_file(mode="create")``; fsspec documents its default as
                     check-then-write, i.e. *not* atomic: a warning is logged once per backend
===================  ==========================================================================

Append (WAL segments) exists on the local filesystem and ``memory://``; object stores have no
append, so logs there write one object per write (``close_file_after_write``).

Locks (single-writer fencing): local -> ``flock`` on ``<dir>/.writer.lock``, released by the OS when
the holder dies; elsewhere -> a lease object ``<dir>/.writer.lease`` created with ``put_if_absent``,
renewed by the holder and taken over by another writer only once it has expired.

Leadership (``lead``: one driver per checkpoint directory, numbered by an epoch that only grows)
is the same lock with a number:

* local: ``flock`` on ``<dir>/.leader.lock`` (the kernel releases it the instant its holder dies:
  no timeout), then the epoch, one more than the last, recorded in ``<dir>/.leader.epoch``
  (``{"epoch", "holder", "pid", "host", "since_ms"}``, replaced atomically) and the same record in
  the lock file itself, so that a deleted record cannot restart the numbering (nor can both: the
  caller's ``min_epoch``, the newest checkpoint's epoch, is a floor). An flock cannot be taken from
  a live holder, but its *file* can be deleted or replaced, after which another driver flocks a new
  inode: every check of a local leadership compares the held descriptor's file with the path's
  (``fstat`` against ``stat``) and fences the holder whose file is gone, and its renewal thread
  looks every 500 ms. A directory on a network file system (NFS, SMB, FUSE mounts of remote
  stores: their flock is not a lock between machines) is refused with one line, unless the caller
  says nothing else can start a driver there (``network_filesystem_ok``).
* object stores: one lease object per epoch, ``<dir>/.leader/epoch-<epoch, 10 digits>`` holding
  ``{"epoch", "owner", "holder", "since_ms", "expires_ms", "lease_ms", "released"}`` and, once a
  taker superseded it, ``"superseded_by"`` (the next epoch); ``<dir>/.leader/high-water``
  (``{"epoch"}``) records the newest epoch taken, read with a GET, so a listing that misses the
  objects (or their deletion) cannot make an epoch be taken twice: that is refused. Only a store
  whose ``put_if_version`` is one conditional request (S3 and stores speaking its API: ``If-Match``
  / ``If-None-Match``; ``memory://``) may be led: elsewhere (``gs://``, ``abfs://``, ...) a
  read-compare-write lets two takers win, so ``lead`` is refused, naming the store. Taking over
  is allowed once the newest object was released, or once the taker has seen it *unchanged for a
  whole lease on its own monotonic clock* (the holder's ``expires_ms`` is for people: wall clocks
  decide nothing); it is two conditional requests: the object rewritten with ``superseded_by`` on
  the condition that it is still the version seen, then the next epoch's object created if absent.
  The holder renews its own object every third of the lease with one conditional PUT on the
  version it last wrote, so a renewal after a takeover is refused and fences it; between renewals
  it trusts the lease on its own monotonic clock, counted from when the renewal was *sent*, and
  stops writing (fences itself) a fifth of the lease before it could be taken over.

Writes bounded by the leadership: a storage that took a leadership keeps it as its ``fence``; its
``put``, ``put_if_absent`` and ``delete`` check it first, and on a remote store every attempt of a
write checks it again and the write's retries stop where the leadership could lapse
(:func:`sparkwal.wal.retry.call`): a write is never retried past its leader's lease, and a paused
leader that resumes hears ``FencedError`` before any storage error. A leader's requests each wait
at most 0.9 of the margin for an answer (``RetryPolicy.request_timeout_s``), so one sent while the
lease held is answered, or abandoned, before anyone may take over. The single-writer lease of a
WAL directory (``.writer.lease``) is renewed and taken over the same way (conditional on the
version read; the holder fences itself at the margin), its expiry read on the holders' clocks.

Readers do the rest: a write of an old epoch that lands anyway (a request held in the network
past every timeout) is ignored or replaced by what the current epoch wrote (the checkpoint
reader, the batch log and snapshot clean-up compare epochs: see their modules).

Transient faults of remote stores (5xx, SlowDown, resets, timeouts) are retried by
:mod:`sparkwal.wal.retry` under a per-operation deadline; on S3 each attempt is one request (botocore's and
s3fs's own retries off, timeouts of half the deadline). ``faulty+file://`` is the local storage
failing on command, for tests and drills (:mod:`sparkwal.wal.disk_faults`).
"""

from __future__ import annotations

import json

from .append_files import AppendFile
from .backends import FileInfo, FsspecStorage, LocalStorage, Storage
from .location import StorageLocation, resolve_url, s3_defaults
from .locks import (LEADER_EPOCH, LEADER_LEASES, LEADER_LOCK, LEASE_FILE, LOCK_FILE, LeaderInfo,
                    Leadership, Lock, WriterInfo)

__all__ = ["AppendFile", "FileInfo", "FsspecStorage", "LEADER_EPOCH", "LEADER_LEASES", "LEADER_LOCK",
           "LEASE_FILE", "LOCK_FILE", "LeaderInfo", "Leadership", "LocalStorage", "Lock", "Storage",
           "StorageLocation", "WriterInfo", "parse_storage_options", "resolve", "resolve_url", "s3_defaults"]


def parse_storage_options(pairs: list[str] | None) -> dict | None:
    """``["key=value", ...]`` (command lines' ``--storage-option``) as fsspec options; a value that
    looks like JSON (``{...}``, ``[...]``, true/false) is decoded. ValueError names a bad pair."""
    options: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option takes key=value, got {pair!r}")
        options[key] = json.loads(value) if value[:1] in "{[" or value in ("true", "false") else value
    return options or None


def resolve(url: str | StorageLocation, storage_options: dict | None = None) -> tuple[Storage, str]:
    """Map a path, URL or :class:`~sparkwal.wal.location.StorageLocation` to ``(storage, path inside
    that storage)`` (a location's storage is resolved once and kept)."""
    if isinstance(url, StorageLocation):
        return StorageLocation.of(url, storage_options).resolve()
    return resolve_url(url, storage_options)
