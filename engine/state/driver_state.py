"""mapWithState run on the driver, for batches whose records the driver already holds.

With ``spark.sparkwal.receiver.precompute``, a batch of a receiver stream's ``reduceByKey`` is rows
the driver holds (:mod:`sparkwal.engine.receiver.precompute`): no Spark job. A ``mapWithState``
after it would still cost one (the state's partitions zipped with the batch's, a Python task each,
the mapped records collected: 300-480 ms a batch on two cores, measured in docs/benchmarks.md),
longer than a 100 ms batch. So while its state holds at most ``spark.sparkwal.state.driverMaxKeys``
keys (100,000), the state lives on the driver, in the same ``n`` partitions and records as in the
executors (:class:`~sparkwal.engine.state.state_map.StateRecord`, the driver keeping each
partition's map live), and such a batch runs the mapping function there, once per record, in a few
milliseconds: the batch's RDDs are :class:`DriverState` (the state) and the mapped records'
:class:`~sparkwal.engine.driver_rows.DriverRowsRDD`, and the output that collects them runs no job.
The state's snapshots are written by the driver, in the same files and layout as the executors'
(:func:`sparkwal.engine.state.snapshot_tasks.write_snapshot`), so a restart, a standby or a batch
in the executors reads them alike.

The state moves to the executors (its records parallelized, partitioned as an executor state is,
at the next batch that needs them there) when a batch is not precomputed (a block without its
result, a re-run batch of a restart) or when the state outgrows the bound; it comes back (its
records collected, after a job that counts its keys) at a precomputed batch while it fits, tried
again at most once a checkpoint interval (10 s by default) after a refusal. Keys are placed by the
executors' own ``portable_hash`` (which depends on their ``PYTHONHASHSEED``, not necessarily the
driver's): the receivers send each key's hash with its combined value, so the driver never hashes a key.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from functools import partial
from itertools import chain
from typing import Callable

from pyspark import RDD, SparkContext
from pyspark.rdd import Partitioner, portable_hash

from ..driver_rows import DriverRowsRDD
from ..errors import StateError
from ..stream_machinery import known_empty
from .snapshot_tasks import ChainOnDriver, DriverParts, chain_on_driver
from .state_map import StateMap, StateRecord

log = logging.getLogger(__name__)

_RETRY_AFTER_MS = 10_000


def _released() -> list:
    raise StateError("mapWithState: this batch's state was released on the driver (a newer batch's "
                     "state replaced it)")


class DriverState(DriverRowsRDD):
    """A state stream's RDD for one batch, held on the driver: ``(i, StateRecord)`` for each of its
    ``n`` partitions, worked out when first used. Its JVM side, for a batch in the executors after
    it, is the records parallelized and partitioned as an executor state is."""

    def __init__(self, sc: SparkContext, n: int, compute: Callable[[], list]):
        super().__init__(sc, compute=compute, num_partitions=n, partitioner=Partitioner(n, portable_hash),
                         build=lambda records: sc.parallelize(records, n).partitionBy(n))
        self._mapped: list | None = None

    @property
    def key_count(self) -> int | None:
        """How many keys the state holds, once worked out."""
        with self._lock:
            return sum(r.keys for _, r in self._rows) if self.rows_known else None

    def mapped(self) -> list:
        """The batch's mapped records, in partition order (kept after :meth:`release`)."""
        with self._lock:
            if self._mapped is None:
                self._mapped = [m for _, record in self.rows() for m in record.mapped]
            return self._mapped

    def items(self) -> list:
        """``(key, state)`` of every key (``stateSnapshots()``)."""
        return [item for _, record in self.rows() for item in record.state.values.items()]

    def partition_rows(self, rows_of: Callable[[StateRecord], list]) -> DriverParts:
        return DriverParts(self.ctx, [list(rows_of(record)) for _, record in self.rows()])

    def release(self) -> None:
        """Forget the state once a newer batch's replaced it (its mapped records stay)."""
        with self._lock:
            if self.rows_known:
                self.mapped()
            self._rows, self._compute = None, _released
            self.unpersist()


def _refused(stream, time_ms: int) -> None:
    """The state stays in the executors: not brought back before a checkpoint interval has passed."""
    stream.driver_retry_ms = time_ms + (stream.checkpoint_ms or _RETRY_AFTER_MS)


def _empty_records(n: int) -> list:
    return [(i, StateRecord.of(-1, StateMap(), [])) for i in range(n)]


def _partitioned(data, n: int) -> list[list]:
    """The batch's records by state partition, placed by the hashes the executors worked out."""
    parts: list[list] = [[] for _ in range(n)]
    if isinstance(data, DriverRowsRDD):
        hashes = data.key_hashes
        for row in data.rows():
            parts[hashes[row[0]] % n].append(row)
    return parts


