"""What a new user trips on (issue 68), where no other test's subject is the place: a restart that
would read input files no longer there (a checkpoint copied without them) says which, where, and
where they were read from, before a batch fails in the JVM."""

from __future__ import annotations

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
