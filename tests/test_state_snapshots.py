"""State snapshot files: typed Arrow columns where the values read back exactly, pickles (named in
the schema) otherwise, chains merged in order with their partitioner kept, incomplete snapshots
never read, and version 1 (pickled) snapshots of earlier releases still read."""

from __future__ import annotations

import io
import json
import pickle

import crc32c
import pytest
from pyspark.rdd import Partitioner, portable_hash

from sparkwal.checkpoint.state_chains import SnapshotRef, parse_state, state_table
from sparkwal.checkpoint.state_files import (
    column_values,
    decode_part,
    delete_snapshot,
    encode_part,
    rows_table,
    snapshot_files,
)
from sparkwal.engine import SnapshotError
from sparkwal.engine.state.snapshot_tasks import apply_delta, read_chain, write_snapshot


@pytest.mark.parametrize("values, arrow_type", [
    (["x", None, "z"], "string"), ([1, 2**62, None], "int64"), ([0.5, float("nan")], "double"),
    ([True, False], "bool"), ([b"\x00", b"\xff"], "binary"),
    ([{"n": 1, "tags": ["a"]}, {"n": 2, "tags": []}], "struct<n: int64, tags: list<item: string>>"),
    ([[1, 2], []], "list<item: int64>"),
])
def test_plain_values_are_typed_columns(values, arrow_type):
    table = decode_part(encode_part(rows_table(values, values, [0] * len(values))), "t")
    assert str(table.schema.field("value").type) == arrow_type
    back = column_values(table, "value")
    assert [type(v) for v in back] == [type(v) for v in values]
    assert repr(back) == repr(values)


@pytest.mark.parametrize("values", [
    [1, "mixed"], [1, 2.5], [(1, 2)], [2**70], [{"a": 1}, {"b": 2}], [{1: "non-str field"}], [[1, 2.5]],
    [frozenset({1})],
], ids=["mixed", "int-float", "tuple", "big-int", "struct-fields-differ", "int-dict-keys",
        "nested-int-float", "set"])
def test_other_values_are_pickled_and_the_schema_says_so(values):
    table = decode_part(encode_part(rows_table(["k"] * len(values), values, [0] * len(values))), "t")
    assert table.schema.field("value").type == "binary"
    assert table.schema.metadata[b"sparkwal.pickled"] == b"value"
    assert column_values(table, "value") == values


def test_state_table_is_keyed_and_typed_or_pickled():
    typed = state_table({"a": (1, 0), "b": (2, 0)}, "s")
    assert typed.column_names == ["key", "value"] and str(typed.schema.field("value").type) == "int64"
    pickled = state_table({("a", 1): ({1, 2}, 0)}, "s")
    assert pickled.schema.metadata[b"sparkwal.pickled"] == b"key,value"


def full_and_delta(sc, tmp_path, n: int) -> str:
    """Snapshots ``<base>500`` (keys k0-k999, value i) and ``<base>1000``, a delta (k1 = -1, k2
    removed, new = 7), in ``n`` hash-partitioned parts; return ``<base>``."""
    full = sc.parallelize([(f"k{i}", i) for i in range(1000)]).partitionBy(n)
    base = str(tmp_path / "state" / "0-")
    write_snapshot(full.mapPartitions(lambda kvs: ((k, v, 500, False) for k, v in kvs), True),
                   base + "500", time_ms=500, base_ms=None, partitioned=True)
    delta = sc.parallelize([("k1", -1, 1000, False), ("k2", None, 1000, True), ("new", 7, 1000, False)])
    delta = delta.map(lambda r: (r[0], r)).partitionBy(n).values()  # each key in its partition
    write_snapshot(delta, base + "1000", time_ms=1000, base_ms=500, partitioned=True)
    return base


