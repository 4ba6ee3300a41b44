"""DStream: a sequence of RDDs, one per batch time, built by transformations on PySpark RDDs.

The API mirrors ``pyspark.streaming.DStream`` (durations in seconds, ``time`` arguments of user
functions as ``datetime``); the machinery mirrors Spark's DStream: each stream generates at most one
RDD per valid batch time (a multiple of its slide duration after the zero time), remembers
generated RDDs for ``remember`` milliseconds, and forgets (and unpersists) older ones.
"""

from __future__ import annotations

import operator
from datetime import datetime
from itertools import chain
from typing import Any, Callable, NamedTuple

from pyspark import RDD, StorageLevel
from pyspark.rdd import portable_hash
from pyspark.resultiterable import ResultIterable

from . import config
from .stream_machinery import StreamMachinery, empty_rdd, known_empty, per_record


def to_ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def describe_times(times_ms: list[int]) -> str:
    """A count and a range of batch times, for a person: ``3 batches (12:00:01 .. 12:00:03)``."""
    if not times_ms:
        return "no batches"
    clock = [_time(t).strftime("%H:%M:%S") for t in (min(times_ms), max(times_ms))]
    span = clock[0] if len(times_ms) == 1 else f"{clock[0]} .. {clock[1]}"
    return f"{len(times_ms)} batch{'es' if len(times_ms) != 1 else ''} ({span})"


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0)


def arity(func: Callable) -> int:
    """How many positional arguments ``func`` takes (pyspark.streaming's rule for ``foreachRDD``'s ``func``)."""
    code = getattr(func, "__code__", None)
    return code.co_argcount - (1 if hasattr(func, "__self__") else 0) if code else 1


class Job(NamedTuple):
    """One output operation's work for one batch."""

    output_op_id: int
    op_name: str
    run: Callable[[], None]
    in_order: bool = False  #: after the same operation of every earlier batch (driver/output_order.py)


