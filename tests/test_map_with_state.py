"""mapWithState: Spark's semantics (a call per record in order, timeouts exactly once, removal,
initial state, the state's snapshots), and a batch that touches only its own keys (its delta
snapshot holds exactly them). Restores from delta chains: tests/test_state_crash.py."""

from __future__ import annotations

import sys

import pytest
from pyspark import cloudpickle
from test_engine_recovery import Completed, ms

from sparkwal.checkpoint.state_chains import checkpoint_state, summarize_state
from sparkwal.engine import State, StateSpec, StreamingContext, read_state
from sparkwal.wal import ManualClock

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its mapping functions run in tasks


def run_batches(sc, batches, spec, *, checkpoint=None, interval=None, until=None, conf_deltas=None,
                between=None):
    """Run ``batches`` (one list of (key, value) per 0.5 s batch) through mapWithState on a manual
    clock; return the mapped records and the state after each batch, by batch time."""
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext(sc, 0.5, clock=clock)
    if checkpoint is not None:
        ssc.checkpoint(str(checkpoint))
    mapped = ssc.queueStream([sc.parallelize(b, 2) for b in batches], default=sc.emptyRDD()).mapWithState(spec)
    if interval is not None:
        mapped.checkpoint(interval)
    out, states = {}, {}
    mapped.foreachRDD(lambda t, rdd: out.__setitem__(ms(t), rdd.collect()))
    mapped.stateSnapshots().foreachRDD(lambda t, rdd: states.__setitem__(ms(t), dict(rdd.collect())))
    ssc.addStreamingListener(done)
    ssc.start()
    for i in range(1, (until or len(batches)) + 1):
        clock.advance(500)
        done.wait_for(500 * i)
        if between is not None:
            between(ssc, 500 * i)
    ssc.stop(stopSparkContext=False)
    return out, states


def running_sum(key, value, state):
    if value is None:
        return ("timed out", key, state.get(), state.isTimingOut())
    total = (state.getOption() or 0) + value
    if total < 0:
        state.remove()
        return ("removed", key)
    state.update(total)
    return (key, total)


def test_one_call_per_record_in_order_with_removal_and_initial_state(spark_context):
    spec = (StateSpec.function(running_sum).numPartitions(1)
            .initialState(spark_context.parallelize([("a", 100), ("z", 7)])))
    out, states = run_batches(spark_context, [
        [("a", 1), ("b", 2), ("a", 3)],
        [("b", -10), ("c", 1)],
        [("b", 5)],
    ], spec)
    assert out[500] == [("a", 101), ("b", 2), ("a", 104)]  # every record, in its partition's order
    assert states[500] == {"a": 104, "b": 2, "z": 7}
    assert out[1000] == [("removed", "b"), ("c", 1)]
    assert states[1000] == {"a": 104, "c": 1, "z": 7}
    assert out[1500] == [("b", 5)]  # a removed key starts again from no state
    assert states[1500] == {"a": 104, "b": 5, "c": 1, "z": 7}


def test_idle_keys_time_out_exactly_once_and_data_keeps_a_key_alive(spark_context):
    spec = StateSpec.function(running_sum).timeout(1.0).numPartitions(3)
    batches = [[("a", 1), ("b", 1)], [("a", 1)], [("a", 1)], [("a", 1)], [], [], [], []]
    out, states = run_batches(spark_context, batches, spec)
    timeouts = [(t, r) for t, rs in out.items() for r in rs if r[0] == "timed out"]
    # b was last updated at 500: idle for more than 1 s at 2000; a at 2000: idle at 3500
    assert timeouts == [(2000, ("timed out", "b", 1, True)), (3500, ("timed out", "a", 4, True))]
    assert states[2000] == {"a": 4} and states[3500] == {} and states[4000] == {}


def test_a_timing_out_state_cannot_be_updated_or_removed(spark_context):
    def misbehave(key, value, state):
        if value is not None:
            state.update(value)
            return "set"
        errors = []
        for attempt in (lambda: state.update(1), state.remove):
            try:
                attempt()
            except ValueError as e:
                errors.append(str(e))
        return errors

    out, _ = run_batches(spark_context, [[("k", 1)], [], [], []],
                         StateSpec.function(misbehave).timeout(0.5))
    assert out[1500] == [["Cannot update the state that is timing out",
                          "Cannot remove the state that is timing out"]]


def test_state_object_rules():
    st = State()
    st.wrap(False, None)
    assert not st.exists() and st.getOption() is None
    with pytest.raises(LookupError, match="State is not set"):
        st.get()
    st.update(3)
    assert st.exists() and st.get() == 3
    st.remove()
    assert not st.exists()
    with pytest.raises(ValueError, match="after it has been removed"):
        st.update(4)
    with pytest.raises(ValueError, match="already been removed"):
        st.remove()
    with pytest.raises(TypeError, match="StateSpec.function needs a function"):
        StateSpec.function(42)
    with pytest.raises(ValueError):
        StateSpec.function(running_sum).timeout(0)


@pytest.mark.compat
def test_a_batch_rewrites_only_its_keys_deltas_hold_them_and_read_state_is_typed(spark_context, tmp_path):
    keys = [f"key{i}" for i in range(2000)]
    batches = [[(k, 1) for k in keys], [(k, 1) for k in keys[:20]], [("key5", -100)], []]
    ckpt = tmp_path / "ckpt"
    out, states = run_batches(spark_context, batches, StateSpec.function(running_sum).numPartitions(4),
                              checkpoint=ckpt, interval=0.5)
    assert len(states[2000]) == 1999 and states[2000]["key0"] == 2 and "key5" not in states[2000]
    (summary,) = summarize_state(_state_entry(ckpt), verify=True)
    assert summary.name.startswith("mapWithState-") and summary.problems == []
    kinds = [(c["kind"], c["rows"]) for c in summary.chain]
    # 500: every key; 1000: the 20 keys with data; 1500: one removal; 2000: nothing changed
    assert kinds == [("full", 2000), ("delta", 20), ("delta", 1), ("delta", 0)]

    table = read_state(str(ckpt))[summary.name]
    assert table.schema.field("key").type == "string" and table.schema.field("value").type == "int64"
    assert dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist())) == states[2000]


