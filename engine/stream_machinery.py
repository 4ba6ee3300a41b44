"""The machinery under every DStream, as in Spark's ``DStream.scala``: a stream generates at most
one RDD per valid batch time (a multiple of its slide duration after the zero time), remembers
generated RDDs for ``remember`` milliseconds, and forgets (and unpersists) older ones; pickled
into a checkpoint's code part, it leaves out its context and what lives only in a running driver.
:class:`sparkwal.engine.dstream.DStream` adds pyspark.streaming's API on top.
"""

from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Self

from pyspark import RDD, StorageLevel

from .graph import creation_site
from .identity import name_stream
from .errors import StreamingContextStateError


def per_record(step: Callable) -> Callable:
    """Mark a per-partition function that maps each record on its own (``map``, ``flatMap``,
    ``filter``): a receiver may run it on records as they arrive, not only on a whole block
    (receiver/precompute.py reads the mark)."""
    step.per_record = True  # type: ignore[attr-defined]
    return step


#: RDDs of no partitions that an input gave for a batch with nothing in it (see :func:`empty_rdd`)
_EMPTY: weakref.WeakSet = weakref.WeakSet()


def empty_rdd(sc) -> RDD:
    """An RDD of no partitions, known to the streams as empty: an input's batch with nothing in it.
    The operations that cannot make records from nothing (:class:`sparkwal.engine.dstream.
    TransformedDStream` with ``keeps_empty``) hand one on instead of building RDDs over it, so an
    empty batch's Spark job has no tasks to run (``spark.sparkwal.emptyBatch.shortcut``)."""
    rdd = sc.emptyRDD()
    _EMPTY.add(rdd)
    return rdd


def known_empty(rdd) -> bool:
    """Whether ``rdd`` is None (no RDD) or came from :func:`empty_rdd`."""
    return rdd is None or rdd in _EMPTY


