"""DeltaSink: a direct stream's batches into a Delta table (delta-rs) exactly once: written by
the executors, committed by the driver with the batch's txn; a re-run commits nothing; a restart
without a checkpoint resumes from the table; a SIGKILL between the executors' writes and the
commit, or between the commit and the checkpoint, loses and doubles nothing and leaves no file
of the dead attempt (tests/sink_crash_app.py)."""

from __future__ import annotations

import json
import os
import re
import signal

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction

from sparkwal.engine.apps.direct_wordcount import append_lines
from sparkwal.engine.sinks import DeltaSink, SinkOffsetsError
from sparkwal.engine.sources import OffsetRange, SinkOffsets, TopicPartition

from sink_helpers import crash_at_each_step_then_recover, expected, run_stream

SCHEMA = pa.schema([("partition", pa.string()), ("line", pa.string())])


def lines_in(sink: DeltaSink) -> list[str]:
    return sorted(sink.read(["line"]).column("line").to_pylist())


def parquet_files(table_dir) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), table_dir) for d, _, fs in os.walk(table_dir)
            for f in fs if f.endswith(".parquet") and "_sparkwal" not in d}


def test_each_batch_goes_in_once_with_its_txn_and_a_restart_resumes_from_the_table(spark_context, tmp_path):
    table_dir = tmp_path / "table"
    sink = DeltaSink(str(table_dir), "lines", schema=SCHEMA, partition_by=["partition"])
    run_stream(spark_context, tmp_path / "log", sink, [{"p0": 3, "p1": 2}, {"p0": 1}], checkpoint=tmp_path / "ckpt")
    assert lines_in(sink) == expected({"p0": 4, "p1": 2})
    assert sink.committed_batch() == 1000  # the txn's version: the newest batch's time
    assert DeltaTable(str(table_dir)).transaction_version("lines") == 1000
    assert {(tp.partition, o) for tp, o in sink.offsets().items()} == {("p0", 4), ("p1", 2)}
    files = parquet_files(table_dir)
    assert all(f.startswith(("partition=p0/", "partition=p1/")) for f in files), files

    # a re-run of the newest batch (a crash between the commit and the checkpoint) writes nothing
    version = DeltaTable(str(table_dir)).version()
    ranges = [OffsetRange("log", "p0", 3, 4)]
    assert sink.write_batch(1000, ranges, spark_context.parallelize([("p0", "again")])) is False
    assert DeltaTable(str(table_dir)).version() == version and parquet_files(table_dir) == files

    # a new stream without a checkpoint starts from the table's offsets (fresh sink object too)
    fresh = DeltaSink(str(table_dir), "lines")
    append_lines(str(tmp_path / "log"), "p1", 2, 2)
    run_stream(spark_context, tmp_path / "log", fresh, [{}], start_ms=5000)
    assert lines_in(fresh) == expected({"p0": 4, "p1": 4})
    assert fresh.committed_batch() == 5500


def test_delta_rs_commits_a_txn_version_twice_and_the_sink_does_not(spark_context, tmp_path):
    """delta-rs records application transactions but commits the same version again (its issues
    2580 and 3821): the sink's own check is what keeps a batch from going in twice."""
    import pyarrow.parquet as pq
    from deltalake.transaction import AddAction

    uri = str(tmp_path / "table")
    DeltaTable.create(uri, SCHEMA)
    txn = CommitProperties(app_transactions=[Transaction(app_id="lines", version=500)])
    for attempt in ("a", "b"):  # two attempts of batch 500, each with its files
        pq.write_table(pa.table({"partition": ["p0"], "line": ["x"]}), f"{uri}/{attempt}.parquet")
        add = AddAction(path=f"{attempt}.parquet", size=os.path.getsize(f"{uri}/{attempt}.parquet"),
                        partition_values={}, modification_time=1, data_change=True, stats='{"numRecords": 1}')
        DeltaTable(uri).create_write_transaction([add], "append", SCHEMA, commit_properties=txn)
    assert DeltaTable(uri).version() == 2 and DeltaSink(uri, "lines").read().num_rows == 2  # twice

    rdd, ranges = spark_context.parallelize([("p0", "y")]), [OffsetRange("log", "p0", 0, 1)]
    assert DeltaSink(uri, "lines").write_batch(500, ranges, rdd) is False  # the txn's batch: in already
    own = DeltaSink(str(tmp_path / "own"), "lines", schema=SCHEMA)
    assert own.write_batch(1000, ranges, rdd) is True and own.write_batch(1000, ranges, rdd) is False
    assert DeltaTable(str(tmp_path / "own")).version() == 1 and lines_in(own) == ["y"]
    # a batch that read and wrote nothing makes no table version
    assert own.write_batch(1500, [OffsetRange("log", "p0", 1, 1)], spark_context.emptyRDD()) is False
    assert DeltaTable(str(tmp_path / "own")).version() == 1


