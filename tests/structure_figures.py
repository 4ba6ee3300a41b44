"""Figures of how the driver's state is shared, read from the syntax trees (issue 43's measures):

* reads of a ``Driver``'s attributes from modules other than ``engine/driver/driver.py``: any
  ``driver.X``, ``self._driver.X``, ``ssc.driver.X`` or ``d.X`` where the name is bound to a driver
  (a parameter or variable named ``driver``, an attribute named ``_driver``/``driver``);
* assignments to another object's attributes (``x.y = ...`` where ``x`` is not ``self``/``cls``);
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
    rooms = ("wal", "checkpoint", "tracker", "engine", "sparkwal")
    return sorted(p for room in rooms for p in (ROOT / room).rglob("*.py"))


def is_driver(node: ast.expr) -> bool:
    """``driver``, ``self._driver``, ``self.driver``, ``ssc.driver``, ``x._driver``."""
    if isinstance(node, ast.Name):
        return node.id == "driver"
    return isinstance(node, ast.Attribute) and node.attr in ("driver", "_driver")


def figures() -> dict[str, list[str]]:
    reads, writes, untyped = [], [], []
    for path in library_files():
        if path == DRIVER_FILE:
            continue
        rel = path.relative_to(ROOT)
        module = ast.parse(path.read_text())
        for node in ast.walk(module):
            if isinstance(node, ast.Attribute) and is_driver(node.value):
                place = f"{rel}:{node.lineno}: {ast.unparse(node)}"
                (writes if isinstance(node.ctx, ast.Store) else reads).append(place)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                writes.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    if arg.arg == "driver" and arg.annotation is None:
                        untyped.append(f"{rel}:{node.lineno}: {node.name}(driver)")
    return {"driver attribute reads from other modules": reads,
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
