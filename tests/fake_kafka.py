"""A broker in memory with Kafka's transactional semantics, as a ``confluent_kafka`` module for
the calls the Kafka sink's task side makes (tests/test_kafka_attempts.py).

Why not the Tansu broker the other Kafka tests use: Tansu 0.6 neither fences a transactional id's
earlier producer at ``init_transactions`` nor hides open or aborted transactions from
``read_committed`` readers, and those are the two behaviours of Kafka that decide whether two
attempts of one task can both commit. Here, as in Kafka: ``init_transactions`` bumps the id's
epoch and aborts its open transaction; a producer of an older epoch fails with
``PRODUCER_FENCED``; a ``read_committed`` consumer reads up to the last stable offset (the first
offset of a transaction still open), never an aborted record, and says end of partition there.
Hooks: ``broker.before_commit(producer)`` runs at each commit (a test pauses an attempt there),
``broker.before_produce(producer, topic)`` at each record; ``broker.events`` lists transactions begun;
``broker.waiting`` is set when a reader stops below the high watermark (an open transaction)."""

from __future__ import annotations

import threading
import types

_PARTITION_EOF = -191


class KafkaError:
    _PARTITION_EOF = _PARTITION_EOF

    def __init__(self, code, name: str = "", text: str = ""):
        self._code, self._name, self._text = code, name, text or name

    def code(self):
        return self._code

    def name(self) -> str:
        return self._name

    def str(self) -> str:
        return self._text

    def retriable(self) -> bool:
        return False

    def fatal(self) -> bool:
        return self._name == "PRODUCER_FENCED"


class KafkaException(Exception):
    pass


class TopicPartition:
    def __init__(self, topic, partition=0, offset=0):
        self.topic, self.partition, self.offset = topic, partition, offset


class _Record:
    def __init__(self, topic, partition, offset, key, value, headers, txn):
        self.topic, self.partition, self.offset = topic, partition, offset
        self.key, self.value, self.headers, self.txn = key, value, headers, txn


class Broker:
    def __init__(self, partitions: dict[str, int]):
        self.partitions = dict(partitions)
        self.log: dict[tuple, list[_Record]] = {}
        self.epochs: dict[str, int] = {}
        self.open: dict[str, dict] = {}  # transactional id -> {"epoch", "records"}
        self.state: dict[int, str] = {}  # a transaction (its serial) -> open / committed / aborted
        self.lock = threading.RLock()
        self.serial = 0
        self.before_commit = lambda producer: None
        self.before_produce = lambda producer, topic: None
        self.events: list[str] = []  # "begin <transactional id>" as transactions begin
        self.waiting = threading.Event()

    def records(self, topic: str, partition: int = 0, committed: bool = True) -> list[_Record]:
        with self.lock:
            return [r for r in self.log.get((topic, partition), [])
                    if not committed or self.state.get(r.txn) == "committed"]

    def lso(self, topic: str, partition: int) -> int:
        with self.lock:
            log = self.log.get((topic, partition), [])
            return next((r.offset for r in log if self.state.get(r.txn) == "open"), len(log))

    def module(self) -> types.ModuleType:
        broker = self
        m = types.ModuleType("confluent_kafka")
        m.KafkaError, m.KafkaException, m.TopicPartition = KafkaError, KafkaException, TopicPartition

        class Producer(_Producer):
            def __init__(self, conf):
                super().__init__(broker, conf)

        class Consumer(_Consumer):
            def __init__(self, conf):
                super().__init__(broker, conf)

        m.Producer, m.Consumer = Producer, Consumer
        return m


def _fenced(txid: str) -> KafkaException:
    return KafkaException(KafkaError(90, "PRODUCER_FENCED", f"{txid}: fenced by a newer producer"))


class _Metadata:
    def __init__(self, broker: Broker):
        self.topics = {t: types.SimpleNamespace(partitions={p: None for p in range(n)}, error=None)
                       for t, n in broker.partitions.items()}


