"""Every layout a checkpoint's program was written in, and how each is read now: the one place that
knows sparkwal's earlier module names.

A program is the pickle (pyspark's cloudpickle) of ``{"version", "graph", "batch_ms",
"concurrent_jobs"}`` (:mod:`.program`), stored as the body of the checkpoint's code part
(:mod:`sparkwal.checkpoint.code`). Its layouts:

* **version 2** (this sparkwal's): ``"SWPROG"`` (6 bytes), the version as a big-endian u16, then
  the pickle. The version is read before anything is unpickled: a later layout is refused without
  running any of its code, and the names in the pickle are read as they are, so a program's own
  module called ``engine`` stays the program's.
* **version 1**: the bare pickle (its dict says ``"version": 1``), written while sparkwal's modules
  had other names. Three sets of names are read under today's:

  - before the ``sparkwal`` package (issue 42; ``tests/fixtures/pre_package``, made at 08f1519) and
    before the engine's rooms (issue 31; ``tests/fixtures/pre_move``, made at 5caa667): the
    top-level packages ``engine``, ``wal``, ``checkpoint`` and ``tracker``. Such a name is read
    as sparkwal's (``engine.graph`` as ``sparkwal.engine.graph``) when sparkwal has it; else as the
    program's own module of that name;
  - before the stateful streams had a room: ``engine.dstream``'s ``StateDStream``,
    ``ReducedWindowedDStream`` and ``update_by_key``, now in ``sparkwal.engine.state.update_state``;
  - before the main job moved into ``engine/apps/`` (issue 49): ``engine.wordcount``'s
    ``_save_batch`` and ``_BATCH_RECORDS`` and ``engine.direct_wordcount``'s ``_tag`` and
    ``write_batch``.

  A version-1 program is otherwise what a version-2 one is: read, it is the current program.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import struct
import types

from pyspark import cloudpickle
from pyspark.cloudpickle.cloudpickle import subimport

from ..errors import ProgramVersionError

PROGRAM_VERSION = 2
MAGIC = b"SWPROG"
_HEADER = struct.Struct(">6sH")

#: the top-level packages sparkwal had before they became ``sparkwal.*``
_OLD_TOPS = ("engine", "wal", "checkpoint", "tracker")
#: (module, name) of version 1, after the tops' renaming -> where it is now
_MOVED = {
    ("sparkwal.engine.dstream", "StateDStream"): ("sparkwal.engine.state.update_state", "StateDStream"),
    ("sparkwal.engine.dstream", "ReducedWindowedDStream"):
        ("sparkwal.engine.state.update_state", "ReducedWindowedDStream"),
    ("sparkwal.engine.dstream", "update_by_key"): ("sparkwal.engine.state.update_state", "update_by_key"),
    ("sparkwal.engine.wordcount", "_save_batch"): ("sparkwal.engine.apps.wordcount", "save_batch"),
    ("sparkwal.engine.wordcount", "_BATCH_RECORDS"): ("sparkwal.engine.apps.wordcount", "BATCH_RECORDS"),
    ("sparkwal.engine.direct_wordcount", "_tag"): ("sparkwal.engine.apps.direct_wordcount", "tag_line"),
    ("sparkwal.engine.direct_wordcount", "write_batch"): ("sparkwal.engine.apps.direct_wordcount", "write_batch"),
}
#: modules of version 1 that are gone, and the module now holding what a program took from them
_MOVED_MODULES = {"sparkwal.engine.direct_wordcount": "sparkwal.engine.apps.direct_wordcount"}


def encode(program: dict) -> bytes:
    """The code part's body of ``program`` (at :data:`PROGRAM_VERSION`); pickling errors propagate."""
    return _HEADER.pack(MAGIC, PROGRAM_VERSION) + cloudpickle.dumps(program)


def decode(body: bytes, path: str) -> dict:
    """The program a code part's body holds, in this sparkwal's names, whichever layout wrote it.
    :class:`~sparkwal.engine.ProgramVersionError` names ``path`` (the checkpoint) when a later
    sparkwal wrote it."""
    if body.startswith(MAGIC):
        if len(body) < _HEADER.size:
            raise ProgramVersionError(path, None, PROGRAM_VERSION)
        _, version = _HEADER.unpack_from(body)
        if version != PROGRAM_VERSION:
            raise ProgramVersionError(path, version, PROGRAM_VERSION)
        program = pickle.loads(body[_HEADER.size:])
    else:
        # written after the package move (it names sparkwal.*), a top-level engine is the program's own
        program = _Version1Unpickler(io.BytesIO(body), old_tops=b"sparkwal." not in body).load()
        if not isinstance(program, dict) or program.get("version") != 1:
            raise ProgramVersionError(path, program.get("version") if isinstance(program, dict) else None,
                                      PROGRAM_VERSION)
    return {**program, "version": PROGRAM_VERSION}


def _sparkwals(module: str) -> str | None:
    """A version-1 module name under sparkwal's, when it is one of sparkwal's old tops."""
    return f"sparkwal.{module}" if module.split(".", 1)[0] in _OLD_TOPS else None


def _is_sparkwals(module: str) -> bool:
    """Whether sparkwal has ``module`` (found; its parent packages, sparkwal's own, are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # (its parent is not sparkwal's either)
        return False


def _module_of_version_1(module: str, old_tops: bool = True) -> str:
    """The module a version-1 program's ``module`` is now: sparkwal's, when sparkwal has it (an old
    top-level name only while ``old_tops``: written before the package move)."""
    renamed = _sparkwals(module) if old_tops else None
    if renamed is not None and _is_sparkwals(_MOVED_MODULES.get(renamed, renamed)):
        return _MOVED_MODULES.get(renamed, renamed)
    return _MOVED_MODULES.get(module, module)


class _ModuleWithOldNames(types.ModuleType):
    """A module a version-1 function took as a global (``app._save_batch(...)`` in the main job's
    program), with the names it had then: the old ones lead to where they are now."""

    def __init__(self, module: types.ModuleType, old_names: dict[str, tuple[str, str]], written_as: str):
        super().__init__(module.__name__, module.__doc__)
        self._module, self._old_names, self._written_as = module, old_names, written_as

    def __reduce__(self):
        """Pickled again (the recovered program is the next checkpoint's), it is read back the same
        way: the function's code still says the old names."""
        return _subimport_version_1, (self._written_as,)

    def __getattr__(self, name: str):
        if name in self._old_names:
            home, new_name = self._old_names[name]
            return getattr(importlib.import_module(home), new_name)
        return getattr(self._module, name)


def _subimport_version_1(module_name: str, old_tops: bool = True) -> types.ModuleType:
    module = subimport(_module_of_version_1(module_name, old_tops))
    renamed = (_sparkwals(module_name) if old_tops else None) or module_name
    old_names = {name: new for (old_module, name), new in _MOVED.items() if old_module == renamed}
    return _ModuleWithOldNames(module, old_names, module_name) if old_names else module


class _Version1Unpickler(pickle.Unpickler):
    """pickle's reader, with the module names of version 1 read as today's (in the classes and
    functions it names, and in the modules cloudpickle imports for a function's globals)."""

    def __init__(self, file, old_tops: bool):
        super().__init__(file)
        self._old_tops = old_tops

    def find_class(self, module: str, name: str):
        renamed = (_sparkwals(module) if self._old_tops else None) or module
        if (renamed, name) in _MOVED:
            return super().find_class(*_MOVED[renamed, name])
        found = super().find_class(_module_of_version_1(module, self._old_tops), name)
        if found is subimport:
            return lambda module_name: _subimport_version_1(module_name, self._old_tops)
        return found
