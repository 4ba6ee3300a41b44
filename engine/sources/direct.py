"""DirectInputDStream: each batch a planned offset range per source partition, read by tasks.

Planning (driver, once per batch time, before the batch's jobs exist): every partition's range
starts where the previous batch's ended (a partition new to the stream at its earliest offset) and
ends at the source's latest offset, limited by the rate (Spark's ``maxMessagesPerPartition``):

* the rate is the backpressure estimate (``spark.streaming.backpressure.enabled``: a PID
  estimator fed by completed batches; ``spark.streaming.backpressure.initialRate`` before its
  first estimate), shared between partitions in proportion to their lag and capped by
  ``spark.streaming.kafka.maxRatePerPartition`` (or the source-neutral
  ``spark.streaming.direct.maxRatePerPartition``); with no estimate the cap alone; each
  partition gets at least ``spark.streaming.kafka.minRatePerPartition`` (1) records per batch.

With a checkpoint, the plan goes to the offset log before any job runs, and a re-run batch takes
its ranges from there (:mod:`sparkwal.engine.sources.batch_log`). A source that changed under the stream
is checked here: a partition that disappears with records the stream never read, or whose latest
offset went below what a batch already planned, is a :class:`DataLossError` (``failOnDataLoss``,
default True; False logs a warning and goes on: a vanished partition is forgotten, one that went
backwards is read again from its new end). A partition that disappears after being read to its
end (a consumed file deleted) is forgotten with an info line.
"""

from __future__ import annotations

import logging
import threading

from pyspark import RDD

from sparkwal.tracker import RateController, create_rate_estimator

from .. import config
from ..config import StreamingConf
from ..inputs import InputDStream
from ..stream_machinery import empty_rdd
from ..errors import StreamingContextStateError
from .protocol import DataLossError, OffsetRange, ReplayableSource, SourceError, TopicPartition

log = logging.getLogger(__name__)

Ranges = dict[TopicPartition, tuple[int, int]]


def rate_limits(lags: dict[TopicPartition, int], batch_ms: int, estimated_rate: float,
                max_rate: float, min_rate: float) -> dict[TopicPartition, int] | None:
    """Records per partition this batch may take (Spark's ``maxMessagesPerPartition``); None: no
    limit. ``estimated_rate`` (records/s for the whole stream, <= 0: none) is split by lag."""
    total_lag = sum(lags.values())
    if estimated_rate > 0:
        per = {tp: estimated_rate * lag / total_lag if total_lag else 0.0 for tp, lag in lags.items()}
        if max_rate > 0:
            per = {tp: min(r, max_rate) for tp, r in per.items()}
    else:
        per = {tp: max_rate for tp in lags}
    if sum(per.values()) <= 0:
        return None
    secs = batch_ms / 1000
    return {tp: max(int(secs * r), int(min_rate)) for tp, r in per.items()}


