"""Transactional output: a batch's results and its offsets in one database transaction.

The second exactly-once recipe of Spark's direct Kafka guide: the database, not the checkpoint,
is the source of truth of how far the output got. Each batch runs, in ONE transaction:

1. read the sink's stored offset of every partition the batch read;
2. if each equals the batch's range start (or is absent): write the results (the caller's
   ``write``), store the range ends (and, for a partition without records in the batch and no
   stored end, where it stands), commit. If each equals the range end, or lies beyond it where a
   later batch stored it (outputs go in batch order: an in-order output that failed stops the
   later batches'), the batch is already in the database (a re-run after a crash between the
   database commit and the checkpoint's): nothing is written. Anything else is an error naming
   the partition and both offsets (the database and the stream disagree: another writer, or a
   stream started from the wrong offsets) (:func:`~sparkwal.engine.sources.protocol.range_in_sink`);
3. on restart, ``offsets()`` gives the stored ends, to pass as ``directStream(fromOffsets=...)``:
   with or without a checkpoint, the output is exactly once.

Results are collected to the driver and written there (aggregates, as in a word count: a batch's
results must fit the driver). Table (created if missing)::

    sparkwal_offsets(sink TEXT, topic TEXT, partition TEXT  -- JSON of the partition (1, "a")
                     until_offset BIGINT, batch_time_ms BIGINT,
                     PRIMARY KEY (sink, topic, partition))

The seam is :class:`DbApiSink` (any DB-API 2 connection: ``connect``, the ``BEGIN`` statement
and the placeholder style); :class:`SQLiteSink` is its SQLite implementation,
:class:`~sparkwal.engine.sinks.PostgresSink` its PostgreSQL one (which also stages rows from the
executors instead of collecting them).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime

from ..sources.protocol import OffsetRange, SinkOffsets, TopicPartition, range_in_sink
from ..dstream import ForEachDStream
from ..errors import EngineError

log = logging.getLogger(__name__)


class SinkOffsetsError(EngineError, RuntimeError):
    """The database's stored offsets do not fit the batch (the message names both)."""


