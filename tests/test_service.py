"""One way to run a thread (issue 43, item 4): :class:`sparkwal.base.service.Service`."""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

from sparkwal.base.service import Service, spawn

ROOT = Path(__file__).resolve().parent.parent


def test_a_service_stops_on_its_event_and_joins():
    ticks = []

    def tick() -> None:
        while not service.stopping.wait(0.01):
            ticks.append(1)

    service = Service("ticker", tick)
    assert service.join(0) is True  # never started: nothing to wait for
    service.start()
    assert service.is_alive()
    assert service.stop(10) is True and not service.is_alive()


def test_a_service_stopped_from_its_own_thread_does_not_wait_for_itself():
    outcome = []
    service = Service("self-stopping", lambda: outcome.append(service.stop(10)))
    service.start()
    assert service.join(10) and outcome == [True]


def test_a_stuck_thread_is_named_in_one_warning_and_left(caplog):
    release = threading.Event()
    stuck = spawn("stuck-writer", release.wait, 30)
    with caplog.at_level(logging.WARNING, logger="sparkwal.base.service"):
        assert stuck.stop(0.05) is False
    assert "thread 'stuck-writer' did not end within 0.05 s; left running" in caplog.text
    release.set()
    assert stuck.join(10)


def test_the_library_starts_threads_only_through_the_service():
    starts = []
    for room in ("base", "wal", "checkpoint", "tracker", "engine", "sparkwal"):
        for path in sorted((ROOT / room).rglob("*.py")):
            if path == ROOT / "base" / "service.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and ast.unparse(node.func) in ("threading.Thread", "Thread"):
                    starts.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert starts == []
