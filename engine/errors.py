"""An error as one line, for people: never a Py4J or Java trace in a log or on a terminal."""

from __future__ import annotations

import re

from sparkwal.base.errors import SparkwalError


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


class StreamingContextStateError(EngineError, RuntimeError):
    """An operation not allowed in the context's (or a stream's) current state."""


class CopySourceActiveError(EngineError, RuntimeError):
    """start() on a copy (``sparkwal checkpoint copy``) whose source a live driver leads, refused:
    ``source`` (its URL) and ``leader`` (a ``sparkwal.wal.storage.LeaderInfo``) say which."""

    def __init__(self, message: str, source: str, leader):
        super().__init__(message)
        self.source = source
        self.leader = leader
