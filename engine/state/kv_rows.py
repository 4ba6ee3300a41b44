"""How a stateful stream whose RDDs are its state as ``(key, value)`` records (updateStateByKey,
the incremental windowed reduce) becomes snapshot rows and comes back from them.

Every stateful stream answers the same four questions (:class:`sparkwal.engine.state.snapshots.
StateSnapshots` asks them); mapWithState answers them its own way
(:mod:`sparkwal.engine.state.map_with_state`).
"""

from __future__ import annotations

from pyspark import RDD

from .snapshot_tasks import is_hash_partitioned


def _equal(a, b) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # noqa: BLE001  (values whose == is not a bool: treat as changed)
        return False


class KeyValueState:
    """Mixin of stateful streams with ``(key, value)`` records."""

    #: The state RDD at a batch time is what the batch's outputs see, so a restart may serve a
    #: snapshot for a batch it re-runs.
    state_is_output = True
    # what the stream classes it is mixed into define
    state_operator: str
    generated_rdds: dict[int, RDD]
    _superseded: dict[int, RDD]

    def state_name(self, index: int) -> str:
        return f"{self.state_operator}-{index}"

    def state_partitioned(self, rdd: RDD) -> bool:
        return is_hash_partitioned(rdd)

    def state_rows(self, rdd: RDD, time_ms: int) -> RDD:
        return rdd.mapPartitions(lambda kvs: ((k, v, time_ms, False) for k, v in kvs),
                                 preservesPartitioning=True)

    def state_delta_rows(self, rdd: RDD, since_ms: int, time_ms: int) -> RDD | None:
        """The keys changed or removed since the snapshot at ``since_ms``, by comparing with the
        state then (still cached, or read back from its snapshot) partition by partition: no
        shuffle. None when the two are not partitioned alike (a full snapshot is written)."""
        before = self._superseded.get(since_ms) or self.generated_rdds.get(since_ms)
        if before is None or not (is_hash_partitioned(rdd) and before.partitioner == rdd.partitioner):
            return None
        both = before.mapValues(lambda v: (0, v)).union(rdd.mapValues(lambda v: (1, v)))
        if both.getNumPartitions() != rdd.getNumPartitions():
            return None  # the JVM did not zip them

        def diff(records):
            old = {}
            for k, (side, v) in records:  # the earlier state's partition comes first
                if side == 0:
                    old[k] = v
                elif k not in old or not _equal(old.pop(k), v):
                    yield k, v, time_ms, False
            for k in old:
                yield k, None, time_ms, True

        return both.mapPartitions(diff)

    def state_from_rows(self, rows: RDD, partitioned: bool) -> RDD:
        return rows.mapPartitions(lambda it: ((k, v) for k, v, _ in it), preservesPartitioning=partitioned)
