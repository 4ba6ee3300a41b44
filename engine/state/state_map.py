"""mapWithState's state partitions: a map with update order, and how it is held between batches.

PySpark caches a partition in the JVM as pickled bytes, so a state kept only there costs a
whole-partition unpickle and pickle every batch, whatever the batch touched. Three things keep a
batch's work proportional to its records instead:

- **Layers.** A cached :class:`StateRecord` is a *base* (the pickled :class:`StateMap` at some
  batch) plus one small *layer* per batch since: the keys the batch put (with their values) and
  removed, as columns, applied in bulk (C loops over dicts, no Python call per key). A batch
  appends its layer and re-emits the base's bytes unchanged (a memory copy, no pickling); once
  the layers add up to half the base (or :data:`MAX_LAYERS`), the batch writes a new base
  instead. Anyone can rebuild the state from the record alone: the base, then the layers in
  order (:meth:`StateRecord.state`), which reproduces the update order exactly.
- **Live maps.** A Python worker keeps the :class:`StateMap` it last produced for each partition
  (:data:`_LIVE`, keyed by the state stream's per-run id and the partition), with the token of
  the record it produced. Every record names the tokens of its base and of each of its layers
  (its *chain*). When a worker is handed a record whose chain holds its live map's token, it
  applies only the layers after it: no unpickling of the base, and nothing at all when the live
  map is that very record's state. Spark does not pin partitions to workers (a task of a cached
  state runs two Python workers, the state's and its reader's, so four or more take turns on
  two cores), so a live map is often a few batches old: it catches up.
- **Bridges.** A new base would strand every older live map (its token is no longer in the
  chain), and a rebuild costs the whole partition. So the record that writes a new base keeps
  the chain it replaces, tokens and layers, as a *bridge* (while the bridge weighs no more than
  the base): a map on the old chain applies the bridge's layers from its token, which brings it
  to the new base's state, then the record's own layers.

Otherwise (another run, a map older than the bridge, a task whose record was never cached) the
record is rebuilt. Tokens, not batch times, identify a state: a retried or recomputed batch makes
a new record with new tokens, and a map of an attempt that was thrown away never matches. A
worker keeps live maps of at most ``live_keys`` keys in all (oldest dropped first): the price is
memory, up to that many keys' state per Python worker.

Values must change through ``State.update``: an object changed in place without it is not in the
batch's layer (Spark's own in-memory state has the same rule for its delta maps).
"""

from __future__ import annotations

import os
import pickle
from collections import deque
from itertools import repeat

_MISSING = object()
_REMOVED = object()  # a key the running batch removed (StateMap.touched)
MAX_LAYERS = 64
LIVE_KEYS = 4_000_000  # default of spark.sparkwal.state.liveKeysPerWorker
_LIVE_ENTRIES = 64  # live maps a worker keeps, over every state stream it served
_LIVE: dict[tuple[str, int], tuple[bytes, StateMap]] = {}  # (uid, partition) -> (token, map)


def new_token() -> bytes:
    return os.urandom(12)


def _oldest_before(times: dict, time_ms: int) -> list:
    """The keys of ``times`` (kept in time order) whose time is before ``time_ms``."""
    out = []
    for key, t in times.items():
        if t >= time_ms:
            break
        out.append(key)
    return out


def _consume(iterator) -> None:
    deque(iterator, 0)


def call_function(records, func, st, values: dict, put, delete, refresh: bool, emit) -> None:
    """mapWithState's calls: ``func(key, value, st)`` once per record, in order, with the key's state
    from ``values`` in ``st`` (a ``State``); then ``put(key, value)`` or ``delete(key)`` as the function
    left it (with a timeout, ``refresh``, every key with data that still exists is fresh again)."""
    wrap = st.wrap
    for key, value in records:
        current = values.get(key, _MISSING)
        if current is _MISSING:
            wrap(False, None)
        else:
            wrap(True, current)
        emit(func(key, value, st))
        if st.isRemoved():
            delete(key)
        elif st.isUpdated() or (refresh and st.exists()):
            put(key, st.getOption())


