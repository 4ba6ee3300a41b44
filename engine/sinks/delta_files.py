"""The files a batch's tasks write into a Delta table for :class:`~sparkwal.engine.sinks.DeltaSink`.

Per task attempt of partition ``<task>`` (5 digits) in batch ``<t>`` (ms), named by ``<stem>`` =
``<t>-<batch attempt>-<task>-<task attempt>``: ``<batch attempt>`` a hex id per driver attempt of
the batch, ``<task attempt>`` fresh per run of the task (Spark's task attempt id, ``x``, random
hex): a retried or speculative copy of a task, or the same task under another driver, never
shares a name with another run:

* ``_sparkwal/<sink name>/<stem>.json``: ``{"files": [path, ...], "ends": [[topic, partition,
  offset], ...]}``, the paths (relative to the table) the attempt is about to write, put before any
  of them, so that nothing it writes goes unrecorded (a ``_`` directory: Delta readers and VACUUM
  leave it alone), and the end of each range with records its batch read; the batch time first:
  cleaning up takes the records of batches up to a time, once the table settled them (:func:`settled`);
* append: ``<col>=<value>/.../part-<stem>-<n>.parquet``, one file per partition value, in
  Hive-style directories (values percent-encoded, null as ``__HIVE_DEFAULT_PARTITION__``; the
  partition columns are not in the file, as Delta wants); merge:
  ``_sparkwal/<sink name>/staging/<stem>-<n>.parquet``, the rows whole.

Each file is created whole and durable through the storage seam (:mod:`sparkwal.wal`), only if
absent (an existing name is an error, never replaced: a file the driver may have committed keeps
the size and statistics of its add action), before the task returns its add action (path, size,
partition values, Delta's statistics) to the driver.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Mapping
from datetime import date, datetime
from urllib.parse import quote

RECORDS_DIR = "_sparkwal"


def write_partition(index, rows, location, name, batch_time_ms, schema, partition_by, staging, attempt, ends=()):
    """Task side: this partition's rows as Parquet files (one per partition value), their names
    recorded first; yields each file's add action as a dict."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = rows_table(list(rows), schema)
    if table.num_rows == 0:
        return
    storage, root = location.resolve()
    groups = _split_by_partition(table, partition_by, pc) if partition_by and not staging else [({}, table)]
    stem = f"{batch_time_ms}-{attempt}-{index:05d}-{task_attempt_id()}"
    planned = []
    for n, (values, _) in enumerate(groups):
        if staging:
            planned.append(f"{RECORDS_DIR}/{name}/staging/{stem}-{n}.parquet")
        else:
            directory = "".join(f"{quote(c, safe='')}={_partition_dir(values[c])}/" for c in partition_by)
            planned.append(f"{directory if values else ''}part-{stem}-{n}.parquet")
    records_dir = storage.join(root, f"{RECORDS_DIR}/{name}")
    storage.makedirs(records_dir)
    record = {"files": planned, "ends": [list(e) for e in ends]}
    _create(storage, storage.join(records_dir, f"{stem}.json"), json.dumps(record).encode())
    for path, (values, part) in zip(planned, groups, strict=True):
        data = part.drop_columns(list(values)) if values else part
        buffer = io.BytesIO()
        pq.write_table(data, buffer)
        payload = buffer.getvalue()
        full = storage.join(root, path)
        storage.makedirs(full.rsplit("/", 1)[0])
        _create(storage, full, payload)  # whole and durable before the driver can commit it
        yield {"path": path, "size": len(payload), "staged": staging,
               "partition_values": {c: _partition_value(v) for c, v in values.items()},
               "modification_time": int(time.time() * 1000), "stats": _stats(data, pa, pc)}


