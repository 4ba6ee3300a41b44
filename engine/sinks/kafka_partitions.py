""":class:`~sparkwal.engine.sinks.KafkaSink` per partition (``per_partition=True``): when the
records keep the source's partitioning, each task produces its partition's records and a marker
of its offset range in ONE Kafka transaction of its own, from the executor, as the PostgreSQL
sink's per-partition way does with database transactions.

* Transactional ids are owned by the source partition: ``<transactional.id>-<source topic>-<source
  partition>``, one per partition (Flink's way: ids owned by what is written, not by who writes). A
  task that starts a producer of its range's id (``init_transactions``) fences every earlier one:
  an earlier attempt of the same task (a Spark retry, a speculative copy, an executor declared lost
  while its task still runs), an earlier driver's task, a paused old driver's task resumed later —
  none of them can commit any more, and their open transactions are aborted. A worker keeps the
  producer it started for the partition's later tasks, but reuses it only for a first attempt and
  while the driver names this worker as the partition's last writer (forgotten after any failed
  write): any other producer of the id started since would have fenced it, so its commit fails.
* The check inside the fence: a task that starts a producer then reads the partition's markers
  written since the batch began (``read_committed``, up to the marker topic's end as it was after
  ``init_transactions`` — its high watermark, not the last stable offset a ``read_committed``
  consumer is told — waiting up to the transaction timeout for other tasks' transactions there to
  end): a marker of its range (or beyond) means it is in (an earlier attempt committed) and the
  task writes nothing; a marker ending anywhere else than the range's start is an error naming
  both offsets. No producer of the range's id can commit between the check and the task's own
  commit without fencing it (the PostgreSQL sink's re-check under a lock, with Kafka's fence as
  the lock); the previous release's per-slot ids are fenced by the driver too.
* The driver, before its first batch and for every new source partition, fences each id, then
  reads the markers; before each batch it reads the markers written since (a fenced-out writer
  may have committed before the fence): a range whose source partition's furthest marker with
  records ends at the range's end (or beyond, from a later batch) is in already, and its task
  writes nothing.
* Data first, then the transaction: a task reads and encodes its range (kept in memory up to
  :data:`SPOOL_MEMORY_BYTES`, then in a temporary file) before it begins its transaction, so that
  the transaction lasts as long as producing takes, not as long as reading the source; a
  transaction the broker aborted for lasting past ``transaction.timeout.ms`` fails the batch in one
  line naming that setting.
* Markers (JSON, key ``<name>/<topic>/<partition>``, in the sink's marker topic)::

      {"sink": name, "batchTimeMs": t, "source": [topic, partition], "from": start, "until": end,
       "records": n, "written": [[partition, first offset, last offset], ...]}

  A partition whose range in a batch is empty and that has no marker yet gets one from the driver
  (``"records": 0``, nothing written): the sink's offsets name every partition it was planned.
  Readers keep a partition's furthest end, and the sink's reader drops a marker whose range begins
  before the end of those it kept (a re-write: a broker that does not fence may let two commit).

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
import pickle
import tempfile
import time
import uuid
from collections.abc import Iterator
from itertools import islice

from .kafka_markers import (ATTEMPT_HEADER, client_settings, init_transactions, librdkafka_log, unreachable,
                            with_secrets)
from ..sources.protocol import OffsetRange, range_in_sink
from .kafka_records import KafkaRecordError, encode, partition_count, produce_records

WRITTEN, SKIPPED, FAILED, UNAVAILABLE = "written", "skipped", "failed", "unavailable"

#: a task's encoded records kept in memory up to this size, the rest in a temporary file
SPOOL_MEMORY_BYTES = 32 << 20
#: the errors of a producer that another producer of its transactional id fenced
FENCED = {"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING"}


def transactional_id(base: str, topic: str, partition) -> str:
    """The transactional id of a source partition's writes."""
    return f"{base}-{topic}-{partition}"


#: the previous release's ids per worker slot (``<id>-<slot>``): fenced too, for its tasks still running
LEGACY_SLOTS = 16


def legacy_transactional_ids(base: str, topic: str, partition) -> list[str]:
    return [f"{transactional_id(base, topic, partition)}-{slot}" for slot in range(LEGACY_SLOTS)]


def marker_key(name: str, topic: str, partition) -> bytes:
    return f"{name}/{topic}/{partition}".encode()


def empty_range_marker(name: str, batch_time_ms: int, r) -> tuple[bytes, bytes]:
    """``(value, key)`` of the driver's marker of an empty range ``r`` (an OffsetRange)."""
    marker = {"sink": name, "batchTimeMs": batch_time_ms, "source": [r.topic, r.partition],
              "from": r.untilOffset, "until": r.untilOffset, "records": 0, "written": []}
    return json.dumps(marker).encode(), marker_key(name, r.topic, r.partition)


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


