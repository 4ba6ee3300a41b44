"""The README and docs/ say true things: every relative link (and its #anchor) leads somewhere, and
the README's porting example runs as printed and keeps its promise under ``kill -9``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fast_jvms import submit_args_with

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (lower case, punctuation dropped, spaces to -)."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not linked
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto: ...
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_leads_somewhere():
    assert len(PAGES) > 10
    assert [b for page in PAGES for b in broken_links(page)] == []


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](missing.md) [bad](#nowhere) [web](https://x.org)\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)", "page.md: #nowhere (no such heading)"]


def test_the_readme_is_short_and_links_each_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(readme)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    reachable = set(linked)
    for page in pages & linked:  # a page reached from a page the README links
        reachable |= {Path(t.partition("#")[0]).name for t in LINK.findall((ROOT / "docs" / page).read_text())}
    assert pages - reachable == set()


def porting_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Porting a pyspark.streaming app", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


class App:
    """One run of the README's example in its own process group; its output read as it comes
    (its standard error kept: ``self.stderr()``)."""

    def __init__(self, script: Path, base: Path, ui: bool = False):
        submit = ("--conf spark.ui.enabled=true --conf spark.sparkwal.ui.port=0 --conf spark.ui.port=0"
                  if ui else "--conf spark.ui.enabled=false")
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1",
                   PYSPARK_SUBMIT_ARGS=submit_args_with(submit))
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self._err = open(base.parent / f"stderr-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen([sys.executable, str(script), str(base), "120"], stdout=subprocess.PIPE,
                                     stderr=self._err, text=True, env=env, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def stderr(self) -> str:
        self._err.flush()
        self._err.seek(0)
        return self._err.read()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, predicate, timeout: float = 90) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.lines), timeout), self.lines[-20:]

    def batches(self) -> int:
        return sum(line.startswith("Time: ") for line in self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def drop(inbox: Path, name: str, text: str) -> None:
    tmp = inbox / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, inbox / name)


def started(lines) -> bool:
    return any(line.startswith("counting the words of files moved into ") for line in lines)


def totals(app: App) -> dict[str, int]:
    """The newest printed total of each word (``('a', 3)`` lines)."""
    out = {}
    with app.changed:
        for line in app.lines:
            if line.startswith("('") and line.endswith(")"):
                word, n = line[2:-1].split("', ")
                out[word] = int(n)
    return out


@pytest.mark.driver
def test_the_porting_example_as_printed_counts_every_file_once_across_kill_9_and_stops_on_ctrl_c(tmp_path):
    """One life of the README's example, three runs of it:

    1. a file moved in right after ``start()`` returned, then ``kill -9`` at once, before its first
       batch is done (it is due a second later): the promise holds from the moment ``start()``
       returns;
    2. a file moved in while it was down; both counted, once; then a file counted and the run
       killed with ``kill -9`` (no stop, no last checkpoint);
    3. its UI address printed and served; a new file counted, nothing counted twice; the checkpoint's
       size following its content (the killed runs' reserved event-log space cut); Ctrl-C a clean
       stop, exit 0, no traceback."""
    script = tmp_path / "app.py"
    script.write_text(porting_example())
    base = tmp_path / "app"
    first = App(script, base)
    try:
        first.wait_for(started)
        drop(base / "in", "early.txt", "early bird\n")
    finally:
        first.kill()
    drop(base / "in", "down.txt", "down time bird\n")
    second = App(script, base)
    try:
        second.wait_for(lambda lines: totals(second).get("bird") == 2)
        seen = second.batches()
        second.wait_for(lambda lines: second.batches() > seen)  # that batch's lines all printed
        assert totals(second) == {"early": 1, "down": 1, "time": 1, "bird": 2}
        drop(base / "in", "one.txt", "a b a\n")
        second.wait_for(lambda lines: "('a', 2)" in lines)
    finally:
        second.kill()
    third = App(script, base, ui=True)
    try:
        third.wait_for(started)
        url = next(line for line in third.lines if started([line])).rsplit("Streaming UI: ", 1)[1]
        page = urllib.request.urlopen(f"{url}/streaming/", timeout=30).read().decode()
        assert "Streaming Statistics: ported" in page
        third.wait_for(lambda lines: third.batches() >= 1)
        drop(base / "in", "two.txt", "a c\n")
        third.wait_for(lambda lines: "('a', 3)" in lines)
        seen = third.batches()
        third.wait_for(lambda lines: third.batches() >= seen + 2)  # two more batches
        with third.changed:
            counts = [line for line in third.lines if line.startswith("('a', ")]
        assert counts[-1] == "('a', 3)" and "('a', 4)" not in counts  # nothing counted twice
        assert totals(third) == {"early": 1, "down": 1, "time": 1, "bird": 2, "a": 3, "b": 1, "c": 1}
        size = sum(f.stat().st_size for f in (base / "checkpoint").rglob("*") if f.is_file())
        assert size < 1 << 20, size
        os.killpg(third.proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
        assert third.proc.wait(60) == 0
        err = third.stderr()
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    finally:
        third.kill()
