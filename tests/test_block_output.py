"""``DStream.foreachBlock``: each receiver block's rows of a precomputable stream, output as soon as
the block is recorded; a batch outputs what was not, so every block is output, at least once, with
the same rows for the same block id."""

from __future__ import annotations

import logging
import operator
import sys
import threading
from collections import Counter

import pytest
from pyspark import cloudpickle

from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.driver_rows import DriverRowsRDD
from sparkwal.engine.receiver.block_output import BlockOutput
from sparkwal.engine.receiver.precompute import BlockPlan, encode_result, with_hashes
from sparkwal.tracker import ReceivedBlockInfo
from sparkwal.wal import FencedError

from test_receiver_precompute import with_conf
from test_receivers import LineServer, wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LINES = [f"a b{i % 7} c{i % 13}" for i in range(3000)]
EXPECTED = Counter(w for line in LINES for w in line.split())


class Paths(StreamingListener):
    def __init__(self):
        self.paths: list[dict] = []

    def onBatchCompleted(self, e):
        self.paths.append(e.batchInfo().paths)


def run_blocks(sc, tmp_path, func_of, lines=LINES, build=None, **conf):
    """Run a word count's ``foreachBlock(func_of(calls))`` over ``lines``; returns the calls
    ``(block_id, rows, is driver rows)``, the output's statistics and each batch's paths."""
    undo = with_conf(sc, **{"spark.streaming.blockInterval": "50ms", "spark.streaming.receiver.maxRate": "6000",
                            **conf})  # (about 10 blocks)
    server = LineServer(lines)
    ssc = StreamingContext(sc, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    calls: list = []
    counts = (build or (lambda s: s.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(operator.add)))(
        ssc.socketTextStream("127.0.0.1", server.port))
    counts.foreachBlock(func_of(calls))
    paths = Paths()
    ssc.addStreamingListener(paths)
    ssc.start()
    try:
        expected = sum(len(line.split()) for line in lines)
        wait_until(lambda: sum(n for _, rows, _ in list(calls) for _, n in rows) >= expected, what="every word")
        stats = ssc.receiverTracker.block_output(0).statistics()
        pre = ssc.receiverTracker.precomputed
        assert pre is None or pre.held_bytes == 0  # (nothing else reads the batches: their results are not kept)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        server.close()
        undo()
    return calls, stats, paths.paths


def recording(calls):
    def output(time, block_id, rdd):
        calls.append((block_id, rdd.collect(), isinstance(rdd, DriverRowsRDD)))
    return output


def totals(calls) -> Counter:
    out: Counter = Counter()
    for _, rows, _ in calls:
        for key, n in rows:
            out[key] += n
    return out


@pytest.mark.parametrize("precompute,wal", [("true", "true"), ("false", "true"), ("false", "false")])
def test_every_block_is_output_once_as_soon_as_it_is_recorded(spark_context, tmp_path, precompute, wal):
    calls, stats, paths = run_blocks(spark_context, tmp_path, recording,
                                     **{"spark.sparkwal.receiver.precompute": precompute,
                                        "spark.streaming.receiver.writeAheadLog.enable": wal})
    assert totals(calls) == EXPECTED
    ids = [block_id for block_id, _, _ in calls]
    assert len(ids) == len(set(ids)) > 1  # one call per block, several blocks
    assert all(driver_rows for _, _, driver_rows in calls)  # no Spark job for a block's rows
    assert stats.early == len(ids) and stats.at_batch == 0 and stats.early_failures == 0
    assert stats.read_back == (0 if precompute == "true" else len(ids))  # without results: read on the driver
    # (from the receiver WAL, or with it off from the receiver's executor)
    assert any(p.get(next(iter(p), None)) == "per-block" for p in paths if p)
    assert stats.queued == 0 and stats.held_bytes == 0


def test_a_block_whose_early_call_raised_is_output_by_its_batch(spark_context, tmp_path, caplog):
    failed: list = []  # (the checkpoint pickles the function: no lock in it)

    def failing_once(calls):
        def output(rdd):
            if not failed:
                failed.append(1)
                raise RuntimeError("the sink is down")
            calls.append(("", rdd.collect(), True))
        return output

    with caplog.at_level(logging.WARNING, logger="sparkwal.engine.receiver.block_output"):
        calls, stats, _ = run_blocks(spark_context, tmp_path, failing_once)
    assert totals(calls) == EXPECTED  # nothing lost, nothing twice
    assert stats.early_failures == 1 and stats.at_batch == 1
    assert "block input-" in caplog.text and "RuntimeError: the sink is down" in caplog.text


@pytest.mark.parametrize("source", ["socket", "queue"])
def test_a_stream_the_receivers_cannot_precompute_is_refused_at_start(spark_context, tmp_path, source):
    server = LineServer([])
    ssc = StreamingContext(spark_context, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    if source == "socket":
        words = ssc.socketTextStream("127.0.0.1", server.port).flatMap(str.split).map(lambda w: (w, 1))
        words.groupByKey().foreachBlock(lambda rdd: None)
        why = r"groupByKey at .*is not one \(stream 0: .*groupByKey"
    else:
        ssc.queueStream([[("a", 1)]]).reduceByKey(operator.add).foreachBlock(lambda rdd: None)
        why = r"reduceByKey at .*is not one \(the program has no receiver stream\)"
    try:
        with pytest.raises(ValueError, match=r"foreachBlock at .*test_block_output.py:\d+ needs a stream the "
                                             r"receivers can precompute .*" + why):
            ssc.start()
    finally:
        ssc.stop(stopSparkContext=False)
        server.close()


def test_foreach_block_takes_one_two_or_three_arguments(spark_context):
    ssc = StreamingContext(spark_context, 0.5)
    stream = ssc.queueStream([[("a", 1)]])
    with pytest.raises(TypeError, match="func\\(time, block_id, rdd\\), got a function of 4 arguments"):
        stream.foreachBlock(lambda a, b, c, d: None)


# -- the protocol, step by step, with a stand-in block tracker -----------------------------------------

PLAN = BlockPlan(0, (lambda records: ((w, 1) for line in records for w in line.split()),),
                 lambda v: v, operator.add)


def block(n: int) -> ReceivedBlockInfo:
    return ReceivedBlockInfo(0, 1, f"input-0-{1000 + n}-x{n}")


class Stand:
    """A BlockOutput over in-memory blocks, whose function waits for ``gate`` when told to."""

    def __init__(self, sc, confirm_leadership=lambda: None):
        self.records = {block(n).block_id: [f"w{n} w{n}"] for n in range(4)}
        self.calls: list = []
        self.entered, self.gate = threading.Event(), threading.Event()
        self.gate.set()
        self.raising: BaseException | None = None
        self.refusing = False
        self.out = BlockOutput(sc, "test", 0, PLAN, self.call, num_partitions=2,
                               read_records=lambda info: self.records.get(info.block_id),
                               batch_blocks=lambda t: [block(n) for n in range(4)],
                               confirm_leadership=confirm_leadership)

    def call(self, time, block_id, rdd):
        self.entered.set()
        assert self.gate.wait(30)
        if self.raising is not None:
            raising, self.raising = self.raising, None
            raise raising
        if self.refusing:
            raise RuntimeError(f"refused {int(block_id.rsplit('x', 1)[1]) % 101}")
        self.calls.append((block_id, rdd.collect()))

    def result(self, n):
        return encode_result(with_hashes({f"w{n}": 2}), 1 << 20)

    def arrive(self, n: int) -> None:
        """Block ``n`` offered with its result, then its ``AddBlock`` logged (recorded)."""
        self.out.offer(block(n), self.result(n))
        self.out.recorded(block(n).block_id)


def test_a_batch_waits_for_an_early_call_in_progress_and_outputs_the_rest(spark_context):
    stand = Stand(spark_context)
    out = stand.out
    out.start()
    try:
        stand.gate.clear()
        stand.arrive(0)
        assert stand.entered.wait(30)  # block 0's early call is running
        batch = threading.Thread(target=out.batch_job(1000))
        batch.start()
        batch.join(0.2)
        assert batch.is_alive()  # waits for it
        stand.gate.set()
        batch.join(30)
    finally:
        out.stop()
    assert [b for b, _ in stand.calls] == [block(n).block_id for n in range(4)]  # each once
    assert stand.calls[1] == (block(1).block_id, [("w1", 2)])  # read back and run through the plan
    stats = out.statistics()
    assert (stats.early, stats.at_batch, stats.read_back) == (1, 3, 3)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (the SystemExit, as raised)
def test_an_early_call_that_ends_its_thread_does_not_hang_its_batch(spark_context):
    stand = Stand(spark_context)
    out = stand.out
    stand.raising = SystemExit(3)  # (not an Exception: it ends the early thread)
    stand.gate.clear()
    stand.arrive(0)
    out.start()
    try:
        assert stand.entered.wait(30)  # block 0's early call is running
        done = threading.Thread(target=out.batch_job(1000))
        done.start()
        stand.gate.set()  # (it raises SystemExit now, on the early thread)
        done.join(30)
        assert not done.is_alive()
    finally:
        out.stop()
    assert sorted(b for b, _ in stand.calls) == [block(n).block_id for n in range(4)]
    assert out.statistics().early_failures == 1


def test_a_driver_that_no_longer_leads_outputs_nothing_early(spark_context, caplog):
    def fenced():
        raise FencedError("epoch 3 was fenced by epoch 4")

    stand = Stand(spark_context, confirm_leadership=fenced)
    out = stand.out
    out.start()
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine.receiver.block_output"):
        for n in range(2):
            stand.arrive(n)
        wait_until(lambda: out.statistics().early_failures == 1, what="the fenced early call")
        out.stop()
        out.offer(block(2), stand.result(2))  # (no early call will come: left to its batch)
    assert stand.calls == [] and "no more early output on this driver (epoch 3 was fenced" in caplog.text
    stats = out.statistics()
    assert (stats.queued, stats.not_queued) == (1, 1)  # (left to batches, which a fenced driver never runs)


def test_a_leadership_not_confirmable_for_a_moment_leaves_one_block_to_its_batch(spark_context, caplog):
    answers = [OSError("the lease's store timed out")]

    def confirm():
        if answers:
            raise answers.pop()

    stand = Stand(spark_context, confirm_leadership=confirm)
    out = stand.out
    out.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sparkwal.engine.receiver.block_output"):
            for n in range(2):
                stand.arrive(n)
            wait_until(lambda: out.statistics().early == 1, what="the next block's early call")
        out.batch_job(1000)()
    finally:
        out.stop()
    assert sorted(b for b, _ in stand.calls) == [block(n).block_id for n in range(4)]  # each once
    stats = out.statistics()
    assert (stats.early, stats.early_failures, stats.at_batch) == (1, 1, 3)
    assert "OSError: the lease's store timed out" in caplog.text


def test_a_lost_block_is_not_output_with_no_rows(spark_context):
    stand = Stand(spark_context)
    del stand.records[block(2).block_id]  # (WAL off, no live executor holds it: read_records gives None)
    stand.out.batch_job(1000)()
    assert sorted(b for b, _ in stand.calls) == [block(n).block_id for n in (0, 1, 3)]
    stats = stand.out.statistics()
    assert (stats.at_batch, stats.read_back, stats.lost) == (4, 3, 1)


def test_a_refused_block_is_never_output_and_the_queue_is_bounded(spark_context):
    stand = Stand(spark_context)
    out = BlockOutput(spark_context, "test", 0, PLAN, stand.call, num_partitions=2,
                      read_records=lambda info: stand.records[info.block_id],
                      batch_blocks=lambda t: [], max_held_bytes=len(stand.result(0)))
    out.offer(block(0), stand.result(0))
    out.refused(block(0).block_id)
    out.recorded(block(0).block_id)
    out.offer(block(1), stand.result(1))
    out.offer(block(2), stand.result(2))  # past max_held_bytes: left to its batch
    stats = out.statistics()
    assert (stats.queued, stats.not_queued, stats.held_bytes) == (0, 1, len(stand.result(1)))
    assert stand.calls == []


def test_early_errors_are_logged_once_each_up_to_a_hundred_then_only_counted(spark_context, caplog):
    stand = Stand(spark_context)
    stand.records = {block(n).block_id: [f"w{n}"] for n in range(102)}
    stand.refusing = True  # each call raises "refused <n % 101>": 101 different errors, then block 0's again
    out = stand.out
    out.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sparkwal.engine.receiver.block_output"):
            for n in range(102):
                stand.arrive(n)
            wait_until(lambda: out.statistics().early_failures == 102, what="every early call")
    finally:
        out.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 100 and all(f"refused {n})" in w for n, w in enumerate(warnings)), warnings[-2:]
    assert "That is 100 different errors: later ones are only counted" in warnings[-1]
    assert not any("later ones" in w for w in warnings[:-1])


def test_outputs_stop_together_so_a_call_in_progress_does_not_hold_back_another_output(spark_context):
    from sparkwal.engine.receiver.block_outputs import stop_all

    first, second = Stand(spark_context), Stand(spark_context)
    stopping = threading.Thread(target=stop_all, args=([first.out, second.out], 30.0))
    offered = iter(range(1, 10_000))
    try:
        for stand in (first, second):
            stand.out.start()
        first.gate.clear()
        first.arrive(0)
        assert first.entered.wait(30)  # the first output's early call is in progress
        stopping.start()
        # the second output is told to stop while the first's call still runs: it takes no more blocks
        wait_until(lambda: second.arrive(next(offered)) or second.out.statistics().not_queued > 0,
                   what="the second output told to stop")
        assert first.calls == [] and stopping.is_alive()  # (the first's call is still in progress)
    finally:
        first.gate.set()
        if stopping.is_alive():
            stopping.join(30)
        stop_all([first.out, second.out], 30.0)
    assert not stopping.is_alive()
    assert [b for b, _ in first.calls] == [block(0).block_id]


def test_two_outputs_of_one_stream_have_job_groups_of_their_own(spark_context):
    """Two ``foreachBlock`` of one combined stream share its plan; a stop that cancels one's Spark jobs must
    not cancel the other's."""
    stand = Stand(spark_context)
    outputs = [BlockOutput(spark_context, "test", 0, PLAN, stand.call, num_partitions=2, output_id=n,
                           read_records=lambda info: None, batch_blocks=lambda t: []) for n in (3, 4)]
    assert [o.job_group for o in outputs] == ["sparkwal-block-output-3", "sparkwal-block-output-4"]
