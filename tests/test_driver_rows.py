"""Rows the driver holds (a precomputed batch, a state on the driver, its snapshots): the actions and
the steps over them run on the driver with no Spark job, and give what Spark gives for the same rows
parallelized; what must run in Spark tasks (``foreach``, a function that raises, a shuffle) still does."""

from __future__ import annotations

import itertools
import operator
import os
import random
import sys

import pytest
from py4j.protocol import Py4JJavaError
from pyspark import TaskContext, cloudpickle
from pyspark.errors import PythonException

from sparkwal.engine.driver_rows import DriverRowsRDD, on_executors, sliced_as_parallelize

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.compat  # (PySpark's internals it builds on: every supported version)

ROWS = [(f"k{i % 7}", i) for i in range(103)]

#: actions PySpark builds on mapPartitionsWithIndex and collect/count/take: none runs a Spark job here
ON_DRIVER = {
    "map collect": lambda r: r.map(lambda kv: (kv[0], kv[1] * 2)).collect(),
    "filter count": lambda r: r.filter(lambda kv: kv[1] % 3 == 0).count(),
    "flatMap take": lambda r: r.flatMap(lambda kv: [kv[0]] * (kv[1] % 3)).take(5),
    "values sum": lambda r: r.values().sum(),
    "reduce": lambda r: r.map(lambda kv: kv[1]).reduce(operator.add),
    "glom": lambda r: r.glom().collect(),
    "a step's partitions": lambda r: [list(p) for _, p in r.filter(lambda kv: kv[1] % 2).partition_iterators()]
    if isinstance(r, DriverRowsRDD) else r.filter(lambda kv: kv[1] % 2).glom().collect(),
    "partition index": lambda r: r.mapPartitionsWithIndex(lambda i, it: [(i, sum(1 for _ in it))]).collect(),
    "countByKey": lambda r: dict(r.countByKey()),
    "top": lambda r: r.map(lambda kv: kv[1]).top(3),
    "steps of steps": lambda r: r.map(lambda kv: kv[1]).filter(lambda v: v > 50).map(str).collect(),
    "zipWithIndex": lambda r: r.keys().zipWithIndex().collect(),
    "first, isEmpty": lambda r: (r.values().first(), r.keys().isEmpty(), r.filter(lambda kv: False).isEmpty()),
    "stats": lambda r: r.values().stats().asDict(),
    "collectAsMap": lambda r: r.mapValues(lambda v: -v).collectAsMap(),
    "aggregate, a mutable zero": lambda r: sorted(r.values().aggregate([], lambda a, v: (a.append(v), a)[1],
                                                                       lambda a, b: (a.extend(b), a)[1])),
    "fold, a mutable zero": lambda r: sorted(r.map(lambda kv: [kv[1]]).fold([], lambda a, b: (a.extend(b), a)[1])),
    "sample": lambda r: r.sample(False, 0.3, seed=7).collect(),
    "take of an endless step": lambda r: r.flatMap(lambda kv: itertools.count(kv[1])).take(3),
}

#: steps that need the JVM side (a shuffle, a union, a zip): Spark runs them, over the steps before
IN_SPARK = {
    "reduceByKey": lambda r: sorted(r.map(lambda kv: (kv[0], 1)).reduceByKey(operator.add).collect()),
    "partitionBy glom": lambda r: [sorted(p) for p in r.mapValues(lambda v: v + 1).partitionBy(3).glom().collect()],
    "union": lambda r: sorted(r.values().union(r.context.parallelize([1000, 1001])).collect()),
    "zip": lambda r: r.keys().zip(r.values().map(lambda v: v * 10)).collect(),
    "sortBy": lambda r: r.sortBy(lambda kv: -kv[1]).take(4),
    "distinct": lambda r: sorted(r.keys().distinct().collect()),
}


def _jobs(sc, group: str, action):
    sc.setJobGroup(group, "reads of rows the driver holds")
    try:
        result = action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


