"""One configuration: every setting sparkwal reads is one typed entry of
:mod:`sparkwal.engine.config`, read once per driver, with one parser per kind and one unit per
key; a bad value is one line naming the key and the value; the docs' table is the module's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sparkwal.engine import StreamingContext
from sparkwal.engine.config import ENTRIES, ConfigError, StreamingConf, settings_table

ROOT = Path(__file__).resolve().parent.parent
KEY = re.compile(r"spark\.(streaming|sparkwal|sql\.streaming)\.[A-Za-z.]+[A-Za-z]")
#: class and package names under spark.streaming that are not settings
NOT_SETTINGS = {"spark.streaming.kafka.KafkaUtils", "spark.streaming.DStream"}


def library_sources() -> list[Path]:
    rooms = ("base", "wal", "checkpoint", "tracker", "engine", "sparkwal")
    return [p for room in rooms for p in (ROOT / room).rglob("*.py")]


def test_the_docs_table_is_the_modules():
    assert (ROOT / "docs" / "configuration.md").read_text() == settings_table(), \
        "regenerate it: python -m sparkwal.engine.config > docs/configuration.md"


def test_every_setting_the_code_names_is_declared_and_read_only_through_the_module():
    undeclared, read_elsewhere = [], []
    for path in library_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and KEY.fullmatch(node.value):
                if node.value not in ENTRIES and node.value not in NOT_SETTINGS \
                        and not node.value.endswith(".pid."):  # the tracker's PID prefix
                    undeclared.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and isinstance(node.args[0], ast.Constant) \
                    and KEY.fullmatch(str(node.args[0].value)) and path.name != "config.py" \
                    and "tracker" not in path.parts:
                read_elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert undeclared == [] and read_elsewhere == []


@pytest.mark.parametrize("key, value, wanted", [
    ("spark.streaming.backpressure.enabled", "yes", "must be true or false, got 'yes'"),
    ("spark.streaming.blockInterval", "soon", "must be a duration such as 30s or 500ms, got 'soon'"),
    ("spark.streaming.blockInterval", "0ms", "must be a duration of at least 1 ms, got '0ms'"),
    ("spark.sparkwal.state.maxLineageBatches", "0", "must be a whole number of at least 1, got '0'"),
    ("spark.streaming.concurrentJobs", "1.5", "must be a whole number of at least 1, got '1.5'"),
    ("spark.sparkwal.ui.port", "70000", "must be a whole number from 0 to 65535, got '70000'"),
    ("spark.sparkwal.backlog.warnIntervals", "nan", "must be a number of at least 0, got 'nan'"),
    ("spark.sparkwal.batchLog.enabled", "sometimes", "must be auto, true or false, got 'sometimes'"),
])
def test_a_bad_value_is_one_error_naming_the_key_and_the_value(key, value, wanted):
    with pytest.raises(ConfigError) as caught:
        StreamingConf({key: value})
    assert str(caught.value) == f"{key} {wanted}" and isinstance(caught.value, ValueError)


def test_one_unit_per_key_as_spark_reads_it():
    """A bare number is in Spark's unit for Spark's keys (getTimeAsMs or getTimeAsSeconds)."""
    read = StreamingConf({"spark.streaming.blockInterval": "200", "spark.streaming.gracefulStopTimeout": "5000",
                          "spark.streaming.minRememberDuration": "90", "spark.sparkwal.storage.deadline": "7",
                          "spark.streaming.driver.leaseTimeout": "2min", "spark.sparkwal.backlog.warnIntervals": "2.5"})
    assert read[ENTRIES["spark.streaming.blockInterval"]] == 200
    assert read[ENTRIES["spark.streaming.gracefulStopTimeout"]] == 5000
    assert read[ENTRIES["spark.streaming.fileStream.minRememberDuration"]] == 90_000  # its fallback's
    assert read[ENTRIES["spark.sparkwal.storage.deadline"]] == 7000
    assert read[ENTRIES["spark.streaming.driver.leaseTimeout"]] == 120_000
    assert read[ENTRIES["spark.sparkwal.backlog.warnIntervals"]] == 2.5
    remember = ENTRIES["spark.streaming.minRememberDuration"]
    assert StreamingConf({remember.key: "1d"})[remember] == 86_400_000  # Spark's suffixes: us, ms, s, m, min, h, d
    defaults = StreamingConf({})
    assert defaults[ENTRIES["spark.streaming.fileStream.minRememberDuration"]] == 60_000
    assert defaults[ENTRIES["spark.streaming.receiver.writeAheadLog.enable"]] is True


def test_a_driver_reads_its_settings_once_when_it_is_made(spark_context, live_settings):
    live_settings({"spark.streaming.gracefulStopTimeout": "4s"})
    ssc = StreamingContext(spark_context, 1)
    live_settings({"spark.streaming.gracefulStopTimeout": "9s"})  # after: not this driver's
    assert ssc.graceful_stop_timeout_s() == 4.0
    live_settings({"spark.streaming.blockInterval": "fast"})
    with pytest.raises(ConfigError, match=r"^spark.streaming.blockInterval must be a duration such as 30s "
                                          r"or 500ms, got 'fast'$"):
        StreamingContext(spark_context, 1)
