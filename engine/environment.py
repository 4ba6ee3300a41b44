"""The conf a SparkContext should be created with on a cluster: the driver's Python environment
packed and shipped to the executors, and the local-mode gains for their Python workers.

``prepare_conf(conf)`` returns a copy of ``conf`` with, off ``local[...]`` (local mode needs none
of it: ``start()`` sets what it needs on the running context):

* ``spark.sparkwal.shipEnvironment=true``: the driver's virtualenv packed with venv-pack into
  ``<cache>/sparkwal-env-<fingerprint>.tar.gz`` and shipped by Spark's own mechanism, as in
  Spark's "Python package management" guide (python/docs/source/user_guide/python_packaging.rst):
  ``spark.archives=<archive>#sparkwal-env`` (each executor unpacks it into its working directory)
  and ``spark.pyspark.python=./sparkwal-env/bin/python``. sparkwal's own packages go in as
  files even when installed in editable mode; PySpark's jars stay out (the executors are Spark),
  as do the executors' work directories a ``local-cluster`` leaves under PySpark's ``work/``.
  The fingerprint is a SHA-256 over every packed file's path, size and modification time (pip
  rewrites what it installs), so a restart with the same environment reuses the archive instead
  of packing again (20-60 s); the cache keeps the newest :data:`KEEP` archives. venv-pack does
  not pack the interpreter: ``bin/python`` links to the driver's base Python, which executors
  must have at the same path (the same image or package), with nothing else installed.
* The executors' Python workers forked from :mod:`sparkwal.engine.worker_daemon` (installed PySpark and
  sparkwal imported once, compiled) when they can import sparkwal: the environment is shipped,
  or ``spark.sparkwal.shipCode=false`` says sparkwal is installed there; unless
  ``spark.sparkwal.preimportWorkers=false`` or ``spark.python.daemon.module`` is set.
* Unix domain sockets between each executor and its Python workers
  (``spark.python.unix.domain.socket.enabled=true``, unless set): the socket file is made in
  ``java.io.tmpdir`` with the executor's umask, which on a normal system (022) lets only its own
  user connect.

An app that makes its own SparkContext uses it in one line:
``sc = SparkContext(conf=prepare_conf(SparkConf().setMaster(...)))``; the main job and
``getOrCreate`` (for the SparkContext it makes from a checkpoint's conf) apply it themselves.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import sys

from pyspark import SparkConf

from .cluster import DAEMON_MODULE, UDS_ENABLED, package_files
from . import config
from .compat import supports
from .config import StreamingConf
from .errors import EngineError

log = logging.getLogger(__name__)

SHIP_ENVIRONMENT = config.SHIP_ENVIRONMENT.key
CACHE_DIR = config.SHIP_ENVIRONMENT_CACHE.key
ALIAS = "sparkwal-env"
KEEP = 3
_EXCLUDED = ("lib/python*/site-packages/pyspark/jars/*",  # the executors are Spark
             "lib/python*/site-packages/pyspark/work/*",  # a local-cluster's executors' directories
             "lib/python*/site-packages/__editable__*sparkwal*")  # sparkwal goes in as files


class EnvironmentShippingError(EngineError, RuntimeError):
    """The driver's environment cannot be packed (the message says why and what to do)."""


def prepare_conf(conf: SparkConf | None = None) -> SparkConf:
    """A copy of ``conf`` ready for the cluster its master names (see the module docstring)."""
    ready = SparkConf(loadDefaults=conf is None)
    if conf is not None:
        ready.setAll(conf.getAll())
    settings = StreamingConf(ready.getAll())  # every setting checked, before any JVM
    master = ready.get("spark.master", "local[*]")
    if master == "local" or master.startswith("local["):
        return ready
    if settings[config.SHIP_ENVIRONMENT]:
        archive = packed_environment(settings[config.SHIP_ENVIRONMENT_CACHE])
        archives = [a for a in (ready.get("spark.archives", "") or "").split(",")  # a recovered
                    if a.strip() and not a.strip().endswith(f"#{ALIAS}")]  # conf names an earlier one
        ready.set("spark.archives", ",".join([*archives, f"file://{archive}#{ALIAS}"]))
        ready.set("spark.pyspark.python", f"./{ALIAS}/bin/python")
        ready.setIfMissing("spark.pyspark.driver.python", sys.executable)
    executors_have_sparkwal = settings[config.SHIP_ENVIRONMENT] or settings[config.SHIP_CODE] == "false"
    daemon_chosen = ready.contains("spark.python.daemon.module")
    if executors_have_sparkwal and settings[config.PREIMPORT_WORKERS] and not daemon_chosen:
        ready.set("spark.python.daemon.module", DAEMON_MODULE)
    if supports("unix_socket_workers"):  # PySpark's version: no SparkContext yet
        ready.setIfMissing(UDS_ENABLED, "true")
    return ready


def packed_environment(cache_dir: str | None = None, prefix: str | None = None) -> str:
    """The archive of the virtualenv at ``prefix`` (the driver's), packed now or found in the
    cache by its fingerprint; its absolute path."""
    try:
        import venv_pack
    except ImportError:
        raise EnvironmentShippingError(f"{SHIP_ENVIRONMENT}=true needs venv-pack in the driver's Python: "
                                       "pip install 'venv-pack>=0.2'") from None
    prefix = prefix or sys.prefix
    if prefix == sys.base_prefix and prefix == sys.prefix:
        raise EnvironmentShippingError(
            f"{SHIP_ENVIRONMENT}=true ships the driver's virtualenv, but the driver runs {sys.executable} "
            "outside one: create one (python -m venv), install your app and sparkwal in it, run "
            "the driver with its python (a conda environment: pack it with conda-pack and set "
            "spark.archives yourself)")
    try:
        env = venv_pack.Env(prefix)
    except Exception as e:  # noqa: BLE001  venv-pack's own error says what is wrong with it
        raise EnvironmentShippingError(f"cannot pack the environment {prefix}: {e}") from None
    for pattern in _EXCLUDED:
        env = env.exclude(pattern)
    site = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    packed = {f.target for f in env.files}
    extra = [venv_pack.File(src, f"{site}/{rel}") for src, rel in package_files()
             if f"{site}/{rel}" not in packed]
    env.files.extend(extra)
    digest = hashlib.sha256()
    for f in sorted(env.files, key=lambda f: f.target):
        st = os.lstat(f.source)
        digest.update(f"{f.target}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    cache = os.path.expanduser(cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "sparkwal", "environments"))
    os.makedirs(cache, exist_ok=True)
    archive = os.path.join(os.path.abspath(cache), f"{ALIAS}-{digest.hexdigest()[:16]}.tar.gz")
    if os.path.exists(archive):
        log.info("shipping the driver's environment packed before: %s", archive)
        os.utime(archive)  # the newest used, kept by the pruning below
        return archive
    log.warning("packing the driver's environment %s for the executors (%d files; once per "
                "environment, cached as %s)", prefix, len(env.files), archive)
    tmp = os.path.join(os.path.dirname(archive), f".{os.path.basename(archive)}.{os.getpid()}.partial")
    try:
        env.pack(output=tmp, format="tar.gz", compress_level=1, force=True)
    except Exception as e:  # noqa: BLE001
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise EnvironmentShippingError(f"packing {prefix} failed: {e}") from None
    os.replace(tmp, archive)
    for old in sorted(glob.glob(os.path.join(cache, f"{ALIAS}-*.tar.gz")), key=os.path.getmtime)[:-KEEP]:
        try:
            os.unlink(old)
        except OSError:
            pass
    return archive
