"""The task side of :class:`~sparkwal.engine.sinks.KafkaSink`: a partition's elements encoded as
``(key, value)`` bytes in the executor, returned whole when they fit the task's share of the
driver's budget, else left for the driver to fetch alone (one partition at a time)."""

from __future__ import annotations

import random
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, repeat
from operator import length_hint

from ..errors import EngineError

#: a task's result: ``(partition index, kind, payload)``; kind "records" (payload: the list),
#: "big" (over the budget: fetched by a job of its own) or "error" (payload: the message)
RECORDS, BIG, ERROR = "records", "big", "error"
_PER_RECORD_OVERHEAD = 64  # bytes of a pickled (bytes, bytes) pair beyond its contents, about
#: records without a key go to one partition this many at a time, then to another one chosen at random
#: (librdkafka's sticky partitioner switches after ``sticky.partitioning.linger.ms``, 10 ms)
STICKY_RECORDS = 1000
#: records placed and produced at a time by :func:`produce_records` (a whole chunk without keys
#: goes to one partition)
CHUNK = STICKY_RECORDS


class KafkaRecordError(EngineError, TypeError):
    """A stream's element is not a Kafka record (a value, or a ``(key, value)`` pair, of bytes,
    str or None)."""


def encode(element) -> tuple:
    """``(key, value)`` bytes of a stream's element: a value, or a ``(key, value)`` pair; str is UTF-8."""
    key, value = element if isinstance(element, tuple) and len(element) == 2 else (None, element)
    return _bytes(key), _bytes(value)


def _bytes(x):
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    raise KafkaRecordError("a Kafka record is a value or a (key, value) pair of bytes, str or None; "
                           f"got {type(x).__name__}")


def encode_partition(index: int, elements: Iterator, budget_bytes: int | None) -> list[tuple]:
    """The partition's records if their size stays within ``budget_bytes`` (None: no bound)."""
    records, size = [], 0
    try:
        for element in elements:
            key, value = encode(element)
            records.append((key, value))
            if budget_bytes is not None:
                size += len(key or b"") + len(value or b"") + _PER_RECORD_OVERHEAD
                if size > budget_bytes:
                    return [(index, BIG, None)]
    except TypeError as e:
        return [(index, ERROR, str(e))]
    return [(index, RECORDS, records)]


def produce_records(producer, topic: str, elements: Iterable, on_delivery, partitions: int | None,
                    headers: list | None = None) -> int:
    """Every element (a value, or a ``(key, value)`` pair; bytes, str or None) into ``topic``
    through ``producer``, waiting when librdkafka's queue is full; the number produced.

    ``on_delivery`` (:class:`~sparkwal.engine.sinks.kafka_partitions.DeliverySpans`) hears of the
    first and the last record of each partition only: the records are placed here as librdkafka's
    default partitioner (``consistent_random``) places them, the CRC32 of the key modulo
    ``partitions``, records without a key sticking to one partition for :data:`STICKY_RECORDS`
    records at a time (as its sticky partitioner does), and each partition's newest record is held
    back until the next comes, so that the span a transaction wrote costs two Python callbacks per
    partition, not one per record. A failed delivery of a record between them still fails the
    transaction's commit. ``partitions`` None (a partitioner of the user's): librdkafka places the
    records and every one calls ``on_delivery``.

    The records go :data:`CHUNK` at a time, placed and produced by loops that run in C (``map``
    over the chunk, a key's partition computed once per chunk where keys repeat): the Python
    bytecode of a loop per record cost as much as the ``produce`` calls themselves
    (docs/benchmarks.md, "Exactly-once sinks")."""
    out = _Producing(producer, topic, on_delivery, headers)
    if partitions is None:
        for element in elements:
            key, value = element if type(element) is tuple and len(element) == 2 else (None, element)
            out.send(_bytes(key), value, -1, on_delivery)
            out.n += 1
        return out.n
    placer = _Placer(partitions)
    elements = iter(elements)
    while chunk := list(islice(elements, CHUNK)):
        out.chunk(*placer.placed(chunk))
    out.finish()
    return out.n


