"""The reading side of :class:`~sparkwal.engine.sinks.KafkaSink`: its topics checked and created,
the start-up probe of the broker's transactions, its markers and records read back
(``read_committed``, each partition up to its end). The marker format is described in
:mod:`sparkwal.engine.sinks.kafka`."""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sparkwal.wal import StorageUnavailableError

from ..errors import EngineError

log = logging.getLogger(__name__)

#: error names of confluent-kafka that mean the broker is out of reach (after librdkafka's retries)
ATTEMPT_HEADER = "sparkwal.attempt"  #: a record's write, where the broker shows aborted records (per partition)
BROKER_UNREACHABLE = {"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT",
                "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
                "NETWORK_EXCEPTION", "_RESOLVE", "_WAIT_COORD", "NOT_ENOUGH_REPLICAS", "LEADER_NOT_AVAILABLE"}


#: producer settings that are secrets: never pickled (see :class:`KafkaSink`)
SECRET_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret")


def with_secrets(conf: dict) -> dict:
    """``conf`` with each secret it lacks from the environment variable ``SPARKWAL_KAFKA_<KEY>``
    (``SPARKWAL_KAFKA_SASL_PASSWORD``): a sink recovered from a checkpoint, an executor's task."""
    conf = dict(conf)
    for key in (k for k in SECRET_KEYS if k not in conf):
        value = os.environ.get("SPARKWAL_KAFKA_" + key.upper().replace(".", "_"))
        if value:
            conf[key] = value
    return conf


class KafkaSinkError(EngineError, RuntimeError):
    """The broker refused the sink's work (the message names the topic, the batch and Kafka's error)."""


def import_confluent_kafka():
    try:
        import confluent_kafka
    except ImportError as e:  # pragma: no cover - the test extra has it
        raise ImportError("KafkaSink needs the confluent-kafka package: pip install 'sparkwal[kafka]'") from e
    return confluent_kafka


librdkafka_log = logging.getLogger("sparkwal.kafka.librdkafka")  #: librdkafka's own lines, not stderr

#: the producer settings a reader or an admin client takes too (where and how to connect)
_CLIENT_PREFIXES = ("bootstrap.servers", "client.id", "security.", "sasl.", "ssl.", "socket.",
                    "broker.address.", "client.dns.", "reconnect.")

#: the sink's clients' ``reconnect.backoff.ms`` unless ``producer_conf`` sets it. librdkafka drops its
#: bootstrap connection after the first metadata answer and connects to a broker that answer named
#: only after half of this (100 ms by default; at least 11 ms): 50 ms of every producer's
#: ``init_transactions`` here, 15 ms in all at 20 (the debug log's "still suppressed for 48ms"). It is
#: also the first wait before reconnecting to a broker that went away (doubled each time, up to
#: ``reconnect.backoff.max.ms``).
RECONNECT_BACKOFF_MS = 20


def client_conf(sink, **extra) -> dict:
    return client_settings(sink.conf, **extra)


def client_settings(producer_conf: dict, **extra) -> dict:
    """What a reader or an admin client takes of a producer's configuration, and ``extra``."""
    conf = {k: v for k, v in producer_conf.items() if k.startswith(_CLIENT_PREFIXES)}
    return {**conf, "logger": librdkafka_log, **extra}


def init_transactions(producer, topic: str, timeout_s: float) -> None:
    """``producer.init_transactions``, once a connection to a broker it learned is up: librdkafka
    drops its bootstrap connection after the first metadata answer, and an ``init_transactions``
    that then finds no broker up waits 500 ms to ask for its coordinator again (one task in six
    here). A second metadata request waits for the learned broker's connection instead."""
    producer.list_topics(topic, timeout=timeout_s)
    producer.list_topics(topic, timeout=timeout_s)
    producer.init_transactions(timeout_s)


