"""IcebergSink: a direct stream's batches into an Apache Iceberg table (pyiceberg) exactly once:
data files written by the executors, committed by the driver in one snapshot whose summary carries
the stream, the batch and its offsets; a re-run commits nothing; a restart without a checkpoint
resumes from the table; a SIGKILL between the data files and the commit, or between the commit and
the checkpoint, loses and doubles nothing and leaves no file of the dead attempt. Catalogs: SQLite
(a file) and the PostgreSQL server the suite starts; warehouses on a local path and on S3 (moto)."""

from __future__ import annotations

import json
import os
import pickle

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from sparkwal.engine.sinks import IcebergSink, SinkOffsetsError
from sparkwal.engine.sources import OffsetRange, TopicPartition

from sink_helpers import crash_at_each_step_then_recover, drill_exactly_once, expected, run_stream

SCHEMA = pa.schema([("partition", pa.string()), ("line", pa.string())])


def sqlite_catalog(tmp_path) -> dict:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def lines_in(sink: IcebergSink) -> list[str]:
    return sorted(sink.read(["line"]).column("line").to_pylist())


def data_files(root) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
            if f.endswith(".parquet") and "_sparkwal" not in d}


def files_in_table(sink: IcebergSink) -> set[str]:
    return {p.removeprefix("file://") for p in sink.table().inspect.files().column("file_path").to_pylist()}


@pytest.mark.slow
def test_each_batch_goes_in_once_in_one_snapshot_and_a_restart_resumes_from_the_table(spark_context, tmp_path):
    catalog = sqlite_catalog(tmp_path)
    sink = IcebergSink(catalog, "db.lines", "lines", schema=SCHEMA, partition_by=["partition"])
    run_stream(spark_context, tmp_path / "log", sink, [{"p0": 3, "p1": 2}, {"p0": 1}], checkpoint=tmp_path / "ckpt")
    assert lines_in(sink) == expected({"p0": 4, "p1": 2})
    table = load_catalog("default", **catalog).load_table("db.lines")  # another reader of the same catalog
    summary = table.current_snapshot().summary
    assert (summary["sparkwal.stream"], summary["sparkwal.batch-ms"]) == ("lines", "1000")
    assert sorted(map(tuple, json.loads(summary["sparkwal.offsets"]))) == [("log", "p0", 4), ("log", "p1", 2)]
    assert sink.committed_batch() == 1000 and sink.batches_committed() == 2
    assert "commit.retry.num-retries" not in table.properties  # the sink's pin of pyiceberg's retries: never committed
    assert all("/data/partition=p" in f for f in data_files(tmp_path / "warehouse"))
    assert data_files(tmp_path / "warehouse") == files_in_table(sink)

    # a re-run of the newest batch (a crash between the commit and the checkpoint) writes nothing
    snapshots = len(sink.table().snapshots())
    rdd = spark_context.parallelize([("p0", "again")])
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 3, 4)], rdd) is False
    assert len(sink.table().snapshots()) == snapshots and lines_in(sink) == expected({"p0": 4, "p1": 2})
    # a batch that read and wrote nothing makes no snapshot
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 4, 4)], spark_context.emptyRDD()) is False
    assert len(sink.table().snapshots()) == snapshots

    # a new stream without a checkpoint, from a sink unpickled without credentials, resumes from the table
    fresh = pickle.loads(pickle.dumps(IcebergSink(catalog, "db.lines", "lines")))
    from sparkwal.engine.apps.direct_wordcount import append_lines

    append_lines(str(tmp_path / "log"), "p1", 2, 2)
    run_stream(spark_context, tmp_path / "log", fresh, [{}], start_ms=5000)
    assert lines_in(fresh) == expected({"p0": 4, "p1": 4}) and fresh.committed_batch() == 5500


