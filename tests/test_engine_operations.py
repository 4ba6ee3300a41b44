"""DStream operations on a manual clock, checked against pyspark.streaming's expected outputs.

The harness is pyspark.streaming's (queueStream input, the non-empty collected RDDs of each batch
as the result), driven batch by batch by a ManualClock instead of the wall clock.
"""

from __future__ import annotations

import operator
import threading

import pytest

from sparkwal.engine import StreamingContext, StreamingContextStateError, StreamingListener
from sparkwal.wal import ManualClock

BATCH = 0.5


class Batches(StreamingListener):
    def __init__(self):
        self.completed: list[int] = []
        self.infos = []
        self._cond = threading.Condition()

    def onBatchCompleted(self, batchCompleted):
        with self._cond:
            self.completed.append(batchCompleted.batchInfo().batch_time_ms)
            self.infos.append(batchCompleted.batchInfo())
            self._cond.notify_all()

    def wait_for(self, time_ms: int, timeout: float = 60) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: time_ms in self.completed, timeout), \
                f"batch {time_ms} did not complete"


class Harness:
    def __init__(self, sc, batch=BATCH):
        self.clock = ManualClock(0)
        self.ssc = StreamingContext(sc, batch, clock=self.clock)
        self.batches = Batches()
        self.ssc.addStreamingListener(self.batches)
        self.batch_ms = int(batch * 1000)

    def collect(self, dstream, keep_empty=False):
        results: list = []

        def get_output(_, rdd):
            r = rdd.collect()
            if r or keep_empty:
                results.append(r)

        dstream.foreachRDD(get_output)
        return results

    def run(self, inputs_stream, n_batches):
        inputs_stream.foreachRDD(lambda rdd: None)  # a job every batch, so every batch completes
        self.ssc.start()
        try:
            for i in range(1, n_batches + 1):
                self.clock.advance(self.batch_ms)
                self.batches.wait_for(i * self.batch_ms)
        finally:
            self.ssc.stop(stopSparkContext=False)
        self.ssc.awaitTerminationOrTimeout(0)  # raises a batch's error, if any


def check(sc, inputs, func, expected, sort=False, n_batches=None, **queue_kw):
    h = Harness(sc)
    src = h.ssc.queueStream(inputs, **queue_kw)
    results = h.collect(func(src))
    h.run(src, n_batches or len(expected))
    if sort:
        results = [sorted(r) for r in results]
        expected = [sorted(e) for e in expected]
    assert results == expected


def test_map(spark_context):
    inputs = [range(1, 5), range(5, 9), range(9, 13)]
    check(spark_context, inputs, lambda s: s.map(str), [list(map(str, x)) for x in inputs])


def test_flat_map(spark_context):
    inputs = [range(1, 5), range(5, 9), range(9, 13)]
    check(spark_context, inputs, lambda s: s.flatMap(lambda x: (x, x * 2)),
          [[y for x in xs for y in (x, x * 2)] for xs in inputs])


def test_filter(spark_context):
    inputs = [range(1, 5), range(5, 9), range(9, 13)]
    check(spark_context, inputs, lambda s: s.filter(lambda x: x % 2 == 0),
          [[x for x in xs if x % 2 == 0] for xs in inputs])


def test_count(spark_context):
    check(spark_context, [range(1, 5), range(1, 10), range(1, 20)], lambda s: s.count(), [[4], [9], [19]])


def test_reduce(spark_context):
    check(spark_context, [range(1, 5), range(5, 9), range(9, 13)], lambda s: s.reduce(operator.add),
          [[10], [26], [42]])


def test_reduce_by_key(spark_context):
    inputs = [[("a", 1), ("a", 1), ("b", 1), ("b", 1)], [("", 1), ("", 1), ("", 1), ("", 1)],
              [(1, 1), (1, 1), (2, 1), (2, 1), (3, 1)]]
    check(spark_context, inputs, lambda s: s.reduceByKey(operator.add),
          [[("a", 2), ("b", 2)], [("", 4)], [(1, 2), (2, 2), (3, 1)]], sort=True)


