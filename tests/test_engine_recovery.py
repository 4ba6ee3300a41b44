"""Driver recovery: getOrCreate restores file-stream inputs and updateStateByKey state from the
checkpoint; a re-run batch reproduces its output; a changed graph is refused clearly.

These apps record their outputs into this process's objects and run on manual clocks, so they
recover with ``upgrade=True`` (the program's own graph and functions, the checkpoint's data);
recovery of the program itself from the checkpoint is tested in test_engine_program.py."""

from __future__ import annotations

import operator
import os
import threading
from contextlib import contextmanager

import pytest

from sparkwal.engine import CheckpointMismatchError, StreamingContext, StreamingListener
from sparkwal.engine.inputs import InputDStream
from sparkwal.tracker import ReceivedBlockInfo
from sparkwal.wal import ManualClock


@contextmanager
def coalescing_downtime(sc):
    """``spark.sparkwal.recovery.coalesceDowntime`` on the live SparkConf (read by the contexts made meanwhile)."""
    live_conf = sc._jsc.sc().conf()
    live_conf.set("spark.sparkwal.recovery.coalesceDowntime", "true")
    try:
        yield
    finally:
        live_conf.remove("spark.sparkwal.recovery.coalesceDowntime")


class Completed(StreamingListener):
    def __init__(self):
        self.times: list[int] = []
        self._cond = threading.Condition()

    def onBatchCompleted(self, batchCompleted):
        with self._cond:
            self.times.append(batchCompleted.batchInfo().batch_time_ms)
            self._cond.notify_all()

    def wait_for(self, t: int, timeout: float = 60) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: t in self.times, timeout), f"batch {t} not completed"


def ms(t) -> int:
    return int(round(t.timestamp() * 1000))


def put_file(directory, name: str, text: str, mtime_ms: int) -> None:
    """A file appearing atomically, with its modification time on the manual clock."""
    tmp = directory / f".{name}.tmp"
    tmp.write_text(text)
    os.utime(tmp, (mtime_ms / 1000, mtime_ms / 1000))
    os.replace(tmp, directory / name)


class WordCountApp:
    """Word counts per batch and running totals, each output recorded per batch time."""

    def __init__(self, sc, indir, ckpt, extra_map=False, batch=0.5):
        self.sc, self.indir, self.ckpt, self.extra_map, self.batch = sc, indir, ckpt, extra_map, batch
        self.counts: dict[int, list] = {}
        self.totals: dict[int, list] = {}
        self.reruns: list[tuple[int, list]] = []

    def setup(self, clock, listener):
        def create():
            ssc = StreamingContext(self.sc, self.batch, clock=clock)
            ssc.checkpoint(str(self.ckpt))
            lines = ssc.textFileStream(str(self.indir))
            if self.extra_map:
                lines = lines.map(str.lower)
            counts = lines.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(operator.add)

            seen, reruns, running = self.counts, self.reruns, self.totals  # not self: it holds sc

            def record_counts(t, rdd):
                result = sorted(rdd.collect())
                if ms(t) in seen:
                    reruns.append((ms(t), result))
                seen[ms(t)] = result

            counts.foreachRDD(record_counts)
            totals = counts.updateStateByKey(lambda vs, s: sum(vs) + (s or 0))
            totals.foreachRDD(lambda t, rdd: running.__setitem__(ms(t), sorted(rdd.collect())))
            ssc.addStreamingListener(listener)
            return ssc
        return create


def started_app(sc, tmp_path):
    """A WordCountApp on tmp_path/in and tmp_path/ckpt, started on a manual clock at 0."""
    indir, ckpt = tmp_path / "in", tmp_path / "ckpt"
    indir.mkdir()
    app = WordCountApp(sc, indir, ckpt)
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(ckpt), app.setup(clock, done))
    ssc.start()
    return app, ssc, clock, done