@pytest.mark.compat
def test_batches_not_starting_where_the_table_ends_or_partly_in_are_refused_naming_both(spark_context, tmp_path):
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines", schema=SCHEMA)
    ab = spark_context.parallelize([("p0", "a"), ("p0", "b")])
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 2)], ab)
    rdd = spark_context.parallelize([("p1", "x")])
    with pytest.raises(SinkOffsetsError, match=r"batch 1500 reads log/p0 \[5, 6\) but the Iceberg table's "
                                               r"output ends at offset 2"):
        sink.write_batch(1500, [OffsetRange("log", "p0", 5, 6)], rdd)
    with pytest.raises(SinkOffsetsError, match=r"batch 1000 is partly in the Iceberg table db.lines: its log/p0 "
                                               r"\[0, 2\) is in, its log/p1 \[0, 1\) is not \(no output\)"):
        sink.write_batch(1000, [OffsetRange("log", "p0", 0, 2), OffsetRange("log", "p1", 0, 1)], rdd)
    # an old driver on another batch grid: decided by offsets, not time
    assert sink.write_batch(700, [OffsetRange("log", "p0", 2, 3)], rdd) is True
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 2, 3)], rdd) is False
    assert lines_in(sink) == ["a", "b", "x"] and sink.offsets() == {TopicPartition("log", "p0"): 3}


def test_a_table_rolled_back_past_the_sinks_snapshots_is_refused_rather_than_written_twice(spark_context, tmp_path):
    """The sink's snapshots left the ancestry (rolled back, or expired): the table property written
    with each commit tells it from a sink that never committed; nothing is decided by guesswork."""
    catalog = sqlite_catalog(tmp_path)
    sink = IcebergSink(catalog, "db.lines", "lines", schema=SCHEMA)
    sink.create_table().append(pa.table({"partition": ["q"], "line": ["other writer"]}))
    before = sink.table().current_snapshot().snapshot_id
    ranges, rdd = [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")])
    assert sink.write_batch(1000, ranges, rdd)
    sink.table().manage_snapshots().rollback_to_snapshot(before).commit()
    assert sink.write_batch(1000, ranges, rdd) is False  # the property's batch: in, as far as the sink can tell
    lost = r"db.lines: the snapshot of batch 1000 \(the newest of sink 'lines'\) is not in the table's current"
    with pytest.raises(SinkOffsetsError, match=lost):
        sink.write_batch(1500, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    with pytest.raises(SinkOffsetsError, match=lost):
        sink.offsets()
    assert lines_in(sink) == ["other writer"]
    # then the sink's snapshot expired: no snapshot is left to tell a rollback from an expiry, but the
    # ancestry reaches back to the snapshot its commit was made on (going on would skip batch 1000)
    sink.table().append(pa.table({"partition": ["q"], "line": ["after the rollback"]}))
    ours = [s.snapshot_id for s in sink.table().snapshots() if s.summary.get("sparkwal.stream") == "lines"]
    sink.table().maintenance.expire_snapshots().by_ids(ours).commit()
    assert not any(s.summary.get("sparkwal.stream") for s in sink.table().snapshots())
    with pytest.raises(SinkOffsetsError, match=lost):
        sink.write_batch(1500, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))


def test_a_rollback_into_an_upserts_commit_then_an_expiry_is_refused(spark_context, tmp_path):
    """Rolled back into the middle of an upsert's commit (half of the batch's rows in), then every
    snapshot of the sink expired: the ancestry passes below the batch's own snapshot without meeting
    it; going on would skip the rest of the batch."""
    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.counts", "counts", schema=schema, mode="upsert", keys=["word"])
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("a", 1)]))
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("b", 2)]))
    inside = sink.table().snapshots()[-2]
    assert inside.summary.get("sparkwal.upsert.batch-ms") == "1000"
    sink.table().manage_snapshots().rollback_to_snapshot(inside.snapshot_id).commit()
    ours = [s.snapshot_id for s in sink.table().snapshots() if s.summary.get("sparkwal.stream") == "counts"]
    sink.table().maintenance.expire_snapshots().by_ids(ours).commit()
    with pytest.raises(SinkOffsetsError, match=r"the snapshot of batch 1000 \(the newest of sink 'counts'\)"):
        sink.write_batch(1500, [OffsetRange("log", "p0", 2, 3)], spark_context.parallelize([("c", 3)]))
    # a version before .snapshot-id committed last (it left the newer version's values): its
    # .base-sequence decides; its snapshot and the one before expired, the ancestry rolled back
    # to a child of the older one
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.mixed", "mixed", schema=schema, mode="upsert", keys=["word"])
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("a", 1)]))
    newer = dict(sink.table().properties)
    sink.table().append(pa.table({"word": ["z"], "n": [0]}))
    between = sink.table().current_snapshot().snapshot_id
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("b", 2)]))
    with sink.table().transaction() as older_version:
        older_version.set_properties({k: newer[k] for k in ("sparkwal.stream.mixed.snapshot-id",
                                                            "sparkwal.stream.mixed.sequence-number")})
    sink.table().manage_snapshots().rollback_to_snapshot(between).commit()
    ours = [s.snapshot_id for s in sink.table().snapshots() if s.summary.get("sparkwal.stream") == "mixed"]
    sink.table().maintenance.expire_snapshots().by_ids(ours).commit()
    with pytest.raises(SinkOffsetsError, match=r"the snapshot of batch 1000 \(the newest of sink 'mixed'\)"):
        sink.write_batch(1500, [OffsetRange("log", "p0", 2, 3)], spark_context.parallelize([("c", 3)]))
    # the batch's own snapshot expired under a later one (no rollback): the sink goes on
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.later", "later", schema=schema, mode="upsert", keys=["word"])
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("a", 1)]))
    own = sink.table().current_snapshot().snapshot_id
    sink.table().append(pa.table({"word": ["z"], "n": [0]}))
    sink.table().maintenance.expire_snapshots().by_id(own).commit()
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("b", 2)]))