def test_a_batch_not_starting_where_the_table_ends_is_refused_naming_both(spark_context, tmp_path):
    sink = DeltaSink(str(tmp_path / "table"), "lines", schema=SCHEMA)
    rdd = spark_context.parallelize([("p0", "a")])
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], rdd)
    with pytest.raises(SinkOffsetsError, match=r"batch 1000 reads log/p0 \[5, 6\) but the Delta table's "
                                               r"output ends at offset 1"):
        DeltaSink(str(tmp_path / "table"), "lines").write_batch(1000, [OffsetRange("log", "p0", 5, 6)], rdd)
    assert lines_in(sink) == ["a"]


def test_a_batch_behind_the_tables_txn_is_decided_by_its_offsets_not_its_time(spark_context, tmp_path):
    """An old driver on another batch grid, or with a clock behind the table's newest batch: its
    batch starting where the table's output ends goes in; its re-run does not."""
    uri = str(tmp_path / "table")
    sink = DeltaSink(uri, "lines", schema=SCHEMA)
    ab = spark_context.parallelize([("p0", "a"), ("p0", "b")])
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 2)], ab)
    behind = DeltaSink(uri, "lines")
    rdd = spark_context.parallelize([("p0", "c")])
    assert behind.write_batch(700, [OffsetRange("log", "p0", 2, 3)], rdd) is True
    assert lines_in(sink) == ["a", "b", "c"] and sink.offsets() == {TopicPartition("log", "p0"): 3}
    version = DeltaTable(uri).version()
    assert behind.write_batch(700, [OffsetRange("log", "p0", 2, 3)], rdd) is False
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 2, 3)], rdd) is False  # a later time, in all the same
    assert DeltaTable(uri).version() == version and sink.committed_batch() == 700  # the txn: the newest commit's


def test_a_batch_partly_in_or_not_where_the_table_ends_is_refused_whatever_its_time(spark_context, tmp_path):
    uri = str(tmp_path / "table")
    sink = DeltaSink(uri, "lines", schema=SCHEMA)
    ab = spark_context.parallelize([("p0", "a"), ("p0", "b")])
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 2)], ab)
    version, rdd = DeltaTable(uri).version(), spark_context.parallelize([("p1", "x")])
    with pytest.raises(SinkOffsetsError, match=r"batch 1000 is partly in the Delta table .*: its log/p0 \[0, 2\) "
                                               r"is in, its log/p1 \[0, 1\) is not \(no output\)"):
        sink.write_batch(1000, [OffsetRange("log", "p0", 0, 2), OffsetRange("log", "p1", 0, 1)], rdd)
    with pytest.raises(SinkOffsetsError, match=r"batch 500 reads log/p0 \[5, 6\) but the Delta table's output "
                                               r"ends at offset 2"):
        DeltaSink(uri, "lines").write_batch(500, [OffsetRange("log", "p0", 5, 6)], rdd)
    assert lines_in(sink) == ["a", "b"] and DeltaTable(uri).version() == version


