"""What a new user does first: files moved in around ``start()`` on the real clock, and the
entry points' argument rules (``getOrCreate``/``getActiveOrCreate`` with no checkpoint)."""

from __future__ import annotations

import os
import threading

import pytest

from sparkwal.engine import StreamingContext

LINES = 100


class LineCounter:
    """An output function counting lines and batches, with a wait on the batch count."""

    def __init__(self):
        self.lines: list = []
        self.batches = 0
        self._cond = threading.Condition()

    def __call__(self, rdd) -> None:
        got = rdd.collect()
        with self._cond:
            self.lines.extend(got)
            self.batches += 1
            self._cond.notify_all()

    def wait_batches(self, n: int, timeout: float = 60) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.batches >= n, timeout), f"{n} batches not run"


def move_in(directory, name: str, lines: list[str]) -> None:
    """A file appearing atomically (written under a temp name, then renamed), stamped by the
    filesystem's own clock."""
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(f"{line}\n" for line in lines))
    os.replace(tmp, directory / name)


def run_once(sc, directory, before_start: list[str], after_start: list[str]) -> list:
    """A fresh context on the real clock: ``before_start`` files move in between creating the
    stream and ``start()``, ``after_start`` files at once after ``start()`` returns; returns
    everything the stream saw within three batches after that."""
    ssc = StreamingContext(sc, 0.1)
    counter = LineCounter()
    ssc.textFileStream(str(directory)).foreachRDD(counter)
    for name in before_start:
        move_in(directory, name, [f"{name}-{i:03d}" for i in range(LINES)])
    ssc.start()
    try:
        for name in after_start:
            move_in(directory, name, [f"{name}-{i:03d}" for i in range(LINES)])
        counter.wait_batches(4)  # the batch in flight at the write, then three more
    finally:
        ssc.stop(stopSparkContext=False)
    return counter.lines


@pytest.mark.slow
def test_files_moved_in_right_after_start_are_read_exactly_once(spark_context, tmp_path):
    for trial in range(12):  # fresh contexts: the race was lost in 8 of 8 trials before the fix
        directory = tmp_path / f"in{trial}"
        directory.mkdir()
        seen = run_once(spark_context, directory, [], ["a.txt"])
        assert sorted(seen) == [f"a.txt-{i:03d}" for i in range(LINES)], f"trial {trial}"