class StateMap:
    """One partition's state: values, update times in update order, and recent removals (which a
    delta snapshot must write) in removal order. While a batch runs (:meth:`begin_batch` to
    :meth:`end_batch`) its puts and removals change ``values`` at once and are noted in
    ``touched``; the times follow at the end, in bulk, and make the batch's layer."""

    __slots__ = ("values", "times", "removed", "touched")

    def __init__(self, values=None, times=None, removed=None):
        self.values, self.times, self.removed = values or {}, times or {}, removed or {}
        self.touched: dict | None = None

    @classmethod
    def of_rows(cls, rows) -> StateMap:
        """From a snapshot chain's rows ``(key, value, updated_ms)`` in update order (a full snapshot's,
        then each delta's): the last row of a key wins, and the times stay in update order."""
        values, times = {}, {}
        for k, v, t in rows:
            values[k] = v
            times[k] = t
        return cls(values, times)

    def __getstate__(self):
        return self.values, self.times, self.removed

    def __setstate__(self, state):
        self.values, self.times, self.removed = state
        self.touched = None

    def put(self, key, value, time_ms: int) -> None:
        """Set one key now (building a state from rows; a batch uses :meth:`set`)."""
        self.values[key] = value
        self.times.pop(key, None)
        self.times[key] = time_ms
        self.removed.pop(key, None)

    # ------------------------------------------------------------------ a batch

    def begin_batch(self) -> None:
        self.touched = {}

    def set(self, key, value) -> None:
        self.values[key] = value
        self.touched[key] = value  # type: ignore[index]

    def delete(self, key) -> None:
        if self.values.pop(key, _MISSING) is not _MISSING:
            self.touched[key] = _REMOVED  # type: ignore[index]

    def idle_before(self, threshold_ms: int) -> list:
        """Keys last updated before ``threshold_ms`` and not touched by the running batch."""
        touched = self.touched or {}
        return [k for k in _oldest_before(self.times, threshold_ms) if k not in touched]

    def end_batch(self, time_ms: int, forget_before_ms: int) -> tuple:
        """Stamp the batch's keys with ``time_ms``, forget removals before ``forget_before_ms``
        and return the batch's layer."""
        touched, self.touched = self.touched or {}, None
        puts = [k for k, v in touched.items() if v is not _REMOVED]
        gone = [k for k, v in touched.items() if v is _REMOVED]
        layer = (time_ms, puts, [touched[k] for k in puts], gone, forget_before_ms)
        self._stamp(layer)
        return layer

    def apply(self, layer: tuple) -> None:
        """Replay a batch's layer (the map must be the state the batch started from)."""
        _, puts, put_values, gone, _ = layer
        self.values.update(zip(puts, put_values))
        _consume(map(self.values.pop, gone, repeat(None)))
        self._stamp(layer)

    def _stamp(self, layer: tuple) -> None:
        time_ms, puts, _, gone, forget_before_ms = layer
        times, removed = self.times, self.removed
        _consume(map(times.pop, puts, repeat(None)))
        _consume(map(times.pop, gone, repeat(None)))
        times.update(zip(puts, repeat(time_ms)))
        if removed:
            _consume(map(removed.pop, puts, repeat(None)))
            _consume(map(removed.pop, gone, repeat(None)))
        removed.update(zip(gone, repeat(time_ms)))
        self.forget_removals_before(forget_before_ms)

    def forget_removals_before(self, time_ms: int) -> None:
        for key in _oldest_before(self.removed, time_ms):
            del self.removed[key]

    # ------------------------------------------------------------------ snapshots

    def rows(self):
        values = self.values
        return ((k, values[k], t, False) for k, t in self.times.items())

    def rows_since(self, since_ms: int) -> list:
        """Keys updated or removed after ``since_ms``, oldest first."""
        changed = []
        for k, t in reversed(self.times.items()):
            if t <= since_ms:
                break
            changed.append((k, self.values[k], t, False))
        for k, t in reversed(self.removed.items()):
            if t <= since_ms:
                break
            changed.append((k, None, t, True))
        return sorted(changed, key=lambda r: r[2])


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


