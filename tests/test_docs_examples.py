"""The docs' exactly-once examples run as printed (docs/direct.md): each whole program, taken from
the page as it stands, run as a user would (``python program.py WORKDIR [SERVER]``) against a real
SQLite file, Delta table, PostgreSQL server and Kafka broker, its table or topic read back through
the sink's own ``read()``. The Delta one runs twice: its lines once more, none twice."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "direct.md"


def program(sink: str) -> str:
    """The page's whole program whose imports name ``sink``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    found = [b for b in blocks if f"from sparkwal.engine.sinks import {sink}\n" in b]
    assert len(found) == 1, f"docs/direct.md has {len(found)} whole programs with {sink}"
    return found[0]


def run(tmp_path: Path, sink: str, *args) -> object:
    """The program run once in its own process group; what it prints last, as a Python value."""
    script = tmp_path / f"{sink.lower()}_example.py"
    script.write_text(program(sink))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "work"), *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=180, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.driver
def test_the_sqlite_example_counts_each_word_once(tmp_path):
    assert run(tmp_path, "SQLiteSink") == [("be", 2), ("not", 1), ("or", 1), ("to", 2)]


@pytest.mark.driver
def test_the_delta_example_runs_as_printed_and_again_without_doubling(tmp_path):
    assert run(tmp_path, "DeltaSink") == ["GET /a", "POST /b"]
    assert run(tmp_path, "DeltaSink") == ["GET /a", "GET /a", "POST /b", "POST /b"]  # resumed: the new lines only


@pytest.mark.driver
def test_the_iceberg_example_runs_as_printed_and_again_without_doubling(tmp_path):
    assert run(tmp_path, "IcebergSink") == ["GET /a", "POST /b"]
    assert run(tmp_path, "IcebergSink") == ["GET /a", "GET /a", "POST /b", "POST /b"]  # resumed: the new lines only


@pytest.mark.driver
def test_the_postgres_example_runs_as_printed(tmp_path, postgres):
    assert run(tmp_path, "PostgresSink", postgres) == ["GET /a", "POST /b"]


@pytest.mark.driver
def test_the_kafka_example_runs_as_printed(tmp_path, broker):
    assert run(tmp_path, "KafkaSink", broker) == ["GET /a", "POST /b"]
