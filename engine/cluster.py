"""Running on a cluster: sparkwal's code on the executors, and a clear error when they lack it.

Spark's Python workers unpickle the engine's task functions, which import ``sparkwal`` (its
``engine``, ``wal``, ``checkpoint`` and ``tracker``) and their dependencies. On a cluster whose
executors do not have sparkwal installed, ``start()`` ships the package as one zip (``sc.addPyFile``), then runs a
probe job, one task per executor core, that imports everything tasks need: a missing module is a
:class:`ExecutorEnvironmentError` naming it, the hosts that lack it and the pip requirement, before
any batch runs, instead of an ImportError deep inside a task's traceback.

The workers' interpreter (:func:`choose_python`): ``spark.pyspark.python``, else ``PYSPARK_PYTHON``,
else, in ``local[...]`` mode, the driver's own (``sys.executable``: same machine, same packages),
where PySpark would run ``python3`` from ``PATH``, which may lack sparkwal's dependencies.

``spark.sparkwal.shipCode``: ``auto`` (default: ship when the master is not ``local[...]``),
``true`` or ``false`` (the executors have sparkwal installed). ``spark.sparkwal.checkExecutors``:
``auto`` (default: probe off ``local[...]``, and in ``local[...]`` mode when the workers run an
interpreter other than the driver's), ``true`` or ``false``.

The probe function is built from source so that cloudpickle sends it by value: unpickling it needs
nothing from sparkwal.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import weakref
import zipfile

from sparkwal.base.service import Service, spawn
from sparkwal.wal.retry import DEADLINE_ENV

from .compat import supports
from . import config
from .jvm_view import cache_class_lookups
from .config import ConfigError, StreamingConf
from .errors import EngineError

log = logging.getLogger(__name__)

#: the package and its rooms (in a checkout the rooms are folders beside it, mapped under it)
PACKAGES = ("sparkwal", "sparkwal.base", "sparkwal.wal", "sparkwal.checkpoint", "sparkwal.tracker", "sparkwal.engine")
#: module -> the pip requirement that provides it
REQUIREMENTS = {"msgpack": "msgpack>=1.0,<2", "crc32c": "crc32c>=2.4,<3", "fsspec": "fsspec>=2024.6",
                "pyarrow": "pyarrow>=15"}
_PROBE_SOURCE = '''
def probe(_):
    import importlib, os, socket
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:
            missing.append((name, type(e).__name__ + ": " + str(e)))
    return socket.gethostname(), os.getpid(), missing
'''


class ExecutorEnvironmentError(EngineError, RuntimeError):
    """Executors cannot import what sparkwal's tasks need (the message names it)."""


def is_local_master(master: str) -> bool:
    return master.startswith("local[") or master == "local"


def total_cores(master: str, default_parallelism: int) -> int:
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if m:
        return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))
    if master == "local":
        return 1
    m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if m:
        return int(m.group(1)) * int(m.group(2))
    return default_parallelism


def package_files() -> list[tuple[str, str]]:
    """``(source, path inside a site-packages)`` of sparkwal's files, from wherever the driver
    imports them (an installed package, or a checkout's folders mapped under ``sparkwal``): what
    the shipped zip and the shipped environment carry."""
    import importlib

    found = []
    for package in PACKAGES:
        directory = os.path.dirname(importlib.import_module(package).__file__)
        prefix = package.replace(".", "/")
        for dirpath, dirnames, filenames in os.walk(directory):
            # the top's own files only: its rooms are walked as packages of their own
            dirnames[:] = [] if package == "sparkwal" else [d for d in dirnames if d != "__pycache__"]
            found += [(os.path.join(dirpath, f), f"{prefix}/{os.path.relpath(os.path.join(dirpath, f), directory)}")
                      for f in filenames if f.endswith((".py", ".properties"))]
    return sorted(found)


