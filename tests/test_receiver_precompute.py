"""``spark.sparkwal.receiver.precompute``: receivers run the per-record operations up to the first
``reduceByKey`` on each block as they store it, and a batch whose every block came with its result
builds that stream's RDD from the results. The output must be exactly the ordinary path's."""

from __future__ import annotations

import operator
import sys
import threading
from collections import Counter

import pytest
from pyspark import cloudpickle

from sparkwal.engine import StreamingContext
from sparkwal.engine.receiver.precompute import RunningResults
from sparkwal.engine.receiver.supervisor import BlockGenerator
from sparkwal.engine.stream_machinery import per_record
from sparkwal.tracker import RateLimiter
from sparkwal.wal import ManualClock
from sparkwal.engine.receiver.precompute import (UNSENT_BEFORE_STOP, BlockPlan, DriverRowsRDD, Precomputed,
                                                 block_results, decode_result, encode_result, run_plan)

from test_receivers import LineServer, wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEY = "spark.sparkwal.receiver.precompute"


def with_conf(sc, **values):
    """Set ``values`` on the live SparkConf (read by the next StreamingContext); returns the undo."""
    conf = sc._jsc.sc().conf()
    for key, value in values.items():
        conf.set(key, value)
    return lambda: [conf.remove(key) for key in values]


def _words(line: str) -> list:
    return line.split()


