"""FileBasedWriteAheadLog: a time-rolled, checksummed, fsync'd log of segment files on any storage.

Spark's ``FileBasedWriteAheadLog`` (segment naming, rolling, cleaning), improved: every record carries a
CRC32C (format in :mod:`sparkwal.wal.segment`): a torn tail is cut off when a writer opens the log, corruption
anywhere else is a loud :class:`CorruptRecordError`; ``write`` is durable on return (``fdatasync``;
:class:`~sparkwal.wal.base.Durability`); a writer never appends to a segment it did not create (each starts a
fresh one at ``max(time, newest start + 1)``, so names are unique and increasing even when two writes share a
millisecond: Spark re-opened the same name); a failed write cuts the segment back to its last good record
before retrying on a new one (no garbage between valid records); one writer per directory (an OS lock, or a
lease object on object stores).
"""

from __future__ import annotations

import logging
import os
import threading
from time import perf_counter as _perf_counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate

from crc32c import crc32c

from .append_files import MappedAppendFile
from .base import Durability, RecordHandle, WalStatistics, WriteAheadLog
from .clock import SYSTEM_CLOCK, Clock
from .errors import CorruptRecordError, FencedError, LogLockedError, StorageUnavailableError, WalError
from .segment import (FRAME_HEADER, FRAME_HEADER_LEN, HEADER, HEADER_LEN, LEN_CRC, MAX_RECORD,
                      ScanResult, SegmentName, encode_frames, frame_header, iter_segment,
                      parse_segment_name, segment_file_name)
from .segment_reads import read_record, read_segments
from .storage import AppendFile, Lock, Storage, StorageLocation, resolve

log = logging.getLogger(__name__)

#: From this payload size a single-record write hands the header and the payload to one
#: ``writev`` instead of joining them (a copy that costs more than the second iovec).
_WRITEV_MIN = 4096
# hot-path names bound once (a global or attribute lookup per record is measurable here)
_FRAME_HEADER_PACK, _LEN_CRC_PACK = FRAME_HEADER.pack, LEN_CRC.pack
_os_write, _os_writev, _os_fdatasync = os.write, os.writev, os.fdatasync
_new_handle = tuple.__new__  # RecordHandle(...) without the NamedTuple's Python-level __new__


class _Counters:
    """The mutable counters behind ``statistics()`` (updated under the log's lock)."""

    def __init__(self) -> None:
        self.records_written = self.bytes_written = self.writes = self.syncs = 0
        self.segments_created = self.segments_deleted = self.write_failures = self.delete_failures = 0
        self.torn_tails_truncated = self.torn_bytes_truncated = 0
        self.sync_seconds = 0.0  #: time spent in durability barriers


