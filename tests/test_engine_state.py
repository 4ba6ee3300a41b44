"""Stateful streams: updateStateByKey and the incremental (inverse) windowed reduce keep a bounded
lineage over many batches (Spark's SPARK-6847 scenario), and across a restart their state comes
from the snapshots the checkpoint references, not from re-reading old input."""

from __future__ import annotations

import json
import operator
import os
import threading
from collections import Counter

import fsspec
import pytest
from test_engine_recovery import Completed, ms, put_file
from test_receivers import wait_until

from sparkwal.checkpoint import Checkpoint, read_checkpoint
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.engine import CheckpointMismatchError, StateSpec, StreamingContext, StreamingListener
from sparkwal.wal import ManualClock


def lineage_depth(rdd) -> int:
    return rdd.toDebugString().count(b"\n")


@pytest.mark.parametrize("checkpointing", [True, False], ids=["snapshots", "local-checkpoints"])
@pytest.mark.slow
def test_state_lineage_stays_bounded(spark_context, tmp_path, checkpointing):
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    if checkpointing:
        ssc.checkpoint(str(tmp_path / "ckpt"))
    stream = ssc.queueStream([], default=spark_context.parallelize([("k", 1)], 1))
    state = stream.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(1.0)
    after = state.map(lambda kv: kv)  # a stream after the state (SPARK-6847's shape)
    depths: dict[int, int] = {}
    values: dict[int, list] = {}

    def record(t, rdd):
        depths[ms(t)] = lineage_depth(rdd)
        values[ms(t)] = rdd.collect()

    after.foreachRDD(record)
    ssc.addStreamingListener(done)
    ssc.start()
    n = 32
    for i in range(1, n + 1):
        clock.advance(500)
        done.wait_for(500 * i)
    ssc.stop(stopSparkContext=False)

    assert values[500 * n] == [("k", n)]
    early = max(depths[500 * i] for i in range(5, 15))
    late = max(depths[500 * i] for i in range(n - 10, n + 1))
    assert late <= early, f"lineage grew from {early} to {late} lines"


def test_a_state_no_output_reaches_holds_nothing_back(spark_context, tmp_path):
    """A stateful stream with no output after it (left over in a program) is never computed, as in
    Spark: it has no state to snapshot, so it must not hold the checkpoints (and inputs) a restart
    would re-run it from at its zero time. They were kept forever."""
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    stream = ssc.queueStream([], default=spark_context.parallelize([("k", 1)], 1))
    stream.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(1.0)  # no output reaches it
    seen: dict[int, list] = {}
    stream.foreachRDD(lambda t, rdd: seen.__setitem__(ms(t), rdd.collect()))
    ssc.addStreamingListener(done)
    ssc.start()
    for i in range(1, 9):
        clock.advance(500)
        done.wait_for(500 * i)
    ssc.stop(stopSparkContext=False)
    assert seen == {t: [("k", 1)] for t in range(500, 4001, 500)}
    kept = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "ckpt").glob("checkpoint-*[0-9]"))
    assert kept and kept[0] >= 2000, kept  # as without that stream: the newest few


_stuck = threading.Event()  # module-level: a closure holding it could not be checkpointed


def _first_batch_waits(time_ms: int) -> None:
    if time_ms == 500:
        assert _stuck.wait(60)


class Submitted(StreamingListener):
    def __init__(self):
        self.times: list[int] = []
        self.started: dict[int, object] = {}  # batch time -> its BatchInfo when it started

    def onBatchSubmitted(self, batchSubmitted):
        self.times.append(batchSubmitted.batchInfo().batch_time_ms)

    def onBatchStarted(self, batchStarted):
        info = batchStarted.batchInfo()
        self.started[info.batch_time_ms] = info


