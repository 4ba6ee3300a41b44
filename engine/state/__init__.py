"""Stateful streams: ``mapWithState`` (:mod:`.map_with_state`), the ``(key, value)`` state of
``updateStateByKey`` and windows as snapshot rows (:mod:`.kv_rows`), and the snapshot chains a
checkpoint references (:mod:`.snapshots`)."""

from . import map_with_state, update_state  # noqa: F401  (they register DStream's stateful operations)
from .snapshots import StateSnapshots

__all__ = ["StateSnapshots"]