def test_a_conflict_answered_to_a_commit_that_landed_keeps_its_manifests_and_the_batch_in_once(
        spark_context, tmp_path, monkeypatch):
    """A catalog whose transport retried a commit that landed answers CommitFailedException: pyiceberg
    deletes the commit's manifests on that answer; the sink holds the deletes until it has read the
    table, finds its snapshot there and deletes nothing (the table stays readable)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import CommitFailedException

    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines", schema=SCHEMA)
    sink.create_table()
    commit, answers, meanwhile = SqlCatalog.commit_table, [], []

    def lands_then_conflicts(self, table, requirements, updates):
        response = commit(self, table, requirements, updates)
        if len(answers) < 2 and any(getattr(u, "action", "") == "add-snapshot" for u in updates):
            answers.append(response)
            for step in meanwhile:
                step()
            raise CommitFailedException("Requirement failed: branch main has changed (a retried request)")
        return response

    monkeypatch.setattr(SqlCatalog, "commit_table", lands_then_conflicts)
    rdd = spark_context.parallelize([("p0", "a")])
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], rdd)
    assert answers and sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], rdd) is False
    assert lines_in(sink) == ["a"] and sink.batches_committed() == 1
    assert data_files(tmp_path / "warehouse") == files_in_table(sink)
    # before the answer, another writer appends and expires the sink's snapshot: the appended one
    # lists the sink's manifest; the commit is not found, and its manifests are left all the same
    ours = []

    def another_writer_expires_ours():
        ours.append(sink.table().current_snapshot().snapshot_id)
        meanwhile.clear()
        sink.table().append(pa.table({"partition": ["q"], "line": ["other writer"]}))
        sink.table().maintenance.expire_snapshots().by_id(ours[0]).commit()

    meanwhile.append(another_writer_expires_ours)
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")])) \
        is False  # in, by the property of its expired snapshot
    assert ours and lines_in(sink) == ["a", "b", "other writer"] and sink.offsets() == {TopicPartition("log", "p0"): 2}


@pytest.mark.parametrize("format_version", ["1", "2"])
def test_a_batch_committed_again_after_a_rollback_keeps_the_first_commits_files(spark_context, tmp_path,
                                                                                 format_version):
    """Rolled back to the sink's older snapshot, the table lacks the newer batch: it goes in again;
    the first commit's snapshot, off the ancestry, still lists its files (a time travel reads them),
    though its records are still there (its driver died before its clean-up). Format 1 has no
    sequence numbers."""
    catalog = load_catalog("default", **sqlite_catalog(tmp_path))
    catalog.create_namespace("db")
    catalog.create_table("db.lines", SCHEMA, properties={"format-version": format_version})
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines", schema=SCHEMA)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    older = sink.table().current_snapshot().snapshot_id
    ranges, rdd = [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")])
    sink.clean_up = lambda *args: 0  # the first commit's driver dies before its clean-up
    assert sink.write_batch(1000, ranges, rdd)
    del sink.clean_up
    first = sink.table().current_snapshot().snapshot_id
    sink.table().manage_snapshots().rollback_to_snapshot(older).commit()
    assert sink.offsets() == {TopicPartition("log", "p0"): 1} and lines_in(sink) == ["a"]
    assert sink.write_batch(1000, ranges, rdd)
    assert lines_in(sink) == ["a", "b"] and sink.batches_committed() == 2
    assert sorted(sink.table().scan(snapshot_id=first).to_arrow().column("line").to_pylist()) == ["a", "b"]
    assert data_files(tmp_path / "warehouse") == files_in_any_snapshot(sink)
    # the first commit kept by a tag, the second expired under another writer's: the batch is in
    # (its own snapshot is the second), not refused for the first one's being off the ancestry
    sink.table().manage_snapshots().create_tag(first, "first-try").commit()
    second = sink.table().current_snapshot().snapshot_id
    sink.table().append(pa.table({"partition": ["q"], "line": ["other writer"]}))
    sink.table().maintenance.expire_snapshots().by_id(second).commit()
    assert sink.offsets() == {TopicPartition("log", "p0"): 2}
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 2, 3)], spark_context.parallelize([("p0", "c")]))
    assert lines_in(sink) == ["a", "b", "c", "other writer"]


def test_expired_snapshots_of_the_sink_and_a_table_path_with_its_records_directory_name(spark_context, tmp_path):
    """Another writer appends and the sink's snapshots expire: the sink goes on from the table's
    property; a table in a namespace named like the sink's records directory keeps its files."""
    sink = IcebergSink(sqlite_catalog(tmp_path), "_sparkwal.lines", "lines", schema=SCHEMA)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    ours = sink.table().current_snapshot().snapshot_id
    sink.table().append(pa.table({"partition": ["q"], "line": ["other writer"]}))
    sink.table().maintenance.expire_snapshots().by_id(ours).commit()
    assert not list(sink.sink_snapshots(sink.table()))
    assert sink.offsets() == {TopicPartition("log", "p0"): 1} and sink.committed_batch() == 1000
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")])) \
        is False
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    assert lines_in(sink) == ["a", "b", "other writer"]


