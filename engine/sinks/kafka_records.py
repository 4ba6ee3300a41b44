"""The task side of :class:`~sparkwal.engine.sinks.KafkaSink`: a partition's elements encoded as
``(key, value)`` bytes in the executor, returned whole when they fit the task's share of the
driver's budget, else left for the driver to fetch alone (one partition at a time)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Iterator

from ..errors import EngineError

#: a task's result: ``(partition index, kind, payload)``; kind "records" (payload: the list),
#: "big" (over the budget: fetched by a job of its own) or "error" (payload: the message)
RECORDS, BIG, ERROR = "records", "big", "error"
_PER_RECORD_OVERHEAD = 64  # bytes of a pickled (bytes, bytes) pair beyond its contents, about
#: records without a key go to one partition this many at a time, then to another one chosen at random
#: (librdkafka's sticky partitioner switches after ``sticky.partitioning.linger.ms``, 10 ms)
STICKY_RECORDS = 1000
_FIRST = object()  # a partition no record went to yet


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
    records and every one calls ``on_delivery``."""
    produce, n = producer.produce, 0

    def send(key, value, partition: int, callback) -> None:
        while True:
            try:
                if headers is None:
                    produce(topic, value, key, partition, callback)
                else:  # (positional: a keyword argument doubles produce's cost)
                    produce(topic, value, key, partition, callback, None, 0, headers)
                return
            except BufferError:  # librdkafka's queue is full: let it drain
                producer.poll(0.05)
            except TypeError:  # librdkafka takes bytes, str and None; anything else is ours to say
                if value is None or type(value) in (bytes, str):
                    raise
                value = _bytes(value)

    if partitions is None:
        for element in elements:
            key, value = element if type(element) is tuple and len(element) == 2 else (None, element)
            send(_bytes(key), value, -1, on_delivery)
            n += 1
        return n
    held: list = [_FIRST] * partitions  # per partition: its newest record not produced yet (None: none)
    sticky, keyless, crc32 = random.randrange(partitions), 0, zlib.crc32
    for element in elements:
        key, value = element if type(element) is tuple and len(element) == 2 else (None, element)
        if type(key) is str:
            key = key.encode()
        elif key is not None and type(key) is not bytes:
            key = _bytes(key)
        if key:
            partition = crc32(key) % partitions
        else:  # (an empty key too, as librdkafka)
            keyless += 1
            if keyless % STICKY_RECORDS == 0 and partitions > 1:
                sticky = (sticky + random.randrange(1, partitions)) % partitions
            partition = sticky
        earlier = held[partition]
        if earlier is _FIRST:  # the partition's first record
            held[partition] = None
            send(key, value, partition, on_delivery)
        else:
            held[partition] = (key, value)
            if earlier is not None:
                try:
                    if headers is None:
                        produce(topic, earlier[1], earlier[0], partition)
                    else:
                        produce(topic, earlier[1], earlier[0], partition, None, None, 0, headers)
                except (BufferError, TypeError):
                    send(earlier[0], earlier[1], partition, None)
        n += 1
    for partition, last in enumerate(held):
        if last is not None and last is not _FIRST:
            send(last[0], last[1], partition, on_delivery)
    return n


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