@pytest.mark.parametrize("operation", ["updateStateByKey", "mapWithState"])
@pytest.mark.slow
def test_a_backlog_does_not_lengthen_the_state_lineage(spark_context, tmp_path, operation):
    """Batches are generated on time, each on the state before it; while the first batch is stuck,
    the batches due reach back past every cut to come. The generator holds those that would reach
    back more than maxLineageBatches plus a checkpoint interval (here 3 + 1) until the batches in
    flight have cut the lineage with a full snapshot; then they run with the state read back, and
    the totals are exact (the soak's driver died of a StackOverflowError with ~160 batches queued)."""
    def running_total(key, value, state):
        state.update((state.getOption() or 0) + value)
        return key, state.get()

    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.sparkwal.state.maxLineageBatches", "3")
    clock, done, submitted = ManualClock(0), Completed(), Submitted()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    pairs = ssc.queueStream([], default=spark_context.parallelize([("k", 1)], 1))
    if operation == "updateStateByKey":
        state = pairs.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(0.5)
    else:
        state = pairs.mapWithState(StateSpec.function(running_total).numPartitions(2)).checkpoint(0.5)
    _stuck.clear()
    depths: dict[int, int] = {}
    values: dict[int, list] = {}

    def record(t, rdd):
        _first_batch_waits(ms(t))
        depths[ms(t)] = lineage_depth(rdd)
        values[ms(t)] = rdd.collect()

    state.foreachRDD(record)
    ssc.addStreamingListener(done)
    ssc.addStreamingListener(submitted)
    n = 40
    try:
        ssc.start()
        for i in range(1, n + 1):
            clock.advance(500)
            wait_until(lambda: ssc.driver.generator.timer.last_fired_ms == 500 * i)
            assert ssc.driver.generator.drain(30)
        assert ssc.driver.events.wait_until_empty(30)  # every onBatchSubmitted heard
        submitted_while_stuck = list(submitted.times)
        _stuck.set()
        done.wait_for(500 * n)
    finally:
        _stuck.set()
        ssc.stop(stopSparkContext=False)
        live_conf.remove("spark.sparkwal.state.maxLineageBatches")
    assert submitted_while_stuck == [500 * i for i in range(1, 6)]  # up to 500 + 4 batches
    held = submitted.started[3000]  # due at 3000 on the clock, generated once the clock stood at 20000
    assert held.submission_time_ms == 3000 and held.scheduling_delay_ms == 17_000  # the hold counts
    assert values == {500 * i: [("k", i)] for i in range(1, n + 1)}
    steady = max(depths[500 * i] for i in range(1, 6))  # 5 batches; ~8 lines each, +-1 line
    assert max(depths.values()) <= steady + 4, f"lineage {depths}"  # was 8x as long


_writer_held = threading.Event()  # module-level, as _stuck


class HoldTheWriterThenCheck(StreamingListener):
    """Holds the checkpoint writer in its first ``onCheckpointWritten`` (as a slow store would)
    until ``_writer_held`` is set; after every checkpoint written, notes each state snapshot the
    newest checkpoint names that is gone."""

    def __init__(self, ckpt):
        self.ckpt, self.written, self.gone = str(ckpt), 0, []

    def onCheckpointWritten(self, event):
        self.written += 1
        if self.written == 1:
            assert _writer_held.wait(60)
        newest = read_checkpoint(self.ckpt)
        for stream in newest.data["state"].values():
            for ref in stream["snapshots"].values():
                if not os.path.exists(CheckpointLayout(self.ckpt).locate(ref["url"]) + ".manifest"):
                    self.gone.append((newest.checkpoint_time_ms, ref["url"]))