class Spool:
    """A task's encoded records, read whole before its transaction begins: in memory up to
    ``memory_bytes``, the rest pickled in chunks to a temporary file (deleted on close)."""

    CHUNK = 1000

    def __init__(self, elements, memory_bytes: int = SPOOL_MEMORY_BYTES):
        self.kept: list[tuple] = []
        self.file = None
        size = 0
        elements = iter(elements)
        while chunk := list(islice(elements, self.CHUNK)):
            records = list(map(encode, chunk))
            if self.file is not None:
                pickle.dump(records, self.file, protocol=pickle.HIGHEST_PROTOCOL)
                continue
            self.kept.extend(records)
            size += sum(len(k or b"") + len(v or b"") for k, v in records) + 64 * len(records)
            if size > memory_bytes:
                local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")  # (the executor's spark.local.dir)
                self.file = tempfile.TemporaryFile(prefix="sparkwal-kafka-spool-",
                                                   dir=local_dirs.split(",")[0] or None)

    def __iter__(self) -> Iterator[tuple]:
        yield from self.kept
        if self.file is not None:
            self.file.seek(0)
            while True:
                try:
                    yield from pickle.load(self.file)  # (our own file, written just above)
                except EOFError:
                    return

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def mark_unseen(sink, batch_time_ms: int, empty: list, ends: dict) -> None:
    """The driver's marker (no records) of each empty range whose partition has no end in
    ``ends``, in one transaction of the sink's producer, so that ``sink.offsets()`` names every
    partition planned (see :class:`~sparkwal.engine.sources.SinkOffsets`)."""
    unseen = [r for r in empty if r.topicPartition() not in ends]
    if not unseen:
        return
    producer = sink.producer()
    sink.broker_call("begin_transaction", producer.begin_transaction)
    try:
        for r in unseen:
            producer.produce(sink.marker_topic, *empty_range_marker(sink.name, batch_time_ms, r))
        sink.broker_call(f"batch {batch_time_ms}'s empty ranges", producer.commit_transaction, sink.timeout_s)
    except BaseException:
        sink.abort(producer)
        raise
    for r in unseen:
        ends.setdefault(r.topicPartition(), r.untilOffset)


def _producer(conf: dict, txid: str, topic: str, timeout_s: float, reuse: bool):
    """``(producer, its delivery spans, whether it is new)``: this worker's producer of ``txid``
    if ``reuse`` and it has one, else a new one, initialised (every earlier producer of the id is
    fenced) and kept."""
    from confluent_kafka import Producer

    kept = _producers.get(txid)
    if reuse and kept is not None:
        return (*kept, False)
    spans = DeliverySpans()
    producer = Producer({**with_secrets(conf), "transactional.id": txid, "logger": librdkafka_log})
    _producers.pop(txid, None)
    init_transactions(producer, topic, timeout_s)
    _producers[txid] = (producer, spans)
    return producer, spans, True


#: this Python worker's producers (transactional id -> (producer, its delivery spans)) and identity
_producers: dict[str, tuple] = {}
WORKER = uuid.uuid4().hex


def produce_partition(index: int, elements: Iterator, plan: list, conf: dict, topic: str, marker_topic: str,
                      name: str, batch_time_ms: int, markers_from: int, timeout_s: float, tag: bool = False,
                      transaction_timeout_ms: int = 60_000):
    """Task side: ``plan[index]`` is ``(source topic, source partition, from, until, skip, the
    worker whose task last wrote the partition)``; yields ``(index, outcome, detail, the worker
    that wrote)``: WRITTEN (detail: records), SKIPPED (the range is in: detail 0), FAILED or
    UNAVAILABLE (detail: the message)."""
    from confluent_kafka import KafkaException
    from pyspark import TaskContext

    source_topic, source_partition, start, until, skip, last_writer = plan[index]
    if skip:
        yield index, SKIPPED, 0, None
        return
    try:
        spool = Spool(elements)
    except KafkaRecordError as e:
        yield index, FAILED, f"batch {batch_time_ms}: {e}", None
        return
    context = TaskContext.get()
    reuse = (context is None or context.attemptNumber() == 0) and last_writer == WORKER
    txid = transactional_id(conf["transactional.id"], source_topic, source_partition)
    key = marker_key(name, source_topic, source_partition)
    try:
        for _try in range(2):  # a kept producer found fenced: once more with a new one (which checks)
            try:
                outcome = _write(spool, conf, txid, topic, marker_topic, key, plan[index], name, batch_time_ms,
                                 markers_from, timeout_s, tag, reuse, transaction_timeout_ms)
            except (KafkaException, TimeoutError) as e:
                _producers.pop(txid, None)
                fenced = isinstance(e, KafkaException) and e.args[0].name() in FENCED
                if fenced and reuse:
                    reuse = False
                    continue
                if fenced:  # another attempt of this range runs: the task fails, Spark keeps the other
                    raise RuntimeError(f"{txid}: batch {batch_time_ms}: fenced by another attempt of "
                                       f"[{start}, {until}) of {source_topic}/{source_partition}") from e
                detail = e.args[0].str() if isinstance(e, KafkaException) else str(e)
                yield index, _outcome(e), f"{txid}: batch {batch_time_ms}: {detail}", None
                return
            yield index, *outcome
            return
    finally:
        spool.close()


