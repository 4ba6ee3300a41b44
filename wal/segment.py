"""On-disk format of a WAL segment, and the scanner that reads, verifies and recovers it.

Segment files are named ``log-<startMs>-<endMs>`` (decimal epoch milliseconds, ``end = start +
rolling interval``). The name grammar is exact: only regular files whose whole name matches are
segments; anything else in the directory (``.writer.lock``, temp files, sub-directories) is ignored.

Layout, format version 1 (all integers unsigned big-endian)::

    segment := header frame*
    header  := "SWAL" (4 bytes)  version:u16 (=1)  header_length:u16 (=8)
    frame   := length:u32  payload_crc:u32  header_crc:u32  payload[length]

    payload_crc = CRC32C(payload)
    header_crc  = CRC32C(length:u32 || payload_crc:u32)

A :class:`~sparkwal.wal.base.RecordHandle` ``(path, offset, length)`` points at the frame start and names the
payload length, so a random read is one ``pread`` of ``12 + length`` bytes and two CRC checks.

Why a header CRC: it lets the reader tell a *corrupt length* from a *torn tail*. When a frame fails,
the scanner asks whether any valid frame follows it in the same file (a frame passes both CRCs):

* no valid frame follows, and the file is the newest segment -> a torn tail (a write cut short by a
  crash); readers stop there silently and the next writer truncates it;
* otherwise -> :class:`~sparkwal.wal.errors.CorruptRecordError` naming the file and byte offset. Sealed
  segments are always fully synced before the next one opens, so they have no legitimate torn tail.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from crc32c import crc32c

from .errors import CorruptRecordError, WalError

MAGIC = b"SWAL"
FORMAT_VERSION = 1
HEADER = struct.pack(">4sHH", MAGIC, FORMAT_VERSION, 8)
HEADER_LEN = len(HEADER)
FRAME_HEADER = struct.Struct(">III")
FRAME_HEADER_LEN = FRAME_HEADER.size
LEN_CRC = struct.Struct(">II")
MAX_RECORD = 0xFFFF_FFFF
READ_CHUNK = 4 << 20

SEGMENT_NAME = re.compile(r"log-(\d+)-(\d+)")
_NONZERO = re.compile(rb"[^\x00]")


@dataclass(frozen=True, order=True)
class SegmentName:
    start_ms: int
    end_ms: int
    path: str


def parse_segment_name(name: str) -> tuple[int, int] | None:
    m = SEGMENT_NAME.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def segment_file_name(start_ms: int, end_ms: int) -> str:
    return f"log-{start_ms}-{end_ms}"


def frame_header(payload: bytes) -> bytes:
    n = len(payload)
    if n > MAX_RECORD:
        raise WalError(f"record of {n} bytes exceeds the {MAX_RECORD}-byte limit")
    head = LEN_CRC.pack(n, crc32c(payload))
    return head + crc32c(head).to_bytes(4, "big")


def encode_frames(payloads) -> tuple[bytes, list[int]]:
    """All frames for ``payloads`` as one buffer, and each frame's offset within it (one loop
    with the framing inlined: this is ``write_many``'s per-record cost)."""
    parts: list[bytes] = []
    offsets: list[int] = []
    add_part, add_offset = parts.append, offsets.append
    pack3, pack2 = FRAME_HEADER.pack, LEN_CRC.pack
    pos = 0
    for p in payloads:
        n = len(p)
        if n > MAX_RECORD:
            raise WalError(f"record of {n} bytes exceeds the {MAX_RECORD}-byte limit")
        pcrc = crc32c(p)
        add_offset(pos)
        add_part(pack3(n, pcrc, crc32c(pack2(n, pcrc))))
        add_part(p)
        pos += FRAME_HEADER_LEN + n
    return b"".join(parts), offsets


def decode_frame(head: bytes, payload: bytes, path: str, offset: int, expected_length: int) -> bytes:
    """Verify a record read at ``offset``: its frame header and payload; return the payload."""
    if len(head) < FRAME_HEADER_LEN:
        raise CorruptRecordError(path, offset, f"record header truncated ({len(head)} bytes)")
    n, pcrc, hcrc = FRAME_HEADER.unpack_from(head, 0)
    if crc32c(head[:8]) != hcrc:
        raise CorruptRecordError(path, offset, "record header checksum mismatch")
    if n != expected_length:
        raise WalError(
            f"{path} at byte offset {offset}: expected a record of {expected_length} bytes, found {n}"
        )
    if len(payload) != n:
        raise CorruptRecordError(path, offset, f"record truncated: {len(payload)} of {n} bytes")
    if crc32c(payload) != pcrc:
        raise CorruptRecordError(path, offset, "payload checksum mismatch")
    return payload


