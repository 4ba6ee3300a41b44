"""Exactly-once output into PostgreSQL (psycopg 3), written by the executors, committed by the driver.

:class:`PostgresSink` is a :class:`~sparkwal.engine.sinks.DbApiSink`: ``saveStream(dstream,
offsetsFrom, write)`` collects each batch and runs ``write(cursor, batch_time_ms, records)`` in the
transaction that stores the batch's offsets, as for SQLite. Without ``write`` it stages instead, so
that a batch's rows never pass through the driver:

1. The driver looks the batch up in ``sparkwal_offsets``: already applied (a re-run after a crash
   between the database's commit and the stream's checkpoint), nothing runs.
2. The driver creates the attempt's staging table (``sparkwal_stage_<hash of the sink's
   name>_<t>_<attempt>``, UNLOGGED: transient), the target's columns after ``sparkwal_task`` and
   ``sparkwal_row`` (the task's index, the row's number in it). Each task COPYs its partition's
   rows into it, in its own transaction that first deletes what an earlier attempt of the same
   task staged (under an advisory lock of the task: a retried or speculative task replaces, never
   adds). Tasks connect without the password: libpq takes it from their environment
   (``PGPASSWORD``, ``PGPASSFILE``), as credentials never travel in tasks.
3. The driver's ONE transaction (under an advisory lock of the sink) checks the offsets as the
   SQLite sink does, checks that every staged row is there (the tasks' counts: a server crash
   empties an unlogged table), moves them into the target (``INSERT ... SELECT``; with ``keys``,
   ``ON CONFLICT (keys) DO UPDATE``: upsert), stores the ranges' ends (empty ranges' too, see
   below) and drops the staging tables of every attempt of this batch and earlier ones (an attempt
   that never committed: a killed driver), then commits.

Per partition (the default where it applies): when the rows keep the source's partitioning
(only ``map``, ``filter``, ``flatMap``, ``mapPartitions``... between the direct stream and the rows,
so that partition ``i`` holds exactly what offset range ``i`` read), each task writes its rows
straight into the target AND its range's end into ``sparkwal_offsets`` in ONE transaction of its
own (the second recipe of Spark's Kafka guide): it first reads its range's stored end (under an
advisory lock of the range, and a shared one of the sink that the driver's transaction takes
exclusively): equal to the range's end (or beyond it, stored by a later batch), the partition is
in the table already and is skipped; neither its start nor absent, an error. Rows are written
once (no staging) and a batch becomes visible partition by partition; a re-run after any crash
writes only the partitions missing (:mod:`sparkwal.engine.sinks.postgres_partitions`).
``saveStream(..., per_partition=False)`` keeps the staged way, whose batches become visible whole.

A key repeated within one batch (with ``keys``): the batch's rows are combined per key before the
upsert, the LAST row winning, as a merge would: per partition, the last in the task's partition
(rows are numbered as they are copied); staged, the last in the stream's order, which orders rows
by task (partition) index, then by their order within the task: the last row of the highest task
holding the key wins. (One ``INSERT ... ON CONFLICT DO UPDATE`` cannot change a row twice:
without this, such a batch failed on every re-run, the stream stuck.) Rows with a NULL key are
never combined: a unique constraint holds NULLs distinct.

Every planned range's end is stored, empty ranges' too: a partition without records yet gets a
row in ``sparkwal_offsets`` at its range's end, so :meth:`offsets` names every partition a
committed batch planned. Such an end is only ever inserted where the partition has none
(``INSERT ... ON CONFLICT DO NOTHING``, under the locks a task takes: a stored end, a zombie
writer's included, is never moved). Staged, the driver's transaction inserts them; per
partition, the driver inserts them in a transaction of its own BEFORE the tasks run (whatever
part of a batch is visible, its empty partitions' ends are too); a batch that read nothing at all
only does that. A driver remembers the partitions it knows stored: once every partition has an
end, an empty batch costs no connection.

The target table must exist (its columns are the rows' fields, in order; dicts are matched by
name). :meth:`offsets` resumes a direct stream without a checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Sequence
from functools import partial

from sparkwal.wal import StorageUnavailableError

from ..driver_rows import on_executors
from ..sources.protocol import OffsetRange, TopicPartition
from .postgres_partitions import (ROW, identifier, insert_empty_ends, insert_select, lock_ranges, table_rows,
                                  write_partition)
from .transactional import DbApiSink, SinkOffsetsError, keeps_source_partitions, ranges_by_partition, save_batches

log = logging.getLogger(__name__)

STAGING_PREFIX = "sparkwal_stage_"


def _psycopg():
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover - the test extra has it
        raise ImportError("PostgresSink needs psycopg 3: pip install 'sparkwal[postgres]'") from e
    return psycopg


def without_password(conninfo: str) -> str:
    """``conninfo`` (a libpq connection string or URL) without its password."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(conninfo)
    params.pop("password", None)
    return make_conninfo("", **params)


