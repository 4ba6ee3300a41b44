"""A checkpoint's code part: the program's pickled DStream graph, kept apart from its data part.

A DStream checkpoint (``checkpoint-<ms>``, :mod:`sparkwal.checkpoint.checkpoint_file`) is data only and names the
code part it goes with, so inspecting, verifying and code-free recovery (``upgrade=True``) never
execute code. The code part is written once per program run, when the context starts, as
``code-<sha>`` in the checkpoint directory (``<sha>``: the first 16 hex digits of the SHA-256 of
the pickled bytes, so the same program writes the same name again and a changed one a new name).

File layout, format version 1 (integers big-endian)::

    "SWCODE" (6 bytes)  version:u16 (=1)  body_length:u64  body_crc32c:u32  body_sha256 (32 bytes)  body

``body`` is opaque here (the engine pickles it with pyspark's cloudpickle and unpickles it only to
recover); this module never unpickles. Created with the storage seam's atomic create-if-absent, so
a reader sees the whole file or none; the CRC and the SHA-256 (which the name also carries) make
a damaged or substituted file detectable. A run deletes the code parts of earlier runs once every
checkpoint file that could name them is gone (:func:`delete_code_parts_except`), since a restart
may fall back to an older checkpoint until then. Like a pickle, recovering from a code part runs
the code in it: a checkpoint directory must be trusted like the program itself.
"""

from __future__ import annotations

import hashlib
import re
import struct

from crc32c import crc32c

from sparkwal.wal.storage import StorageLocation, resolve

from .envelope import open_envelope
from .errors import CheckpointError, MissingCodePartError
from .layout import CODE_PREFIX

MAGIC = b"SWCODE"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">6sHQI32s")
CODE_FILE = re.compile(r"code-([0-9a-f]{16})")


def code_name(body: bytes) -> str:
    """The file name of the code part holding ``body``."""
    return f"{CODE_PREFIX}{hashlib.sha256(body).hexdigest()[:16]}"


def encode_code(body: bytes) -> bytes:
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(body), crc32c(body), hashlib.sha256(body).digest()) + body


def decode_code(blob: bytes, path: str = "<bytes>") -> bytes:
    """The body of a code part, verified; CheckpointError says what is wrong with the file."""
    fields, body = open_envelope(blob, path, _HEADER, MAGIC, FORMAT_VERSION, "code part",
                                 length_at=2, crc_at=3)
    if hashlib.sha256(body).digest() != fields[4]:
        raise CheckpointError(f"{path}: checksum mismatch")
    return body


def write_code(directory: str | StorageLocation, body: bytes, storage_options: dict | None = None) -> str:
    """Store ``body`` as the code part of ``directory`` (once: an existing file of the same name
    holds the same bytes); return its file name."""
    storage, root = resolve(directory, storage_options)
    storage.makedirs(root)
    name = code_name(body)
    storage.put_if_absent(storage.join(root, name), encode_code(body))
    return name


def read_code(directory: str, name: str, storage_options: dict | None = None) -> bytes:
    """The verified body of code part ``name`` in ``directory``."""
    if not CODE_FILE.fullmatch(name):
        raise CheckpointError(f"{directory}: {name!r} is not a code part name")
    storage, root = resolve(directory, storage_options)
    path = storage.join(root, name)
    try:
        blob = storage.read_file(path)
    except FileNotFoundError:
        raise MissingCodePartError(f"{storage.url(path)}: the code part named by the checkpoint is "
                                   "missing") from None
    body = decode_code(blob, storage.url(path))
    if code_name(body) != name:
        raise CheckpointError(f"{storage.url(path)}: its content does not match its name")
    return body


def delete_code_parts_except(directory: str | StorageLocation, name: str,
                             storage_options: dict | None = None) -> list[str]:
    """Delete every code part of ``directory`` but ``name``; returns the names deleted."""
    storage, root = resolve(directory, storage_options)
    deleted = []
    for info in storage.list_files(root):
        if CODE_FILE.fullmatch(info.name) and info.name != name:
            storage.delete(info.path)
            deleted.append(info.name)
    return deleted
