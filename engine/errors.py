"""An error as one line, for people: never a Py4J or Java trace in a log or on a terminal."""

from __future__ import annotations

import functools
import importlib.util
import os
import re

from py4j.protocol import Py4JJavaError

from sparkwal.base.errors import SparkwalError
from sparkwal.base.times import batch_name


def one_line(error: BaseException) -> str:
    """An error as one line: a Py4J error's Java exception and its message (not its trace), a
    Python error inside a task as its last line, else ``Type: message``."""
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # noqa: BLE001  the JVM may be gone
            text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):  # a Python task's own error, inside a Java trace
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception): ", line) and not line.startswith(("at ", "org.", "java.")):
            return line
    return lines[0] if lines else type(error).__name__


class EngineError(SparkwalError):
    """Base class of every error the DStream engine raises (its receivers, sources and sinks too);
    an error that is also a built-in kind keeps that base (see :mod:`sparkwal.base.errors`)."""


class StateError(EngineError, RuntimeError):
    """A stateful stream's partitions do not line up with its batch (the state partition missing
    or misplaced): names the stream or partition and the batch."""


class ProgramVersionError(EngineError, ValueError):
    """A checkpoint's program (its code part) was written in a layout this sparkwal does not read:
    names the checkpoint, the layout's version and the one read here."""

    def __init__(self, path: str, version, supported: int):
        self.path, self.version, self.supported = path, version, supported
        super().__init__(f"{path}: the checkpoint's program has version {version}; this sparkwal reads "
                         f"version {supported}")


class MissingInputError(EngineError, LookupError):
    """A restart's batches would read again input that is no longer there (a file stream's files not
    copied with a checkpoint copy, or deleted): names the files, the directory and where they were read."""


class StreamingContextStateError(EngineError, RuntimeError):
    """An operation not allowed in the context's (or a stream's) current state."""


class CopySourceActiveError(EngineError, RuntimeError):
    """start() on a copy (``sparkwal checkpoint copy``) whose source a live driver leads, refused:
    ``source`` (its URL) and ``leader`` (a ``sparkwal.wal.storage.LeaderInfo``) say which."""

    def __init__(self, message: str, source: str, leader):
        super().__init__(message)
        self.source = source
        self.leader = leader


class AnotherApplicationError(EngineError, ValueError):
    """``getOrCreate`` refused to recover a checkpoint written by an application of another name:
    recovering runs the checkpoint's program, not the caller's (``path``, ``written_by``, ``app_name``)."""

    def __init__(self, path: str, written_by: str, app_name: str):
        self.path, self.written_by, self.app_name = path, written_by, app_name
        super().__init__(
            f"the checkpoint in {path} belongs to application {written_by!r}, not to this one ({app_name!r}): "
            "recovering would run that program; give this application a checkpoint directory of its own, "
            "or recover it anyway with getOrCreate(..., allow_other_app=True) "
            "(spark.sparkwal.recover.allowOtherApp=true)")


class BatchFailedError(EngineError, Py4JJavaError):
    """A batch's Spark job failed, as ``awaitTermination`` raises it: still the ``Py4JJavaError``
    pyspark.streaming raises (``java_exception`` is the Java exception, its trace ``java_trace()``),
    but its text is one line naming the batch, not the Java trace. Once a SparkSession exists,
    PySpark turns a failed job into one of its captured exceptions (a ``PythonException`` whose text
    is the worker's whole traceback): that one is wrapped the same way (``error`` is PySpark's
    exception, ``java_exception`` None), so a failed batch is this one type either way."""

    def __init__(self, time_ms: int | None, error: BaseException):
        if isinstance(error, Py4JJavaError):
            Py4JJavaError.__init__(self, error.errmsg, error.java_exception)
        else:  # (Py4J's __init__ needs a Java object)
            self.errmsg, self.java_exception, self.cause = str(error), None, None
        self.time_ms, self.error = time_ms, error  # the driver's frames (a foreachRDD's) come with it
        self.with_traceback(error.__traceback__)
        where = _task_code_line(error)
        self.message = (f"{batch_name(time_ms) if time_ms is not None else 'a batch'} failed: {one_line(error)}"
                        + (f" ({where})" if where else ""))
        self.args = (self.message,)

    def __str__(self) -> str:
        return self.message

    def java_trace(self) -> str:
        """The Java exception's trace (what ``str()`` of a ``Py4JJavaError`` is); PySpark's own text
        of a captured exception."""
        return Py4JJavaError.__str__(self) if self.java_exception is not None else str(self.error)

    @staticmethod
    def wraps(error: BaseException) -> bool:
        """Whether ``error`` is a failed Spark job this class wraps: Py4J's error, or PySpark's captured
        exception of it (pyspark.errors.exceptions.captured, in every supported version)."""
        if isinstance(error, Py4JJavaError):
            return True
        from pyspark.errors.exceptions.captured import CapturedException

        return isinstance(error, CapturedException)


@functools.cache
def _library_folders() -> tuple[str, ...]:
    """The folders sparkwal's rooms load from (in a checkout they are not under one folder)."""
    folders = []
    for room in ("sparkwal", "sparkwal.base", "sparkwal.wal", "sparkwal.checkpoint", "sparkwal.tracker",
                 "sparkwal.engine"):
        spec = importlib.util.find_spec(room)
        folders += [os.path.abspath(f) + os.sep for f in (spec.submodule_search_locations or [])] if spec else []
    return tuple(folders)


def is_library_code(path: str) -> bool:
    """Whether a traceback's file is sparkwal's, PySpark's or Py4J's rather than the app's own."""
    in_library = re.search(r"[/\\](pyspark|py4j)[/\\]", path) is not None
    return in_library or os.path.abspath(path).startswith(_library_folders())


#: a Python traceback's line inside a Java trace: a task's own error
_PYTHON_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _task_code_line(error: BaseException) -> str | None:
    """Where in the app's own code a failed task's Python error was raised (``at app.py:12 in
    <lambda>``): the innermost frame of the worker's traceback outside PySpark and sparkwal."""
    try:
        text = Py4JJavaError.__str__(error) if isinstance(error, Py4JJavaError) else str(error)
    except Exception:  # noqa: BLE001 (the JVM may be gone: the error's own line is enough)
        return None
    frames = [m for m in _PYTHON_FRAME.finditer(text) if not is_library_code(m.group(1))]
    if not frames:
        return None
    path, line, function = frames[-1].groups()
    return f"at {path.rsplit('/', 1)[-1]}:{line} in {function}"
