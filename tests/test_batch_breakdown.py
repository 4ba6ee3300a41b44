"""An output operation's phases (``submit``, ``tasks``, ``collect``) come from the submission
times of the stages its Spark jobs ran, asked of Spark's status tracker. A state's lineage grows
by a skipped stage per batch; the question must not grow with it (each stage asked is two Py4J
calls on the batch's job thread)."""

from __future__ import annotations

import time

import pytest

from sparkwal.engine.driver.breakdown import SparkJobs


class CountingTracker:
    """Spark's Java status tracker, with the stages asked of it counted."""

    def __init__(self, tracker):
        self._tracker, self.stages_asked = tracker, 0

    def getJobIdsForGroup(self, group):
        return self._tracker.getJobIdsForGroup(group)

    def getJobInfo(self, job_id):
        return self._tracker.getJobInfo(job_id)

    def getStageInfo(self, stage_id):
        self.stages_asked += 1
        return self._tracker.getStageInfo(stage_id)


class CountedJobs(SparkJobs):
    def __init__(self, sc):
        super().__init__(sc)
        self.counting = CountingTracker(sc._jsc.statusTracker())

    def tracker(self):
        return self.counting



def the_batch(sc, run):
    """``run()`` as a batch's output operation: in a job group of its own, timed; returns the counted
    jobs, the group's job ids, their phases and the wall clock's start and end (ms)."""
    group = f"breakdown-{time.monotonic_ns()}"
    sc.setJobGroup(group, "the batch")
    start_ms = time.time() * 1000
    try:
        run()
    finally:
        end_ms = time.time() * 1000
        sc.setLocalProperty("spark.jobGroup.id", None)
    jobs = CountedJobs(sc)
    job_ids = jobs.job_ids(group)
    return jobs, job_ids, jobs.operation_phases(job_ids, start_ms, end_ms), start_ms, end_ms


@pytest.mark.slow
def test_phases_ask_only_the_stages_a_job_ran_however_long_its_lineage(spark_context):
    sc = spark_context
    state = sc.parallelize(range(100), 2).map(lambda x: (x % 5, x)).reduceByKey(lambda a, b: a + b).cache()
    state.count()
    for _batch in range(8):  # as a state does: each batch's shuffle over the previous, cached
        state = state.union(sc.parallelize([(1, 1)], 1)).reduceByKey(lambda a, b: a + b).cache()
        state.count()
    jobs, job_ids, phases, start_ms, end_ms = the_batch(
        sc, lambda: state.union(sc.parallelize([(2, 2)], 1)).reduceByKey(lambda a, b: a + b).collect())
    tracker = sc._jsc.statusTracker()
    stage_ids = [s for j in job_ids for s in tracker.getJobInfo(j).stageIds()]
    ran = sorted(tracker.getStageInfo(s).submissionTime() for s in stage_ids
                 if tracker.getStageInfo(s).submissionTime() > 0)
    assert len(stage_ids) >= 10 and len(ran) == 2  # the lineage's 9 shuffles skipped; this batch's shuffle and result
    assert jobs.counting.stages_asked == len(ran) + 2  # the stages that ran, and the first skipped one from each end
    assert phases == {"submit": round(ran[0] - start_ms, 1), "tasks": round(ran[-1] - ran[0], 1),
                      "collect": round(end_ms - ran[-1], 1)}
    assert all(v >= 0 for v in phases.values()) and sum(phases.values()) <= end_ms - start_ms + 0.5