def test_a_snapshot_outlives_every_checkpoint_written_behind_that_names_it(spark_context, tmp_path):
    """A full snapshot a batch, three chains kept: older snapshots are retired while checkpoints
    that name them are still queued behind a slow writer. They are deleted only once two
    checkpoints taken after their retirement are durable, so the newest checkpoint never names a
    snapshot that is gone (the 100-fault drill's job could not restart: its newest checkpoint,
    written late, named a snapshot deleted two writes earlier)."""
    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.sparkwal.state.deltasPerFull", "0")
    _writer_held.clear()
    clock, done = ManualClock(0), Completed()
    ckpt = tmp_path / "ckpt"
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    ssc.checkpoint(str(ckpt))
    pairs = ssc.queueStream([], default=spark_context.parallelize([("k", 1)], 1))
    totals: dict[int, list] = {}
    state = pairs.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(0.5)
    state.foreachRDD(lambda t, rdd: totals.__setitem__(ms(t), rdd.collect()))
    check = HoldTheWriterThenCheck(ckpt)
    ssc.addStreamingListener(done)
    # on the writer's thread (a synchronous subscriber of the driver's bus), so that holding it
    # holds the writer; a listener addStreamingListener adds runs on the listener bus's thread
    ssc.driver.events.subscribe(check)
    n = 8
    try:
        ssc.start()
        for i in range(1, n + 1):
            clock.advance(500)
            done.wait_for(500 * i)
        _writer_held.set()
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    finally:
        _writer_held.set()
        ssc.stop(stopSparkContext=False)
        live_conf.remove("spark.sparkwal.state.deltasPerFull")
    assert totals[500 * n] == [("k", n)]
    assert check.written > 2 * n
    assert check.gone == []
    kept = sorted((p.name for p in (ckpt / "state").glob("*.manifest")), key=lambda n: int(n.split("-")[1]))
    # the three newest chains, and one retired by the last snapshot, which only one checkpoint
    # after it followed; the older ones deleted once safe
    assert kept == [f"1-{t}-e1.manifest" for t in range(500 * (n - 3), 500 * n + 1, 500)], kept


class SnapshotApp:
    """Running totals (updateStateByKey) and an incremental 2.5 s window over a file stream,
    both snapshotted every second."""

    def __init__(self, sc, tmp_path, ckpt=None, storage_options=None):
        self.sc, self.indir = sc, tmp_path / "in"
        self.ckpt = ckpt or tmp_path / "ckpt"
        self.options = storage_options
        self.indir.mkdir()
        self.totals: dict[int, list] = {}
        self.windows: dict[int, list] = {}

    def setup(self, clock, done):
        def create():
            ssc = StreamingContext(self.sc, 0.5, clock=clock)
            ssc.checkpoint(str(self.ckpt), storage_options=self.options)
            pairs = ssc.textFileStream(str(self.indir)).flatMap(str.split).map(lambda w: (w, 1))
            totals = pairs.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(1.0)
            running, windowed = self.totals, self.windows  # not self: it holds the SparkContext
            totals.foreachRDD(lambda t, rdd: running.__setitem__(ms(t), sorted(rdd.collect())))
            windows = pairs.reduceByKeyAndWindow(operator.add, operator.sub, 2.5, 0.5,
                                                 filterFunc=lambda kv: kv[1] > 0).checkpoint(1.0)
            windows.foreachRDD(lambda t, rdd: windowed.__setitem__(ms(t), sorted(rdd.collect())))
            ssc.addStreamingListener(done)
            return ssc
        return create


def words_at(t: int) -> str:
    return " ".join(["a"] * (1 + t // 500 % 3) + ["b"] * (t // 1000 % 2))


def expected_window(t: int) -> list:
    c = Counter()
    for u in range(max(500, t - 2000), t + 1, 500):
        c.update(words_at(u).split())
    return sorted(c.items())


def stopped_app_with_snapshots(spark_context, tmp_path, last_batch_ms: int = 2000) -> SnapshotApp:
    """A SnapshotApp run on a manual clock up to ``last_batch_ms``, one file per batch, stopped."""
    app = SnapshotApp(spark_context, tmp_path)
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock, done))
    ssc.start()
    for t in range(500, last_batch_ms + 1, 500):
        put_file(app.indir, f"{t}.txt", words_at(t), t - 100)
        clock.advance(500)
        done.wait_for(t)
    ssc.stop(stopSparkContext=False)
    return app


