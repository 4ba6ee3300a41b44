"""Exactly-once outputs and the batch log's edges: the SQLite transactional sink, idempotent
saveAsTextFiles, retention, a changed graph or a lost offset log, and the batch protocol for a
graph with no direct input (spark.sparkwal.batchLog.enabled=true)."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from sparkwal.checkpoint import CommitLog, OffsetSeqLog
from sparkwal.engine import StreamingContext
from sparkwal.engine.sinks import SinkOffsetsError, SQLiteSink
from sparkwal.engine.sources import BatchLog, FileLogSource, OffsetRange, TopicPartition
from sparkwal.wal import ManualClock

from test_engine_operations import Harness
from test_engine_recovery import Completed, put_file


def test_sqlite_sink_applies_a_batch_once_and_resumes_from_its_offsets(tmp_path):
    sink = SQLiteSink(str(tmp_path / "out.db"), "counts")
    assert sink.offsets() == {}

    def write(cur):
        cur.execute("CREATE TABLE IF NOT EXISTS c (k TEXT PRIMARY KEY, n INTEGER)")
        cur.execute("INSERT INTO c VALUES ('x', 1) ON CONFLICT(k) DO UPDATE SET n = n + 1")

    batch = [OffsetRange("log", "a", 0, 3), OffsetRange("log", 1, 0, 0)]
    assert sink.commit_batch(500, batch, write) is True
    assert sink.commit_batch(500, batch, write) is False  # a re-run: already in the database
    # partition names keep their type; a partition planned without records is stored too (SinkOffsets)
    assert sink.offsets() == {TopicPartition("log", "a"): 3, TopicPartition("log", 1): 0}
    assert sink.commit_batch(1000, [OffsetRange("log", "a", 3, 5)], write) is True
    # a batch re-run after a later one went in (outputs go in batch order): in already, by its offsets
    assert sink.commit_batch(500, batch, write) is False
    with pytest.raises(SinkOffsetsError, match=r"log/a \[6, 7\) but the database's output ends at offset 5"):
        sink.commit_batch(1500, [OffsetRange("log", "a", 6, 7)], write)
    with pytest.raises(SinkOffsetsError, match=r"log/a \[4, 6\) but the database's output ends at offset 5"):
        sink.commit_batch(1500, [OffsetRange("log", "a", 4, 6)], write)
    # a stream behind the sink (explicit fromOffsets below its end, offsets that restarted): a later batch
    # whose range ends before the stored end is refused, not taken for in
    with pytest.raises(SinkOffsetsError, match=r"log/a \[0, 3\) but the database's output ends at offset 5"):
        sink.commit_batch(3000, [OffsetRange("log", "a", 0, 3)], write)
    assert sink.commit_batch(3000, [OffsetRange("log", "a", 3, 5)], write) is False  # ends there: in, whoever wrote it

    def broken(cur):
        write(cur)
        raise RuntimeError("output failed half-way")
    with pytest.raises(RuntimeError):
        sink.commit_batch(2000, [OffsetRange("log", "a", 5, 6)], broken)
    conn = sqlite3.connect(tmp_path / "out.db")
    assert conn.execute("SELECT n FROM c").fetchall() == [(2,)]  # rolled back with its offsets
    assert sink.offsets() == {TopicPartition("log", "a"): 5, TopicPartition("log", 1): 0}
    other = SQLiteSink(str(tmp_path / "out.db"), "other")  # sinks share a database by name
    assert other.offsets() == {}


@pytest.mark.compat
def test_transactional_output_is_exactly_once_without_a_checkpoint(spark_context, tmp_path):
    logdir = tmp_path / "log"
    logdir.mkdir()
    (logdir / "a").write_text("w1\nw2\n")
    sink = SQLiteSink(str(tmp_path / "out.db"), "lines")

    def write(cur, t, records):
        cur.execute("CREATE TABLE IF NOT EXISTS lines (line TEXT)")
        cur.executemany("INSERT INTO lines VALUES (?)", [(r,) for r in records])

    for run, more in enumerate(["w3\n", "w4\nw5\n"]):
        clock, done = ManualClock(0), Completed()
        ssc = StreamingContext(spark_context, 0.5, clock=clock)  # no checkpoint
        stream = ssc.directStream(FileLogSource(str(logdir)), fromOffsets=sink.offsets())
        sink.saveStream(stream, stream, write)
        ssc.addStreamingListener(done)
        ssc.start()
        clock.advance(500)
        done.wait_for(500)
        with open(logdir / "a", "a") as f:
            f.write(more)
        clock.advance(500)
        done.wait_for(1000)
        ssc.stop(stopSparkContext=False)
    lines = [r[0] for r in sqlite3.connect(tmp_path / "out.db").execute("SELECT line FROM lines")]
    assert sorted(lines) == ["w1", "w2", "w3", "w4", "w5"]


def test_save_as_text_files_replaces_what_an_earlier_run_left(spark_context, tmp_path):
    stale = tmp_path / "out-500.txt"
    stale.mkdir()
    (stale / "part-00000").write_text("stale\n")  # a killed run's partial output of batch 500
    h = Harness(spark_context)
    src = h.ssc.queueStream([["x", "y"], ["z"]])
    src.saveAsTextFiles(str(tmp_path / "out"), "txt")
    h.run(src, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-1000.txt", "out-500.txt"]
    assert sorted(spark_context.textFile(str(stale)).collect()) == ["x", "y"]


class _Input:
    def __init__(self, path, input_id=0):
        self.source, self.input_id = FileLogSource(str(path)), input_id


def test_batch_log_retains_min_batches_and_refuses_a_changed_graph(tmp_path):
    one = _Input(tmp_path / "log")
    blog = BatchLog(str(tmp_path / "ckpt"), [one], retain=3)
    blog.recover()
    for i in range(10):
        t = (i + 1) * 500
        assert blog.log_batch(t, [{TopicPartition("log", "a"): i}], {}) == i
        blog.batch_done(t, True)
        blog.checkpoint_durable(t)
    assert OffsetSeqLog(str(tmp_path / "ckpt" / "offsets")).batch_ids() == [7, 8, 9]
    assert CommitLog(str(tmp_path / "ckpt" / "commits")).batch_ids() == [7, 8, 9]
    again = BatchLog(str(tmp_path / "ckpt"), [one], retain=3)
    again.recover()
    assert again.latest_logged_id() == 9 and again.is_committed(5000) and not again.rerun_times
    assert again.latest_ends(one) == {TopicPartition("log", "a"): 9}
    # each entry names its lines' inputs: one an upgrade added has no range in the logged batches
    added = _Input(tmp_path / "other", input_id=1)
    upgraded = BatchLog(str(tmp_path / "ckpt"), [one, added])
    upgraded.recover()
    assert upgraded.latest_ends(added) is None and upgraded.logged_ranges(added, 5000) == ([], {})
    assert upgraded.latest_ends(one) == {TopicPartition("log", "a"): 9}
    # an entry that does not name them (an earlier release's) has a line per input of its graph
    (tmp_path / "ckpt" / "offsets" / "9").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":5000,"conf":{}}\n{"log":{"a":9}}')
    with pytest.raises(ValueError, match=r"offsets/9 has offsets of 1 direct inputs, and 2 are known to have "
                                         r"written it \(\[0, 1\]\): the graph changed"):
        BatchLog(str(tmp_path / "ckpt"), [one, added]).recover()
    assert BatchLog(str(tmp_path / "ckpt"), [one, added], legacy_ids=[0]).recover() is None


def test_commits_wait_for_the_checkpoint_and_for_every_earlier_batch(tmp_path):
    blog = BatchLog(str(tmp_path / "ckpt"), [], retain=100)
    blog.recover()
    for t in (500, 1000, 1500):
        blog.log_batch(t, [], {})
    blog.batch_done(1000, True)  # batch 1 finished first (concurrent jobs)
    blog.checkpoint_durable(1500)
    assert blog.statistics().latest_committed == -1  # batch 0 is not done
    blog.batch_done(500, True)
    assert blog.statistics().latest_committed == 1
    blog.batch_done(1500, False)  # a failed batch is never committed
    assert blog.statistics().latest_committed == 1
    restarted = BatchLog(str(tmp_path / "ckpt"), [])
    restarted.recover()
    assert restarted.rerun_times == [1500]
    b2 = BatchLog(str(tmp_path / "ckpt2"), [])
    b2.recover()
    b2.log_batch(500, [], {})
    b2.batch_done(500, True)
    assert b2.statistics().latest_committed == -1  # no DStream checkpoint durable yet
    b2.checkpoint_durable(500)
    assert b2.statistics().latest_committed == 0


def test_a_lost_offset_log_is_refused_by_the_checkpoint(spark_context, tmp_path):
    logdir = tmp_path / "log"
    logdir.mkdir()
    (logdir / "a").write_text("x\n")

    def setup(clock, done):
        def make():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.checkpoint(str(tmp_path / "ckpt"))
            ssc.directStream(FileLogSource(str(logdir))).foreachRDD(lambda rdd: rdd.count())
            ssc.addStreamingListener(done)
            return ssc
        return make

    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(tmp_path / "ckpt"), setup(clock, done))
    ssc.start()
    clock.advance(500)
    done.wait_for(500)
    clock.advance(500)
    done.wait_for(1000)
    ssc.stop(stopSparkContext=False)
    shutil.rmtree(tmp_path / "ckpt" / "offsets")
    ssc2 = StreamingContext.getOrCreate(str(tmp_path / "ckpt"), setup(ManualClock(1200), Completed()),
                                        upgrade=True)
    with pytest.raises(Exception, match="commit log is ahead of the offset log|offset log was lost"):
        ssc2.start()


def test_batch_protocol_for_a_file_stream_skips_committed_batches(spark_context, tmp_path, live_settings):
    indir = tmp_path / "in"
    indir.mkdir()
    outputs: list[int] = []

    def setup(clock, done):
        def make():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.checkpoint(str(tmp_path / "ckpt"))
            seen = outputs
            ssc.textFileStream(str(indir)).foreachRDD(lambda t, rdd: seen.append(len(rdd.collect())))
            ssc.addStreamingListener(done)
            return ssc
        return make

    live_settings({"spark.sparkwal.batchLog.enabled": "true"})
    clock, done = ManualClock(0), Completed()
    ssc = setup(clock, done)()
    ssc.start()
    put_file(indir, "a.txt", "1\n2\n", 400)
    clock.advance(500)
    done.wait_for(500)
    ssc.stop(stopSparkContext=False)
    assert outputs == [2]
    clock2, done2 = ManualClock(1200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(tmp_path / "ckpt"), setup(clock2, done2), upgrade=True)
    ssc2.start()
    assert ssc2.skipped_batch_times == [500] and 500 not in ssc2.rerun_batch_times
    for t in ssc2.rerun_batch_times:
        done2.wait_for(t)
    ssc2.stop(stopSparkContext=False)
    assert outputs[0] == 2 and sum(outputs) == 2  # batch 500's output did not run again


@pytest.mark.s3
def test_file_streams_read_any_fsspec_url(spark_context, s3_url):
    """textFileStream and FileLogSource on S3 (moto's server): listed and read through fsspec by
    the driver and the tasks, as every executor of a cluster would."""
    import time

    import s3fs

    bucket, options = s3_url
    fs = s3fs.S3FileSystem(**options)
    fs.pipe(f"{bucket}/log/p0", b"l0\nl1\n")
    start = int(time.time() * 1000) // 500 * 500
    clock, done = ManualClock(start), Completed()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    files: list = []
    logged: list = []
    ssc.textFileStream(f"{bucket}/in", storage_options=options).foreachRDD(
        lambda rdd: files.extend(rdd.collect()))
    ssc.directStream(FileLogSource(f"{bucket}/log", options)).foreachRDD(
        lambda rdd: logged.extend(rdd.collect()))
    ssc.addStreamingListener(done)
    ssc.start()
    fs.pipe(f"{bucket}/in/_tmp", b"ignored\n")
    fs.pipe(f"{bucket}/in/a.txt", b"x\ny\r\nz")
    fs.pipe(f"{bucket}/log/p0", b"l0\nl1\nl2\n")  # an object store "appends" by rewriting
    for i in range(1, 5):
        clock.advance(500)
        done.wait_for(start + 500 * i)
    ssc.stop(stopSparkContext=False)
    assert files == ["x", "y", "z"]
    assert logged == ["l0", "l1", "l2"]


def test_per_partition_sinks_tell_which_lineages_keep_the_source_partitions(spark_context):
    """The check per-partition writes rely on: map, filter, mapPartitions... over the source (also
    across a cached step) keep partition i computed from source partition i alone; a shuffle, a
    coalesce or a union do not."""
    from sparkwal.engine.sinks.transactional import keeps_source_partitions

    source = spark_context.parallelize(range(20), 4).map(lambda x: x)
    kept = source.map(str).filter(bool).mapPartitions(iter)
    assert keeps_source_partitions(kept, source)
    assert keeps_source_partitions(kept.cache().map(len).flatMap(range), source)
    assert keeps_source_partitions(source, source)
    assert keeps_source_partitions(source.glom(), source)
    assert not keeps_source_partitions(source.repartition(4), source)
    assert not keeps_source_partitions(source.coalesce(2).map(str), source)
    assert not keeps_source_partitions(source.union(source).map(str), source)
    assert not keeps_source_partitions(spark_context.parallelize(range(20), 4).map(str), source)
    assert not keeps_source_partitions(kept, None)