def test_a_partition_spec_changed_between_the_writes_and_the_commit_makes_the_tasks_write_again(
        spark_context, tmp_path, caplog):
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines", schema=SCHEMA)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    commit, evolved = sink.commit_batch, []

    def spec_changes_first(*args):
        if not evolved:
            evolved.append(True)
            with sink.table().update_spec() as spec:
                spec.add_identity("partition")
        return commit(*args)

    sink.commit_batch = spec_changes_first
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    assert any("batch 1000 is written again" in r.getMessage() for r in caplog.records)
    assert lines_in(sink) == ["a", "b"] and data_files(tmp_path / "warehouse") == files_in_table(sink)
    assert any("/data/partition=p0/" in f for f in files_in_table(sink))  # the new spec's layout


def test_a_commit_that_landed_with_its_answer_lost_is_found_by_the_rerun_and_not_made_twice(
        spark_context, tmp_path, monkeypatch):
    """The catalog took the commit, then the connection dropped before the answer: the batch fails
    as the store's outage (one line), and its re-run finds the batch in the table's ancestry."""
    from pyiceberg.table import Transaction
    from sqlalchemy.exc import OperationalError

    from sparkwal.wal import StorageUnavailableError

    class ConnectionLost(Exception):
        sqlstate = "08006"

    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines", schema=SCHEMA)
    commit = Transaction.commit_transaction

    def answer_lost(self):
        commit(self)
        raise OperationalError("COMMIT", {}, ConnectionLost("server closed the connection unexpectedly"))

    monkeypatch.setattr(Transaction, "commit_transaction", answer_lost)
    rdd = spark_context.parallelize([("p0", "a")])
    with pytest.raises(StorageUnavailableError, match=r"Iceberg commit of batch 1000 db.lines"):
        sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], rdd)
    monkeypatch.setattr(Transaction, "commit_transaction", commit)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], rdd) is False
    assert lines_in(sink) == ["a"] and data_files(tmp_path / "warehouse") == files_in_table(sink)


