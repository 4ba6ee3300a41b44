"""Two attempts of one range never both become visible in the Kafka sink, whatever interleaves:
a speculative or retried task, an attempt whose commit hides behind another transaction, a
paused old driver's task (a broker in memory with Kafka's fencing and ``read_committed``
semantics: tests/fake_kafka.py); and on the Tansu broker: a retry that finds its earlier
attempt's commit keeps the stream going, batches are judged by offsets not batch times, every
planned partition is in the sink's offsets, a partition the sink never saw starts at its earliest
offset, and a batch's jobs run before its transaction opens."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from sparkwal.engine import StreamingContext
from sparkwal.engine.sinks import KafkaSink
from sparkwal.engine.sinks import kafka_partitions
from sparkwal.engine.sinks.kafka_partitions import produce_partition
from sparkwal.engine.sources import OffsetRange, SinkOffsets, TopicPartition
from sparkwal.wal import ManualClock

from fake_kafka import Broker
from sink_helpers import Completed
from test_kafka_sink import lines_in

WAIT_S = 30
CONF = {"bootstrap.servers": "fake:9092", "transactional.id": "sparkwal-s"}


@pytest.fixture
def fake(monkeypatch):
    broker = Broker({"out": 2, "out.markers": 1})
    monkeypatch.setitem(sys.modules, "confluent_kafka", broker.module())
    return broker


def attempt(source_range=(0, 5), batch_time_ms=1000, last_writer=None, records=None, **kwargs):
    start, until = source_range
    plan = [("src", 0, start, until, False, last_writer)]
    rows = records if records is not None else [f"r{i}" for i in range(start, until)]
    options = {"conf": CONF, "topic": "out", "marker_topic": "out.markers", "name": "s",
               "batch_time_ms": batch_time_ms, "markers_from": 0, "timeout_s": 5, **kwargs}
    return list(produce_partition(0, iter(rows), plan, **options))


def visible(fake) -> tuple[list[bytes], list[dict]]:
    data = [r.value for p in (0, 1) for r in fake.records("out", p)]
    return sorted(data), [json.loads(r.value) for r in fake.records("out.markers")]


def test_a_second_attempt_fences_the_first_which_cannot_commit_after_it(fake, monkeypatch):
    """Attempt 0 has produced its records and marker and not committed (speculation, an executor
    declared lost while its task runs); attempt 1, on another worker, writes and commits; attempt
    0's commit then fails: the range is in once."""
    at_commit, go, outcomes = threading.Event(), threading.Event(), {}

    def pause_attempt_0(_producer):
        if threading.current_thread().name == "attempt-0":
            at_commit.set()
            assert go.wait(WAIT_S)

    fake.before_commit = pause_attempt_0
    # (the previous release's ids were per worker slot: two workers' attempts had two ids)
    monkeypatch.setattr(kafka_partitions, "SLOT", 0, raising=False)
    def first_attempt():
        try:
            outcomes["first"] = attempt()
        except RuntimeError as e:  # fenced: the task fails, and Spark keeps the other attempt's result
            outcomes["first"] = e

    first = threading.Thread(target=first_attempt, name="attempt-0")
    first.start()
    assert at_commit.wait(WAIT_S)
    monkeypatch.setattr(kafka_partitions, "SLOT", 1, raising=False)
    second = attempt()
    go.set()
    first.join(WAIT_S)
    assert [o[1] for o in second] == ["written"]
    fenced = outcomes["first"]
    assert isinstance(fenced, RuntimeError) and "fenced by another attempt of [0, 5)" in str(fenced)
    data, markers = visible(fake)
    assert data == sorted(f"r{i}".encode() for i in range(5))
    assert [(m["from"], m["until"]) for m in markers] == [(0, 5)]