def run_counts(sc, tmp_path, lines, build, expected=None, **conf):
    """Run ``build(stream)`` (a keyed stream) over ``lines`` and return the summed counts and the
    receiver tracker's statistics."""
    undo = with_conf(sc, **conf)
    server = LineServer(lines)
    ssc = StreamingContext(sc, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    totals: Counter = Counter()
    batches: list = []

    def take(rdd):
        items = rdd.collect()
        batches.append((items, isinstance(rdd, DriverRowsRDD)))
        for key, value in items:
            totals[key] += value

    source = ssc.socketTextStream("127.0.0.1", server.port)
    build(source).foreachRDD(take)
    ssc.start()
    try:
        expected = expected or sum(len(_words(line)) for line in lines)
        wait_until(lambda: sum(totals.values()) >= expected, what="every word")
        cuts = ssc.receiverTracker.batch_cuts  # its receiver reports each cut on a batch time (test_batch_cuts.py)
        wait_until(lambda: cuts.recorded_batch(source.input_id) is not None, what="the receiver's report of a cut")
        stats = ssc.receiverTracker.statistics()
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        server.close()
        undo()
    return totals, stats, batches


LINES = [f"a b{i % 7} c{i % 13} é{i % 3}" for i in range(4000)]
EXPECTED = Counter(w for line in LINES for w in _words(line))


def test_a_word_count_built_from_the_receivers_results_is_exactly_the_ordinary_paths(spark_context, tmp_path):
    totals, stats, batches = run_counts(
        spark_context, tmp_path, LINES,
        lambda s: s.flatMap(_words).map(lambda w: (w, 1)).filter(lambda kv: kv[0]).reduceByKey(operator.add),
        **{KEY: "true"})
    assert totals == EXPECTED
    assert stats.precomputed_batches >= 1 and stats.precompute_fallbacks == 0
    assert all(len({k for k, _ in b}) == len(b) for b, _ in batches)  # one row per key in a batch
    assert sum(from_driver for _, from_driver in batches) == stats.precomputed_batches


def test_a_precomputed_batchs_rows_are_read_on_the_driver_without_a_spark_job(spark_context):
    rows = [(f"k{i}", i) for i in range(10)]
    rdd = DriverRowsRDD(spark_context, rows, num_partitions=3)
    spark_context.setJobGroup("driver-rows", "reads of rows the driver holds")
    try:
        assert (rdd.collect(), rdd.take(4), rdd.first(), rdd.count(), rdd.isEmpty()) == (rows, rows[:4], rows[0], 10,
                                                                                           False)
        assert spark_context.statusTracker().getJobIdsForGroup("driver-rows") == []
        assert rdd.getNumPartitions() == 3 and not rdd.jvm_side_built
        assert rdd.map(lambda kv: kv[1]).sum() == 45 and not rdd.jvm_side_built  # steps too (test_driver_rows.py)
        assert rdd.map(lambda kv: kv[1]).repartition(2).sum() == 45 and rdd.jvm_side_built  # a shuffle: Spark's
        assert len(spark_context.statusTracker().getJobIdsForGroup("driver-rows")) == 1
    finally:
        spark_context.setLocalProperty("spark.jobGroup.id", None)
    empty = DriverRowsRDD(spark_context, [], num_partitions=2)
    assert (empty.isEmpty(), empty.take(1), empty.count()) == (True, [], 0)


def test_a_step_after_the_precomputed_combine_runs_on_the_driver(spark_context, tmp_path):
    """The output's steps over a precomputed batch (here mapValues, then count) run no Spark job, in a
    driver whose executors' environment holds sparkwal's own settings (test_driver_rows.py has the rules)."""
    probed: list = []

    def probe(rdd):
        probed.append((rdd.count(), isinstance(rdd, DriverRowsRDD) and not rdd.jvm_side_built))

    def build(s):
        counts = s.flatMap(_words).map(lambda w: (w, 1)).reduceByKey(operator.add).mapValues(lambda v: v)
        counts.foreachRDD(probe)
        return counts

    totals, stats, _ = run_counts(spark_context, tmp_path, LINES, build)
    assert totals == EXPECTED and stats.precomputed_batches >= 1
    assert sum(on_driver for _, on_driver in probed) == stats.precomputed_batches


def test_on_by_default_and_false_turns_it_off(spark_context, tmp_path):
    count = lambda s: s.flatMap(_words).map(lambda w: (w, 1)).reduceByKey(operator.add)  # noqa: E731
    totals, stats, _ = run_counts(spark_context, tmp_path / "default", LINES, count)
    assert totals == EXPECTED and stats.precomputed_batches >= 1  # nothing set: the receiver precomputes
    totals, stats, batches = run_counts(spark_context, tmp_path / "off", LINES, count, **{KEY: "false"})
    assert totals == EXPECTED and stats.precomputed_batches == 0  # every batch reads its blocks
    assert not any(from_driver for _, from_driver in batches)


def test_a_receiver_stops_a_plan_whose_results_it_cannot_send(caplog):
    """On by default, precompute must not double a receiver's work where its results never reach the
    driver: after UNSENT_BEFORE_STOP blocks in a row whose result was too large, the plan stops (one
    line); a result sent in between starts the count again."""
    plan = BlockPlan(4, (lambda it: ((w, 1) for line in it for w in line.split()),), lambda v: v, operator.add)
    failed: set = set()
    unsent: dict = {}
    small, large = ["a a b"], [" ".join(f"w{i}" for i in range(200))]
    for _ in range(UNSENT_BEFORE_STOP - 1):
        assert block_results(0, (plan,), large, 256, failed, unsent) == []
    assert block_results(0, (plan,), small, 256, failed, unsent) != [] and not failed  # sent: counted anew
    with caplog.at_level("WARNING", logger="sparkwal.engine.receiver.precompute"):
        for _ in range(UNSENT_BEFORE_STOP):
            assert block_results(0, (plan,), large, 256, failed, unsent) == []
    assert failed == {4}
    assert block_results(0, (plan,), small, 256, failed, unsent) == []  # stopped: not run again
    stopped = [r.getMessage() for r in caplog.records if "stopped" in r.getMessage()]
    assert len(stopped) == 1 and f"last {UNSENT_BEFORE_STOP} blocks were not sent" in stopped[0]
    assert "spark.sparkwal.receiver.precompute.maxBytes" in stopped[0]


def test_results_too_large_to_send_fall_back_to_reading_the_blocks(spark_context, tmp_path):
    lines = [f"u{i} v{i}" for i in range(3000)]  # every word distinct: results as large as the data
    totals, stats, _ = run_counts(
        spark_context, tmp_path, lines, lambda s: s.flatMap(_words).map(lambda w: (w, 1)).reduceByKey(operator.add),
        **{KEY: "true", "spark.sparkwal.receiver.precompute.maxBytes": "64"})
    assert totals == Counter(w for line in lines for w in _words(line))
    assert stats.precomputed_batches == 0 and stats.precompute_fallbacks >= 1


def test_a_function_that_fails_on_the_receiver_fails_its_batch_as_on_the_ordinary_path():
    def bad(_w):
        raise ValueError("no")
    plan = BlockPlan(3, (lambda it: map(lambda w: (bad(w), 1), it),), lambda v: v, operator.add)
    failed: set = set()
    assert block_results(0, (plan,), ["x"], 1 << 10, failed) == [] and failed == {3}
    assert block_results(0, (plan,), ["x"], 1 << 10, failed) == []  # not run again


@pytest.mark.parametrize("items, sent", [
    ([("a", 1), ("b", 2.5), (None, True), (b"k", (1, ("x", None)))], True),
    ([("a", [1, 2])], False),  # a list would come back a tuple: not sent
    ([("a", {"k": 1})], False),
    ([("a", 1 << 70)], False),  # beyond msgpack's integers
])
def test_only_results_that_come_back_exactly_are_sent(items, sent):
    data = encode_result(items, 1 << 20)
    assert (data is not None) == sent
    if sent:
        assert list(decode_result(data)) == items


def test_a_plan_is_the_map_side_of_combine_by_key():
    plan = BlockPlan(0, (lambda it: (w for line in it for w in line.split()), lambda it: ((w, 1) for w in it)),
                     lambda v: [v], lambda c, v: c + [v])
    assert dict(run_plan(plan, ["a b", "a"])) == {"a": [1, 1], "b": [1]}


def test_a_whole_partition_function_runs_on_whole_blocks_as_on_the_ordinary_path(spark_context, tmp_path):
    lines = [f"x y{i % 5}" for i in range(3000)]
    def build(s):  # glom sees a block as its partition: per-block sizes add up
        return s.glom().map(lambda b: ("records", 2 * len(b))).reduceByKey(operator.add)
    totals, stats, _ = run_counts(spark_context, tmp_path, lines, build, **{KEY: "true"})
    assert totals == {"records": 2 * len(lines)}
    assert stats.precomputed_batches >= 1 and stats.precompute_fallbacks == 0


def test_the_driver_holds_a_bounded_amount_of_results_dropping_the_oldest_first():
    class Head:
        creation_site = "reduceByKey at app.py:1"
    plan = BlockPlan(7, (), lambda v: v, operator.add)
    held = Precomputed(None, [], None, None, plans={0: [(Head(), plan)]}, max_held=250)
    for i in range(5):
        held.add(0, f"input-0-{i}", [[7, bytes(100)], [99, bytes(100)]])  # plan 99 is not this stream's
    assert held.held_bytes == 200  # the two newest blocks' results of plan 7
    assert "stream 0 runs the per-record operations up to reduceByKey at app.py:1" in held.describe()


def test_two_branches_each_with_its_own_plan_count_and_count_by_value(spark_context, tmp_path):
    lines = [f"p q{i % 4}" for i in range(3000)]

    def build(s):  # one output of both: the lines counted (count: a whole-block step) and the words
        return s.flatMap(_words).countByValue().union(s.count().map(lambda n: ("lines", n)))
    totals, stats, _ = run_counts(spark_context, tmp_path, lines, build, expected=3 * len(lines), **{KEY: "true"})
    assert totals == Counter({"p": 3000, "q0": 750, "q1": 750, "q2": 750, "q3": 750, "lines": 3000})
    assert stats.precomputed_batches >= 2 and stats.precompute_fallbacks == 0


def test_results_carry_each_keys_hash_and_a_malformed_one_falls_back_to_the_blocks(spark_context):
    class Head:
        creation_site = "reduceByKey at app.py:1"
        block_combine = (None, None, operator.add, 2)  # (create, merge value, merge combiners, partitions)

    class Block:
        block_id, num_records = "input-0-1", 3

    class Blocks:  # the driver's block tracker, as Precomputed reads it
        @staticmethod
        def get_blocks_of_batch_and_stream(time_ms, stream_id):
            return [Block()]

    head, plan = Head(), BlockPlan(7, (), lambda v: v, operator.add)
    inputs, reported = [type("Input", (), {"input_id": 0})()], []
    held = Precomputed(spark_context, inputs, Blocks(), lambda *args: reported.append(args),
                       plans={0: [(head, plan)]}, max_held=1 << 20)
    held.add(0, "input-0-1", [[7, encode_result([("a", 1)], 1024)]])  # [key, combiner]: no hash
    assert held.rdd(head, 1000) is None and held.fallbacks == 1
    held.add(0, "input-0-1", [[7, encode_result([("a", 1, 5), ("b", 2, None)], 1024)]])
    rdd = held.rdd(head, 1500)  # a hash not worked out: the rows, and no hashes for any key
    assert rdd.collect() == [("a", 1), ("b", 2)] and rdd.key_hashes is None
    held.add(0, "input-0-1", [[7, encode_result([("a", 1, 5)], 1024)]])
    assert held.rdd(head, 2000).key_hashes == {"a": 5}
    assert [(t, n) for t, _, n, _ in reported] == [(1500, 3), (2000, 3)]  # each batch's input, reported once


def test_the_start_names_the_operation_that_keeps_each_receiver_stream_from_precomputing(spark_context, caplog):
    """One line at start says which streams the receivers precompute and, for each other receiver
    stream, the operation that stops it: a WARNING where the program set spark.sparkwal.receiver.precompute
    (it asked and does not get it there), INFO under the default."""
    ssc = StreamingContext(spark_context, 0.5)
    counted = ssc.socketTextStream("127.0.0.1", 9)
    counted.flatMap(_words).map(lambda w: (w, 1)).reduceByKey(operator.add).pprint()
    windowed = ssc.socketTextStream("127.0.0.1", 9)
    windowed.map(lambda w: (w, 1)).window(1.0, 1.0).reduceByKey(operator.add).pprint()
    persisted = ssc.socketTextStream("127.0.0.1", 9)
    persisted.map(lambda w: (w, 1)).cache().reduceByKey(operator.add).pprint()
    plain = ssc.socketTextStream("127.0.0.1", 9)
    plain.pprint()
    inputs = [counted, windowed, persisted, plain]
    caplog.set_level("INFO", logger="sparkwal.engine.receiver.precompute")
    made = Precomputed.of_graph(spark_context, ssc.driver.graph, inputs, None, None, 1 << 20)
    [line] = [r for r in caplog.records if "spark.sparkwal.receiver.precompute" in r.getMessage()]
    said = line.getMessage()
    assert line.levelname == "WARNING" and made.covers is not None
    assert "stream 0 runs the per-record operations up to reduceByKey at" in said
    assert "stream 1 is not precomputed: map at" in said and "persisted for window at" in said
    assert "stream 2 is not precomputed: map at" in said and "is persisted (its RDD is built" in said
    assert "stream 3 is not precomputed: pprint at" in said and "not a per-record operation" in said
    assert "test_receiver_precompute.py" in said  # each operation named where the program made it
    caplog.clear()  # under the default (the program did not ask): the same line, at INFO
    Precomputed.of_graph(spark_context, ssc.driver.graph, inputs, None, None, 1 << 20, asked=False)
    [line] = [r for r in caplog.records if "spark.sparkwal.receiver.precompute" in r.getMessage()]
    assert line.levelname == "INFO" and line.getMessage() == said


def _counting_plan(plan_id: int = 0) -> BlockPlan:
    step = per_record(lambda it: ((w, 1) for line in it for w in line.split()))
    return BlockPlan(plan_id, (step,), lambda v: v, operator.add)


def test_a_block_that_waits_for_room_in_the_queue_keeps_its_records_combiners():
    """A source faster than the pusher: the buffer is full and the queue too, so add_many waits for
    room. The block it queues at last must carry the combiners of exactly its records (a result
    taken for an attempt that found no room, then lost, would make the driver count none of them)."""
    gate, pushed = threading.Event(), []

    def push(block_id, records, _metadata, results):
        gate.wait(10)
        pushed.append((records, results))

    running = RunningResults(0, (_counting_plan(),), 1 << 20, set(), {})
    gen = BlockGenerator(push, interval_ms=60_000, queue_size=1, max_buffered=3, rate_limiter=RateLimiter(),
                         clock=ManualClock(0), on_error=lambda *_: None, new_block_id=iter(range(100)).__next__,
                         running=running)
    gen.start()
    lines = [f"w{i} x" for i in range(12)]
    adder = threading.Thread(target=lambda: [gen.add_many([line]) for line in lines])
    adder.start()
    adder.join(0.5)
    assert adder.is_alive()  # waiting for room: one block in the pusher, one queued, a full buffer
    gate.set()
    adder.join(10)
    gen.stop()
    assert sorted(r for records, _ in pushed for r in records) == sorted(lines)  # every record, once
    for records, results in pushed:
        [[plan_id, data]] = results
        counted = Counter({k: c for k, c, _ in decode_result(data)})
        assert counted == Counter(w for line in records for w in line.split())


def test_a_result_msgpack_refuses_is_not_sent_and_costs_no_record():
    running = RunningResults(0, (_counting_plan(),), 1 << 20, set(), {})
    running.add(["ok \udc80"])  # a lone surrogate: msgpack cannot encode it
    assert running.take() == []  # not sent: the batch reads the block
    running.add(["fine"])
    [[_, data]] = running.take()
    assert decode_result(data)[0][:2] == ("fine", 1)


def test_a_plan_whose_functions_cannot_be_pickled_is_left_out_at_start(spark_context, caplog):
    lock = threading.Lock()  # a receiver's job could not carry it
    ssc = StreamingContext(spark_context, 0.5)
    stream = ssc.socketTextStream("127.0.0.1", 9)
    stream.map(lambda w: (w, lock.locked())).reduceByKey(operator.add).pprint()
    caplog.set_level("INFO", logger="sparkwal.engine.receiver.precompute")
    made = Precomputed.of_graph(spark_context, ssc.driver.graph, [stream], None, None, 1 << 20)
    assert made.plans_of(stream.input_id) == ()
    [line] = [r.getMessage() for r in caplog.records if "spark.sparkwal.receiver.precompute" in r.getMessage()]
    assert f"stream {stream.input_id} is not precomputed: its functions cannot be pickled" in line


def test_a_refused_block_leaves_no_result_held_and_one_sent_again_counts_once(spark_context):
    """The tracker holds a block's results before it records the block (a batch that allocates it must
    find them): a block refused after all leaves none behind, and an AddBlock sent again replaces them."""
    ssc = StreamingContext(spark_context, 0.5)
    stream = ssc.socketTextStream("127.0.0.1", 9)
    stream.map(lambda w: (w, 1)).reduceByKey(operator.add).pprint()
    made = Precomputed.of_graph(spark_context, ssc.driver.graph, [stream], None, None, 1 << 20)
    [plan] = made.plans_of(stream.input_id)
    data = encode_result([("a", 1, 0)], 1 << 10)
    made.add(stream.input_id, "input-0-1-x", [[plan.plan_id, data]])
    made.add(stream.input_id, "input-0-1-x", [[plan.plan_id, data]])  # sent again: held once
    assert made.held_bytes == len(data)
    made.discard("input-0-1-x")
    assert made.held_bytes == 0