def _state_entry(ckpt) -> dict:
    streams = checkpoint_state(str(ckpt))
    return {str(i): s.to_json() for i, s in streams.items()}


@pytest.mark.slow
def test_the_command_shows_verifies_and_exports_the_state(spark_context, tmp_path):
    import pyarrow.parquet as parquet

    from test_cli import as_json, sparkwal

    ckpt = tmp_path / "ckpt"
    _, states = run_batches(spark_context, [[(f"k{i}", i) for i in range(300)], [("k1", 5)]],
                            StateSpec.function(running_sum).numPartitions(2), checkpoint=ckpt,
                            interval=0.5)
    out = sparkwal("checkpoint", "inspect", ckpt, expect=0).stdout
    assert "state mapWithState-" in out and "full@" in out and "delta@" in out and "(1 rows" in out
    (name,) = [s["name"] for s in as_json(sparkwal("checkpoint", "inspect", ckpt, "--json", expect=0))["state"]]
    shown = sparkwal("checkpoint", "state", ckpt, "--limit", "3", expect=0).stdout
    assert f"{name}: 300 keys, key string, value int64" in shown and "297 more" in shown
    sparkwal("checkpoint", "state", ckpt, "--out", tmp_path / "s.parquet", expect=0)
    table = parquet.read_table(tmp_path / "s.parquet")
    assert dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist())) == states[1000]
    assert sparkwal("checkpoint", "state", ckpt, "--stream", "nope", expect=2).stderr.count(name) == 1

    assert "OK:" in sparkwal("checkpoint", "verify", ckpt, expect=0).stdout
    delta = max((ckpt / "state").glob("*-1000-e*.part-*"), key=lambda p: p.stat().st_size)
    delta.write_bytes(delta.read_bytes()[:-1])
    problem = sparkwal("checkpoint", "verify", ckpt, expect=1).stdout
    assert f"state snapshot part {delta}" in problem and "is damaged" in problem
    assert sparkwal("checkpoint", "state", ckpt, expect=1).stderr.count(delta.name) == 1


def test_a_lost_cached_state_is_recomputed_from_the_last_full_snapshot_and_the_inputs_since(
        spark_context, tmp_path):
    """After a delta snapshot the cached state goes on being served (its lineage reaches back to
    the last full snapshot): losing every cached partition, as an executor loss would, recomputes
    it exactly; and the checkpoint keeps the inputs of every batch since that full snapshot."""
    batches = [[(f"k{(i * 7 + j) % 23}", j + 1) for j in range(6)] for i in range(12)]
    spec = StateSpec.function(running_sum).numPartitions(2)
    expected, totals = {}, {}
    for i, b in enumerate(batches, 1):  # running sums of positive values: nothing removed
        for k, v in b:
            totals[k] = totals.get(k, 0) + v
        expected[500 * i] = dict(totals)
    floors = {}

    def lose_every_cached_partition(ssc, t):
        snapshots = ssc.driver.snapshots
        floors[t] = (snapshots.floor(t), dict(snapshots.roots),
                     {i: sorted(s.snapshots) for i, s in snapshots.by_stream.items()})
        if t in (2500, 4000):
            for rdd in list(spark_context._jsc.getPersistentRDDs().values()):
                rdd.unpersist(True)

    _, states = run_batches(spark_context, batches, spec, checkpoint=tmp_path / "ckpt", interval=1.0,
                            between=lose_every_cached_partition)
    assert states == expected
    floor, roots, snapshots = floors[4500]
    (index, root), = roots.items()
    assert snapshots[index][-1] > root, "no delta after the full snapshot: nothing tested"
    assert floor <= root  # the inputs since the last full snapshot are kept


@pytest.mark.slow
def test_a_full_snapshot_ends_the_lineage_once_it_reaches_back_max_lineage_batches(spark_context, tmp_path):
    """Deltas alone would let the state's lineage grow for deltasPerFull intervals (here 1000); a
    full snapshot read back ends it once it reaches back MAX_LINEAGE_BATCHES batches (the soak's
    driver died of a StackOverflowError deserializing a task with ~160 batches of lineage)."""
    from sparkwal.engine.state.snapshots import MAX_LINEAGE_BATCHES

    live_conf = spark_context._jsc.sc().conf()
    live_conf.set("spark.sparkwal.state.deltasPerFull", "1000")
    keys = [f"key{i}" for i in range(20_000)]  # a large full snapshot: the small deltas stay under it
    batches = [[(k, 1) for k in keys]] + [[(keys[i], 1)] for i in range(MAX_LINEAGE_BATCHES + 2)]
    ckpt = tmp_path / "ckpt"
    try:
        run_batches(spark_context, batches, StateSpec.function(running_sum).numPartitions(2),
                    checkpoint=ckpt, interval=0.5)
    finally:
        live_conf.remove("spark.sparkwal.state.deltasPerFull")
    (summary,) = summarize_state(_state_entry(ckpt), verify=True)
    assert [(c["time_ms"], c["kind"]) for c in summary.chain] == [
        (500 * (MAX_LINEAGE_BATCHES + 1), "full"), (500 * (MAX_LINEAGE_BATCHES + 2), "delta"),
        (500 * (MAX_LINEAGE_BATCHES + 3), "delta")]
