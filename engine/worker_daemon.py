"""PySpark's Python worker daemon with sparkwal already imported, so that every worker it forks
starts with it.

Spark forks each Python worker from one daemon process per executor. A fresh worker's first task
unpickles the engine's task functions, which imports ``engine`` and its dependencies: about
0.3-0.5 s, paid again by every new worker, and a takeover's or a restart's first batch starts
several at once (each cached step of recomputed state runs in a worker of its own). With this
module as ``spark.python.daemon.module`` the daemon imports them once and its forks inherit them.

:func:`engine.cluster.prepare` sets it in ``local[...]`` mode (where the executors run this
interpreter and can import sparkwal), unless ``spark.python.daemon.module`` is set already or
``spark.sparkwal.preimportWorkers`` is false. An import that fails here is left to the task that
needs it, which names it.
"""

from __future__ import annotations

import importlib

PREIMPORTED = ("engine", "engine.snapshot", "engine.state.state_map", "checkpoint.state_files",
               "pyarrow", "pyarrow.ipc", "crc32c")


def preimport() -> None:
    for name in PREIMPORTED:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  the task that needs it reports it
            pass


if __name__ == "__main__":
    preimport()
    from pyspark.daemon import manager

    manager()
