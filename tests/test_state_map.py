"""mapWithState's partitions between batches (engine/state/state_map.py): a base plus per-batch
layers that rebuild the exact state, and the live map a worker keeps, used only when it is the
state the record holds. Run on the partition function itself, as a worker runs it."""

from __future__ import annotations

import pickle
import random

import pytest

from sparkwal.engine.state import state_map
from sparkwal.engine.state.map_with_state import _update_partition
from sparkwal.engine.state.state_map import StateMap, StateRecord, take_state


def counting(key, value, state):
    if value is None:
        return ("timeout", key, state.get())
    if value < 0:
        state.remove()
        return ("removed", key)
    state.update((state.getOption() or 0) + value)
    return (key, state.get())


def batch(uid, record, data, batch_ms, func=counting, timeout_ms=1500):
    """One task of batch ``batch_ms``: the state record (as the JVM hands it over, unpickled from
    bytes) then the batch's records; returns the new record, pickled and back."""
    record = pickle.loads(pickle.dumps(record))
    out = list(_update_partition(0, [(0, record), *data], func=func, uid=uid, batch_ms=batch_ms,
                                 timeout_ms=timeout_ms, forget_before_ms=batch_ms - 1500))
    assert len(out) == 1 and out[0][0] == 0
    return pickle.loads(pickle.dumps(out[0][1]))


def dump(state: StateMap):
    """Values, update order and removals (the order of ``values`` itself is no behaviour)."""
    return dict(state.values), list(state.times.items()), list(state.removed.items())


def run(uid, batches, cold: bool, timeout_ms=1500):
    record, mapped = StateRecord.of(-1, StateMap(), []), []
    for i, data in enumerate(batches, 1):
        if cold:
            state_map._LIVE.clear()  # another worker each time: rebuilt from the record
        record = batch(uid, record, data, 500 * i, timeout_ms=timeout_ms)
        mapped.append(record.mapped)
    return record, mapped


def test_layers_and_live_maps_give_exactly_the_state_a_cold_rebuild_gives(monkeypatch):
    rng = random.Random(7)
    keys = [f"k{i}" for i in range(300)]
    batches = [[(k, rng.choice([1, 2, 3, -1])) for k in rng.sample(keys, 40)] for _ in range(40)]
    cold, cold_mapped = run("cold", batches, cold=True)
    rebuilds = []
    rebuild = StateRecord.state.fget
    monkeypatch.setattr(StateRecord, "state", property(lambda r: rebuilds.append(r.time_ms) or rebuild(r)))
    hot, hot_mapped = run("hot", batches, cold=False)
    assert rebuilds == [-1]  # only the first state; every later batch found its live map
    assert hot_mapped == cold_mapped  # the same calls, timeouts included
    assert any(m[0] == "timeout" for ms in hot_mapped for m in ms)
    assert any(m[0] == "removed" for ms in hot_mapped for m in ms)
    assert dump(hot.state) == dump(cold.state)  # values, update order and removals alike
    assert dump(hot.state) == dump(state_map._LIVE[("hot", 0)][1])  # the live map is that state


def test_a_batch_appends_a_small_layer_and_keeps_the_base_until_the_layers_weigh_half_of_it():
    record = StateRecord.of(-1, StateMap(), [])
    record = batch("u", record, [(f"k{i}", 1) for i in range(5000)], 500, timeout_ms=None)
    base = record.base
    assert record.layers == [] or len(b"".join(record.layers)) * 2 < len(base)
    sizes = []
    for t in range(1000, 20000, 500):
        record = batch("u", record, [(f"k{t % 5000}", 1), ("new", 1)], t, timeout_ms=None)
        sizes.append((len(record.base), len(record.layers)))
    assert record.base == base or len(record.layers) < 38  # a few tiny layers: the same base
    assert max(n for _, n in sizes) >= 30, "a batch of two records rewrote the whole base"
    state = record.state
    assert state.values["new"] == 38 and len(state.values) == 5001