def test_a_chain_is_merged_in_order_and_keeps_its_partitioner(spark_context, tmp_path):
    sc = spark_context
    n = 3
    base = full_and_delta(sc, tmp_path, n)
    chain = [SnapshotRef(500, base + "500"), SnapshotRef(1000, base + "1000", 500)]

    rows, partitioned = read_chain(sc, chain)
    assert partitioned and rows.partitioner == Partitioner(n, portable_hash)
    state = rows.map(lambda r: (r[0], r[1]), preservesPartitioning=True)
    got = dict(state.collect())
    assert got["k1"] == -1 and "k2" not in got and got["new"] == 7 and got["k999"] == 999
    assert len(got) == 1000
    # the state joins new data partition by partition: no stage moves the state
    joined = state.union(sc.parallelize([("k1", 1)]).partitionBy(n))
    assert joined.getNumPartitions() == n

    manifest = tmp_path / "state" / "0-1000.manifest"
    whole = manifest.read_bytes()
    manifest.write_bytes(whole[:len(whole) // 2])  # torn: a store that lost the end of the write
    with pytest.raises(SnapshotError, match=r"manifest .*0-1000.manifest is damaged"):
        read_chain(sc, chain)
    manifest.unlink()  # as if its writer died before the manifest
    with pytest.raises(SnapshotError, match=r"0-1000 is missing or incomplete \(no .*0-1000.manifest\)"):
        read_chain(sc, chain)
    delete_snapshot(base + "1000")
    assert snapshot_files(base + "1000") == []


def test_a_delta_applies_to_the_cached_state_at_its_base_without_reading_the_base_again(
        spark_context, tmp_path):
    """How a hot standby keeps its preloaded state current: the state at the base, cached, plus
    the delta's parts, partition by partition."""
    sc = spark_context
    n = 3
    base = full_and_delta(sc, tmp_path, n)
    delta = SnapshotRef(1000, base + "1000", 500)
    before, _ = read_chain(sc, [SnapshotRef(500, base + "500")])
    before = before.map(lambda r: (*r, False), preservesPartitioning=True).cache()
    assert before.count() == 1000
    delete_snapshot(base + "500")  # from here on only the cache holds the base

    after = apply_delta(sc, before, delta, n)
    assert after.partitioner == Partitioner(n, portable_hash)
    got = {k: (v, t) for k, v, t in after.collect()}
    assert len(got) == 1000 and got["k1"] == (-1, 1000) and "k2" not in got
    assert got["new"] == (7, 1000) and got["k999"] == (999, 500)

    other = sc.parallelize([("k1", 5, 1500, False)], 1)  # one part: not laid out like the base
    write_snapshot(other, base + "1500", time_ms=1500, base_ms=1000, partitioned=False)
    assert apply_delta(sc, after, SnapshotRef(1500, base + "1500", 1000), n) is None
    before.unpersist()


def test_version_1_snapshots_of_earlier_releases_are_still_read(spark_context, tmp_path):
    """The first release's snapshots: pickled record lists, ``{"version": 1}`` manifests, and
    checkpoints naming them as ``{time: url}``."""
    records = [(f"k{i}", {"n": i}) for i in range(100)]
    url = tmp_path / "state" / "2-5000"
    url.parent.mkdir()
    parts = []
    for i, chunk in enumerate([records[:60], records[60:]]):
        buf = io.BytesIO()
        pickle.dump(chunk, buf)
        data = buf.getvalue()
        (tmp_path / "state" / f"2-5000.part-{i:05d}").write_bytes(data)
        parts.append([len(chunk), len(data), crc32c.crc32c(data)])
    (tmp_path / "state" / "2-5000.manifest").write_text(json.dumps({"version": 1, "parts": parts}))

    (stream,) = parse_state({"2": {"5000": str(url)}}).values()
    assert stream.name == "state-2" and stream.chain(5000) == [SnapshotRef(5000, str(url))]
    rows, partitioned = read_chain(spark_context, stream.chain(5000))
    assert not partitioned  # the first release did not record its layout: one re-shuffle
    assert sorted((k, v) for k, v, _ in rows.collect()) == sorted(records)


def test_a_snapshot_written_under_a_leadership_carries_its_epoch_and_replaces_every_epochs_leftovers(
        spark_context, tmp_path):
    """Parts are written by tasks, which a fenced driver may still be running: the snapshot's name
    carries the writing driver's epoch, so a stale epoch's parts are never what a later checkpoint
    references; writing a batch's snapshot removes what earlier epochs (or a killed run) left."""
    from sparkwal.wal import resolve

    storage, root = resolve(str(tmp_path / "ckpt"))
    storage.lead(root).release()  # epoch 1, now released
    lead = storage.lead(root)
    assert lead.epoch == 2
    state_dir = tmp_path / "ckpt" / "state"
    state_dir.mkdir()
    for leftover in ("0-1000.part-00000", "0-1000-e1.part-00001", "0-1000-e1.manifest"):
        (state_dir / leftover).write_bytes(b"stale")
    (state_dir / "0-10000-e1.part-00000").write_bytes(b"another batch's")
    url = f"{state_dir}/0-1000-e{lead.epoch}"
    rows = spark_context.parallelize([("k", 1, 1000, False)], 2)
    manifest = write_snapshot(rows, url, time_ms=1000, base_ms=None, partitioned=False, fence=lead)
    assert manifest["leader_epoch"] == 2
    assert sorted(p.name for p in state_dir.iterdir()) == [
        "0-1000-e2.manifest", "0-1000-e2.part-00000", "0-1000-e2.part-00001", "0-10000-e1.part-00000"]
    rdd, _ = read_chain(spark_context, [SnapshotRef(1000, url)])
    assert rdd.collect() == [("k", 1, 1000)]
    lead.release()
