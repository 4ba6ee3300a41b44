"""PostgresSink against a real PostgreSQL server (sparkwal.engine.apps.postgres_server): rows staged by the
executors with COPY and moved into the table with the batch's offsets in one driver transaction;
upsert by key; the DB-API way (collected) on the same seam; a re-run commits nothing; a restart
without a checkpoint resumes from the database; the server down at the commit fails the batch in
one line and its re-run goes in once; SIGKILL between the staging and the commit, and between the
commit and the checkpoint, loses and doubles nothing and leaves nothing staged
(tests/sink_crash_app.py)."""

from __future__ import annotations

import pickle
import signal

import psycopg
import pytest

from sparkwal.engine.apps.direct_wordcount import append_lines
from sparkwal.engine.sinks import PostgresSink, SinkOffsetsError
from sparkwal.engine.sources import OffsetRange
from sparkwal.wal import StorageUnavailableError

from sink_helpers import crash_at_each_step_then_recover, drill_exactly_once, expected, run_app, run_stream


def query(conninfo: str, sql: str, *params) -> list:
    with psycopg.connect(conninfo) as conn:
        return conn.execute(sql, params).fetchall()


def create_lines(conninfo: str, keyed: bool = False) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute("CREATE TABLE lines (partition TEXT, line TEXT" + (" PRIMARY KEY" if keyed else "") + ")")


def staging_tables(conninfo: str) -> list[str]:
    return [r[0] for r in query(conninfo, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'sparkwal_stage%%'")]


def lines_in(conninfo: str) -> list[str]:
    return sorted(r[0] for r in query(conninfo, "SELECT line FROM lines"))


def test_staged_rows_go_in_once_and_a_restart_resumes_from_the_database(spark_context, postgres, tmp_path):
    create_lines(postgres)
    logdir = tmp_path / "log"
    sink = PostgresSink(postgres, "lines", "lines")
    run_stream(spark_context, logdir, sink, [{"p0": 3, "p1": 2}, {"p0": 1}], checkpoint=tmp_path / "ckpt",
               per_partition=False)
    assert lines_in(postgres) == expected({"p0": 4, "p1": 2})
    assert {(tp.partition, o) for tp, o in sink.offsets().items()} == {("p0", 4), ("p1", 2)}
    assert staging_tables(postgres) == []  # nothing left staged
    # a re-run of the newest batch writes nothing
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 3, 4)], spark_context.parallelize([("p0", "x")])) is False
    # a new stream without a checkpoint, from the database's offsets
    append_lines(str(logdir), "p1", 2, 2)
    run_stream(spark_context, logdir, PostgresSink(postgres, "lines", "lines"), [{}], start_ms=5000,
               per_partition=False)
    assert lines_in(postgres) == expected({"p0": 4, "p1": 4})


def test_rows_keeping_the_source_partitioning_go_in_per_partition_once(spark_context, postgres, tmp_path):
    create_lines(postgres)
    logdir = tmp_path / "log"
    sink = PostgresSink(postgres, "lines", "lines")
    run_stream(spark_context, logdir, sink, [{"p0": 3, "p1": 2}, {"p0": 1}])
    assert lines_in(postgres) == expected({"p0": 4, "p1": 2})
    assert {(tp.partition, o) for tp, o in sink.offsets().items()} == {("p0", 4), ("p1", 2)}
    assert staging_tables(postgres) == []  # never staged
    # a batch whose p0 range is in already (a crash after p0's task committed): only p1 is written
    ranges = [OffsetRange("log", "p0", 3, 4), OffsetRange("log", "p1", 2, 3)]
    assert sink.write_partitions(1000, ranges, spark_context.parallelize([("p0", "again"), ("p1", "new")], 2))
    assert lines_in(postgres) == sorted(expected({"p0": 4, "p1": 2}) + ["new"])
    assert not sink.write_partitions(1000, ranges, spark_context.parallelize([("p0", "x"), ("p1", "y")], 2))
    with pytest.raises(SinkOffsetsError, match=r"batch 1500 reads log/p1 \[5, 6\) but the database's output "
                                               r"ends at offset 3"):
        sink.write_partitions(1500, [OffsetRange("log", "p1", 5, 6)], spark_context.parallelize([("p1", "z")], 1))
    # keyed rows upsert, per partition too
    with psycopg.connect(postgres) as conn:
        conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    keyed = PostgresSink(postgres, "kv", "kv", keys=["k"])
    keyed.write_partitions(500, [OffsetRange("t", 0, 0, 2)], spark_context.parallelize([("a", "1"), ("b", "1")], 1))
    keyed.write_partitions(1000, [OffsetRange("t", 0, 2, 3)], spark_context.parallelize([("a", "2")], 1))
    assert query(postgres, "SELECT k, v FROM kv ORDER BY k") == [("a", "2"), ("b", "1")]


