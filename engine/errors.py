"""An error as one line, for people: never a Py4J or Java trace in a log or on a terminal."""

from __future__ import annotations

import re


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
