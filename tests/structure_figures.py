"""Figures of how the driver's state is shared, read from the syntax trees (issue 43's measures):

* ``Protocol`` classes of the library and their members (issue 66: one implementer each, the
  driver, was ceremony, not a seam; the components are handed their collaborators instead);
* reads of a ``Driver``'s attributes from modules other than ``engine/driver/driver.py``: any
  ``driver.X``, ``self._driver.X`` or ``ssc.driver.X`` (a parameter or variable named ``driver``, an
  attribute named ``_driver``/``driver``; a stream's ``self._driver`` is its context's driver, as
  Spark's DStreams read their ``ssc``), counted apart where the module takes the driver as a
  narrow ``Protocol`` named ``...Host``;
* assignments to another object's attributes (``x.y = ...`` where ``x`` is not ``self``/``cls``,
  an object the instance keeps privately (``self._stats.y``), or one the function made itself);
* functions taking an untyped ``driver`` parameter.

Run: ``python tests/structure_figures.py`` (``--list`` names each place).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER_FILE = ROOT / "engine" / "driver" / "driver.py"


def library_files() -> list[Path]:
    rooms = ("base", "wal", "checkpoint", "tracker", "engine", "sparkwal")
    return sorted(p for room in rooms for p in (ROOT / room).rglob("*.py"))


def is_driver(node: ast.expr) -> bool:
    """``driver``, ``self._driver``, ``self.driver``, ``ssc.driver``, ``x._driver``."""
    if isinstance(node, ast.Name):
        return node.id == "driver"
    return isinstance(node, ast.Attribute) and node.attr in ("driver", "_driver")


def _host_annotated(module: ast.Module) -> bool:
    """Whether every ``driver`` parameter of the module is typed as a narrow interface (a
    ``Protocol`` named ``...Host``): its reads are of that interface, not of the whole driver."""
    notes = [arg.annotation for node in ast.walk(module) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs] if arg.arg == "driver"]
    return bool(notes) and all(n is not None and ast.unparse(n).endswith("Host") for n in notes)


def _built_here(function: ast.AST) -> set[str]:
    """Names a function binds to an object it makes itself (``report = Report(...)``): setting
    their attributes builds the function's own result, not another object's state."""
    return {t.id for node in ast.walk(function) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            for t in node.targets if isinstance(t, ast.Name)}


def _own(target: ast.expr, built: set[str]) -> bool:
    """``self.x``/``cls.x``, ``self._private.x`` (an object the instance keeps to itself), a
    module's private object or an object the function made."""
    value = target.value if isinstance(target, ast.Attribute) else None
    if isinstance(value, ast.Name):  # (a module's private object, ``_counters``, is its own too)
        return value.id in ("self", "cls") or value.id in built or value.id.startswith("_")
    return (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
            and value.value.id == "self" and value.attr.startswith("_"))


def figures() -> dict[str, list[str]]:
    protocols: list[str] = []
    members: list[str] = []
    reads, narrow, writes, untyped = [], [], [], []
    for path in library_files():
        if path == DRIVER_FILE:
            continue
        rel = path.relative_to(ROOT)
        module = ast.parse(path.read_text())
        through_host = _host_annotated(module)
        functions = [n for n in ast.walk(module) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        built_in = {id(node): _built_here(f) for f in functions for node in ast.walk(f)}
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Protocol") for b in node.bases):
                protocols.append(f"{rel}:{node.lineno}: {node.name}")
                members += [f"{rel}:{item.lineno}: {node.name}.{ast.unparse(getattr(item, 'target', item))}"
                            if isinstance(item, ast.AnnAssign) else f"{rel}:{item.lineno}: {node.name}.{item.name}"
                            for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.AnnAssign))]
            if isinstance(node, ast.Attribute) and is_driver(node.value):
                place = f"{rel}:{node.lineno}: {ast.unparse(node)}"
                if isinstance(node.ctx, ast.Store):
                    writes.append(place)
                else:
                    (narrow if through_host else reads).append(place)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and not _own(node, built_in.get(id(node), set())):
                writes.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    if arg.arg == "driver" and arg.annotation is None:
                        untyped.append(f"{rel}:{node.lineno}: {node.name}(driver)")
    return {"Protocol classes": protocols, "their members": members,
            "reads of the whole Driver from other modules": reads,
            "reads through a narrow interface (a ...Host Protocol)": narrow,
            "assignments to another object's attributes": writes,
            "functions with an untyped driver parameter": untyped}


def main() -> None:
    found = figures()
    for what, places in found.items():
        modules = Counter(p.split(":", 1)[0] for p in places)
        attrs = Counter(p.rsplit(".", 1)[-1] for p in places)
        print(f"{what}: {len(places)} in {len(modules)} modules ({len(attrs)} names)")
        if "--list" in sys.argv:
            for place in places:
                print(f"  {place}")


if __name__ == "__main__":
    main()