def test_map_values_flat_map_values(spark_context):
    inputs = [[("a", 2), ("b", 2)], [("c", 1)]]
    check(spark_context, inputs, lambda s: s.mapValues(lambda x: x + 10), [[("a", 12), ("b", 12)], [("c", 11)]],
          sort=True)
    check(spark_context, inputs, lambda s: s.flatMapValues(lambda x: (x, x * 10)),
          [[("a", 2), ("a", 20), ("b", 2), ("b", 20)], [("c", 1), ("c", 10)]], sort=True)


def test_glom_and_map_partitions(spark_context):
    inputs = [[1, 2, 3, 4], [5, 6]]
    rdds = [spark_context.parallelize(x, 2) for x in inputs]
    check(spark_context, rdds, lambda s: s.glom(), [[[1, 2], [3, 4]], [[5], [6]]])
    rdds = [spark_context.parallelize(x, 2) for x in inputs]
    check(spark_context, rdds, lambda s: s.mapPartitions(lambda it: [sum(it)]), [[3, 7], [5, 6]])


def test_count_by_value(spark_context):
    inputs = [[1, 1, 2, 2], [3, 3, 3], []]
    check(spark_context, inputs, lambda s: s.countByValue(), [[(1, 2), (2, 2)], [(3, 3)]], sort=True,
          n_batches=3)


def test_group_by_key_and_combine_by_key(spark_context):
    inputs = [[(1, 1), (2, 1), (3, 1), (4, 1)], [(1, 1), (1, 1), (2, 1), (2, 1), (3, 1)]]
    check(spark_context, inputs, lambda s: s.groupByKey().mapValues(sorted),
          [[(1, [1]), (2, [1]), (3, [1]), (4, [1])], [(1, [1, 1]), (2, [1, 1]), (3, [1])]], sort=True)
    check(spark_context, inputs,
          lambda s: s.combineByKey(lambda x: [x], lambda c, x: c + [x], operator.add),
          [[(1, [1]), (2, [1]), (3, [1]), (4, [1])], [(1, [1, 1]), (2, [1, 1]), (3, [1])]], sort=True)


def test_repartition_and_partition_by(spark_context):
    inputs = [range(20)]
    check(spark_context, inputs, lambda s: s.repartition(3).glom().map(len), [[len(p) for p in
          spark_context.parallelize(range(20)).repartition(3).glom().collect()]])
    check(spark_context, [[(i, i) for i in range(6)]], lambda s: s.partitionBy(2).glom().map(len), [[3, 3]])


def test_union_and_transform_with(spark_context):
    h = Harness(spark_context)
    a = h.ssc.queueStream([[1, 2], [3]])
    b = h.ssc.queueStream([[10], [20, 30]])
    u = h.collect(a.union(b))
    tw = h.collect(a.transformWith(lambda x, y: x.cartesian(y), b))
    ctx_union = h.collect(h.ssc.union(a, b, a))
    h.run(a, 2)
    assert [sorted(r) for r in u] == [[1, 2, 10], [3, 20, 30]]
    assert [sorted(r) for r in tw] == [[(1, 10), (2, 10)], [(3, 20), (3, 30)]]
    assert [sorted(r) for r in ctx_union] == [[1, 1, 2, 2, 10], [3, 3, 20, 30]]