def test_a_live_map_is_used_only_for_records_whose_chain_holds_it():
    record = batch("u", StateRecord.of(-1, StateMap(), []), [("a", 1)], 500)
    live = state_map._LIVE[("u", 0)][1]
    assert take_state("u", 0, record) is live  # same stream, partition, record: no unpickling
    state_map.keep_live("u", 0, record.token, live)
    other = StateRecord(500, record.base, [], [])  # the same batch's state, another attempt's record
    assert take_state("u", 0, other) is not live  # not in its chain: rebuilt
    assert ("u", 0) not in state_map._LIVE  # ... and the map was given up: never used twice


def test_a_worker_whose_live_map_is_batches_old_catches_up_from_the_layers(monkeypatch):
    """Three workers take the batches in turn at random: each one applies the layers since its
    own last batch of the partition (across new bases, through their bridges), and rebuilds only
    when it holds no map of the chain or the bridge."""
    rng = random.Random(11)
    keys = [f"k{i}" for i in range(3000)]
    first = [(k, 1) for k in keys]
    batches = [first] + [[(k, rng.choice([1, 2, -1])) for k in rng.sample(keys, 300)] for _ in range(60)]
    cold, cold_mapped = run("cold", batches, cold=True, timeout_ms=None)
    rebuilds, rebuild = [], StateRecord.state.fget
    monkeypatch.setattr(StateRecord, "state", property(lambda r: rebuilds.append(r.time_ms) or rebuild(r)))
    workers = [{}, {}, {}]
    record, mapped, caught_up, bridged, stranded, bases = StateRecord.of(-1, StateMap(), []), [], 0, 0, 0, set()
    for i, data in enumerate(batches, 1):
        w = workers[rng.randrange(3)]
        monkeypatch.setattr(state_map, "_LIVE", w)
        held = w.get(("warm", 0))
        if held is None or record.layers_after(held[0]) is None:
            stranded += 1
        elif held[0] not in record.tokens:
            bridged += 1
        elif held[0] != record.token:
            caught_up += 1
        record = batch("warm", record, data, 500 * i, timeout_ms=None)
        mapped.append(record.mapped)
        bases.add(record.tokens[0])
    assert mapped == cold_mapped
    assert dump(record.state) == dump(cold.state)
    assert len(bases) >= 5, "the layers never added up to a new base"
    assert caught_up >= 20, "workers did not catch up from their older live maps"
    assert bridged >= 3, "no live map crossed a new base"
    assert len(rebuilds) - 2 == stranded <= 8  # -2: the two .state above; the rest: no map to start from


def test_a_new_base_keeps_the_chain_it_replaces_as_a_bridge_no_heavier_than_the_base():
    record = batch("b", StateRecord.of(-1, StateMap(), []), [(f"k{i}", 1) for i in range(2000)], 500,
                   timeout_ms=None)
    t, chain = 1000, None
    while record.layers or chain is None:  # small batches until one writes a new base
        chain = record.tokens
        record = batch("b", record, [(f"k{j}", 1) for j in range(t % 2000, t % 2000 + 100)], t,
                       timeout_ms=None)
        t += 500
    tokens, layers = record.bridge
    assert tokens == chain and len(layers) == len(chain)
    assert sum(map(len, layers)) <= len(record.base)
    old = pickle.loads(pickle.dumps(record))
    nxt = batch("b", record, [("x", 1)], t, timeout_ms=None)
    assert nxt.bridge == old.bridge  # carried until the next base
    assert nxt.layers_after(chain[1]) == [*layers[1:], *nxt.layers]
    assert nxt.layers_after(b"elsewhere") is None


def test_the_live_map_of_an_attempt_whose_record_was_thrown_away_is_never_used(monkeypatch):
    """Batch 1000 runs twice (say its first record was lost with its cache); the function is not
    deterministic, so the two attempts' states differ: the state goes on from the record kept."""
    attempts = iter([100, 1])

    def bump(key, value, state):
        state.update((state.getOption() or 0) + next(attempts))
        return key

    one, two = {}, {}
    monkeypatch.setattr(state_map, "_LIVE", one)
    first = batch("n", StateRecord.of(-1, StateMap(), []), [], 500)
    batch("n", first, [("a", 1)], 1000, func=bump)  # worker one keeps a map of batch 1000: a == 100
    monkeypatch.setattr(state_map, "_LIVE", two)
    kept = batch("n", first, [("a", 1)], 1000, func=bump)  # worker two: the record Spark kept
    monkeypatch.setattr(state_map, "_LIVE", one)
    after = batch("n", kept, [("b", 1)], 1500)  # worker one again
    assert after.state.values == {"a": 1, "b": 1}