@pytest.mark.compat
@pytest.mark.slow
def test_state_and_windows_recover_from_snapshots_not_from_old_input(spark_context, tmp_path):
    app = stopped_app_with_snapshots(spark_context, tmp_path, last_batch_ms=4000)
    snapshots = sorted(p.name for p in (app.ckpt / "state").iterdir())
    assert snapshots and all("-" in n for n in snapshots)

    # The oldest input is gone: only snapshots can restore the state. (Input within a window of
    # the restart stays: the incremental window subtracts those batches as they leave it.)
    for t in range(500, 1501, 500):
        (app.indir / f"{t}.txt").unlink()
    clock2, done2 = ManualClock(4200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, done2), upgrade=True)
    ssc2.start()  # batch 4000 succeeded before the stop: regenerated for later state, not output
    assert ssc2.skipped_batch_times == [4000] and ssc2.rerun_batch_times == []
    for t in range(4500, 6001, 500):
        put_file(app.indir, f"{t}.txt", words_at(t), t - 100)
        clock2.advance(500)
        done2.wait_for(t)
    ssc2.stop(stopSparkContext=False)
    ssc2.awaitTerminationOrTimeout(0)

    expected_totals = Counter()
    for t in range(500, 6001, 500):
        expected_totals.update(words_at(t).split())
        assert app.totals[t] == sorted(expected_totals.items()), f"totals at {t}"
        assert app.windows[t] == expected_window(t), f"window at {t}"


def test_a_graceful_stop_snapshots_the_last_batchs_state_whatever_the_interval(spark_context, tmp_path):
    """What goes on after a graceful stop or a handover (a restart, a standby taking over) starts
    from the last batch's state: none of the batches since the last interval's snapshot re-runs."""
    from sparkwal.checkpoint.inspect import inspect_checkpoint

    app = SnapshotApp(spark_context, tmp_path)
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock, done))
    ssc.start()
    for t in (500, 1000, 1500):  # snapshots every 1 s: at 1000; 1500 is between two
        put_file(app.indir, f"{t}.txt", words_at(t), t - 100)
        clock.advance(500)
        done.wait_for(t)
    ssc.stop(stopSparkContext=False, stopGraceFully=True)
    states = inspect_checkpoint(str(app.ckpt)).state
    assert len(states) == 2 and [s.newest_ms for s in states] == [1500, 1500], states


def test_a_missing_snapshot_is_named(spark_context, tmp_path):
    app = stopped_app_with_snapshots(spark_context, tmp_path)
    victim = sorted((app.ckpt / "state").glob("*.manifest"))[-1]
    victim.unlink()
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(2200), Completed()),
                                       upgrade=True)
    with pytest.raises(CheckpointMismatchError,
                       match=f"state snapshot .* is missing or incomplete \\(no .*{victim.name}\\).*"
                             "referenced by the checkpoint of batch 2000"):
        ssc2.start()


@pytest.mark.parametrize("victim", ["1000", "2000"], ids=["full", "delta"])
def test_a_damaged_snapshot_part_is_named_and_fails_the_batch(spark_context, tmp_path, victim):
    """The state at 2000 is the chain full@1000 + delta@2000: damage to either is named."""
    app = stopped_app_with_snapshots(spark_context, tmp_path)
    kinds = {json.loads(m.read_text())["kind"] for m in (app.ckpt / "state").glob("*-2000-e*.manifest")}
    assert kinds == {"delta"}
    part = sorted((app.ckpt / "state").glob(f"*-{victim}-e*.part-*"), key=lambda p: p.stat().st_size)[-1]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    clock2 = ManualClock(2200)
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, Completed()), upgrade=True)
    ssc2.start()  # batch 2000 (completed before the stop) is regenerated: its state is that chain
    clock2.advance(300)  # batch 2500 reads it
    with pytest.raises(Exception, match=f"state snapshot part .*{part.name} is damaged"):
        ssc2.awaitTermination(60)
    ssc2.stop(stopSparkContext=False)


