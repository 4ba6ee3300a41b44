"""Exactly-once output into a Kafka topic, with Kafka's transactions (confluent-kafka).

Each batch (time ``t``, the offset ranges ``R`` its direct stream read) goes in as ONE Kafka
transaction of the sink's transactional producer: the batch's records and a marker of the batch.

1. At the sink's first use in a driver, its producer (``transactional.id``: ``sparkwal-<name>``
   unless ``producer_conf`` gives one) calls ``init_transactions``: the broker fences every earlier
   producer of that id (a killed or still running earlier driver) and aborts its open transaction.
   The sink then reads its newest marker (a ``read_committed`` read of the marker topic).
2. A batch whose every range with records ends where that marker's offsets do is in the topic
   already (a re-run after a crash between the Kafka commit and the stream's checkpoint): nothing
   is written. Offsets decide, not batch times (an old driver on another batch grid, a clock
   behind); an end beyond the batch's is in only where a later batch stored it, and a batch that
   read nothing is in iff the newest marker's batch is as late. As with
   :class:`~sparkwal.engine.sinks.DbApiSink`, a batch must start where the sink's output ended;
   partly in, or elsewhere, is an error naming both offsets.
3. The batch's Spark jobs run (:mod:`sparkwal.engine.sinks.kafka_batch`: a partition larger than
   the driver's budget is kept in the executors' storage and fetched inside); then, in one
   transaction: the batch's records, flushed (their delivery reports give the first and last
   offset written to each partition); then the marker; then the commit. A ``read_committed``
   reader sees the batch whole, once, or not at all. A transaction the broker aborted for
   lasting past ``transaction.timeout.ms`` fails the batch in one line naming that setting.

Why the driver produces: a Kafka transaction belongs to one producer, and confluent-kafka cannot
hand an open transaction to another process (Flink's Kafka sink resumes one in the Java client
through reflection). The executors encode the records (:mod:`sparkwal.engine.sinks.kafka_records`);
the driver holds a budget (``collect_limit_bytes``) and one larger partition at most
(:mod:`sparkwal.engine.sinks.kafka_batch`).

The marker topic (``<topic>.<name>.sparkwal`` unless ``marker_topic`` names one; created with one
partition and ``retention.ms=-1`` if missing) holds one JSON record per batch::

    {"sink": name, "batchTimeMs": t, "attempt": id, "records": n,
     "offsets": [[topic, partition, end offset], ...],   # every partition planned so far: its end
     "written": [[partition, first offset, last offset], ...]}   # the batch's records in ``topic``

:meth:`KafkaSink.offsets` resumes a direct stream from the newest one without a checkpoint.

Per partition (``per_partition=True``, records that keep the source's partitioning): each task
produces its partition and a marker of its offset range in a transaction of its own, from the
executor (:mod:`sparkwal.engine.sinks.kafka_partitions`); a batch is then visible partition by
partition, and its output never passes through the driver.

Brokers that do not honour transactions: at start-up the sink aborts a probe transaction and
reads it back. If a ``read_committed`` reader sees the aborted record (the Tansu broker 0.6 does),
the sink says so in one warning line (or refuses: ``require_transactions=True``): on such a
broker, the records of a write that never committed (a killed driver) stay visible to plain
readers, which then see that batch's records twice. :meth:`KafkaSink.read`, and any reader that
keeps only records within a marker's ``written`` offsets, still sees each record once.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from functools import partial

from sparkwal.wal import StorageUnavailableError
from sparkwal.wal.location import without_credentials

from ..driver_rows import on_executors
from ..sources.protocol import OffsetRange, SinkOffsets, TopicPartition, range_in_sink
from .kafka_markers import (KafkaSinkError, ensure_topics, unreachable, import_confluent_kafka, init_transactions,
                            librdkafka_log, probe_transactions, committed_records, marker_topic_end, read_markers,
                            RECONNECT_BACKOFF_MS, read_newest_marker, with_secrets, Watermarks, partition_ends)
from .kafka_partitions import (FAILED, SKIPPED, DeliverySpans, UNAVAILABLE, WRITTEN, mark_unseen,
                               legacy_transactional_ids, produce_partition, transaction_timed_out, transactional_id)
from .kafka_batch import ReadyRecords
from .kafka_records import partition_count, produce_records
from .transactional import SinkOffsetsError, advance_ends, keeps_source_partitions, ranges_by_partition, save_batches

log = logging.getLogger(__name__)

class KafkaSink:
    """Exactly-once output of a direct stream's batches into the Kafka topic ``topic``.

    ``producer_conf``: confluent-kafka's producer configuration (``bootstrap.servers`` at least;
    ``transactional.id`` defaults to ``sparkwal-<name>``, ``reconnect.backoff.ms`` to
    :data:`~.kafka_markers.RECONNECT_BACKOFF_MS`); ``name``: the stream's identity in the
    markers; ``marker_topic``: where the markers go; ``partitions``: create ``topic`` with that
    many partitions if it does not exist (None: it must exist); ``require_transactions``: refuse a broker
    that shows aborted records to ``read_committed`` readers instead of warning;
    ``timeout_s``: the bound of each broker call (a broker out of reach that long is
    :class:`~sparkwal.wal.StorageUnavailableError`). Elements are values or ``(key, value)``
    pairs (bytes, str as UTF-8, or None). Secrets of ``producer_conf`` (``sasl.password``...) are
    never pickled: a sink recovered from a checkpoint takes each from the environment variable
    ``SPARKWAL_KAFKA_<KEY>`` (``SPARKWAL_KAFKA_SASL_PASSWORD``). ``per_partition``: each task
    commits its partition in a transaction of its own, from the executor
    (:mod:`sparkwal.engine.sinks.kafka_partitions`; the records must keep the source's partitioning)."""

    def __init__(self, topic: str, producer_conf: Mapping, name: str = "sparkwal", *,
                 marker_topic: str | None = None, partitions: int | None = None,
                 require_transactions: bool = False, timeout_s: float = 60.0, collect_limit_bytes: int = 64 << 20,
                 per_partition: bool = False):
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        if not isinstance(producer_conf, Mapping):
            raise ValueError(f"producer_conf must be a dict of confluent-kafka settings, got {producer_conf!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        conf = dict(producer_conf)
        if "metadata.broker.list" in conf:
            conf.setdefault("bootstrap.servers", conf.pop("metadata.broker.list"))
        if not conf.get("bootstrap.servers"):
            raise ValueError("producer_conf needs bootstrap.servers")
        if str(conf.get("enable.idempotence", "true")).lower() == "false":
            raise ValueError("producer_conf: a transactional producer is idempotent (enable.idempotence=false refused)")
        conf.setdefault("transactional.id", f"sparkwal-{name}")
        conf.setdefault("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)
        self.topic, self.name, self.conf = topic, name, conf
        self.marker_topic = marker_topic or f"{topic}.{name}.sparkwal"
        for what, value in (("topic", topic), ("marker topic", self.marker_topic)):
            if not _TOPIC_NAME.fullmatch(value):
                raise ValueError(f"the {what} {value!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; "
                                 "at most 249): name the sink or its marker_topic accordingly")
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise ValueError(f"partitions must be a positive number of partitions, got {partitions!r}")
        self.partitions = partitions
        self.require_transactions, self.timeout_s = require_transactions, float(timeout_s)
        self.collect_limit_bytes = int(collect_limit_bytes)
        self.per_partition = bool(per_partition)
        self._fenced: set[tuple] = set()  # source partitions whose transactional ids this driver fenced
        self._partition_ends: dict[TopicPartition, int] | None = None  # per partition: as the markers say
        self._partition_batches: dict[TopicPartition, int] = {}  # per partition: the batch of its furthest records
        self._markers_read_to = 0  # per partition: the marker topic's offset the ends were read up to
        self._writers: dict[tuple, str] = {}  # per partition: the worker whose task last wrote it
        self.honours_transactions: bool | None = None  #: the start-up probe's answer
        self._producer: Any = None  # confluent_kafka.Producer, started by producer()
        self._last: dict | None = None  # the newest marker, once read
        self._spans = DeliverySpans()  # the batch's [first, last] offset per partition
        self.watermarks = Watermarks()  #: the marker and data topics' ends, asked of one kept consumer

    def __getstate__(self) -> dict:
        """Pickled into checkpoints with the output: no producer, no cached marker, no secrets."""
        return {**self.__dict__, "_producer": None, "_last": None, "honours_transactions": None,
                "_fenced": set(), "_partition_ends": None, "_markers_read_to": 0, "_writers": {},
                "_partition_batches": {}, "_spans": DeliverySpans(),
                "conf": without_credentials(self.conf) or {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"per_partition": False, "_fenced": set(), "_partition_ends": None, "_writers": {},
                              "_partition_batches": {},
                              "_markers_read_to": 0,
                              "_spans": DeliverySpans(), "watermarks": Watermarks(), **state})
        self.conf = with_secrets(self.conf)
        self.conf.setdefault("reconnect.backoff.ms", RECONNECT_BACKOFF_MS)  # (a sink pickled before it was one)

    @property
    def bootstrap(self) -> str:
        return str(self.conf["bootstrap.servers"])

    # ------------------------------------------------------------------ the broker

    def error_of(self, operation: str, e: BaseException, start: float) -> Exception:
        """confluent-kafka's error as sparkwal's: a broker out of reach is the storage's exit status."""
        if unreachable(e):
            return StorageUnavailableError(f"Kafka {operation}", self.bootstrap, 1, time.monotonic() - start, e)
        err = e.args[0]
        return KafkaSinkError(f"{self.name}: Kafka {operation} ({self.topic} at {self.bootstrap}) failed: "
                              f"{err.name()}: {err.str()}")

    def broker_call(self, operation: str, fn, *args):
        kafka = import_confluent_kafka()
        start = time.monotonic()
        try:
            return fn(*args)
        except kafka.KafkaException as e:
            raise self.error_of(operation, e, start) from e

    def producer(self):
        """The sink's transactional producer, started at the first call in a process: topics
        checked (the marker topic created), earlier producers of the transactional id fenced, the
        broker probed, the newest marker read."""
        if self._producer is not None:
            return self._producer
        kafka = import_confluent_kafka()
        ensure_topics(self)
        conf = {"logger": librdkafka_log, **self.conf, "transaction.timeout.ms": self.transaction_timeout_ms}
        producer = kafka.Producer(conf)
        self.broker_call("init_transactions", init_transactions, producer, self.topic, self.timeout_s)
        if self.honours_transactions is None:
            self.honours_transactions = probe_transactions(self, producer)
            if not self.honours_transactions:
                self._say_broker_leaks()
        self._producer = producer
        self._last = self.newest_marker()
        return producer

    @property
    def transaction_timeout_ms(self) -> int:
        """The producers' ``transaction.timeout.ms``: ``producer_conf``'s, else twice ``timeout_s``
        (a minute at least)."""
        return int(self.conf.get("transaction.timeout.ms", max(60_000, int(self.timeout_s * 2000))))

    def close(self) -> None:
        """Let go of the producer and the kept consumer (at the end of a program; a later batch starts new ones)."""
        producer, self._producer, self._last = self._producer, None, None
        self.watermarks.close()
        if producer is not None:
            producer.flush(self.timeout_s)

    def _say_broker_leaks(self) -> None:
        message = (f"the Kafka broker at {self.bootstrap} shows aborted transactions' records to "
                   "read_committed readers: a batch whose write was interrupted (a killed driver) "
                   f"stays visible there and is seen twice by plain readers of {self.topic}; "
                   "KafkaSink.read() and readers keeping only records within the written offsets of "
                   f"a marker in {self.marker_topic} see each record once")
        if self.require_transactions:
            raise KafkaSinkError(f"{self.name}: {message}")
        log.warning("%s: %s", self.name, message)

    def newest_marker(self) -> dict | None:
        """The newest committed marker of the sink (read_committed), or None."""
        return read_newest_marker(self)

    def committed_batch(self) -> int | None:
        """The time of the newest batch in the topic, or None."""
        if self.per_partition:
            return max((int(m["batchTimeMs"]) for m in read_markers(self) if "source" in m), default=None)
        marker = self._last if self._producer is not None else self.newest_marker()
        return None if marker is None else int(marker["batchTimeMs"])

    def offsets(self) -> SinkOffsets:
        """The end offset of every partition the sink's output reached: ``directStream(fromOffsets=...)``
        (:class:`~sparkwal.engine.sources.SinkOffsets`). Starts the producer: the caller becomes
        the sink's writer (earlier ones are fenced: per partition, the ids of every partition the
        markers name, then the markers are read again)."""
        self.producer()
        if self.per_partition:
            known = self._partition_ends_now()
            return SinkOffsets(self._partition_ends_now([OffsetRange(tp.topic, tp.partition, o, o)
                                                         for tp, o in known.items()]))
        return SinkOffsets(self._ends())

    def batches_committed(self) -> int:
        """How many batches the sink committed (its markers)."""
        return len({m["batchTimeMs"] for m in read_markers(self) if ("source" in m) == self.per_partition})

    def read(self) -> list[tuple[bytes | None, bytes | None]]:
        """The sink's committed records, ``(key, value)`` in partition then offset order: records
        of writes that never committed are left out even where the broker shows them."""
        return committed_records(self)

    # ------------------------------------------------------------------ one batch

    def saveStream(self, dstream, offsetsFrom) -> None:
        """Each batch of ``dstream`` into the topic, exactly once, with the offsets of
        ``offsetsFrom`` (the direct stream ``dstream`` derives from)."""
        if not self.per_partition:
            return save_batches(dstream, offsetsFrom, self.write_batch)
        sink = self

        def write_batch(batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
            if not any(r.untilOffset > r.fromOffset for r in ranges):
                return False  # nothing read: nothing to write
            if not keeps_source_partitions(rdd, offsetsFrom.get_or_compute(batch_time_ms)):
                raise KafkaSinkError(f"{sink.name}: batch {batch_time_ms}: per_partition=True needs records that "
                                     "keep the source's partitioning (only map, filter, flatMap, mapPartitions... "
                                     "between the direct stream and the records)")
            return sink.write_partitions(batch_time_ms, ranges, rdd)

        save_batches(dstream, offsetsFrom, write_batch)

    def write_partitions(self, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
        """Per partition: each task produces its records and its range's marker in a transaction of
        its own (``rdd``'s partition ``i`` holds what the ``i``-th range with records read); False
        if every range is in the topic already, or if the batch read nothing."""
        with_data = ranges_by_partition(self.name, batch_time_ms, ranges, rdd)
        if not with_data:
            return False
        self.producer()  # the topics checked, the broker probed
        ends = self._partition_ends_now(with_data)
        plan = []
        batches = self._partition_batches
        for r in with_data:  # (an end only an empty range's marker stored decides nothing)
            tp = TopicPartition(r.topic, r.partition)
            done = range_in_sink(r, batch_time_ms, ends.get(tp) if tp in batches else None, batches.get(tp))
            if done is None:
                advance_ends(self.name, ends, batch_time_ms, [r], f"the Kafka topic {self.topic}'s")  # raises
            plan.append((r.topic, r.partition, r.fromOffset, r.untilOffset, done,
                         self._writers.get((r.topic, r.partition))))
        empty = [r for r in ranges if r.untilOffset <= r.fromOffset]
        if all(skip for *_r, skip, _writer in plan):
            log.info("%s: batch %d is in %s already; not written again", self.name, batch_time_ms, self.topic)
            mark_unseen(self, batch_time_ms, empty, ends)
            return False
        conf = {**(without_credentials(self.conf) or {}), "transaction.timeout.ms": self.transaction_timeout_ms}
        task = partial(produce_partition, plan=plan, conf=conf, topic=self.topic, tag=not self.honours_transactions,
                       marker_topic=self.marker_topic, name=self.name, batch_time_ms=batch_time_ms,
                       markers_from=self._markers_read_to, timeout_s=self.timeout_s,
                       transaction_timeout_ms=self.transaction_timeout_ms)
        self._writers, writers = {}, self._writers  # forgotten unless this write succeeds (see kafka_partitions)
        outcomes = on_executors(rdd).mapPartitionsWithIndex(task).collect()
        for index, outcome, _detail, _writer in outcomes:
            tp = TopicPartition(plan[index][0], plan[index][1])
            if outcome in (WRITTEN, SKIPPED) and (tp not in batches or plan[index][3] >= ends[tp]):  # (skipped: in)
                ends[tp], batches[tp] = plan[index][3], max(batch_time_ms, batches.get(tp, batch_time_ms))
        for _index, outcome, detail, _writer in outcomes:
            if outcome == UNAVAILABLE:
                raise StorageUnavailableError(f"Kafka produce of batch {batch_time_ms}", self.bootstrap, 1, 0.0,
                                              RuntimeError(detail))
            if outcome == FAILED:
                raise KafkaSinkError(f"{self.name}: Kafka produce ({self.topic} at {self.bootstrap}) failed: {detail}")
        for i, _outcome, _detail, worker in (o for o in outcomes if o[1] == WRITTEN):
            writers[(plan[i][0], plan[i][1])] = worker
        self._writers = writers
        mark_unseen(self, batch_time_ms, empty, ends)  # (after the batch's ranges with records are in)
        return any(outcome == WRITTEN for _i, outcome, _d, _w in outcomes)

    def _partition_ends_now(self, ranges: Sequence[OffsetRange] = ()) -> dict[TopicPartition, int]:
        """Per partition: every source partition's end as the markers say. The transactional ids
        of partitions new to this driver are fenced first (their earlier writers cannot commit
        any more), then the markers are read: all of them the first time, afterwards those
        written since the last read (a writer fenced out may have committed before its fence)."""
        new = {(r.topic, r.partition) for r in ranges} - self._fenced
        if new:
            from concurrent.futures import ThreadPoolExecutor

            kafka = import_confluent_kafka()

            def fence(txid: str) -> None:
                producer = kafka.Producer({"logger": librdkafka_log, **self.conf, "transactional.id": txid})
                self.broker_call("init_transactions", init_transactions, producer, self.topic, self.timeout_s)

            base = self.conf["transactional.id"]
            txids = [txid for topic, partition in sorted(new, key=repr)
                     for txid in (transactional_id(base, topic, partition),
                                  *legacy_transactional_ids(base, topic, partition))]
            with ThreadPoolExecutor(min(16, len(txids)), thread_name_prefix="kafka-fence") as pool:
                list(pool.map(fence, txids))
            self._fenced |= new
        end = marker_topic_end(self)
        if new or self._partition_ends is None or end > self._markers_read_to:
            since = 0 if new or self._partition_ends is None else self._markers_read_to
            ends = {} if since == 0 else self._partition_ends
            if since == 0:
                self._partition_batches = {}
            for m in read_markers(self, since):
                if "source" in m:
                    partition_ends(ends, self._partition_batches, m)
            self._partition_ends, self._markers_read_to = ends, end
        return self._partition_ends

    def write_batch(self, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
        """Produce ``rdd``'s records and commit them with the batch's marker; False (nothing
        written) if the topic holds the batch already, or if the batch read and wrote nothing.
        Whether the batch is in is decided by the newest marker's offsets (its batch time only
        tells an end beyond the batch's apart, and judges a batch that read nothing)."""
        self.producer()
        if self._in_already(batch_time_ms, ranges):
            return False
        ready = ReadyRecords(self, batch_time_ms, rdd)  # the jobs run before the transaction opens
        producer = self.producer()
        attempt = uuid.uuid4().hex[:12]
        self.broker_call("begin_transaction", producer.begin_transaction)
        began = time.monotonic()
        try:
            produced = self._produce(producer, batch_time_ms, ready)
            if not produced and not any(r.untilOffset > r.fromOffset for r in ranges):
                self.broker_call("abort_transaction", producer.abort_transaction, self.timeout_s)
                return False  # nothing to make visible: no transaction
            return self.commit_batch(batch_time_ms, ranges, attempt, produced)
        except BaseException as e:
            self.abort(producer)
            open_ms = (time.monotonic() - began) * 1000
            if isinstance(e, (KafkaSinkError, StorageUnavailableError)) and open_ms > self.transaction_timeout_ms:
                raise KafkaSinkError(f"{self.name}: batch {batch_time_ms}: " + transaction_timed_out(
                    open_ms, self.transaction_timeout_ms, str(e))) from e
            raise
        finally:
            ready.release()

    def _in_already(self, batch_time_ms: int, ranges: list[OffsetRange]) -> bool:
        """Whether the newest marker's offsets hold the batch: every range with records ends
        there (True), or none of them has begun (False); anything else is an error naming both."""
        ends = self._ends()
        with_data = [r for r in ranges if r.untilOffset > r.fromOffset]
        if not with_data:  # no offsets to decide by (a window's output of a batch that read nothing)
            last = self.committed_batch()
            return last is not None and last >= batch_time_ms
        last = None if self._last is None else int(self._last["batchTimeMs"])
        done = [range_in_sink(r, batch_time_ms, ends.get(r.topicPartition()), last) for r in with_data]
        if None in done:
            advance_ends(self.name, ends, batch_time_ms, ranges, f"the Kafka topic {self.topic}'s")  # raises
        if all(done):
            log.info("%s: batch %d is in %s already (the newest marker's offsets end where it does); "
                     "not written again", self.name, batch_time_ms, self.topic)
            return True
        if any(done):
            raise SinkOffsetsError(f"{self.name}: batch {batch_time_ms} is partly in {self.topic} "
                                   f"({sum(done)} of {len(done)} partitions) by the newest marker's offsets")
        return False

    def _produce(self, producer, batch_time_ms: int, parts: Iterable[list]) -> int:
        """Every record into the open transaction, flushed (each delivered, or an error)."""
        self._spans.reset()
        partitions = self.broker_call("metadata", partition_count, producer, self.topic, self.conf, self.timeout_s)
        n = sum(produce_records(producer, self.topic, records, self._spans, partitions) for records in parts)
        start = time.monotonic()
        if producer.flush(self.timeout_s) > 0:
            raise StorageUnavailableError(f"Kafka produce of batch {batch_time_ms}", self.bootstrap, 1,
                                          time.monotonic() - start, TimeoutError("records not delivered"))
        if self._spans.failed is not None:
            failure = import_confluent_kafka().KafkaException(self._spans.failed)
            raise self.error_of(f"produce of batch {batch_time_ms}", failure, start)
        return n

    def commit_batch(self, batch_time_ms: int, ranges: list[OffsetRange], attempt: str, records: int) -> bool:
        """The batch's marker and the transaction's commit."""
        ends = advance_ends(self.name, self._ends(), batch_time_ms, ranges, f"the Kafka topic {self.topic}'s")
        marker = {"sink": self.name, "batchTimeMs": batch_time_ms, "attempt": attempt, "records": records,
                  "offsets": [[tp.topic, tp.partition, o] for tp, o in ends.items()],
                  "written": [[p, first, last] for p, (first, last) in sorted(self._spans.written.items())]}
        producer = self.producer()
        producer.produce(self.marker_topic, json.dumps(marker).encode(), self.name.encode())
        self.broker_call(f"commit of batch {batch_time_ms}", producer.commit_transaction, self.timeout_s)
        self._last = marker
        return True

    def _ends(self) -> dict[TopicPartition, int]:
        return {} if self._last is None else {TopicPartition(t, p): int(o) for t, p, o in self._last["offsets"]}

    def abort(self, producer) -> None:
        """After a failed write: abort the open transaction, and start afresh at the next batch
        (a commit whose answer never came may have happened: the next ``init_transactions``
        settles it and the newest marker is read again)."""
        try:
            producer.abort_transaction(self.timeout_s)
        except import_confluent_kafka().KafkaException as e:
            log.warning("%s: aborting the transaction failed (%s)", self.name, e)
        self._producer, self._last = None, None


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")

