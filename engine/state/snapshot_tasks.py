"""Writing and reading state snapshots with Spark's tasks (the files' format is
:mod:`sparkwal.checkpoint.state_files`').

Each task writes or reads its own partition's part, straight from or into the state cache: no
record goes through the driver, and no JVM object file (SequenceFile + Java serialisation) path
is involved. A snapshot read back keeps its layout: when part ``i`` holds exactly the keys that
``portable_hash`` (under the executors' current ``PYTHONHASHSEED``) puts in partition ``i`` of
``n``, the RDD read back carries that partitioner, in Python and in the JVM, so the next batch's
``cogroup`` (or mapWithState's partition-wise union) moves only the batch's records, never the
whole state.

The tasks reach the snapshots through a :class:`~sparkwal.wal.StorageLocation`: its options travel
with them, credentials never (the executors take theirs from their environment).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from pyspark import RDD, SparkContext
from pyspark.rdd import Partitioner, portable_hash

from sparkwal.checkpoint.state_chains import SnapshotRef
from sparkwal.checkpoint.state_files import (VERSION, SnapshotError, delete_snapshot, encode_part,
                                    merge_chain, part_rows, put_part, read_manifest, rows_table,
                                    write_manifest)
from sparkwal.wal import StorageLocation
from sparkwal.wal.storage import resolve

from . import versions

__all__ = ["ChainOnDriver", "DriverParts", "SnapshotError", "apply_delta", "chain_on_driver", "delete_snapshot",
           "hash_seed", "is_hash_partitioned", "read_chain", "write_snapshot"]


class DriverParts(NamedTuple):
    """Snapshot rows the driver holds, one list per state partition (a state held on the driver:
    :mod:`sparkwal.engine.state.driver_state`), written by :func:`write_snapshot` on the driver."""

    context: SparkContext
    parts: list


def hash_seed(sc: SparkContext) -> str | None:
    """The executors' ``PYTHONHASHSEED``: string keys hash (and so partition) by it."""
    return sc.environment.get("PYTHONHASHSEED")


def is_hash_partitioned(rdd: RDD) -> bool:
    n = rdd.getNumPartitions()
    return rdd.partitioner == Partitioner(n, portable_hash)


def write_snapshot(rows: RDD | DriverParts, url: str | StorageLocation, *, time_ms: int, base_ms: int | None,
                   partitioned: bool, storage_options: dict | None = None, fence=None,
                   state_version: int = 1) -> dict:
    """Write the rows ``(key, value, updated_ms, removed)`` of every partition of ``rows`` (an RDD,
    written by its tasks, or :class:`DriverParts`, written here) as snapshot ``url`` (a delta when
    ``base_ms`` is set), replacing an incomplete one a killed run left (of this epoch or an older
    one: none is referenced, or this one would not be written); return its manifest.
    ``storage_options`` go to the tasks too, but for credentials. ``fence``: the driver's
    leadership, checked before the driver deletes or writes anything (its epoch is recorded;
    ``url`` names it, see :mod:`sparkwal.checkpoint.state_files`). A newer epoch's snapshot of the
    same batch is never deleted: this driver may be the one that lost the leadership, still
    writing, and the new leader's checkpoints reference that one (without a ``fence``, every
    epoch's is replaced)."""
    if fence is not None:
        fence.check()
    where = StorageLocation.of(url, storage_options)
    storage, path = resolve(where)
    storage.makedirs(path.rpartition("/")[0])
    delete_snapshot(where, every_epoch=True, up_to_epoch=None if fence is None else fence.epoch)
    delta = base_ms is not None

    def write_part(index, records):
        keys, values, times, removed = [], [], [], []
        for k, v, t, r in records:
            keys.append(k)
            values.append(v)
            times.append(t)
            removed.append(r)
        data = encode_part(rows_table(keys, values, times, removed if delta else None))
        yield index, [len(keys), *put_part(where, index, data)]

    if isinstance(rows, RDD):
        parts = sorted(rows.mapPartitionsWithIndex(write_part).collect())
    else:  # rows the driver holds, one list per partition (a state held on the driver)
        parts = [entry for index, part in enumerate(rows.parts) for entry in write_part(index, iter(part))]
    manifest = {"version": VERSION, "format": "arrow-ipc", "compression": "zstd",
                "kind": "delta" if delta else "full", "time_ms": time_ms, "base_ms": base_ms,
                "num_partitions": len(parts), "partitioned": partitioned,
                "hash_seed": hash_seed(rows.context), "parts": [entry for _, entry in parts]}
    if state_version != 1:
        manifest["state_version"] = state_version
    if fence is not None:
        fence.check()
        manifest["leader_epoch"] = fence.epoch
    write_manifest(where, manifest)
    return manifest