def test_file_stream_and_state_recover_after_a_stop(spark_context, tmp_path):
    app, ssc, clock, done = started_app(spark_context, tmp_path)
    indir, ckpt = app.indir, app.ckpt
    put_file(indir, "a.txt", "x y x", 400)
    clock.advance(500)
    done.wait_for(500)
    put_file(indir, "b.txt", "y", 900)
    clock.advance(500)
    done.wait_for(1000)
    ssc.stop(stopSparkContext=False)  # the driver goes away after batch 1000

    put_file(indir, "c.txt", "z x", 1300)  # arrives while the driver is down
    clock2, done2 = ManualClock(1200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(ckpt), app.setup(clock2, done2), upgrade=True)
    # Spark re-runs batch 1000 (the checkpoint's); its checkpoint says its outputs all succeeded,
    # so here it is only regenerated (for the state of later batches), not output again
    ssc2.start()
    assert ssc2.skipped_batch_times == [1000] and ssc2.rerun_batch_times == []
    clock2.advance(300)
    done2.wait_for(1500)
    ssc2.stop(stopSparkContext=False)

    assert app.counts == {500: [("x", 2), ("y", 1)], 1000: [("y", 1)], 1500: [("x", 1), ("z", 1)]}
    assert app.reruns == []
    assert app.totals[1500] == [("x", 3), ("y", 2), ("z", 1)]  # state carried across the restart


def test_a_changed_batch_duration_is_refused_naming_both_where_the_state_would_not_be_exact(spark_context, tmp_path):
    """Stopped without a snapshot of its last batch's state, the old version's state would be
    recomputed at the new duration. (Where it is exact, the change is an upgrade: tests/test_upgrade.py.)"""
    app, ssc, clock, done = started_app(spark_context, tmp_path)
    indir, ckpt = app.indir, app.ckpt
    clock.advance(500)
    done.wait_for(500)
    ssc.stop(stopSparkContext=False)

    slower = WordCountApp(spark_context, indir, ckpt, batch=1.0)
    upgraded = StreamingContext.getOrCreate(str(ckpt), slower.setup(ManualClock(600), Completed()), upgrade=True)
    with pytest.raises(CheckpointMismatchError, match="batch duration changes from 500 ms to 1000 ms.*snapshot"):
        upgraded.start()


def test_get_or_create_without_a_checkpoint_just_builds(spark_context, tmp_path):
    created = []

    def setup():
        ssc = StreamingContext(spark_context, 0.5, clock=ManualClock(0))
        ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
        created.append(ssc)
        return ssc

    ssc = StreamingContext.getOrCreate(str(tmp_path / "none"), setup)
    assert created == [ssc] and ssc.driver.restored is None
    assert StreamingContext.getActiveOrCreate(str(tmp_path / "none"), setup) is not None


@pytest.mark.parametrize("new_files_only", [True, False])
def test_files_present_at_a_fresh_start(spark_context, tmp_path, new_files_only):
    indir = tmp_path / "in"
    indir.mkdir()
    put_file(indir, "old.txt", "old", 100)  # already there when the context starts at 200
    clock, done = ManualClock(200), Completed()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    seen = []
    ssc.textFileStream(str(indir), newFilesOnly=new_files_only).foreachRDD(lambda rdd: seen.extend(rdd.collect()))
    ssc.addStreamingListener(done)
    ssc.start()
    clock.advance(300)
    done.wait_for(500)
    ssc.stop(stopSparkContext=False)
    assert seen == ([] if new_files_only else ["old"])


@pytest.mark.parametrize("remember", [None, "10min"])
def test_a_file_is_taken_only_within_the_remember_window_which_the_user_may_widen(spark_context, tmp_path,
                                                                                 remember):
    """Spark's spark.streaming.fileStream.minRememberDuration: 60 s by default, so a file 90 s older
    than the batch is skipped (a job down that long skips it, in Spark too) unless it is raised."""
    indir = tmp_path / "in"
    indir.mkdir()
    put_file(indir, "old.txt", "old", 100_000)
    live_conf = spark_context._jsc.sc().conf()
    if remember:
        live_conf.set("spark.streaming.fileStream.minRememberDuration", remember)
    try:
        clock, done = ManualClock(190_000), Completed()
        ssc = StreamingContext(spark_context, 0.5, clock=clock)
        seen = []
        ssc.textFileStream(str(indir), newFilesOnly=False).foreachRDD(lambda rdd: seen.extend(rdd.collect()))
    finally:
        live_conf.remove("spark.streaming.fileStream.minRememberDuration")
    ssc.addStreamingListener(done)
    ssc.start()
    clock.advance(500)
    done.wait_for(190_500)
    ssc.stop(stopSparkContext=False)
    assert seen == (["old"] if remember else [])


class BlockIdsInput(InputDStream):
    """A receiver-based input as receivers plug in: a batch is the ids of the blocks the
    context's ReceivedBlockTracker allocated to it."""

    receiver_based = True

    def compute(self, time_ms):
        blocks = self._ssc.receivedBlockTracker.get_blocks_of_batch_and_stream(time_ms, self.input_id)
        return self._sc.parallelize([b.block_id for b in blocks], 1)


