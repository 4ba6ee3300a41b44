"""RDDs whose rows the driver holds: read without a Spark job, sent to the JVM only when needed.

A batch whose records are already on the driver (a receiver's precomputed results, a state run on the
driver: :mod:`sparkwal.engine.receiver.precompute`, :mod:`sparkwal.engine.state.driver_state`) still
hands the program an RDD. :class:`DriverRowsRDD` answers the actions that only read rows (``collect``,
``take``, ``first``, ``count``, ``isEmpty``) from the rows themselves, as Spark SQL answers ``collect`` on
a local relation (sql/core/.../execution/LocalTableScanExec.scala, ``executeCollect``/``executeTake``),
and builds its JVM side (``parallelize``) only when something needs one: a transformation, ``persist``
applied, ``saveAs*``. Its rows may be worked out on first use (``compute``), once: a lazy batch, as a
Spark RDD is.
"""

from __future__ import annotations

import threading
from typing import Callable

from pyspark import RDD, SparkContext, StorageLevel


class DriverRowsRDD(RDD):
    """``rows`` (or ``compute()``'s, worked out once, on first use) in ``num_partitions`` partitions;
    the JVM side is ``build(rows)`` (by default ``parallelize``, whose partitions hold the rows in
    this order, so ``collect``/``take`` return what Spark would), made on first need."""

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
        self._build = build or (lambda rows: ctx.parallelize(rows, self._num_partitions))
        self._built: RDD | None = None
        self._level = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ the rows

    def rows(self) -> list:
        """The rows, worked out now if they were not yet (a failure is raised, and tried again next time)."""
        with self._lock:
            if self._rows is None:
                self._rows, self._compute = self._compute(), None  # type: ignore[misc]
            return self._rows

    @property
    def rows_known(self) -> bool:
        return self._rows is not None

    def collect(self) -> list:
        return list(self.rows())

    def take(self, num: int) -> list:
        return self.rows()[:max(num, 0)]

    def count(self) -> int:
        return len(self.rows())

    def isEmpty(self) -> bool:
        return not self.rows()

    def getNumPartitions(self) -> int:
        return self._num_partitions

    def __repr__(self) -> str:  # (RDD's asks the JVM side, which would build it)
        rows = f"{len(self._rows)} rows" if self._rows is not None else "rows not worked out yet"
        return f"{type(self).__name__}[{rows} on the driver, {self._num_partitions} partitions]"

    # ------------------------------------------------------------------ the JVM side, on demand

    @property
    def jvm_side_built(self) -> bool:
        return self._built is not None

    def _jvm_side(self) -> RDD:
        with self._lock:
            if self._built is None:
                built = self._build(self.rows())
                if self._level is not None:
                    built.persist(self._level)
                self._built = built
            return self._built

    @property
    def _jrdd(self):  # type: ignore[override]
        return self._jvm_side()._jrdd

    @property
    def _jrdd_deserializer(self):  # type: ignore[override]
        return self._jvm_side()._jrdd_deserializer

    @property
    def _id(self):  # type: ignore[override]
        return self._jvm_side().id()

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