def read_chain(sc: SparkContext, chain: list[SnapshotRef], storage_options: dict | None = None,
               version: tuple[int, Callable | None, str] | None = None) -> tuple[RDD, bool]:
    """The state at the chain's end as an RDD of rows ``(key, value, updated_ms)``, partition
    ``i`` from part ``i`` of every snapshot of the chain (merged in order, in parallel tasks), and
    whether it is hash-partitioned as it was written (then it carries the partitioner). The
    manifests are read now, so a missing or incomplete snapshot fails here, by name; the parts
    are read and checked by the tasks. ``version``: (the program's state version, its migrate
    function, the stream's name): values of an older version are migrated
    (:func:`sparkwal.engine.state.versions.migrated`)."""
    manifests = [read_manifest(ref.url, storage_options) for ref in chain]
    n = len(manifests[-1]["parts"])
    for ref, m in zip(chain, manifests):
        if len(m["parts"]) != n:
            raise SnapshotError(f"state snapshot {ref.url} has {len(m['parts'])} parts, the newest "
                                f"of its chain {n}: the chain cannot be merged")
    links = [(StorageLocation.of(ref.url, storage_options), m) for ref, m in zip(chain, manifests)]

    def read(i, seeds=()):
        for _ in seeds:  # a worker whose task left input unread is not reused: Spark forks
            pass         # (and the engine is imported into) a new one for the next task
        state = merge_chain(part_rows(where, i, m) for where, m in links)
        return ((k, v, t) for k, (v, t) in state.items())

    partitioned = n > 0 and all(m.get("partitioned") and m.get("hash_seed") == hash_seed(sc)
                                for m in manifests)
    if partitioned:  # n tiny seed records, shuffled so that the JVM knows the partitioner
        seeds = sc.parallelize([(i, None) for i in range(n)], n).partitionBy(n)
        rows = seeds.mapPartitionsWithIndex(read, preservesPartitioning=True)
    else:
        rows = sc.parallelize(range(n), n).flatMap(read) if n else sc.emptyRDD()
    if version is not None:
        rows = versions.migrated(rows, [ref.url for ref in chain], manifests, *version)
    return rows, partitioned


def apply_delta(sc: SparkContext, rows: RDD, ref: SnapshotRef, base_parts: int,
                storage_options: dict | None = None, state_version: int = 1) -> RDD | None:
    """The state at ``ref`` (a delta) as rows ``(key, value, updated_ms)``, as :func:`read_chain`
    gives them, from ``rows`` ``(key, value, updated_ms, removed)``: the state at the delta's base,
    hash-partitioned in ``base_parts`` partitions, each in update order. Partition ``i`` is merged
    with the delta's part ``i`` in its own task: no shuffle, and no file of the base read again.
    None when the delta is not laid out like the base, or its values are of another state version
    than ``state_version`` (then its chain is read whole, and migrated)."""
    manifest = read_manifest(ref.url, storage_options)
    if (manifest["kind"] != "delta" or len(manifest["parts"]) != base_parts
            or versions.written_at(manifest) != state_version
            or not manifest.get("partitioned") or manifest.get("hash_seed") != hash_seed(sc)):
        return None
    where = StorageLocation.of(ref.url, storage_options)

    def merge(i, base_rows):
        state = merge_chain([base_rows, part_rows(where, i, manifest)])
        return ((k, v, t) for k, (v, t) in state.items())

    return rows.mapPartitionsWithIndex(merge, preservesPartitioning=True)


#: how many parts the driver reads at once (an object store answers each read in tens of ms)
DRIVER_READERS = 16


class ChainOnDriver(NamedTuple):
    """A snapshot chain the driver may read itself, without a Spark job: a state restored from it
    that moves to the driver (:mod:`sparkwal.engine.state.driver_state`) is read here in a few
    milliseconds rather than by two jobs (its keys counted, then its records collected: 0.3-0.5 s
    on two cores), the first batch of a takeover included. Attached to the RDD read from it
    (:func:`chain_on_driver`)."""

    chain: list[SnapshotRef]
    storage_options: dict | None
    state_version: int

    def read(self, sc: SparkContext, num_partitions: int, max_keys: int) -> list[list[tuple]] | None:
        """Partition ``i``'s rows ``(key, value, updated_ms)`` in update order, from part ``i`` of
        every snapshot of the chain, for each of ``num_partitions``; None where the executors must
        read it instead: laid out otherwise (another partition count or ``PYTHONHASHSEED``), of
        another state version (migrated as it is read), or more than ``max_keys`` rows by its
        manifests (which count a key once per snapshot it is in: never fewer than it holds)."""
        manifests = [read_manifest(ref.url, self.storage_options) for ref in self.chain]
        seed = hash_seed(sc)
        if any(len(m["parts"]) != num_partitions or not m.get("partitioned") or m.get("hash_seed") != seed
               or versions.written_at(m) != self.state_version for m in manifests):
            return None
        if sum(entry[0] for m in manifests for entry in m["parts"]) > max_keys:
            return None
        links = [(StorageLocation.of(ref.url, self.storage_options), m) for ref, m in zip(self.chain, manifests)]

        def part(i: int) -> list[tuple]:
            state = merge_chain(part_rows(where, i, m) for where, m in links)
            return [(k, v, t) for k, (v, t) in state.items()]

        if num_partitions <= 1 or (num_partitions <= DRIVER_READERS and all(w.storage.is_local for w, _ in links)):
            # (a few parts on a local disk read in well under a ms: starting the pool's threads took
            # 20-60 ms of a takeover's first batch on two loaded cores; many, or on NFS, are read at once)
            return [part(i) for i in range(num_partitions)]
        with ThreadPoolExecutor(min(DRIVER_READERS, num_partitions), thread_name_prefix="sparkwal-state-read") as pool:
            return list(pool.map(part, range(num_partitions)))


def chain_on_driver(rdd: RDD, chain: ChainOnDriver | None = None) -> ChainOnDriver | None:
    """The chain ``rdd`` (a state read back from snapshots) was read from; with ``chain``, record it."""
    if chain is not None:
        setattr(rdd, "sparkwal_chain", chain)  # (pyspark's RDD takes attributes; it declares none of ours)
    return getattr(rdd, "sparkwal_chain", None)
