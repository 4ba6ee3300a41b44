"""Reading a log's records back: one record by its handle (one ``pread`` of its frame, both
CRCs checked) and every record of a list of segments, oldest first (the frame format is
:mod:`sparkwal.wal.segment`'s)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from crc32c import crc32c

from .base import RecordHandle
from .errors import WalError
from .segment import FRAME_HEADER, FRAME_HEADER_LEN, SegmentName, decode_frame, iter_segment
from .storage import Storage

PARALLEL_READS = 8
_FRAME_HEADER_UNPACK = FRAME_HEADER.unpack_from  # bound once: this is a hot path


def read_record(storage: Storage, handle: RecordHandle) -> bytes:
    """The record at ``handle``; a damaged frame raises an error naming its file and offset."""
    path, offset, length = handle
    try:
        buf = storage.read_range(path, offset, FRAME_HEADER_LEN + length)
    except FileNotFoundError:
        raise WalError(f"cannot read {handle}: segment {path} does not exist "
                       "(cleaned, or written elsewhere)") from None
    if len(buf) == FRAME_HEADER_LEN + length:
        n, pcrc, hcrc = _FRAME_HEADER_UNPACK(buf, 0)
        payload = buf[FRAME_HEADER_LEN:]  # the one copy: it is also what the CRC checks
        if n == length and crc32c(buf[:8]) == hcrc and crc32c(payload) == pcrc:
            return payload
    # something failed: decode_frame names it (file, offset, what)
    return decode_frame(buf[:FRAME_HEADER_LEN], buf[FRAME_HEADER_LEN:], path, offset, length)


def read_segments(storage: Storage, segments: list[SegmentName], parallel: bool) -> Iterator[bytes]:
    """Every record of ``segments`` in order (a torn tail tolerated in the newest only).
    ``parallel``: many small objects (a log on an object store), fetched up to
    :data:`PARALLEL_READS` at once."""
    if parallel and len(segments) > 1:
        return _read_parallel(storage, segments)
    return _read_sequential(storage, segments)


def _read_segment(storage: Storage, seg: SegmentName, newest: bool) -> Iterator[bytes]:
    try:
        f = storage.open_read(seg.path)
    except FileNotFoundError:
        return  # cleaned while we were reading
    with f:
        yield from iter_segment(f, seg.path, newest=newest)


def _read_sequential(storage: Storage, segments: list[SegmentName]) -> Iterator[bytes]:
    last = len(segments) - 1
    for i, seg in enumerate(segments):
        yield from _read_segment(storage, seg, i == last)


def _read_parallel(storage: Storage, segments: list[SegmentName]) -> Iterator[bytes]:
    last = len(segments) - 1

    def fetch(seg: SegmentName, newest: bool) -> list[bytes]:
        return list(_read_segment(storage, seg, newest))

    with ThreadPoolExecutor(PARALLEL_READS, thread_name_prefix="wal-read") as pool:
        futures: list = [pool.submit(fetch, seg, i == last) for i, seg in enumerate(segments[:PARALLEL_READS])]
        for i in range(len(segments)):
            records = futures[i].result()
            nxt = i + PARALLEL_READS
            if nxt <= last:
                futures.append(pool.submit(fetch, segments[nxt], nxt == last))
            futures[i] = None
            yield from records
