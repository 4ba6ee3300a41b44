"""The write-ahead log contract every implementation (and every caller) relies on."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


class RecordHandle(NamedTuple):
    """Where one record lives: the segment ``path``, the ``offset`` of its frame, the payload ``length``.

    A frozen, hashable tuple, so it packs with msgpack as-is; ``to_list()``/``from_list`` convert
    explicitly for callers that embed it in their own records.
    """

    path: str
    offset: int
    length: int

    def to_list(self) -> list:
        return [self.path, self.offset, self.length]

    @classmethod
    def from_list(cls, value: Sequence) -> RecordHandle:
        path, offset, length = value
        return cls(str(path), int(offset), int(length))


class Durability(str, enum.Enum):
    """What "``write`` returned" promises.

    ``FSYNC`` (default): the record is on stable storage (``fdatasync`` of the segment, and of the
    directory when a segment is created); it survives power loss and kernel crashes.

    ``FLUSH``: the record has been handed to the operating system; it survives a crash of the
    process (even ``kill -9``) but not of the machine. Segments are still synced when sealed.
    Object stores ignore the difference: a finished PUT is durable.
    """

    FSYNC = "fsync"
    FLUSH = "flush"


@dataclass(frozen=True)
class WalStatistics:
    records_written: int = 0  #: user records acknowledged
    bytes_written: int = 0  #: payload bytes acknowledged
    writes: int = 0  #: successful durable writes (one per record, or one per group)
    syncs: int = 0  #: durability barriers issued (fsyncs, or object PUTs)
    segments: int = 0  #: segments currently in the log
    segments_created: int = 0
    segments_deleted: int = 0
    write_failures: int = 0  #: failed write attempts (each retried on a fresh segment)
    delete_failures: int = 0
    torn_tails_truncated: int = 0  #: torn tails cut off when a writer opened the log
    torn_bytes_truncated: int = 0
    queued_records: int = 0  #: records waiting for a group commit (batched logs)
    sync_seconds: float = 0.0  #: time spent in those barriers (fsyncs, object PUTs)


class WriteAheadLog(ABC):
    """An append-only log of byte records, each indexed by a time for cleaning.

    ``write`` returns only once the record is durable (see :class:`Durability`); ``read_all``
    yields every record written and not yet cleaned, in write order.
    """

    @abstractmethod
    def write(self, data: bytes, time_ms: int) -> RecordHandle: ...

    def write_many(self, records: Sequence[bytes], time_ms: int) -> list[RecordHandle]:
        """Write several records, each keeping its own handle (same order); implementations make
        them durable with one write and one barrier."""
        return [self.write(r, time_ms) for r in records]

    def write_batch(self, records: Sequence[bytes], time_ms: int) -> list[RecordHandle]:
        """The earlier name of :meth:`write_many` (an alias: override ``write_many``)."""
        return self.write_many(records, time_ms)

    # Group-commit hooks: BatchedWriteAheadLog calls ``prepare`` on each writer's own thread
    # (while it would otherwise just wait) and hands the prepared records of one group to
    # ``write_prepared``, keeping per-record work off its single writer thread.

    def prepare(self, data: bytes) -> Any:
        return data

    def write_prepared(self, prepared: list, time_ms: int) -> list[RecordHandle]:
        return self.write_many(prepared, time_ms)

    @abstractmethod
    def read(self, handle: RecordHandle) -> bytes: ...

    @abstractmethod
    def read_all(self) -> Iterator[bytes]: ...

    @abstractmethod
    def clean(self, thresh_time_ms: int, wait_for_completion: bool = False) -> None:
        """Delete the records older than ``thresh_time_ms`` (whole sealed segments only)."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def statistics(self) -> WalStatistics: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
