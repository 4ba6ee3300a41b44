"""The direct-source protocol: partitions with offsets that can be read again by range.

A :class:`ReplayableSource` is asked on the driver which partitions exist and how far each one
goes; a batch is then a planned ``[from, until)`` range per partition, written ahead to the offset
log (:mod:`sparkwal.engine.sources.batch_log`), and read by a task straight from the source. Reading the
same range twice gives the same records: that is what makes a re-run batch after a driver crash
identical to the first run.

Offsets are non-negative integers that only grow (Kafka offsets, line numbers). A partition is a
``(topic, partition)`` pair: Kafka's, or for a :class:`~sparkwal.engine.sources.FileLogSource` its
directory's name and a file name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import NamedTuple
from ..errors import EngineError


class TopicPartition(NamedTuple):
    topic: str
    partition: int | str


class OffsetRange(NamedTuple):
    """One partition's range in one batch (the names of Spark's ``OffsetRange``)."""

    topic: str
    partition: int | str
    fromOffset: int
    untilOffset: int

    def count(self) -> int:  # type: ignore[override]  # Spark's OffsetRange.count(), not tuple.count
        return self.untilOffset - self.fromOffset

    def topicPartition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def range_in_sink(r: OffsetRange, batch_time_ms: int, stored: int | None, stored_batch_ms: int | None) -> bool | None:
    """Whether an exactly-once sink holds batch ``batch_time_ms``'s range ``r`` (with records), by
    the partition's stored end and the time of the batch that stored it: False if the output has
    not begun it (no end, or the end at its start); True if the output ends at its end (whichever
    batch stored it: the records up to it are in, an old driver's on another batch grid too), or
    beyond it where a later batch stored that end (outputs go in batch order, so a re-run of an
    earlier batch after a crash is in); None otherwise, the caller's
    error naming both offsets (a stream behind the sink: explicit ``fromOffsets`` below its end,
    offsets that restarted, two streams sharing a sink name)."""
    if stored is None or stored == r.fromOffset:
        return False
    later = stored_batch_ms is not None and stored_batch_ms > batch_time_ms
    if stored == r.untilOffset or (stored > r.untilOffset and later):
        return True
    return None


class SinkOffsets(dict):
    """An exactly-once sink's stored end offsets (``sink.offsets()``), to pass as
    ``directStream(fromOffsets=...)``. A sink stores the end of every partition each committed
    batch planned, records or not; so once it holds any, a partition it does not hold appeared
    after its last batch (added while the program was down) and starts at its earliest offset, not
    at ``auto.offset.reset``: its records are never skipped. An empty one (the sink never
    committed) leaves every partition to the stream's own reset rule."""

    @property
    def unseen_from_earliest(self) -> bool:
        return bool(self)


class SourceError(EngineError, RuntimeError):
    """A source cannot serve what a batch needs (the message names the partition and offsets)."""


class DataLossError(SourceError):
    """Records a batch planned or a source once offered are gone: a partition removed with
    unread records, offsets that went backwards, or a range no longer readable in full."""


class ReplayableSource(ABC):
    """A partitioned, replayable source. The object is pickled into tasks: keep driver-only
    resources (clients, connections) out of its pickled state and open them lazily."""

    @abstractmethod
    def partitions(self) -> list[TopicPartition]:
        """The partitions that exist now (driver side)."""

    @abstractmethod
    def latest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset after the last available record of each partition (driver side). A
        partition that disappeared meanwhile is left out."""

    def earliest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset still available in each partition: where a partition that appears
        after the stream started is read from."""
        return {tp: 0 for tp in partitions}

    def initial_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Where a stream with no checkpoint and no ``fromOffsets`` starts (default: earliest)."""
        return self.earliest_offsets(partitions)

    @abstractmethod
    def read(self, partition: TopicPartition, from_offset: int, until_offset: int,
             hint=None) -> Iterable:
        """The records of ``[from_offset, until_offset)`` of ``partition``, inside a task. Raise
        :class:`DataLossError` if the range cannot be read in full. ``hint`` is what
        :meth:`read_hint` returned on the driver for this range (None if it had none)."""

    def read_hint(self, partition: TopicPartition, from_offset: int, until_offset: int):
        """Optional driver-side knowledge that speeds up :meth:`read` (e.g. a byte position)."""
        return None

    def parse_partition(self, key: str) -> int | str:
        """A partition from its key in the offset log's JSON (integers by default, as Kafka's)."""
        return int(key)

    def describe(self) -> str:
        """A short name of the source for logs and the graph's fingerprint."""
        return type(self).__name__

    def identity(self) -> str:
        """What the source reads, spelled the same in every version of the program: an upgrade gives
        the checkpoint's offsets to the direct stream of the same identity
        (:mod:`sparkwal.engine.identity`). By default :meth:`describe`."""
        return self.describe()

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release driver-side resources (called when the context stops)."""