def test_catalog_failures_are_told_apart_and_secrets_stay_out_of_pickles(tmp_path):
    """Which failures mean the catalog is down (the batch runs again), another writer won (decide
    again), or a mistake (raised as it is); what is pickled of a catalog's properties."""
    import sqlite3

    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
    from sqlalchemy.exc import OperationalError

    from sparkwal.engine.sinks.iceberg_catalog import failure_kind, without_secrets

    class PgError(Exception):
        def __init__(self, sqlstate):
            self.sqlstate = sqlstate

    def database(orig):
        return OperationalError("COMMIT", {}, orig)

    assert failure_kind(database(PgError("08006"))) == "unavailable"  # connection lost
    assert failure_kind(database(PgError("57P01"))) == "unavailable"  # server shutting down
    assert failure_kind(database(PgError("40001"))) == "conflict"  # serialization failure
    assert failure_kind(database(PgError("28P01"))) is None  # wrong password: a mistake, said as it is
    assert failure_kind(database(sqlite3.OperationalError("database is locked"))) == "unavailable"
    assert failure_kind(database(sqlite3.OperationalError("unable to open database file"))) is None
    assert failure_kind(CommitFailedException("x")) == "conflict"
    assert failure_kind(CommitStateUnknownException("x")) == "unavailable"
    assert failure_kind(FileNotFoundError("x")) is None and failure_kind(ConnectionResetError()) == "unavailable"
    kept = without_secrets({"uri": "postgresql+psycopg://u:pw@h/db?password=pw2&sslmode=require",
                            "s3.secret-access-key": "k", "adls.account-key": "k", "header.Authorization": "k",
                            "token": "k", "s3.endpoint": "http://h"})
    assert kept == {"uri": "postgresql+psycopg://u@h/db?sslmode=require", "s3.endpoint": "http://h"}