def test_joins_and_cogroup(spark_context):
    h = Harness(spark_context)
    a = h.ssc.queueStream([[("a", 1), ("b", 2)]])
    b = h.ssc.queueStream([[("b", 3), ("c", 4)]])
    join = h.collect(a.join(b))
    left = h.collect(a.leftOuterJoin(b))
    right = h.collect(a.rightOuterJoin(b))
    full = h.collect(a.fullOuterJoin(b))
    cog = h.collect(a.cogroup(b).mapValues(lambda vs: (sorted(vs[0]), sorted(vs[1]))))
    h.run(a, 1)
    assert join == [[("b", (2, 3))]]
    assert sorted(left[0]) == [("a", (1, None)), ("b", (2, 3))]
    assert sorted(right[0]) == [("b", (2, 3)), ("c", (None, 4))]
    assert sorted(full[0]) == [("a", (1, None)), ("b", (2, 3)), ("c", (None, 4))]
    assert sorted(cog[0]) == [("a", ([1], [])), ("b", ([2], [3])), ("c", ([], [4]))]


def test_transform_with_time(spark_context):
    h = Harness(spark_context)
    src = h.ssc.queueStream([[1], [2]])
    out = h.collect(src.transform(lambda t, rdd: rdd.map(lambda x: (x, int(t.timestamp() * 1000)))))
    multi = h.collect(h.ssc.transform([src, src], lambda rdds: rdds[0].union(rdds[1])))
    h.run(src, 2)
    assert out == [[(1, 500)], [(2, 1000)]]
    assert multi == [[1, 1], [2, 2]]


def test_window(spark_context):
    """pyspark.streaming's test_window, verbatim."""
    inputs = [range(1), range(2), range(3), range(4), range(5)]
    check(spark_context, inputs, lambda s: s.window(1.5, .5).count(), [[1], [3], [6], [9], [12], [9], [5]])


def test_window_with_slide(spark_context):
    # batches at 500..3500 hold 1..5 elements; slide 1 s fires at 1000, 2000, 3000
    inputs = [range(1), range(2), range(3), range(4), range(5)]
    check(spark_context, inputs, lambda s: s.window(1.5, 1).count(), [[3], [9], [9]], n_batches=6)


def test_window_parameters_must_be_multiples_of_the_slide(spark_context):
    ssc = StreamingContext(spark_context, BATCH, clock=ManualClock(0))
    s = ssc.queueStream([[1]])
    with pytest.raises(ValueError, match="windowDuration must be multiple"):
        s.window(1.2, 0.5)
    with pytest.raises(ValueError, match="slideDuration must be multiple"):
        s.window(1.5, 0.7)
    with pytest.raises(ValueError, match="windowDuration must be multiple"):
        s.reduceByKeyAndWindow(operator.add, operator.sub, 0.7)


def test_a_checkpoint_interval_must_be_a_multiple_of_the_slide(spark_context):
    h = Harness(spark_context)
    src = h.ssc.queueStream([[("a", 1)]])
    src.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(0.75).foreachRDD(lambda rdd: None)
    with pytest.raises(ValueError, match=r"checkpoint interval of StateDStream.* \(750 ms\) must be a "
                                         r"multiple of its slide duration \(500 ms\)"):
        h.ssc.start()


@pytest.mark.slow
def test_count_by_window_and_reduce_by_window(spark_context):
    inputs = [range(1), range(2), range(3), range(4), range(5), range(6)]
    check(spark_context, inputs, lambda s: s.countByWindow(1.5, .5), [[1], [3], [6], [9], [12], [15], [11], [6]],
          n_batches=8)
    check(spark_context, inputs, lambda s: s.reduceByWindow(operator.add, None, 1.5, .5),
          [[0], [1], [4], [10], [19], [31], [25], [15]], n_batches=8)


@pytest.mark.slow
def test_count_by_value_and_window(spark_context):
    inputs = [range(1), range(2), range(3), range(4), range(5), range(6)]
    check(spark_context, inputs, lambda s: s.countByValueAndWindow(1.5, .5).map(lambda kv: kv[0]).count(),
          [[1], [2], [3], [4], [5], [6], [6], [6], [0]], n_batches=9)