def unreachable(e: BaseException) -> bool:
    """Whether confluent-kafka's error means the broker is out of reach (after librdkafka's retries)."""
    err = e.args[0] if e.args and hasattr(e.args[0], "name") else None
    return err is None or err.name() in BROKER_UNREACHABLE or (err.retriable() and not err.fatal())


def ensure_topics(sink) -> None:
    """The data topic must exist (its partitions are the user's choice), unless the sink names
    its partitions; the marker topic is created if missing: one partition, kept forever
    (``retention.ms=-1``)."""
    kafka = import_confluent_kafka()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client_conf(sink))
    start = time.monotonic()
    try:
        metadata = admin.list_topics(timeout=sink.timeout_s)
        topics, replicas = metadata.topics, min(3, len(metadata.brokers) or 1)
        new = []
        if sink.topic not in topics or topics[sink.topic].error is not None:
            if sink.partitions is None:
                raise KafkaSinkError(f"{sink.name}: the topic {sink.topic} does not exist at {sink.bootstrap}: "
                                     "create it with the partitions it needs (or give KafkaSink partitions=)")
            new.append(NewTopic(sink.topic, sink.partitions, replicas))
        if sink.marker_topic not in topics or topics[sink.marker_topic].error is not None:
            new.append(NewTopic(sink.marker_topic, 1, replicas, config={"retention.ms": "-1"}))
        for name, future in admin.create_topics(new).items() if new else ():
            try:
                future.result(sink.timeout_s)
            except kafka.KafkaException as e:
                if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
            log.info("%s: created the topic %s", sink.name, name)
    except kafka.KafkaException as e:
        raise sink.error_of("topic check", e, start) from e


def _reader(sink):
    kafka = import_confluent_kafka()
    return kafka.Consumer(client_conf(sink, **{"group.id": f"sparkwal-reader-{uuid.uuid4().hex[:12]}",
                                               "isolation.level": "read_committed", "enable.auto.commit": False,
                                               "enable.partition.eof": True, "fetch.wait.max.ms": 10}))


def read_to_end(sink, starts: dict[tuple[str, int], int]) -> Iterator:
    """The committed messages of each ``(topic, partition)`` from its start offset to its end."""
    kafka = import_confluent_kafka()
    consumer = _reader(sink)
    try:
        consumer.assign([kafka.TopicPartition(t, p, o) for (t, p), o in starts.items()])
        pending, deadline = set(starts), time.monotonic() + sink.timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise StorageUnavailableError(f"Kafka read of {sorted(pending)}", sink.bootstrap, 1,
                                              sink.timeout_s, TimeoutError("the partitions' ends not reached"))
            for msg in consumer.consume(10_000, 0.05):
                error = msg.error()
                if error is None:
                    yield msg
                elif error.code() == kafka.KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                else:
                    raise sink.error_of("read", kafka.KafkaException(error), deadline - sink.timeout_s)
    finally:
        consumer.close()


class Watermarks:
    """Partitions' low and high watermarks, asked of one ``read_committed`` consumer kept until
    :meth:`close` (the sink's): opening a consumer for each question costs about 4 ms, asking a
    kept one under 1 ms, and every per-partition batch asks. Never pickled.

    A consumer's answer "unknown topic or partition" may come from its own stale metadata (a
    topic created moments before, a broker that had not yet listed it): the sink would then read
    an empty marker topic, take every batch for unwritten and write it again. Such an answer is
    (0, 0) only once the broker's own topic list confirms it; otherwise a new consumer is asked,
    within the sink's ``timeout_s``. ``new_consumer(sink)`` makes the consumer (tests inject one)."""

    UNKNOWN = ("_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART")

    def __init__(self, new_consumer: Callable[[Any], Any] | None = None):
        self._new_consumer = new_consumer or _reader
        self._consumer: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, _state: dict) -> None:
        self._new_consumer, self._consumer, self._lock = _reader, None, threading.Lock()

    def of(self, sink, topic: str, partition: int) -> tuple[int, int]:
        """The partition's low and high watermarks; (0, 0) if the broker does not list the partition."""
        kafka = import_confluent_kafka()
        start = time.monotonic()
        with self._lock:
            while True:
                if self._consumer is None:
                    self._consumer = self._new_consumer(sink)
                try:
                    return self._consumer.get_watermark_offsets(kafka.TopicPartition(topic, partition),
                                                                sink.timeout_s)
                except kafka.KafkaException as e:
                    self._close()  # (the next question asks a new consumer, with no metadata cached)
                    if e.args[0].name() not in self.UNKNOWN or time.monotonic() - start > sink.timeout_s:
                        raise sink.error_of("watermarks", e, start) from e
                    if not partition_listed(sink, topic, partition):
                        return 0, 0
                    log.info("%s: a consumer did not know %s[%d], which the broker lists; asking again",
                             sink.name, topic, partition)
                    time.sleep(0.05)  # (a backoff between two questions to the broker, not a wait for an event)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def partition_listed(sink, topic: str, partition: int) -> bool:
    """Whether the broker lists the partition."""
    listed = listed_topic(sink, topic)
    return listed is not None and partition in listed.partitions