@pytest.mark.slow
def test_phases_find_a_batch_shuffle_created_below_the_lineage_skipped_stages(spark_context):
    """mapWithState's shape: the cached state unioned with the batch's records moved to its partitions,
    then a narrow update. Spark creates the batch's map stage in a hash set's order among the lineage's
    (skipped) ones, often below them all, where the walk from the highest id down never reached it."""
    sc = spark_context
    seeds = sc.parallelize([(i, None) for i in range(2)], 2).partitionBy(2)
    state = seeds.mapPartitions(lambda rows: [sum(1 for _ in rows)], preservesPartitioning=True).cache()
    state.count()
    for batch in range(8):  # each batch: the batch's records shuffled to the state's partitions, then updated
        data = sc.parallelize([(batch, 1)], 1).partitionBy(2)
        state = state.union(data).mapPartitions(lambda rows: [sum(1 for _ in rows)], preservesPartitioning=True).cache()
        state.count()
    jobs, job_ids, phases, start_ms, end_ms = the_batch(sc, lambda: state.union(
        sc.parallelize([(9, 1)], 1).partitionBy(2)).mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect())
    tracker = sc._jsc.statusTracker()
    stage_ids = sorted(s for j in job_ids for s in tracker.getJobInfo(j).stageIds())
    submitted = {s: tracker.getStageInfo(s).submissionTime() for s in stage_ids}
    ran = sorted(t for t in submitted.values() if t > 0)
    assert len(stage_ids) >= 10 and len(ran) == 2  # the lineage's shuffles skipped; this batch's shuffle and result
    # (where the batch's shuffle sits among the job's ids is a hash set's order: often the lowest, any of them)
    assert jobs.counting.stages_asked <= len(stage_ids)  # each at most once
    assert phases == {"submit": round(ran[0] - start_ms, 1), "tasks": round(ran[-1] - ran[0], 1),
                      "collect": round(end_ms - ran[-1], 1)}


class Stage:
    def __init__(self, submitted_ms):
        self._submitted_ms = submitted_ms

    def submissionTime(self):
        return self._submitted_ms


class StagesTracker:
    """A job's stages as Spark's status tracker gives them: a submission time, or none (skipped)."""

    def __init__(self, submitted: dict[int, int]):
        self.submitted, self.asked = submitted, []

    def getStageInfo(self, stage_id):
        self.asked.append(stage_id)
        return Stage(self.submitted[stage_id])


@pytest.mark.parametrize("shuffle_id", [0, 3, 5, 8])
def test_a_batch_shuffle_anywhere_among_the_skipped_stages_is_found_by_its_job_count(shuffle_id):
    """Spark creates a job's parent stages in a hash set's order: the batch's shuffle may be anywhere
    among the lineage's skipped ones. Spark's count of the stages that ran finds it, asked only when
    a skipped stage was met."""
    submitted = {i: -1 for i in range(10)}
    submitted[9], submitted[shuffle_id] = 2_000, 1_000  # the result stage (the highest id) and the shuffle
    tracker = StagesTracker(submitted)
    counted = []

    def ran_count():
        counted.append(True)
        return 2

    assert sorted(SparkJobs._stages_run(tracker, list(submitted), ran_count)) == [1_000, 2_000]
    assert counted == [True] and len(tracker.asked) == len(set(tracker.asked))  # no stage asked twice
    # without a count (Spark has forgotten the job), the ends alone
    found = SparkJobs._stages_run(StagesTracker(submitted), list(submitted))
    assert found == ([2_000, 1_000] if shuffle_id in (0, 8) else [2_000])


def test_a_job_with_no_skipped_stage_is_asked_once_per_stage_and_not_counted():
    tracker = StagesTracker({1: 100, 2: 200, 3: 300})
    assert sorted(SparkJobs._stages_run(tracker, [1, 2, 3], lambda: pytest.fail("counted"))) == [100, 200, 300]
    assert sorted(tracker.asked) == [1, 2, 3]


def test_a_count_behind_the_stages_found_stops_the_walk_and_one_ahead_asks_each_stage_once():
    """Spark's status store applies events after the job's thread wakes: its count may be behind (the walk
    stops with what it found) or, having caught up since a stage was asked, ahead (each stage asked once)."""
    submitted = {i: -1 for i in range(10)}
    submitted[9], submitted[4] = 2_000, 1_000
    behind = StagesTracker(submitted)
    assert SparkJobs._stages_run(behind, list(submitted), lambda: 1) == [2_000]
    assert len(behind.asked) == 3  # the result, the first skipped below it, the lowest id
    ahead = StagesTracker(submitted)
    assert sorted(SparkJobs._stages_run(ahead, list(submitted), lambda: 3)) == [1_000, 2_000]
    assert sorted(ahead.asked) == list(range(10))