class DirectInputDStream(InputDStream):
    """``ssc.directStream(source)``: one RDD partition per source partition with new records;
    each batch's RDD answers ``offsetRanges()``."""

    transient_fields = (*InputDStream.transient_fields, "_planned", "_ends", "_seen", "_plan_lock",
                  "_rate_controller", "_log")

    def __init__(self, ssc, source: ReplayableSource, fromOffsets: dict | None = None,
                 failOnDataLoss: bool = True):
        if not isinstance(source, ReplayableSource):
            raise TypeError(f"source must be an engine.sources.ReplayableSource, got {type(source).__name__}")
        super().__init__(ssc)
        self.source = source
        self.source_desc = source.describe()
        self.from_offsets = {_topic_partition(tp): int(o) for tp, o in (fromOffsets or {}).items()}
        #: fromOffsets came from a sink that committed: a partition it lacks is newer than its output
        self.unseen_from_earliest = bool(getattr(fromOffsets, "unseen_from_earliest", False))
        self.fail_on_data_loss = failOnDataLoss
        self._init_runtime()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._planned: dict[int, list[OffsetRange]] = {}  # batch time -> its ranges
        self._ends: dict[TopicPartition, int] | None = None  # None: not started yet
        self._seen: dict[TopicPartition, int] = {}  # the latest offsets seen last
        self._plan_lock = threading.Lock()
        self._rate_controller: RateController | None = None
        self._log = None  # the context's BatchLog when it checkpoints

    # ------------------------------------------------------------------ lifecycle (context)

    def start_planning(self, batch_log, settings: StreamingConf, batch_ms: int) -> None:
        """Called by start(): where planning resumes (the offset log's last entry, else the
        initial offsets, written to the log first) and the rate controller."""
        self._log = batch_log
        if settings[config.BACKPRESSURE]:
            self._rate_controller = RateController(
                self.input_id, create_rate_estimator(batch_ms, config.rate_conf(settings)), lambda rate: None)
        ends = batch_log.latest_ends(self) if batch_log is not None else None
        if ends is None:
            initial = batch_log.initial_offsets(self) if batch_log is not None else None
            if initial is None:
                initial = self._initial_offsets()
                if batch_log is not None:
                    batch_log.write_initial_offsets(self, initial)
            ends = initial
        elif self.from_offsets:
            log.info("%s: resuming from the offset log; fromOffsets are ignored", self)
        self._ends = dict(ends)

    def _initial_offsets(self) -> dict[TopicPartition, int]:
        parts = self.source.partitions()
        unseen = [tp for tp in parts if tp not in self.from_offsets]
        if unseen and getattr(self, "unseen_from_earliest", False):
            log.info("%s: %d partitions the sink's offsets do not name (%s...) start at their earliest offsets",
                     self, len(unseen), unseen[0])
            initial = self.source.earliest_offsets(unseen)
        else:
            initial = self.source.initial_offsets(unseen)
        return {**initial, **self.from_offsets}

    def stop(self) -> None:
        if self._rate_controller is not None:
            self._rate_controller.stop()
        self.source.close()

    def on_batch_completed(self, info) -> None:
        if self._rate_controller is not None and info is not None:
            self._rate_controller.on_batch_completed(info)

    # ------------------------------------------------------------------ planning (driver)

    def plan(self, time_ms: int) -> dict[TopicPartition, int]:
        """The batch's ranges (the logged ones when the batch is in the offset log); returns the
        end offset of every partition known, for the offset log."""
        with self._plan_lock:
            logged = self._log.logged_ranges(self, time_ms) if self._log is not None else None
            if logged is not None:
                ranges, ends = logged
            else:
                ranges, ends = self._plan_new()
            self._planned[time_ms] = ranges
            if logged is None:  # a re-run batch: planning resumes after the log's last entry
                self._ends = dict(ends)
            return ends

    def _plan_new(self) -> tuple[list[OffsetRange], dict[TopicPartition, int]]:
        if self._ends is None:
            raise StreamingContextStateError(f"{self} has not been started")
        src = self.source
        parts = src.partitions()
        latest = src.latest_offsets(parts)
        starts = dict(self._ends)
        for tp in [tp for tp in starts if tp not in latest]:
            self._vanished(tp, starts.pop(tp))
        new = [tp for tp in latest if tp not in starts]
        if new:
            earliest = src.earliest_offsets(new)
            for tp in new:
                starts[tp] = earliest.get(tp, 0)
                log.info("%s: new partition %s/%s, read from offset %d", self, tp.topic, tp.partition,
                         starts[tp])
        for tp, start in list(starts.items()):
            if latest[tp] < start:
                starts[tp] = self._backwards(tp, start, latest[tp])
        self._seen = dict(latest)
        lags = {tp: latest[tp] - s for tp, s in starts.items()}
        limits = rate_limits(lags, self._driver.batch_ms, self._estimated_rate(), *self._rate_conf())
        ends = {tp: s + (lags[tp] if limits is None else min(lags[tp], limits[tp]))
                for tp, s in starts.items()}
        ranges = [OffsetRange(tp.topic, tp.partition, starts[tp], ends[tp]) for tp in sorted(
            starts, key=lambda tp: (tp.topic, str(tp.partition)))]
        return ranges, ends

    def _vanished(self, tp: TopicPartition, planned_end: int) -> None:
        seen = self._seen.get(tp, planned_end)
        if seen <= planned_end:
            log.info("%s: partition %s/%s is gone after being read to its end (%d); forgotten",
                     self, tp.topic, tp.partition, planned_end)
            return
        msg = (f"{self}: partition {tp.topic}/{tp.partition} disappeared with records "
               f"[{planned_end}, {seen}) never read")
        if self.fail_on_data_loss:
            raise DataLossError(msg + " (directStream(..., failOnDataLoss=False) forgets it)")
        log.warning("%s; forgotten (failOnDataLoss=False)", msg)

    def _backwards(self, tp: TopicPartition, start: int, latest: int) -> int:
        msg = (f"{self}: the latest offset of partition {tp.topic}/{tp.partition} is {latest}, "
               f"below {start}, where the next batch starts: the partition was truncated or "
               "recreated")
        if self.fail_on_data_loss:
            raise DataLossError(msg + " (directStream(..., failOnDataLoss=False) reads on from "
                                "its new end)")
        log.warning("%s; reading on from %d (failOnDataLoss=False)", msg, latest)
        return latest

    def _estimated_rate(self) -> float:
        if self._rate_controller is None:
            return 0.0
        rate = self._rate_controller.latest_rate
        if rate > 0:
            return rate
        return self._driver.settings[config.INITIAL_RATE]

    def _rate_conf(self) -> tuple[float, float]:
        settings = self._driver.settings
        kafka = settings[config.KAFKA_MAX_RATE]
        return (settings[config.DIRECT_MAX_RATE] if kafka is None else kafka, settings[config.KAFKA_MIN_RATE])

    # ------------------------------------------------------------------ the RDDs

    def offset_ranges(self, time_ms: int) -> list[OffsetRange]:
        """The ranges of the batch at ``time_ms`` (planned, or read back from the offset log)."""
        with self._plan_lock:
            ranges = self._planned.get(time_ms)
            if ranges is None and self._log is not None:
                logged = self._log.logged_ranges(self, time_ms)
                if logged is not None:
                    ranges = self._planned[time_ms] = logged[0]
        if ranges is None:
            raise SourceError(f"{self}: no offset ranges for batch time {time_ms}: it was never "
                              "planned and is not in the offset log (purged, or before the stream)")
        return ranges

    def compute(self, time_ms: int) -> RDD | None:
        ranges = self.offset_ranges(time_ms)
        with_data = [r for r in ranges if r.untilOffset > r.fromOffset]
        self._driver.scheduler.report_input(time_ms, self, sum(r.count() for r in with_data),
                                {"offsetRanges": [list(r) for r in with_data]})
        if not with_data:
            rdd = empty_rdd(self._sc)
        else:
            payloads = [(r.topicPartition(), r.fromOffset, r.untilOffset,
                         self.source.read_hint(r.topicPartition(), r.fromOffset, r.untilOffset))
                        for r in with_data]
            rdd = self._sc.parallelize(payloads, len(payloads)).mapPartitions(
                _reader(self.source, f"{self.source_desc}, batch time {time_ms}"))
        rdd.offsetRanges = lambda: list(with_data)  # type: ignore[attr-defined]  # Spark's HasOffsetRanges
        return rdd

    def clear_metadata(self, time_ms: int) -> None:
        super().clear_metadata(time_ms)
        with self._plan_lock:
            for t in [t for t in self._planned if t <= time_ms - self.remember_ms]:
                del self._planned[t]

    def __repr__(self) -> str:
        return f"DirectInputDStream[{self.input_id}]({self.source_desc})"


def _topic_partition(tp) -> TopicPartition:
    """A (topic, partition) pair, or an object with ``topic`` and ``partition`` (pyspark 2's
    TopicAndPartition, confluent-kafka's TopicPartition)."""
    if hasattr(tp, "topic") and hasattr(tp, "partition"):
        return TopicPartition(tp.topic, tp.partition)
    return TopicPartition(*tp)


def _reader(source: ReplayableSource, where: str):
    """The task function: each payload's records, errors naming the batch."""

    def read(payloads):
        for tp, start, until, hint in payloads:
            try:
                yield from source.read(tp, start, until, hint)
            except SourceError as e:
                raise type(e)(f"{where}, {tp.topic}/{tp.partition} [{start}, {until}): {e}") from None

    return read