def listed_topic(sink, topic: str):
    """The topic's metadata from the broker's list of every topic, None if it is not there. Asking
    for the one topic instead would create it on a broker that creates topics on first mention
    (Kafka's default, and Tansu's): a reader must not."""
    kafka = import_confluent_kafka()
    from confluent_kafka.admin import AdminClient

    start = time.monotonic()
    try:
        listed = AdminClient(client_conf(sink)).list_topics(timeout=sink.timeout_s).topics.get(topic)
    except kafka.KafkaException as e:
        raise sink.error_of("metadata", e, start) from e
    return listed if listed is not None and listed.error is None else None


def _watermarks(sink, topic: str, partition: int) -> tuple[int, int]:
    return sink.watermarks.of(sink, topic, partition)


def _markers(sink, messages) -> Iterator[dict]:
    for msg in messages:
        try:
            marker = json.loads(msg.value())
        except (TypeError, ValueError):
            continue  # not a marker (the topic is shared with something else)
        if isinstance(marker, dict) and marker.get("sink") == sink.name and "batchTimeMs" in marker:
            yield marker


def read_markers(sink, since: int = 0) -> Iterator[dict]:
    """Every committed marker of the sink (from the marker topic's offset ``since``), oldest first."""
    low, high = _watermarks(sink, sink.marker_topic, 0)
    start = max(low, since)
    return _markers(sink, read_to_end(sink, {(sink.marker_topic, 0): start}) if high > start else ())


def partition_ends(ends: dict, batches: dict, marker: dict) -> None:
    """A per-partition marker applied to ``ends`` (TopicPartition -> end) and ``batches`` (->
    the batch that wrote the furthest records): a marker of an empty range (the driver's, of a
    partition without output) only where the partition has no end, and never in ``batches``."""
    from ..sources.protocol import TopicPartition

    tp = TopicPartition(*marker["source"])
    until = int(marker["until"])
    if int(marker["from"]) == until:
        ends.setdefault(tp, until)
    elif tp not in batches or until >= ends[tp]:  # data markers own the end; the furthest: a late commit
        ends[tp], batches[tp] = until, int(marker["batchTimeMs"])  # of an older range moves nothing back


def marker_topic_end(sink) -> int:
    """The marker topic's end offset now (where a batch's markers begin)."""
    return _watermarks(sink, sink.marker_topic, 0)[1]


def read_newest_marker(sink) -> dict | None:
    """The newest committed marker of the sink: the topic's tail, read back further until one is found."""
    low, high = _watermarks(sink, sink.marker_topic, 0)
    if high <= low:
        return None
    span = 64
    while True:
        start = max(low, high - span)
        found = [m for m in _markers(sink, read_to_end(sink, {(sink.marker_topic, 0): start})) if "source" not in m]
        if found:
            return found[-1]
        if start <= low:
            return None
        span *= 8