def ship_code(sc) -> str:
    """Zip sparkwal's packages (as the driver imports them) and add the zip to ``sc``."""
    fd, path = tempfile.mkstemp(prefix="sparkwal-code-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for source, name in package_files():
            z.write(source, name)
    sc.addPyFile(path)
    log.info("shipped sparkwal's packages to the executors (%s)", path)
    return path


def check_executors(sc, modules: tuple[str, ...] = (*PACKAGES, *REQUIREMENTS), slots: int | None = None) -> None:
    """Run the probe on every executor slot; raise :class:`ExecutorEnvironmentError` if any
    module cannot be imported there."""
    namespace: dict = {"__name__": "sparkwal_executor_probe", "MODULES": tuple(modules)}
    exec(compile(_PROBE_SOURCE, "<sparkwal executor probe>", "exec"), namespace)  # noqa: S102
    probe = namespace["probe"]
    n = slots or max(2, sc.defaultParallelism)
    python = sc.pythonExec
    try:
        results = sc.parallelize(range(n), n).map(probe).collect()
    except Exception as e:  # noqa: BLE001  the interpreter did not start or died: say which
        raise ExecutorEnvironmentError(
            f"the executors' Python ({python}) could not run sparkwal's probe task: "
            f"{_last_line(e)}. Set spark.pyspark.python (or PYSPARK_PYTHON) to an interpreter "
            "that has sparkwal's dependencies") from None
    missing: dict[str, set[str]] = {}
    reasons: dict[str, str] = {}
    for host, _pid, lacks in results:
        for name, reason in lacks:
            missing.setdefault(name, set()).add(host)
            reasons.setdefault(name, reason)
    if missing:
        lines = [f"  {name} ({reasons[name]}) on {', '.join(sorted(hosts))}"
                 + (f": pip install '{REQUIREMENTS[name]}'" if name in REQUIREMENTS else "")
                 for name, hosts in sorted(missing.items())]
        raise ExecutorEnvironmentError(
            f"the executors' Python ({python}) cannot import what sparkwal's tasks need:\n"
            + "\n".join(lines)
            + "\nInstall sparkwal's dependencies in the executors' Python (spark.pyspark.python / "
            "PYSPARK_PYTHON), or set spark.sparkwal.shipCode=true to ship sparkwal's own packages")


_GIST = re.compile(r"(?:ModuleNotFoundError|ImportError|java\.io\.IOException|PermissionError|"
                   r"FileNotFoundError|OSError|SyntaxError): [^\n]*")


def _last_line(error: BaseException) -> str:
    """The gist of a failed probe job: the last import or start-up error named anywhere in its
    (Py4J) trace, else the error's first line."""
    text = str(error)
    found = _GIST.findall(text)
    if found:
        return next((f for f in found if "Cannot run program" in f), found[-1]).strip()
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def configured_python(settings: StreamingConf) -> str | None:
    """The workers' interpreter the user chose (``spark.pyspark.python``, else ``PYSPARK_PYTHON``,
    as spark-submit reads them), or None."""
    return settings.raw("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or None


def choose_python(sc, settings: StreamingConf) -> str:
    """Set the interpreter of the Python workers that run this context's functions (PySpark
    reads ``sc.pythonExec`` when it wraps a function, so this holds for every RDD made after):
    the configured one, else, in ``local[...]`` mode, ``sys.executable``. Returns it."""
    chosen = configured_python(settings)
    if chosen is None and is_local_master(sc.master):
        chosen = sys.executable
    if chosen is not None and sc.pythonExec != chosen:
        sc.pythonExec = chosen
    return sc.pythonExec


def is_drivers_python(python: str) -> bool:
    """Whether ``python`` is the driver's own interpreter (by path, not by what the path links
    to: a virtualenv's python links to the base interpreter but has other packages)."""
    found = shutil.which(python) or python
    try:  # the same file in the same bin directory (python and python3 of one virtualenv)
        return (os.path.samefile(found, sys.executable)
                and os.path.samefile(os.path.dirname(os.path.abspath(found)),
                                     os.path.dirname(os.path.abspath(sys.executable))))
    except OSError:  # no such interpreter: not the driver's (the probe says what is wrong)
        return False


def prepare(sc, settings: StreamingConf) -> None:
    """Called by ``StreamingContext.start()``: choose the workers' interpreter, ship the code
    and probe the executors (see the module docstring for the settings)."""
    master = sc.master
    python = choose_python(sc, settings)
    ship = settings[config.SHIP_CODE]
    if ship == "true" or (ship == "auto" and not is_local_master(master)):
        if not _done(sc, "code shipped"):
            ship_code(sc)
            _mark_done(sc, "code shipped")
    configure_local_workers(sc, settings)
    cache_class_lookups(sc)
    check = settings[config.CHECK_EXECUTORS]
    if check == "true" or (check == "auto" and (not is_local_master(master) or not is_drivers_python(python))):
        if not _done(sc, "executors checked"):
            check_executors(sc)
            _mark_done(sc, "executors checked")


#: What was done once per SparkContext (its code shipped, its executors checked, its workers
#: warmed), forgotten with the context.
_DONE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DONE_LOCK = threading.Lock()


def _done(sc, what: str) -> bool:
    with _DONE_LOCK:
        return what in _DONE.get(sc, ())


def _mark_done(sc, what: str) -> None:
    with _DONE_LOCK:
        _DONE.setdefault(sc, set()).add(what)


def configure_local_workers(sc, settings: StreamingConf) -> None:
    """The Python workers' settings in ``local[...]`` mode (each is left alone when already set):
    forked from sparkwal's daemon (when they run the driver's interpreter, which can import it),
    reached over Unix sockets."""
    if is_drivers_python(choose_python(sc, settings)):
        preimport_in_workers(sc, settings)
    unix_sockets_for_workers(sc)


DAEMON_MODULE = "sparkwal.engine.worker_daemon"


def preimport_in_workers(sc, settings: StreamingConf) -> None:
    """In ``local[...]`` mode, Python workers forked from :mod:`sparkwal.engine.worker_daemon` (sparkwal
    imported once, in the daemon). Set on the running context's configuration, which Spark reads
    when it starts a daemon: workers started before keep the plain daemon."""
    if not is_local_master(sc.master):
        return
    if not settings[config.PREIMPORT_WORKERS]:
        return
    jconf = sc._jsc.sc().conf()
    if jconf.contains("spark.python.daemon.module"):
        return
    jconf.set("spark.python.daemon.module", DAEMON_MODULE)


def start_python_workers(sc, per_core: int) -> None:
    """A job that leaves ``per_core`` Python workers per core alive at once, each with the engine's
    task-side modules imported (Spark ends them after a minute idle): a batch that recomputes
    state runs each cached step and each batch's group in a worker of its own, nested and streaming
    into the next, and a new worker's first task costs 0.2-0.4 s more (0.3 s to import the engine
    when its daemon did not)."""
    from pyspark import RDD

    n = max(2, sc.defaultParallelism)
    rdd = sc.parallelize(range(n), n)
    for _ in range(per_core):  # each level a PythonRDD of its own (a plain RDD's child is not
        rdd = rdd.mapPartitions(_import_engine)  # pipelined into it), streaming: every level's
        rdd = RDD(rdd._jrdd, sc, rdd._jrdd_deserializer)  # worker alive at once
    rdd.count()


def _import_engine(rows):
    from .worker_daemon import preimport

    preimport()
    return rows


#: Python workers per core a restart starts in the background (see :func:`warm_workers_early`)
RESTART_WORKERS_PER_CORE = 1


def warm_workers_early(sc) -> Service | None:
    """In ``local[...]`` mode, once per SparkContext: make the settings :func:`prepare` makes for
    the workers (the daemon, the Unix sockets) and start Python workers in a background job, so
    that the daemon's start (0.3 s, then 0.7 s importing the engine) and the workers' overlap the
    driver's reading of a checkpoint instead of delaying the first batch of a restart. Called by
    ``getOrCreate`` (engine.get_or_create); the job's failure (e.g. the context stopped
    under it) is only logged."""
    if not is_local_master(sc.master) or _done(sc, "workers warmed"):
        return None
    _mark_done(sc, "workers warmed")
    try:
        settings = StreamingConf.of(sc.getConf())
    except ConfigError:  # said by the context, which reads the settings too
        return None
    configure_local_workers(sc, settings)
    storage_deadline_s(sc, settings)

    def run() -> None:
        try:
            start_python_workers(sc, RESTART_WORKERS_PER_CORE)
        except Exception as e:  # noqa: BLE001  the first batch starts its workers itself
            log.info("starting Python workers early failed: %s", e)

    return spawn("sparkwal-warm-workers", run)


def storage_deadline_s(sc, settings: StreamingConf) -> float:
    """``spark.sparkwal.storage.deadline`` in seconds (default 60 s), handed to the executors'
    Python workers in their environment as well (:data:`sparkwal.wal.retry.DEADLINE_ENV`: the Spark conf
    does not reach them), before the first Python function is wrapped: workers are started per
    environment, so the early warm-up sets it too."""
    seconds = settings[config.STORAGE_DEADLINE] / 1000
    sc.environment[DEADLINE_ENV] = str(seconds)
    return seconds


UDS_ENABLED = "spark.python.unix.domain.socket.enabled"
UDS_DIR = "spark.python.unix.domain.socket.dir"
_UDS_NAME = len("/.00000000-0000-0000-0000-000000000000.sock")  # the name Spark gives a socket
_UDS_MAX_PATH = 104  # sockaddr_un's limit (108 on Linux, 104 on macOS)


def unix_sockets_for_workers(sc) -> str | None:
    """In ``local[...]`` mode, Spark's executors talk to their Python workers over Unix domain
    sockets (Spark's own ``spark.python.unix.domain.socket.enabled``, set on the running context
    before its first Python task) instead of loopback TCP, whose small writes wait out a delayed
    ACK: a one-task Python job took 100 ms over TCP and 55 ms over a Unix socket here, and a
    batch runs a few waves of tasks. The sockets live in a directory of this user's only (mode
    0700, removed at exit), so the kernel admits no other user's process to the workers (over a
    Unix socket Spark's workers skip their shared-secret handshake). Left alone when the setting
    is made already or when the directory's path would be too long for a socket address; workers
    started before keep TCP. Returns the directory, or None."""
    if not is_local_master(sc.master) or not hasattr(socket, "AF_UNIX"):
        return None
    if not supports("unix_socket_workers", sc):
        return None
    jconf = sc._jsc.sc().conf()
    if jconf.contains(UDS_ENABLED):
        return None
    path = tempfile.mkdtemp(prefix="sparkwal-uds-")
    if len(path) + _UDS_NAME > _UDS_MAX_PATH:
        os.rmdir(path)
        log.info("Python workers keep loopback TCP: %s is too long a path for a Unix socket", path)
        return None
    atexit.register(shutil.rmtree, path, True)
    jconf.set(UDS_DIR, path)
    jconf.set(UDS_ENABLED, "true")
    return path