def test_a_memory_checkpoint_directory_is_refused_for_state(spark_context, memory_url):
    ssc = StreamingContext(spark_context, 0.5, clock=ManualClock(0))
    ssc.checkpoint(memory_url)
    ssc.queueStream([[("a", 1)]]).updateStateByKey(lambda vs, s: sum(vs)).foreachRDD(lambda rdd: None)
    with pytest.raises(ValueError, match=r"memory://.*StateDStream.*snapshots its state from Spark's tasks"):
        ssc.start()


@pytest.mark.s3
@pytest.mark.slow
def test_state_recovers_from_a_checkpoint_on_s3(spark_context, tmp_path, s3_url):
    base, options = s3_url
    app = SnapshotApp(spark_context, tmp_path, ckpt=f"{base}/ckpt", storage_options=options)
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(app.ckpt, app.setup(clock, done), storage_options=options)
    ssc.start()
    for t in range(500, 2001, 500):
        put_file(app.indir, f"{t}.txt", words_at(t), t - 100)
        clock.advance(500)
        done.wait_for(t)
    ssc.stop(stopSparkContext=False, stopGraceFully=True)  # batch 2000's completion checkpointed
    fs = fsspec.filesystem("s3", **options)
    assert any(p.endswith(".manifest") for p in fs.ls(f"{base}/ckpt/state"))

    for t in range(500, 1001, 500):  # only the snapshots can restore the state now
        (app.indir / f"{t}.txt").unlink()
    clock2, done2 = ManualClock(2200), Completed()
    ssc2 = StreamingContext.getOrCreate(app.ckpt, app.setup(clock2, done2), upgrade=True,
                                       storage_options=options)
    ssc2.start()  # batch 2000 completed before the stop: regenerated (its state read back), not output
    assert ssc2.skipped_batch_times == [2000]
    put_file(app.indir, "2500.txt", words_at(2500), 2400)
    clock2.advance(300)
    done2.wait_for(2500)
    ssc2.stop(stopSparkContext=False)
    ssc2.awaitTerminationOrTimeout(0)
    expected = Counter()
    for t in range(500, 2501, 500):
        expected.update(words_at(t).split())
    assert app.totals[2500] == sorted(expected.items())


@pytest.mark.slow
def test_a_driver_killed_while_its_snapshot_is_written_re_runs_no_completed_batch(spark_context, tmp_path):
    app = stopped_app_with_snapshots(spark_context, tmp_path, last_batch_ms=4000)
    main, first = app.ckpt / "checkpoint-4000", app.ckpt / "checkpoint-4000.bk"
    # The batch's completion was written before its snapshot's job, and again after it.
    written_first, written_then = Checkpoint.decode(first.read_bytes()), Checkpoint.decode(main.read_bytes())
    assert written_first.data["completed_ms"] == written_then.data["completed_ms"] == 4000
    assert written_first.data["state"] != written_then.data["state"]  # only the second names it
    # The driver dies during that job: no second write, no complete snapshot of batch 4000.
    main.unlink()
    first.rename(main)
    for f in (app.ckpt / "state").iterdir():
        if "-4000" in f.name:
            f.unlink()
    clock2, done2 = ManualClock(4200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, done2), upgrade=True)
    ssc2.start()  # batch 4000 is done: its state recomputed from the snapshot of 3000, not output again
    assert ssc2.skipped_batch_times == [4000] and ssc2.rerun_batch_times == []
    put_file(app.indir, "4500.txt", words_at(4500), 4400)
    clock2.advance(500)
    done2.wait_for(4500)
    ssc2.stop(stopSparkContext=False)
    expected = Counter()
    for t in range(500, 4501, 500):
        expected.update(words_at(t).split())
    assert app.totals[4500] == sorted(expected.items())
    assert app.windows[4500] == expected_window(4500)
