"""Received blocks and the three tracker events, and their encoding in the driver's WAL.

Each WAL record is one event, a msgpack array (flat and iterative, so a 100,000-block allocation is
just a long list; language-neutral, no pickle)::

    [1, 1, block]                                   BlockAdditionEvent
    [1, 2, time_ms, [[stream_id, [block, ...]], ...]]   BatchAllocationEvent
    [1, 3, [time_ms, ...]]                          BatchCleanupEvent

    block := [stream_id, num_records | nil, block_id, [path, offset, length] | nil, metadata | nil]

The first element is the format version (1). ``metadata`` is whatever msgpack-serialisable value
the receiver attached. ``is_block_id_valid`` is not stored: it describes the memory of the running
driver, and recovery clears it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from sparkwal.wal import RecordHandle

from .input_info import TrackerError

FORMAT_VERSION = 1
ADD, ALLOC, CLEAN = 1, 2, 3  #: the event kinds, second element of every record
_tuple_new = tuple.__new__
_object_new = object.__new__


class EventFormatError(TrackerError, ValueError):
    """A WAL record that is not a tracker event this version understands."""


@dataclass(slots=True)
class ReceivedBlockInfo:
    """A block a receiver stored: where its data lives and how many records it holds.

    ``is_block_id_valid`` is True while the block may still be in executors' memory; recovery
    clears it so readers go straight to the WAL. It is not part of equality.
    """

    stream_id: int
    num_records: int | None
    block_id: str
    wal_handle: RecordHandle | None = None
    metadata: Any = None
    is_block_id_valid: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if self.num_records is not None and self.num_records < 0:
            raise ValueError(f"num_records must be >= 0, got {self.num_records} for {self.block_id}")

    def set_block_id_invalid(self) -> None:
        self.is_block_id_valid = False

    def to_raw(self) -> list:
        """The encoded list of the layout above (:func:`block_from_raw` reads it back)."""
        h = self.wal_handle
        return [self.stream_id, self.num_records, self.block_id,
                None if h is None else [h[0], h[1], h[2]], self.metadata]


def block_from_raw(v: list) -> ReceivedBlockInfo:
    """A block from its encoded list (see the layout above). Recovery builds a million of these,
    so this skips the dataclass ``__init__`` (the values were validated when first added)."""
    h = v[3]
    if h is not None:
        if len(h) != 3:
            raise EventFormatError(f"bad WAL handle {h!r} in block {v[2]!r}")
        h = _tuple_new(RecordHandle, h)
    info = _object_new(ReceivedBlockInfo)
    info.stream_id, info.num_records, info.block_id = v[0], v[1], v[2]
    info.wal_handle, info.metadata, info.is_block_id_valid = h, v[4], True
    return info



@dataclass(frozen=True)
class BlockAdditionEvent:
    block: ReceivedBlockInfo


@dataclass(frozen=True)
class BatchAllocationEvent:
    time_ms: int
    blocks: dict[int, list[ReceivedBlockInfo]]  #: stream id -> blocks, every configured stream


@dataclass(frozen=True)
class BatchCleanupEvent:
    times_ms: list[int]


Event = BlockAdditionEvent | BatchAllocationEvent | BatchCleanupEvent


def encode_event(event: Event) -> bytes:
    if isinstance(event, BlockAdditionEvent):
        body = [FORMAT_VERSION, ADD, event.block.to_raw()]
    elif isinstance(event, BatchAllocationEvent):
        body = [FORMAT_VERSION, ALLOC, event.time_ms,
                [[sid, [b.to_raw() for b in blocks]] for sid, blocks in event.blocks.items()]]
    elif isinstance(event, BatchCleanupEvent):
        body = [FORMAT_VERSION, CLEAN, list(event.times_ms)]
    else:
        raise TypeError(f"not a tracker event: {event!r}")
    return msgpack.packb(body, use_bin_type=True)


def decode_raw(data: bytes) -> list:
    """An event's encoded list after checking its version: ``[version, kind, ...]``. Recovery
    works on these directly; ``decode_event`` builds the event objects."""
    try:
        v = msgpack.unpackb(data, raw=False, strict_map_key=False)
        version = v[0]
        v[1]  # noqa: B018  (the kind must be there)
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as e:
        raise EventFormatError(f"undecodable tracker event ({e})") from None
    if version != FORMAT_VERSION:
        raise EventFormatError(f"tracker event format version {version} is not supported "
                               f"(this sparkwal reads version {FORMAT_VERSION})")
    return v


def decode_event(data: bytes) -> Event:
    v = decode_raw(data)
    kind = v[1]
    if kind == ADD:
        return BlockAdditionEvent(block_from_raw(v[2]))
    if kind == ALLOC:
        return BatchAllocationEvent(v[2], {sid: [block_from_raw(b) for b in blocks] for sid, blocks in v[3]})
    if kind == CLEAN:
        return BatchCleanupEvent(list(v[2]))
    raise EventFormatError(f"unknown tracker event kind {kind}")