def settled(record: dict, batch_time_ms: int, newest: tuple[int, dict]) -> bool:
    """Whether the attempt of ``record`` (of batch ``batch_time_ms``) is decided by the table whose
    sink's newest batch and end offsets are ``newest``: the table's output has reached the end of
    every range the attempt's batch read (whoever wrote it: this attempt, or another in its place),
    or, for a batch that read nothing, the sink's newest batch is not older. An attempt not settled
    may be in flight in another driver: its files are left alone."""
    from ..sources.protocol import TopicPartition

    newest_batch, table_ends = newest
    if record.get("ends"):
        return all(table_ends.get(TopicPartition(t, p), -1) >= until for t, p, until in record["ends"])
    return batch_time_ms <= newest_batch


def records_up_to(storage, records_dir: str, up_to_ms: int) -> list:
    """The records (files of ``records_dir``) of attempts of batches up to ``up_to_ms``."""
    return [r for r in storage.list_files(records_dir)
            if r.name.endswith(".json") and int(r.name.split("-", 1)[0]) <= up_to_ms]


def delete_settled(storage, records: list, newest: tuple[int, dict], unheld, path_of) -> int:
    """Of each record the table has settled (:func:`settled`, ``newest`` its sink's newest batch
    and ends), the files ``unheld(record name, batch time, file)`` says the table does not hold
    (deleted at ``path_of(file)``), then the record itself; the files deleted."""
    deleted = 0
    for record in records:
        batch = int(record.name.split("-", 1)[0])
        content = json.loads(storage.read_file(record.path))
        if not settled(content, batch, newest):
            continue
        for file in content["files"]:
            if unheld(record.name, batch, file):
                storage.delete(path_of(file))
                deleted += 1
        storage.delete(record.path)
    return deleted


def task_attempt_id() -> str:
    """A fresh id of this run of a task: Spark's task attempt id (unique in one driver's life)
    and random hex (unique across drivers); random hex alone outside a Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    random = uuid.uuid4().hex[:8]
    return random if context is None else f"{context.taskAttemptId()}x{random}"


def _create(storage, path: str, data: bytes) -> None:
    if not storage.put_if_absent(path, data):
        raise FileExistsError(f"{path} exists already: a Delta sink's file is never replaced")


def rows_table(rows: list, schema):
    import pyarrow as pa

    if rows and isinstance(rows[0], Mapping):
        return pa.Table.from_pylist(rows, schema=schema)
    columns: list = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    if len(columns) != len(schema):
        raise ValueError(f"rows of {len(columns)} values for a schema of {len(schema)} columns "
                         f"({', '.join(schema.names)}): {rows[0]!r}")
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)


def _split_by_partition(table, partition_by, pc):
    keys = table.select(partition_by).group_by(partition_by).aggregate([]).to_pylist()
    groups = []
    for values in keys:
        mask = None
        for c, v in values.items():
            m = pc.is_null(table[c]) if v is None else pc.equal(table[c], v)
            mask = m if mask is None else pc.and_(mask, m)
        groups.append((values, table.filter(mask)))
    return groups


def _partition_value(v) -> str | None:
    """A partition value as the Delta protocol serialises it."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(v, date):
        return v.isoformat()
    return str(v)


def _partition_dir(v) -> str:
    value = _partition_value(v)
    return "__HIVE_DEFAULT_PARTITION__" if value is None else quote(value, safe="")


def _stats(table, pa, pc) -> str:
    """Delta's per-file statistics (numRecords, min/max of simple columns, null counts)."""
    mins, maxs, nulls = {}, {}, {}
    for field in table.schema:
        column = table[field.name]
        nulls[field.name] = column.null_count
        if pa.types.is_integer(field.type) or pa.types.is_floating(field.type) or pa.types.is_string(field.type):
            mm = pc.min_max(column).as_py()
            if mm["min"] is not None:
                mins[field.name], maxs[field.name] = mm["min"], mm["max"]
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


def add_action(written: dict):
    """A file a task wrote (what :func:`write_partition` yields) as delta-rs's add action."""
    from deltalake.transaction import AddAction

    return AddAction(path=written["path"], size=written["size"], partition_values=written["partition_values"],
                     modification_time=written["modification_time"], data_change=True, stats=written["stats"])
