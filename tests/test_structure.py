"""The code's structure, read from its syntax trees: no module reaches into another object's
private fields, imports form no circle, the layers point one way (``engine -> tracker -> wal``,
``engine -> checkpoint -> wal``), the apps sit on top, and every module stays small."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the rooms, folders of the repository mapped under the one import package: wal/ is sparkwal.wal
PACKAGES = ("base", "wal", "checkpoint", "tracker", "engine")
MAX_LINES = 450

#: Private names of other projects that have no public equivalent: PySpark's Py4J gateway and
#: JVM handles (the brief allows Spark core's JVM API through Py4J), a Py4J class's name and
#: gateway (engine/jvm_view.py keeps the classes it looked up), confluent-kafka's end-of-partition
#: code, and CPython's frame access for creation sites.
FOREIGN_PRIVATE = {"_jvm", "_jsc", "_jrdd", "_jrdd_deserializer", "_active_spark_context",
                   "_fqn", "_gateway_client", "_PARTITION_EOF", "_getframe", "_exit",
                   # PySpark's partitionBy sets it on the step it builds before asking its _jrdd: a step
                   # over rows the driver holds hands it to the PipelinedRDD it builds then
                   "_bypass_serializer",
                   # pyiceberg's split of rows by a partition spec (any transform), which its own
                   # append uses and which has no public name (pinned <0.13; IcebergSink's tests
                   # write a partitioned table)
                   "_determine_partitions"}


def modules() -> dict[str, Path]:
    """Module name -> file: the package's top and the command (sparkwal/), then the rooms."""
    found = {}
    for package in ("sparkwal", *PACKAGES):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts if package == "sparkwal" else ("sparkwal", *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def room(name: str) -> str:
    """``base``, ``wal``, ``checkpoint``, ``tracker`` or ``engine``; ``top`` for the package itself;
    ``command`` for the command's modules (``sparkwal.cli``, ...)."""
    parts = name.split(".")
    if len(parts) == 1:
        return "top"
    return parts[1] if parts[1] in PACKAGES else "command"


MODULES = modules()


def tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), str(MODULES[name]))


def private_accesses(name: str) -> list[str]:
    """Accesses of private names on anything but ``self``/``cls``: a module's own private names
    on another object (``self._wal._clock``, ``ssc._driver``) are a reach-in like any other."""
    module = tree(name)
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in FOREIGN_PRIVATE:
                found.append(f"{MODULES[name].relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{MODULES[name].relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if is_private(a.name)]
    return found


def is_private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def runtime_imports(name: str) -> set[str]:
    """The project modules ``name`` imports when it runs (any nesting), and the packages they
    live in; ``if TYPE_CHECKING:`` blocks and a PEP 562 ``__getattr__`` are not run on import and
    are left out."""
    module = tree(name)
    skipped: set[int] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            skipped.update(id(n) for n in ast.walk(node))
    is_package = MODULES[name].name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(module):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (name if is_package else name.rsplit(".", 1)[0]).split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    targets.add(f"{base}.{alias.name}")
                elif base in MODULES:
                    targets.add(base)
    for target in list(targets):  # importing a.b.c runs the packages a.b (unless name is inside)
        parts = target.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if package in MODULES and not name.startswith(package + "."):
                targets.add(package)
    targets.discard(name)
    return targets


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_module_reaches_into_another_objects_private_fields():
    found = [hit for name in MODULES for hit in private_accesses(name)]
    assert found == []


def test_the_private_field_check_catches_a_reach_in(monkeypatch, tmp_path):
    """The check above can fail: a reach into another object's field is found, also when the
    field has the name of one of the module's own (the case the earlier check let through)."""
    source = tmp_path / "reach.py"
    source.write_text("class Blocks:\n    def __init__(self, wal):\n        self._wal = wal\n"
                      "        self._clock = self._wal._clock\n\n\ndef f(ssc):\n    return ssc._graph\n")
    monkeypatch.setitem(MODULES, "reach", source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(private_accesses("reach")) == ["reach.py:4: self._wal._clock", "reach.py:8: ssc._graph"]


def test_imports_form_no_circle():
    edges = {name: runtime_imports(name) for name in MODULES}
    assert circles(edges) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_layers_point_one_way():
    """base imports no other room; wal only base; checkpoint and tracker only wal and base (and not
    each other), none of them the package's top or the command; nothing
    below engine imports it; the library's core never imports its apps (but for the shims that
    keep ``python -m sparkwal.engine.wordcount``/``.drill`` working), the
    apps and the command never import the driver's room (they use StreamingContext), and no room
    imports the command."""
    allowed = {"base": {"base"}, "wal": {"wal", "base"}, "checkpoint": {"checkpoint", "wal", "base"},
               "tracker": {"tracker", "wal", "base"}}
    shims = {"sparkwal.engine.wordcount", "sparkwal.engine.drill"}
    apps, driver = "sparkwal.engine.apps", "sparkwal.engine.driver"
    wrong = []
    for name in MODULES:
        layer = room(name)
        for target in runtime_imports(name):
            if layer in allowed and room(target) not in allowed[layer]:
                wrong.append(f"{name} -> {target}")
            if target.startswith(apps) and not name.startswith(apps) and name not in shims \
                    and layer != "command":
                wrong.append(f"{name} -> {target} (an app)")
            if (name.startswith(apps) or layer == "command") and target.startswith(driver):
                wrong.append(f"{name} -> {target} (the driver's room)")
            if layer in (*PACKAGES, "top") and room(target) == "command":
                wrong.append(f"{name} -> {target} (the command)")
    assert wrong == []


def test_every_module_stays_small():
    big = {str(path.relative_to(ROOT)): n for path in MODULES.values()
           if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_the_package_holds_its_rooms_only():
    """``pyproject.toml`` maps the rooms' folders under ``sparkwal`` (wal/ is ``sparkwal.wal``, ...)
    and nothing else: the checkout's tests, benchmarks and docs are not part of the package."""
    import importlib.util

    for room in ("wal", "checkpoint", "tracker", "engine"):
        spec = importlib.util.find_spec(f"sparkwal.{room}")
        assert spec is not None and Path(spec.origin).parent == ROOT / room
    for folder in ("tests", "benchmarks", "docs"):
        assert importlib.util.find_spec(f"sparkwal.{folder}") is None, folder
