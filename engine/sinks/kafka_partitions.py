""":class:`~sparkwal.engine.sinks.KafkaSink` per partition (``per_partition=True``): when the
records keep the source's partitioning, each task produces its partition's records and a marker
of its offset range in ONE Kafka transaction of its own, from the executor, as the PostgreSQL
sink's per-partition way does with database transactions.

* Transactional ids: ``<transactional.id>-<source topic>-<source partition>-<slot>``, :data:`SLOTS`
  per source partition, a Python worker using the slot its identity hashes to: the ids a new
  driver fences, all of them, before it trusts the markers. A worker keeps the producer it
  started (``init_transactions``: 50 ms here) for the partition's later tasks, but reuses it only
  while no other worker of the same slot may have started one since: the driver names, per
  partition and slot, the worker whose task last wrote it (forgotten after any failed write); a
  task elsewhere, or a task's second attempt, starts a producer of its own. (A fenced producer
  fails only after it has taken records, and a broker that does not fence, as Tansu 0.6, lets
  its commit hang.)
* The driver, before its first batch and for every new source partition, fences each id (a
  producer of it calls ``init_transactions``: an earlier driver's tasks still running cannot
  commit, their open transactions are aborted), then reads the markers: a range whose source
  partition's newest marker ends at the range's end is in already, and its task writes nothing.
* A task run again within a batch (a Spark retry, a speculative copy) reads the markers written
  since the batch began before writing: its partition may have committed in the earlier attempt.
* Markers (JSON, key ``<name>/<topic>/<partition>``, in the sink's marker topic)::

      {"sink": name, "batchTimeMs": t, "source": [topic, partition], "from": start, "until": end,
       "records": n, "written": [[partition, first offset, last offset], ...]}

Concurrent tasks' records interleave in the topic's partitions, so a marker's ``written`` span
may hold another task's records: on a broker that shows aborted records to ``read_committed``
readers (the start-up probe), each record is tagged with its write (header ``sparkwal.attempt``,
``"tagged": true`` in the marker) and the sink's reader keeps a record only within its own
write's span.

A batch becomes visible partition by partition; a ``read_committed`` reader sees each
partition's records of a batch once. Secrets of the producer's configuration never travel with
tasks: executors take them from ``SPARKWAL_KAFKA_<KEY>`` in their environment.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator

from .kafka_markers import (ATTEMPT_HEADER, client_settings, init_transactions, librdkafka_log, unreachable,
                            with_secrets)
from .kafka_records import KafkaRecordError, partition_count, produce_records

WRITTEN, SKIPPED, FAILED, UNAVAILABLE = "written", "skipped", "failed", "unavailable"


SLOTS = 16


def transactional_id(base: str, topic: str, partition, slot: int) -> str:
    return f"{base}-{topic}-{partition}-{slot}"


def marker_key(name: str, topic: str, partition) -> bytes:
    return f"{name}/{topic}/{partition}".encode()


class DeliverySpans:
    """The delivery callback of the records :func:`~.kafka_records.produce_records` reports (each
    partition's first and last): the first and last offset a transaction wrote to each partition,
    and the first failed delivery."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.written: dict[int, list[int]] = {}
        self.failed = None

    def __call__(self, err, msg) -> None:
        if err is not None:
            self.failed = self.failed or err
            return
        span = self.written.get(msg.partition())
        if span is None:
            self.written[msg.partition()] = [msg.offset(), msg.offset()]
        else:
            span[1] = msg.offset()


def _producer(conf: dict, txid: str, topic: str, timeout_s: float, reuse: bool):
    """This worker's producer of ``txid`` if ``reuse`` and it has one, else a new one,
    initialised (every earlier producer of the id is fenced) and kept."""
    from confluent_kafka import Producer

    kept = _producers.get(txid)
    if reuse and kept is not None:
        return kept
    spans = DeliverySpans()
    producer = Producer({**with_secrets(conf), "transactional.id": txid, "logger": librdkafka_log})
    _producers.pop(txid, None)
    init_transactions(producer, topic, timeout_s)
    _producers[txid] = (producer, spans)
    return producer, spans


#: this Python worker's producers (transactional id -> (producer, its delivery spans)), identity and slot
_producers: dict[str, tuple] = {}
WORKER = uuid.uuid4().hex
SLOT = int(WORKER[:8], 16) % SLOTS


def produce_partition(index: int, elements: Iterator, plan: list, conf: dict, topic: str, marker_topic: str,
                      name: str, batch_time_ms: int, markers_from: int, timeout_s: float, tag: bool = False):
    """Task side: ``plan[index]`` is ``(source topic, source partition, from, until, skip, {slot:
    the worker whose task last wrote the partition in it})``; yields ``(index, outcome, detail,
    (slot, worker) of the producer that wrote)``."""
    from confluent_kafka import KafkaException
    from pyspark import TaskContext

    source_topic, source_partition, start, until, skip, writers = plan[index]
    context = TaskContext.get()
    first_attempt = context is None or context.attemptNumber() == 0
    if not skip and not first_attempt:  # the earlier attempt may have committed
        try:
            skip = _committed_since(conf, marker_topic, markers_from,
                                    marker_key(name, source_topic, source_partition), batch_time_ms, timeout_s)
        except (KafkaException, TimeoutError) as e:
            yield index, UNAVAILABLE, f"markers of {marker_topic}: {e}", None
            return
    if skip:
        yield index, SKIPPED, 0, None
        return
    txid = transactional_id(conf["transactional.id"], source_topic, source_partition, SLOT)
    try:
        producer, spans = _producer(conf, txid, topic, timeout_s, reuse=first_attempt and writers.get(SLOT) == WORKER)
        producer.begin_transaction()
    except KafkaException as e:
        _producers.pop(txid, None)
        yield index, _outcome(e), f"{txid}: {e.args[0].str()}", None
        return
    spans.reset()
    attempt = uuid.uuid4().hex[:12]
    headers = [(ATTEMPT_HEADER, attempt.encode())] if tag else None
    try:
        try:
            n = produce_records(producer, topic, elements, spans, partition_count(producer, topic, conf, timeout_s),
                                headers)
        except KafkaRecordError as e:
            producer.abort_transaction(timeout_s)
            yield index, FAILED, f"batch {batch_time_ms}: {e}", None
            return
        if producer.flush(timeout_s) > 0 or spans.failed is not None:
            raise KafkaException(spans.failed) if spans.failed is not None else TimeoutError("not delivered")
        marker = {"sink": name, "batchTimeMs": batch_time_ms, "source": [source_topic, source_partition],
                  "from": start, "until": until, "records": n, "attempt": attempt, "tagged": tag,
                  "written": [[p, first, last] for p, (first, last) in sorted(spans.written.items())]}
        producer.produce(marker_topic, json.dumps(marker).encode(), marker_key(name, source_topic, source_partition))
        producer.commit_transaction(timeout_s)
    except (KafkaException, TimeoutError) as e:
        _producers.pop(txid, None)
        try:
            producer.abort_transaction(timeout_s)
        except KafkaException:
            pass
        detail = e.args[0].str() if isinstance(e, KafkaException) else str(e)
        yield index, _outcome(e), f"{txid}: batch {batch_time_ms}: {detail}", None
        return
    yield index, WRITTEN, n, (SLOT, WORKER)


def _outcome(e: BaseException) -> str:
    return UNAVAILABLE if unreachable(e) else FAILED


def _committed_since(conf: dict, marker_topic: str, start: int, key: bytes, batch_time_ms: int,
                     timeout_s: float) -> bool:
    """Whether the marker topic holds, after ``start``, this partition's marker of the batch."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(client_settings(with_secrets(conf), **{
        "group.id": f"sparkwal-retry-{os.getpid()}", "isolation.level": "read_committed",
        "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10}))
    try:
        consumer.assign([TopicPartition(marker_topic, 0, start)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.05):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return False
                    continue
                if msg.key() == key and json.loads(msg.value()).get("batchTimeMs") == batch_time_ms:
                    return True
        raise TimeoutError(f"the markers of {marker_topic} not read within {timeout_s:g} s")
    finally:
        consumer.close()
