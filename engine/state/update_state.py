"""The key-value state streams of the DStream API: ``updateStateByKey`` and the incremental
``reduceByKeyAndWindow`` (their state is snapshotted through :class:`KeyValueState`).

``updateStateByKey``'s batch (:func:`update_by_key`): the state stays hash-partitioned between
batches, so only the batch's records are shuffled, grouped by key into one record per partition
(:class:`_Batch`), and the JVM zips that record with the state's partition (a union of two RDDs
partitioned alike). One Python pass then reads the group first and streams the state after it,
calling the function once per key: no shuffle, tagging or merging of the state itself, where
PySpark's ``cogroup`` passes the whole state through Python twice and through its spilling
merger. The batch's groups of one partition are held in memory (the state is not)."""

from __future__ import annotations

from functools import partial

from pyspark import RDD, StorageLevel

from ..dstream import DStream
from ..errors import StateError
from . import versions
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
        previous = self.get_or_compute(previous_end) if self.has_state_before(previous_end) else None
        if previous is not None and self.window_ms >= 5 * self.slide_ms:
            old = parent.rdds_between(previous_begin + parent.slide_ms, current_begin)
            subtracted = self._inv(previous, self._sc.union(old)) if old else previous
            new = parent.rdds_between(previous_end + parent.slide_ms, time_ms)
            return self._reduce(subtracted, self._sc.union(new)) if new else subtracted
        current = parent.rdds_between(current_begin + parent.slide_ms, time_ms)
        return self._reduce(None, self._sc.union(current)) if current else None


class StateDStream(KeyValueState, DStream):
    """updateStateByKey: the state at ``t`` = ``func(state at t - slide, batch at t)``."""

    state_operator = "updateStateByKey"
    num_partitions: int | None = None  # the state's (None: a graph pickled before it was kept)
    transient_fields = (*DStream.transient_fields, "_initial")  # a restart restores the state instead

    def __init__(self, ssc, parent: DStream, func, initial: RDD | None):
        super().__init__(ssc, [parent])
        self._func = func
        self._initial = initial
        self.must_checkpoint = True
        self.storage_level = StorageLevel.MEMORY_ONLY

    def compute(self, time_ms: int) -> RDD | None:
        previous = self.previous_batch_ms(time_ms)
        last = self.get_or_compute(previous) if self.has_state_before(previous) else None
        rdd = self.dependencies[0].get_or_compute(time_ms)
        if rdd is None:
            return last
        return self._func(last if last is not None else self._initial, rdd)


class _Batch:
    """One partition of a batch, its values grouped by key: the first record of the union that
    :func:`_update_partition` reads (no state record is of this type)."""

    __slots__ = ("values",)

    def __init__(self, values: dict):
        self.values = values

    def __getstate__(self):
        return self.values

    def __setstate__(self, values):
        self.values = values


def _group(records):
    values: dict = {}
    for k, v in records:
        vs = values.get(k)
        if vs is None:
            values[k] = [v]
        else:
            vs.append(v)
    yield _Batch(values)


def _update_partition(records, func):
    it = iter(records)
    first = next(it, None)
    if type(first) is not _Batch:
        raise StateError("updateStateByKey: a state partition without its batch group first")
    new = first.values
    for k, state in it:
        out = func(new.pop(k, None) or [], state)
        if out is not None:
            yield k, out
    for k, vs in new.items():
        out = func(vs, None)
        if out is not None:
            yield k, out


def _update_by_cogroup(state: RDD, batch: RDD, func, n: int) -> RDD:
    grouped = state.cogroup(batch.partitionBy(n), n)
    pairs = grouped.mapValues(lambda ab: (list(ab[1]), list(ab[0])[0] if len(ab[0]) else None))
    return pairs.mapValues(lambda vs_s: func(vs_s[0], vs_s[1])).filter(lambda kv: kv[1] is not None)


def update_by_key(func, n: int):
    """``updateStateByKey``'s step ``(state RDD or None, batch RDD) -> state RDD``, partitioned by
    ``portable_hash`` into ``n``: ``func(new_values, last_state)`` once per key of either side,
    None dropping the key."""

    def step(state: RDD | None, batch: RDD) -> RDD:
        grouped = batch.partitionBy(n).mapPartitions(_group, preservesPartitioning=True)
        both = grouped
        if state is not None:
            both = grouped.union(state.partitionBy(n))  # a no-op when partitioned already
            if both.getNumPartitions() != n:  # the JVM did not zip them: PySpark's way
                return _update_by_cogroup(state, batch, func, n)
        return both.mapPartitions(partial(_update_partition, func=func), preservesPartitioning=True)

    return step


def reduce_by_key_and_window(reduced: DStream, reduce_func, inv_reduce_func, window_ms: int,
                             slide_ms: int) -> DStream:
    """An inverse ``reduceByKeyAndWindow`` over the per-batch ``reduced`` stream."""
    return ReducedWindowedDStream(reduced.context(), reduced, reduce_func, inv_reduce_func,
                                  window_ms, slide_ms)


def update_state_by_key(parent: DStream, update_func, num_partitions: int, initial: RDD | list | None,
                        state_version: int = 1, migrate=None) -> DStream:
    rdd = parent.context().sparkContext.parallelize(initial) if isinstance(initial, list) else initial
    version = versions.check(state_version, migrate)
    stream = StateDStream(parent.context(), parent, update_by_key(update_func, num_partitions), rdd)
    stream.state_version, stream.state_migrate = version
    stream.num_partitions = num_partitions
    return stream