def test_batches_take_their_blocks_from_the_tracker_and_keep_them_across_a_restart(spark_context, tmp_path):
    ckpt = tmp_path / "ckpt"
    seen, reruns = {}, []

    def setup(clock, done):
        def create():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.checkpoint(str(ckpt))

            def record(t, rdd):
                ids = sorted(rdd.collect())
                if ms(t) in seen:
                    reruns.append((ms(t), ids))
                seen[ms(t)] = ids
            BlockIdsInput(ssc).foreachRDD(record)
            ssc.addStreamingListener(done)
            return ssc
        return create

    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(ckpt), setup(clock, done))
    ssc.start()
    for block in ("b1", "b2"):
        assert ssc.receivedBlockTracker.add_block(ReceivedBlockInfo(0, 1, block))
    clock.advance(500)
    done.wait_for(500)
    ssc.receivedBlockTracker.add_block(ReceivedBlockInfo(0, 1, "b3"))
    clock.advance(500)
    done.wait_for(1000)
    ssc.receivedBlockTracker.add_block(ReceivedBlockInfo(0, 1, "b4"))  # logged, not yet allocated
    ssc.stop(stopSparkContext=False)
    assert (ckpt / "receivedBlockMetadata").is_dir()

    clock2, done2 = ManualClock(1200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(ckpt), setup(clock2, done2), upgrade=True)
    # batch 1000 succeeded before the stop: regenerated with its logged allocation (b3 stays
    # its block, not the first new batch's), not output again; b4 goes to the first new batch
    ssc2.start()
    assert ssc2.skipped_batch_times == [1000]
    clock2.advance(300)
    done2.wait_for(1500)
    ssc2.stop(stopSparkContext=False)
    assert seen == {500: ["b1", "b2"], 1000: ["b3"], 1500: ["b4"]}
    assert reruns == []


def test_without_a_checkpoint_batches_still_allocate_and_old_ones_are_forgotten(spark_context):
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    BlockIdsInput(ssc).foreachRDD(lambda rdd: None)
    ssc.addStreamingListener(done)
    ssc.start()
    for t in range(500, 3001, 500):
        clock.advance(500)
        done.wait_for(t)
    ssc.stop(stopSparkContext=False)
    times = ssc.receivedBlockTracker.allocated_batch_times()
    assert ssc.receivedBlockTracker.wal is None
    assert times[-1] == 3000 and 500 not in times  # allocated every batch, cleaned past remember


def test_binary_records_stream(spark_context, tmp_path):
    indir = tmp_path / "in"
    indir.mkdir()
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    with pytest.raises(ValueError, match="recordLength must be a positive integer"):
        ssc.binaryRecordsStream(str(indir), 0)
    seen: dict[int, list] = {}
    ssc.binaryRecordsStream(str(indir), 4).foreachRDD(
        lambda t, rdd: seen.__setitem__(ms(t), sorted(rdd.collect())))
    ssc.addStreamingListener(done)
    ssc.start()
    tmp = indir / ".r.tmp"
    tmp.write_bytes(b"abcd" + b"efgh" + b"\x00\x01\x02\x03")
    os.utime(tmp, (0.4, 0.4))
    os.replace(tmp, indir / "records.bin")
    clock.advance(500)
    done.wait_for(500)
    ssc.stop(stopSparkContext=False)
    assert seen[500] == [b"\x00\x01\x02\x03", b"abcd", b"efgh"]


class Recorder(StreamingListener):
    """The driver's events of the kinds a metrics sink or a UI would follow."""

    def __init__(self):
        self.events: list = []
        self.changed = threading.Condition()

    def _add(self, event) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    onCheckpointWritten = onDriverRestarted = onBatchCompleted = _add

    def wait_for(self, predicate, timeout: float = 60) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.events), timeout), self.events


