"""What every verb of the ``sparkwal`` command shares: its exit statuses, its errors, how it reads
DIR and its storage options, and how it prints (text for people, ``--json`` for tools)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from sparkwal.base.errors import SparkwalError

OK, PROBLEM, USAGE = 0, 1, 2


class UsageError(SparkwalError, ValueError):
    """A command line that cannot be carried out as written (exit status 2)."""


class MissingDirectory(SparkwalError, ValueError):
    """DIR does not exist, is not a directory, or is not what the verb works on (no log, no
    checkpoint in it): exit status 1, one line (a cron job's mistyped path must not verify as a
    healthy, empty log)."""


def require_directory(args, what: str) -> None:
    """Raise :class:`MissingDirectory` naming ``args.dir`` unless it is a directory (on an object
    store: unless something is stored under it). Reads only."""
    import os

    from sparkwal.wal.storage import resolve

    try:
        storage, root = resolve(args.dir, storage_options(args.storage_option))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not storage.exists(root):
        raise MissingDirectory(f"no such {what} directory: {args.dir}")
    if storage.is_local and not os.path.isdir(root):
        raise MissingDirectory(f"not a directory: {args.dir} (a {what} is a directory)")


def storage_options(pairs: list[str]) -> dict | None:
    from sparkwal.wal.storage import parse_storage_options

    try:
        return parse_storage_options(pairs)
    except ValueError as e:
        raise UsageError(str(e)) from None


class Progress:
    """A progress bar on stderr for scans that take more than a moment (and only on a terminal)."""

    def __init__(self, what: str):
        self.what, self.started, self.shown = what, time.monotonic(), False

    def __call__(self, done: int, total: int) -> None:
        if not sys.stderr.isatty() or time.monotonic() - self.started < 0.5:
            return
        filled = int(30 * done / max(total, 1))
        sys.stderr.write(f"\r{self.what} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def emit(args, data: dict, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(data, default=jsonable, sort_keys=True))
    elif lines:
        print("\n".join(lines))


def jsonable(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"
