"""Kafka direct streams for Python, as pyspark 2.x's removed ``KafkaUtils`` had them, on
confluent-kafka (the optional extra ``sparkwal[kafka]``).

    from sparkwal.engine.kafka import KafkaUtils
    stream = KafkaUtils.createDirectStream(ssc, ["events"], {"metadata.broker.list": "host:9092"})
    stream.map(lambda kv: kv[1])...   # records are (key, value), decoded as UTF-8 by default

Each batch is a range of offsets per topic partition, from the broker's high watermarks, logged
to the checkpoint's offset log before the batch runs (:mod:`sparkwal.engine.sources.batch_log`) and read
by tasks with an assigned consumer (``assign`` + ``seek``; no consumer group membership). With no
checkpoint the stream starts at ``fromOffsets`` ({(topic, partition): offset}), else at
``auto.offset.reset``: ``smallest``/``earliest`` or ``largest``/``latest`` (the default, as in
pyspark 2). The stream never commits consumer-group offsets: the checkpoint is the source of
truth (an output may commit them itself). A partition added to a topic later is read from its
earliest offset.

``kafkaParams`` are passed to confluent-kafka's consumer, with pyspark 2's names translated
(``metadata.broker.list`` -> ``bootstrap.servers``); ``enable.auto.commit`` is always false.
``sparkwal.kafka.pollTimeoutMs`` (default 120000) bounds a task's wait for a planned range.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from .sources.protocol import DataLossError, ReplayableSource, SourceError, TopicPartition

log = logging.getLogger(__name__)

_OURS = ("auto.offset.reset", "sparkwal.kafka.pollTimeoutMs", "metadata.broker.list")
_RESET = {"smallest": "earliest", "earliest": "earliest", "largest": "latest", "latest": "latest"}
_task_consumers: dict[tuple, Any] = {}  # one consumer per configuration in each Python worker
_task_lock = threading.Lock()


#: pyspark 2's name for a (topic, partition) key of ``fromOffsets``
TopicAndPartition = TopicPartition


def utf8_decoder(s: bytes | None) -> str | None:
    """pyspark 2's default decoder."""
    return None if s is None else s.decode("utf-8")


def _consumer_conf(params: dict) -> dict:
    conf = {k: v for k, v in params.items() if k not in _OURS}
    if "metadata.broker.list" in params:
        conf.setdefault("bootstrap.servers", params["metadata.broker.list"])
    if "bootstrap.servers" not in conf:
        raise ValueError("kafkaParams need metadata.broker.list or bootstrap.servers")
    conf.setdefault("group.id", f"sparkwal-{uuid.uuid4().hex[:12]}")
    conf["enable.auto.commit"] = False
    conf.setdefault("enable.partition.eof", False)
    return conf