@pytest.mark.parametrize("name", ON_DRIVER)
def test_steps_and_actions_over_the_drivers_rows_run_no_job_and_give_what_spark_gives(spark_context, name):
    action = ON_DRIVER[name]
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=4)
    result, jobs = _jobs(spark_context, f"driver-rows-{name}", lambda: action(rdd))
    assert (result, jobs) == (action(spark_context.parallelize(ROWS, 4)), 0)
    assert not rdd.jvm_side_built


@pytest.mark.parametrize("name", IN_SPARK)
def test_steps_that_need_the_jvm_run_in_spark_over_the_steps_before(spark_context, name):
    action = IN_SPARK[name]
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=4)
    result, jobs = _jobs(spark_context, f"driver-rows-{name}", lambda: action(rdd))
    assert result == action(spark_context.parallelize(ROWS, 4)) and jobs >= 1


def test_a_step_reserialized_for_the_jvm_saves_what_spark_saves(spark_context, tmp_path):
    """saveAsPickleFile (as createDataFrame) gives the step a serializer of its own before building it."""
    step = DriverRowsRDD(spark_context, ROWS, num_partitions=3).mapValues(lambda v: -v)
    step.saveAsPickleFile(str(tmp_path / "saved"), batchSize=7)
    assert sorted(spark_context.pickleFile(str(tmp_path / "saved")).collect()) == sorted((k, -v) for k, v in ROWS)


def test_the_partitions_are_parallelizes(spark_context):
    """Batches of rows sliced as the JVM slices them: past 1,024 rows a partition, uneven."""
    for n in (1, 3, 4):
        for size in (0, 1, 3, 10, 11, 4100, 5000):
            rows = list(range(size))
            expected = spark_context.parallelize(rows, n).glom().collect()
            assert sliced_as_parallelize(spark_context, rows, n) == expected, (size, n)
    assert [len(p) for p in sliced_as_parallelize(spark_context, list(range(5000)), 2)] == [2048, 2952]


def test_a_step_that_changes_its_rows_never_changes_the_drivers(spark_context):
    rows = [("a", [1]), ("b", [2])]
    rdd = DriverRowsRDD(spark_context, rows, num_partitions=2)
    assert rdd.map(lambda kv: kv[1].append(0) or kv).collect() == [("a", [1, 0]), ("b", [2, 0])]
    rdd.collect()[0][1].append(9)
    rdd.take(1)[0][1].append(9)
    assert rdd.collect() == [("a", [1]), ("b", [2])] and rows == [("a", [1]), ("b", [2])]
    kept = rdd.map(lambda kv: kv).cache()
    kept.collect()[0][1].append(5)
    assert kept.collect() == [("a", [1]), ("b", [2])]


