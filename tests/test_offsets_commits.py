"""Ports of OffsetSeqLogSuite and CommitLogSuite with Spark's golden files
(sql/core/src/test/resources/structured-streaming/)."""

from __future__ import annotations

import os

import pytest

from sparkwal.checkpoint import (CommitLog, CommitMetadata, MalformedLogError, OffsetMap, OffsetSeq,
                        OffsetSeqLog, OffsetSeqMetadata, UnsupportedLogVersionError)

GOLDEN_OFFSETS_2_1_0 = (b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1480981499528}\n'
                        b'{"logOffset":345}\n{"topic-0":{"0":1}}')
GOLDEN_CKPT_2_1_0_OFFSETS_0 = b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1489085905815}\n2'
GOLDEN_2_3_1_OFFSETS_1 = (
    b'v1\n{"batchWatermarkMs":5000,"batchTimestampMs":1531991878604,"conf":{"spark.sql.shuffle.'
    b'partitions":"5","spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.'
    b'execution.streaming.state.HDFSBackedStateStoreProvider"}}\n1')
GOLDEN_OFFSET_MAP_3 = (
    b'v2\n{"batchWatermarkMs":0,"batchTimestampMs":1758651405232,"conf":{"spark.sql.streaming.'
    b'stateStore.providerClass":"org.apache.spark.sql.execution.streaming.state.RocksDBStateStore'
    b'Provider","spark.sql.streaming.join.stateFormatVersion":"2","spark.sql.streaming.stateStore.'
    b'compression.codec":"lz4","spark.sql.shuffle.partitions":"5"}}\n0:3')
GOLDEN_COMMIT_V1 = b'v1\n{"nextBatchWatermarkMs":1}'
GOLDEN_COMMIT_V2 = (b'v2\n{"nextBatchWatermarkMs":0,"stateUniqueIds":{"0":[["unique_id1","unique_id2"],'
                    b'["unique_id3","unique_id4"]],"1":[["unique_id5","unique_id6"],["unique_id7",'
                    b'"unique_id8"]]}}')
GOLDEN_COMMIT_V2_EMPTY = b'v2\n{"nextBatchWatermarkMs":0,"stateUniqueIds":{}}'
GOLDEN_COMMIT_LEGACY = b"v1\n{}"


def put(tmp_path, name, batch, data):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / str(batch)).write_bytes(data)
    return str(d)


# ------------------------------------------------------------------------------ OffsetSeqMetadata

def test_offset_seq_metadata_deserialization():
    assert OffsetSeqMetadata.from_json("{}") == OffsetSeqMetadata(0, 0, {})
    assert OffsetSeqMetadata.from_json('{"batchWatermarkMs":1}') == OffsetSeqMetadata(1, 0, {})
    assert OffsetSeqMetadata.from_json('{"batchTimestampMs":2}') == OffsetSeqMetadata(0, 2, {})
    assert OffsetSeqMetadata.from_json('{"batchWatermarkMs":1,"batchTimestampMs":2}') == \
        OffsetSeqMetadata(1, 2, {})
    assert OffsetSeqMetadata.from_json(
        '{"batchWatermarkMs":1,"batchTimestampMs":2,"conf":{"spark.sql.shuffle.partitions":2}}'
    ) == OffsetSeqMetadata(1, 2, {"spark.sql.shuffle.partitions": "2"})  # numbers become strings
    assert OffsetSeqMetadata.from_json(
        '{"batchWatermarkMs":1,"batchTimestampMs":2,"unknown":3}') == OffsetSeqMetadata(1, 2, {})
    assert OffsetSeqMetadata.from_json(
        '{"batchWatermarkMs":1,"batchTimestampMs":2} trailing junk') == OffsetSeqMetadata(1, 2, {})


def test_offset_seq_metadata_is_written_as_spark_writes_it():
    m = OffsetSeqMetadata(5000, 1531991878604, {"spark.sql.shuffle.partitions": "5"})
    assert m.to_json() == ('{"batchWatermarkMs":5000,"batchTimestampMs":1531991878604,'
                           '"conf":{"spark.sql.shuffle.partitions":"5"}}')


# ------------------------------------------------------------------------------ OffsetSeqLog

def test_offset_seq_log_serialization_round_trip(tmp_path):
    log = OffsetSeqLog(str(tmp_path / "offsets"))
    batch0 = OffsetSeq(['{"logOffset":1}', None, '{"a":2}'], OffsetSeqMetadata(0, 10, {"k": "v"}))
    batch1 = OffsetSeq(['{"logOffset":2}', '{"b":1}', None], None)
    assert log.add(0, batch0) and log.add(1, batch1)
    assert not log.add(1, batch0)  # duplicates ignored
    again = OffsetSeqLog(str(tmp_path / "offsets"))
    assert again.get(0) == batch0 and again.get(1) == batch1
    assert (tmp_path / "offsets" / "1").read_bytes() == b'v1\n\n{"logOffset":2}\n{"b":1}\n-'


def test_an_inspection_of_a_query_with_no_commit_yet_creates_nothing(tmp_path):
    """Inspectors only read: a checkpoint with offsets and no commit keeps having no ``commits/``."""
    from sparkwal.checkpoint.inspect import inspect_checkpoint

    ckpt = tmp_path / "query"
    ckpt.mkdir()
    put(ckpt, "offsets", 0, GOLDEN_CKPT_2_1_0_OFFSETS_0)
    report = inspect_checkpoint(str(ckpt))
    assert report.offsets.ids == [0] and report.commits.ids == [] and report.restart.rerun
    assert sorted(os.listdir(ckpt)) == ["offsets"]
    assert CommitLog(str(ckpt / "commits"), create=False).get_latest() is None
    assert not (ckpt / "commits").exists()


