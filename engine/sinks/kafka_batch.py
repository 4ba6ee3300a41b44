"""The whole-batch way of :class:`~sparkwal.engine.sinks.KafkaSink`: a batch's records ready
before its transaction begins.

The driver produces a batch in one Kafka transaction, and the broker aborts a transaction open
longer than ``transaction.timeout.ms``: so the Spark jobs that compute the batch run first, and
the transaction lasts only as long as producing takes. The executors encode the records; the
partitions that fit their share of the driver's budget (``collect_limit_bytes``, at most half of
``spark.driver.maxResultSize``) come to the driver in up to ``defaultParallelism`` concurrent
jobs and wait there; a larger partition is computed into the executors' storage (memory, then
disk) by a job of its own and fetched from there, alone, once the transaction is open. The
driver holds the budget and one such partition at most.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from functools import partial

from .kafka_markers import KafkaSinkError
from .kafka_records import BIG, ERROR, encode_partition, parse_size


class ReadyRecords:
    """The records of batch ``batch_time_ms`` (``rdd``'s elements), computed on construction:
    iterate for each partition's list of ``(key, value)`` bytes; :meth:`release` frees the
    executors' copies of large partitions."""

    def __init__(self, sink, batch_time_ms: int, rdd):
        self.sink, self.batch_time_ms, self.rdd = sink, batch_time_ms, rdd
        self.fitting: list[list] = []
        self.big: list[int] = []
        self._cached = None
        sc = rdd.context
        live_conf = sc._jsc.sc().conf()  # (SparkContext.getConf copies every setting: 20 ms a batch)
        result_limit = parse_size(live_conf.get("spark.driver.maxResultSize", "1g")) or sink.collect_limit_bytes
        partitions = rdd.getNumPartitions()
        budget = min(sink.collect_limit_bytes, result_limit // 2) // max(1, partitions)
        fitting = rdd.mapPartitionsWithIndex(partial(encode_partition, budget_bytes=budget))
        jobs = max(1, min(partitions, sc.defaultParallelism))
        groups = [list(range(i, partitions, jobs)) for i in range(jobs) if i < partitions]
        properties = sc._jsc.sc().getLocalProperties().clone()  # the batch's job group, its pool

        def run(rdd_, group: list[int], fn=_identity) -> list:
            sc._jsc.sc().setLocalProperties(properties)  # (inheritable_thread_target's way, no warning)
            return sc.runJob(rdd_, fn, group)

        with ThreadPoolExecutor(len(groups) or 1, thread_name_prefix="kafka-sink") as pool:
            for done in as_completed([pool.submit(run, fitting, g) for g in groups]):
                for index, kind, payload in done.result():
                    if kind == BIG:
                        self.big.append(index)
                    else:
                        self.fitting.append(self._checked(kind, payload))
        if self.big:
            try:
                self._keep_big(run)
            except BaseException:
                self.release()
                raise

    def _keep_big(self, run) -> None:
        """The large partitions computed into the executors' storage (memory, then disk)."""
        from pyspark import StorageLevel

        self.big.sort()
        cached = self._cached = self.rdd.mapPartitionsWithIndex(partial(encode_partition, budget_bytes=None))
        cached.persist(StorageLevel.MEMORY_AND_DISK)
        for kind, error in run(cached, self.big, _kinds):  # computed and kept, not sent to the driver
            self._checked(kind, error)

    def __iter__(self) -> Iterator[list]:
        yield from self.fitting
        self.fitting = []
        for index in self.big:
            ((_i, kind, payload),) = self.rdd.context.runJob(self._cached, _identity, [index])
            yield self._checked(kind, payload)

    def _checked(self, kind: str, payload):
        if kind == ERROR:
            raise KafkaSinkError(f"{self.sink.name}: batch {self.batch_time_ms}: {payload}")
        return payload

    def release(self) -> None:
        if self._cached is not None:
            self._cached.unpersist()
            self._cached = None


def _identity(results):
    return results


def _kinds(results) -> list:
    """A large partition's result kind and error only (its records stay in the executor's storage)."""
    return [(kind, payload if kind == ERROR else None) for _index, kind, payload in results]