@pytest.mark.driver
def test_a_kill_after_one_partition_committed_loses_and_doubles_nothing(tmp_path, postgres):
    """Per partition, a batch is visible partition by partition: p0's task commits, the driver is
    SIGKILLed with p1's transaction open; the restart writes p1 only."""
    from sparkwal.engine.apps.direct_wordcount import append_lines

    create_lines(postgres)
    logdir = tmp_path / "log"
    logdir.mkdir()
    append_lines(str(logdir), "p0", 0, 3)
    append_lines(str(logdir), "p1", 0, 2)
    env = {"SPARKWAL_TEST_PG": postgres, "SPARKWAL_TEST_PG_WAY": "partitions"}
    assert run_app(tmp_path, 60, "partition", "postgres", **env) == -signal.SIGKILL, f"see {tmp_path}/app.log"
    assert lines_in(postgres) == expected({"p0": 3})  # p0 in with its offsets, p1 not
    for _run in range(3):
        assert run_app(tmp_path, 8, None, "postgres", **env) == 0, f"see {tmp_path}/app.log"
        if lines_in(postgres) == expected({"p0": 3, "p1": 2}):
            break
    assert lines_in(postgres) == expected({"p0": 3, "p1": 2})


def test_upsert_by_key_and_the_db_api_way_on_the_same_seam(spark_context, postgres):
    with psycopg.connect(postgres) as conn:
        conn.execute("CREATE TABLE counts (word TEXT PRIMARY KEY, n BIGINT)")
    sink = PostgresSink(postgres, "counts", "counts", keys=["word"])
    assert sink.write_batch(500, [], spark_context.parallelize([("a", 1), ("b", 2)], 2))
    rows = [{"word": "b", "n": 5}, {"word": "c", "n": 3_000_000_000}]
    assert sink.write_batch(1000, [], spark_context.parallelize(rows))
    assert sorted(query(postgres, "SELECT word, n FROM counts")) == [("a", 1), ("b", 5), ("c", 3_000_000_000)]

    # the DB-API way: a batch collected and written by a function in the offsets' transaction
    seen = PostgresSink(postgres, name="collected")
    ranges = [OffsetRange("t", 0, 0, 2**40)]  # 64-bit offsets
    write = lambda cur: cur.execute("INSERT INTO counts VALUES (%s, %s)", ("d", 4))  # noqa: E731
    assert seen.commit_batch(500, ranges, write) and not seen.commit_batch(500, ranges, write)
    assert seen.offsets() == {(("t", 0)): 2**40} and query(postgres, "SELECT n FROM counts WHERE word = 'd'") == [(4,)]


