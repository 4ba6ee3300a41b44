"""mapWithState's partitions between batches (engine/state/state_map.py): a base plus per-batch
layers that rebuild the exact state, and the live map a worker keeps, used only when it is the
state the record holds. Run on the partition function itself, as a worker runs it."""

from __future__ import annotations

import pickle
import random

import pytest

from engine.state import state_map
from engine.state.map_with_state import _update_partition
from engine.state.state_map import StateMap, StateRecord, take_state


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
    return list(state.values.items()), list(state.times.items()), list(state.removed.items())


def run(uid, batches, cold: bool):
    record, mapped = StateRecord.of(-1, StateMap(), []), []
    for i, data in enumerate(batches, 1):
        if cold:
            state_map._LIVE.clear()  # another worker each time: rebuilt from the record
        record = batch(uid, record, data, 500 * i)
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


def test_a_live_map_is_used_only_for_the_record_it_was_made_for():
    record = batch("u", StateRecord.of(-1, StateMap(), []), [("a", 1)], 500)
    live = state_map._LIVE[("u", 0)][1]
    assert take_state("u", 0, record) is live  # same stream, partition, batch: no unpickling
    state_map._keep_live("u", 0, 500, live, stale_before_ms=0)
    older = StateRecord(0, record.base, [], [])
    assert take_state("u", 0, older) is not live  # another batch's record is rebuilt
    assert ("u", 0) not in state_map._LIVE  # ... and the map was given up: never used twice


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


def test_stale_live_maps_of_a_stream_are_dropped():
    state_map._LIVE.clear()
    for i in range(4):
        state_map._keep_live("s", i, 500, StateMap(), stale_before_ms=0)
    state_map._keep_live("other", 0, 100, StateMap(), stale_before_ms=0)
    state_map._keep_live("s", 0, 1500, StateMap(), stale_before_ms=1000)  # batch 1000 ran elsewhere
    assert sorted(state_map._LIVE) == [("other", 0), ("s", 0)]