@pytest.mark.slow
def test_the_driver_publishes_checkpoints_written_and_its_restart_on_its_event_bus(spark_context, tmp_path):
    from sparkwal.engine.listener import StreamingListenerCheckpointWritten, StreamingListenerDriverRestarted

    app, ssc, clock, done = started_app(spark_context, tmp_path)
    first = Recorder()
    ssc.addStreamingListener(first)
    put_file(app.indir, "a.txt", "x y", 400)
    clock.advance(500)
    first.wait_for(lambda es: any(isinstance(e, StreamingListenerCheckpointWritten)
                                  and e.checkpoint_time_ms == 500 for e in es))
    written = [e for e in first.events if isinstance(e, StreamingListenerCheckpointWritten)]
    assert all(e.epoch == ssc.leaderEpoch and e.took_ms >= 0 for e in written)
    assert not any(isinstance(e, StreamingListenerDriverRestarted) for e in first.events)  # a new one
    ssc.stop(stopSparkContext=False)

    again = Recorder()
    clock2 = ManualClock(1200)
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, again), clock=clock2)
    ssc2.addStreamingListener(again)  # listeners are not part of a checkpoint
    ssc2.start()
    try:
        again.wait_for(lambda es: any(isinstance(e, StreamingListenerDriverRestarted) for e in es))
        restarted = next(e for e in again.events if isinstance(e, StreamingListenerDriverRestarted))
        assert restarted.recovery == "checkpoint" and restarted.checkpoint_time_ms == 500
        assert sorted(restarted.rerun_batch_times + restarted.skipped_batch_times) == [500, 1000]
    finally:
        ssc2.stop(stopSparkContext=False)


def test_a_failing_subscriber_does_not_keep_an_event_from_the_others(caplog):
    from sparkwal.engine.driver.events import EventBus
    from sparkwal.engine.listener import StreamingListenerStreamingStarted

    class Broken(StreamingListener):
        def onStreamingStarted(self, event):
            raise RuntimeError("broken listener")

    heard, bus = [], EventBus()
    bus.subscribe(Broken())
    bus.subscribe(object())  # no callbacks at all: skipped
    bus.subscribe(type("Hears", (StreamingListener,), {"onStreamingStarted": lambda self, e: heard.append(e)})())
    with caplog.at_level("WARNING", logger="sparkwal.engine.driver.events"):
        bus.post(StreamingListenerStreamingStarted(7))
    assert heard == [StreamingListenerStreamingStarted(7)]
    assert "failed in onStreamingStarted" in caplog.text


def test_a_batch_seen_complete_is_checkpointed_by_a_stop_that_does_not_wait(spark_context, tmp_path):
    """Spark's non-graceful stop drops its generator's queue, so a batch its listeners saw
    complete can lose its completion checkpoint and run again; sparkwal queues the checkpoint
    before telling listeners and keeps it through the stop."""
    from sparkwal.checkpoint import read_checkpoint

    clock, stopped = ManualClock(0), threading.Event()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    ssc.queueStream([], default=spark_context.emptyRDD()).foreachRDD(lambda t, rdd: rdd.count())

    class StopAtOnce(StreamingListener):
        def onBatchCompleted(self, batchCompleted):  # as soon as it is heard of
            threading.Thread(target=lambda: (ssc.stop(stopSparkContext=False), stopped.set())).start()

    ssc.addStreamingListener(StopAtOnce())
    ssc.start()
    clock.advance(500)
    assert stopped.wait(60)
    latest = read_checkpoint(str(tmp_path / "ckpt"))
    assert (latest.checkpoint_time_ms, latest.pending_times_ms) == (500, [])


def test_coalesced_downtime_runs_the_missed_input_as_the_first_new_batch(spark_context, tmp_path, caplog):
    """spark.sparkwal.recovery.coalesceDowntime: after two minutes down at 0.5 s batches, a
    stateless program runs its checkpoint's batch again and then one batch with every file that
    arrived meanwhile (one older than the remember window included), instead of 238 batches. A
    window that no output reaches (never run) does not stop it."""
    indir, ckpt = tmp_path / "in", tmp_path / "ckpt"
    indir.mkdir()
    counts: dict[int, list] = {}

    def create(clock, done):
        def build():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.checkpoint(str(ckpt))
            words = ssc.textFileStream(str(indir)).flatMap(str.split).map(lambda w: (w, 1))
            words.reduceByKey(operator.add).foreachRDD(
                lambda t, rdd: counts.__setitem__(ms(t), sorted(rdd.collect())))
            words.window(1.5, 0.5)  # no output: never run
            ssc.addStreamingListener(done)
            return ssc
        return build

    with coalescing_downtime(spark_context):
        clock, done = ManualClock(0), Completed()
        ssc = StreamingContext.getOrCreate(str(ckpt), create(clock, done))
        ssc.start()
        put_file(indir, "a.txt", "x y", 400)
        clock.advance(500)
        done.wait_for(500)
        ssc.stop(stopSparkContext=False)

        put_file(indir, "b.txt", "x", 1300)  # two minutes before the restart: outside the remember window
        put_file(indir, "c.txt", "z", 119_000)
        clock2, done2 = ManualClock(120_200), Completed()
        ssc2 = StreamingContext.getOrCreate(str(ckpt), create(clock2, done2), upgrade=True)  # this clock
        ssc2.start()
        try:
            assert ssc2.skipped_batch_times == [500] and ssc2.rerun_batch_times == []
            assert ssc2.coalesced_batch_times == list(range(1000, 120_500, 500))
            clock2.advance(300)
            done2.wait_for(120_500)
        finally:
            ssc2.stop(stopSparkContext=False)
    assert counts == {500: [("x", 1), ("y", 1)], 120_500: [("x", 1), ("z", 1)]}
    assert done2.times == [120_500]  # (batch 500 is regenerated for nothing: its outputs succeeded)