def test_a_history_without_the_sinks_newest_commit_refuses_rather_than_guess_by_time(spark_context, tmp_path):
    """Log retention removed the commit holding the sink's offsets: only the txn's own batch can
    be told in; any other batch is refused (an older time is no proof it is in)."""
    from deltalake import write_deltalake

    uri = str(tmp_path / "table")
    DeltaTable.create(uri, SCHEMA, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    ranges, rdd = [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")])
    assert DeltaSink(uri, "lines").write_batch(1000, ranges, rdd)
    write_deltalake(uri, pa.table({"partition": ["q"], "line": ["other writer"]}), mode="append")
    DeltaTable(uri).create_checkpoint()
    DeltaTable(uri).cleanup_metadata()
    assert all(c.get("sparkwal.sink") is None for c in DeltaTable(uri).history())
    sink, version = DeltaSink(uri, "lines"), DeltaTable(uri).version()
    assert sink.write_batch(1000, ranges, rdd) is False  # the txn's batch: the newest commit
    lost = (rf"{re.escape(uri)}: the commit of batch 1000 \(the txn of 'lines'\) is not in the table's history "
            r".* explicit fromOffsets")
    for t in (500, 1500):
        with pytest.raises(SinkOffsetsError, match=lost):
            sink.write_batch(t, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    with pytest.raises(SinkOffsetsError, match=lost):
        sink.offsets()
    assert DeltaTable(uri).version() == version and lines_in(sink) == ["a", "other writer"]


def test_a_partition_without_records_in_a_committed_batch_is_in_the_offsets(spark_context, tmp_path):
    uri = str(tmp_path / "table")
    sink = DeltaSink(uri, "lines", schema=SCHEMA)
    rdd = spark_context.parallelize([("p0", "a")])
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1), OffsetRange("log", "p1", 3, 3)], rdd)
    offsets = DeltaSink(uri, "lines").offsets()
    assert offsets == {TopicPartition("log", "p0"): 1, TopicPartition("log", "p1"): 3}
    assert ["log", "p1", 3] in json.loads(DeltaTable(uri).history(1)[0]["sparkwal.offsets"])
    assert isinstance(offsets, SinkOffsets) and offsets.unseen_from_earliest
    never = DeltaSink(str(tmp_path / "other"), "lines").offsets()
    assert isinstance(never, SinkOffsets) and never == {} and not never.unseen_from_earliest
    rdd = spark_context.parallelize([("p1", "b")])
    assert sink.write_batch(1500, [OffsetRange("log", "p0", 1, 1), OffsetRange("log", "p1", 3, 4)], rdd)
    assert DeltaSink(uri, "lines").offsets() == {TopicPartition("log", "p0"): 1, TopicPartition("log", "p1"): 4}


def test_merge_mode_upserts_by_key(spark_context, tmp_path):
    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    sink = DeltaSink(str(tmp_path / "table"), "counts", schema=schema, mode="merge", keys=["word"])
    sink.write_batch(500, [], spark_context.parallelize([("a", 1), ("b", 2)], 2))
    sink.write_batch(1000, [], spark_context.parallelize([{"word": "b", "n": 5}, {"word": "c", "n": 1}], 2))
    assert sink.write_batch(1000, [], spark_context.parallelize([("b", 99)])) is False
    got = sink.read().to_pylist()
    assert sorted((r["word"], r["n"]) for r in got) == [("a", 1), ("b", 5), ("c", 1)]
    assert not os.path.exists(tmp_path / "table" / "_sparkwal" / "counts" / "1000")  # staging gone
    with pytest.raises(ValueError, match="mode='merge' needs keys"):
        DeltaSink(str(tmp_path / "t2"), mode="merge")


def test_partition_values_with_any_characters_read_back(spark_context, tmp_path):
    sink = DeltaSink(str(tmp_path / "table"), "lines", schema=SCHEMA, partition_by=["partition"])
    rows = [("a b", "1"), ("x/y:z%", "2"), ("é", "3"), (None, "4")]
    sink.write_batch(500, [], spark_context.parallelize(rows, 2))
    got = sink.read().to_pylist()
    assert sorted((r["partition"] or "", r["line"]) for r in got) == sorted((p or "", v) for p, v in rows)