def test_a_key_repeated_in_one_batch_upserts_its_last_row_per_partition_and_staged(spark_context, postgres):
    """One INSERT ... ON CONFLICT DO UPDATE cannot change a row twice: a batch repeating a key
    failed on every re-run. Its rows are combined per key first, the last winning: per partition,
    the last of the task's partition; staged, the last by task index, then row."""
    with psycopg.connect(postgres) as conn:
        for table in ("per_partition", "staged"):
            conn.execute(f"CREATE TABLE {table} (k TEXT PRIMARY KEY, v TEXT)")
            conn.execute(f"INSERT INTO {table} VALUES ('b', '0')")
        conn.execute("CREATE TABLE nullable (k TEXT UNIQUE, v TEXT)")
    ranges = [OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 0, 3)]

    def batch(rows):
        rdd = spark_context.parallelize(rows, 2)
        assert rdd.glom().collect() == [rows[:3], rows[3:]]  # partition i: range i's records
        return rdd

    sink = PostgresSink(postgres, "per_partition", "per_partition", keys=["k"])
    assert sink.write_partitions(500, ranges, batch([("a", "1"), ("b", "1"), ("a", "2"),
                                                      ("c", "1"), ("c", "2"), ("c", "3")]))
    assert query(postgres, "SELECT k, v FROM per_partition ORDER BY k") == [("a", "2"), ("b", "1"), ("c", "3")]
    assert sink.offsets() == {("t", 0): 3, ("t", 1): 3}

    sink = PostgresSink(postgres, "staged", "staged", keys=["k"])
    assert sink.write_batch(500, ranges, batch([("a", "1"), ("b", "1"), ("a", "2"),
                                                ("a", "3"), ("c", "1"), ("c", "2")]))
    assert query(postgres, "SELECT k, v FROM staged ORDER BY k") == [("a", "3"), ("b", "1"), ("c", "2")]
    assert sink.offsets() == {("t", 0): 3, ("t", 1): 3}
    assert staging_tables(postgres) == []

    # NULL keys are never combined (a unique constraint holds NULLs distinct): each goes in
    sink = PostgresSink(postgres, "nullable", "nullable", keys=["k"])
    assert sink.write_batch(500, [], spark_context.parallelize([(None, "x"), ("a", "1"), (None, "y"), ("a", "2")], 1))
    assert sorted(query(postgres, "SELECT k, v FROM nullable"), key=repr) == [("a", "2"), (None, "x"), (None, "y")]


def test_every_planned_range_end_is_stored_empty_ones_too(spark_context, postgres, tmp_path):
    """A partition without records in any committed batch still gets its end in the offsets'
    table (a restart without a checkpoint knows where it stands); a stored end is never moved."""
    create_lines(postgres)
    sink = PostgresSink(postgres, "lines", "per_partition")
    run_stream(spark_context, tmp_path / "log", sink, [{"p0": 3, "p1": 0}])  # p1: a file without lines
    assert {(tp.partition, o) for tp, o in sink.offsets().items()} == {("p0", 3), ("p1", 0)}
    # a batch that read nothing at all stores its ranges' ends too, never moving one stored
    assert not sink.write_partitions(1000, [OffsetRange("log", "p0", 3, 3), OffsetRange("log", "p2", 4, 4)],
                                     spark_context.emptyRDD())
    assert not PostgresSink(postgres, "lines", "per_partition").write_partitions(
        1500, [OffsetRange("log", "p0", 7, 7)], spark_context.emptyRDD())  # (a driver that knows nothing stored)
    assert {(tp.partition, o) for tp, o in sink.offsets().items()} == {("p0", 3), ("p1", 0), ("p2", 4)}

    staged = PostgresSink(postgres, "lines", "staged")
    assert staged.write_batch(500, [OffsetRange("log", "p0", 0, 2), OffsetRange("log", "p1", 0, 0)],
                              spark_context.parallelize([("p0", "a"), ("p0", "b")], 1))
    assert staged.offsets() == {("log", "p0"): 2, ("log", "p1"): 0}
    assert not staged.write_batch(1000, [OffsetRange("log", "p0", 2, 2), OffsetRange("log", "p2", 5, 5)],
                                  spark_context.emptyRDD())
    assert staged.offsets() == {("log", "p0"): 2, ("log", "p1"): 0, ("log", "p2"): 5}
    assert staging_tables(postgres) == []


