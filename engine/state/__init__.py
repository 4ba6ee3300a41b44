"""Stateful streams: ``mapWithState`` (:mod:`.map_with_state`), the ``(key, value)`` state of
``updateStateByKey`` and windows as snapshot rows (:mod:`.kv_rows`), and the snapshot chains a
checkpoint references (:mod:`.snapshots`).

The names below are imported on first use (PEP 562), as :mod:`sparkwal.engine`'s are: an executor's
state host (:mod:`.state_host`) imports its own module without PySpark, and starts in a fraction of
the time a restarted executor would otherwise spend on it. (``map_with_state`` names the submodule;
its function is ``STATEFUL_OPERATIONS["mapWithState"]``.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .snapshots import StateSnapshots

#: DStream's stateful operations by name (:meth:`sparkwal.engine.dstream.DStream.stateful_stream`),
#: each ``build(parent, *args) -> DStream``: (module, function)
_OPERATIONS = {
    "mapWithState": (".map_with_state", "map_with_state"),
    "reduceByKeyAndWindow": (".update_state", "reduce_by_key_and_window"),
    "updateStateByKey": (".update_state", "update_state_by_key"),
}

__all__ = ["STATEFUL_OPERATIONS", "StateSnapshots"]


def __getattr__(name: str):
    if name == "StateSnapshots":
        value = importlib.import_module(".snapshots", __name__).StateSnapshots
    elif name in ("update_state_by_key", "reduce_by_key_and_window"):  # (names this package had)
        value = getattr(importlib.import_module(".update_state", __name__), name)
    elif name == "STATEFUL_OPERATIONS":
        value = {op: getattr(importlib.import_module(module, __name__), function)
                 for op, (module, function) in _OPERATIONS.items()}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
