"""sparkwal installs clean, as a user installs it (conftest's ``installed``): the wheel
``pip wheel --no-deps .`` builds holds one import package, ``sparkwal``; installed (not editable)
into a fresh virtualenv beside the running PySpark's version, pip resolving the rest, it runs the
command, the main job and a ported stateful app (killed with SIGKILL and restarted) from a directory
outside the checkout, and its environment packs for executors (``spark.sparkwal.shipEnvironment``)
with sparkwal's files in it. Run under each PySpark the project supports (the newest in the suite,
the oldest in the compatibility set)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from app_runs import run_ok as run
from test_readme import App, drop, porting_example, started, totals

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.compat]


@pytest.mark.driver
def test_the_wheel_installs_one_package_and_its_command_and_main_job_run(installed, tmp_path):
    version = run(installed / "sparkwal", "--version", cwd=tmp_path).stdout.strip()
    assert version.startswith("sparkwal ") and version != "sparkwal 0+unknown"
    where = run(installed / "python", "-c", "import sparkwal, sparkwal.engine.context as c; "
                "print(sparkwal.__file__, c.__file__)", cwd=tmp_path).stdout.split()
    assert all(str(installed.parent) in w and str(ROOT) not in w for w in where)  # the install, not the checkout
    (tmp_path / "empty").mkdir()
    verify = subprocess.run([installed / "sparkwal", "checkpoint", "verify", tmp_path / "empty"],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 1 and "is not a checkpoint" in verify.stderr
    out = run(installed / "sparkwal", "run", "wordcount", "--dir", tmp_path / "work", "--files", "3", "--batch",
              "0.5", "--seconds", "8", "--json", "--conf", "spark.ui.enabled=false", cwd=tmp_path).stdout
    stopped = [e for e in map(json.loads, out.splitlines()) if e["event"] == "stopped"]
    assert stopped and stopped[0]["files"] == 3 and stopped[0]["records"] == 9


@pytest.mark.driver
def test_a_ported_stateful_app_survives_kill_9_on_the_installed_package(installed, tmp_path, monkeypatch):
    script = tmp_path / "app.py"
    script.write_text(porting_example())
    base = tmp_path / "app"
    monkeypatch.setattr(sys, "executable", str(installed / "python"))  # App runs sys.executable
    first = App(script, base)
    try:
        first.wait_for(started)
        drop(base / "in", "one.txt", "a b a\n")
        first.wait_for(lambda lines: totals(first).get("a") == 2)
    finally:
        first.kill()
    second = App(script, base)
    try:
        second.wait_for(started)
        drop(base / "in", "two.txt", "a c\n")
        second.wait_for(lambda lines: totals(second).get("a") == 3)
        assert totals(second) == {"a": 3, "b": 1, "c": 1}
    finally:
        second.kill()


def test_the_installed_environment_packs_for_executors_with_sparkwal_in_it(installed, tmp_path):
    archive = run(installed / "python", "-c", "from sparkwal.engine.environment import packed_environment; "
                  f"print(packed_environment({str(tmp_path / 'cache')!r}))", cwd=tmp_path).stdout.strip()
    names = tarfile.open(archive).getnames()
    site = [n for n in names if n.endswith("site-packages/sparkwal/engine/context.py")]
    assert site and not any(n.endswith((".pth",)) and "__editable__" in n for n in names)


def test_the_installed_package_imports_every_module_first(installed, tmp_path):
    """As the checkout's editable install does (tests/test_engine_program.py): every module of the
    built package imports first in a fresh interpreter, under sparkwal.* names only."""
    from test_engine_program import _IMPORT_EACH_FIRST

    seen = json.loads(run(installed / "python", "-c", _IMPORT_EACH_FIRST, cwd=tmp_path).stdout.splitlines()[-1])
    assert seen["modules"] > 40 and seen["failed"] == [] and seen["tops"] == []
