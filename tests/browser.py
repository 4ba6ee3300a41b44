"""Headless Chromium (Debian's ``chromium`` package) for the UI's browser tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is needed for the browser tests: apt-get install chromium (.ci/run does)"
    return path


def browser_dom(url: str, tmp_path: Path) -> str:
    """The page as headless Chromium rendered it (its DOM after load)."""
    out = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