def test_upsert_mode_replaces_rows_by_key_and_leaves_no_staging(spark_context, tmp_path):
    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.counts", "counts", schema=schema, mode="upsert", keys=["word"])
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 2)], spark_context.parallelize([("a", 1), ("b", 2)], 2))
    rows = spark_context.parallelize([{"word": "b", "n": 5}, {"word": "c", "n": 1}], 2)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 2, 4)], rows)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 2, 4)], spark_context.parallelize([("b", 99)])) is False
    assert sorted((r["word"], r["n"]) for r in sink.read().to_pylist()) == [("a", 1), ("b", 5), ("c", 1)]
    assert sink.batches_committed() == 2 and sink.offsets() == {TopicPartition("log", "p0"): 4}
    # rows the table holds already change nothing, yet the batch is in; a key twice: its last row wins
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 4, 5)], spark_context.parallelize([("c", 1)]))
    assert sink.write_batch(2000, [OffsetRange("log", "p0", 5, 7)], spark_context.parallelize([("a", 7), ("a", 8)]))
    assert sorted((r["word"], r["n"]) for r in sink.read().to_pylist()) == [("a", 8), ("b", 5), ("c", 1)]
    # only the batch's last snapshot says it is in: rolled back into the middle of it, the batch goes in again
    history = sink.table().snapshots()
    assert [s.summary.get("sparkwal.batch-ms") for s in history[-3:]] == [None, None, "2000"]
    sink.table().manage_snapshots().rollback_to_snapshot(history[-2].snapshot_id).commit()
    assert sink.offsets() == {TopicPartition("log", "p0"): 5}
    assert sink.write_batch(2000, [OffsetRange("log", "p0", 5, 7)], spark_context.parallelize([("a", 8)]))
    assert not [f for _, _, fs in os.walk(tmp_path / "warehouse" / "db" / "counts" / "_sparkwal") for f in fs]
    with pytest.raises(ValueError, match="mode='upsert' needs keys"):
        IcebergSink(sqlite_catalog(tmp_path), "db.t2", mode="upsert")


def files_in_any_snapshot(sink: IcebergSink) -> set[str]:
    """The data files some snapshot of the table lists (time travel reads them: never deleted)."""
    table = sink.table()
    return {e.data_file.file_path.removeprefix("file://") for s in table.metadata.snapshots
            for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}