def test_log_written_by_a_future_version(tmp_path):
    d = put(tmp_path, "offsets", 0, b'v99999\n{}\n1')
    with pytest.raises(UnsupportedLogVersionError, match="v99999"):
        OffsetSeqLog(d).get(0)


@pytest.mark.parametrize("name,data,expected", [
    ("offset-log-version-2.1.0", GOLDEN_OFFSETS_2_1_0,
     OffsetSeq(['{"logOffset":345}', '{"topic-0":{"0":1}}'], OffsetSeqMetadata(0, 1480981499528))),
    ("checkpoint-version-2.1.0", GOLDEN_CKPT_2_1_0_OFFSETS_0,
     OffsetSeq(["2"], OffsetSeqMetadata(0, 1489085905815))),
    ("checkpoint-version-2.3.1", GOLDEN_2_3_1_OFFSETS_1,
     OffsetSeq(["1"], OffsetSeqMetadata(5000, 1531991878604, {
         "spark.sql.shuffle.partitions": "5",
         "spark.sql.streaming.stateStore.providerClass":
             "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"}))),
])
def test_read_spark_golden_offset_files_and_write_them_back_exactly(tmp_path, name, data, expected):
    log = OffsetSeqLog(put(tmp_path, name, 0, data))
    value = log.get(0)
    assert value == expected
    assert log.get_latest() == (0, expected)
    assert log.serialize(value) == data  # writing back what was read reproduces Spark's bytes
    copy = OffsetSeqLog(str(tmp_path / f"{name}-copy"))
    copy.add(0, value)
    assert (tmp_path / f"{name}-copy" / "0").read_bytes() == data


def test_modern_spark_files_are_reproduced_from_values_built_in_code(tmp_path):
    """Spark >= 2.2 always writes conf: a freshly built value serialises to the same bytes."""
    log = OffsetSeqLog(str(tmp_path))
    fresh = OffsetSeq(["1"], OffsetSeqMetadata(5000, 1531991878604, {
        "spark.sql.shuffle.partitions": "5",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"}))
    assert fresh.source_bytes is None
    assert log.serialize(fresh) == GOLDEN_2_3_1_OFFSETS_1


def test_offset_map_golden_file_version_2(tmp_path):
    log = OffsetSeqLog(put(tmp_path, "offset-map", 3, GOLDEN_OFFSET_MAP_3))
    value = log.get(3)
    assert isinstance(value, OffsetMap)
    assert value.offsets == {"0": "3"}
    assert value.metadata.batch_timestamp_ms == 1758651405232
    assert value.metadata.conf["spark.sql.shuffle.partitions"] == "5"
    assert log.serialize(value) == GOLDEN_OFFSET_MAP_3
    fresh = OffsetMap(dict(value.offsets), value.metadata)
    assert log.serialize(fresh) == GOLDEN_OFFSET_MAP_3


def test_offset_map_without_separator_is_malformed(tmp_path):
    d = put(tmp_path, "offsets", 0, b'v2\n{}\nno-colon-here')
    with pytest.raises(MalformedLogError, match="Invalid OffsetMap format"):
        OffsetSeqLog(d).get(0)


def test_offset_file_tolerates_one_trailing_newline(tmp_path):
    d = put(tmp_path, "offsets", 0, GOLDEN_CKPT_2_1_0_OFFSETS_0 + b"\n")
    assert OffsetSeqLog(d).get(0).offsets == ["2"]


def test_empty_offset_file_is_incomplete(tmp_path):
    d = put(tmp_path, "offsets", 0, b"")
    with pytest.raises(MalformedLogError, match="Incomplete log file"):
        OffsetSeqLog(d).get(0)


# ------------------------------------------------------------------------------ CommitLog

@pytest.mark.parametrize("data,expected", [
    (GOLDEN_COMMIT_V1, CommitMetadata(1)),
    (GOLDEN_COMMIT_V2, CommitMetadata(0, {0: [["unique_id1", "unique_id2"], ["unique_id3", "unique_id4"]],
                                          1: [["unique_id5", "unique_id6"], ["unique_id7", "unique_id8"]]})),
    (GOLDEN_COMMIT_V2_EMPTY, CommitMetadata(0, {})),
    (GOLDEN_COMMIT_LEGACY, CommitMetadata(0)),
])
def test_commit_log_golden_files(tmp_path, data, expected):
    log = CommitLog(put(tmp_path, "commits", 1, data))
    assert log.get(1) == expected
    assert log.serialize(log.get(1)) == data
    if data != GOLDEN_COMMIT_LEGACY:  # Spark never writes "{}" any more
        assert log.serialize(CommitMetadata(expected.next_batch_watermark_ms,
                                            expected.state_unique_ids)) == data


def test_commit_log_round_trip(tmp_path):
    log = CommitLog(str(tmp_path / "commits"))
    assert log.add(0, CommitMetadata(0)) and log.add(1, CommitMetadata(7))
    assert (tmp_path / "commits" / "1").read_bytes() == b'v1\n{"nextBatchWatermarkMs":7}'
    assert CommitLog(str(tmp_path / "commits")).get_latest() == (1, CommitMetadata(7))


def test_commit_log_from_the_future(tmp_path):
    d = put(tmp_path, "commits", 0, b'v3\n{}')
    with pytest.raises(UnsupportedLogVersionError):
        CommitLog(d).get(0)