def test_a_function_that_raises_runs_in_spark_with_its_error(spark_context):
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=2)
    failing = rdd.map(lambda kv: 1 // (kv[1] - 50))
    with pytest.raises((Py4JJavaError, PythonException), match="ZeroDivisionError"):  # (the latter once a
        # SparkSession exists in the process: PySpark's SQL converts every job's error)
        _jobs(spark_context, "driver-rows-raises", failing.collect)
    assert len(spark_context.statusTracker().getJobIdsForGroup("driver-rows-raises")) == 1


def test_a_failed_run_on_the_driver_adds_nothing_to_accumulators(spark_context):
    """As in Spark, only what succeeded adds: a function that needs a task adds once, in Spark's tasks."""
    added = spark_context.accumulator(0)
    rdd = DriverRowsRDD(spark_context, list(range(10)), num_partitions=2)
    step = rdd.map(lambda v: (added.add(1), TaskContext.get().partitionId())[1])  # (None on the driver: raises)
    result, jobs = _jobs(spark_context, "driver-rows-needs-a-task", step.collect)
    assert (result, jobs, added.value) == ([0] * 5 + [1] * 5, 1, 10)


def test_chained_steps_share_what_they_captured_as_in_a_task(spark_context):
    seen: set = set()
    steps = lambda r: r.filter(lambda v: v not in seen).map(lambda v: (seen.add(v), v)[1])  # noqa: E731
    on_driver = steps(DriverRowsRDD(spark_context, [1, 1, 2], num_partitions=1)).collect()
    assert on_driver == steps(spark_context.parallelize([1, 1, 2], 1)).collect() == [1, 2] and seen == set()


def test_steps_read_the_executors_environment_in_spark(spark_context, monkeypatch):
    monkeypatch.setitem(spark_context.environment, "SPARKWAL_TEST_ONLY_EXECUTORS", "theirs")
    rdd = DriverRowsRDD(spark_context, [1, 2], num_partitions=2)
    result, jobs = _jobs(spark_context, "driver-rows-environment",
                         rdd.map(lambda _: os.environ.get("SPARKWAL_TEST_ONLY_EXECUTORS", "driver's")).collect)
    assert (result, jobs) == (["theirs", "theirs"], 1)


def test_a_locally_checkpointed_step_is_worked_out_once(spark_context):
    """A stream's lineage cut (localCheckpoint): every output of the batch reads the same rows."""
    step = DriverRowsRDD(spark_context, list(range(20)), num_partitions=2).map(lambda _: random.random())
    step.localCheckpoint()
    assert step.collect() == step.collect()


def test_foreach_runs_in_spark_tasks(spark_context):
    seen = spark_context.accumulator(0)
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=2)
    _, jobs = _jobs(spark_context, "driver-rows-foreach", lambda: rdd.values().foreach(lambda v: seen.add(v)))
    assert seen.value == sum(range(103)) and jobs == 1
    _, jobs = _jobs(spark_context, "driver-rows-foreachPartition",
                    lambda: rdd.foreachPartition(lambda it: seen.add(sum(1 for _ in it))))
    assert seen.value == sum(range(103)) + 103 and jobs == 1


def test_broadcasts_and_accumulators_are_the_drivers(spark_context):
    table, seen = spark_context.broadcast({i: -i for i in range(103)}), spark_context.accumulator(0)
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=3)
    step = rdd.map(lambda kv: (seen.add(1), table.value[kv[1]])[1])
    result, jobs = _jobs(spark_context, "driver-rows-broadcast", step.collect)
    assert (result, jobs, seen.value) == ([-i for i in range(103)], 0, 103)


def test_the_sinks_tasks_run_in_spark_with_their_attempts(spark_context):
    """on_executors (the exactly-once sinks' writes): a task's attempt id names what it writes."""
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=2)
    in_task = lambda i, it: [(i, TaskContext.get() is not None, sum(1 for _ in it))]  # noqa: E731
    result, jobs = _jobs(spark_context, "driver-rows-sink", on_executors(rdd).mapPartitionsWithIndex(in_task).collect)
    assert (result, jobs) == ([(0, True, 51), (1, True, 52)], 1)
    assert on_executors(spark_context.parallelize([1])).collect() == [1]  # any other RDD: itself


def test_a_step_is_worked_out_for_each_action_and_its_function_copied_per_partition(spark_context):
    calls = []
    rdd = DriverRowsRDD(spark_context, [1, 2, 3, 4], num_partitions=2)
    step = rdd.mapPartitions(lambda it: [calls.append(1) or len(calls) for _ in it])
    assert step.collect() == [1, 2, 1, 2] and step.count() == 4  # each partition's own copy of calls
    assert calls == [] and step.take(0) == []  # (the driver's never changes; take(0) runs nothing)


def test_persisted_steps_are_sparks(spark_context):
    rdd = DriverRowsRDD(spark_context, ROWS, num_partitions=2)
    kept = rdd.values().cache()
    try:
        result, jobs = _jobs(spark_context, "driver-rows-persisted", lambda: (kept.sum(), kept.count()))
        assert result == (sum(range(103)), 103) and jobs == 2  # the executors keep it, as asked
        assert kept.map(lambda v: v + 1).collect() == [v + 1 for v in range(103)]
    finally:
        kept.unpersist()
