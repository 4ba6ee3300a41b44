"""Durable, atomic writes: fsync'ed temporary files made visible by ``link`` (create-if-absent)
or ``rename`` (replace) on a local filesystem, and their object-store equivalents. The
guarantees are listed in :mod:`sparkwal.wal.storage`."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import threading
import uuid

from .append_files import fsync_dir

log = logging.getLogger(__name__)

#: ``memory://`` is process-local: its create-if-absent is a check and store under this lock.
MEMORY_LOCK = threading.Lock()
_warned_non_atomic: set[str] = set()
_NO_LOCK = contextlib.nullcontext()


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_temp(path: str, data: bytes, sync: bool = True) -> str:
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def local_put_if_absent(path: str, data: bytes, sync: bool = True) -> bool:
    if os.path.lexists(path):
        return False
    tmp = write_temp(path, data, sync)
    try:
        os.link(tmp, path)  # atomic, and refuses to replace an existing name
    except FileExistsError:
        return False
    finally:
        unlink_quietly(tmp)
    if sync:
        fsync_dir(os.path.dirname(path))
    return True


def local_put(path: str, data: bytes) -> None:
    tmp = write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def object_put_if_absent(storage, path: str, data: bytes) -> bool:
    if storage.is_memory:
        with MEMORY_LOCK:
            if storage.fs.exists(path):
                return False
            storage.fs.pipe_file(path, bytes(data))
            return True
    if not storage.atomic_create and storage.protocol not in _warned_non_atomic:
        _warned_non_atomic.add(storage.protocol)
        log.warning("%s:// has no atomic create-if-absent; concurrent writers may race", storage.protocol)
    try:  # a retry after an answer lost comes back "exists": settled by _created_by_us
        storage.retrying("create", path, lambda: storage.fs.pipe_file(path, bytes(data), mode="create"),
                         bounded=True)
    except FileExistsError:
        return _created_by_us(storage, path, data)
    except OSError as e:  # some clients surface HTTP 412 as a generic OSError
        if "412" in str(e) or "pre-condition" in str(e).lower() or "precondition" in str(e).lower():
            return _created_by_us(storage, path, data)
        raise
    finally:
        storage.fs.invalidate_cache(path)
    return True


def _created_by_us(storage, path: str, data: bytes) -> bool:
    """"Already exists" after a create may be our own create: its answer was lost (a connection
    reset after the store took the PUT) and the client retried it. Read it back: the same bytes
    are ours (created: True), so the caller does not write the record a second time elsewhere."""
    try:
        return storage.read_file(path) == bytes(data)
    except OSError:
        return False  # cannot tell: not created (the caller tries another name)


def object_put(storage, path: str, data: bytes) -> None:
    if storage.is_memory:
        with MEMORY_LOCK:
            storage.fs.pipe_file(path, bytes(data))
        return
    storage.retrying("put", path, lambda: storage.fs.pipe_file(path, bytes(data)), bounded=True)
    storage.fs.invalidate_cache(path)


# ------------------------------------------------------------------ versioned objects (leases)


def content_version(data: bytes) -> str:
    """A version where the store has none: the content's digest (a compare-and-swap on content)."""
    return hashlib.md5(bytes(data), usedforsecurity=False).hexdigest()


def _get_object(storage, bucket: str, key: str) -> tuple[bytes, str]:
    from fsspec.asyn import sync

    response = storage.fs.call_s3("get_object", Bucket=bucket, Key=key)
    try:
        return bytes(sync(storage.fs.loop, response["Body"].read)), response["ETag"]
    finally:
        response["Body"].close()


def object_read_versioned(storage, path: str) -> tuple[bytes, str] | None:
    """``(bytes, version)`` of an object in one request (S3: a GET and its ETag); None if absent."""
    if not storage.is_s3:
        with MEMORY_LOCK if storage.is_memory else _NO_LOCK:
            try:
                data = bytes(storage.fs.cat_file(path))
            except FileNotFoundError:
                return None
        return data, content_version(data)
    bucket, key, _ = storage.fs.split_path(path)
    try:
        return storage.retrying("read", path, lambda: _get_object(storage, bucket, key))
    except FileNotFoundError:
        return None


def object_put_if_version(storage, path: str, data: bytes, version: str | None, bounded: bool = False
                          ) -> str | None:
    """Write ``data`` to ``path`` if the object is still at ``version`` (None: if it is absent):
    one conditional PUT on S3 (``If-Match`` / ``If-None-Match: *``). The new version, or None when
    the condition failed. An answer lost to a reset is settled by reading back: our own bytes
    there mean the write was ours."""
    if not storage.is_s3:
        if not storage.is_memory and storage.protocol not in _warned_non_atomic:
            _warned_non_atomic.add(storage.protocol)
            log.warning("%s:// has no conditional put; concurrent writers may race", storage.protocol)
        with MEMORY_LOCK if storage.is_memory else _NO_LOCK:
            try:
                current = content_version(bytes(storage.fs.cat_file(path)))
            except FileNotFoundError:
                current = None
            if current != version:
                return None
            storage.fs.pipe_file(path, bytes(data))
        return content_version(data)
    bucket, key, _ = storage.fs.split_path(path)
    condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}

    def put():
        return storage.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=bytes(data), **condition)["ETag"]
    try:
        return storage.retrying("put", path, put, bounded=bounded)
    except OSError as e:  # a failed condition: s3fs says 412 with EINVAL (404 for If-Match on none)
        if not isinstance(e, (FileExistsError, FileNotFoundError)) and e.errno != errno.EINVAL:
            raise
        now = object_read_versioned(storage, path)
        return now[1] if now is not None and now[0] == bytes(data) else None
    finally:
        storage.fs.invalidate_cache(path)