def test_a_retry_waits_for_transactions_that_hide_its_earlier_attempts_commit(fake):
    """Attempt 0 committed, but another task's transaction, open before its marker, holds the
    marker topic's last stable offset back: the retry waits for it, sees the commit, writes nothing."""
    other = sys.modules["confluent_kafka"].Producer({"transactional.id": "other-task"})
    other.init_transactions()

    def open_another_transaction_first(producer, topic):
        first_marker = not fake.records("out.markers", committed=False)
        if topic == "out.markers" and producer.txid != "other-task" and first_marker:
            other.begin_transaction()
            other.produce("out.markers", b'{"sink": "another"}', b"another")

    fake.before_produce = open_another_transaction_first
    assert [o[1] for o in attempt()] == ["written"]
    retry: dict = {}
    thread = threading.Thread(target=lambda: retry.update(outcomes=attempt()))
    thread.start()
    assert fake.waiting.wait(WAIT_S)  # the retry's reader stopped below the marker topic's end
    other.commit_transaction()
    thread.join(WAIT_S)
    assert [o[1] for o in retry["outcomes"]] == ["skipped"]
    assert visible(fake)[0] == sorted(f"r{i}".encode() for i in range(5))


def test_a_paused_old_drivers_task_starting_late_writes_nothing_twice(fake):
    """The new driver's task committed the range; the old driver's task, resumed, starts a fresh
    producer (a first attempt): it finds the range in, or refuses a range that disagrees."""
    assert [o[1] for o in attempt()] == ["written"]
    assert [o[1] for o in attempt()] == ["skipped"]
    [(_i, outcome, detail, _w)] = attempt(source_range=(0, 7), batch_time_ms=500)
    assert outcome == "failed" and "reads src/0 [0, 7) but the Kafka topic out's output ends at offset 5" in detail
    assert visible(fake)[0] == sorted(f"r{i}".encode() for i in range(5))


def test_a_tasks_records_are_read_before_its_transaction_opens_and_a_timed_out_one_is_named(fake):
    events = fake.events

    def rows():
        for i in range(3):
            events.append("read")
            yield f"r{i}"

    assert [o[1] for o in attempt(source_range=(0, 3), records=rows())] == ["written"]
    assert events == ["read", "read", "read", "begin sparkwal-s-src-0"]

    def broker_aborted(_producer):
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(47, "INVALID_PRODUCER_EPOCH", "the transaction timed out"))

    fake.before_commit = broker_aborted
    [(_i, outcome, detail, _w)] = attempt(source_range=(3, 4), batch_time_ms=2000, transaction_timeout_ms=0)
    assert outcome == "failed" and "longer than the producer's transaction.timeout.ms (0 ms)" in detail


# ---------------------------------------------------------------------- on the Tansu broker

def test_a_retry_that_finds_its_earlier_attempts_commit_keeps_the_stream_going(spark_context, broker, topic):
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "retry", per_partition=True)
    sink.offsets()  # the sink's producer started: the partitions' ids are fenced when first written
    conf = {"bootstrap.servers": broker, "transactional.id": "sparkwal-retry"}
    marker_topic, markers_from = sink.marker_topic, sink.watermarks.of(sink, sink.marker_topic, 0)[1]

    def an_earlier_attempt_commits_first(_index, rows):
        from sparkwal.engine.sinks.kafka_partitions import produce_partition

        rows = list(rows)
        list(produce_partition(0, iter(rows), [("log", "p0", 0, 3, False, None)], conf, topic, marker_topic,
                               "retry", 1000, markers_from, 30))
        return rows

    rdd = spark_context.parallelize([("p0", "a"), ("p0", "b"), ("p0", "c")], 1)
    sink.write_partitions(1000, [OffsetRange("log", "p0", 0, 3)],
                          rdd.mapPartitionsWithIndex(an_earlier_attempt_commits_first))
    assert lines_in(sink) == ["a", "b", "c"]
    assert sink.write_partitions(1500, [OffsetRange("log", "p0", 3, 4)], spark_context.parallelize([("p0", "d")], 1))
    assert lines_in(sink) == ["a", "b", "c", "d"]


def test_batches_are_judged_by_offsets_and_every_planned_partition_is_in_the_offsets(spark_context, broker, topic):
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "grid")
    p0, p1 = TopicPartition("log", "p0"), TopicPartition("log", "p1")
    assert sink.write_batch(2000, [OffsetRange("log", "p0", 0, 2), OffsetRange("log", "p1", 7, 7)],
                            spark_context.parallelize(["a", "b"], 1))
    # an old driver on another batch grid: an earlier batch time, the next offsets: written
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 2, 3), OffsetRange("log", "p1", 7, 7)],
                            spark_context.parallelize(["c"], 1))
    # a later batch time whose offsets are in: not written again
    assert not sink.write_batch(3000, [OffsetRange("log", "p0", 2, 3)], spark_context.parallelize(["c"], 1))
    assert lines_in(sink) == ["a", "b", "c"]
    fresh = KafkaSink(topic, {"bootstrap.servers": broker}, "grid")
    assert fresh.offsets() == {p0: 3, p1: 7} and isinstance(fresh.offsets(), SinkOffsets)
    parts = KafkaSink(topic, {"bootstrap.servers": broker}, "grid-parts", per_partition=True)
    assert parts.write_partitions(1000, [OffsetRange("log", "p0", 0, 2), OffsetRange("log", "p1", 4, 4)],
                                  spark_context.parallelize([("p0", "x"), ("p0", "y")], 1))
    again = KafkaSink(topic, {"bootstrap.servers": broker}, "grid-parts", per_partition=True)
    assert again.offsets() == {p0: 2, p1: 4}


