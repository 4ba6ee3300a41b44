"""Direct streams on a FileLogSource: ranges planned, logged (offsets/), committed (commits/) in
order; restarts re-run exactly the uncommitted batches with their logged ranges; a changed source
is an error or a documented behaviour; rate limits."""

from __future__ import annotations

import threading

import pytest

from sparkwal.checkpoint import CommitLog, OffsetSeqLog
from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.sources import DataLossError, FileLogSource, OffsetRange, TopicPartition
from sparkwal.wal import ManualClock

from test_engine_recovery import Completed, ms


class Committed(StreamingListener):
    def __init__(self):
        self.ids: list[tuple[int, int]] = []
        self._cond = threading.Condition()

    def onBatchCommitted(self, event):
        with self._cond:
            self.ids.append((event.batchId(), event.batchTime()))
            self._cond.notify_all()

    def wait_for(self, batch_id: int, timeout: float = 60) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: any(i == batch_id for i, _ in self.ids), timeout)


def append(path, *lines: str, newline: bool = True) -> None:
    with open(path, "a") as f:
        f.write("\n".join(lines) + ("\n" if newline else ""))


def run_more(clock, done, until_ms, step=500):
    """Advance the clock batch by batch until ``until_ms``, each batch completed."""
    t = clock.now_ms()
    while t < until_ms:
        t += step
        clock.advance(step)
        done.wait_for(t)


class DirectApp:
    """Lines of a FileLogSource, each batch's lines and ranges recorded by batch time."""

    def __init__(self, sc, tmp_path, batch_s: float = 0.5, **stream_kw):
        self.sc, self.tmp = sc, tmp_path
        self.logdir = tmp_path / "log"
        self.logdir.mkdir(exist_ok=True)
        self.ckpt = tmp_path / "ckpt"
        self.batch_s, self.stream_kw = batch_s, stream_kw
        self.lines: dict[int, list[str]] = {}
        self.ranges: dict[int, list[OffsetRange]] = {}

    def setup(self, clock, *listeners, checkpoint: bool = True, conf_fail=None):
        def make():
            ssc = StreamingContext(self.sc, self.batch_s, clock=clock)
            if checkpoint:
                ssc.checkpoint(str(self.ckpt))
            stream = ssc.directStream(FileLogSource(str(self.logdir)), **self.stream_kw)
            lines, ranges = self.lines, self.ranges  # not self: it holds the SparkContext

            def record(t, rdd):
                ranges[ms(t)] = rdd.offsetRanges()
                got = rdd.collect()
                if conf_fail is not None:
                    conf_fail(ms(t))
                lines[ms(t)] = got

            stream.foreachRDD(record)
            for listener in listeners:
                ssc.addStreamingListener(listener)
            return ssc
        return make

    def all_lines(self) -> list[str]:
        return [x for t in sorted(self.lines) for x in self.lines[t]]


def run(ssc, clock, done, until_ms: int, step: int = 500) -> None:
    ssc.start()
    run_more(clock, done, until_ms, step)


def test_ranges_are_planned_logged_and_committed_in_order(spark_context, tmp_path):
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", "a0", "a1")
    append(app.logdir / "b", "b0")
    append(app.logdir / "c", "partial", newline=False)  # not a record until its newline
    clock, done, committed = ManualClock(0), Completed(), Committed()
    ssc = app.setup(clock, done, committed)()
    # appends that land between batches, made here once the batch before has completed (a
    # listener of its own would race the one run_more waits on)
    run(ssc, clock, done, 500)
    append(app.logdir / "a", "a2")
    run_more(clock, done, 1000)
    append(app.logdir / "c", "")  # completes "partial"
    run_more(clock, done, 2000)
    ssc.stop(stopSparkContext=False)

    assert app.lines[500] and sorted(app.lines[500]) == ["a0", "a1", "b0"]
    assert app.ranges[500] == [OffsetRange("log", "a", 0, 2), OffsetRange("log", "b", 0, 1)]
    assert app.lines[1000] == ["a2"] and app.ranges[1000] == [OffsetRange("log", "a", 2, 3)]
    assert app.lines[1500] == ["partial"]
    assert app.lines[2000] == []
    offsets = OffsetSeqLog(str(app.ckpt / "offsets"))
    commits = CommitLog(str(app.ckpt / "commits"))
    assert offsets.batch_ids() == [0, 1, 2, 3] == commits.batch_ids()
    assert [i for i, _ in committed.ids] == [0, 1, 2, 3]
    first = offsets.get(0)
    assert first.metadata.batch_timestamp_ms == 500
    assert first.offsets == ['{"log":{"a":2,"b":1,"c":0}}']  # every known partition's end
    assert offsets.get(2).offsets == ['{"log":{"a":3,"b":1,"c":1}}']
    # Spark's text format, byte for byte; the conf map records the leader's epoch and the input
    # id of each line (an upgrade may add or drop direct inputs)
    assert (app.ckpt / "offsets" / "0").read_text() == (
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":500,"conf":{"sparkwal.leaderEpoch":"1",'
        '"sparkwal.inputIds":"0"}}\n'
        '{"log":{"a":2,"b":1,"c":0}}')
    # a commit too, in a field Spark's reader (json4s) ignores
    assert (app.ckpt / "commits" / "3").read_text() == 'v1\n{"nextBatchWatermarkMs":0,"sparkwal.leaderEpoch":1}'
    assert (app.ckpt / "sources" / "0" / "0").read_text() == 'v1\n{"log":{"a":0,"b":0,"c":0}}'
    assert ssc.batchLog.statistics().latest_committed == 3