def test_group_by_key_and_window(spark_context):
    inputs = [[("a", i)] for i in range(5)]
    check(spark_context, inputs, lambda s: s.groupByKeyAndWindow(1.5, .5).mapValues(sorted),
          [[("a", [0])], [("a", [0, 1])], [("a", [0, 1, 2])], [("a", [1, 2, 3])], [("a", [2, 3, 4])],
           [("a", [3, 4])], [("a", [4])]], n_batches=7)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.slow
def test_reduce_by_key_and_window_incremental_matches_full_recomputation(spark_context, inverse):
    """A 3 s window over 0.5 s batches (6 slides): with an inverse function each window is the
    previous one minus the batch that left plus the one that entered (Spark's incremental path)."""
    inputs = [[(k, i) for k in "abc"[: 1 + i % 3]] for i in range(10)]
    inv = operator.sub if inverse else None
    expected = []
    for t in range(1, 13):
        window = [kv for i in range(max(0, t - 6), min(t, 10)) for kv in inputs[i]]
        sums = {}
        for k, v in window:
            sums[k] = sums.get(k, 0) + v
        expected.append(sorted(sums.items()))
    check(spark_context, inputs,
          lambda s: s.reduceByKeyAndWindow(operator.add, inv, 3.0, .5, filterFunc=lambda kv: True)
          .filter(lambda kv: kv[1] != 0 or kv[0] == "a"),
          [e for e in expected if e], sort=True, n_batches=12)


def test_update_state_by_key(spark_context):
    def update(values, last):
        return sum(values) + (last or 0)

    inputs = [[("k", 1)], [("k", 2), ("j", 1)], [], [("k", 3)]]
    check(spark_context, inputs, lambda s: s.updateStateByKey(update),
          [[("k", 1)], [("j", 1), ("k", 3)], [("j", 1), ("k", 3)], [("j", 1), ("k", 6)]], sort=True)


def test_update_state_by_key_with_initial_rdd_and_removal(spark_context):
    def update(values, last):
        total = sum(values) + (last or 0)
        return None if total > 5 else total  # None drops the key

    inputs = [[("a", 1)], [("a", 1), ("b", 2)], [("a", 9)]]
    check(spark_context, inputs, lambda s: s.updateStateByKey(update, initialRDD=[("a", 2), ("z", 0)]),
          [[("a", 3), ("z", 0)], [("a", 4), ("b", 2), ("z", 0)], [("b", 2), ("z", 0)]], sort=True)


def test_update_state_by_key_shuffles_only_the_batch_and_keeps_the_state_partitioned(spark_context):
    """The function sees every key once per batch ([] without new values, None without state);
    the JVM zips the batch's groups with the state's partitions, so the state is never shuffled
    and the next state keeps its partitioner."""
    from pyspark.rdd import Partitioner, portable_hash

    h = Harness(spark_context)
    src = h.ssc.queueStream([[("a", 1), ("b", 1), ("a", 2)], [("c", 5)], [("a", 1)]])
    seen = []

    def update(values, last):  # (total, calls)
        total, calls = last or (0, 0)
        return total + sum(values), calls + 1

    def record(t, rdd):
        seen.append((sorted(rdd.collect()), rdd.partitioner, rdd.toDebugString().decode()))

    src.updateStateByKey(update, numPartitions=3).foreachRDD(record)
    h.run(src, 3)
    assert [s[0] for s in seen] == [[("a", (3, 1)), ("b", (1, 1))],
                                    [("a", (3, 2)), ("b", (1, 2)), ("c", (5, 1))],
                                    [("a", (4, 3)), ("b", (1, 3)), ("c", (5, 2))]]
    assert all(s[1] == Partitioner(3, portable_hash) for s in seen)
    assert "PartitionerAwareUnionRDD" in seen[2][2]  # zipped, not cogrouped


def test_slice(spark_context):
    h = Harness(spark_context)
    h.ssc.remember(10)
    src = h.ssc.queueStream([[1], [2], [3], [4]])
    h.run(src, 4)
    sliced = src.slice(0.5, 1.5)  # epoch seconds: the batches at 500, 1000, 1500 ms
    assert [r.collect() for r in sliced] == [[1], [2], [3]]


