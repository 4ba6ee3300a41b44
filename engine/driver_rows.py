"""RDDs whose rows the driver holds: read without a Spark job, sent to the JVM only when needed.

A batch whose records are already on the driver (a receiver's precomputed results, a state run on the
driver: :mod:`sparkwal.engine.receiver.precompute`, :mod:`sparkwal.engine.state.driver_state`) still
hands the program an RDD. :class:`DriverRowsRDD` answers the actions that only read rows (``collect``,
``take``, ``first``, ``count``, ``isEmpty``) from the rows themselves, as Spark SQL answers ``collect`` on
a local relation (sql/core/.../execution/LocalTableScanExec.scala, ``executeCollect``/``executeTake``),
and builds its JVM side (``parallelize``) only when something needs one: a transformation, ``persist``
applied, ``saveAs*``. Its rows may be worked out on first use (``compute``), once: a lazy batch, as a
Spark RDD is.

A step over such rows (``map``, ``filter``, ``flatMap``, ``mapPartitions``..., everything PySpark builds on
``mapPartitionsWithIndex``) is :class:`DriverRowsPipeline`: the same function over the same partitions
(those ``parallelize`` gives), run on the driver when an action reads it (``collect``, ``count``, ``sum``,
``reduce``, ``take``...), with no Spark job, as Spark SQL's optimizer evaluates a projection or a filter
over a local relation on the driver (sql/catalyst/.../optimizer/Optimizer.scala, ``ConvertToLocalRelation``).
As in a task, each partition gets copies of its rows and its own copy of the steps' function (pickled and
read back: broadcasts stay the driver's, accumulators add once the run succeeded), and the rows stream
through the steps: a function that changes what it is given or what it captured never changes what the
driver holds. Where the driver would not give Spark's result, Spark runs it as before, over the rows
parallelized:

* a function that raises on the driver: the action then runs as a Spark job, with Spark's retries and
  its error (pyspark.streaming's ``Py4JJavaError``, one line naming the batch);
* ``foreach``/``foreachPartition`` (writes to the outside world, which a user expects in a task with
  Spark's retries) and the exactly-once sinks (their tasks' attempt ids): :func:`on_executors`;
* a step persisted or checkpointed (or one after it): the storage asked for is the executors';
* every step where ``spark.executorEnv.*`` sets a variable that the driver has otherwise or not at all;
* ``pipe``: the command is the executors';
* anything that needs the JVM side (a shuffle, a ``union``, ``saveAs*``, ``id()``): the functions are
  pipelined into one Python task over the parallelized rows, as PySpark pipelines them.

Inside a function run on the driver ``TaskContext.get()`` is None, as it is for any code of a
``foreachRDD``.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import pickle
import threading
from itertools import islice
from typing import Callable, Iterator

from pyspark import RDD, Accumulator, Broadcast, SparkContext, StorageLevel, cloudpickle
from pyspark.rdd import PipelinedRDD

from sparkwal.wal.retry import DEADLINE_ENV

log = logging.getLogger(__name__)


class DriverRowsRDD(RDD):
    """``rows`` (or ``compute()``'s, worked out once, on first use) in ``num_partitions`` partitions;
    the JVM side is ``build(rows)`` (by default ``parallelize``, whose partitions hold the rows in
    this order, so ``collect``/``take`` return what Spark would), made on first need. With the default
    ``build``, a step over it is a :class:`DriverRowsPipeline` (the module's docstring)."""

    #: a job never recomputes these rows from earlier batches' inputs (a parallelized RDD's data
    #: lives in the driver): a state held so has no lineage for a snapshot or checkpoint to cut
    has_lineage = False

    def __init__(self, ctx: SparkContext, rows: list | None = None, *, compute: Callable[[], list] | None = None,
                 num_partitions: int | None = None, build: Callable[[list], RDD] | None = None, partitioner=None,
                 key_hashes: dict | None = None):
        if (rows is None) == (compute is None):
            raise ValueError("DriverRowsRDD takes rows or a function computing them, not both")
        self.ctx = ctx
        self.is_cached = self.is_checkpointed = self.has_resource_profile = False
        self.partitioner = partitioner
        self._rows, self._compute = rows, compute
        #: key -> ``portable_hash(key)`` as the executors work it out, where the rows' maker knew it
        self.key_hashes = key_hashes
        self._num_partitions = num_partitions or ctx.defaultParallelism
        #: the partitions are parallelize's (a step over them runs on the driver); else only the JVM knows
        self._parallelized = build is None
        self._build = build or (lambda rows: ctx.parallelize(rows, self._num_partitions))
        self._built: RDD | None = None
        self._level = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ the rows

    def rows(self) -> list:
        """The rows, worked out now if they were not yet (a failure is raised, and tried again next time).
        The driver's own objects, not copies: for sparkwal's use (the actions hand out copies)."""
        with self._lock:
            if self._rows is None:
                self._rows, self._compute = self._compute(), None  # type: ignore[misc]
            return self._rows

    @property
    def rows_known(self) -> bool:
        return self._rows is not None

    def partition_iterators(self) -> Iterator[tuple[int, Iterator]]:
        """(i, copies of partition i's rows) for each partition the JVM side holds them in, copied as read."""
        for i, rows in enumerate(sliced_as_parallelize(self.ctx, self.rows(), self._num_partitions)):
            yield i, iter(copies(rows))

    def collect(self) -> list:
        return self._handed_out(self.rows())

    def take(self, num: int) -> list:
        return self._handed_out(self.rows()[:max(num, 0)])

    def _handed_out(self, rows: list) -> list:
        """Copies of rows an app reads (a state's records, which only sparkwal reads, as they are)."""
        return copies(rows) if self._parallelized else list(rows)

    def count(self) -> int:
        return len(self.rows())

    def isEmpty(self) -> bool:
        return not self.rows()

    def getNumPartitions(self) -> int:
        return self._num_partitions

    def mapPartitionsWithIndex(self, f, preservesPartitioning: bool = False):  # type: ignore[override]
        """A step over these rows: on the driver when they are in parallelize's partitions (a state's
        records, placed by their keys' hashes, are not: a Spark step then, over the JVM side)."""
        if not self._parallelized:
            return RDD.mapPartitionsWithIndex(self, f, preservesPartitioning)
        return DriverRowsPipeline(self, f, preservesPartitioning)

    def foreach(self, f) -> None:  # type: ignore[override]
        """In Spark tasks, as Spark runs it: writes to the outside world get its retries."""
        self.jvm_side().foreach(f)

    def foreachPartition(self, f) -> None:  # type: ignore[override]
        self.jvm_side().foreachPartition(f)

    def _is_barrier(self) -> bool:  # (RDD's asks the JVM side; neither parallelize nor a step is a barrier)
        return False

    def __repr__(self) -> str:  # (RDD's asks the JVM side, which would build it)
        rows = f"{len(self._rows)} rows" if self._rows is not None else "rows not worked out yet"
        return f"{type(self).__name__}[{rows} on the driver, {self._num_partitions} partitions]"

    # ------------------------------------------------------------------ the JVM side, on demand

    @property
    def jvm_side_built(self) -> bool:
        return self._built is not None

    def _make_jvm_side(self) -> RDD:
        return self._build(self.rows())

    def jvm_side(self) -> RDD:
        with self._lock:
            if self._built is None:
                built = self._make_jvm_side()
                if self._level is not None:
                    built.persist(self._level)
                self._built = built
            return self._built

    @property
    def _jrdd(self):  # type: ignore[override]
        return self.jvm_side()._jrdd

    @property
    def _jrdd_deserializer(self):  # type: ignore[override]
        return self.jvm_side()._jrdd_deserializer

    @property
    def _id(self):  # type: ignore[override]
        return self.jvm_side().id()

    def persist(self, storageLevel=StorageLevel.MEMORY_ONLY):  # type: ignore[override]
        with self._lock:
            self.is_cached, self._level = True, storageLevel
            if self._built is not None:  # else applied when it is built
                self._built.persist(storageLevel)
            return self

    def unpersist(self, blocking: bool = False):  # type: ignore[override]
        with self._lock:
            self.is_cached, self._level = False, None
            if self._built is None:
                return self
            self._built.unpersist(blocking)
            return self

    def localCheckpoint(self) -> None:
        """Nothing to cut: the rows come from the driver, never from a lineage."""


class DriverRowsPipeline(DriverRowsRDD):
    """``f(i, partition i of parent)`` for each partition of ``parent`` (a :class:`DriverRowsRDD`),
    run on the driver when an action reads it, again for each action, streamed partition by
    partition, as a Spark task runs its steps: the steps since the rows are one function (``func``,
    composed as PySpark's ``PipelinedRDD`` composes them), of which each partition gets its own copy
    (:class:`_Shipped`). Its JVM side is PySpark's ``PipelinedRDD`` over the parent's, so steps after
    steps pipeline into one Python task there, as without this class. Its actions are Spark's where
    the driver would not give Spark's result (:meth:`_on_driver`)."""

    def __init__(self, parent: DriverRowsRDD, f: Callable, preservesPartitioning: bool = False):
        super().__init__(parent.ctx, compute=self._read_all, num_partitions=parent.getNumPartitions(),
                         partitioner=parent.partitioner if preservesPartitioning else None)
        self.parent, self._f, self._preserves = parent, f, preservesPartitioning
        #: the rows the steps start from, and the steps since them as one function
        self.root: DriverRowsRDD = parent.root if isinstance(parent, DriverRowsPipeline) else parent
        self.func: Callable = _composed(parent.func, f) if isinstance(parent, DriverRowsPipeline) else f
        #: PySpark's ``partitionBy`` and ``_reserialize`` set these on a step before building it
        self._bypass_serializer = False
        self._serializer_set = None

    def _on_driver(self) -> bool:
        """Whether the driver gives what Spark would: not where this step or one before it is persisted,
        checkpointed or has a resource profile (the storage or resources asked for are the executors'),
        nor where the executors' environment (``spark.executorEnv.*``) is not the driver's."""
        step: DriverRowsRDD = self
        while isinstance(step, DriverRowsPipeline):
            if step.is_cached or step.is_checkpointed or step.has_resource_profile:
                return False
            step = step.parent
        return not _environment_differs(self.ctx)

    def _run(self, consume: Callable):
        """``consume((i, partition i's rows) for each partition)``, each partition run by its own copy of
        ``func``; the accumulators get what the copies added once it returned (a failed run adds nothing,
        as a failed task adds nothing)."""
        shipped = _Shipped(self.func)
        result = consume((i, iter(shipped.copy()(i, rows))) for i, rows in self.root.partition_iterators())
        shipped.add_to_accumulators()
        return result

    def _read_all(self) -> list:
        return self._run(_all_rows)

    def partition_iterators(self) -> Iterator[tuple[int, Iterator]]:  # (its parent's partitions, run)
        parts = self._run(lambda parts: [list(rows) for _, rows in parts])
        return ((i, iter(rows)) for i, rows in enumerate(parts))

    def rows(self) -> list:  # (worked out for each use: a step's rows are not kept)
        return self._read_all()

    @property
    def rows_known(self) -> bool:
        return False

    def collect(self) -> list:
        return self._or_in_spark(_all_rows, lambda rdd: rdd.collect())

    def count(self) -> int:
        return self._or_in_spark(lambda parts: sum(1 for _, rows in parts for _ in rows), lambda rdd: rdd.count())

    def isEmpty(self) -> bool:
        return not self.take(1)

    def take(self, num: int) -> list:
        def first_rows(parts) -> list:
            taken: list = []
            for _, rows in parts:  # partitions read until num rows, as Spark's take
                if len(taken) >= num:
                    break
                taken.extend(islice(rows, num - len(taken)))
            return taken
        return self._or_in_spark(first_rows, lambda rdd: rdd.take(num))

    def _or_in_spark(self, consume: Callable, in_spark: Callable):
        if not self._on_driver():
            return in_spark(self.jvm_side())
        try:
            return self._run(consume)
        except Exception as e:  # noqa: BLE001  (the app's function: Spark runs it, with its retries and error)
            _warn_once(e)
            return in_spark(self.jvm_side())

    def localCheckpoint(self) -> None:  # type: ignore[override]
        """Spark's: the step is worked out once, in the executors, for every use (a stream's lineage cut)."""
        with self._lock:
            self.is_checkpointed = True
        RDD.localCheckpoint(self.jvm_side())

    def pipe(self, command, env=None, checkCode=False):  # type: ignore[override]
        """In Spark tasks: the command is the executors' (their files, their directory)."""
        return self.jvm_side().pipe(command, env, checkCode)

    def _make_jvm_side(self) -> RDD:
        parent = self.parent.jvm_side()
        for flag in ("is_cached", "is_checkpointed", "has_resource_profile"):  # (set on the wrapper by RDD's
            if getattr(self.parent, flag):  # methods: the step over it must not pipeline through it)
                setattr(parent, flag, True)
        built = PipelinedRDD(parent, self._f, self._preserves)
        built._bypass_serializer = self._bypass_serializer
        if self._serializer_set is not None:
            built._jrdd_deserializer = self._serializer_set
        return built

    @property
    def _jrdd_deserializer(self):  # type: ignore[override]
        return self.jvm_side()._jrdd_deserializer

    @_jrdd_deserializer.setter
    def _jrdd_deserializer(self, serializer) -> None:  # (RDD._reserialize: before the JVM side is built)
        with self._lock:
            self._serializer_set = serializer
            if self._built is not None:
                self._built._jrdd_deserializer = serializer


def _all_rows(parts: Iterator[tuple[int, Iterator]]) -> list:
    return [row for _, rows in parts for row in rows]


def _composed(before: Callable, after: Callable) -> Callable:
    def pipeline_func(split: int, iterator):  # (PipelinedRDD's)
        return after(split, before(split, iterator))
    return pipeline_func


#: what the executors' environment holds for PySpark's and sparkwal's own use, never for a step's function
_NOT_FOR_STEPS = ("PYTHONHASHSEED", DEADLINE_ENV)


def _environment_differs(sc: SparkContext) -> bool:
    """Whether a variable ``spark.executorEnv.*`` sets for the executors is not the driver's (a step
    reading it would read another value on the driver)."""
    return any(os.environ.get(name) != value for name, value in sc.environment.items() if name not in _NOT_FOR_STEPS)


class _Shipped:
    """A step's function pickled once (cloudpickle, as PySpark ships it), read back for each partition:
    its own copy of what the function captured, as each task unpickles its own. A broadcast stays the
    driver's; an accumulator is a task's copy (from its zero), added to the driver's once the whole run
    succeeded (:meth:`add_to_accumulators`), as Spark adds a task's once it succeeded."""

    def __init__(self, f: Callable):
        self._kept: list = []
        self._task_copies: list[_TaskAccumulator] = []
        buffer = io.BytesIO()
        _KeepingPickler(buffer, self._kept).dump(f)
        self._bytes = buffer.getvalue()

    def copy(self) -> Callable:
        return _KeptUnpickler(io.BytesIO(self._bytes), self._kept, self._task_copies).load()

    def add_to_accumulators(self) -> None:
        with _ADDING:
            for task_copy in self._task_copies:
                task_copy.add_to_drivers()


_ADDING = threading.Lock()  # (Spark adds tasks' updates from one thread)


class _TaskAccumulator(Accumulator):
    """An accumulator as a task has it: from the driver's zero, not registered, its value not readable
    (``Accumulator.value`` raises, as in a task)."""

    def __init__(self, drivers: Accumulator):  # (no Accumulator.__init__: that registers it as the driver's)
        self.aid, self.accum_param, self.drivers = drivers.aid, drivers.accum_param, drivers
        self._value = drivers.accum_param.zero(drivers.value)
        self._deserialized = True

    def add_to_drivers(self) -> None:
        self.drivers.add(self._value)


class _KeepingPickler(cloudpickle.Pickler):
    def __init__(self, file, kept: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._kept = kept

    def persistent_id(self, obj):  # type: ignore[override]
        if isinstance(obj, (Broadcast, Accumulator)):
            self._kept.append(obj)
            return len(self._kept) - 1
        return None


class _KeptUnpickler(pickle.Unpickler):
    def __init__(self, file, kept: list, task_copies: list):
        super().__init__(file)
        self._kept, self._task_copies = kept, task_copies
        self._loaded: dict = {}

    def persistent_load(self, pid):  # type: ignore[override]
        if pid not in self._loaded:
            obj = self._kept[pid]
            if isinstance(obj, Accumulator):
                obj = _TaskAccumulator(obj)
                self._task_copies.append(obj)
            self._loaded[pid] = obj
        return self._loaded[pid]


_warned: set[str] = set()


def _warn_once(error: Exception) -> None:
    what = f"{type(error).__name__}: {error}"[:300]
    if what in _warned or len(_warned) >= 100:
        log.debug("a step over rows the driver holds raised %s: run as a Spark job", what)
        return
    _warned.add(what)
    log.warning("a step over rows the driver holds raised %s on the driver; that action runs as a Spark job "
                "(with Spark's retries and its error). A function that needs a task (TaskContext.get()) "
                "always does so%s", what,
                ". That is 100 different errors: later ones are logged at DEBUG" if len(_warned) == 100 else "")


def on_executors(rdd: RDD) -> RDD:
    """``rdd`` as Spark tasks run it: a :class:`DriverRowsRDD`'s JVM side (for the exactly-once sinks,
    whose tasks write under their attempt's id), any other RDD itself."""
    return rdd.jvm_side() if isinstance(rdd, DriverRowsRDD) else rdd


def copies(rows: list) -> list:
    """New objects equal to ``rows``' (an executor's task gets them so: pickled and read back)."""
    try:
        return pickle.loads(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001  (a row pickle cannot carry: copied as Python can)
        return copy.deepcopy(rows)


def sliced_as_parallelize(sc: SparkContext, rows: list, num_slices: int) -> list[list]:
    """``rows`` in the partitions ``sc.parallelize(rows, num_slices)`` puts them in: PySpark sends
    them in batches of ``max(1, min(len // n, batchSize or 1024))`` rows (``SparkContext.parallelize``)
    and the JVM gives slice ``i`` the batches ``[i * m // n, (i + 1) * m // n)`` of the ``m``
    (``ParallelCollectionRDD.slice``, core/src/main/scala/org/apache/spark/rdd/ParallelCollectionRDD.scala)."""
    batch = max(1, min(len(rows) // num_slices, getattr(sc, "_batchSize", 0) or 1024))
    batches = -(-len(rows) // batch)
    bounds = [i * batches // num_slices * batch for i in range(num_slices + 1)]
    return [rows[bounds[i]:bounds[i + 1]] for i in range(num_slices)]