class _Producer:
    def __init__(self, broker: Broker, conf: dict):
        self.broker, self.txid, self.epoch, self.txn = broker, conf["transactional.id"], None, None
        self.pending: list = []

    def list_topics(self, topic=None, timeout=None):
        return _Metadata(self.broker)

    def init_transactions(self, timeout=None):
        b = self.broker
        with b.lock:
            self.epoch = b.epochs[self.txid] = b.epochs.get(self.txid, 0) + 1
            old = b.open.pop(self.txid, None)
            if old is not None:
                b.state[old["txn"]] = "aborted"

    def _check(self):
        if self.broker.epochs.get(self.txid) != self.epoch:
            raise _fenced(self.txid)

    def begin_transaction(self):
        b = self.broker
        b.events.append(f"begin {self.txid}")
        with b.lock:
            b.serial += 1
            self.txn = b.serial
            b.state[self.txn] = "open"
            b.open[self.txid] = {"txn": self.txn, "epoch": self.epoch}

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None, callback=None, timestamp=0,
                headers=None):
        on_delivery = on_delivery or callback
        self.broker.before_produce(self, topic)
        b = self.broker
        with b.lock:
            self._check()
            partition = 0 if partition in (-1, None) else partition
            log = b.log.setdefault((topic, partition), [])
            record = _Record(topic, partition, len(log), key, value if value is None or isinstance(value, bytes)
                             else str(value).encode(), headers, self.txn)
            log.append(record)
        if on_delivery is not None:
            self.pending.append((on_delivery, record))

    def poll(self, timeout=None):
        pending, self.pending = self.pending, []
        for callback, record in pending:
            callback(None, types.SimpleNamespace(partition=lambda r=record: r.partition,
                                                 offset=lambda r=record: r.offset))
        return len(pending)

    def flush(self, timeout=None):
        self.poll()
        return 0

    def commit_transaction(self, timeout=None):
        self.broker.before_commit(self)
        b = self.broker
        with b.lock:
            if b.epochs.get(self.txid) != self.epoch or b.state.get(self.txn) != "open":
                raise _fenced(self.txid)
            b.state[self.txn] = "committed"
            b.open.pop(self.txid, None)

    def abort_transaction(self, timeout=None):
        b = self.broker
        with b.lock:
            if b.state.get(self.txn) == "open":
                b.state[self.txn] = "aborted"
            if b.open.get(self.txid, {}).get("txn") == self.txn:
                b.open.pop(self.txid, None)


class _Message:
    def __init__(self, record=None, error=None, topic=None, partition=None, offset=None):
        self._record, self._error = record, error
        self._where = (topic, partition, offset) if record is None else (record.topic, record.partition, record.offset)

    def error(self):
        return self._error

    def key(self):
        return self._record.key

    def value(self):
        return self._record.value

    def headers(self):
        return self._record.headers

    def topic(self):
        return self._where[0]

    def partition(self):
        return self._where[1]

    def offset(self):
        return self._where[2]


class _Consumer:
    def __init__(self, broker: Broker, conf: dict):
        self.broker, self.committed_only = broker, conf.get("isolation.level") == "read_committed"
        self.positions: dict[tuple, int] = {}
        self.eof_at: dict[tuple, int] = {}

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        """(low, high): high is the last stable offset for a ``read_committed`` consumer (librdkafka's answer)."""
        if self.committed_only:
            return 0, self.broker.lso(tp.topic, tp.partition)
        return 0, len(self.broker.log.get((tp.topic, tp.partition), []))

    def assign(self, partitions):
        self.positions = {(tp.topic, tp.partition): tp.offset for tp in partitions}

    def consume(self, num_messages=1, timeout=None):
        out = []
        b = self.broker
        with b.lock:
            for (topic, partition), position in self.positions.items():
                log = b.log.get((topic, partition), [])
                end = b.lso(topic, partition) if self.committed_only else len(log)
                while position < end and len(out) < num_messages:
                    record = log[position]
                    position += 1
                    if not self.committed_only or b.state.get(record.txn) == "committed":
                        out.append(_Message(record))
                self.positions[(topic, partition)] = position
                if position == end and self.eof_at.get((topic, partition)) != end:
                    self.eof_at[(topic, partition)] = end
                    out.append(_Message(error=KafkaError(_PARTITION_EOF, "_PARTITION_EOF"), topic=topic,
                                        partition=partition, offset=end))
                    if end < len(log):
                        b.waiting.set()
        if not out and timeout:
            threading.Event().wait(min(timeout, 0.01))  # (a real consumer's poll blocks up to its timeout)
        return out

    def close(self):
        pass
