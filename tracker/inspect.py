"""Which received blocks a block tracker's WAL still names, read without a lock: what a restart
would replay (an inspector's question: is every block a kept batch needs still readable?)."""

from __future__ import annotations

from dataclasses import dataclass

from sparkwal.wal.inspect import iter_records

from .events import (BatchAllocationEvent, BatchCleanupEvent, BlockAdditionEvent, EventFormatError,
                     ReceivedBlockInfo, decode_event)


@dataclass(frozen=True)
class NamedBlock:
    block: ReceivedBlockInfo
    batch_ms: int | None  #: the batch it is allocated to; None: not allocated yet


def named_blocks(log_url: str, storage_options: dict | None = None) -> list[NamedBlock]:
    """The blocks the tracker's WAL at ``log_url`` names that a restart still reads: allocated
    to a batch not cleaned up, or not allocated yet (Spark's ``ReceivedBlockTracker`` replay:
    an allocation takes every block added before it; a cleanup forgets its batches). Records
    that do not read back, or are not tracker events, are skipped (``wal verify`` names them)."""
    unallocated: list[ReceivedBlockInfo] = []
    allocated: dict[int, list[ReceivedBlockInfo]] = {}
    for _segment, _offset, payload in iter_records(log_url, storage_options):
        try:
            event = decode_event(payload)
        except EventFormatError:
            continue
        if isinstance(event, BlockAdditionEvent):
            unallocated.append(event.block)
        elif isinstance(event, BatchAllocationEvent):
            allocated[event.time_ms] = [b for blocks in event.blocks.values() for b in blocks]
            unallocated.clear()
        elif isinstance(event, BatchCleanupEvent):
            for t in event.times_ms:
                allocated.pop(t, None)
    return ([NamedBlock(b, t) for t, blocks in sorted(allocated.items()) for b in blocks]
            + [NamedBlock(b, None) for b in unallocated])
