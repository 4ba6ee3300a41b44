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
  (``{"epoch", "holder", "pid", "host", "since_ms"}``, replaced atomically). An flock cannot be
  taken from a live holder, so a local leader is never fenced while it lives.
* object stores: one lease object per epoch, ``<dir>/.leader/epoch-<epoch, 10 digits>`` holding
  ``{"epoch", "owner", "holder", "since_ms", "expires_ms", "released"}`` and, once a taker
  superseded it, ``"superseded_by"`` (the next epoch). Taking over, allowed once the newest object
  expired (or was released), is two conditional requests: the expired object rewritten with
  ``superseded_by`` on the condition that it is still the version read (``put_if_version``: S3's
  ``If-Match``), then the next epoch's object created if absent. The holder renews its own object
  every third of the lease with one conditional PUT on the version it last wrote, so a renewal after
  a takeover is refused and fences it; between renewals it trusts the lease on its own clock, and
  stops writing (fences itself) a fifth of the lease before it would expire unrenewed.

Transient faults of remote stores (5xx, SlowDown, resets, timeouts) are retried by
:mod:`sparkwal.wal.retry` under a per-operation deadline; on S3 each attempt is one request (botocore's and
s3fs's own retries off, timeouts of half the deadline). ``faulty+file://`` is the local storage
failing on command, for tests and drills (:mod:`sparkwal.wal.disk_faults`).
"""

from __future__ import annotations

import json
import os

import fsspec

from . import retry
from .append_files import AppendFile
from .backends import FileInfo, FsspecStorage, LocalStorage, Storage
from .locks import (LEADER_EPOCH, LEADER_LEASES, LEADER_LOCK, LEASE_FILE, LOCK_FILE, LeaderInfo,
                    Leadership, Lock, WriterInfo)

__all__ = ["AppendFile", "FileInfo", "FsspecStorage", "LEADER_EPOCH", "LEADER_LEASES", "LEADER_LOCK",
           "LEASE_FILE", "LOCK_FILE", "LeaderInfo", "Leadership", "LocalStorage", "Lock", "Storage",
           "WriterInfo", "parse_storage_options", "resolve"]


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


def resolve(url: str, storage_options: dict | None = None) -> tuple[Storage, str]:
    """Map a path or URL to ``(storage, path inside that storage)``."""
    if url.startswith("faulty+file://"):  # a local disk that fails on command (wal.disk_faults)
        from .disk_faults import FaultyLocalStorage

        path = os.path.abspath(url[len("faulty+file://"):])
        return FaultyLocalStorage(path), path
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://"):] if url.startswith("file://") else url
        if storage_options:
            raise ValueError(f"storage_options given for local path {url!r}")
        return LocalStorage(), os.path.abspath(path)
    if url.split("://", 1)[0] in ("s3", "s3a"):
        storage_options = s3_defaults(storage_options)
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return FsspecStorage(fs), path.rstrip("/") or "/"


def s3_defaults(storage_options: dict | None) -> dict:
    """The seam's retry loop owns retries (wal.retry): botocore makes one attempt per call, and no
    call waits longer than half the deadline for a connection or an answer (what the caller sets
    in ``config_kwargs`` stays)."""
    options = dict(storage_options or {})
    config = dict(options.get("config_kwargs") or {})
    deadline = retry.default_policy().deadline_s
    config.setdefault("retries", {"max_attempts": 1})
    config.setdefault("connect_timeout", min(10.0, deadline / 2))
    config.setdefault("read_timeout", min(30.0, deadline / 2))
    options["config_kwargs"] = config
    return options