class FileBasedWriteAheadLog(WriteAheadLog):
    """A write-ahead log in ``log_dir`` (a local path or any fsspec URL).

    Constructing or reading a log creates nothing; the first write takes the directory's
    single-writer lock (:class:`LogLockedError` at once if another writer holds it), truncates a
    torn tail left by a crash, and opens a new segment.

    ``close_file_after_write=True`` publishes each write (or group) as its own segment object in one
    atomic create; None (the default) chooses it where the store cannot append (object stores).
    """

    def __init__(self, log_dir: str | StorageLocation, *, rolling_interval_s: float = 60, max_failures: int = 3,
                 close_file_after_write: bool | None = None, storage_options: dict | None = None,
                 clock: Clock | None = None, durability: Durability | str = Durability.FSYNC, lease_s: float = 60,
                 lock: Lock | None = None):
        if rolling_interval_s <= 0:
            raise ValueError(f"rolling_interval_s must be > 0, got {rolling_interval_s}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        self.log_dir = str(log_dir)
        self._storage: Storage
        self._storage, self._dir = resolve(log_dir, storage_options)
        if close_file_after_write is None:
            close_file_after_write = not self._storage.supports_append
        if not close_file_after_write and not self._storage.supports_append:
            raise WalError(f"{log_dir}: this store cannot append to files; use close_file_after_write=True "
                           "(one object per write or group)")
        self._interval_ms = int(rolling_interval_s * 1000)
        self._max_failures = max_failures
        self._close_after_write = close_file_after_write
        self._clock = clock or SYSTEM_CLOCK
        self._durability = Durability(durability)
        self._fsync = self._durability is Durability.FSYNC
        self._lease_ms = int(lease_s * 1000)
        #: a lock the caller holds over a directory containing this one (a driver's leadership of
        #: its checkpoint directory): used instead of taking this directory's own, never released
        self._outer_lock = lock

        self._lock = threading.RLock()
        self._segments: list[SegmentName] = self._list_segments()
        self._last_start = self._segments[-1].start_ms if self._segments else -1
        self._writer: AppendFile | None = None
        self._writer_fd: int | None = None  # set when ``write`` may take the local fast path
        self._mapped_writer: MappedAppendFile | None = None  # set when it may copy into a memory map
        self._writer_end = -1
        self._dir_lock: Lock | None = None
        self._closed = False
        self._delete_pool: ThreadPoolExecutor | None = None
        self._stats = _Counters()
        self._fast_records, self._fast_bytes, self._fast_sync_s = 0, 0, 0.0  # by the fast path (one write each)

    # ---------------------------------------------------------------- listing

    def _list_segments(self) -> list[SegmentName]:
        out = []
        for info in self._storage.list_files(self._dir):
            parsed = parse_segment_name(info.name)
            if parsed is not None:
                out.append(SegmentName(parsed[0], parsed[1], info.path))
        out.sort()
        return out

    def segment_paths(self) -> list[str]:
        """Paths of the segments currently in the log, oldest first."""
        with self._lock:
            return [s.path for s in self._segments]

    # ---------------------------------------------------------------- writing

    def write(self, data: bytes, time_ms: int) -> RecordHandle:
        n = len(data)
        if n > MAX_RECORD:
            raise WalError(f"record of {n} bytes exceeds the {MAX_RECORD}-byte limit")
        pcrc = crc32c(data)
        head = _FRAME_HEADER_PACK(n, pcrc, crc32c(_LEN_CRC_PACK(n, pcrc)))
        with self._lock:
            w = self._mapped_writer
            if w is not None and time_ms <= self._writer_end:
                # Fastest path (durability "flush", local): copy the frame into the segment's
                # memory map, no system call; the OS has the bytes once the copy ends.
                offset = w.size
                end = offset + FRAME_HEADER_LEN + n
                m = w.map
                if end <= w.capacity and m is not None:
                    if n < _WRITEV_MIN:
                        m[offset:end] = head + data
                    else:
                        m[offset:offset + FRAME_HEADER_LEN] = head
                        m[offset + FRAME_HEADER_LEN:end] = data
                    w.size = end
                    self._fast_records += 1
                    self._fast_bytes += n
                    return _new_handle(RecordHandle, (w.path, offset, n))
            fd, writer = self._writer_fd, self._writer
            # Fast path, most writes: one os.write of the frame into the open local segment. It
            # is the whole per-record cost that matters here, so the frame, the write and the
            # handle are inlined; anything else (a roll, a lease to renew, a short or failed
            # write, another store) goes through the general path with its retries.
            if fd is not None and writer is not None and time_ms <= self._writer_end:
                offset = writer.size
                error: OSError | None = None
                try:
                    if n < _WRITEV_MIN:
                        written = _os_write(fd, head + data)
                    else:  # no copy of a large payload into a joined frame
                        written = _os_writev(fd, (head, data))
                except OSError as exc:
                    written, error = -1, exc
                if written == n + FRAME_HEADER_LEN:
                    writer.size = offset + written
                    if self._fsync:
                        try:
                            began = _perf_counter()
                            _os_fdatasync(fd)
                            self._fast_sync_s += _perf_counter() - began
                        except OSError as exc:
                            self._abandon_writer(offset)
                            self._write_failed(exc, 1, 1, time_ms)
                            return self._write(head + data, [0], [n], time_ms, first_attempt=2)[0]
                    self._fast_records += 1
                    self._fast_bytes += n
                    return _new_handle(RecordHandle, (writer.path, offset, n))
                # a short or failed write: cut it off, then the general path retries
                self._abandon_writer(offset)
                self._write_failed(error or OSError(f"short write ({written} of "
                                                    f"{n + FRAME_HEADER_LEN} bytes)"), 1, 1, time_ms)
                return self._write(head + data, [0], [n], time_ms, first_attempt=2)[0]
        return self._write(head + data, [0], [n], time_ms)[0]

    def write_many(self, records: Sequence[bytes], time_ms: int) -> list[RecordHandle]:
        """Write ``records`` with one write and one sync (one durable write for all), each in its
        own frame with its own handle, in the same order."""
        if not records:
            return []
        frames, offsets = encode_frames(records)
        return self._write(frames, offsets, list(map(len, records)), time_ms)

    def prepare(self, data: bytes) -> bytes:
        """The record's whole frame (header + payload), built on the caller's thread."""
        return frame_header(data) + data

    def write_prepared(self, prepared: list, time_ms: int) -> list[RecordHandle]:
        lengths = [len(f) - FRAME_HEADER_LEN for f in prepared]
        offsets = [0, *accumulate(map(len, prepared))][:-1]
        return self._write(b"".join(prepared), offsets, lengths, time_ms)

    def _write(self, frames: bytes, offsets: list[int], lengths: list[int], time_ms: int,
               first_attempt: int = 1) -> list[RecordHandle]:
        with self._lock:
            if self._closed:
                raise WalError(f"{self.log_dir}: write after close()")
            for attempt in range(first_attempt, self._max_failures + 1):
                try:
                    (self._dir_lock or self._open_for_writing()).check()
                    if self._close_after_write:
                        path, base = self._publish_segment(frames, time_ms), HEADER_LEN
                    else:
                        path, base = self._append(frames, time_ms)
                except (LogLockedError, FencedError, CorruptRecordError, StorageUnavailableError):
                    raise  # another writer, damage, a store retried till its deadline: not again
                except Exception as exc:  # noqa: BLE001  Spark's maxFailures: retried, the last one raised
                    self._write_failed(exc, attempt, len(lengths), time_ms)
                    continue
                s = self._stats
                s.records_written += len(lengths)
                s.bytes_written += sum(lengths)
                s.writes += 1
                return [_new_handle(RecordHandle, (path, base + o, n))
                        for o, n in zip(offsets, lengths, strict=True)]
        raise AssertionError("unreachable")

    def _write_failed(self, exc: Exception, attempt: int, records: int, time_ms: int) -> None:
        """Count and log a failed attempt; raise once it was the last one."""
        self._stats.write_failures += 1
        log.warning("WAL write to %s failed (attempt %d of %d): %s",
                    self.log_dir, attempt, self._max_failures, exc)
        if attempt >= self._max_failures:
            raise WalError(
                f"{self.log_dir}: write of {records} record(s) at time {time_ms} "
                f"failed after {attempt} attempt(s): {exc}"
            ) from exc

    def _append(self, frames: bytes, time_ms: int) -> tuple[str, int]:
        writer = self._writer
        if writer is None or time_ms > self._writer_end:
            writer = self._roll(time_ms)
        good_size = writer.size
        try:
            base = writer.append(frames)
            if self._fsync:
                began = _perf_counter()
                writer.sync()
                self._stats.sync_seconds += _perf_counter() - began
                self._stats.syncs += 1
        except BaseException:
            self._abandon_writer(good_size)
            raise
        return writer.path, base

    def _next_segment(self, time_ms: int) -> tuple[int, int, str]:
        start = max(time_ms, self._last_start + 1)
        end = start + self._interval_ms
        return start, end, self._storage.join(self._dir, segment_file_name(start, end))

    def _roll(self, time_ms: int) -> AppendFile:
        self._seal_writer()
        start, end, path = self._next_segment(time_ms)
        self._last_start = start  # even if creation fails, never reuse the name
        # "flush" needs only the OS to have the bytes: a memory map gives it that with no
        # system call per record (sealed segments are still synced)
        writer = self._storage.create_append(path, mapped=not self._fsync)
        try:
            writer.append(HEADER)
        except BaseException:
            writer.close()
            self._storage.delete(path)
            raise
        self._writer, self._writer_end = writer, end
        # the fast path needs a plain descriptor and a lock that cannot be lost while held
        fast = self._dir_lock is not None and not self._dir_lock.needs_check
        self._writer_fd = writer.fileno() if fast else None
        self._mapped_writer = None
        if fast and isinstance(writer, MappedAppendFile) and writer.map is not None:
            self._mapped_writer = writer
        self._segments.append(SegmentName(start, end, path))
        self._stats.segments_created += 1
        return writer

    def _publish_segment(self, frames: bytes, time_ms: int) -> str:
        while True:
            start, end, path = self._next_segment(time_ms)
            self._last_start = start
            began = _perf_counter()
            if self._storage.put_if_absent(path, HEADER + frames):
                break
            log.warning("segment %s already exists; trying the next millisecond", path)
        self._segments.append(SegmentName(start, end, path))
        self._stats.sync_seconds += _perf_counter() - began  # an object PUT: its durability barrier
        self._stats.syncs += 1
        self._stats.segments_created += 1
        return path

    def _seal_writer(self) -> None:
        writer, self._writer, self._writer_fd = self._writer, None, None
        self._mapped_writer = None
        if writer is None:
            return
        try:
            if self._durability is not Durability.FSYNC:
                writer.sync()  # sealed segments are always on stable storage
                self._stats.syncs += 1
        finally:
            writer.close()

    def _abandon_writer(self, good_size: int) -> None:
        """After a failed append: cut the segment back to its last good record, then drop it."""
        writer, self._writer, self._writer_fd = self._writer, None, None
        self._mapped_writer = None
        if writer is None:
            return
        try:
            writer.truncate(good_size)
        except Exception:
            log.error("could not truncate %s back to %d bytes after a failed write; the segment "
                      "may end with a partial record", writer.path, good_size, exc_info=True)
        try:
            writer.close()
        except Exception:
            log.warning("closing %s failed", writer.path, exc_info=True)

    def _open_for_writing(self) -> Lock:
        """Take the directory lock, then repair the newest segment's torn tail if there is one."""
        if self._outer_lock is not None:
            self._storage.makedirs(self._dir)
        dir_lock = self._outer_lock or self._storage.lock(self._dir, clock=self._clock, lease_ms=self._lease_ms)
        try:
            self._segments = self._list_segments()
            if self._segments:
                self._last_start = max(self._last_start, self._segments[-1].start_ms)
                self._repair_tail(self._segments[-1])
        except BaseException:
            if dir_lock is not self._outer_lock:
                dir_lock.release()
            raise
        self._dir_lock = dir_lock
        return dir_lock

    def _repair_tail(self, seg: SegmentName) -> None:
        result = ScanResult()
        with self._storage.open_read(seg.path) as f:
            for _ in iter_segment(f, seg.path, newest=True, result=result):
                pass
        if not result.torn_bytes and result.header_ok:
            return  # (an empty file, killed before its header, is torn too: no byte of it is valid)
        self._stats.torn_tails_truncated += 1
        self._stats.torn_bytes_truncated += result.torn_bytes
        if result.valid_end <= HEADER_LEN and result.records == 0:
            log.warning("removing %s: it holds no complete record (%d torn bytes)",
                        seg.path, result.torn_bytes)
            self._storage.delete(seg.path)
            self._segments.pop()
        else:
            log.warning("truncating torn tail of %s: %d bytes after offset %d",
                        seg.path, result.torn_bytes, result.valid_end)
            self._storage.truncate(seg.path, result.valid_end)

    # ---------------------------------------------------------------- reading

    def read(self, handle: RecordHandle) -> bytes:
        """The record at ``handle``: one ``pread`` of its frame, both CRCs checked."""
        if self._closed:
            raise WalError(f"{self.log_dir}: read after close()")
        return read_record(self._storage, handle)

    def read_all(self) -> Iterator[bytes]:
        """Every record in the log, oldest segment first. Lazy; safe to run while writing."""
        if self._closed:
            raise WalError(f"{self.log_dir}: read_all after close()")
        with self._lock:
            # the writer knows its segments (minus those it is deleting); a reader looks
            segments = list(self._segments) if self._dir_lock is not None else self._list_segments()
        return read_segments(self._storage, segments, parallel=self._close_after_write)

    # ---------------------------------------------------------------- cleaning

    def clean(self, thresh_time_ms: int, wait_for_completion: bool = False) -> None:
        with self._lock:
            current = self._writer.path if self._writer is not None else None
            if self._dir_lock is None:  # a reader instance: see what is there now
                self._segments = self._list_segments()
            victims = [s for s in self._segments if s.end_ms < thresh_time_ms and s.path != current]
            if not victims:
                return
            gone = {s.path for s in victims}
            self._segments = [s for s in self._segments if s.path not in gone]
            if not wait_for_completion and not self._closed:
                if self._delete_pool is None:
                    self._delete_pool = ThreadPoolExecutor(4, thread_name_prefix="wal-clean")
                for seg in victims:
                    self._delete_pool.submit(self._delete_segment, seg)
                return
        for seg in victims:
            self._delete_segment(seg)

    def _delete_segment(self, seg: SegmentName) -> None:
        try:
            self._storage.delete(seg.path)
        except Exception as e:  # noqa: BLE001  a later clean deletes it; WARNING and the statistics say so
            log.warning("could not delete WAL segment %s: %s", seg.path, e)
            with self._lock:
                self._stats.delete_failures += 1
            return
        with self._lock:
            self._stats.segments_deleted += 1

    # ---------------------------------------------------------------- lifecycle

    def statistics(self) -> WalStatistics:
        with self._lock:
            counts = dict(vars(self._stats))
            fast = self._fast_records
            counts["records_written"] += fast
            counts["bytes_written"] += self._fast_bytes
            counts["writes"] += fast
            counts["syncs"] += fast if self._fsync else 0
            counts["sync_seconds"] += self._fast_sync_s
            return WalStatistics(**counts, segments=len(self._segments))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._delete_pool = self._delete_pool, None
            try:
                self._seal_writer()
            finally:
                if self._dir_lock is not None:
                    if self._dir_lock is not self._outer_lock:
                        self._dir_lock.release()
                    self._dir_lock = None
        if pool is not None:
            pool.shutdown(wait=True)
        self._storage.close()

    def __repr__(self) -> str:
        return f"FileBasedWriteAheadLog({self.log_dir!r})"
