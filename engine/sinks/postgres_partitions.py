""":class:`~sparkwal.engine.sinks.PostgresSink` per partition: when the rows keep the source's
partitioning, each task writes its rows and its offset range's end in one transaction of its own
(the module docstring of :mod:`sparkwal.engine.sinks.postgres` gives the protocol)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ..sources.protocol import OffsetRange, range_in_sink

ROW = "sparkwal_row"  #: the column numbering a task's rows in the order they came, for upserts


def write_partition(index, rows, conninfo: str, sink: str, table: str, columns: list[str], keys: list[str],
                    batch_time_ms: int, ranges: list[OffsetRange], connect_timeout_s: int):
    """Task side: this partition's rows and its range's end in one transaction (with ``keys``,
    through a temporary table numbering the rows: a key repeated in the partition upserts its
    last row); yields ``(index, "written" | "applied" | "error", detail)``."""
    import psycopg
    from psycopg import sql

    r = ranges[index]
    partition = json.dumps(r.partition)
    with psycopg.connect(conninfo, connect_timeout=connect_timeout_s) as conn, conn.cursor() as cur:
        # the driver's transaction (the staged way, a zombie driver) holds the sink's lock exclusively
        cur.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s))", (f"sparkwal_offsets/{sink}",))
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sparkwal_offsets/{sink}/{r.topic}/{partition}",))
        cur.execute("SELECT until_offset, batch_time_ms FROM sparkwal_offsets WHERE sink = %s AND topic = %s AND "
                    "partition = %s", (sink, r.topic, partition))
        found = cur.fetchone()
        stored = None if found is None else int(found[0])
        state = range_in_sink(r, batch_time_ms, stored, None if found is None else int(found[1]))
        if state:
            yield index, "applied", 0
            return
        if state is None:
            yield index, "error", (f"batch {batch_time_ms} reads {r.topic}/{r.partition} [{r.fromOffset}, "
                                   f"{r.untilOffset}) but the database's output ends at offset {stored}: start "
                                   "the stream from the database's offsets (fromOffsets=sink.offsets())")
            return
        n = 0
        if keys:  # upsert: through a temporary table of the transaction, the rows numbered in order
            cur.execute(sql.SQL("CREATE TEMP TABLE sparkwal_rows ON COMMIT DROP AS SELECT t.*, NULL::bigint AS "
                                "{row} FROM {table} AS t WITH NO DATA").format(row=sql.Identifier(ROW),
                                                                               table=identifier(table)))
            names = sql.SQL(", ").join(map(sql.Identifier, (*columns, ROW)))
            with cur.copy(sql.SQL("COPY sparkwal_rows ({}) FROM STDIN").format(names)) as copy:
                for values in table_rows(rows, columns):
                    copy.write_row((*values, n))
                    n += 1
            cur.execute(insert_select(table, columns, keys, sql.Identifier("sparkwal_rows"), order=[ROW]))
        else:
            names = sql.SQL(", ").join(map(sql.Identifier, columns))
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(identifier(table), names)) as copy:
                for values in table_rows(rows, columns):
                    copy.write_row(values)
                    n += 1
        cur.execute("DELETE FROM sparkwal_offsets WHERE sink = %s AND topic = %s AND partition = %s",
                    (sink, r.topic, partition))
        cur.execute("INSERT INTO sparkwal_offsets VALUES (%s, %s, %s, %s, %s)",
                    (sink, r.topic, partition, r.untilOffset, batch_time_ms))
    yield index, "written", n  # (the connection's context committed the transaction)


def insert_empty_ends(cur, sink: str, batch_time_ms: int, ranges: list[OffsetRange]) -> None:
    """Store the end of each of ``ranges`` (empty ones) whose partition has no stored end; a
    stored end is never moved (``ON CONFLICT DO NOTHING``: it waits for a writer of the partition
    whose transaction is open, then leaves what it stored)."""
    if not ranges:
        return
    cur.executemany("INSERT INTO sparkwal_offsets VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [(sink, r.topic, json.dumps(r.partition), r.untilOffset, batch_time_ms) for r in ranges])


def lock_ranges(cur, sink: str, ranges: list[OffsetRange]) -> None:
    """In a transaction: the sink's lock shared and the ranges' own, as a task takes them (the
    ranges in one order: two such transactions never deadlock)."""
    cur.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s))", (f"sparkwal_offsets/{sink}",))
    for topic, partition in sorted({(r.topic, json.dumps(r.partition)) for r in ranges}):
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sparkwal_offsets/{sink}/{topic}/{partition}",))


def identifier(table: str):
    from psycopg import sql

    return sql.Identifier(*table.split(".", 1))


def insert_select(table: str, columns: list[str], keys: list[str], source, order: Sequence[str] = ()):
    """``INSERT INTO table (columns) SELECT columns FROM source``, upserting by ``keys`` if any: the
    source's rows combined per key first, the last by ``order`` (columns of ``source``) winning, as
    one ``INSERT ... ON CONFLICT DO UPDATE`` cannot change a row twice; rows with a NULL key are
    never combined (a unique constraint holds NULLs distinct: each goes in, as without ``keys``)."""
    from psycopg import sql

    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    if keys and order:
        key_cols = sql.SQL(", ").join(map(sql.Identifier, keys))
        last = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c)) for c in order)
        null_key = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier(k)) for k in keys)
        source = sql.SQL("(SELECT {cols}, row_number() OVER (PARTITION BY {keys} ORDER BY {last}) AS sparkwal_rank "
                         "FROM {source}) AS s WHERE sparkwal_rank = 1 OR {null_key}").format(
            cols=cols, keys=key_cols, last=last, source=source, null_key=null_key)
    move = sql.SQL("INSERT INTO {table} ({cols}) SELECT {cols} FROM {source}").format(
        table=identifier(table), cols=cols, source=source)
    if keys:  # in key order: concurrent tasks upserting overlapping keys lock their rows in one order (no deadlock)
        move = move + sql.SQL(" ORDER BY {}").format(sql.SQL(", ").join(map(sql.Identifier, keys)))
        updates = [c for c in columns if c not in keys]
        action = (sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in updates)
            if updates else sql.SQL("DO NOTHING"))
        conflict = sql.SQL(" ON CONFLICT ({keys}) ").format(keys=sql.SQL(", ").join(map(sql.Identifier, keys)))
        move = move + conflict + action
    return move


def table_rows(rows, columns: list[str]):
    """Each row's values in the table's column order: a tuple of the columns' width as it is
    (:func:`row_values` costs 0.4 µs a row, ~20 ms of a 50,000-row task), anything else through it."""
    width = len(columns)
    for row in rows:
        yield row if type(row) is tuple and len(row) == width else row_values(row, columns)


def row_values(row, columns: list[str]) -> list:
    """A row's values in the table's column order (a dict by name, else a sequence)."""
    values = [row.get(c) for c in columns] if isinstance(row, Mapping) else list(row)
    if len(values) != len(columns):
        raise ValueError(f"a row of {len(values)} values for {len(columns)} columns ({', '.join(columns)}): {row!r}")
    return values
