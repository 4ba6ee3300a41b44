"""PySpark's Python worker daemon, importing PySpark's compiled modules and sparkwal once, so that
every worker it forks starts with them.

Spark forks each Python worker from one daemon process per executor, and puts PySpark's own
``pyspark.zip`` (and py4j's) first on the daemon's ``PYTHONPATH``. A zip holds no compiled
bytecode and Python cannot cache any in it, so every daemon compiled PySpark from source (1.1 s of
its 1.5 s start here) and every forked worker compiled ``pyspark.worker`` (0.3 s); then a fresh
worker's first task unpickled the engine's task functions, importing ``engine`` and its
dependencies (0.3-0.5 s). A restart's or a takeover's first batch waits for all of that, and starts
several workers at once. As ``spark.python.daemon.module`` this module:

* drops those zips from ``sys.path`` when the same versions of PySpark and py4j are installed on
  it (an installed package's modules carry their compiled bytecode), before importing PySpark;
* imports ``pyspark.worker`` and sparkwal's task-side modules once, in the daemon (none starts a
  thread, which PySpark's daemon forbids before it forks);
* freezes what it imported out of the garbage collector (``gc.freeze()``, as a pre-fork server
  should): a reused worker runs a full ``gc.collect()`` after every task (pyspark/daemon.py), which
  walked every imported module's objects each time and took over 40% of an idle job's worker CPU.

:func:`sparkwal.engine.cluster.prepare` sets it in ``local[...]`` mode (where the executors run this
interpreter and can import sparkwal), unless ``spark.python.daemon.module`` is set already or
``spark.sparkwal.preimportWorkers`` is false. An import that fails here is left to the task that
needs it, which names it.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import zipfile

PREIMPORTED = ("pyspark.worker", "sparkwal.engine.state.snapshot_tasks", "sparkwal.engine.state.state_map",
               "sparkwal.engine.state.map_with_state", "sparkwal.engine.state.update_state", "sparkwal.engine.inputs",
               "sparkwal.checkpoint.state_files", "pyarrow", "pyarrow.ipc", "crc32c")

#: a zip Spark puts on the workers' path -> the file whose bytes name its version
_ZIPPED = {"pyspark.zip": "pyspark/version.py", "py4j-": "py4j/version.py"}


def _installed_twin(entry: str, path: list[str]) -> bool:
    """Whether ``entry``, one of Spark's zips, has an identical version of its package installed in
    a directory on ``path`` (not counting the zip)."""
    name = os.path.basename(entry)
    version_file = next((v for prefix, v in _ZIPPED.items() if name.startswith(prefix)), None)
    if version_file is None or not name.endswith(".zip") or not os.path.isfile(entry):
        return False
    try:
        with zipfile.ZipFile(entry) as z:
            zipped = z.read(version_file)
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    for d in path:
        if d == entry or not d or d.endswith(".zip") or d.endswith(".jar"):
            continue
        try:
            with open(os.path.join(d, version_file), "rb") as f:
                return f.read() == zipped
        except OSError:
            continue
    return False


def prefer_installed_pyspark(path: list[str] | None = None) -> list[str]:
    """Remove from ``path`` (``sys.path``) Spark's zips whose package is installed, same version,
    further along it; return what was removed. Call before anything imports PySpark."""
    path = sys.path if path is None else path
    dropped = [e for e in path if _installed_twin(e, path)]
    for e in dropped:
        path.remove(e)
    return dropped


def preimport() -> None:
    for name in PREIMPORTED:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  the task that needs it reports it
            pass


def quiet_when_the_executor_hangs_up() -> None:
    """A worker whose executor closed its socket (a task cancelled by a stop, or the JVM
    stopping) ends quietly: PySpark's daemon prints a ``BrokenPipeError`` trace for each such
    worker on the driver's stderr in local mode, where nobody is left to read the result."""
    import pyspark.daemon as daemon

    run_worker = daemon.worker

    def worker(sock, authenticated):
        try:
            return run_worker(sock, authenticated)
        except (BrokenPipeError, ConnectionResetError):
            return 1  # the daemon's child then waits for the socket to close and exits

    daemon.worker = worker  # manager() looks the name up at each fork


if __name__ == "__main__":
    prefer_installed_pyspark()
    preimport()
    quiet_when_the_executor_hangs_up()
    from pyspark.daemon import manager

    gc.freeze()  # what the daemon imported is left out of the collection each worker runs after each task
    manager()
