"""The key-value state streams of the DStream API: ``updateStateByKey`` and the incremental
``reduceByKeyAndWindow`` (their state is snapshotted through :class:`KeyValueState`)."""

from __future__ import annotations

from pyspark import RDD, StorageLevel

from ..dstream import DStream
from .kv_rows import KeyValueState


class ReducedWindowedDStream(KeyValueState, DStream):
    """Spark's incremental windowed reduce: the window at ``t`` is the one at ``t - slide`` minus
    the batches that left it plus the ones that entered it (when that is cheaper than reducing
    the whole window, i.e. the window spans at least 5 slides)."""

    state_operator = "reduceByKeyAndWindow"

    def __init__(self, ssc, reduced: DStream, reduce_func, inv_reduce_func, window_ms: int, slide_ms: int):
        super().__init__(ssc, [reduced], slide_ms)
        self.window_ms = window_ms
        self._reduce = reduce_func
        self._inv = inv_reduce_func
        self.must_checkpoint = True
        self.storage_level = StorageLevel.MEMORY_ONLY
        if reduced.storage_level is None:
            reduced.persist(StorageLevel.MEMORY_ONLY)

    def parent_remember_ms(self) -> int:
        return self.remember_ms + self.window_ms

    def compute(self, time_ms: int) -> RDD | None:
        parent = self.dependencies[0]
        current_begin = time_ms - self.window_ms
        previous_end = time_ms - self.slide_ms
        previous_begin = current_begin - self.slide_ms
        previous = self.get_or_compute(previous_end) if previous_end > self.zero_time_ms else None
        if previous is not None and self.window_ms >= 5 * self.slide_ms:
            old = parent._slice_ms(previous_begin + parent.slide_ms, current_begin)
            subtracted = self._inv(previous, self._sc.union(old)) if old else previous
            new = parent._slice_ms(previous_end + parent.slide_ms, time_ms)
            return self._reduce(subtracted, self._sc.union(new)) if new else subtracted
        current = parent._slice_ms(current_begin + parent.slide_ms, time_ms)
        return self._reduce(None, self._sc.union(current)) if current else None


class StateDStream(KeyValueState, DStream):
    """updateStateByKey: the state at ``t`` = ``func(state at t - slide, batch at t)``."""

    state_operator = "updateStateByKey"
    _transient = (*DStream._transient, "_initial")  # a restart restores the state instead

    def __init__(self, ssc, parent: DStream, func, initial: RDD | None):
        super().__init__(ssc, [parent])
        self._func = func
        self._initial = initial
        self.must_checkpoint = True
        self.storage_level = StorageLevel.MEMORY_ONLY

    def compute(self, time_ms: int) -> RDD | None:
        previous = time_ms - self.slide_ms
        last = self.get_or_compute(previous) if previous > self.zero_time_ms else None
        rdd = self.dependencies[0].get_or_compute(time_ms)
        if rdd is None:
            return last
        return self._func(last if last is not None else self._initial, rdd)
