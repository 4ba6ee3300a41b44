"""mapWithState: Spark's per-key state with idle timeouts, in Python.

The state lives in ``n`` partitions, one record ``(i, StateRecord)`` each, partitioned so that
partition ``i`` holds the keys ``portable_hash`` puts there, cached between batches. A batch
shuffles only its own records to their state's partition (``portable_hash(i) == i`` for the
state's partition keys, so the same partitioner places both, and the JVM zips them partition by
partition without moving the state) and calls the mapping function once per record, in the
records' order within their partition, then once for every key idle for longer than the timeout.
Keys without new data are not touched: each partition's update times are kept in update order, so
finding the idle keys, and the keys a delta snapshot must write, costs the keys found, not the
state's size; and a partition is carried from batch to batch as a base plus per-batch layers, live
in the Python worker that last updated it (:mod:`sparkwal.engine.state.state_map`), so that a batch neither
unpickles nor pickles the whole state when its worker kept it.

A batch whose records the driver holds (receivers that precompute a ``reduceByKey``) runs on the
driver while the state is small, with the same records (:mod:`sparkwal.engine.state.driver_state`).

Differences from Spark, on purpose: idle keys time out in the first batch after their timeout,
not only at checkpoint batches (Spark's full scan); the mapping function's return value is the
mapped record whatever it is (``None`` included).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from pyspark import RDD, StorageLevel

from .. import config
from ..driver_rows import DriverRowsRDD
from ..dstream import DStream, TransformedDStream, to_ms
from ..errors import StateError
from .driver_state import DriverState, driver_batch, prefetch, state_of_snapshot
from .snapshot_tasks import DriverParts, chain_on_driver
from . import versions
from .hosted import HostLoading, HostUnavailable, update_on_host
from .state_host import host_client, warn_once
from .state_map import (LIVE_KEYS, StateMap, StateRecord, call_function, keep_live, next_record, peek_state,
                        take_state)


class State:
    """The state of one key, as the mapping function sees it (Spark's ``State``)."""

    __slots__ = ("_exists", "_value", "_updated", "_removed", "_timing_out")

    def wrap(self, exists: bool, value, timing_out: bool = False) -> None:
        """Show the function this key's state (the engine's call, Spark's ``StateImpl.wrap``)."""
        self._exists, self._value = exists, value
        self._updated = self._removed = False
        self._timing_out = timing_out

    def exists(self) -> bool:
        return self._exists

    def get(self):
        if not self._exists:
            raise LookupError("State is not set")
        return self._value

    def getOption(self):
        return self._value if self._exists else None

    def update(self, newState) -> None:
        if self._removed:
            raise ValueError("Cannot update the state after it has been removed")
        if self._timing_out:
            raise ValueError("Cannot update the state that is timing out")
        self._exists, self._value, self._updated = True, newState, True

    def remove(self) -> None:
        if self._timing_out:
            raise ValueError("Cannot remove the state that is timing out")
        if self._removed:
            raise ValueError("Cannot remove the state that has already been removed")
        self._exists, self._value, self._removed = False, None, True

    def isTimingOut(self) -> bool:
        return self._timing_out

    def isRemoved(self) -> bool:
        """The function removed the state (read by the engine, as Spark's ``StateImpl``)."""
        return self._removed

    def isUpdated(self) -> bool:
        return self._updated

    def __repr__(self) -> str:
        return f"State({self._value!r})" if self._exists else "State(<none>)"


class StateSpec:
    """What mapWithState does: ``StateSpec.function(f).initialState(rdd).numPartitions(n)
    .timeout(seconds)``; ``f(key, value, state)`` returns the mapped record."""

    def __init__(self, mappingFunction):
        if not callable(mappingFunction):
            raise TypeError("StateSpec.function needs a function (key, value, state) -> mapped")
        self._func = mappingFunction
        self._initial = None
        self._partitions: int | None = None
        self._timeout_ms: int | None = None
        self._state_version, self._migrate = 1, None

    @staticmethod
    def function(mappingFunction) -> StateSpec:
        return StateSpec(mappingFunction)

    def initialState(self, rdd) -> StateSpec:
        self._initial = rdd
        return self

    def numPartitions(self, numPartitions: int) -> StateSpec:
        if int(numPartitions) < 1:
            raise ValueError(f"numPartitions must be at least 1, not {numPartitions}")
        self._partitions = int(numPartitions)
        return self

    def stateVersion(self, version: int, migrate=None) -> StateSpec:
        """The version of the state's values this function writes, and ``migrate(from_version, value)
        -> value`` for those an older version wrote (:mod:`sparkwal.engine.state.versions`)."""
        self._state_version, self._migrate = versions.check(version, migrate)
        return self

    def timeout(self, idleDuration: float) -> StateSpec:
        if idleDuration <= 0:
            raise ValueError(f"the timeout must be positive, not {idleDuration}")
        self._timeout_ms = to_ms(idleDuration)
        return self

    # what the engine reads (Spark's StateSpecImpl getters)

    def getFunction(self):
        return self._func

    def getInitialStateRDD(self):
        return self._initial

    def getNumPartitions(self) -> int | None:
        return self._partitions

    def getStateVersion(self) -> tuple[int, Callable | None]:
        """(state version, migrate function)."""
        return self._state_version, self._migrate

    def getTimeoutInterval(self) -> int | None:
        """The idle timeout in milliseconds (None: none)."""
        return self._timeout_ms


def _no_state(index: int, batch_ms: int) -> StateError:
    return StateError(f"mapWithState: partition {index} of the batch of {batch_ms} has no state "
                        "partition to update")


def _update_partition(index, records, func, uid, batch_ms, timeout_ms, forget_before_ms, delta_since_ms=None,
                      live_keys=LIVE_KEYS, hosted=False):
    records = iter(records)
    first = next(records, None)
    if first is None or type(first[1]) is not StateRecord:  # the state partition comes first (the union's order)
        raise _no_state(index, batch_ms)
    previous = first[1]
    client = host_client() if hosted and live_keys > 0 else None
    if client is not None:
        batch = list(records)
        try:
            yield index, update_on_host(client, index, previous, batch, State(), func, uid, batch_ms, timeout_ms,
                                        forget_before_ms, delta_since_ms, live_keys)
            return
        except HostUnavailable as e:  # before any call of func: this worker runs the batch
            if not isinstance(e, HostLoading):
                warn_once(str(e))
            records = iter(batch)
    state = take_state(uid, index, previous)
    state.begin_batch()
    values, delete = state.values, state.delete
    mapped, st = [], State()
    emit, wrap = mapped.append, st.wrap
    call_function(records, func, st, values, state.set, delete, timeout_ms is not None, emit)
    if timeout_ms is not None:
        for key in state.idle_before(batch_ms - timeout_ms):
            wrap(True, values[key], timing_out=True)
            emit(func(key, None, st))
            delete(key)
    layer = state.end_batch(batch_ms, forget_before_ms)
    delta = None if delta_since_ms is None else (delta_since_ms, state.rows_since(delta_since_ms))
    yield index, next_record(uid, index, previous, state, layer, mapped, delta, live_keys)


def _record_of(uid, index, state: StateMap, live_keys: int) -> StateRecord:
    """A first record of ``state``, which this worker then keeps live: the partition's next batch
    needs no rebuild when Spark hands it to this worker."""
    record = StateRecord.of(-1, state, [])
    keep_live(uid, index, record.token, state, live_keys)
    return record


def _build_partition(index, records, time_ms, uid, live_keys=LIVE_KEYS):
    """Partition ``index``'s first state from rows ``(key, value, updated_ms)`` (or ``(key,
    value)`` pairs of an initial state, stamped ``time_ms``), in update order."""
    rows = [(r[1][0], r[1][1], r[1][2] if len(r[1]) > 2 else time_ms) for r in records if r[1] is not None]
    rows.sort(key=lambda r: r[2])
    state = StateMap()
    for k, v, t in rows:
        state.put(k, v, t)
    yield index, _record_of(uid, index, state, live_keys)


def _restore_partition(index, rows, uid, live_keys=LIVE_KEYS):
    """Partition ``index``'s state from a snapshot chain's rows ``(key, value, updated_ms)``,
    which come in update order (a full snapshot is written in that order and deltas after it)."""
    yield index, _record_of(uid, index, StateMap.of_rows(rows), live_keys)


def _by_partition(rdd: RDD, n: int) -> RDD:
    """Records ``(key, ...)`` shuffled to their key's state partition, as ``(key, record)``, with
    seeds ``(i, None)`` so that every partition exists (``portable_hash(i) == i``)."""
    seeds = rdd.context.parallelize([(i, None) for i in range(n)], n)
    return seeds.union(rdd.map(lambda r: (r[0], r))).partitionBy(n)


class InternalMapWithStateDStream(DStream):
    """The state stream: ``(i, StateRecord)`` per partition, cached, snapshotted."""

    transient_fields = (*DStream.transient_fields, "_initial", "driver_retry_ms", "prefetched", "snapshotted",
                        "snapshot_alone")
    #: a batch before this time does not try to bring the state back to the driver (driver_state.py)
    driver_retry_ms: int | None = None
    #: (the state RDD, the Future of its keys and records) a takeover reads for the next batch (driver_state.py)
    prefetched: tuple | None = None
    #: a restart's re-generated batch time -> the checkpoint's snapshot of the state after it (ChainOnDriver)
    snapshotted: dict | None = None
    #: ... and nothing remembers those batches' mapped records: the snapshot alone may be their state
    snapshot_alone = False
    state_operator = "mapWithState"
    state_is_output = False  # a re-run batch must call the function again: restore the state before it

    def __init__(self, ssc, parent: DStream, spec: StateSpec):
        super().__init__(ssc, [parent])
        self._func = spec.getFunction()
        self._initial = spec.getInitialStateRDD()
        self.num_partitions = spec.getNumPartitions() or self._sc.defaultParallelism
        self.timeout_ms = spec.getTimeoutInterval()
        self.state_version, self.state_migrate = spec.getStateVersion()
        self.must_checkpoint = True
        self.storage_level = StorageLevel.MEMORY_ONLY
        self._uid = uuid.uuid4().hex  # names this run's live maps in the workers

    def __setstate__(self, state):
        super().__setstate__(state)
        self._uid = uuid.uuid4().hex  # a restored stream is a new run: no worker's map is its own

    def _first_state(self, time_ms: int) -> RDD:
        initial = self._initial
        if initial is not None and not isinstance(initial, RDD):
            initial = self._sc.parallelize(list(initial))
        rows = initial if initial is not None else self._sc.emptyRDD()
        return _by_partition(rows, self.num_partitions).mapPartitionsWithIndex(
            partial(_build_partition, time_ms=time_ms, uid=self._uid, live_keys=self._live_keys()),
            preservesPartitioning=True)

    @property
    def has_initial_state(self) -> bool:
        return self._initial is not None

    def compute(self, time_ms: int) -> RDD | None:
        snapshot = self.snapshotted.pop(time_ms, None) if self.snapshotted else None
        if snapshot is not None and self.snapshot_alone and self._precomputed():
            held = state_of_snapshot(self, snapshot, self._driver.settings[config.DRIVER_STATE_KEYS])
            if held is not None:
                return held
        previous = self.previous_batch_ms(time_ms)
        state = self.get_or_compute(previous) if self.has_state_before(previous) else None
        data = self.dependencies[0].get_or_compute(time_ms)
        update = self._update(time_ms)
        ahead, self.prefetched = self.prefetched, None  # (for the one batch after a takeover's read_ahead)
        on_driver = driver_batch(self, state, data, time_ms, update, self._driver.settings[config.DRIVER_STATE_KEYS],
                                 ahead, self._precomputed())
        if ahead is not None:
            ahead[1].cancel()  # not used by this batch: not read, unless under way
        if on_driver is not None:
            return on_driver
        if state is None:
            state = self._first_state(time_ms)
        n = self.num_partitions
        both = state
        if data is not None:  # the state's records are keyed by partition i: portable_hash(i) == i
            both = state.union(data.partitionBy(n))
        if both.getNumPartitions() != n:
            raise StateError(f"{self}: the state and the batch of {time_ms} are not partitioned "
                               f"alike ({both.getNumPartitions()} partitions after their union)")
        state = both.mapPartitionsWithIndex(update, preservesPartitioning=True)
        chain_on_driver(state, snapshot)  # (driver_state.py reads it)
        return state

    def state_snapshotted(self, chains: dict, records_remembered: bool = True) -> None:
        """A committed batch a restart re-generates without outputs has, as its state, the snapshot the
        checkpoint took after it (consistent with the outputs committed, whatever code re-generates it):
        where the driver takes the state, it reads that snapshot itself rather than run the batch in the
        executors (a takeover's last committed batch). Where nothing remembers that batch's mapped
        records (output before the restart), the snapshot alone is its state: no RDD of the batch's
        input or of the state before it is built (a takeover's first batch built them, 40-90 Py4J
        calls, 30-120 ms of its generation on two loaded cores, only for the driver to read the
        snapshot), and its blocks are not read back."""
        self.snapshotted = dict(chains) or None
        self.snapshot_alone = not records_remembered

    def read_ahead(self, rdd: RDD) -> Callable[[bool], None]:
        """Collected to the driver where a precomputed batch would run the state there
        (:func:`~sparkwal.engine.state.driver_state.prefetch`; the next batch's generation takes it)."""
        bound = self._driver.settings[config.DRIVER_STATE_KEYS]
        if isinstance(rdd, DriverState):
            return lambda run: None  # (on the driver already)
        if bound <= 0 or not self._precomputed():
            return super().read_ahead(rdd)
        ahead: Future = Future()
        self.prefetched = (rdd, ahead)
        return partial(prefetch, rdd, bound, ahead)

    def _precomputed(self) -> bool:
        """Whether this state's batches may come from the receivers' results (driver_state.py)."""
        precomputed = getattr(self._driver.scheduler.receiver_tracker, "precomputed", None)
        return precomputed is not None and precomputed.covers(self.dependencies[0])

    def _update(self, time_ms: int):
        """The batch's function of (partition index, records): the state record first."""
        keep_removals = 2 * (self.checkpoint_ms or self.slide_ms) + self.slide_ms
        delta_since = None  # a checkpoint batch works out its delta from the previous one's
        if self.checkpoint_ms and (time_ms - self.zero_time_ms) % self.checkpoint_ms == 0:
            delta_since = time_ms - self.checkpoint_ms
        return partial(_update_partition, func=self._func, uid=self._uid, batch_ms=time_ms,
                       timeout_ms=self.timeout_ms,
                       forget_before_ms=time_ms - keep_removals, delta_since_ms=delta_since,
                       live_keys=self._live_keys(), hosted=self._driver.settings[config.STATE_HOST])

    def _live_keys(self) -> int:
        return self._driver.settings[config.LIVE_KEYS]

    def clear_metadata(self, time_ms: int) -> None:
        """Each batch's state is a full copy (PySpark caches pickles): keep only the newest
        cached; older ones stay as lineage (back to the last snapshot) if a cache is lost. A state
        held on the driver has no lineage: older ones are released."""
        with self._lock:
            for rdds in (self.generated_rdds, self._superseded):
                for t, rdd in rdds.items():
                    if t < time_ms and isinstance(rdd, DriverState):
                        rdd.release()
                    elif t < time_ms and rdd.is_cached:
                        rdd.unpersist(blocking=False)
        super().clear_metadata(time_ms)

    # ------------------------------------------------------------------ snapshots

    def state_name(self, index: int) -> str:
        return f"{self.state_operator}-{index}"

    def state_items(self, _time_ms: int, rdds: list) -> RDD:
        """``(key, value)`` of every key after a batch (``stateSnapshots()``): a worker's live map of a
        partition caught up with the layers since, no work for a partition it holds at that state."""
        state = rdds[0]
        if isinstance(state, DriverState):  # read on the driver, no job
            return DriverRowsRDD(state.ctx, compute=state.items, num_partitions=state.getNumPartitions())
        uid, live_keys = self._uid, self._live_keys()
        return state.flatMap(lambda r: peek_state(uid, r[0], r[1], live_keys).values.items())

    def state_partitioned(self, rdd: RDD) -> bool:
        return True

    def state_rows(self, rdd: RDD, time_ms: int) -> RDD | DriverParts:
        if isinstance(rdd, DriverState):  # written by the driver, in the same layout
            return rdd.partition_rows(lambda record: record.state.rows())
        return rdd.flatMap(lambda r: r[1].state.rows(), preservesPartitioning=True)

    def state_delta_rows(self, rdd: RDD, since_ms: int, time_ms: int) -> RDD | DriverParts | None:
        if since_ms < time_ms - 2 * (self.checkpoint_ms or self.slide_ms):
            return None  # removals that old are forgotten
        if isinstance(rdd, DriverState):
            return rdd.partition_rows(lambda record: record.rows_since(since_ms))
        return rdd.flatMap(lambda r: r[1].rows_since(since_ms))

    def state_from_rows(self, rows: RDD, partitioned: bool) -> RDD:
        n = self.num_partitions
        if partitioned and rows.getNumPartitions() == n:
            restore = partial(_restore_partition, uid=self._uid, live_keys=self._live_keys())
            return rows.mapPartitionsWithIndex(restore, preservesPartitioning=True)
        # another layout (numPartitions or PYTHONHASHSEED changed): shuffle once
        build = partial(_build_partition, time_ms=0, uid=self._uid, live_keys=self._live_keys())
        return _by_partition(rows, n).mapPartitionsWithIndex(build, preservesPartitioning=True)


class MapWithStateDStream(DStream):
    """The mapped records of mapWithState; ``stateSnapshots()`` gives the state itself."""

    def __init__(self, ssc, parent: DStream, spec: StateSpec):
        self._state_stream = InternalMapWithStateDStream(ssc, parent, spec)
        super().__init__(ssc, [self._state_stream])

    def compute(self, time_ms: int) -> RDD | None:
        rdd = self._state_stream.get_or_compute(time_ms)
        if isinstance(rdd, DriverState):  # read on the driver, no job
            return DriverRowsRDD(self._sc, compute=rdd.mapped, num_partitions=rdd.getNumPartitions())
        return None if rdd is None else rdd.flatMap(lambda r: r[1].mapped)

    def stateSnapshots(self) -> DStream:
        """``(key, state)`` of every key after each batch."""
        return TransformedDStream(self._ssc, [self._state_stream], self._state_stream.state_items)

    def checkpoint(self, interval: float) -> DStream:
        """The state's snapshot interval (Spark forwards it to the internal state stream)."""
        self._state_stream.checkpoint(interval)
        return self


def _state_items(_time_ms, rdds) -> RDD:
    """``stateSnapshots()``'s function in checkpoints of releases before the state host (their pickled
    graphs name it): the state rebuilt from each record."""
    state = rdds[0]
    if isinstance(state, DriverState):
        return DriverRowsRDD(state.ctx, compute=state.items, num_partitions=state.getNumPartitions())
    return state.flatMap(lambda r: r[1].state.values.items())


def map_with_state(parent: DStream, spec) -> DStream:
    if not isinstance(spec, StateSpec):
        raise TypeError(f"mapWithState takes a StateSpec, not {type(spec).__name__}")
    return MapWithStateDStream(parent.context(), parent, spec)