def test_an_output_far_larger_than_max_result_size_never_passes_through_the_driver(spark_context, tmp_path):
    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.driver.maxResultSize", "1m")
    try:
        rdd = spark_context.range(0, 120_000, numSlices=4).map(lambda i: ("p0", f"{i:08d}" + "x" * 92))
        with pytest.raises(Exception, match="maxResultSize"):
            rdd.collect()  # ~12 MB of rows: more than ten times the limit
        sink = DeltaSink(str(tmp_path / "table"), "big", schema=SCHEMA)
        assert sink.write_batch(500, [], rdd)
    finally:
        live_conf.remove("spark.driver.maxResultSize")
    table = sink.read(["line"])
    assert table.num_rows == 120_000 and len(set(table.column("line").to_pylist())) == 120_000


@pytest.mark.driver
def test_a_kill_between_the_writes_and_the_commit_and_after_the_commit_loses_and_doubles_nothing(tmp_path):
    sink = DeltaSink(str(tmp_path / "table"), "lines")
    crash_at_each_step_then_recover(tmp_path, lambda: lines_in(sink))
    # the attempt killed before its commit left files; a later batch's commit deleted them
    held = {os.path.normpath(p) for p in parquet_files(tmp_path / "table")}
    table = DeltaTable(str(tmp_path / "table"))
    from urllib.parse import unquote
    in_table = {os.path.normpath(unquote(p)) for p in pa.table(table.get_add_actions()).column("path").to_pylist()}
    assert held == in_table, held - in_table


@pytest.mark.slow
def test_a_table_on_s3(spark_context, s3_process_url):
    """The same protocol on an S3 server (moto): tasks write through the storage seam with the
    endpoint but without the credentials (the executors' environment has them)."""
    url, options = s3_process_url
    sink = DeltaSink(f"{url}/table", "lines", schema=SCHEMA, partition_by=["partition"], storage_options=options)
    rdd = spark_context.parallelize([("p0", "a"), ("p1", "b"), ("p0", "c")], 2)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 3)], rdd)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 3)], rdd) is False
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 3, 4)], spark_context.parallelize([("p1", "d")]))
    assert lines_in(sink) == ["a", "b", "c", "d"] and sink.committed_batch() == 1000
    assert {(tp.partition, o) for tp, o in DeltaSink(f"{url}/table", "lines", storage_options=options)
            .offsets().items()} == {("p0", 4)}


@pytest.mark.slow
def test_a_store_down_at_the_commit_fails_the_batch_in_one_line_and_leaves_nothing_half_visible(
        spark_context, monkeypatch):
    """The S3 server stops answering (SIGSTOP) between the tasks' writes and the Delta commit:
    the commit gives up after the storage deadline with the seam's StorageUnavailableError naming
    the table and the batch; once the server is back the table holds the batches before it, and
    the batch's re-run goes in once."""
    from conftest import moto_process, new_bucket
    from sparkwal.wal import StorageUnavailableError

    with moto_process() as (endpoint, server):
        url, options = new_bucket(endpoint)
        sink = DeltaSink(f"{url}/table", "lines", schema=SCHEMA, storage_options=options,
                         delta_storage_options={"timeout": "1s", "retry_timeout": "2s"})
        rdd = spark_context.parallelize([("p0", "a")])
        assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], rdd)
        check = DeltaSink._check

        def stop_the_server_first(self, *args):
            os.kill(server.pid, signal.SIGSTOP)
            return check(self, *args)

        monkeypatch.setattr(DeltaSink, "_check", stop_the_server_first)
        try:
            with pytest.raises(StorageUnavailableError, match=r"Delta commit of batch 1000 s3://.*/table"):
                sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
        finally:
            os.kill(server.pid, signal.SIGCONT)
        monkeypatch.setattr(DeltaSink, "_check", check)
        assert lines_in(sink) == ["a"] and sink.committed_batch() == 500
        assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
        assert lines_in(sink) == ["a", "b"]


