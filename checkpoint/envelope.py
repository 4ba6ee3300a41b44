"""The checked envelope of sparkwal's own checkpoint files (DStream checkpoints, code parts): a
header that starts with a magic and a format version and carries the body's length and CRC32C.
Each format describes its header in its own module; this checks what they share."""

from __future__ import annotations

import struct

from crc32c import crc32c

from .errors import CheckpointError


def open_envelope(blob: bytes, path: str, header: struct.Struct, magic: bytes, version: int,
                  what: str, length_at: int, crc_at: int) -> tuple[tuple, bytes]:
    """The header fields and the body of ``blob`` once its magic, version (at most
    ``version``), length and CRC32C check out; else CheckpointError saying what is wrong."""
    if len(blob) < header.size:
        raise CheckpointError(f"{path}: truncated ({len(blob)} bytes, header needs {header.size})")
    fields = header.unpack_from(blob)
    if fields[0] != magic:
        raise CheckpointError(f"{path}: not a sparkwal {what} (magic {fields[0]!r})")
    if fields[1] > version:
        raise CheckpointError(f"{path}: {what} format version {fields[1]} is newer than this "
                              f"sparkwal reads ({version}); upgrade sparkwal")
    body = blob[header.size:]
    if len(body) != fields[length_at]:
        raise CheckpointError(f"{path}: truncated body ({len(body)} of {fields[length_at]} bytes)")
    if crc32c(body) != fields[crc_at]:
        raise CheckpointError(f"{path}: checksum mismatch")
    return fields, body