def test_coalesced_downtime_still_runs_a_batch_given_its_blocks_before_its_checkpoint(spark_context, tmp_path):
    """A driver stopped (as if killed) after batch 1000 was given its receiver blocks in the tracker's
    WAL, before that batch's generation was checkpointed: coalescing the downtime, batch 1000 still
    runs with its blocks (coalesced, they would be in no batch), the times after it coalesce."""
    ckpt = tmp_path / "ckpt"
    seen: dict[int, list] = {}

    def setup(clock, done):
        def create():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.checkpoint(str(ckpt))
            BlockIdsInput(ssc).foreachRDD(lambda t, rdd: seen.__setitem__(ms(t), sorted(rdd.collect())))
            ssc.addStreamingListener(done)
            return ssc
        return create

    with coalescing_downtime(spark_context):
        clock, done = ManualClock(0), Completed()
        ssc = StreamingContext.getOrCreate(str(ckpt), setup(clock, done))
        ssc.start()
        assert ssc.receivedBlockTracker.add_block(ReceivedBlockInfo(0, 1, "b1"))
        clock.advance(500)
        done.wait_for(500)
        assert ssc.receivedBlockTracker.add_block(ReceivedBlockInfo(0, 1, "b2"))
        assert ssc.receivedBlockTracker.allocate_blocks_to_batch(1000)  # (then the kill)
        ssc.stop(stopSparkContext=False)

        clock2, done2 = ManualClock(10_200), Completed()
        ssc2 = StreamingContext.getOrCreate(str(ckpt), setup(clock2, done2), upgrade=True)
        ssc2.start()
        try:
            assert ssc2.coalesced_batch_times == list(range(1500, 10_500, 500))
            clock2.advance(300)
            done2.wait_for(10_500)
        finally:
            ssc2.stop(stopSparkContext=False)
    assert {t: ids for t, ids in seen.items() if ids} == {500: ["b1"], 1000: ["b2"]}


class StatefulApp:
    """Running totals by updateStateByKey and by mapWithState (with a timeout if given), each
    batch's recorded per batch time."""

    def __init__(self, sc, tmp_path, timeout: float | None = None):
        self.sc, self.indir, self.ckpt, self.timeout = sc, tmp_path / "in", tmp_path / "ckpt", timeout
        self.indir.mkdir()
        self.totals: dict[int, list] = {}
        self.mapped: dict[int, list] = {}

    def setup(self, clock, listener):
        def create():
            from sparkwal.engine import StateSpec

            ssc = StreamingContext(self.sc, 0.5, clock=clock)
            ssc.checkpoint(str(self.ckpt))
            pairs = ssc.textFileStream(str(self.indir)).flatMap(str.split).map(lambda w: (w, 1))
            totals, mapped = self.totals, self.mapped  # not self: it holds sc
            pairs.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).foreachRDD(
                lambda t, rdd: totals.__setitem__(ms(t), sorted(rdd.collect())))

            def running(key, value, state):
                if value is None:
                    return key, "timed out"
                state.update((state.get() if state.exists() else 0) + value)
                return key, state.get()

            spec = StateSpec.function(running).numPartitions(2)
            if self.timeout is not None:
                spec = spec.timeout(self.timeout)
            pairs.mapWithState(spec).foreachRDD(lambda t, rdd: mapped.__setitem__(ms(t), sorted(rdd.collect())))
            ssc.addStreamingListener(listener)
            return ssc
        return create

    def run_then_restart(self, restart_ms: int, while_down) -> tuple[StreamingContext, ManualClock, Completed]:
        """Batch 500 with "x y", a stop, ``while_down()``, and a restart at ``restart_ms``
        (coalescing downtime), started."""
        clock, done = ManualClock(0), Completed()
        ssc = StreamingContext.getOrCreate(str(self.ckpt), self.setup(clock, done))
        ssc.start()
        put_file(self.indir, "a.txt", "x y", 400)
        clock.advance(500)
        done.wait_for(500)
        ssc.stop(stopSparkContext=False)
        while_down()
        clock2, done2 = ManualClock(restart_ms), Completed()
        ssc2 = StreamingContext.getOrCreate(str(self.ckpt), self.setup(clock2, done2), upgrade=True)
        ssc2.start()
        return ssc2, clock2, done2