class StreamMachinery:
    #: the program's name for this stream across its versions (:meth:`uid`), else None
    stream_uid: str | None = None

    def uid(self, name: str) -> Self:
        """Name this stream across versions of the program (Flink's word) and return it: an upgrade
        gives an input's position and a stateful operator's state to the stream of the same name,
        whatever changed around it (:mod:`sparkwal.engine.identity`). On a stateless step it names
        the one input or stateful operator the step reads from. Unique in a context."""
        name_stream(self, self._driver.graph, name)
        return self

    #: a stateful stream's state version, and ``migrate(from_version, value) -> value``, which brings
    #: a value an older version wrote up to this one as a snapshot is read (snapshots record it)
    state_version: int = 1
    state_migrate: Callable | None = None
    #: a stateful stream an upgrade added: the first batch time its state holds (the state before
    #: it is empty, whatever batches ran before the upgrade); None: since the zero time
    state_start_ms: int | None = None

    def has_state_before(self, time_ms: int) -> bool:
        """Whether a stateful stream has a state at ``time_ms`` to build its next one on."""
        return time_ms > self.zero_time_ms and (self.state_start_ms is None or time_ms >= self.state_start_ms)

    def __init__(self, ssc, dependencies: Sequence[StreamMachinery], slide_ms: int | None = None):
        self._ssc = ssc
        self._sc = ssc.sparkContext
        self.dependencies = list(dependencies)
        self.slide_ms: int = slide_ms if slide_ms is not None else dependencies[0].slide_ms
        self.generated_rdds: dict[int, RDD] = {}
        self._superseded: dict[int, RDD] = {}  # replaced RDDs, maybe still used by running jobs
        #: a stateful stream's batch time -> the batch time its RDD's lineage starts at: the state
        #: it was built on, unless that was served read back from a snapshot (see serve_state)
        self.lineage_from: dict[int, int] = {}
        self.zero_time_ms: int | None = None
        self.remember_ms: int | None = None
        self.storage_level: StorageLevel | None = None
        self.checkpoint_ms: int | None = None
        self.must_checkpoint = False
        self._lock = threading.RLock()
        #: first new batch time -> the last batch time before it, of each downtime whose batch
        #: times a restart coalesced (:meth:`coalesce_downtime`)
        self.downtimes: dict[int, int] = {}
        self.creation_site = creation_site()  # "map at app.py:12": names it in errors
        ssc.driver.graph.register(self)

    @property
    def _driver(self):  # (untyped: naming the driver's type here would tie the streams into a circle with it)
        """The driver running this stream's context, which a stream reads as Spark's DStreams read
        their ``ssc``: the graph, the settings, the clock, the trackers, the checkpoint location."""
        return self._ssc.driver

    # ------------------------------------------------------------------ pickling (the code part)

    #: set by sparkwal's per-partition operations and combineByKey: what a receiver may run
    #: for the batch (engine/receiver/precompute.py)
    block_step: Callable | None = None
    block_combine: tuple | None = None

    #: What a pickled stream leaves out: its context and what lives only in a running driver.
    transient_fields: tuple[str, ...] = ("_ssc", "_sc", "generated_rdds", "_superseded", "lineage_from", "_lock",
                                         "downtimes")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in self.transient_fields:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name in self.transient_fields:
            setattr(self, name, None)
        self.generated_rdds, self._superseded, self.lineage_from = {}, {}, {}
        self._lock = threading.RLock()
        self.downtimes = {}

    def attach(self, ssc) -> None:
        """Bind an unpickled stream to the context (a StreamingContext) that recovers it."""
        self._ssc, self._sc = ssc, ssc.sparkContext

    def __class_getitem__(cls, item):  # DStream[T] in annotations, as pyspark's Generic DStream
        return types.GenericAlias(cls, item)

    # ------------------------------------------------------------------ machinery

    @property
    def _slideDuration(self) -> float:  # pyspark's attribute name, in seconds
        return self.slide_ms / 1000.0

    def parent_remember_ms(self) -> int:
        """How long dependencies must remember their RDDs for this stream."""
        return self.remember_ms

    def initialize(self, zero_time_ms: int) -> None:
        if self.zero_time_ms is not None and self.zero_time_ms != zero_time_ms:
            raise StreamingContextStateError(f"{self} initialized with two zero times")
        self.zero_time_ms = zero_time_ms
        if self.must_checkpoint and self.checkpoint_ms is None:  # Spark's: >= 10 s, whole slides
            self.checkpoint_ms = -(-10_000 // self.slide_ms) * self.slide_ms
        if self.checkpoint_ms is not None and (self.checkpoint_ms < self.slide_ms
                                               or self.checkpoint_ms % self.slide_ms):
            raise ValueError(f"the checkpoint interval of {self} ({self.checkpoint_ms} ms) must be a "
                             f"multiple of its slide duration ({self.slide_ms} ms)")
        minimum = self.slide_ms if self.checkpoint_ms is None else max(self.slide_ms, 2 * self.checkpoint_ms)
        if self.remember_ms is None or self.remember_ms < minimum:
            self.remember_ms = minimum
        for d in self.dependencies:
            d.initialize(zero_time_ms)

    def remember_at_least(self, duration_ms: int) -> None:
        if duration_ms is not None and (self.remember_ms is None or duration_ms > self.remember_ms):
            self.remember_ms = duration_ms
        for d in self.dependencies:
            d.remember_at_least(self.parent_remember_ms())

    def is_time_valid(self, time_ms: int) -> bool:
        if self.zero_time_ms is None:
            raise StreamingContextStateError(f"{self} has not been initialized")
        return time_ms > self.zero_time_ms and (time_ms - self.zero_time_ms) % self.slide_ms == 0

    def compute(self, time_ms: int) -> RDD | None:
        raise NotImplementedError

    def coalesce_downtime(self, last_ms: int, first_new_ms: int) -> None:
        """A restart coalesces the batch times after ``last_ms`` into the batch of
        ``first_new_ms`` (``spark.sparkwal.recovery.coalesceDowntime``): that batch takes their
        input, and a stateful stream's state at ``first_new_ms`` is built on the one at
        ``last_ms`` (:meth:`previous_batch_ms`); the times between are never generated."""
        self.downtimes[first_new_ms] = last_ms

    def previous_batch_ms(self, time_ms: int) -> int:
        """The batch time whose state a stateful stream's batch at ``time_ms`` builds on: one
        slide before, or the last batch before a coalesced downtime."""
        return self.downtimes.get(time_ms, time_ms - self.slide_ms)

    def _cut_lineage(self, rdd: RDD) -> None:
        """Cut the lineage of an RDD due for checkpointing, before any job uses it. A stateful
        stream's RDD, when the driver checkpoints, is cut later by its snapshot instead (see
        :mod:`sparkwal.engine.state.snapshots`); others are checkpointed locally (no files to clean up)."""
        if not (self.must_checkpoint and self._driver.checkpoint_dir is not None):
            rdd.localCheckpoint()

    def get_or_compute(self, time_ms: int) -> RDD | None:
        with self._lock:
            if time_ms in self.generated_rdds:
                return self.generated_rdds[time_ms]
            if not self.is_time_valid(time_ms):
                return None
            rdd = self.compute(time_ms)
            if rdd is not None:
                if self.storage_level is not None:
                    rdd.persist(self.storage_level)
                if self.checkpoint_ms and (time_ms - self.zero_time_ms) % self.checkpoint_ms == 0:
                    self._cut_lineage(rdd)
                self.generated_rdds[time_ms] = rdd
                if self.must_checkpoint:  # a state built on the one before it, if any (rows the driver holds: none)
                    self.lineage_from[time_ms] = (self.lineage_from.get(self.previous_batch_ms(time_ms), time_ms)
                                                  if getattr(rdd, "has_lineage", True) else time_ms)
            return rdd

    def lineage_start(self, time_ms: int) -> int | None:
        """Where the lineage of this stateful stream's RDD at ``time_ms`` starts (None: no RDD)."""
        with self._lock:
            return self.lineage_from.get(time_ms)

    def oldest_lineage_start(self) -> int | None:
        """Where the longest lineage of this stateful stream's remembered RDDs starts."""
        with self._lock:
            return min(self.lineage_from.values(), default=None)

    def serve_state(self, time_ms: int, rdd: RDD) -> None:
        """Serve ``rdd``, read back from a snapshot, as the state at ``time_ms``: its lineage starts
        there. RDDs built on the state served before keep their longer lineage."""
        with self._lock:
            self.generated_rdds[time_ms] = rdd
            self.lineage_from[time_ms] = time_ms

    def state_snapshotted(self, chains: dict, records_remembered: bool = True) -> None:
        """A restart: committed batch time it re-generates -> the checkpoint's snapshot of this stream's
        state after it (a :class:`~sparkwal.engine.state.snapshot_tasks.ChainOnDriver`; a ``mapWithState``
        lets the driver read it rather than compute that batch's state). ``records_remembered``: a
        later batch may read those batches' records (a stream after this one remembers its RDDs past
        their batch, or keeps a state)."""

    def read_ahead(self, rdd: RDD) -> Callable[[bool], None]:
        """A takeover's state that its first batch builds on: called on the generation thread,
        returns the read to run beside it (into the executors' cache), called with False to give it
        up (see ``engine/driver/standby.py``)."""
        def read(run: bool) -> None:
            if run:
                rdd.count()
        return read

    def replace_rdd(self, time_ms: int, old: RDD, new: RDD) -> None:
        """Serve ``new`` (same contents, e.g. read back from a snapshot) for ``time_ms`` from now
        on; ``old`` stays cached until the time is forgotten, as jobs may still be using it."""
        with self._lock:
            if self.generated_rdds.get(time_ms) is old:
                self.generated_rdds[time_ms] = new
                self._superseded[time_ms] = old
                if self.must_checkpoint:
                    self.lineage_from[time_ms] = time_ms

    def clear_metadata(self, time_ms: int) -> None:
        """Forget RDDs older than ``time_ms - remember``; unpersist them."""
        with self._lock:
            for rdds in (self.generated_rdds, self._superseded):
                for t in [t for t in rdds if t <= time_ms - self.remember_ms]:
                    rdd = rdds.pop(t)
                    if self.storage_level is not None:
                        rdd.unpersist(blocking=False)
            for t in [t for t in self.lineage_from if t <= time_ms - self.remember_ms]:
                del self.lineage_from[t]
        for d in self.dependencies:
            d.clear_metadata(time_ms)

    def rdds_between(self, from_ms: int, until_ms: int) -> list[RDD]:
        """The RDDs of the batch times from ``from_ms`` to ``until_ms`` (both included)."""
        if self.zero_time_ms is None:
            raise StreamingContextStateError(f"{self} has not been initialized")
        z, s = self.zero_time_ms, self.slide_ms
        until_ms = z + ((until_ms - z) // s) * s
        from_ms = z + ((from_ms - z) // s) * s
        out = []
        t = from_ms
        while t <= until_ms:
            if t >= z:
                rdd = self.get_or_compute(t)
                if rdd is not None:
                    out.append(rdd)
            t += s
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(slide={self.slide_ms} ms)"