class DbApiSink(ABC):
    """Exactly-once output of batches into a database through DB-API 2 connections."""

    placeholder = "?"  #: the driver's paramstyle marker ("?" qmark, "%s" format)
    begin_sql = "BEGIN"

    def __init__(self, name: str):
        if not name or not isinstance(name, str):
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self.name = name

    @abstractmethod
    def connect(self):
        """A new DB-API connection (autocommit off or managed by ``begin_sql``)."""

    def _sql(self, text: str) -> str:
        return text.replace("?", self.placeholder)

    def _ensure_table(self, cur) -> None:
        # BIGINT: 64-bit offsets and times in every database (SQLite's INTEGER already is)
        cur.execute("CREATE TABLE IF NOT EXISTS sparkwal_offsets (sink TEXT NOT NULL, topic TEXT "
                    "NOT NULL, partition TEXT NOT NULL, until_offset BIGINT NOT NULL, "
                    "batch_time_ms BIGINT NOT NULL, PRIMARY KEY (sink, topic, partition))")

    def offsets(self) -> SinkOffsets:
        """The stored end offset of every partition: ``directStream(fromOffsets=...)`` (see
        :class:`~sparkwal.engine.sources.SinkOffsets`: a partition it lacks starts at its earliest)."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            self._ensure_table(cur)
            conn.commit()
            cur.execute(self._sql("SELECT topic, partition, until_offset FROM sparkwal_offsets "
                                  "WHERE sink = ?"), (self.name,))
            return SinkOffsets({TopicPartition(t, json.loads(p)): int(o) for t, p, o in cur.fetchall()})
        finally:
            conn.close()

    def commit_batch(self, batch_time_ms: int, ranges: list[OffsetRange],
                     write: Callable[[object], None]) -> bool:
        """Run ``write(cursor)`` and store ``ranges``' ends in one transaction; False (nothing
        written) if the database already holds this batch."""
        empty = [r for r in ranges if r.untilOffset <= r.fromOffset]
        ranges = [r for r in ranges if r.untilOffset > r.fromOffset]
        conn = self.connect()
        try:
            cur = conn.cursor()
            self._ensure_table(cur)
            conn.commit()
            cur.execute(self.begin_sql)
            try:
                self.lock_sink(cur)
                applied = self.batch_applied(cur, batch_time_ms, ranges)
                if not applied:
                    write(cur)
                    for r in ranges:
                        self._store(cur, r, batch_time_ms)
                for r in empty:  # every planned partition's end, records or not (see SinkOffsets)
                    self.store_if_missing(cur, r, batch_time_ms)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            if applied:
                log.info("%s: batch %d is already in the database; not written again", self.name,
                         batch_time_ms)
            return not applied
        finally:
            conn.close()

    def lock_sink(self, cur) -> None:
        """At the start of the sink's transaction: keep other writers of this sink out until its
        end, where ``begin_sql`` does not (SQLite's ``BEGIN IMMEDIATE`` does)."""

    def batch_applied(self, cur, batch_time_ms: int, ranges: list[OffsetRange]) -> bool:
        """True if every range is already applied; False if none is; else an error."""
        states = []
        for r in ranges:
            cur.execute(self._sql("SELECT until_offset, batch_time_ms FROM sparkwal_offsets WHERE sink = ? AND "
                                  "topic = ? AND partition = ?"),
                        (self.name, r.topic, json.dumps(r.partition)))
            row = cur.fetchone()
            stored = None if row is None else int(row[0])
            state = range_in_sink(r, batch_time_ms, stored, None if row is None else int(row[1]))
            if state is not None:
                states.append(state)
            else:
                raise SinkOffsetsError(
                    f"{self.name}: batch {batch_time_ms} reads {r.topic}/{r.partition} "
                    f"[{r.fromOffset}, {r.untilOffset}) but the database's output ends at offset "
                    f"{stored}: start the stream from the database's offsets (fromOffsets=sink.offsets())")
        if any(states) and not all(states):
            raise SinkOffsetsError(f"{self.name}: batch {batch_time_ms} is partly in the database "
                                   f"({sum(states)} of {len(states)} partitions)")
        return bool(states) and all(states)

    def store_if_missing(self, cur, r: OffsetRange, batch_time_ms: int) -> None:
        """Store ``r``'s end where the partition has none: a range without records never moves a
        stored end (another writer's, or one the stream disagrees with, is left for a batch with
        records to judge)."""
        cur.execute(self._sql("SELECT 1 FROM sparkwal_offsets WHERE sink = ? AND topic = ? AND partition = ?"),
                    (self.name, r.topic, json.dumps(r.partition)))
        if cur.fetchone() is None:
            self._store(cur, r, batch_time_ms)

    def _store(self, cur, r: OffsetRange, batch_time_ms: int) -> None:
        cur.execute(self._sql("DELETE FROM sparkwal_offsets WHERE sink = ? AND topic = ? AND "
                              "partition = ?"), (self.name, r.topic, json.dumps(r.partition)))
        cur.execute(self._sql("INSERT INTO sparkwal_offsets VALUES (?, ?, ?, ?, ?)"),
                    (self.name, r.topic, json.dumps(r.partition), r.untilOffset, batch_time_ms))

    def saveStream(self, dstream, offsetsFrom, write: Callable[[object, int, list], None]) -> None:
        """Each batch of ``dstream``: its records collected and ``write(cursor, batch_time_ms,
        records)`` run in the transaction that stores the offsets of ``offsetsFrom`` (the direct
        stream ``dstream`` derives from) for the batch."""
        sink = self

        def collect_and_commit(t: int, ranges: list[OffsetRange], rdd) -> None:
            records = rdd.collect()
            sink.commit_batch(t, ranges, lambda cur: write(cur, t, records))

        save_batches(dstream, offsetsFrom, collect_and_commit)


def advance_ends(name: str, ends: dict[TopicPartition, int], batch_time_ms: int, ranges: list[OffsetRange],
                 where: str) -> dict[TopicPartition, int]:
    """The sink's end offsets after the batch (``ends``: before it, as the sink stored them); an
    error naming the partition and both offsets if the batch does not start where ``where``
    (the sink's output, in words) ended."""
    ends = dict(ends)
    for r in ranges:
        tp = TopicPartition(r.topic, r.partition)
        if r.untilOffset <= r.fromOffset:
            ends.setdefault(tp, r.untilOffset)  # a partition without output yet: where the stream stands
            continue
        stored = ends.get(tp)
        if stored is not None and stored != r.fromOffset:
            raise SinkOffsetsError(
                f"{name}: batch {batch_time_ms} reads {r.topic}/{r.partition} [{r.fromOffset}, "
                f"{r.untilOffset}) but {where} output ends at offset {stored}: start the stream from "
                "the sink's offsets (fromOffsets=sink.offsets())")
        ends[tp] = r.untilOffset
    return ends


def batch_in_output(name: str, batch_time_ms: int, read: list[OffsetRange], ends: dict[TopicPartition, int],
                    stored_batch: int | None, where: str, output: str) -> bool:
    """Whether a table sink holds the batch whose ranges with records are ``read``, by the end
    offsets its newest commit stored (``ends``, written by batch ``stored_batch``): True if every
    range is in, False if none is; an error naming the partition and both offsets otherwise
    (``where``: the output's owner, "the Delta table's"; ``output``: the output in words)."""
    done, todo = [], []
    for r in read:
        stored = ends.get(TopicPartition(r.topic, r.partition))
        state = range_in_sink(r, batch_time_ms, stored, stored_batch)
        if state:
            done.append(r)
        elif state is not None:
            todo.append((r, stored))
        else:
            raise SinkOffsetsError(
                f"{name}: batch {batch_time_ms} reads {r.topic}/{r.partition} [{r.fromOffset}, "
                f"{r.untilOffset}) but {where} output ends at offset {stored}: start the "
                "stream from the sink's offsets (fromOffsets=sink.offsets())")
    if done and todo:
        (r, stored), d = todo[0], done[0]
        at = "no output" if stored is None else f"output ending at offset {stored}"
        raise SinkOffsetsError(
            f"{name}: batch {batch_time_ms} is partly in {output}: its "
            f"{d.topic}/{d.partition} [{d.fromOffset}, {d.untilOffset}) is in, its {r.topic}/{r.partition} "
            f"[{r.fromOffset}, {r.untilOffset}) is not ({at}): start the stream from the sink's "
            "offsets (fromOffsets=sink.offsets())")
    if done:
        log.info("%s: batch %d is in %s already (its offsets end where the output does); not written "
                 "again", name, batch_time_ms, output)
    return bool(done)


def ranges_by_partition(name: str, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> list[OffsetRange]:
    """The ranges that read records, ``rdd``'s partition ``i`` holding what the ``i``-th read (a
    per-partition sink's batch); an error if the partition counts differ."""
    with_data = [r for r in ranges if r.untilOffset > r.fromOffset]
    if with_data and rdd.getNumPartitions() != len(with_data):
        raise ValueError(f"{name}: batch {batch_time_ms}: {rdd.getNumPartitions()} partitions for "
                         f"{len(with_data)} offset ranges: the records do not keep the source's partitioning")
    return with_data


def keeps_source_partitions(rdd, source_rdd) -> bool:
    """Whether ``rdd``'s partition ``i`` is computed from ``source_rdd``'s partition ``i`` alone:
    in the JVM, a chain of one-to-one dependencies leads from ``rdd`` to ``source_rdd`` or to one
    of its own one-to-one ancestors (PySpark folds ``map``, ``filter``... into one PythonRDD over
    the first RDD that is not pipelined, so the chain may meet ``source_rdd``'s below it)."""
    if source_rdd is None:
        return False
    from pyspark.rdd import PipelinedRDD

    step = rdd  # first in Python, no Py4J call: each PipelinedRDD maps its ``prev``'s partitions one to one
    while step is not source_rdd and isinstance(step, PipelinedRDD):
        step = step.prev
    if step is source_rdd:
        return True
    ancestors, step = set(), source_rdd._jrdd.rdd()
    while step is not None:
        ancestors.add(step.id())
        step = _one_to_one_parent(step)
    step = rdd._jrdd.rdd()
    while step is not None and step.id() not in ancestors:
        step = _one_to_one_parent(step)
    return step is not None


def _one_to_one_parent(jrdd):
    deps = jrdd.dependencies()
    if deps.size() != 1 or deps.head().getClass().getSimpleName() != "OneToOneDependency":
        return None
    return deps.head().rdd()


def save_batches(dstream, offsetsFrom, write_batch: Callable[[int, list[OffsetRange], object], object]) -> None:
    """The output operation of an exactly-once sink: each batch of ``dstream`` as
    ``write_batch(batch_time_ms, the ranges offsetsFrom read for it, its RDD)``, in batch order
    when batches overlap (``spark.streaming.concurrentJobs`` > 1): each batch's output must start
    where the previous one's ended (``DbApiSink.batch_applied``)."""

    def save(time: datetime, rdd) -> None:
        t = int(round(time.timestamp() * 1000))
        write_batch(t, offsetsFrom.offset_ranges(t), rdd)

    ForEachDStream(dstream.context(), dstream, save, in_order=True)


class SQLiteSink(DbApiSink):
    """:class:`DbApiSink` on a SQLite file (WAL journal, ``synchronous=FULL``: a committed batch
    survives a process kill and a power loss)."""

    begin_sql = "BEGIN IMMEDIATE"  # take the write lock before reading the offsets

    def __init__(self, path: str, name: str = "default", timeout_s: float = 30.0):
        super().__init__(name)
        self.path = str(path)
        self.timeout_s = timeout_s

    def connect(self):
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return _AutoCommitConnection(conn)


class _AutoCommitConnection:
    """sqlite3 in autocommit mode with explicit BEGIN: commit/rollback only when in a
    transaction (DB-API calls made outside one are no-ops)."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def cursor(self):
        return self._conn.cursor()

    def commit(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        self._conn.close()

