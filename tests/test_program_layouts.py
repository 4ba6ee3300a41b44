"""A checkpoint's program in each layout sparkwal wrote it (``engine/driver/program_layouts.py``):
today's read by its own names, version 1 by sparkwal's earlier names, a later one refused before
any of it is unpickled. The committed fixtures of two earlier releases recover in
``test_pre_move_checkpoints.py``."""

from __future__ import annotations

import struct
import sys

import pytest

from sparkwal.engine import ProgramVersionError
from sparkwal.engine.driver.program_layouts import MAGIC, PROGRAM_VERSION, decode, encode


def version_1(**names: str) -> bytes:
    """A version-1 program (the bare pickle, protocol 0) whose fields name ``module.name`` globals."""
    body = b"(dp0\nVversion\np1\nI1\ns"
    for field, qualified in names.items():
        module, name = qualified.rsplit(".", 1)
        body += f"V{field}\nc{module}\n{name}\ns".encode()
    return body + b"."


@pytest.fixture
def own_engine_package(tmp_path, monkeypatch):
    """A program's own top-level package called ``engine`` (as sparkwal's room was once named)."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "pricing.py").write_text("def price(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # (the suite refuses the repository's folders as top-level packages: this one is the program's)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "_NoOldTopLevelNames"])
    for name in [n for n in sys.modules if n == "engine" or n.startswith("engine.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n == "engine" or n.startswith("engine.")]:
        del sys.modules[name]


def test_a_program_today_keeps_its_own_module_called_engine(own_engine_package):
    from engine.pricing import price

    program = decode(encode({"version": PROGRAM_VERSION, "graph": price, "batch_ms": 1000}), "ckpt")
    assert program["graph"] is price and program["graph"](21) == 42


def test_a_version_1_program_reads_sparkwals_earlier_names_and_its_own_otherwise(own_engine_package):
    program = decode(version_1(graph="engine.graph.DStreamGraph", state="engine.dstream.StateDStream",
                               save="engine.wordcount._save_batch", tag="engine.direct_wordcount._tag",
                               own="engine.pricing.price"), "ckpt")
    from sparkwal.engine.apps import direct_wordcount, wordcount
    from sparkwal.engine.graph import DStreamGraph
    from sparkwal.engine.state.update_state import StateDStream

    assert program["version"] == PROGRAM_VERSION
    assert program["graph"] is DStreamGraph and program["state"] is StateDStream
    assert program["save"] is wordcount.save_batch and program["tag"] is direct_wordcount.tag_line
    assert program["own"].__module__ == "engine.pricing" and program["own"](1) == 2  # not sparkwal's


def test_a_later_layout_is_refused_naming_the_checkpoint_before_anything_is_unpickled():
    later = struct.pack(">6sH", MAGIC, PROGRAM_VERSION + 1) + b"not a pickle: never read"
    with pytest.raises(ProgramVersionError, match=rf"/ckpt: the checkpoint's program has version "
                                                  rf"{PROGRAM_VERSION + 1}; this sparkwal reads version "
                                                  rf"{PROGRAM_VERSION}"):
        decode(later, "/ckpt")


def test_a_version_1_program_written_under_sparkwals_names_keeps_its_own_module_called_engine(own_engine_package):
    """Written after the package move (it names ``sparkwal.*``), a top-level ``engine`` can only be
    the program's own."""
    program = decode(version_1(graph="sparkwal.engine.graph.DStreamGraph", own="engine.pricing.price",
                               write="sparkwal.engine.direct_wordcount.write_batch",
                               save="sparkwal.engine.wordcount._save_batch"), "ckpt")
    from sparkwal.engine.apps import direct_wordcount, wordcount

    assert program["own"].__module__ == "engine.pricing" and program["write"] is direct_wordcount.write_batch
    assert program["save"] is wordcount.save_batch


def test_a_code_part_too_short_for_its_header_is_refused_naming_the_checkpoint():
    with pytest.raises(ProgramVersionError, match="/ckpt: the checkpoint's program has version None"):
        decode(MAGIC, "/ckpt")
