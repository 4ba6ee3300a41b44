"""Checkpoints written by a real PySpark Structured Streaming query, read by sparkwal; and real
Spark's restart decision matched by resolve_restart."""

from __future__ import annotations

import json
import uuid

import pytest

from sparkwal.checkpoint import (CommitLog, CommitMetadata, OffsetSeq, OffsetSeqLog, OffsetSeqMetadata,
                        resolve_restart)

pytestmark = pytest.mark.slow


@pytest.fixture
def spark(spark_context):
    from pyspark.sql import SparkSession

    session = SparkSession.builder.getOrCreate()
    session.conf.set("spark.sql.shuffle.partitions", "2")
    return session


def run_query(spark, src, ckpt):
    name = f"q{uuid.uuid4().hex[:8]}"
    query = (spark.readStream.schema("word string").json(str(src))
             .groupBy("word").count()
             .writeStream.outputMode("complete").format("memory").queryName(name)
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "query did not finish"
    assert query.exception() is None
    batches = [p["batchId"] for p in query.recentProgress]
    counts = {r["word"]: r["count"] for r in spark.sql(f"select * from {name}").collect()}
    return batches, counts


def test_real_spark_checkpoint_reads_round_trips_and_restarts_as_spark_does(spark, tmp_path):
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    src.mkdir()
    (src / "a.json").write_text('{"word":"a"}\n{"word":"b"}\n{"word":"a"}\n')
    batches, counts = run_query(spark, src, ckpt)
    assert batches == [0] and counts == {"a": 2, "b": 1}

    offsets, commits = OffsetSeqLog(str(ckpt / "offsets")), CommitLog(str(ckpt / "commits"))
    assert offsets.batch_ids() == [0] and commits.batch_ids() == [0]
    batch0 = offsets.get(0)
    assert isinstance(batch0, OffsetSeq)
    assert json.loads(batch0.offsets[0]) == {"logOffset": 0}
    assert batch0.metadata.conf["spark.sql.shuffle.partitions"] == "2"
    assert batch0.metadata.batch_timestamp_ms > 0
    # our writer produces Spark's exact bytes from values built in code
    on_disk = (ckpt / "offsets" / "0").read_bytes()
    rebuilt = OffsetSeq(list(batch0.offsets), OffsetSeqMetadata(
        batch0.metadata.batch_watermark_ms, batch0.metadata.batch_timestamp_ms,
        dict(batch0.metadata.conf)))
    assert offsets.serialize(rebuilt) == on_disk
    commit0 = commits.get(0)
    assert commits.serialize(CommitMetadata(commit0.next_batch_watermark_ms,
                                            commit0.state_unique_ids)) == \
        (ckpt / "commits" / "0").read_bytes()
    p = resolve_restart(offsets, commits)
    assert (p.batch_id, p.rerun, p.start_offsets) == (1, False, batch0.offsets)

    (src / "b.json").write_text('{"word":"b"}\n{"word":"c"}\n')
    batches, counts = run_query(spark, src, ckpt)
    assert batches == [1] and counts == {"a": 2, "b": 2, "c": 1}
    batch1 = offsets.get(1)

    # a driver that died after logging batch 1's offsets but before committing it (Hadoop's
    # local filesystem also wrote a .1.crc side file, which our listing ignores)
    assert sorted(p.name for p in (ckpt / "commits").iterdir()) == [".0.crc", ".1.crc", "0", "1"]
    assert commits.purge_after(0) == [1]  # removes Spark's .1.crc side file too
    assert sorted(p.name for p in (ckpt / "commits").iterdir()) == [".0.crc", "0"]
    p = resolve_restart(offsets, commits)
    assert (p.batch_id, p.rerun) == (1, True)
    assert p.start_offsets == batch0.offsets and p.end_offsets == batch1.offsets
    assert p.metadata.batch_timestamp_ms == batch1.metadata.batch_timestamp_ms
    batches, counts = run_query(spark, src, ckpt)  # and real Spark agrees: it re-runs batch 1
    assert batches == [1] and counts == {"a": 2, "b": 2, "c": 1}
    assert (ckpt / "offsets" / "1").read_bytes() == offsets.serialize(batch1)  # same offsets