def test_queue_stream_all_at_once_and_default(spark_context):
    check(spark_context, [[1], [2], [3]], lambda s: s, [[1, 2, 3]], n_batches=3, oneAtATime=False)
    check(spark_context, [[1]], lambda s: s, [[1], [0], [0]], n_batches=3, default=[0])


def test_pprint(spark_context, capsys):
    h = Harness(spark_context)
    src = h.ssc.queueStream([list(range(12))])
    src.pprint()
    h.run(src, 1)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "-------------------------------------------"
    assert out[1].startswith("Time: ")
    assert out[3:13] == [str(i) for i in range(10)] and out[13] == "..."


def test_save_as_text_files_is_idempotent_per_batch(spark_context, tmp_path):
    h = Harness(spark_context)
    src = h.ssc.queueStream([["x", "y"], ["z"]])
    src.saveAsTextFiles(str(tmp_path / "out"), "txt")
    h.run(src, 2)
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert dirs == ["out-1000.txt", "out-500.txt"]
    assert sorted(spark_context.textFile(str(tmp_path / "out-500.txt")).collect()) == ["x", "y"]


def test_listener_sees_batch_timing(spark_context):
    h = Harness(spark_context)
    src = h.ssc.queueStream([[1], [2]])
    h.run(src, 2)
    infos = sorted(h.batches.infos, key=lambda i: i.batch_time_ms)
    assert [i.batch_time_ms for i in infos] == [500, 1000]
    assert all(i.processing_delay_ms is not None and i.total_delay_ms >= 0 for i in infos)


class PortedListener(StreamingListener):
    """Written against pyspark.streaming's listener API (accessor methods only)."""

    def __init__(self):
        self.events: list[tuple] = []

    def onStreamingStarted(self, streamingStarted):
        self.events.append(("started", streamingStarted.time() >= 0))

    def onBatchSubmitted(self, batchSubmitted):
        info = batchSubmitted.batchInfo()
        ops = info.outputOperationInfos()
        self.events.append(("submitted", info.batchTime().milliseconds(), sorted(ops),
                            {(o.name(), o.startTime(), o.endTime()) for o in ops.values()}))

    def onBatchCompleted(self, batchCompleted):
        info = batchCompleted.batchInfo()
        self.events.append(("batch", info.batchTime().milliseconds(), info.numRecords(),
                            info.totalDelay() == info.schedulingDelay() + info.processingDelay() >= 0))
        self.events.append(("batch ops", info.batchTime().milliseconds(),
                            sorted((i, o.name(), o.startTime() >= 0 and o.endTime() >= o.startTime(),
                                    (o.failureReason() or "").split(":")[0])
                                   for i, o in info.outputOperationInfos().items())))

    def onOutputOperationCompleted(self, outputOperationCompleted):
        op = outputOperationCompleted.outputOperationInfo()
        reason = op.failureReason()
        self.events.append(("op", op.batchTime().milliseconds(), op.id(), op.name(),
                            reason.split(":")[0] if reason else None, op.duration() >= 0))


