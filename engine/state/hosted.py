"""A mapWithState batch whose partition's map the executor's state host keeps
(:mod:`sparkwal.engine.state.state_host`): the worker asks for the batch's keys, calls the mapping
function and hands back the layer. Records, tokens and layers are those of
:mod:`sparkwal.engine.state.state_map`; the same batch run in the worker gives the same record."""

from __future__ import annotations

import pickle

from .state_host import HostClient, HostLoading, HostUnavailable, warn_once
from .state_map import (StateRecord, call_function, extends, keep_live, new_token, record_after, take_state,
                        unchanged)

_ABSENT = object()
_REMOVED = object()


def update_on_host(client: HostClient, index: int, previous: StateRecord, batch: list, st, func, uid: str,
                   batch_ms: int, timeout_ms: int | None, forget_before_ms: int, delta_since_ms: int | None,
                   live_keys: int) -> StateRecord:
    """The record after the batch of ``batch`` (``(key, value)`` records) on ``previous``. Raises
    :class:`HostUnavailable` only before the first call of ``func``: the caller then runs the batch
    itself; a host lost after that costs this task a rebuild of the state, not a second call."""
    keys = list(dict.fromkeys(key for key, _ in batch))
    idle_before_ms = None if timeout_ms is None else batch_ms - timeout_ms
    if not keys and idle_before_ms is None and delta_since_ms is None:
        return record_after(previous, batch_ms, None, [], None, previous.keys, previous.token, None)
    current, idle = client.lookup(uid, index, previous, keys, idle_before_ms)
    held_before = set(current).union(k for k, _ in idle)  # of the batch's keys and the idle ones
    mapped: list = []
    touched: dict = {}  # the batch's puts and removals, as StateMap.touched
    emit, wrap = mapped.append, st.wrap

    def put(key, value) -> None:
        current[key] = touched[key] = value

    def delete(key) -> None:
        if current.pop(key, _ABSENT) is not _ABSENT:
            touched[key] = _REMOVED

    call_function(batch, func, st, current, put, delete, timeout_ms is not None, emit)
    for key, value in idle:
        wrap(True, value, timing_out=True)
        emit(func(key, None, st))
        touched[key] = _REMOVED
    puts = [k for k, v in touched.items() if v is not _REMOVED]
    layer = (batch_ms, puts, [touched[k] for k in puts], [k for k, v in touched.items() if v is _REMOVED],
             forget_before_ms)
    pickled = None if unchanged(layer) else pickle.dumps(layer, pickle.HIGHEST_PROTOCOL)
    token = previous.token if pickled is None else new_token()
    want_base = pickled is not None and not extends(previous, pickled)
    if delta_since_ms is not None and pickled is not None and previous.covers(delta_since_ms):
        delta_since_ms = None  # the record's layers hold the delta's rows: the snapshot reads them there
    if pickled is not None and not want_base and delta_since_ms is None:  # nothing to wait for
        client.apply_later(uid, index, previous.token, token, pickled, live_keys)
        return record_after(previous, batch_ms, pickled, mapped, None, _keys_after(previous, held_before, layer), token,
                            None)
    try:
        keys_held, base, delta = client.apply(uid, index, previous.token, token, pickled, want_base, delta_since_ms,
                                              live_keys)
    except HostUnavailable as e:
        warn_once(str(e))
        state = take_state(uid, index, previous)
        if pickled is not None:
            state.apply(layer)
        keys_held = len(state.values)
        base = pickle.dumps(state, pickle.HIGHEST_PROTOCOL) if want_base else None
        delta = None if delta_since_ms is None else state.rows_since(delta_since_ms)
        keep_live(uid, index, token, state, live_keys)
    return record_after(previous, batch_ms, pickled, mapped, None if delta is None else (delta_since_ms, delta),
                        keys_held, token, base)


def _keys_after(previous: StateRecord, held_before: set, layer: tuple) -> int:
    """How many keys the state holds after ``layer``, from the record's count and which of the keys
    the layer names it held before (-1: not known)."""
    if previous.keys < 0:
        return -1
    _, puts, _, gone, _ = layer
    return previous.keys + sum(1 for k in puts if k not in held_before) - sum(1 for k in gone if k in held_before)


__all__ = ["HostLoading", "HostUnavailable", "update_on_host"]