def test_an_upserts_files_of_a_refused_or_dead_commit_are_recorded_and_deleted_once_the_batch_is_in(
        spark_context, tmp_path, monkeypatch):
    """The driver writes an upsert's data files inside the commit (inserted rows, copy-on-write
    rewrites): a commit refused by another writer's, and one whose driver died before the catalog
    took it, leave files that a record names; once the batch is in, they are deleted, and every file
    any snapshot lists is kept."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import Transaction

    class DriverKilled(BaseException):
        pass

    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.counts", "counts", schema=schema, mode="upsert", keys=["word"])
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 2)], spark_context.parallelize([("a", 1), ("b", 2)]))
    commit, failures = Transaction.commit_transaction, [CommitFailedException("another writer won"), DriverKilled()]

    def fails_first(self):
        if failures:
            raise failures.pop(0)
        return commit(self)

    monkeypatch.setattr(Transaction, "commit_transaction", fails_first)
    rows = spark_context.parallelize([("b", 5), ("c", 1)])
    with pytest.raises(DriverKilled):  # the first try refused (tried again), the second's driver "dies"
        sink.write_batch(1000, [OffsetRange("log", "p0", 2, 4)], rows)
    warehouse = tmp_path / "warehouse"
    left = data_files(warehouse) - files_in_any_snapshot(sink)
    assert len(left) >= 4  # two tries of an insert and a rewrite, written and never committed
    records = [json.load(open(os.path.join(d, f))) for d, _, fs in os.walk(warehouse / "db" / "counts" / "_sparkwal")
               for f in fs if f.endswith(".json")]
    assert left <= {u.removeprefix("file://") for r in records for u in r["files"]}
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 2, 4)], rows)  # the re-run
    assert sorted((r["word"], r["n"]) for r in sink.read().to_pylist()) == [("a", 1), ("b", 5), ("c", 1)]
    assert data_files(warehouse) == files_in_any_snapshot(sink)  # the re-run's kept, the dead tries' gone
    assert not [f for _, _, fs in os.walk(warehouse / "db" / "counts" / "_sparkwal") for f in fs]
    upserts = [s.summary for s in sink.table().snapshots() if s.summary.get("sparkwal.upsert.stream") == "counts"]
    assert upserts and {s.get("sparkwal.upsert.batch-ms") for s in upserts} == {"500", "1000"}


def test_an_output_far_larger_than_max_result_size_never_passes_through_the_driver(spark_context, tmp_path):
    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.driver.maxResultSize", "1m")
    try:
        rdd = spark_context.range(0, 120_000, numSlices=4).map(lambda i: ("p0", f"{i:08d}" + "x" * 92))
        sink = IcebergSink(sqlite_catalog(tmp_path), "db.big", "big", schema=SCHEMA)
        assert sink.write_batch(500, [], rdd)
    finally:
        live_conf.remove("spark.driver.maxResultSize")
    lines = sink.read(["line"]).column("line")
    assert len(lines) == 120_000 and len(set(lines.to_pylist())) == 120_000


def test_a_concurrent_commit_of_the_same_batch_conflicts_and_the_sink_decides_again(
        spark_context, tmp_path, monkeypatch, caplog):
    """Another writer of the sink (a zombie driver) commits batch 1000 between this sink's check
    and its commit, and dies before its clean-up: the catalog refuses the stale commit
    (CommitFailedException), the sink reloads the table, finds the batch there, commits nothing,
    and deletes its own losing attempt's files, never the zombie's, which the table holds."""
    from pyiceberg.table import Transaction

    catalog = sqlite_catalog(tmp_path)
    sink = IcebergSink(catalog, "db.lines", "lines", schema=SCHEMA)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    zombie = IcebergSink(catalog, "db.lines", "lines")
    zombie.clean_up = lambda *args: 0  # killed right after its commit
    commit = Transaction.commit_transaction
    raced = []

    def zombie_commits_first(self):
        if not raced:
            raced.append(True)
            monkeypatch.setattr(Transaction, "commit_transaction", commit)
            assert zombie.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
        return commit(self)

    monkeypatch.setattr(Transaction, "commit_transaction", zombie_commits_first)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")])) is False
    assert raced and lines_in(sink) == ["a", "b"] and sink.batches_committed() == 2
    assert any("batch 1000's Iceberg commit conflicted" in r.getMessage() for r in caplog.records)
    assert data_files(tmp_path / "warehouse") == files_in_table(sink)


@pytest.mark.parametrize("leader_ms, zombie_ms", [(1500, 1800), (700, 1000)])
def test_a_zombie_finding_its_old_batch_in_leaves_the_leaders_next_batch_files_alone(
        spark_context, tmp_path, leader_ms, zombie_ms):
    """A zombie driver re-runs a batch whose offsets are in (on a clock ahead of the leader's, or
    the leader's behind): its clean-up runs between the leader's data files of its next batch and
    their commit, and must not take them (an attempt's files go only once the table's output has
    passed its ranges)."""
    catalog = sqlite_catalog(tmp_path)
    sink = IcebergSink(catalog, "db.lines", "lines", schema=SCHEMA)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    zombie, leader_commit = IcebergSink(catalog, "db.lines", "lines"), sink.commit_batch

    def zombie_first(*args):
        assert zombie.write_batch(zombie_ms, [OffsetRange("log", "p0", 0, 1)],
                                  spark_context.parallelize([("p0", "a")])) is False
        return leader_commit(*args)

    sink.commit_batch = zombie_first
    assert sink.write_batch(leader_ms, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    assert lines_in(sink) == ["a", "b"] and data_files(tmp_path / "warehouse") == files_in_table(sink)


@pytest.mark.driver
def test_a_kill_between_the_data_files_and_the_commit_and_after_the_commit_loses_and_doubles_nothing(tmp_path):
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines")
    crash_at_each_step_then_recover(tmp_path, lambda: lines_in(sink), sink="iceberg")
    # the attempt killed before its commit left data files; a later batch's commit deleted them
    assert data_files(tmp_path / "warehouse") == files_in_table(sink)


@pytest.mark.driver
def test_an_upserting_driver_killed_between_its_data_files_and_the_catalog_leaves_no_file_behind(tmp_path):
    """The driver's upsert wrote its data files and the driver was SIGKILLed before it asked the
    catalog: the recovered stream's commit of that batch deletes them (recorded before written)."""
    sink = IcebergSink(sqlite_catalog(tmp_path), "db.lines", "lines")
    crash_at_each_step_then_recover(tmp_path, lambda: lines_in(sink), sink="iceberg", steps=("upserted",),
                                    SPARKWAL_TEST_ICEBERG_MODE="upsert")
    assert data_files(tmp_path / "warehouse") == files_in_any_snapshot(sink)
    assert [s for s in sink.table().snapshots() if s.summary.get("sparkwal.upsert.stream") == "lines"]


@pytest.mark.driver
def test_drill_with_the_iceberg_sink_counts_every_line_exactly_once(tmp_path):
    drill_exactly_once(tmp_path, "iceberg", seed=7)


def test_a_postgresql_catalog_down_at_the_commit_fails_the_batch_in_one_line_and_the_rerun_goes_in_once(
        spark_context, tmp_path, postgres_cluster, postgres, monkeypatch):
    """The SQL catalog on the suite's PostgreSQL server (a catalog many processes share), the server
    stopped between the data files and the commit: one line naming the table and the batch, nothing
    visible; once the server is back the batch's re-run goes in once, its stray files deleted."""
    from pyiceberg.table import Transaction

    from sparkwal.wal import StorageUnavailableError

    database = dict(p.split("=", 1) for p in postgres.split())["dbname"]
    catalog = {"type": "sql", "uri": f"postgresql+psycopg://sparkwal@127.0.0.1:{postgres_cluster.port}/{database}",
               "warehouse": f"file://{tmp_path}/warehouse"}
    sink = IcebergSink(catalog, "db.lines", "lines", schema=SCHEMA)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    commit = Transaction.commit_transaction

    def server_gone_first(self):
        postgres_cluster.stop()
        return commit(self)

    monkeypatch.setattr(Transaction, "commit_transaction", server_gone_first)
    try:
        with pytest.raises(StorageUnavailableError, match=r"Iceberg commit of batch 1000 db.lines") as e:
            sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
        assert "\n" not in str(e.value).strip()
    finally:
        monkeypatch.setattr(Transaction, "commit_transaction", commit)
        postgres_cluster.start()
    restarted = IcebergSink(catalog, "db.lines", "lines")  # a new driver: a new catalog connection
    assert lines_in(restarted) == ["a"] and restarted.committed_batch() == 500
    assert restarted.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    assert restarted.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")])) \
        is False
    assert lines_in(restarted) == ["a", "b"] and data_files(tmp_path / "warehouse") == files_in_table(restarted)


def test_a_warehouse_on_s3(spark_context, tmp_path, s3_process_url):
    """The warehouse on an S3 server (moto): the catalog's s3.* properties give the tasks their
    endpoint; the tasks write through the storage seam without the keys (their environment has
    them), and the table reads back through pyiceberg's own S3 FileIO."""
    url, options = s3_process_url
    endpoint = options["client_kwargs"]["endpoint_url"]
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"{url}/warehouse",
               "s3.endpoint": endpoint, "s3.region": "us-east-1", "s3.access-key-id": "testing",
               "s3.secret-access-key": "testing"}
    sink = IcebergSink(catalog, "db.lines", "lines", schema=SCHEMA, partition_by=["partition"])
    assert "testing" not in str(pickle.loads(pickle.dumps(sink)).__dict__)
    rdd = spark_context.parallelize([("p0", "a"), ("p1", "b"), ("p0", "c")], 2)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 3)], rdd)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 3)], rdd) is False
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 3, 4)], spark_context.parallelize([("p1", "d")]))
    assert lines_in(sink) == ["a", "b", "c", "d"] and sink.committed_batch() == 1000
    assert IcebergSink(catalog, "db.lines", "lines").offsets() == {TopicPartition("log", "p0"): 4}
