"""Errors with a root: everything sparkwal raises on purpose is a :class:`sparkwal.SparkwalError`,
each room's errors sit under that room's root, and code that branches on an error's kind catches
a type, never a message's text."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil

import pytest

import sparkwal
from sparkwal import SparkwalError
from sparkwal.checkpoint import (CheckpointError, CheckpointMismatchError, MissingCodePartError, SnapshotError,
                                 read_code, write_code)
from sparkwal.engine import EngineError
from sparkwal.tracker import TrackerError
from sparkwal.wal import WalError

ROOTS = {"sparkwal.wal": WalError, "sparkwal.checkpoint": CheckpointError,
         "sparkwal.tracker": TrackerError, "sparkwal.engine": EngineError}
#: the command and the apps sit above the rooms: their errors are under the library's root
ABOVE_THE_ROOMS = ("sparkwal.engine.apps", "sparkwal.cli", "sparkwal.common", "sparkwal.wal_verbs",
                   "sparkwal.checkpoint_verbs", "sparkwal.received")


def library_errors() -> dict[str, type]:
    """Every exception class a sparkwal module defines: ``module.Name`` -> class."""
    rooms = [importlib.import_module(room) for room in ROOTS]
    names = [m.name for room in rooms for m in pkgutil.walk_packages(room.__path__, room.__name__ + ".")]
    names += [f"sparkwal.{m.name}" for m in pkgutil.iter_modules([os.path.dirname(sparkwal.__file__)])
              if m.name != "__main__"]  # the package's top and the command (not the checkout's root)
    found = {}
    for name in names:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{attr}"] = value
    return found


def test_every_error_sparkwal_defines_is_under_its_rooms_root():
    errors = library_errors()
    assert len(errors) > 30  # the walk saw the rooms, not just the package's top
    wrong = []
    for name, error in errors.items():
        if error is SparkwalError:
            continue
        if not issubclass(error, SparkwalError):
            wrong.append(f"{name} is not a SparkwalError")
            continue
        room = next((r for r in ROOTS if name.startswith(r + ".")), None)
        if room is None or name.startswith(ABOVE_THE_ROOMS) or error is ROOTS[room]:
            continue
        if not issubclass(error, ROOTS[room]):
            wrong.append(f"{name} is not a {ROOTS[room].__name__}")
    assert wrong == []


def test_the_rooms_roots_share_the_librarys_root_and_errors_keep_their_builtin_kinds():
    assert all(issubclass(root, SparkwalError) for root in ROOTS.values())
    assert issubclass(CheckpointMismatchError, CheckpointError) and issubclass(CheckpointMismatchError, ValueError)
    assert issubclass(SnapshotError, CheckpointError) and issubclass(SnapshotError, RuntimeError)
    from sparkwal.engine import StreamingContextStateError
    from sparkwal.engine.driver.states import StreamingContextStateError as where_it_was
    assert where_it_was is StreamingContextStateError
    assert issubclass(StreamingContextStateError, EngineError) and issubclass(StreamingContextStateError, RuntimeError)


def test_the_check_sees_an_error_outside_the_root():
    """The walk above can fail: a class defined like the errors before the root is found."""
    stray = type("StrayError", (RuntimeError,), {"__module__": "sparkwal.engine.stray"})
    assert not issubclass(stray, SparkwalError)


def test_a_missing_code_part_is_its_own_kind(tmp_path):
    """getOrCreate reads the newest checkpoint again when the code part its first read named was
    deleted meanwhile: it catches this type (it once matched the message's text)."""
    name = write_code(str(tmp_path), b"program")
    assert read_code(str(tmp_path), name) == b"program"
    (tmp_path / name).unlink()
    with pytest.raises(MissingCodePartError, match=name) as caught:
        read_code(str(tmp_path), name)
    assert isinstance(caught.value, CheckpointError)