def test_restart_reruns_every_uncommitted_batch_with_its_logged_ranges(spark_context, tmp_path):
    """Batches 1 and 2 fail their output (several pending batches when the driver dies): the
    restart re-runs both, in order, with the same ranges and times, though the log grew."""
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", "x0", "x1")
    logfile = app.logdir / "a"

    def fail_after_first(t):
        if t >= 1000:
            append(logfile, f"late{t}")
            raise RuntimeError("output failed")

    clock, done = ManualClock(0), Completed()
    ssc = app.setup(clock, done, conf_fail=fail_after_first)()
    ssc.start()
    clock.advance(500)
    done.wait_for(500)
    append(app.logdir / "a", "y0")
    clock.advance(500)
    done.wait_for(1000)
    with pytest.raises(RuntimeError):
        ssc.awaitTermination(30)
    ssc.stop(stopSparkContext=False)
    offsets = OffsetSeqLog(str(app.ckpt / "offsets"))
    commits = CommitLog(str(app.ckpt / "commits"))
    assert commits.batch_ids() == [0]
    logged = offsets.batch_ids()
    assert logged[:2] == [0, 1]
    first_ranges = dict(app.ranges)

    app.lines.clear()
    clock2, done2 = ManualClock(clock.now_ms() + 1200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, done2), upgrade=True)
    ssc2.start()
    rerun = ssc2.rerun_batch_times
    assert rerun[0] == 1000 and 500 not in rerun and 500 not in ssc2.skipped_batch_times
    for t in rerun:
        done2.wait_for(t)
    ssc2.stop(stopSparkContext=False)
    assert app.ranges[1000] == first_ranges[1000] == [OffsetRange("log", "a", 2, 3)]
    assert app.lines[1000] == ["y0"]
    assert 500 not in app.lines  # committed: never output again
    everything = [x for t in sorted(app.lines) for x in app.lines[t]]
    assert everything.count("y0") == 1 and "late1000" in everything  # read by a new batch
    assert CommitLog(str(app.ckpt / "commits")).batch_ids() == list(range(len(OffsetSeqLog(
        str(app.ckpt / "offsets")).batch_ids())))


def test_from_offsets_without_checkpoint_and_ignored_with_one(spark_context, tmp_path):
    app = DirectApp(spark_context, tmp_path, fromOffsets={("log", "a"): 1})
    append(app.logdir / "a", "a0", "a1", "a2")
    clock, done = ManualClock(0), Completed()
    ssc = app.setup(clock, done, checkpoint=False)()
    run(ssc, clock, done, 500)
    ssc.stop(stopSparkContext=False)
    assert app.lines[500] == ["a1", "a2"]


def test_a_changed_source_is_an_error_or_documented(spark_context, tmp_path):
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", "a0", "a1")
    append(app.logdir / "done", "d0")
    clock, done = ManualClock(0), Completed()
    ssc = app.setup(clock, done)()
    run(ssc, clock, done, 500)
    (app.logdir / "done").unlink()  # read to its end, then deleted: forgotten
    append(app.logdir / "new", "n0")  # a partition added: read from its start
    run_more(clock, done, 1000)
    assert app.lines[1000] == ["n0"]
    (app.logdir / "a").write_text("a0\n")  # truncated below what was read
    clock.advance(500)
    with pytest.raises(DataLossError, match=r"partition log/a .* below 2"):
        ssc.awaitTermination(30)
    ssc.stop(stopSparkContext=False)


