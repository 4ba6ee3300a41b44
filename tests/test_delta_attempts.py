"""DeltaSink's task attempts: every run of a task (a retry, a speculative copy, the same task
under another driver) writes files and a record of its own; none rewrites a file the driver may
have committed, and the clean-up deletes what any attempt wrote that the table does not hold."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from sparkwal.engine.sinks import DeltaSink
from sparkwal.engine.sinks import delta_files
from sparkwal.engine.sources import OffsetRange

SCHEMA = pa.schema([("partition", pa.string()), ("line", pa.string())])


def run_task(sink: DeltaSink, rows: list, batch_time_ms: int = 1000, index: int = 0) -> list[dict]:
    """One attempt of task ``index`` of the batch, as the driver's write_batch ships it (one
    batch attempt id for all the tasks of the batch)."""
    return list(delta_files.write_partition(index, iter(rows), location=sink.location, name=sink.name,
                                            batch_time_ms=batch_time_ms, schema=SCHEMA,
                                            partition_by=sink.partition_by, staging=False, attempt="batchattempt"))


def data_files(table_dir) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), table_dir) for d, _, fs in os.walk(table_dir)
            for f in fs if f.endswith(".parquet") and "_sparkwal" not in d and "_delta_log" not in d}


def lines_in(sink: DeltaSink) -> list[str]:
    return sorted(sink.read(["line"]).column("line").to_pylist())


def test_a_speculative_copy_finishing_after_the_commit_rewrites_nothing_and_is_cleaned_up(tmp_path):
    table_dir = tmp_path / "table"
    sink = DeltaSink(str(table_dir), "lines", schema=SCHEMA, partition_by=["partition"])
    p0, p1 = [("p0", f"line {i}") for i in range(40)], [("p1", "x"), ("p1", "yy")]
    rows = p0 + p1
    first = run_task(sink, rows)
    assert sink.commit_batch(1000, [OffsetRange("log", "p0", 0, 42)], first, SCHEMA)
    committed = {w["path"]: (table_dir / w["path"]).read_bytes() for w in first}

    second = run_task(sink, p0[::-1] + p1[::-1])  # the same task's copy, its rows in another order
    assert {w["path"] for w in second}.isdisjoint(committed)
    assert all((table_dir / path).read_bytes() == data for path, data in committed.items())
    assert lines_in(sink) == sorted(line for _, line in rows)  # the committed files read as committed

    assert sink.clean_up(1000) == len(second)  # the copy's files: never committed
    assert data_files(table_dir) == set(committed)
    assert not os.listdir(table_dir / "_sparkwal" / "lines")  # the records of both attempts gone
    assert lines_in(sink) == sorted(line for _, line in rows)


def test_a_retried_task_leaves_no_file_of_the_attempt_it_replaced(tmp_path):
    """The first attempt wrote its files and died; the retry, its partition values met in
    another order, names its files otherwise: the first attempt's record still leads the
    clean-up to them."""
    table_dir = tmp_path / "table"
    sink = DeltaSink(str(table_dir), "lines", schema=SCHEMA, partition_by=["partition"])
    rows = [("p0", "a"), ("p1", "b")]
    killed = run_task(sink, rows)
    retry = run_task(sink, rows[::-1])
    assert sink.commit_batch(1000, [OffsetRange("log", "p0", 0, 2)], retry, SCHEMA)
    assert sink.clean_up(1000) == len(killed)
    assert data_files(table_dir) == {w["path"] for w in retry}
    assert lines_in(sink) == ["a", "b"]


def test_a_task_never_replaces_an_existing_file(tmp_path, monkeypatch):
    """Were two attempts ever to meet on a name, the second fails rather than replace the
    first's file (which the driver may have committed with its size and statistics)."""
    table_dir = tmp_path / "table"
    sink = DeltaSink(str(table_dir), "lines", schema=SCHEMA)
    monkeypatch.setattr(delta_files, "task_attempt_id", lambda: "same")
    first = run_task(sink, [("p0", "a"), ("p0", "b")])
    assert sink.commit_batch(1000, [OffsetRange("log", "p0", 0, 2)], first, SCHEMA)
    data = (table_dir / first[0]["path"]).read_bytes()
    with pytest.raises(FileExistsError, match="never replaced"):
        run_task(sink, [("p0", "b"), ("p0", "a")])
    assert (table_dir / first[0]["path"]).read_bytes() == data and lines_in(sink) == ["a", "b"]
