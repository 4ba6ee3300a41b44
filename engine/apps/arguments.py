"""What the main job and the drill check on their command lines before any JVM starts: a mistake
is one line naming the argument and the value, plus usage, and exit status 2 (argparse's), not a
traceback after a JVM started.

Exit statuses shared by ``python -m sparkwal.engine.wordcount`` and ``python -m sparkwal.engine.drill``:

* 0 done (also after a graceful stop on SIGTERM or SIGINT);
* 1 the app failed (a batch's error; the drill: something lost or counted twice);
* 2 a usage or environment mistake (a bad argument, an unusable path, a package missing from
  this interpreter or from the executors' interpreter, no Java);
* 3 the main job's driver was fenced: another driver leads its checkpoint;
* 4 the storage failed: a storage call kept failing past ``spark.sparkwal.storage.deadline``
  (``wal.StorageUnavailableError``: the operation, the object and the last error are named) or
  the disk is full. Nothing half-written is left where a restart reads; restarted once the
  storage works again, the job resumes from its checkpoint;
* 5 the main job did not start: another live driver leads its checkpoint (run it with
  ``--standby`` to take over when that one dies). Nothing was recovered or run.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys

from sparkwal.engine.errors import one_line  # also the apps' (a.one_line)
from sparkwal.base.errors import SparkwalError

OK, FAILED, USAGE, FENCED, STORAGE, LEADER_HELD = 0, 1, 2, 3, 4, 5

#: module -> what provides it, for a line that says what to install
NEEDED = {"pyspark": "pyspark", "pyarrow": "pyarrow", "msgpack": "msgpack", "crc32c": "crc32c",
          "fsspec": "fsspec"}

_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
                     r"|spark://\S+|yarn|k8s://\S+")


def plain(text: str) -> str:
    """A docstring as ``--help`` shows it: reST's markup (````x````, ``:class:`X```, ``:mod:`X``)
    left out, the text kept."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """An app's argument parser: its docstring as the help's text (plain), the exit statuses below as its
    epilog, and no abbreviated options (``--versio`` is not taken for ``--version``)."""
    return argparse.ArgumentParser(prog=prog, description=plain(doc), allow_abbrev=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=plain(__doc__.split("\n\n", 1)[1]))


def _seconds(text: str, least: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and least == "a positive"):
        raise argparse.ArgumentTypeError(f"must be {least} number of seconds, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    return _seconds(text, "a positive")


def non_negative_seconds(text: str) -> float:
    """argparse type: 0 or a positive, finite number of seconds."""
    return _seconds(text, "0 or a positive")


def count(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {text!r}")
    return value


def positive_count(text: str) -> int:
    value = count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more, got {text!r}")
    return value


def port(text: str) -> int:
    value = count(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {text!r}")
    return value


def check_master(ap: argparse.ArgumentParser, master: str, flag: str = "--master") -> None:
    if not _MASTER.fullmatch(master):
        ap.error(f"{flag} {master!r}: not a Spark master (local[N], local-cluster[N,C,MB], "
                 "spark://HOST:PORT, yarn, k8s://...)")


def check_key_values(ap: argparse.ArgumentParser, pairs: list[str], flag: str) -> list[tuple[str, str]]:
    """``KEY=VALUE`` pairs; a setting sparkwal reads (:mod:`sparkwal.engine.config`) with a bad
    value is a usage error here, status 2, before the JVM starts (not a failed start)."""
    from sparkwal.engine.config import ENTRIES, ConfigError

    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            ap.error(f"{flag} takes KEY=VALUE, got {pair!r}")
        if key in ENTRIES:
            try:
                ENTRIES[key].parse(value)
            except ConfigError as e:
                ap.error(f"{flag} {e}")
        out.append((key, value))
    return out


def usable_directory(ap: argparse.ArgumentParser, path: str, flag: str) -> str:
    """``path`` as an absolute directory, created if missing; a path that is a file, or that
    cannot be created or written, is a usage error naming it."""
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        ap.error(f"{flag} {path}: not a directory")
    try:
        os.makedirs(full, exist_ok=True)
    except OSError as e:
        ap.error(f"{flag} {path}: cannot create it ({e.strerror})")
    if not os.access(full, os.W_OK | os.X_OK):
        ap.error(f"{flag} {path}: not writable")
    return full


def absolute(url: str | None) -> str | None:
    """A local path made absolute (the main job changes into its work directory); URLs as given."""
    if url and "://" not in url:
        return os.path.abspath(url)
    return url


def local_path_is_directory(ap: argparse.ArgumentParser, url: str | None, flag: str) -> None:
    """A local ``url`` (no scheme, or ``file://``) that names a file is a usage error."""
    if url and ("://" not in url or url.startswith("file://")):
        path = url[len("file://"):] if url.startswith("file://") else url
        if os.path.exists(path) and not os.path.isdir(path):
            ap.error(f"{flag} {url}: not a directory")


def check_environment(ap: argparse.ArgumentParser, extra: dict[str, str] | None = None) -> None:
    """The packages the job imports, and Java for Spark, in this interpreter: one line naming
    what is missing and how to get it."""
    missing = [pkg for module, pkg in {**NEEDED, **(extra or {})}.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        ap.error(f"this Python ({sys.executable}) lacks {', '.join(missing)}: run it from the "
                 "virtualenv the README sets up (.venv/bin/python), or pip install "
                 + " ".join(missing))
    java_home = os.environ.get("JAVA_HOME")
    if java_home and not os.path.isfile(os.path.join(java_home, "bin", "java")):
        ap.error(f"JAVA_HOME={java_home} holds no bin/java: Spark needs Java 17 or 21")
    if not java_home and shutil.which("java") is None:
        ap.error("no java on PATH and no JAVA_HOME: Spark needs Java 17 or 21")


def check_worker_python(ap: argparse.ArgumentParser, master: str, confs: list[tuple[str, str]]) -> None:
    """In ``local[...]`` mode, an interpreter configured for the workers (``--conf
    spark.pyspark.python=...`` or ``PYSPARK_PYTHON``) other than this one is tried before the JVM
    starts: one that does not run, or cannot import what sparkwal's tasks need, is one line
    naming it and the modules (off local mode, ``start()``'s probe on the executors says it)."""
    from sparkwal.engine.cluster import PACKAGES, REQUIREMENTS, is_drivers_python, is_local_master

    python = dict(confs).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    if not python or not is_local_master(master) or is_drivers_python(python):
        return
    where = ("spark.pyspark.python" if dict(confs).get("spark.pyspark.python") else "PYSPARK_PYTHON")
    modules = ("pyspark", *PACKAGES, *REQUIREMENTS)
    probe = ("import importlib.util, sys\n"
             "def missing(m):\n"
             "    try:\n"
             "        return importlib.util.find_spec(m) is None\n"
             "    except Exception:\n"  # (a package found but not importable: a checkout not installed)
             "        return True\n"
             "print(' '.join(m for m in sys.argv[1:] if missing(m)))")
    try:
        out = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        ap.error(f"{where}={python}: the workers' interpreter does not run ({getattr(e, 'strerror', None) or e})")
    if out.returncode != 0:
        ap.error(f"{where}={python}: the workers' interpreter failed (exit status {out.returncode})")
    if out.stdout.split():
        ap.error(f"{where}={python}: the workers' interpreter cannot import {', '.join(out.stdout.split())} "
                 f"(leave {where} unset to run the workers on this interpreter, {sys.executable})")


def storage_fault(error: BaseException) -> bool:
    """Whether an app's error is its storage's: unavailable past the deadline, or full (also when
    it happened in a task and reached the driver as a Py4J error's text)."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ == "StorageUnavailableError" or getattr(error, "errno", None) == errno.ENOSPC:
            return True
        text = one_line(error)
        if any(s in text for s in ("StorageUnavailableError", "storage unavailable: ", "No space left on device",
                                         "renewing it failed: ", "the store answered with errors: ")):
            return True
        error = error.__cause__ or error.__context__
    return False


#: what looking at a checkpoint before the start may meet and leave to the start to report: the store
#: failing or refusing (OSError, WalError), the files not verifying (CheckpointError), a URL or storage
#: option it cannot take (ValueError), a filesystem's package missing (ImportError). A bug is raised.
STORAGE_OR_DATA_ERRORS = (OSError, SparkwalError, ValueError, ImportError)

#: the main job's spark.app.name, and the input stream each of its --source modes reads
MAIN_JOB = "sparkwal-wordcount"
MAIN_JOB_INPUTS = {"files": "FileInputDStream", "receiver": "ReceiverInputDStream",
                   "filelog": "DirectInputDStream"}


def checkpoint_program(url: str, options: dict | None) -> tuple[str, list[str]] | None:
    """Which program wrote the newest checkpoint in ``url``: its ``spark.app.name`` and the kinds
    of its input streams; None when there is none (or it cannot be read: the job's start says
    why). Reads files only."""
    from sparkwal.checkpoint import read_checkpoint

    try:
        cp = read_checkpoint(url, storage_options=options)
    except STORAGE_OR_DATA_ERRORS:  # unreadable: the job's start reads it again and says why
        return None
    if cp is None:
        return None
    name = dict(cp.data.get("conf") or []).get("spark.app.name", "an unnamed application")
    inputs = [part.split(":", 1)[-1].split("(", 1)[0] for part in cp.data.get("graph", "").split("; ")
              if part.endswith("<-[]")]
    return name, inputs


def check_own_checkpoint(prog: str, url: str, options: dict | None, source: str) -> None:
    """A checkpoint written by another program than the main job with ``--source source`` is
    refused before anything runs (recovering it would run that program, on its inputs): one line
    naming both, exit status 2."""
    found = checkpoint_program(url, options)
    if found is None:
        return
    name, inputs = found
    if name == MAIN_JOB and MAIN_JOB_INPUTS[source] in inputs:
        return
    if name == MAIN_JOB:
        modes = [m for m, kind in MAIN_JOB_INPUTS.items() if kind in inputs]
        theirs = f"the main job with --source {modes[0] if modes else '?'}"
    else:
        theirs = f"{name!r} (spark.app.name), reading {', '.join(inputs) or 'no input'}"
    print(f"{prog}: {url} holds the checkpoint of another program, {theirs}, not of this one, the "
          f"main job with --source {source}: a checkpoint recovers the program that wrote it; give "
          "this job a work directory (or --checkpoint) of its own", file=sys.stderr)
    sys.exit(USAGE)


def leader_held_line(leader: str, checkpoint: str) -> str:
    return (f"another driver leads {checkpoint} ({leader}): this job did not start; run it with "
            "--standby to take over when that driver dies, or stop that driver first")


def check_no_leader(prog: str, url: str, options: dict | None) -> None:
    """A live driver leading the checkpoint is said in one line before anything starts, exit 5
    (looked at without taking anything; ``start()`` decides for good). Only a local lock says so
    for certain: a lease may be a dead driver's, which ``start()`` waits out."""
    from sparkwal.wal.storage import resolve

    try:
        storage, root = resolve(url, options)
        leader = storage.leader(root) if storage.exists(root) else None
    except STORAGE_OR_DATA_ERRORS:  # unknown here: start() says
        return
    if leader is not None and leader.held and leader.kind == "lock":
        print(f"{prog}: {leader_held_line(leader.describe(), url)}", file=sys.stderr)
        sys.exit(LEADER_HELD)