class _Producing:
    """The held-back records of :func:`produce_records` and its calls of ``produce``."""

    def __init__(self, producer, topic: str, on_delivery, headers: list | None):
        self.producer, self.topic, self.on_delivery, self.n = producer, topic, on_delivery, 0
        # produce's on_delivery, timestamp and headers, positional: as keywords they double produce's cost
        self.extra = () if headers is None else (None, 0, headers)
        self.held: dict[int, tuple | None] = {}  # per partition seen: its newest record, not produced yet

    def send(self, key, value, partition: int, callback) -> None:
        """One record, waiting while librdkafka's queue is full; a value of another type as bytes."""
        while True:
            try:
                self.producer.produce(self.topic, value, key, partition, callback, *self.extra)
                return
            except BufferError:  # librdkafka's queue is full: let it drain
                self.producer.poll(0.05)
            except TypeError:  # librdkafka takes bytes, str and None; anything else is ours to say
                if value is None or type(value) in (bytes, str):
                    raise
                value = _bytes(value)

    def chunk(self, keys: Sequence, values: Sequence, parts: Sequence[int]) -> None:
        """A chunk's records: each partition's held record first, then the chunk in order, the
        first record a partition ever had reporting its delivery, each partition's last held back."""
        size = len(parts)
        self.n += size
        last = dict(zip(parts, range(size)))  # per partition: its last record in the chunk
        special = {i: p for p, i in last.items()}
        for p in last:
            if p not in self.held:
                special[parts.index(p)] = p
            elif (earlier := self.held[p]) is not None:
                self.send(earlier[0], earlier[1], p, None)
                self.held[p] = None
        start = 0
        for i in sorted(special):
            if i > start:
                self.run(keys[start:i], values[start:i], parts[start:i])
            p = parts[i]
            if p not in self.held:  # the partition's first record
                self.send(keys[i], values[i], p, self.on_delivery)
                self.held[p] = None
            else:
                self.held[p] = (keys[i], values[i])
            start = i + 1
        if start < size:
            self.run(keys[start:], values[start:], parts[start:])

    def run(self, keys: Sequence, values: Sequence, parts: Sequence[int]) -> None:
        """Records with no delivery report, produced by ``map`` (no Python bytecode per record);
        where a call fails (a full queue, a value's type), that record goes through :meth:`send`
        and the rest through ``map`` again."""
        extra = [repeat(x) for x in (None, *self.extra)]
        vs, ks, ps = iter(values), iter(keys), iter(parts)  # (map takes a record's arguments before its call)
        while True:
            try:
                deque(map(self.producer.produce, repeat(self.topic), vs, ks, ps, *extra), 0)
                return
            except (BufferError, TypeError):
                i = len(values) - length_hint(vs) - 1  # the failed record: the iterators are past it
                self.send(keys[i], values[i], parts[i], None)

    def finish(self) -> None:
        for partition, record in self.held.items():
            if record is not None:
                self.send(record[0], record[1], partition, self.on_delivery)


class _Placer:
    """Keys and partitions of a chunk of elements, as librdkafka's ``consistent_random`` places them."""

    def __init__(self, partitions: int):
        self.partitions, self.keyless = partitions, 0
        self.sticky = random.randrange(partitions)  # where records without a key go for now

    def placed(self, chunk: list) -> tuple[Sequence, Sequence, list[int]]:
        """``(keys, values, partitions)`` of ``chunk``: in C where every element is a pair with a
        str key, or every one with a bytes key, or none has a key; else record by record."""
        size, kinds = len(chunk), set(map(type, chunk))
        if tuple not in kinds:  # values alone
            return [None] * size, chunk, self._keyless(size)
        if kinds == {tuple} and set(map(len, chunk)) == {2}:
            keys, values = zip(*chunk)
            kinds = set(map(type, keys))
            if (kinds == {str} and "" not in keys) or (kinds == {bytes} and b"" not in keys):
                return keys, values, self._of_keys(keys, kinds == {str})
            if kinds == {type(None)}:
                return keys, values, self._keyless(size)
        return self._one_by_one(chunk)

    def _keyless(self, size: int) -> list[int]:
        """``size`` records without a key: to the sticky partition, which changes once
        :data:`STICKY_RECORDS` more have gone."""
        parts = [self.sticky] * size
        before, self.keyless = self.keyless, self.keyless + size
        if self.keyless // STICKY_RECORDS > before // STICKY_RECORDS and self.partitions > 1:
            self.sticky = (self.sticky + random.randrange(1, self.partitions)) % self.partitions
        return parts

    def _of_keys(self, keys: Sequence, encode: bool) -> list[int]:
        n, crc32 = self.partitions, zlib.crc32
        distinct = set(keys)
        if len(distinct) * 8 <= len(keys):  # keys repeat: each one's partition once
            where = {k: crc32(k.encode() if encode else k) % n for k in distinct}
            return list(map(where.__getitem__, keys))
        return [crc32(k) % n for k in (map(str.encode, keys) if encode else keys)]

    def _one_by_one(self, chunk: list) -> tuple[list, list, list[int]]:
        keys, values, parts = [], [], []
        n, crc32 = self.partitions, zlib.crc32
        for element in chunk:
            key, value = element if type(element) is tuple and len(element) == 2 else (None, element)
            if type(key) is str:
                key = key.encode()
            elif key is not None and type(key) is not bytes:
                key = _bytes(key)
            if key:
                parts.append(crc32(key) % n)
            else:  # (an empty key too, as librdkafka)
                parts.extend(self._keyless(1))
            keys.append(key)
            values.append(value)
        return keys, values, parts


def partition_count(producer, topic: str, conf: dict, timeout_s: float) -> int | None:
    """The topic's partitions, for :func:`produce_records` to place records as librdkafka would;
    None where ``conf`` names a partitioner of its own (librdkafka places the records)."""
    if conf.get("partitioner", "consistent_random") != "consistent_random":
        return None
    topic_metadata = producer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if topic_metadata is None or topic_metadata.error is not None or not topic_metadata.partitions:
        return None
    return len(topic_metadata.partitions)


def parse_size(text: str) -> int:
    """Spark's size strings (``1g``, ``512m``, ``1048576``) in bytes; 0 means no bound."""
    text = str(text).strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)