@pytest.mark.driver
def test_drill_with_the_delta_sink_and_speculative_copies_counts_every_line_exactly_once(tmp_path, monkeypatch):
    """CI's share of ``sparkwal drill --mode direct --sink delta --speculation --standalone 2`` (it
    replaces the 3-kill drill on local[2]; docs/direct.md gives longer runs): a standalone cluster
    whose two workers are hosts of their own, ``spark.speculation=true``, first attempts slowed, a
    kill: speculative copies write beside the attempts they copy, and every line is counted once."""
    import sys

    from sparkwal.engine.apps import direct_drill
    from sparkwal.engine.apps.standalone import StandaloneCluster

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    with StandaloneCluster(str(tmp_path / "cluster"), 2, cores=2, hosts_apart=True) as cluster:
        report = direct_drill.run(1, 1.0, seed=11, workdir=str(tmp_path), log=lambda *_: None, sink="delta",
                                  master=cluster.url, speculation=True)
    assert report["records_lost"] == 0 and report["duplicates"] == 0 and report["words_exact"], report
    assert report["kills"] == 1 and report["speculative_attempts"] >= 1 and report["ok"], report


def test_a_concurrent_commit_of_the_same_batch_conflicts_and_the_sink_decides_again(
        spark_context, tmp_path, monkeypatch, caplog):
    """Another writer of the sink (a zombie driver) commits batch 1000 between this sink's check
    and its commit: delta-rs's conflict check refuses a second transaction of the same appId, the
    sink reads the table again, finds the batch there and commits nothing."""
    uri = str(tmp_path / "table")
    sink = DeltaSink(uri, "lines", schema=SCHEMA)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    zombie = DeltaSink(uri, "lines")
    commit = DeltaTable.create_write_transaction
    raced = []

    def zombie_commits_first(self, *args, **kwargs):
        if not raced:
            raced.append(True)
            monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)
            assert zombie.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", zombie_commits_first)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")])) is False
    assert raced and lines_in(sink) == ["a", "b"]
    assert any("batch 1000's Delta commit conflicted" in r.getMessage() for r in caplog.records)
    assert DeltaTable(uri).version() == 2 and sink.committed_batch() == 1000
    sink.clean_up(1000)  # the losing attempt's files go (as the next commit would delete them)
    held = {p.replace("%3D", "=") for p in pa.table(DeltaTable(uri).get_add_actions()).column("path").to_pylist()}
    assert parquet_files(tmp_path / "table") == held


@pytest.mark.parametrize("leader_ms, zombie_ms", [(1500, 1800), (700, 1000)])
def test_a_zombie_finding_its_old_batch_in_leaves_the_leaders_next_batch_files_alone(
        spark_context, tmp_path, leader_ms, zombie_ms):
    """A zombie driver re-runs a batch whose offsets are in (on a clock ahead of the leader's, or the
    leader's behind): its clean-up runs between the leader's files of its next batch and their
    commit, and must not take them (an attempt's files go only once the table's output has passed
    its ranges)."""
    uri = str(tmp_path / "table")
    sink = DeltaSink(uri, "lines", schema=SCHEMA)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    zombie, leader_commit = DeltaSink(uri, "lines"), sink.commit_batch

    def zombie_first(*args):
        assert zombie.write_batch(zombie_ms, [OffsetRange("log", "p0", 0, 1)],
                                  spark_context.parallelize([("p0", "a")])) is False
        return leader_commit(*args)

    sink.commit_batch = zombie_first
    assert sink.write_batch(leader_ms, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    assert lines_in(sink) == ["a", "b"]
    held = {p.replace("%3D", "=") for p in pa.table(DeltaTable(uri).get_add_actions()).column("path").to_pylist()}
    assert parquet_files(tmp_path / "table") == held