def test_a_listener_ported_from_pyspark_streaming_sees_batches_and_output_operations(spark_context, capsys):
    h = Harness(spark_context)
    ported = PortedListener()
    h.ssc.addStreamingListener(ported)
    src = h.ssc.queueStream([[1], [2]])
    src.pprint()

    def fails_in_second_batch(t, rdd):
        if int(t.timestamp() * 1000) == 1000:
            raise ZeroDivisionError("second batch")

    src.foreachRDD(fails_in_second_batch)
    h.ssc.start()
    for t in (500, 1000):
        h.clock.advance(500)
        h.batches.wait_for(t)
    h.ssc.stop(stopSparkContext=False)
    with pytest.raises(ZeroDivisionError, match="second batch"):
        h.ssc.awaitTerminationOrTimeout(0)
    assert ported.events[0] == ("started", True)
    assert sorted(e for e in ported.events if e[0] == "op") == [
        ("op", 500, 0, "pprint", None, True), ("op", 500, 1, "foreachRDD", None, True),
        ("op", 1000, 0, "pprint", None, True), ("op", 1000, 1, "foreachRDD", "ZeroDivisionError", True)]
    batches = [e for e in ported.events if e[0] == "batch"]
    assert batches == [("batch", 500, 0, True), ("batch", 1000, 0, True)]
    # a batch's outputOperationInfos(), as pyspark's BatchInfo: not started when submitted, done after
    submitted = [e for e in ported.events if e[0] == "submitted"]
    assert submitted == [("submitted", t, [0, 1], {("pprint", -1, -1), ("foreachRDD", -1, -1)})
                         for t in (500, 1000)]
    assert [e for e in ported.events if e[0] == "batch ops"] == [
        ("batch ops", 500, [(0, "pprint", True, ""), (1, "foreachRDD", True, "")]),
        ("batch ops", 1000, [(0, "pprint", True, ""), (1, "foreachRDD", True, "ZeroDivisionError")])]


def test_an_error_in_a_batch_reaches_await_termination(spark_context):
    h = Harness(spark_context)
    src = h.ssc.queueStream([[1, 2, 3]])

    def boom(rdd):
        rdd.map(lambda x: 1 / 0).collect()

    src.foreachRDD(boom)
    h.ssc.start()
    h.clock.advance(500)
    with pytest.raises(Exception, match="ZeroDivisionError|division by zero"):
        h.ssc.awaitTermination(60)
    h.ssc.stop(stopSparkContext=False)


def test_context_states(spark_context):
    ssc = StreamingContext(spark_context, BATCH, clock=ManualClock(0))
    with pytest.raises(ValueError, match="No output operations"):
        ssc.start()
    s = ssc.queueStream([[1]])
    s.foreachRDD(lambda rdd: None)
    ssc.start()
    assert StreamingContext.getActive() is ssc
    other = StreamingContext(spark_context, BATCH, clock=ManualClock(0))
    other.queueStream([[1]]).foreachRDD(lambda rdd: None)
    with pytest.raises(StreamingContextStateError, match="Only one StreamingContext"):
        other.start()
    with pytest.raises(StreamingContextStateError, match="after starting"):
        ssc.queueStream([[2]])
    ssc.stop(stopSparkContext=False)
    assert StreamingContext.getActive() is None
    assert ssc.awaitTerminationOrTimeout(0.1)
    with pytest.raises(StreamingContextStateError, match="already been stopped"):
        ssc.start()
    with pytest.raises(ValueError):
        StreamingContext(spark_context, 0)


@pytest.mark.slow
def test_stop_cancels_a_running_batch_without_reporting_an_error(spark_context):
    import time as _time

    h = Harness(spark_context)
    started = threading.Event()
    src = h.ssc.queueStream([[1, 2]])

    def slow(rdd):
        started.set()
        rdd.map(lambda x: _time.sleep(60)).collect()

    src.foreachRDD(slow)
    h.ssc.start()
    h.clock.advance(500)
    assert started.wait(60)
    deadline = _time.monotonic() + 60
    while not spark_context.statusTracker().getActiveJobsIds():  # the slow Spark job is running
        assert _time.monotonic() < deadline
        started.wait(0.05)
    t0 = _time.monotonic()
    h.ssc.stop(stopSparkContext=False, stopGraceFully=False)
    assert _time.monotonic() - t0 < 30  # the Spark job was cancelled, not waited for
    assert h.ssc.awaitTerminationOrTimeout(1)  # and its cancellation is no error of the app
    t1 = _time.monotonic()
    assert spark_context.parallelize([1, 2, 3]).count() == 3  # the SparkContext is fine...
    assert _time.monotonic() - t1 < 30  # ...and its cores were freed by the cancellation