def test_coalesced_downtime_builds_state_on_the_last_batch_before_it(spark_context, tmp_path):
    """State without timeouts coalesces too: after 10 s down, updateStateByKey's and
    mapWithState's state of the one new batch is the last batch's plus all the input the missed
    batch times would have had."""
    app = StatefulApp(spark_context, tmp_path)
    with coalescing_downtime(spark_context):
        def arrive():
            put_file(app.indir, "b.txt", "x", 1300)
            put_file(app.indir, "c.txt", "z x", 9000)
        ssc2, clock2, done2 = app.run_then_restart(10_200, arrive)
        try:
            assert ssc2.coalesced_batch_times == list(range(1000, 10_500, 500))
            clock2.advance(300)
            done2.wait_for(10_500)
        finally:
            ssc2.stop(stopSparkContext=False)
    assert sorted(app.totals) == [500, 10_500] and sorted(app.mapped) == [500, 10_500]
    assert app.totals[10_500] == [("x", 3), ("y", 1), ("z", 1)]
    assert app.mapped[10_500] == [("x", 2), ("x", 3), ("z", 1)]  # a call per record, as Spark's
    assert done2.times == [10_500]

    # the downtime is checkpointed: a later restart (not coalescing) regenerates batch 10 500's
    # state on batch 500's again, and never runs the coalesced batch times (a file arriving late
    # with one of their times goes to the next batch, not to one of them)
    from sparkwal.checkpoint import read_checkpoint

    assert read_checkpoint(str(app.ckpt)).data["downtimes"] == [[10_500, 500]]
    indir = str(app.indir)  # and what an upgrade knows the input and the two states by
    assert sorted(e["identity"] for e in read_checkpoint(str(app.ckpt)).data["identities"].values()) == [
        f"files:{indir}", f"mapWithState(files:{indir})", f"updateStateByKey(files:{indir})"]
    clock3, done3 = ManualClock(10_700), Completed()
    ssc3 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock3, done3), upgrade=True)
    ssc3.start()
    try:
        assert ssc3.skipped_batch_times == [10_500] and ssc3.rerun_batch_times == []
        put_file(app.indir, "d.txt", "y", 10_800)
        put_file(app.indir, "late.txt", "w", 5000)
        clock3.advance(300)
        done3.wait_for(11_000)
    finally:
        ssc3.stop(stopSparkContext=False)
    assert app.totals[11_000] == [("w", 1), ("x", 3), ("y", 2), ("z", 1)]
    assert app.mapped[11_000] == [("w", 1), ("y", 2)]


def test_coalesced_downtime_is_refused_for_state_with_a_timeout(spark_context, tmp_path, caplog):
    """A mapWithState timeout is checked batch by batch: the missed batches re-run, as Spark's,
    and one line says why."""
    app = StatefulApp(spark_context, tmp_path, timeout=60)
    with coalescing_downtime(spark_context):
        with caplog.at_level("WARNING", logger="sparkwal.engine.driver.recovery"):
            ssc2, clock2, done2 = app.run_then_restart(2200, lambda: None)
        try:
            assert ssc2.coalesced_batch_times == [] and ssc2.rerun_batch_times == [1000, 1500, 2000]
            refusals = [r.getMessage() for r in caplog.records if "coalesceDowntime" in r.getMessage()]
            assert len(refusals) == 1 and "has a state timeout" in refusals[0], refusals
            done2.wait_for(2000)
        finally:
            ssc2.stop(stopSparkContext=False)