def driver_batch(stream, previous: RDD | None, data: RDD | None, time_ms: int, update: Callable,
                 bound: int, ahead: tuple[RDD, Future] | None = None, precomputed: bool = False
                 ) -> DriverState | None:
    """The state of ``stream`` (an ``InternalMapWithStateDStream``) at ``time_ms`` worked out on the
    driver from ``previous`` (the state before, None at the first batch) and ``data`` (the batch's
    records), calling ``update(i, records)`` per partition; None when the batch must run in the
    executors (see the module's docstring). ``bound``: ``spark.sparkwal.state.driverMaxKeys``;
    ``ahead``: a takeover's :func:`prefetch` of a state, used when it is ``previous``;
    ``precomputed``: the stream's batches may come from the receivers' results."""
    held = isinstance(data, DriverRowsRDD) and data.key_hashes is not None
    if bound <= 0 or not (held or known_empty(data)):
        return None
    sc, n = stream.context().sparkContext, stream.num_partitions
    records: Callable[[], list]
    if not held and previous is not None and not isinstance(previous, DriverState):
        # an empty batch does not bring a state to the driver (the batches after it may not be
        # precomputed), but for one read back from snapshots that the driver reads itself, without
        # a job: a restart's first batches, before the receivers' first blocks
        read = _chain_records(previous, bound) if precomputed else None
        if read is None:
            return None
        log.info("%s: the state (%d keys) moves to the driver, read from its snapshots", stream.creation_site, read[0])
        records = partial(list, read[1])
    elif isinstance(previous, DriverState):
        keys = previous.key_count
        if keys is not None and keys > bound:
            log.info("%s: the state holds %d keys, more than spark.sparkwal.state.driverMaxKeys (%d): "
                     "it moves to the executors", stream.creation_site, keys, bound)
            _refused(stream, time_ms)
            return None
        # rows worked out already are taken now: the state before is released once this batch
        # completes, and this one's may be worked out only later (nothing of the batch read them)
        records = partial(list, previous.rows()) if previous.rows_known else previous.rows
    elif previous is None:
        if stream.has_initial_state:
            return None
        records = partial(_empty_records, n)
    else:
        fetched = _fetch(stream, previous, time_ms, bound, ahead)
        if fetched is None:
            return None
        records = partial(list, fetched)

    def run() -> list:
        parts, out = _partitioned(data, n), []
        for i, record in records():
            out.extend(update(i, chain([(i, record)], parts[i])))
        return out

    return DriverState(sc, n, run)


#: how long a batch waits for a takeover's prefetch under way before collecting the state itself
PREFETCH_WAIT_S = 60.0


def prefetch(state: RDD, bound: int, ahead: Future, run: bool = True) -> None:
    """A takeover's read of the state its first batch starts from, beside the wait for that batch
    (whose generation would otherwise run these two jobs: 0.4-0.7 s on two cores): ``ahead``
    gets (keys, records or None when more than ``bound``), or the failure; ``run=False`` gives it up
    (cancelled: the batch collects the state itself)."""
    if not run or not ahead.set_running_or_notify_cancel():
        ahead.cancel()
        return
    try:
        ahead.set_result(_collect(state, bound))
    except BaseException as e:
        ahead.set_exception(e)
        raise


def _fetch(stream, previous: RDD, time_ms: int, bound: int, ahead: tuple[RDD, Future] | None) -> list | None:
    """An executor state's records, collected to the driver when it holds at most ``bound`` keys
    (counted first, by a job that moves no state); None when it does not, or not yet."""
    if time_ms < (stream.driver_retry_ms or 0):
        return None
    read = None
    if ahead is not None and ahead[0] is previous and not ahead[1].cancel():  # (not started: collected here)
        try:
            read = ahead[1].result(PREFETCH_WAIT_S)
        except Exception as e:  # noqa: BLE001  (cancelled, failed or late: collected here, as without it)
            log.debug("%s: the takeover's read of the state: %s", stream.creation_site, e)
    keys, records = read if read is not None else _collect(previous, bound)
    if records is None:
        _refused(stream, time_ms)
        return None
    log.info("%s: the state (%d keys%s) moves to the driver", stream.creation_site, keys,
             ", read ahead by the takeover" if read is not None else "")
    return records


def _collect(state: RDD, bound: int) -> tuple[int, list | None]:
    """(the keys ``state`` holds, its records in partition order, or None when more than ``bound``):
    read by the driver itself when it was read back from snapshots it can read
    (:class:`~sparkwal.engine.state.snapshot_tasks.ChainOnDriver`), else by two jobs."""
    read = _chain_records(state, bound)
    if read is not None:
        return read
    keys = sum(state.map(lambda r: r[1].keys).collect())
    return keys, sorted(state.collect(), key=lambda r: r[0]) if 0 <= keys <= bound else None


def state_of_snapshot(stream, chain: ChainOnDriver, bound: int) -> DriverState | None:
    """The state of ``stream`` (an ``InternalMapWithStateDStream``) at a committed batch a restart
    re-generates, read by the driver from ``chain``, the snapshot taken after it, with no RDD of
    the batch or of the state before it (its mapped records were output before the restart: it has
    none); None where the driver cannot read it (as :func:`_chain_records`)."""
    sc, n = stream.context().sparkContext, stream.num_partitions
    read = _chain_read(chain, sc, n, bound) if bound > 0 else None
    if read is None:
        return None
    log.info("%s: the state (%d keys) moves to the driver, read from its snapshots", stream.creation_site, read[0])
    held = DriverState(sc, n, partial(list, read[1]))
    held.rows()  # (known: the next batch takes them, not this object, which is released)
    return held


def _chain_records(state: RDD, bound: int) -> tuple[int, list] | None:
    """(keys, records) of ``state`` read by the driver from the snapshots it was read back from, or
    None where it cannot (not read back, laid out otherwise, more than ``bound`` keys, a storage
    error: the executors' jobs read it then, as they would without this)."""
    chain = chain_on_driver(state)
    return _chain_read(chain, state.context, state.getNumPartitions(), bound) if chain is not None else None


def _chain_read(chain: ChainOnDriver, sc: SparkContext, n: int, bound: int) -> tuple[int, list] | None:
    try:
        parts = chain.read(sc, n, bound)
    except Exception as e:  # noqa: BLE001  (any failure of a shortcut: the jobs that read it anyway)
        log.warning("the driver could not read the state from its snapshots (%s): the executors read it", e)
        return None
    if parts is None:
        return None
    records = [(i, StateRecord.of(-1, StateMap.of_rows(rows), []))
               for i, rows in enumerate(parts)]
    return sum(len(rows) for rows in parts), records