def test_a_worker_that_restores_a_partition_from_a_snapshot_keeps_it_live(monkeypatch):
    from sparkwal.engine.state.map_with_state import _restore_partition

    state_map._LIVE.clear()
    [(index, record)] = _restore_partition(2, [("a", 1, 100), ("b", 2, 200)], uid="r")
    rebuilds, rebuild = [], StateRecord.state.fget
    monkeypatch.setattr(StateRecord, "state", property(lambda r: rebuilds.append(r) or rebuild(r)))
    state = take_state("r", 2, pickle.loads(pickle.dumps(record)))  # the same worker, next batch
    assert rebuilds == [] and dump(state) == ({"a": 1, "b": 2}, [("a", 100), ("b", 200)], [])


def test_a_batch_that_fails_half_way_leaves_no_half_updated_live_map():
    record = batch("f", StateRecord.of(-1, StateMap(), []), [("a", 1), ("b", 1)], 500)

    def fails_on_b(key, value, state):
        if key == "b":
            raise ValueError("boom")
        return counting(key, value, state)

    with pytest.raises(ValueError, match="boom"):
        batch("f", record, [("a", 5), ("b", 1)], 1000, func=fails_on_b)
    again = batch("f", record, [("a", 5), ("b", 1)], 1000)  # the retry
    assert again.state.values == {"a": 6, "b": 2}


def test_a_worker_keeps_live_maps_of_at_most_live_keys_keys_dropping_the_oldest_first():
    state_map._LIVE.clear()
    for i in range(3):
        state_map.keep_live("s", i, b"t%d" % i, StateMap({f"k{j}": j for j in range(10)}), live_keys=25)
    assert sorted(state_map._LIVE) == [("s", 1), ("s", 2)]
    state_map.keep_live("s", 1, b"again", StateMap({"x": 1}), live_keys=25)  # newest again
    state_map.keep_live("s", 3, b"t3", StateMap({f"k{j}": j for j in range(10)}), live_keys=25)
    assert sorted(state_map._LIVE) == [("s", 1), ("s", 2), ("s", 3)]  # 21 keys
    state_map.keep_live("s", 4, b"t4", StateMap({f"k{j}": j for j in range(10)}), live_keys=25)
    assert sorted(state_map._LIVE) == [("s", 1), ("s", 3), ("s", 4)]  # 2 was the oldest
    state_map.keep_live("big", 0, b"b", StateMap({f"k{j}": j for j in range(30)}), live_keys=25)
    assert ("big", 0) not in state_map._LIVE  # one map over the bound is not kept either


def test_state_snapshots_of_a_partition_its_batch_left_unchanged_do_no_work(monkeypatch):
    """``stateSnapshots()`` reads each partition through the reading worker's copy (``peek_state``). A
    batch with no record for a partition (and no timeout) keeps its record's chain: the copy is that
    very state, so reading it rebuilds nothing, applies no layer and unpickles nothing."""
    from sparkwal.engine.state.state_map import peek_state

    state_map._LIVE.clear()
    first = batch("u", StateRecord.of(-1, StateMap(), []), [("a", 1), ("b", 2)], 500, timeout_ms=None)
    read = peek_state("u", 0, pickle.loads(pickle.dumps(first)))  # the reader's copy made
    second = batch("u", first, [], 1000, timeout_ms=None)  # nothing for this partition
    assert second.tokens == first.tokens  # the same state
    handed = pickle.loads(pickle.dumps(second))  # (the record unpickled, as the JVM hands it over)
    work: list = []
    rebuild, apply, loads = StateRecord.state.fget, StateMap.apply, state_map.pickle.loads
    monkeypatch.setattr(StateRecord, "state", property(lambda r: work.append("rebuilt") or rebuild(r)))
    monkeypatch.setattr(StateMap, "apply", lambda m, layer: work.append("applied") or apply(m, layer))
    monkeypatch.setattr(state_map.pickle, "loads", lambda b: work.append("unpickled") or loads(b))
    again = peek_state("u", 0, handed)
    assert work == [] and again is read and dict(again.values) == {"a": 1, "b": 2}
