"""A ported app's console, as a user sees it (sparkwal.engine.console): an error sparkwal raises that
the app does not catch is one line naming it, status 1, never a Python, Py4J or Java trace; Spark's
log level and progress bar left at PySpark's defaults are made quiet when the stream starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_program_identity import foreign_checkpoint

APP = Path(__file__).resolve().parent / "console_app.py"


def run_app(*args, **extra_env) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPARKWAL_TRACEBACK"}
    env.update(SPARK_LOCAL_IP="127.0.0.1", **extra_env)
    return subprocess.run([sys.executable, str(APP), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120, start_new_session=True)


def app_lines(stderr: str) -> list[str]:
    """Standard error without the JVM's start-up lines (printed before any sparkwal code runs) and the one
    line an older PySpark's fallback says (``Spark 3.5: ...``)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(
        ("WARNING: Using incubator", "Using Spark's default", "Setting default log level", "To adjust logging"))
        and " WARN NativeCodeLoader" not in line and not re.match(r"Spark \d+\.\d+: ", line)]


@pytest.mark.driver
def test_a_batch_that_fails_in_the_jvm_ends_the_app_in_one_line():
    proc = run_app("failing")
    started = json.loads(proc.stdout.splitlines()[0])
    assert started["logLevel"] == "ERROR"  # PySpark's default WARN, made quiet at start
    lines = app_lines(proc.stderr)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "\tat " not in proc.stderr and "py4j" not in proc.stderr.lower()
    last = lines[-1]  # the app's own line it came through (its awaitTermination), the batch as a time
    assert re.fullmatch(r"console_app\.py:\d+: batch \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{3})? failed: "
                        r"org\.apache\.hadoop\.mapred\.InvalidInputException: Input path does not exist: "
                        r"file:/nonexistent/sparkwal-console-input", last), proc.stderr
    assert lines[:-1] and all(line.startswith("error in batch ") for line in lines[:-1])  # the driver's own log
    for mode in ("task", "session-task"):  # the app's own function failed in a task: where, in one line
        task = run_app(mode)  # (with a SparkSession, PySpark's PythonException holds the worker's whole traceback)
        assert task.returncode == 1 and "Traceback" not in task.stderr and "\tat " not in task.stderr, task.stderr
        assert re.search(r"console_app\.py:\d+: batch .* failed: ZeroDivisionError: division by zero "
                         r"\(at console_app\.py:\d+ in divide\)$", app_lines(task.stderr)[-1]), task.stderr


@pytest.mark.driver
def test_recovering_another_applications_checkpoint_is_one_line(tmp_path):
    foreign_checkpoint(tmp_path / "checkpoint", "sparkwal-wordcount", "0:FileInputDStream(slide=1000)<-[]")
    proc = run_app("recover", tmp_path / "checkpoint")
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    line = app_lines(proc.stderr)
    assert len(line) == 1 and re.match(r"console_app\.py:\d+: ", line[0]), proc.stderr  # the getOrCreate line
    assert line == [
        f"{line[0].split(': ', 1)[0]}: the checkpoint in {tmp_path / 'checkpoint'} belongs to application "
        "'sparkwal-wordcount', not to this one ('console-app'): recovering would run that program; give this "
        "application a checkpoint directory of its own, or recover it anyway with "
        "getOrCreate(..., allow_other_app=True) (spark.sparkwal.recover.allowOtherApp=true)"]
    shown = run_app("recover", tmp_path / "checkpoint", SPARKWAL_TRACEBACK="1")  # the trace, when asked for
    assert shown.returncode == 1 and "Traceback" in shown.stderr and "AnotherApplicationError" in shown.stderr


@pytest.mark.driver
def test_spark_console_is_put_back_when_the_stream_stops():
    """A notebook or shell goes on with PySpark's own console after the stream."""
    proc = run_app("stop")
    started, stopped = (json.loads(line) for line in proc.stdout.splitlines()[:2])
    assert proc.returncode == 0, proc.stderr
    assert started["logLevel"] == "ERROR" and started["threshold"] is None, started
    assert stopped["threshold"] == "WARN" and stopped["logLevel"] != "ERROR", stopped  # PySpark's defaults again