class StateRecord:
    """A state partition after the batch of ``time_ms``: a base, its layers, the batch's mapped
    records, and (at a checkpoint batch) the rows of the next delta snapshot. ``tokens`` is the
    chain: the base's token, then one per layer; the last one names this record's state.
    ``bridge`` (tokens, layers), when the record wrote a new base, is the chain it replaced with
    the layers that lead from each of its tokens to the new base. Readers of the mapped records
    unpickle only bytes objects, never the state's objects."""

    __slots__ = ("time_ms", "base", "layers", "tokens", "mapped", "delta", "bridge", "keys")

    def __init__(self, time_ms: int, base: bytes, layers: list[bytes], mapped: list,
                 delta: tuple[int, list] | None = None, tokens: list[bytes] | None = None,
                 bridge: tuple[list[bytes], list[bytes]] | None = None, keys: int = -1):
        self.time_ms, self.base, self.layers, self.mapped = time_ms, base, layers, mapped
        self.keys = keys  # how many keys the state holds (-1: not known)
        self.tokens = tokens if tokens is not None else [new_token() for _ in range(len(layers) + 1)]
        self.delta = delta  # (since_ms, rows_since(since_ms)), worked out by a checkpoint batch
        self.bridge = bridge

    @classmethod
    def of(cls, time_ms: int, state: StateMap, mapped: list) -> StateRecord:
        return cls(time_ms, _dumps(state), [], mapped, keys=len(state.values))

    @property
    def token(self) -> bytes:
        return self.tokens[-1]

    @property
    def state(self) -> StateMap:
        """The state, rebuilt from the base and the layers."""
        state = pickle.loads(self.base)
        for layer in self.layers:
            state.apply(pickle.loads(layer))
        return state

    def layers_after(self, token: bytes) -> list[bytes] | None:
        """The layers that bring the state named ``token`` to this record's, or None when
        ``token`` is in neither the chain nor the bridge."""
        if token in self.tokens:
            return self.layers[self.tokens.index(token):]
        if self.bridge is not None and token in self.bridge[0]:
            tokens, layers = self.bridge
            return [*layers[tokens.index(token):], *self.layers]
        return None

    def rows_since(self, since_ms: int) -> list:
        """A delta snapshot's rows: the ones the batch worked out, or the ones its layers hold
        (:meth:`layer_rows_since`), without rebuilding the state when either has them."""
        if self.delta is not None and self.delta[0] == since_ms:
            return self.delta[1]
        rows = self.layer_rows_since(since_ms)
        return self.state.rows_since(since_ms) if rows is None else rows

    def history(self) -> list[bytes]:
        """Every layer this record knows, oldest first: its bridge's (which lead to its base), then its own."""
        return [*(self.bridge[1] if self.bridge is not None else ()), *self.layers]

    def covers(self, since_ms: int) -> bool:
        """Whether :meth:`history` holds every change after ``since_ms``: its first layer is of a batch
        at or before it (so the base it starts from is older)."""
        history = self.history()
        return bool(history) and pickle.loads(history[0])[0] <= since_ms

    def layer_rows_since(self, since_ms: int) -> list | None:
        """:meth:`StateMap.rows_since` of this record's state, in the same order, from its layers alone;
        None when they do not reach back to ``since_ms``."""
        if not self.covers(since_ms):
            return None
        seen: set = set()
        puts: dict[int, list] = {}
        removals: dict[int, list] = {}
        for layer in reversed(self.history()):  # the newest change of each key wins
            time_ms, keys, values, gone, _ = pickle.loads(layer)
            if time_ms <= since_ms:
                break
            # rows_since's order within a batch: its puts newest first, then its removals newest first
            puts[time_ms] = [(k, v, time_ms, False) for k, v in zip(reversed(keys), reversed(values)) if k not in seen]
            seen.update(keys)
            removals[time_ms] = [(k, None, time_ms, True) for k in reversed(gone) if k not in seen]
            seen.update(gone)
        return [row for t in sorted(puts) for row in (*puts[t], *removals[t])]

    def __getstate__(self):
        return (self.time_ms, self.base, self.layers, self.tokens, self.mapped, self.delta, self.bridge,
                self.keys)

    def __setstate__(self, state):
        (self.time_ms, self.base, self.layers, self.tokens, self.mapped, self.delta, self.bridge,
         self.keys) = state