def test_mistakes_are_named(spark_context, postgres):
    with pytest.raises(SinkOffsetsError, match="the table nope does not exist in the database: create it first"):
        PostgresSink(postgres, "nope").write_batch(500, [], spark_context.parallelize([("a", "b")]))
    create_lines(postgres)
    with pytest.raises(Exception, match=r"a row of 3 values for 2 columns \(partition, line\)"):
        PostgresSink(postgres, "lines").write_batch(500, [], spark_context.parallelize([("a", "b", "c")]))
    sink = PostgresSink(postgres, "lines", "lines")
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    with pytest.raises(SinkOffsetsError, match=r"batch 1000 reads log/p0 \[5, 6\) but the database's output "
                                               r"ends at offset 1"):
        sink.write_batch(1000, [OffsetRange("log", "p0", 5, 6)], spark_context.parallelize([("p0", "b")]))
    assert lines_in(postgres) == ["a"]
    with pytest.raises(Exception, match=r"a row of 1 values for 2 columns \(partition, line\)"):  # per partition too
        sink.write_partitions(1000, [OffsetRange("log", "p0", 1, 3)],
                              spark_context.parallelize([("p0", "b"), ("p0",)], 1))
    assert lines_in(postgres) == ["a"] and sink.offsets() == {("log", "p0"): 1}  # its transaction rolled back


def test_the_password_never_travels_with_tasks_or_into_checkpoints(postgres):
    sink = PostgresSink(postgres + " password=s3cret-pw", "lines", "lines")
    assert b"s3cret-pw" not in pickle.dumps(sink)
    assert "s3cret-pw" in sink.conninfo  # the driver's own object keeps it


def test_an_output_far_larger_than_max_result_size_is_staged_not_collected(spark_context, postgres):
    create_lines(postgres)
    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.driver.maxResultSize", "1m")
    try:
        rdd = spark_context.range(0, 120_000, numSlices=4).map(lambda i: ("p0", f"{i:08d}" + "x" * 92))
        with pytest.raises(Exception, match="maxResultSize"):
            rdd.collect()
        assert PostgresSink(postgres, "lines", "big").write_batch(500, [], rdd)
    finally:
        live_conf.remove("spark.driver.maxResultSize")
    assert query(postgres, "SELECT count(*), count(DISTINCT line) FROM lines") == [(120_000, 120_000)]


def test_the_server_down_at_the_commit_fails_the_batch_in_one_line_and_its_rerun_goes_in_once(
        spark_context, postgres_cluster, postgres, monkeypatch):
    create_lines(postgres)
    sink = PostgresSink(postgres, "lines", "lines", connect_timeout_s=2)
    assert sink.write_batch(500, [OffsetRange("log", "p0", 0, 1)], spark_context.parallelize([("p0", "a")]))
    commit_batch = PostgresSink.commit_batch

    def server_gone_first(self, *args):
        postgres_cluster.stop()
        return commit_batch(self, *args)

    monkeypatch.setattr(PostgresSink, "commit_batch", server_gone_first)
    try:
        with pytest.raises(StorageUnavailableError, match=r"storage unavailable: connect to .*port="
                                                          rf"{postgres_cluster.port}.*Connection refused"):
            sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    finally:
        postgres_cluster.start()
    monkeypatch.setattr(PostgresSink, "commit_batch", commit_batch)
    assert lines_in(postgres) == ["a"] and len(staging_tables(postgres)) == 1  # batch 1000's rows only staged
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 1, 2)], spark_context.parallelize([("p0", "b")]))
    assert lines_in(postgres) == ["a", "b"]
    assert staging_tables(postgres) == []


@pytest.mark.driver
def test_a_kill_between_the_staging_and_the_commit_and_after_the_commit_loses_and_doubles_nothing(
        tmp_path, postgres):
    create_lines(postgres)
    crash_at_each_step_then_recover(tmp_path, lambda: lines_in(postgres), "postgres", SPARKWAL_TEST_PG=postgres,
                                    SPARKWAL_TEST_PG_WAY="staged")
    assert staging_tables(postgres) == []


@pytest.mark.driver
def test_drill_with_the_postgres_sink_counts_every_line_exactly_once_across_a_kill(tmp_path):
    drill_exactly_once(tmp_path, "postgres", seed=5)