def test_a_partition_removed_with_unread_records_is_data_loss(spark_context, tmp_path, live_settings):
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", "a0", "a1")
    clock, done = ManualClock(0), Completed()
    live_settings({"spark.streaming.direct.maxRatePerPartition": "2"})  # 1 record per batch
    ssc = app.setup(clock, done)()
    run(ssc, clock, done, 500)
    assert app.lines[500] == ["a0"]  # the batch saw a1 but was limited to a0
    (app.logdir / "a").unlink()
    clock.advance(500)
    with pytest.raises(DataLossError, match=r"log/a disappeared with records \[1, 2\) never read"):
        ssc.awaitTermination(30)
    ssc.stop(stopSparkContext=False)


def test_rate_limit_per_partition(spark_context, tmp_path, live_settings):
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", *[f"a{i}" for i in range(5)])
    append(app.logdir / "b", "b0")
    clock, done = ManualClock(0), Completed()
    live_settings({"spark.streaming.kafka.maxRatePerPartition": "4"})  # 2 per 0.5 s batch
    ssc = app.setup(clock, done)()
    run(ssc, clock, done, 2000)
    ssc.stop(stopSparkContext=False)
    assert [len(app.lines[t]) for t in (500, 1000, 1500, 2000)] == [3, 2, 1, 0]
    assert sorted(app.all_lines()) == sorted([f"a{i}" for i in range(5)] + ["b0"])


def test_rate_limits_follow_sparks_rule():
    from sparkwal.engine.sources.direct import rate_limits

    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    assert rate_limits({a: 10, b: 30}, 1000, 0, 0, 1) is None  # no estimate, no cap: no limit
    assert rate_limits({a: 10, b: 30}, 1000, 0, 5, 1) == {a: 5, b: 5}
    assert rate_limits({a: 10, b: 30}, 2000, 100, 0, 1) == {a: 50, b: 150}  # split by lag
    assert rate_limits({a: 10, b: 30}, 1000, 100, 40, 1) == {a: 25, b: 40}  # capped
    assert rate_limits({a: 0, b: 30}, 100, 100, 0, 1) == {a: 1, b: 10}  # minRatePerPartition


def test_backpressure_initial_rate_is_split_by_lag(spark_context, tmp_path, live_settings):
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", *[f"a{i}" for i in range(6)])
    append(app.logdir / "b", "b0", "b1")
    clock, done = ManualClock(0), Completed()
    live_settings({"spark.streaming.backpressure.enabled": "true",
                   "spark.streaming.backpressure.initialRate": "8"})  # 4 records per 0.5 s batch
    ssc = app.setup(clock, done)()
    run(ssc, clock, done, 500)
    ssc.stop(stopSparkContext=False)
    # a has 3/4 of the lag: 8 * 6/8 = 6/s -> 3 per batch; b 2/s -> 1
    assert app.ranges[500] == [OffsetRange("log", "a", 0, 3), OffsetRange("log", "b", 0, 1)]


def test_a_fresh_context_reruns_the_logged_uncommitted_batches(spark_context, tmp_path):
    """A driver killed before its first DStream checkpoint leaves an offset log and no checkpoint:
    the program's new context re-runs the logged uncommitted batch with its logged ranges and
    time, and batch ids continue."""
    app = DirectApp(spark_context, tmp_path)
    append(app.logdir / "a", "a0", "a1")
    clock, done = ManualClock(0), Completed()
    ssc = app.setup(clock, done)()
    run(ssc, clock, done, 500)
    append(app.logdir / "a", "a2")
    run_more(clock, done, 1000)
    ssc.stop(stopSparkContext=False)
    for f in app.ckpt.iterdir():
        if f.name.startswith("checkpoint-"):
            f.unlink()
    (app.ckpt / "commits" / "1").unlink()  # batch 1 (time 1000) logged, not committed
    app.lines.clear()
    append(app.logdir / "a", "a3")
    clock2, done2 = ManualClock(2200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, done2))
    assert ssc2.recovery == "new"
    ssc2.start()
    assert ssc2.rerun_batch_times == [1000]
    done2.wait_for(1000)
    clock2.advance(300)
    done2.wait_for(2500)
    ssc2.stop(stopSparkContext=False)
    assert app.lines[1000] == ["a2"] and app.ranges[1000] == [OffsetRange("log", "a", 2, 3)]
    assert app.lines[2500] == ["a3"]
    assert OffsetSeqLog(str(app.ckpt / "offsets")).get(2).metadata.batch_timestamp_ms == 2500
