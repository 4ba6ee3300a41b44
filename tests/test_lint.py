"""The habits that keep the code as it is: ruff (pyflakes and pycodestyle, 120 columns) and mypy
find nothing, with their settings in pyproject.toml. Both are pinned in the test extras."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("base", "wal", "checkpoint", "tracker", "engine")


def test_ruff_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_library(tmp_path):
    """Over the layout an install has: the rooms are folders beside the package in the
    repository, mapped under it (sparkwal.wal is wal/), which mypy cannot follow by itself."""
    package = tmp_path / "sparkwal"
    package.mkdir()
    for module in (ROOT / "sparkwal").glob("*.py"):
        (package / module.name).symlink_to(module)
    for room in ROOMS:
        (package / room).symlink_to(ROOT / room, target_is_directory=True)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--cache-dir", str(tmp_path / ".mypy_cache"), "sparkwal"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert "no issues found" in out.stdout