class KafkaSource(ReplayableSource):
    """The partitions of ``topics`` as a :class:`ReplayableSource` of (key, value) records."""

    def __init__(self, topics: list[str], kafkaParams: dict, keyDecoder: Callable = utf8_decoder,
                 valueDecoder: Callable = utf8_decoder, metadata_timeout_s: float = 30.0):
        if isinstance(topics, str) or not topics or not all(isinstance(t, str) and t for t in topics):
            raise ValueError(f"topics must be a non-empty list of topic names, got {topics!r}")
        reset = str(kafkaParams.get("auto.offset.reset", "largest")).lower()
        if reset not in _RESET:
            raise ValueError(f"auto.offset.reset must be smallest/earliest or largest/latest, got {reset!r}")
        self.topics = list(topics)
        self.params = dict(kafkaParams)
        self.reset = _RESET[reset]
        self.conf = _consumer_conf(self.params)
        self.key_decoder, self.value_decoder = keyDecoder, valueDecoder
        self.timeout_s = metadata_timeout_s
        self.poll_timeout_s = float(self.params.get("sparkwal.kafka.pollTimeoutMs", 120_000)) / 1000
        self._consumer = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    def _driver(self):
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self.conf)
        return self._consumer

    def describe(self) -> str:
        return f"Kafka({','.join(self.topics)})"

    def identity(self) -> str:
        """Its topics, in any order (not its brokers: name the stream with ``uid`` to start a new
        cluster's offsets from scratch)."""
        return f"Kafka({','.join(sorted(self.topics))})"

    def partitions(self) -> list[TopicPartition]:
        md = self._driver().list_topics(timeout=self.timeout_s)
        out = []
        for t in self.topics:
            topic = md.topics.get(t)
            if topic is None or topic.error is not None:
                raise SourceError(f"Kafka topic {t!r} is not available: "
                                  f"{'unknown' if topic is None else topic.error}")
            out += [TopicPartition(t, p) for p in sorted(topic.partitions)]
        return out

    def _watermarks(self, partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KTP

        out = {}
        for tp in partitions:
            try:
                out[tp] = self._driver().get_watermark_offsets(KTP(tp.topic, int(tp.partition)),
                                                               timeout=self.timeout_s, cached=False)
            except KafkaException as e:
                raise SourceError(f"Kafka {tp.topic}/{tp.partition}: no watermarks ({e})") from None
        return out

    def latest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: high for tp, (_low, high) in self._watermarks(partitions).items()}

    def earliest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: low for tp, (low, _high) in self._watermarks(partitions).items()}

    def initial_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        marks = self._watermarks(partitions)
        return {tp: (low if self.reset == "earliest" else high) for tp, (low, high) in marks.items()}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # ------------------------------------------------------------------ task side

    def read(self, partition: TopicPartition, from_offset: int, until_offset: int,
             hint=None) -> Iterator[tuple]:
        from confluent_kafka import Consumer, KafkaError
        from confluent_kafka import TopicPartition as KTP

        key = tuple(sorted((k, str(v)) for k, v in self.conf.items()))
        with _task_lock:
            consumer = _task_consumers.get(key)
            if consumer is None:
                consumer = _task_consumers[key] = Consumer(self.conf)
        consumer.assign([KTP(partition.topic, int(partition.partition), from_offset)])
        try:
            next_offset = from_offset
            deadline = time.monotonic() + self.poll_timeout_s
            while next_offset < until_offset:
                messages = consumer.consume(min(10_000, until_offset - next_offset), timeout=1.0)
                for m in messages:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        if err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                            raise DataLossError(f"offsets [{next_offset}, {until_offset}) are no "
                                                f"longer in Kafka ({err.str()})")
                        raise SourceError(f"Kafka error: {err.str()}")
                    if m.offset() < next_offset:
                        continue
                    if m.offset() >= until_offset:
                        break
                    next_offset = m.offset() + 1
                    yield self.key_decoder(m.key()), self.value_decoder(m.value())
                if next_offset < until_offset and time.monotonic() > deadline:
                    raise SourceError(f"read only up to offset {next_offset} of [{from_offset}, "
                                      f"{until_offset}) within {self.poll_timeout_s} s")
        finally:
            consumer.unassign()


class KafkaUtils:
    """pyspark 2.x's ``pyspark.streaming.kafka.KafkaUtils`` (its direct approach)."""

    @staticmethod
    def createDirectStream(ssc, topics: list[str], kafkaParams: dict, fromOffsets: dict | None = None,
                           keyDecoder: Callable = utf8_decoder, valueDecoder: Callable = utf8_decoder,
                           messageHandler: Callable | None = None):
        """A direct stream of (key, value) records of ``topics`` (``messageHandler``, if given,
        maps each (key, value) instead)."""
        source = KafkaSource(topics, kafkaParams, keyDecoder, valueDecoder)
        stream = ssc.directStream(source, fromOffsets=fromOffsets)
        return stream.map(messageHandler) if messageHandler is not None else stream
