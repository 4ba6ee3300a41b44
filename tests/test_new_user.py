"""What a new user trips on (issue 68), where no other test's subject is the place: a restart that
would read input files no longer there (a checkpoint copied without them) says which, where, and
where they were read from, before a batch fails in the JVM; a file stream on a missing directory
says so; the command's --version, its options never abbreviated, plain --help, and a refused main
job that leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkwal.engine import MissingInputError, StreamingContext


def test_a_restart_missing_a_file_streams_files_names_them_and_where_they_were_read(spark_context, tmp_path):
    inbox = tmp_path / "copy" / "in"
    inbox.mkdir(parents=True)
    ssc = StreamingContext(spark_context, 1.0)
    files = ssc.textFileStream(str(inbox))
    taken = [str(inbox / f"f{i}.txt") for i in range(5)]
    (inbox / "f0.txt").write_text("here\n")
    files.restore({"batch_files": {"1000": taken[:1], "2000": taken[1:]}, "read_from": "/data/app/in"})
    with pytest.raises(MissingInputError) as missing:  # the re-run batches' files, at start
        files.check_inputs_present([1000, 2000], "/data/copy/checkpoint")
    said = str(missing.value)
    assert said.startswith("the restart from /data/copy/checkpoint re-reads 4 file(s) of stream 0 that are not in "
                           f"{inbox}: f1.txt, f2.txt, f3.txt, ...")
    assert "(the checkpoint's program read them from /data/app/in)" in said and "copy them along" in said
    files.check_inputs_present([1000], None)  # its file is there
    with pytest.raises(MissingInputError, match=r"in batch \d{4}-\d\d-\d\d \d\d:\d\d:\d\d that are not in .*: f1.txt"):
        files.compute(2000)  # a batch computed again for a state's lineage checks its own
    assert files.compute(1000).collect() == ["here"]


def test_a_file_stream_on_a_directory_that_does_not_exist_says_so_once_a_minute(spark_context, tmp_path, caplog):
    from sparkwal.wal import ManualClock

    clock = ManualClock(0)
    ssc = StreamingContext(spark_context, 1.0, clock=clock)
    files = ssc.textFileStream(str(tmp_path / "typo"))
    with caplog.at_level("WARNING", logger="sparkwal.engine.inputs"):
        for t in (1000, 2000, 30_000, 61_000, 62_000):
            clock.set_ms(t)
            assert files.compute(t).isEmpty()
        (tmp_path / "typo").mkdir()
        clock.set_ms(200_000)
        files.compute(200_000)  # there now: nothing more said
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"file stream 0: the directory {tmp_path / 'typo'} does not exist: its batches are empty until "
                    "it appears"] * 2  # at 1 s, and a minute later


def _run(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))


def test_the_command_names_the_pyspark_it_runs_on_and_takes_no_abbreviation():
    from importlib.metadata import version

    said = _run("sparkwal", "--version")
    assert said.returncode == 0 and f" on PySpark {version('pyspark')}, Python " in said.stdout, said
    for wrong in (["sparkwal", "--versio"], ["sparkwal.engine.wordcount", "--di", "x"]):
        refused = _run(*wrong)
        assert refused.returncode == 2 and refused.stdout == "", refused
        assert "--versio" not in wrong or "unrecognized option --versio (did you mean --version?)" in refused.stderr
    assert "unrecognized arguments: --di x" in refused.stderr


def test_the_main_jobs_help_is_plain_text():
    text = _run("sparkwal.engine.wordcount", "--help").stdout
    assert "WORKDIR/input: the input." in text and "sparkwal.engine.receiver.acked_lines.AckedLineReceiver" in text
    assert "``" not in text and ":class:" not in text and ":mod:" not in text


def test_a_refused_main_job_leaves_no_work_directory_behind(tmp_path):
    from test_program_identity import PORTED, foreign_checkpoint

    foreign_checkpoint(tmp_path / "theirs", "ported", PORTED)
    refused = _run("sparkwal.engine.wordcount", "--dir", str(tmp_path / "new"),
                   "--checkpoint", str(tmp_path / "theirs"))
    assert refused.returncode == 2 and "holds the checkpoint of another program" in refused.stderr, refused
    assert not (tmp_path / "new").exists()


def test_an_error_of_python_shutting_down_is_not_a_batch_error(spark_context, caplog):
    """An app ended by an error exits without stop(): a batch generated meanwhile fails on Python's
    pools shutting down, which is not the app's error (an 'error in batch' line after its one line)."""
    ssc = StreamingContext(spark_context, 1.0)
    with caplog.at_level("ERROR", logger="sparkwal.engine.driver"):
        ssc.driver.report_error(RuntimeError("cannot schedule new futures after interpreter shutdown"), 2000)
    assert ssc.driver.error is None and not ssc.driver.terminated.is_set() and caplog.records == []
    ssc.driver.report_error(ZeroDivisionError("division by zero"), 3000)  # the app's own: as before
    assert isinstance(ssc.driver.error, ZeroDivisionError) and ssc.driver.terminated.is_set()