class DStream(StreamMachinery):
    """pyspark.streaming's DStream API over the machinery of :mod:`sparkwal.engine.stream_machinery`."""

    def stateful_stream(self, name: str, *args) -> DStream:
        """The stateful operation ``name`` (``updateStateByKey``, ``mapWithState``, an inverse
        ``reduceByKeyAndWindow``) over this stream. Their streams subclass DStream, so they are
        defined in :mod:`sparkwal.engine.state` (which imports this module), and the context hands
        them over: :attr:`sparkwal.engine.context.StreamingContext.stateful_operations`."""
        return self._ssc.stateful_operations[name](self, *args)

    # ------------------------------------------------------------------ pyspark.streaming API

    def context(self):
        """The StreamingContext this stream belongs to."""
        return self._ssc

    def transform(self, func: Callable) -> DStream:
        """``func(rdd)`` or ``func(time, rdd)`` -> RDD, applied to every RDD of this stream."""
        if arity(func) == 1:
            one = func

            def func(_t, rdd):  # noqa: F811
                return one(rdd)
        if arity(func) != 2:
            raise ValueError("func should take one or two arguments")
        return TransformedDStream(self._ssc, [self], lambda t, rdds: func(_time(t), rdds[0]))

    def transformWith(self, func: Callable, other: DStream, keepSerializer: bool = False) -> DStream:
        """``func(rdd_a, rdd_b)`` or ``func(time, rdd_a, rdd_b)`` -> RDD."""
        if arity(func) == 2:
            two = func

            def func(_t, a, b):  # noqa: F811
                return two(a, b)
        if arity(func) != 3:
            raise ValueError("func should take two or three arguments")
        return self.with_other(other, lambda t, rdds: func(_time(t), rdds[0], rdds[1]), keeps_empty=False)

    def with_other(self, other: DStream, func: Callable, keeps_empty: bool = True) -> DStream:
        """``func(time_ms, [rdd, other's rdd])``; ``keeps_empty``: it makes no records when both are
        empty (sparkwal's own operations: unions, joins, cogroups)."""
        if self.slide_ms != other.slide_ms:
            raise ValueError("the two DStream should have same slide duration")
        return TransformedDStream(self._ssc, [self, other], func, allow_missing=True, keeps_empty=keeps_empty)

    def _all_empty(self, rdds: list[RDD | None]) -> bool:
        """Whether a batch's parent RDDs (some may be missing) are all known empty and the
        shortcut is on (``spark.sparkwal.emptyBatch.shortcut``): then nothing need be built."""
        return (any(r is not None for r in rdds) and all(known_empty(r) for r in rdds)
                and self._driver.settings[config.EMPTY_BATCH_SHORTCUT])

    def _keeping_empty(self, func: Callable[[RDD], RDD]) -> DStream:
        """``func(rdd)`` applied by an operation that makes no records from an empty batch (its
        function runs per partition, or per key after a shuffle): an empty input's batch skips it."""
        return TransformedDStream(self._ssc, [self], lambda t, rdds: func(rdds[0]), keeps_empty=True)

    def mapPartitionsWithIndex(self, f: Callable, preservesPartitioning: bool = False) -> DStream:
        return self._keeping_empty(lambda rdd: rdd.mapPartitionsWithIndex(f, preservesPartitioning))

    def mapPartitions(self, f: Callable, preservesPartitioning: bool = False) -> DStream:
        stream = self.mapPartitionsWithIndex(lambda _, it: f(it), preservesPartitioning)
        stream.block_step = f  # per partition, index-free: a receiver may run it (receiver/precompute.py)
        return stream

    def map(self, f: Callable, preservesPartitioning: bool = False) -> DStream:
        return self.mapPartitions(per_record(lambda it: map(f, it)), preservesPartitioning)

    def flatMap(self, f: Callable, preservesPartitioning: bool = False) -> DStream:
        return self.mapPartitions(per_record(lambda it: chain.from_iterable(map(f, it))), preservesPartitioning)

    def filter(self, f: Callable) -> DStream:
        return self.mapPartitions(per_record(lambda it: filter(f, it)), True)

    def glom(self) -> DStream:
        return self.mapPartitions(lambda it: [list(it)])

    def mapValues(self, f: Callable) -> DStream:
        return self.map(lambda kv: (kv[0], f(kv[1])), preservesPartitioning=True)

    def flatMapValues(self, f: Callable) -> DStream:
        return self.flatMap(lambda kv: ((kv[0], x) for x in f(kv[1])), preservesPartitioning=True)

    def count(self) -> DStream:
        return self.mapPartitions(lambda it: [sum(1 for _ in it)]).reduce(operator.add)

    def reduce(self, func: Callable) -> DStream:
        return self.map(lambda x: (None, x)).reduceByKey(func, 1).map(lambda kv: kv[1])

    def countByValue(self) -> DStream:
        return self.map(lambda x: (x, 1)).reduceByKey(operator.add)

    def _partitions(self, numPartitions: int | None) -> int:
        return numPartitions if numPartitions is not None else self._sc.defaultParallelism

    def combineByKey(self, createCombiner: Callable, mergeValue: Callable, mergeCombiners: Callable,
                     numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        stream = self._keeping_empty(lambda rdd: rdd.combineByKey(createCombiner, mergeValue, mergeCombiners, n))
        stream.block_combine = (createCombiner, mergeValue, mergeCombiners, n)  # receiver/precompute.py
        return stream

    def reduceByKey(self, func: Callable, numPartitions: int | None = None) -> DStream:
        return self.combineByKey(lambda x: x, func, func, numPartitions)

    def groupByKey(self, numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        return self._keeping_empty(lambda rdd: rdd.groupByKey(n))

    def partitionBy(self, numPartitions: int, partitionFunc: Callable = portable_hash) -> DStream:
        return self._keeping_empty(lambda rdd: rdd.partitionBy(numPartitions, partitionFunc))

    def repartition(self, numPartitions: int) -> DStream:
        return self._keeping_empty(lambda rdd: rdd.repartition(numPartitions))

    def union(self, other: DStream) -> DStream:
        return self.with_other(other, lambda t, rdds: rdds[0].union(rdds[1]))

    def cogroup(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        return self.with_other(other, lambda t, rdds: rdds[0].cogroup(rdds[1], n))

    def join(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        return self.with_other(other, lambda t, rdds: rdds[0].join(rdds[1], n))

    def leftOuterJoin(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        return self.with_other(other, lambda t, rdds: rdds[0].leftOuterJoin(rdds[1], n))

    def rightOuterJoin(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        return self.with_other(other, lambda t, rdds: rdds[0].rightOuterJoin(rdds[1], n))

    def fullOuterJoin(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = self._partitions(numPartitions)
        return self.with_other(other, lambda t, rdds: rdds[0].fullOuterJoin(rdds[1], n))

    def cache(self) -> DStream:
        return self.persist(StorageLevel.MEMORY_ONLY)

    def persist(self, storageLevel: StorageLevel) -> DStream:
        self.storage_level = storageLevel
        return self

    def checkpoint(self, interval: float) -> DStream:
        """Checkpoint this stream's RDDs every ``interval`` seconds (bounds their lineage)."""
        self.checkpoint_ms = to_ms(interval)
        if self.storage_level is None:
            self.storage_level = StorageLevel.MEMORY_ONLY
        return self

    def foreachRDD(self, func: Callable) -> None:
        """Run ``func(rdd)`` or ``func(time, rdd)`` on every RDD (an output operation)."""
        if arity(func) == 1:
            one = func

            def func(_t, rdd):  # noqa: F811
                return one(rdd)
        ForEachDStream(self._ssc, self, func)

    def foreachBlock(self, func: Callable) -> None:
        """Run ``func(rdd)``, ``func(time, rdd)`` or ``func(time, block_id, rdd)`` on the rows of each
        receiver block as soon as the block is recorded, before its batch (an output operation; at least
        once, the same rows for the same block id; :mod:`sparkwal.engine.receiver.block_output`). For a
        stream the receivers can precompute: per-record operations from one receiver stream up to a
        ``reduceByKey``/``combineByKey``; ``time`` is the block's."""
        self._ssc.block_output_stream(self._ssc, self, func)

    def pprint(self, num: int = 10) -> None:
        def take_and_print(time: datetime, rdd: RDD) -> None:
            taken = rdd.take(num + 1)
            print(f"-------------------------------------------\nTime: {time}\n"
                  "-------------------------------------------")
            for record in taken[:num]:
                print(record)
            if len(taken) > num:
                print("...")
            print("")

        ForEachDStream(self._ssc, self, take_and_print, "pprint")

    def saveAsTextFiles(self, prefix: str, suffix: str | None = None) -> None:
        """Each batch to ``<prefix>-<time ms>[.<suffix>]``, idempotently: the batch is written
        under a hidden temporary name and renamed into place when complete, replacing what an
        earlier run of the same batch left, so a reader sees a whole batch or none."""

        def save(time: datetime, rdd: RDD) -> None:
            path = f"{prefix}-{int(round(time.timestamp() * 1000))}" + (f".{suffix}" if suffix else "")
            _save_text_atomically(rdd, path)

        ForEachDStream(self._ssc, self, save, "saveAsTextFiles")

    def slice(self, begin: datetime | float, end: datetime | float) -> list[RDD]:
        """The RDDs of this stream from ``begin`` to ``end`` (datetimes or epoch seconds)."""
        return self.rdds_between(*(int(round((x.timestamp() if isinstance(x, datetime) else x) * 1000))
                                   for x in (begin, end)))

    def _validate_window_param(self, window: float, slide: float | None) -> None:
        for name, value in (("windowDuration", window), ("slideDuration", slide)):
            if value and to_ms(value) % self.slide_ms != 0:
                raise ValueError(f"{name} must be multiple of the parent dstream's slide (batch) "
                                 f"duration ({self.slide_ms} ms)")

    def window(self, windowDuration: float, slideDuration: float | None = None) -> DStream:
        self._validate_window_param(windowDuration, slideDuration)
        return WindowedDStream(self._ssc, self, to_ms(windowDuration),
                               to_ms(slideDuration) if slideDuration else self.slide_ms)

    def reduceByWindow(self, reduceFunc: Callable, invReduceFunc: Callable | None,
                       windowDuration: float, slideDuration: float) -> DStream:
        keyed = self.map(lambda x: (1, x))
        reduced = keyed.reduceByKeyAndWindow(reduceFunc, invReduceFunc, windowDuration, slideDuration, 1)
        return reduced.map(lambda kv: kv[1])

    def countByWindow(self, windowDuration: float, slideDuration: float) -> DStream:
        return self.map(lambda x: 1).reduceByWindow(operator.add, operator.sub, windowDuration,
                                                    slideDuration)

    def countByValueAndWindow(self, windowDuration: float, slideDuration: float,
                              numPartitions: int | None = None) -> DStream:
        keyed = self.map(lambda x: (x, 1))
        counted = keyed.reduceByKeyAndWindow(operator.add, operator.sub, windowDuration, slideDuration,
                                             numPartitions)
        return counted.filter(lambda kv: kv[1] > 0)

    def groupByKeyAndWindow(self, windowDuration: float, slideDuration: float,
                            numPartitions: int | None = None) -> DStream:
        ls = self.mapValues(lambda x: [x])
        grouped = ls.reduceByKeyAndWindow(lambda a, b: a.extend(b) or a, lambda a, b: a[len(b):],
                                          windowDuration, slideDuration, numPartitions)
        return grouped.mapValues(ResultIterable)

    def reduceByKeyAndWindow(self, func: Callable, invFunc: Callable | None, windowDuration: float,
                             slideDuration: float | None = None, numPartitions: int | None = None,
                             filterFunc: Callable | None = None) -> DStream:
        """With ``invFunc``, each window is computed incrementally from the previous one (add the
        new batches, subtract the ones that left), which needs checkpointing."""
        self._validate_window_param(windowDuration, slideDuration)
        n = self._partitions(numPartitions)
        reduced = self.reduceByKey(func, n)
        slide = to_ms(slideDuration) if slideDuration else self.slide_ms
        if invFunc is None:
            return reduced.window(windowDuration, slideDuration).reduceByKey(func, n)

        def reduce_func(a: RDD | None, b: RDD) -> RDD:
            b = b.reduceByKey(func, n)
            r = a.union(b).reduceByKey(func, n) if a is not None else b
            return r.filter(filterFunc) if filterFunc else r

        def inv_reduce_func(a: RDD, b: RDD) -> RDD:
            b = b.reduceByKey(func, n)
            joined = a.leftOuterJoin(b, n)
            return joined.mapValues(lambda vs: invFunc(vs[0], vs[1]) if vs[1] is not None else vs[0])

        return reduced.stateful_stream("reduceByKeyAndWindow", reduce_func, inv_reduce_func,
                                 to_ms(windowDuration), slide)

    def updateStateByKey(self, updateFunc: Callable, numPartitions: int | None = None,
                         initialRDD: RDD | list | None = None, stateVersion: int = 1,
                         migrate: Callable | None = None) -> DStream:
        """``updateFunc(new_values, last_state) -> new_state`` per key (None drops it); versions: state/versions.py"""
        return self.stateful_stream("updateStateByKey", updateFunc, self._partitions(numPartitions), initialRDD,
                                    stateVersion, migrate)

    def mapWithState(self, spec) -> DStream:
        """Spark's mapWithState: ``spec`` (a :class:`sparkwal.engine.StateSpec`) calls its function once per
        record of a batch and once per key timing out; the result is the stream of the values it
        returns, with ``stateSnapshots()`` for the state itself."""
        return self.stateful_stream("mapWithState", spec)


class TransformedDStream(DStream):
    """``func(time_ms, [parent RDDs]) -> RDD | None``."""

    def __init__(self, ssc, parents: list[DStream], func: Callable, allow_missing: bool = False,
                 keeps_empty: bool = False):
        super().__init__(ssc, parents)
        self._func = func
        self._allow_missing = allow_missing
        #: ``func`` makes no records when every parent's RDD is known empty (sparkwal's own
        #: operations; a user's ``transform`` may make records from nothing, so it is run)
        self.keeps_empty = keeps_empty

    def compute(self, time_ms: int) -> RDD | None:
        pre = getattr(self._driver.scheduler.receiver_tracker, "precomputed", None)
        if pre is not None and (rdd := pre.rdd(self, time_ms)):
            return rdd  # every block's result came with it (receiver/precompute.py)
        rdds = [p.get_or_compute(time_ms) for p in self.dependencies]
        if getattr(self, "keeps_empty", False) and self._all_empty(rdds):
            return empty_rdd(self._sc)
        if any(r is None for r in rdds):
            if not self._allow_missing or all(r is None for r in rdds):
                return None
            rdds = [r if r is not None else self._sc.emptyRDD() for r in rdds]
        result = self._func(time_ms, rdds)
        if result is not None and not isinstance(result, RDD):
            raise TypeError(f"transform function returned {type(result).__name__}, not an RDD")
        return result


class UnionDStream(DStream):
    def __init__(self, ssc, parents: list[DStream]):
        if len({p.slide_ms for p in parents}) > 1:
            raise ValueError("all DStreams in a union must have the same slide duration")
        super().__init__(ssc, parents)

    def compute(self, time_ms: int) -> RDD | None:
        rdds = [r for r in (p.get_or_compute(time_ms) for p in self.dependencies) if r is not None]
        if self._all_empty(rdds):
            return empty_rdd(self._sc)
        return self._sc.union(rdds) if rdds else None


class WindowedDStream(DStream):
    def __init__(self, ssc, parent: DStream, window_ms: int, slide_ms: int):
        super().__init__(ssc, [parent], slide_ms)
        self.window_ms = window_ms
        if parent.storage_level is None:  # each parent RDD is used by several windows
            parent.persist(StorageLevel.MEMORY_ONLY)

    def parent_remember_ms(self) -> int:
        return self.remember_ms + self.window_ms

    def compute(self, time_ms: int) -> RDD | None:
        parent = self.dependencies[0]
        rdds = parent.rdds_between(time_ms - self.window_ms + parent.slide_ms, time_ms)
        return self._sc.union(rdds) if rdds else self._sc.emptyRDD()


class ForEachDStream(DStream):
    """An output operation: at every batch, ``func(time, rdd)`` runs as one job (``in_order``: output_order)."""

    in_order = False  # (also for streams pickled before it existed)

    def __init__(self, ssc, parent: DStream, func: Callable[[datetime, RDD], Any],
                 op_name: str = "foreachRDD", in_order: bool = False):
        super().__init__(ssc, [parent])
        self._func = func
        self.op_name, self.in_order = op_name, in_order
        self.output_op_id = self._driver.graph.add_output(self)

    def compute(self, time_ms: int) -> RDD | None:
        return None

    def generate_job(self, time_ms: int) -> Job | None:
        rdd = self.dependencies[0].get_or_compute(time_ms)
        if rdd is None:
            return None
        func = self._func
        return Job(self.output_op_id, self.op_name, lambda: func(_time(time_ms), rdd), self.in_order)


def _save_text_atomically(rdd: RDD, path: str) -> None:
    """``rdd.saveAsTextFile`` into a hidden sibling, then renamed to ``path`` through Hadoop's
    FileSystem (any URL Spark writes to); a previous ``path`` is moved aside first, then deleted."""
    import uuid

    sc = rdd.context
    hadoop_path = sc._jvm.org.apache.hadoop.fs.Path
    final = hadoop_path(path)
    fs = final.getFileSystem(sc._jsc.hadoopConfiguration())
    parent, name = final.getParent(), final.getName()
    tag = uuid.uuid4().hex[:12]
    tmp = hadoop_path(parent, f".{name}.tmp-{tag}")
    rdd.saveAsTextFile(tmp.toString())
    old = None
    if fs.exists(final):
        old = hadoop_path(parent, f".{name}.old-{tag}")
        if not fs.rename(final, old):
            raise OSError(f"cannot move the earlier output {path} aside to {old.toString()}")
    if not fs.rename(tmp, final):
        raise OSError(f"cannot rename {tmp.toString()} to {path}")
    if old is not None:
        fs.delete(old, True)
