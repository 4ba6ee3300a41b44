"""sparkwal's thin DStream engine on PySpark RDDs, with pyspark.streaming's API names.

Porting an app: ``from pyspark.streaming import StreamingContext`` becomes
``from sparkwal import StreamingContext`` (pyspark.streaming's names are at the package's top; the
engine's others are here: ``from sparkwal.engine import StateSpec``).

The names below are imported on first use (PEP 562), so that importing a submodule, e.g.
:mod:`sparkwal.engine.worker_daemon` as PySpark's worker daemon, does not import PySpark first.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "sparkwal.tracker": ["BatchInfo"],
    "sparkwal.checkpoint.state_chains": ["read_state"],
    ".context": ["CheckpointMismatchError", "CopySourceActiveError", "StreamingContext", "StreamingContextStateError"],
    ".dstream": ["DStream"],
    ".listener": [
        "OutputOperationInfo", "ReceiverInfo", "StreamingListener", "StreamingListenerBatchCompleted",
        "StreamingListenerBatchStarted", "StreamingListenerBatchSubmitted",
        "StreamingListenerDriverTakeover", "StreamingListenerOutputOperationCompleted",
        "StreamingListenerOutputOperationStarted", "StreamingListenerReceiverError",
        "StreamingListenerReceiverStarted", "StreamingListenerReceiverStopped",
        "StreamingListenerStandbyReady", "StreamingListenerStreamingStarted"],
    ".driver.leadership": ["DriverAlreadyActiveError"],
    ".driver.upgrade_preview": ["UPGRADE_CHECKPOINT_ENV", "UPGRADE_PLAN_ENV"],
    ".environment": ["EnvironmentShippingError", "prepare_conf"],
    ".errors": ["AnotherApplicationError", "BatchFailedError", "EngineError", "MissingInputError",
                "ProgramVersionError", "StateError"],
    ".receiver": ["BlockReadError", "Receiver", "SocketReceiver"],
    ".state.snapshot_tasks": ["SnapshotError"],
    ".state.map_with_state": ["State", "StateSpec"],
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
