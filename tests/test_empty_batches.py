"""An empty batch costs nearly nothing (issue 44, part 4): when a batch's inputs are empty,
sparkwal's own operations build no RDDs over them and their Spark job has no tasks, the output
still runs once per batch with an empty RDD, and ``spark.sparkwal.emptyBatch.shortcut=false``
gives Spark's behaviour (N empty partitions after a shuffle, their tasks run)."""

from __future__ import annotations

import threading

import pytest

from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.wal import ManualClock


class Seen(StreamingListener):
    def __init__(self):
        self.ops, self.cond = {}, threading.Condition()

    def onBatchCompleted(self, event):
        info = event.batchInfo()
        with self.cond:
            self.ops[info.batch_time_ms] = info.output_operation_infos[0]
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.ops) >= n, 60), f"{len(self.ops)} of {n} batches"


@pytest.mark.parametrize("shortcut", [True, False])
def test_an_empty_batch_runs_its_output_on_an_rdd_of_no_tasks_and_data_batches_are_exact(spark_context, shortcut):
    spark_context._jsc.sc().conf().set("spark.sparkwal.emptyBatch.shortcut", str(shortcut).lower())
    try:
        clock, seen, outputs = ManualClock(0), Seen(), []
        ssc = StreamingContext(spark_context, 0.5, clock=clock)
        # one RDD per batch, then none: the third batch's input is empty
        queue = ssc.queueStream([spark_context.parallelize(["a b", "b"], 2), spark_context.parallelize(["c"], 1)],
                                oneAtATime=True)
        words = queue.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b, 2)
        other = ssc.queueStream([])  # empty in every batch
        joined = words.union(other.map(lambda w: (w, 1))).filter(lambda kv: kv[1] > 0)
        joined.foreachRDD(lambda t, rdd: outputs.append((rdd.getNumPartitions(), sorted(rdd.collect()))))
        ssc.addStreamingListener(seen)
        ssc.start()
        try:
            clock.advance(500)
            seen.wait_for(1)
            clock.advance(500)
            seen.wait_for(2)
            clock.advance(500)
            seen.wait_for(3)
        finally:
            ssc.stop(stopSparkContext=False)
    finally:
        spark_context._jsc.sc().conf().remove("spark.sparkwal.emptyBatch.shortcut")
    assert [records for _, records in outputs] == [[("a", 1), ("b", 2)], [("c", 1)], []]
    empty_partitions, _ = outputs[2]
    if shortcut:  # nothing built over the empty input, no task run for it
        assert empty_partitions == 0 and seen.ops[1500].breakdown == {}
    else:  # Spark's: the shuffle's partitions, each an (empty) task
        assert empty_partitions == 2 and set(seen.ops[1500].breakdown) == {"submit", "tasks", "collect"}
