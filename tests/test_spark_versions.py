"""Spark 3.5 through the newest 4.x: what a Spark lacks is detected and falls back with one log line,
and a checkpoint written under the oldest supported Spark recovers under the newest with its state
exact (the upgrade users make: stop the app, upgrade PySpark, start it again). Run in the suite
(the newest Spark) and in the compatibility set (``.venv35``, PySpark 3.5.0)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyspark
import pytest

from test_readme import App, drop, porting_example, started, totals

ROOT = Path(__file__).resolve().parent.parent
#: the project's newest PySpark: the virtualenv the README's test command makes first
NEWEST = Path(os.environ.get("SPARKWAL_NEWEST_PYTHON", ROOT / ".venv" / "bin" / "python"))


def test_a_missing_feature_falls_back_with_one_line(caplog):
    from sparkwal.engine import compat

    compat._said.discard("unix_socket_workers")  # noqa: SLF001  (a fresh process's state)
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine.compat"):
        has = compat.supports("unix_socket_workers")
        again = compat.supports("unix_socket_workers")
    assert has == again == (compat.version_of(pyspark.__version__) >= (4, 1))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ([] if has else [f"Spark {pyspark.__version__[:3]}: Python workers talk to their executor "
                                     "over loopback TCP (spark.python.unix.domain.socket.enabled needs Spark 4.1)"])
    assert compat.version_of("3.5.0") == (3, 5) and compat.version_of("4.1.0.dev1") == (4, 1)
    with pytest.raises(ValueError, match="not a Spark version"):
        compat.version_of("unknown")


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.driver
def test_a_checkpoint_written_under_this_spark_recovers_under_the_newest(tmp_path, monkeypatch):
    """The README's stateful example under this PySpark, killed with SIGKILL, started again under
    the newest: its totals go on, exact."""
    assert NEWEST.exists(), f"{NEWEST}: the README's test command makes it (SPARKWAL_NEWEST_PYTHON elsewhere)"
    script = tmp_path / "app.py"
    script.write_text(porting_example())
    base = tmp_path / "app"
    first = App(script, base)
    try:
        first.wait_for(started)
        drop(base / "in", "one.txt", "a b a\n")
        first.wait_for(lambda lines: totals(first).get("a") == 2)
    finally:
        first.kill()
    monkeypatch.setattr("sys.executable", str(NEWEST))
    second = App(script, base)
    try:
        second.wait_for(started)
        drop(base / "in", "two.txt", "a c\n")
        second.wait_for(lambda lines: totals(second).get("a") == 3)
        assert totals(second) == {"a": 3, "b": 1, "c": 1}
    finally:
        second.kill()
