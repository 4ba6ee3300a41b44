"""Stateful streams: ``mapWithState`` (:mod:`.map_with_state`), the ``(key, value)`` state of
``updateStateByKey`` and windows as snapshot rows (:mod:`.kv_rows`), and the snapshot chains a
checkpoint references (:mod:`.snapshots`)."""

from .map_with_state import map_with_state
from .snapshots import StateSnapshots
from .update_state import reduce_by_key_and_window, update_state_by_key

#: DStream's stateful operations by name (:meth:`sparkwal.engine.dstream.DStream.stateful_stream`),
#: each ``build(parent, *args) -> DStream``
STATEFUL_OPERATIONS = {
    "mapWithState": map_with_state,
    "reduceByKeyAndWindow": reduce_by_key_and_window,
    "updateStateByKey": update_state_by_key,
}

__all__ = ["STATEFUL_OPERATIONS", "StateSnapshots"]
