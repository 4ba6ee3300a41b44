"""Where a batch's time goes: the driver's steps of each batch timed as they run, and each
output operation's Spark job split by its stages' submission times (the phases are named in
:data:`sparkwal.tracker.input_info.BATCH_PHASES` and ``OPERATION_PHASES``).

Durations are real elapsed time (``time.perf_counter``), whatever clock drives the batches (a
``ManualClock`` in tests moves batch times, not the work's duration). Spark's stage submission
times are its wall clock's, so an operation's phases are measured against ``time.time()``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from functools import partial
from typing import Any

from ..driver_rows import DriverRowsRDD


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


class Phases:
    """A batch's phase durations in ms, in the order they ran; a phase run twice adds up."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        self.ms.setdefault(name, 0.0)  # listed in the order the phases began (an outer one first)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = round(self.ms.get(name, 0.0) + _ms(time.perf_counter() - start), 1)


class RecentDurations:
    """The last ``keep`` durations recorded by batch time (a checkpoint's write, read once its
    batch completes); older ones are forgotten, so memory stays bounded."""

    def __init__(self, keep: int = 256) -> None:
        self._keep = keep
        self._ms: OrderedDict[int, float] = OrderedDict()
        self._lock = threading.Lock()  # recorded on the checkpoint writer's thread, read on a job's

    def record(self, time_ms: int, took_ms: float) -> None:
        with self._lock:
            if time_ms not in self._ms:  # a batch time's first write is the one its batch waits on
                self._ms[time_ms] = took_ms
                while len(self._ms) > self._keep:
                    self._ms.popitem(last=False)

    def get(self, time_ms: int) -> float | None:
        with self._lock:
            return self._ms.get(time_ms)


def batch_paths(graph, time_ms: int, input_infos: dict) -> dict[str, str]:
    """Where batch ``time_ms``'s work ran, per receiver stream and per state
    (:data:`sparkwal.tracker.input_info.BATCH_PATHS`), from its input reports and its RDDs."""
    paths = {}
    for stream in graph.inputs:
        info = input_infos.get(stream.input_id)
        if stream.receiver_based and info is not None:
            paths[stream.creation_site] = ("per-block" if info.metadata.get("perBlock") else
                                           "precomputed" if info.metadata.get("precomputed") else "executors")
    for stream in graph.streams:
        rdd = stream.generated_rdds.get(time_ms) if stream.must_checkpoint else None
        if rdd is not None:
            paths[stream.creation_site] = "driver" if isinstance(rdd, DriverRowsRDD) else "executors"
    return paths


class SparkJobs:
    """A context's Spark jobs and stages, from Java's ``SparkStatusTracker`` in few Py4J calls
    (each is a round trip to the JVM, and a 100 ms batch has few to spare): the tracker is looked
    up once, and an id array comes back as one string instead of one call per element."""

    def __init__(self, sc) -> None:
        self._sc = sc
        self._tracker: Any = None
        self._store: Any = None
        self._to_string: Any = None

    def _ints(self, java_array) -> list[int]:
        if self._to_string is None:
            self._to_string = getattr(self._sc._jvm, "java.util.Arrays").toString
        text = self._to_string(java_array) if java_array is not None else "[]"
        return [int(part) for part in text.strip("[]").split(",") if part.strip()]

    def tracker(self):
        if self._tracker is None:
            self._tracker = self._sc._jsc.statusTracker()
        return self._tracker

    def job_ids(self, group: str) -> tuple[int, ...]:
        """The Spark jobs of a job group (none once Spark forgot them, or the context stops)."""
        try:
            return tuple(sorted(self._ints(self.tracker().getJobIdsForGroup(group))))
        except Exception:  # noqa: BLE001 (a stopping SparkContext: the ids are only for show)
            return ()

    def operation_phases(self, job_ids: tuple[int, ...], start_wall_ms: float, end_wall_ms: float) -> dict:
        """An output operation's ``submit``, ``tasks`` and ``collect`` in ms, from the submission
        times of its jobs' stages; empty when Spark has no times for them."""
        if not job_ids:
            return {}
        submitted = []
        try:
            tracker = self.tracker()
            for job_id in job_ids:
                job = tracker.getJobInfo(job_id)
                stage_ids = self._ints(job.stageIds()) if job is not None else []
                submitted.extend(self._stages_run(tracker, stage_ids, partial(self._stages_ran, job_id)))
        except Exception:  # noqa: BLE001 (a stopping SparkContext: the phases are only for show)
            return {}
        if not submitted:
            return {}
        first = max(min(submitted), start_wall_ms)
        last = min(max(max(submitted), first), end_wall_ms)
        return {"submit": round(first - start_wall_ms, 1), "tasks": round(last - first, 1),
                "collect": round(end_wall_ms - last, 1)}

    def _stages_ran(self, job_id: int) -> int | None:
        """How many of a job's stages ran, from Spark's status store (the one behind the status tracker,
        which has no such count); None if it has not seen the job. Its stages completed (distinct ids: a
        stage run again after a fetch failure counts once) and active (a store behind the job's events
        has the last ones submitted, not yet completed): stages whose submission it has not applied yet
        have no time to find either."""
        try:
            if self._store is None:
                self._store = self._sc._jsc.sc().statusStore()
            job = self._store.job(job_id)
            return int(job.numCompletedStages()) + int(job.numActiveStages())
        except Exception:  # noqa: BLE001 (forgotten, not seen yet, or a stopping SparkContext)
            return None

    @staticmethod
    def _stages_run(tracker, stage_ids: list[int], ran_count=lambda: None) -> list[int]:
        """The submission times of a job's stages that ran. A job's stage ids include every shuffle
        stage of its lineage, skipped ones too (their output was there: no submission time), and
        a state's lineage adds a skipped stage per batch back to its last snapshot: two Py4J calls
        each: 14% of the job thread's time at 250 ms stateful batches here, 1% when asked this way.
        Spark creates the result stage last (the job's highest id) and its parents' stages in the
        order of a hash set (``DAGScheduler.getOrCreateParentStages``): the batch's own shuffle is
        often the job's lowest id, below the lineage's skipped ones (mapWithState's), or anywhere
        among them. So stages are asked from each end up to the first skipped one, and only if that
        found fewer than ``ran_count()`` (Spark's count of the job's stages that ran), the rest,
        newest first, until it has them all: a shuffle among the skipped ones costs the ids above it."""
        ids = sorted(stage_ids, reverse=True)
        times: list[int] = []
        asked: set[int] = set()
        skipped = False

        def ask(stage_id: int) -> bool:
            asked.add(stage_id)
            stage = tracker.getStageInfo(stage_id)
            when = stage.submissionTime() if stage is not None else -1
            if when is None or when <= 0:  # skipped (its output was there), or forgotten by Spark
                return False
            times.append(when)
            return True

        for order in (ids, ids[::-1]):
            for stage_id in order:
                if stage_id in asked:
                    break
                if not ask(stage_id):
                    skipped = True
                    break
        ran = ran_count() if skipped else None
        for stage_id in ids:
            if ran is None or len(times) >= ran:
                break
            if stage_id not in asked:
                ask(stage_id)
        return times