def take_state(uid: str, index: int, record: StateRecord) -> StateMap:
    """The state ``record`` holds: this worker's live map of the partition when the record's
    chain or bridge holds it (caught up with the layers after it), else rebuilt; either way the
    caller owns it (a failure half-way leaves no live map behind)."""
    live = _LIVE.pop((uid, index), None)
    if live is not None:
        token, state = live
        layers = record.layers_after(token)
        if layers is not None:
            for layer in layers:
                state.apply(pickle.loads(layer))
            return state
    return record.state


def extends(previous: StateRecord, layer: bytes) -> bool:
    """Whether the record after ``previous`` keeps its base, adding ``layer`` (else: a new base)."""
    layers = [*previous.layers, layer]
    return len(layers) <= MAX_LAYERS and sum(map(len, layers)) * 2 < len(previous.base)


def record_after(previous: StateRecord, time_ms: int, layer: bytes | None, mapped: list, delta, keys: int,
                 token: bytes, base: bytes | None) -> StateRecord:
    """The record after a batch: ``previous``'s base plus ``layer`` named ``token``, or ``base`` (the
    state after the batch, pickled) with a bridge from the previous chain; a batch that changed
    nothing (``layer`` None) keeps ``previous``'s chain and its tokens: the same state."""
    if layer is None:
        return StateRecord(time_ms, previous.base, previous.layers, mapped, delta, previous.tokens, previous.bridge,
                           keys=keys)
    layers = [*previous.layers, layer]
    if base is None:
        return StateRecord(time_ms, previous.base, layers, mapped, delta, [*previous.tokens, token], previous.bridge,
                           keys=keys)
    bridge = (previous.tokens, layers) if sum(map(len, layers)) <= len(base) else None
    return StateRecord(time_ms, base, [], mapped, delta, [token], bridge=bridge, keys=keys)


def unchanged(layer: tuple) -> bool:
    """Whether a batch's layer changed no key (its removals to forget wait for the next layer)."""
    return not layer[1] and not layer[3]


def next_record(uid: str, index: int, previous: StateRecord, state: StateMap, layer: tuple,
                mapped: list, delta, live_keys: int = LIVE_KEYS) -> StateRecord:
    """The record after a batch that made ``layer`` (:meth:`StateMap.end_batch`) from
    ``previous``'s state: the previous base plus the layer, or a new base with a bridge from the
    previous chain; ``state`` stays live."""
    pickled = None if unchanged(layer) else _dumps(layer)
    base = None if pickled is None or extends(previous, pickled) else _dumps(state)
    record = record_after(previous, layer[0], pickled, mapped, delta, len(state.values), new_token(), base)
    keep_live(uid, index, record.token, state, live_keys)
    return record


def peek_state(uid: str, index: int, record: StateRecord, live_keys: int = LIVE_KEYS) -> StateMap:
    """The state ``record`` holds, for reading only (``stateSnapshots()``): this worker's reading
    copy of the partition caught up to it (none of the record's base unpickled, no work at all when
    the copy is at that state), else rebuilt. The copy is kept apart from the map batches update:
    what a reader does to the values it is handed never reaches the state."""
    key = (f"{uid}/read", index)
    state = take_state(*key, record)
    keep_live(*key, record.token, state, live_keys)
    return state


def keep_live(uid: str, index: int, token: bytes, state: StateMap, live_keys: int = LIVE_KEYS) -> None:
    # one map per partition (its newest); the oldest go first while the maps hold too many keys
    _LIVE.pop((uid, index), None)
    _LIVE[(uid, index)] = (token, state)
    held = sum(len(m.values) for _, m in _LIVE.values())
    while _LIVE and (len(_LIVE) > _LIVE_ENTRIES or held > live_keys):
        held -= len(_LIVE.pop(next(iter(_LIVE)))[1].values)