def _write(spool: Spool, conf: dict, txid: str, topic: str, marker_topic: str, key: bytes, planned: tuple,
           name: str, batch_time_ms: int, markers_from: int, timeout_s: float, tag: bool, reuse: bool,
           transaction_timeout_ms: int) -> tuple:
    """One try: ``(outcome, detail, writer)``; a broker's refusal raises (the transaction aborted)."""
    from confluent_kafka import KafkaException

    source_topic, source_partition, start, until, _skip, _last = planned
    producer, spans, new = _producer(conf, txid, topic, timeout_s, reuse)
    if new:  # every other producer of the id is fenced now: what the markers hold is final
        stored, stored_batch = _stored_end(conf, marker_topic, markers_from, key,
                                           max(timeout_s, transaction_timeout_ms / 1000))
        state = range_in_sink(OffsetRange(source_topic, source_partition, start, until), batch_time_ms, stored,
                              stored_batch)
        if state:  # (beyond: a later batch is in, and outputs go in batch order)
            return SKIPPED, 0, None
        if state is None:
            return FAILED, (f"batch {batch_time_ms} reads {source_topic}/{source_partition} [{start}, {until}) "
                            f"but the Kafka topic {topic}'s output ends at offset {stored}: start the stream "
                            "from the sink's offsets (fromOffsets=sink.offsets())"), None
    producer.begin_transaction()
    began = time.monotonic()
    spans.reset()
    attempt = uuid.uuid4().hex[:12]
    headers = [(ATTEMPT_HEADER, attempt.encode())] if tag else None
    try:
        n = produce_records(producer, topic, spool, spans, partition_count(producer, topic, conf, timeout_s), headers)
        if producer.flush(timeout_s) > 0 or spans.failed is not None:
            raise KafkaException(spans.failed) if spans.failed is not None else TimeoutError("not delivered")
        marker = {"sink": name, "batchTimeMs": batch_time_ms, "source": [source_topic, source_partition],
                  "from": start, "until": until, "records": n, "attempt": attempt, "tagged": tag,
                  "written": [[p, first, last] for p, (first, last) in sorted(spans.written.items())]}
        producer.produce(marker_topic, json.dumps(marker).encode(), key)
        producer.commit_transaction(timeout_s)
    except BaseException as e:
        try:
            producer.abort_transaction(timeout_s)
        except KafkaException:
            pass
        open_ms = (time.monotonic() - began) * 1000
        if isinstance(e, KafkaException) and open_ms > transaction_timeout_ms:
            raise TimeoutError(transaction_timed_out(open_ms, transaction_timeout_ms, e.args[0].str())) from e
        raise
    return WRITTEN, n, WORKER


def transaction_timed_out(open_ms: float, timeout_ms: int, detail: str) -> str:
    """The one line of a transaction the broker aborted for lasting too long."""
    return (f"the transaction was open {open_ms / 1000:.1f} s, longer than the producer's "
            f"transaction.timeout.ms ({timeout_ms} ms), and the broker aborted it ({detail}): raise "
            "transaction.timeout.ms in producer_conf (at most the broker's transaction.max.timeout.ms, "
            "15 min by default) or make batches smaller (spark.streaming.kafka.maxRatePerPartition)")


def _outcome(e: BaseException) -> str:
    if isinstance(e, TimeoutError) and "transaction.timeout.ms" in str(e):
        return FAILED
    return UNAVAILABLE if unreachable(e) else FAILED


def _stored_end(conf: dict, marker_topic: str, start: int, key: bytes,
                timeout_s: float) -> tuple[int | None, int | None]:
    """The furthest end of the committed markers of ``key`` with records after ``start`` in the
    marker topic and its batch time (None, None: none), read up to the topic's end as it is now
    (its high watermark, asked ``read_uncommitted``: a ``read_committed`` consumer's answer is the
    last stable offset): the ``read_committed`` reader waits there, up to ``timeout_s``, for
    transactions still open to end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    settings = client_settings(with_secrets(conf), **{
        "group.id": f"sparkwal-check-{os.getpid()}", "enable.auto.commit": False, "enable.partition.eof": True,
        "fetch.wait.max.ms": 10})
    partition = TopicPartition(marker_topic, 0, start)
    probe = Consumer({**settings, "isolation.level": "read_uncommitted"})
    try:
        _low, high = probe.get_watermark_offsets(partition, timeout_s, cached=False)
    finally:
        probe.close()
    consumer = Consumer({**settings, "isolation.level": "read_committed"})
    try:
        if high <= start:
            return None, None
        consumer.assign([partition])
        stored: tuple[int | None, int | None] = (None, None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.05):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= high:
                        return stored
                    continue
                if msg.key() == key:
                    marker = json.loads(msg.value())
                    until = int(marker.get("until", -1))
                    if int(marker.get("from", until)) < until and until >= (stored[0] or 0):  # (not an empty range's)
                        stored = until, int(marker["batchTimeMs"])
                if msg.offset() + 1 >= high:
                    return stored
        raise TimeoutError(f"the markers of {marker_topic} not read to offset {high} within {timeout_s:g} s")
    finally:
        consumer.close()