class PostgresSink(DbApiSink):
    """Exactly-once output of batches into PostgreSQL: ``conninfo`` (libpq's), the target ``table``
    (``name`` or ``schema.name``, for the staged path), ``name`` the sink's (its rows in
    ``sparkwal_offsets``), ``keys`` to upsert by (a unique constraint of the table)."""

    placeholder = "%s"
    begin_sql = "BEGIN"

    def __init__(self, conninfo: str, table: str | None = None, name: str = "default", *,
                 keys: Sequence[str] | None = None, connect_timeout_s: int = 10):
        super().__init__(name)
        if not isinstance(conninfo, str):
            raise ValueError(f"conninfo must be a libpq connection string, got {conninfo!r}")
        self.conninfo = conninfo
        self.table = table
        self.keys = list(keys or [])
        self.connect_timeout_s = connect_timeout_s
        self._target_columns: dict[str, list[str]] = {}  # the table's columns, read at the first batch
        self._ends_stored: set[TopicPartition] = set()  # partitions this driver knows have a stored end

    def __getstate__(self) -> dict:
        """Pickled into checkpoints with the output: without the password (see the module)."""
        state = {**self.__dict__, "_target_columns": {}, "_ends_stored": set()}
        state["conninfo"] = without_password(self.conninfo)
        return state

    def __setstate__(self, state: dict) -> None:
        # (sinks pickled before they existed)
        self.__dict__.update({"_target_columns": {}, "_ends_stored": set(), **state})

    def connect(self):
        """A connection in autocommit mode (``BEGIN`` opens the sink's transactions); a server that
        cannot be reached is the storage seam's :class:`StorageUnavailableError`, in one line."""
        psycopg = _psycopg()
        start = time.monotonic()
        try:
            return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=self.connect_timeout_s)
        except psycopg.OperationalError as e:
            raise StorageUnavailableError("connect to", without_password(self.conninfo), 1,
                                          time.monotonic() - start, e) from e

    def lock_sink(self, cur) -> None:
        # one driver transaction of this sink at a time (a zombie driver waits, then sees the batch)
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sparkwal_offsets/{self.name}",))

    def read(self) -> list[tuple]:
        """The target table's committed rows, in no particular order (a batch partly committed shows the
        partitions it committed: see the module)."""
        if self.table is None:
            raise ValueError(f"{self.name}: read() needs the sink's table (PostgresSink(conninfo, table, ...))")
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(_psycopg().sql.SQL("SELECT * FROM {}").format(identifier(self.table)))
            return cur.fetchall()

    # ------------------------------------------------------------------ the staged path

    @property
    def staging_prefix(self) -> str:
        """The names of this sink's staging tables: ``<prefix><batch time>_<attempt>``."""
        return f"{STAGING_PREFIX}{hashlib.sha1(self.name.encode()).hexdigest()[:8]}_"

    def saveStream(self, dstream, offsetsFrom, write=None, *, per_partition: bool = True) -> None:
        """Each batch of ``dstream`` into the database exactly once with the offsets of
        ``offsetsFrom``: ``write(cursor, batch_time_ms, records)`` on the collected records (the
        DB-API way), or, without ``write``, the rows written by the tasks: per partition where the
        rows keep the source's partitioning (and ``per_partition``), else staged and moved into
        ``table`` by the driver's transaction (see the module)."""
        if write is not None:
            return super().saveStream(dstream, offsetsFrom, write)
        if not self.table:
            raise ValueError("PostgresSink.saveStream without write needs the sink's table")
        sink = self

        def write_batch(batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
            if per_partition and not any(r.untilOffset > r.fromOffset for r in ranges):
                return sink.write_partitions(batch_time_ms, ranges, rdd)  # nothing read: empty ranges' ends only
            if per_partition and keeps_source_partitions(rdd, offsetsFrom.get_or_compute(batch_time_ms)):
                return sink.write_partitions(batch_time_ms, ranges, rdd)
            return sink.write_batch(batch_time_ms, ranges, rdd)

        save_batches(dstream, offsetsFrom, write_batch)

    def write_partitions(self, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
        """Each task's rows and its range's end in one transaction of its own (``rdd``'s partition
        ``i`` holds what the ``i``-th range with records read); False if every range was in the
        database already, or if the batch read nothing. Empty ranges' ends are stored first."""
        with_data = ranges_by_partition(self.name, batch_time_ms, ranges, rdd)
        self.store_empty_ends(batch_time_ms, ranges)
        if not with_data:
            return False
        columns = self._target_columns.get(self.table)
        if columns is None:  # once per driver: a later change of the table shows in the tasks' COPY
            conn = self.connect()
            try:
                cur = conn.cursor()
                self._ensure_table(cur)
                columns = self._target_columns[self.table] = self._columns(cur)
            finally:
                conn.close()
        task = partial(write_partition, conninfo=without_password(self.conninfo), sink=self.name,
                       table=self.table, columns=columns, keys=self.keys, batch_time_ms=batch_time_ms,
                       ranges=with_data, connect_timeout_s=self.connect_timeout_s)
        outcomes = on_executors(rdd).mapPartitionsWithIndex(task).collect()
        errors = [detail for _i, outcome, detail in outcomes if outcome == "error"]
        if errors:
            raise SinkOffsetsError(f"{self.name}: {errors[0]}")
        self._ends_stored.update(r.topicPartition() for r in with_data)
        written = sum(1 for _i, outcome, _n in outcomes if outcome == "written")
        if written < len(with_data):
            log.info("%s: batch %d: %d of %d partitions were in the database already; not written again",
                     self.name, batch_time_ms, len(with_data) - written, len(with_data))
        return written > 0

    def _empty_unknown(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        """``ranges``' empty ones whose partition this driver does not know stored."""
        return [r for r in ranges if r.untilOffset <= r.fromOffset and r.topicPartition() not in self._ends_stored]

    def store_empty_ends(self, batch_time_ms: int, ranges: list[OffsetRange]) -> None:
        """The end of each empty range whose partition has none stored, in a transaction of its
        own under the locks a task takes (see the module); no connection if this driver knows
        every such partition stored."""
        empty = self._empty_unknown(ranges)
        if not empty:
            return
        conn = self.connect()
        try:
            cur = conn.cursor()
            self._ensure_table(cur)
            cur.execute(self.begin_sql)
            try:
                lock_ranges(cur, self.name, empty)
                insert_empty_ends(cur, self.name, batch_time_ms, empty)
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        self._ends_stored.update(r.topicPartition() for r in empty)

    def _columns(self, cur) -> list[str]:
        """The target's columns."""
        try:
            cur.execute(_psycopg().sql.SQL("SELECT * FROM {} LIMIT 0").format(identifier(self.table)))
        except _psycopg().errors.UndefinedTable:
            raise SinkOffsetsError(f"{self.name}: the table {self.table} does not exist in the database: "
                                   "create it first (its columns are the rows' fields)") from None
        return [d.name for d in cur.description]

    def write_batch(self, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
        """Stage ``rdd``'s rows from the tasks, then move them into the table with the batch's
        offsets in one transaction; False (nothing written) if the database holds the batch, or
        if the batch read and wrote nothing."""
        staging = f"{self.staging_prefix}{batch_time_ms}_{uuid.uuid4().hex[:12]}"
        columns = self._prepare(batch_time_ms, ranges, staging)
        if columns is None:
            log.info("%s: batch %d is in the database already; not written again", self.name, batch_time_ms)
            self.store_empty_ends(batch_time_ms, ranges)  # (a batch committed before they were stored)
            return False
        task = partial(stage_partition, conninfo=without_password(self.conninfo), staging=staging,
                       columns=columns, connect_timeout_s=self.connect_timeout_s)
        staged = sum(on_executors(rdd).mapPartitionsWithIndex(task).collect())  # counts only, never the rows
        if not staged and not any(r.untilOffset > r.fromOffset for r in ranges):
            self._drop_staging(batch_time_ms)
            self.store_empty_ends(batch_time_ms, ranges)
            return False  # nothing read, nothing written: empty ranges' ends only
        empty = self._empty_unknown(ranges)
        written = self.commit_batch(batch_time_ms, ranges,
                                    lambda cur: self._move(cur, batch_time_ms, staging, staged, columns, empty))
        self._ends_stored.update(r.topicPartition() for r in ranges if r.untilOffset > r.fromOffset or written)
        return written

    def _prepare(self, batch_time_ms: int, ranges: list[OffsetRange], staging: str) -> list[str] | None:
        """The target's columns, and the attempt's staging table created (UNLOGGED: it is
        transient, and the move checks that every staged row is there); None if the database
        holds the batch already."""
        sql = _psycopg().sql
        conn = self.connect()
        try:
            cur = conn.cursor()
            self._ensure_table(cur)
            if self.batch_applied(cur, batch_time_ms, [r for r in ranges if r.untilOffset > r.fromOffset]):
                return None
            columns = self._columns(cur)
            cur.execute(sql.SQL("CREATE UNLOGGED TABLE {staging} AS SELECT NULL::integer AS sparkwal_task, "
                                "NULL::bigint AS {row}, t.* FROM {table} AS t WITH NO DATA").format(
                staging=sql.Identifier(staging), row=sql.Identifier(ROW), table=identifier(self.table)))
            return columns
        finally:
            conn.close()

    def _move(self, cur, batch_time_ms: int, staging: str, staged: int, columns: list[str],
              empty: list[OffsetRange]) -> None:
        """In the driver's transaction (the sink's lock held exclusively: no task nor other
        driver of the sink writes offsets meanwhile): the staged rows into the target, the last
        of a repeated key winning (task index, then row), and the ``empty`` ranges' ends."""
        sql = _psycopg().sql
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(staging)))
        found = cur.fetchone()[0]
        if found != staged:  # (an unlogged table is emptied by a server crash: the batch runs again)
            raise SinkOffsetsError(f"{self.name}: batch {batch_time_ms}: {found} rows staged in {staging}, "
                                   f"the tasks wrote {staged}: not moved")
        cur.execute(insert_select(self.table, columns, self.keys, sql.Identifier(staging),
                                  order=["sparkwal_task", ROW]))
        insert_empty_ends(cur, self.name, batch_time_ms, empty)
        self._drop_staging_in(cur, batch_time_ms)

    def _drop_staging(self, up_to_ms: int) -> None:
        conn = self.connect()
        try:
            self._drop_staging_in(conn.cursor(), up_to_ms)
        finally:
            conn.close()

    def _drop_staging_in(self, cur, up_to_ms: int) -> None:
        """Drop the staging tables of every attempt of batches up to ``up_to_ms``."""
        sql = _psycopg().sql
        prefix = self.staging_prefix
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND "
                    "starts_with(tablename, %s)", (prefix,))
        for (name,) in cur.fetchall():
            batch = name[len(prefix):].split("_", 1)[0]
            if batch.isdigit() and int(batch) <= up_to_ms:
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def stage_partition(index, rows, conninfo, staging, columns, connect_timeout_s):
    """Task side: COPY this partition's rows into the attempt's staging table, numbered in order,
    replacing what an earlier attempt of this task staged; yields the rows' count."""
    psycopg = _psycopg()
    sql = psycopg.sql
    n = 0
    with psycopg.connect(conninfo, connect_timeout=connect_timeout_s) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{staging}/{index}",))
        cur.execute(sql.SQL("DELETE FROM {} WHERE sparkwal_task = %s").format(sql.Identifier(staging)), (index,))
        names = sql.SQL(", ").join(map(sql.Identifier, ("sparkwal_task", ROW, *columns)))
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(staging), names)) as copy:
            for values in table_rows(rows, columns):
                copy.write_row((index, n, *values))
                n += 1
    yield n  # (the connection's context committed the transaction)