def read_records(sink) -> Iterator[tuple[int, int, bytes | None, bytes | None, bytes | None]]:
    """``(partition, offset, key, value, its sparkwal.attempt header)`` of every committed record
    of the data topic, in partition then offset order; none if the topic does not exist."""
    listed = listed_topic(sink, sink.topic)
    partitions = sorted(listed.partitions) if listed is not None else []  # (no topic: nothing committed)
    starts = {(sink.topic, p): _watermarks(sink, sink.topic, p)[0] for p in partitions}
    by_partition: dict[int, list] = {p: [] for p in partitions}
    for msg in read_to_end(sink, starts):
        attempt = next((v for k, v in msg.headers() or () if k == ATTEMPT_HEADER), None)
        by_partition[msg.partition()].append((msg.offset(), msg.key(), msg.value(), attempt))
    for p in partitions:
        for offset, key, value, attempt in sorted(by_partition[p], key=lambda r: r[0]):
            yield p, offset, key, value, attempt


def probe_transactions(sink, producer) -> bool:
    """Whether the broker hides an aborted transaction's records from ``read_committed`` readers:
    a probe record aborted in the marker topic, then read back."""
    probe = uuid.uuid4().hex
    offsets: list = []
    sink.broker_call("probe transaction", producer.begin_transaction)
    producer.produce(sink.marker_topic, json.dumps({"sink": sink.name, "probe": probe}).encode(),
                     b"sparkwal.probe", on_delivery=lambda err, msg: offsets.append(None if err else msg.offset()))
    producer.flush(sink.timeout_s)
    sink.broker_call("probe abort", producer.abort_transaction, sink.timeout_s)
    if not offsets or offsets[0] is None:
        raise KafkaSinkError(f"{sink.name}: the probe record was not delivered to {sink.marker_topic} "
                             f"at {sink.bootstrap}")
    seen = any(probe.encode() in (msg.value() or b"")
               for msg in read_to_end(sink, {(sink.marker_topic, 0): offsets[0]}))
    return not seen


def committed_records(sink) -> list[tuple[bytes | None, bytes | None]]:
    """The sink's committed records, ``(key, value)`` in partition then offset order: only records
    within a marker's ``written`` span (of their own write, where the write tagged them), and
    of markers whose source range begins where the kept ones of its partition end or later."""
    spans: dict[int, list[tuple[int, int]]] = {}  # untagged writes' spans, merged per partition
    tagged: dict[tuple, tuple[int, int]] = {}  # (partition, attempt) -> its span
    covered: dict[tuple, int] = {}  # per source partition: the end of the ranges kept so far
    for marker in read_markers(sink):
        if "source" in marker and int(marker["from"]) < int(marker["until"]):  # (an empty range's: nothing)
            source = tuple(marker["source"])
            if int(marker["from"]) < covered.get(source, int(marker["from"])):
                continue  # a range kept already, written again (a broker that did not fence an attempt)
            covered[source] = max(covered.get(source, 0), int(marker["until"]))
        for partition, first, last in marker.get("written", ()):
            if marker.get("tagged"):
                tagged[(partition, marker["attempt"].encode())] = (first, last)
            else:
                spans.setdefault(partition, []).append((first, last))
    merged = {p: _merged(s) for p, s in spans.items()}
    return [(key, value) for partition, offset, key, value, attempt in read_records(sink)
            if (_within(tagged[(partition, attempt)], offset) if (partition, attempt) in tagged
                else _within_any(merged.get(partition, []), offset))]


def _within(span: tuple[int, int], offset: int) -> bool:
    return span[0] <= offset <= span[1]


def _within_any(spans: list[tuple[int, int]], offset: int) -> bool:
    """Whether ``offset`` is in one of the sorted, disjoint ``[first, last]`` spans."""
    i = bisect.bisect_right(spans, (offset, float("inf"))) - 1
    return i >= 0 and _within(spans[i], offset)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping spans (per-partition writes interleave) merged: sorted and disjoint."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out