def check_header(head: bytes, path: str) -> str | None:
    """None if ``head`` is a valid segment header, else why not. Newer versions raise."""
    if len(head) < HEADER_LEN:
        return f"segment header truncated ({len(head)} of {HEADER_LEN} bytes)"
    magic, version, hlen = struct.unpack_from(">4sHH", head, 0)
    if magic != MAGIC:
        return f"bad magic {magic!r}: not a sparkwal segment"
    if version > FORMAT_VERSION:
        raise WalError(
            f"{path}: segment format version {version} is newer than this sparkwal "
            f"supports (version {FORMAT_VERSION}); upgrade sparkwal to read it"
        )
    if version == 0 or hlen != HEADER_LEN:
        return f"bad header (version {version}, header length {hlen})"
    return None


def valid_frame_follows(buf: bytes, start: int) -> int | None:
    """Offset (relative to ``buf``) of the first complete, valid frame at or after ``start``."""
    end = len(buf)
    o = start
    unpack = FRAME_HEADER.unpack_from
    while o + FRAME_HEADER_LEN <= end:
        if buf[o] == 0 and buf[o:o + FRAME_HEADER_LEN] == bytes(FRAME_HEADER_LEN):
            m = _NONZERO.search(buf, o)
            if m is None:
                return None
            # a frame may start with zero bytes of its length field: back up to cover that
            o = max(start, m.start() - 3)
            if o + FRAME_HEADER_LEN > end:
                return None
        n, pcrc, hcrc = unpack(buf, o)
        if (crc32c(buf[o:o + 8]) == hcrc and o + FRAME_HEADER_LEN + n <= end
                and crc32c(buf[o + FRAME_HEADER_LEN:o + FRAME_HEADER_LEN + n]) == pcrc):
            return o
        o += 1
    return None


@dataclass
class ScanResult:
    """What a full scan of one segment found."""

    records: int = 0
    valid_end: int = HEADER_LEN  # end of the last good frame (the file size after truncation)
    torn_bytes: int = 0  # bytes past valid_end (0 when the segment ends cleanly)
    header_ok: bool = True
    #: how many of the torn bytes are zeros all through: space a mapped writer reserved ahead of
    #: its records (wal.append_files) and did not cut off (it was killed), not a write cut short
    preallocated: int = 0


def iter_segment(
    f: BinaryIO, path: str, *, newest: bool, result: ScanResult | None = None
) -> Iterator[bytes]:
    """Yield every record payload of the open segment ``f``, verifying each frame.

    A bad frame is a torn tail (stop silently, noted in ``result``) only in the ``newest``
    segment and only if no valid frame follows; otherwise it raises CorruptRecordError.
    """
    res = result if result is not None else ScanResult()
    head = f.read(HEADER_LEN)
    problem = check_header(head, path)
    if problem is not None:
        rest = head + f.read()
        if newest and valid_frame_follows(rest, 0) is None:
            res.header_ok, res.valid_end, res.torn_bytes = False, 0, len(rest)
            return
        raise CorruptRecordError(path, 0, problem)

    buf = b""
    buf_start = HEADER_LEN  # file offset of buf[0]
    pos = blen = 0  # position in buf, len(buf)
    eof = False
    unpack = FRAME_HEADER.unpack_from
    while True:
        if pos + FRAME_HEADER_LEN <= blen:
            n, pcrc, hcrc = unpack(buf, pos)
            if crc32c(buf[pos:pos + 8]) != hcrc:
                _bad_frame(f, path, buf, pos, buf_start, newest, res, "record header checksum mismatch")
                return
            end = pos + FRAME_HEADER_LEN + n
            if end <= blen:
                payload = buf[pos + FRAME_HEADER_LEN:end]
                if crc32c(payload) != pcrc:
                    _bad_frame(f, path, buf, pos, buf_start, newest, res, "payload checksum mismatch")
                    return
                pos = end
                res.records += 1
                yield payload
                continue
            need = end - pos
        else:
            need = FRAME_HEADER_LEN
        if eof:
            if pos == blen:
                res.valid_end = buf_start + pos
                return
            _bad_frame(f, path, buf, pos, buf_start, newest, res,
                       f"record truncated: {blen - pos} bytes left at end of file")
            return
        chunk = f.read(max(READ_CHUNK, need))
        eof = not chunk
        buf_start += pos
        buf = buf[pos:] + chunk
        pos, blen = 0, len(buf)


def _bad_frame(f: BinaryIO, path: str, buf: bytes, pos: int, buf_start: int, newest: bool,
               res: ScanResult, reason: str) -> None:
    offset = buf_start + pos
    rest = buf[pos:] + f.read()
    if newest and valid_frame_follows(rest, 1) is None:
        res.valid_end = offset
        res.torn_bytes = len(rest)
        res.preallocated = len(rest) if _NONZERO.search(rest) is None else 0
        return
    raise CorruptRecordError(path, offset, reason)