def test_a_partition_known_only_by_an_empty_ranges_marker_is_owned_by_its_first_records(
        spark_context, broker, topic):
    """Per partition: p1 was planned empty at 100 (its marker says where it stood); a stream that
    reads it from 0 writes, its data marker owns the end, and a re-run writes nothing twice."""
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "owned", per_partition=True)
    assert sink.write_partitions(1000, [OffsetRange("log", "p0", 0, 1), OffsetRange("log", "p1", 100, 100)],
                                 spark_context.parallelize([("p0", "a")], 1))
    assert sink.offsets()[TopicPartition("log", "p1")] == 100
    rows = spark_context.parallelize([("p1", "b"), ("p1", "c")], 1)
    assert sink.write_partitions(2000, [OffsetRange("log", "p1", 0, 2)], rows)
    again = KafkaSink(topic, {"bootstrap.servers": broker}, "owned", per_partition=True)
    assert not again.write_partitions(2000, [OffsetRange("log", "p1", 0, 2)], rows)  # a re-run: in
    assert again.offsets()[TopicPartition("log", "p1")] == 2 and lines_in(again) == ["a", "b", "c"]


def test_a_batchs_jobs_run_before_its_transaction_opens(spark_context, broker, topic, tmp_path):
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "ready")
    real = sink.producer()
    done_at_begin = []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def begin_transaction(self):
            done_at_begin.append(len(os.listdir(tmp_path)))
            return real.begin_transaction()

    sink._producer = Recording()
    where = str(tmp_path)

    def computed(x):
        open(os.path.join(where, str(x)), "w").close()
        return str(x)

    rdd = spark_context.parallelize(range(4), 4).map(computed)
    assert sink.write_batch(1000, [OffsetRange("log", "p0", 0, 4)], rdd)
    assert done_at_begin == [4] and lines_in(sink) == ["0", "1", "2", "3"]


def test_a_partition_the_sinks_offsets_lack_starts_at_its_earliest_offset(spark_context, broker, topic):
    """A partition added while the program was down (absent from a sink's offsets): its records
    are read from the earliest offset, not skipped by auto.offset.reset=largest; a plain dict of
    fromOffsets leaves such a partition to the reset rule."""
    from confluent_kafka import Producer

    from sparkwal.engine.kafka import KafkaSource

    producer = Producer({"bootstrap.servers": broker, "log_level": 0})
    for p in (0, 1):
        for i in range(3):
            producer.produce(topic, f"p{p}-{i}".encode(), partition=p)
            producer.flush(30)  # (one record a batch: Tansu's watermarks count a batch as one offset)

    def first_batch(from_offsets) -> list[str]:
        clock, completed, seen = ManualClock(0), Completed(), []
        ssc = StreamingContext(spark_context, 0.5, clock=clock)
        source = KafkaSource([topic], {"bootstrap.servers": broker, "auto.offset.reset": "largest"})
        stream = ssc.directStream(source, fromOffsets=from_offsets)
        stream.foreachRDD(lambda rdd: seen.extend(v for _k, v in rdd.collect()))
        ssc.addStreamingListener(completed)
        ssc.start()
        try:
            clock.advance(500)
            completed.wait_for(1)
        finally:
            ssc.stop(stopSparkContext=False)
        return sorted(seen)

    assert first_batch(SinkOffsets({TopicPartition(topic, 0): 1})) == ["p0-1", "p0-2", "p1-0", "p1-1", "p1-2"]
    assert first_batch({TopicPartition(topic, 0): 1}) == ["p0-1", "p0-2"]