def test_a_file_moved_in_between_creating_the_stream_and_start_is_read_once(spark_context, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    move_in(directory, "old.txt", ["old"])  # there before the stream exists: ignored
    seen = run_once(spark_context, directory, ["early.txt"], ["late.txt"])
    assert sorted(seen) == sorted([f"early.txt-{i:03d}" for i in range(LINES)]
                                  + [f"late.txt-{i:03d}" for i in range(LINES)])


def test_binary_records_stream_reads_a_file_moved_in_right_after_start(spark_context, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    ssc = StreamingContext(spark_context, 0.1)
    counter = LineCounter()
    ssc.binaryRecordsStream(str(directory), 4).foreachRDD(counter)
    ssc.start()
    try:
        tmp = directory / ".r.tmp"
        tmp.write_bytes(b"abcdefgh")
        os.replace(tmp, directory / "r.bin")
        counter.wait_batches(4)
    finally:
        ssc.stop(stopSparkContext=False)
    assert sorted(counter.lines) == [b"abcd", b"efgh"]


def test_old_files_stay_ignored_even_inside_the_timestamp_slack(spark_context, tmp_path):
    """Files already there when the stream is created are skipped by path and modification time,
    however close to the creation time they were stamped."""
    directory = tmp_path / "in"
    directory.mkdir()
    move_in(directory, "just-before.txt", ["old"])
    ssc = StreamingContext(spark_context, 0.1)
    counter = LineCounter()
    ssc.textFileStream(str(directory)).foreachRDD(counter)
    ssc.start()
    try:
        counter.wait_batches(2)
        move_in(directory, "fresh.txt", ["new"])
        counter.wait_batches(counter.batches + 3)
    finally:
        ssc.stop(stopSparkContext=False)
    assert counter.lines == ["new"]


def test_get_or_create_with_no_checkpoint_path_just_calls_setup(spark_context):
    made = []

    def setup():
        ssc = StreamingContext(spark_context, 0.5)
        made.append(ssc)
        return ssc

    ssc = StreamingContext.getOrCreate(None, setup)
    assert made == [ssc] and ssc.driver.checkpoint_dir is None  # nothing read, nothing set
    assert StreamingContext.getActiveOrCreate(None, setup) is made[-1] and len(made) == 2
    ssc.queueStream([], default=[1]).foreachRDD(lambda rdd: None)
    ssc.start()
    try:
        assert StreamingContext.getActiveOrCreate(None, setup) is ssc  # the active one, no new
        assert len(made) == 2
    finally:
        ssc.stop(stopSparkContext=False)


@pytest.mark.parametrize("bad", [42, b"/tmp/ckpt", "", ["ckpt"]])
def test_a_bad_checkpoint_path_fails_at_the_api_naming_the_parameter(spark_context, bad):
    called = []
    for entry in (StreamingContext.getOrCreate, StreamingContext.getActiveOrCreate):
        with pytest.raises(TypeError, match="checkpointPath must be"):
            entry(bad, lambda: called.append(1))
    ssc = StreamingContext(spark_context, 0.5)
    with pytest.raises(TypeError, match="directory must be"):
        ssc.checkpoint(bad)
    assert called == []


def test_setup_func_is_required(spark_context, tmp_path):
    for entry in (StreamingContext.getOrCreate, StreamingContext.getActiveOrCreate):
        with pytest.raises(ValueError, match="setupFunc cannot be None"):
            entry(str(tmp_path), None)


def test_a_path_like_checkpoint_path_is_accepted(spark_context, tmp_path):
    ssc = StreamingContext.getOrCreate(tmp_path / "ckpt", lambda: StreamingContext(spark_context, 0.5))
    assert ssc.driver.checkpoint_dir == str(tmp_path / "ckpt")


def test_a_file_stream_reads_the_lines_sparks_text_file_reads(spark_context, tmp_path):
    """Small files are read by Python tasks, compressed ones by Hadoop's reader: the same lines
    as ``textFile`` either way (ends of line \\n, \\r, \\r\\n, a byte order mark, bytes that are
    not UTF-8, a last line without an end, a \\r\\n across the reader's buffer)."""
    import gzip

    directory = tmp_path / "in"
    directory.mkdir()
    blobs = {
        "ends.txt": b"a\nb\r\nc\rd\n\n\re\r\n\r\nlast",
        "bom.txt": b"\xef\xbb\xbfbom first\nx\xef\xbb\xbfy\n",
        "bad.txt": b"ok\nbad \xff\xfe here\ncut \xe2\x82\n\xc3",
        "long.txt": b"x" * 8191 + b"\r\n" + b"y" * 9000 + b"\r" + b"z\n",
        "empty.txt": b"",
    }
    staged = tmp_path / "staged"
    staged.mkdir()
    for name, blob in blobs.items():
        (staged / name).write_bytes(blob)
    (staged / "zipped.txt.gz").write_bytes(gzip.compress(b"g1\r\ng2\n"))
    expected = sorted(spark_context.textFile(",".join(str(staged / n) for n in sorted(os.listdir(staged)))).collect())

    ssc = StreamingContext(spark_context, 0.1)
    counter = LineCounter()
    readers: set[str] = set()

    def output(rdd):
        lineage = rdd.toDebugString().decode()
        readers.update(r for r in ("ParallelCollectionRDD", "HadoopRDD") if r in lineage)
        counter(rdd)

    ssc.textFileStream("file://" + str(directory)).foreachRDD(output)
    ssc.start()
    try:
        for name in sorted(os.listdir(staged)):
            os.replace(staged / name, directory / name)
        counter.wait_batches(4)
    finally:
        ssc.stop(stopSparkContext=False)
    assert sorted(counter.lines) == expected
    assert "g1" in expected and "last" in expected and "bom first" in expected
    assert readers == {"ParallelCollectionRDD", "HadoopRDD"}  # both readers were used
