"""Port of Spark's HDFSMetadataLogSuite plus races and listing rules, on every backend."""

from __future__ import annotations

import os
import threading

import pytest

from concurrency import run_concurrently

from sparkwal.checkpoint import (BatchRangeError, MalformedLogError, MetadataLog, UnsupportedLogVersionError,
                        parse_version, verify_batch_ids)
from sparkwal.wal.storage import resolve


def make(storage_url, name="log"):
    base, options = storage_url
    return MetadataLog(f"{base}/{name}", storage_options=options)


def test_basic(storage_url):
    log = make(storage_url)
    assert log.add(0, "batch0")
    assert log.get(0) == "batch0"
    assert log.get_latest() == (0, "batch0")
    assert log.add(1, "batch1")
    assert log.get(1) == "batch1"
    assert log.get_latest() == (1, "batch1")
    assert log.get_range(None, 1) == [(0, "batch0"), (1, "batch1")]
    # a duplicate add leaves the first value untouched
    assert not log.add(1, "batch1-again")
    assert log.get(1) == "batch1"
    assert log.get(7) is None


def test_purge(storage_url):
    log = make(storage_url)
    for i in range(3):
        log.add(i, f"batch{i}")
    assert log.purge(2) == [0, 1]
    assert log.get(0) is None and log.get(1) is None
    assert log.get(2) == "batch2"
    assert log.batch_ids() == [2]
    base, options = storage_url
    storage, path = resolve(f"{base}/log", options)
    assert [f.name for f in storage.list_files(path)] == ["2"]  # no stray files (SPARK-17475)


def test_purge_after(storage_url):
    log = make(storage_url)
    for i in range(5):
        log.add(i, i)
    assert log.purge_after(2) == [3, 4]
    assert log.batch_ids() == [0, 1, 2]


def test_restart(storage_url):
    log = make(storage_url)
    log.add(0, "batch0")
    log.add(1, "batch1")
    again = make(storage_url)
    assert again.get_latest() == (1, "batch1")
    assert again.get_range(0, 1) == [(0, "batch0"), (1, "batch1")]


@pytest.mark.parametrize("text", ["", "xyz", "v10.x", "10", "v0", "v-10", "v", " 1"])
def test_parse_version_malformed(text):
    with pytest.raises(MalformedLogError, match="failed to read correct log version"):
        parse_version(text, 100, "/f")


def test_parse_version_too_new():
    assert parse_version("v7", 7, "/f") == 7
    with pytest.raises(UnsupportedLogVersionError,
                       match="maximum supported log version is v2, but encountered v9"):
        parse_version("v9", 2, "/some/file")


def test_reading_a_newer_or_malformed_file_names_it(tmp_path):
    log = MetadataLog(str(tmp_path))
    (tmp_path / "0").write_text('v99999\n"x"')
    (tmp_path / "1").write_text("")
    (tmp_path / "2").write_bytes(b"v1\n\xff\xfe")
    with pytest.raises(UnsupportedLogVersionError, match=f"{tmp_path}/0"):
        log.get(0)
    with pytest.raises(MalformedLogError, match=f"{tmp_path}/1"):
        log.get(1)
    with pytest.raises(MalformedLogError, match=f"{tmp_path}/2"):
        log.get(2)


def test_concurrent_writers_exactly_one_winner_per_id(storage_url):
    """(metadata directory collision) 5 writers race to add 0..10: exactly one wins each id."""
    wins: dict[int, list[str]] = {i: [] for i in range(11)}
    lock = threading.Lock()
    barrier = threading.Barrier(5)

    def writer(name):
        log = make(storage_url)
        barrier.wait()
        for i in range(11):
            if log.add(i, f"{name}-{i}"):
                with lock:
                    wins[i].append(name)

    run_concurrently(writer, [(f"w{n}",) for n in range(5)])
    assert all(len(w) == 1 for w in wins.values()), wins
    log = make(storage_url)
    assert log.batch_ids() == list(range(11))
    assert [v for _, v in log.get_range(0, 10)] == [f"{wins[i][0]}-{i}" for i in range(11)]


def test_concurrent_processes_exactly_one_winner_per_id(tmp_path):
    """The same race between processes on a local filesystem (os.link decides the winner)."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, %r)\n"
            "from checkpoint import MetadataLog\n"
            "log = MetadataLog(sys.argv[1]); name = sys.argv[2]\n"
            "print(' '.join(str(i) for i in range(200) if log.add(i, name)))\n") % os.getcwd()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), f"p{n}"],
                              stdout=subprocess.PIPE, text=True) for n in range(5)]
    won = [set(map(int, p.communicate()[0].split())) for p in procs]
    assert sum(len(w) for w in won) == 200
    assert set().union(*won) == set(range(200))
    log = MetadataLog(str(tmp_path))
    for i in range(200):
        (winner,) = [n for n, w in enumerate(won) if i in w]
        assert log.get(i) == f"p{winner}"
    assert not [f for f in os.listdir(tmp_path) if not f.isdigit()]  # no temp files left


def test_listing_accepts_only_regular_files_named_by_a_batch_id(tmp_path):
    log = MetadataLog(str(tmp_path))
    log.add(0, "a")
    (tmp_path / "99").mkdir()  # SPARK-46339: a directory with a numeric name
    (tmp_path / ".0.abc.tmp").write_text("v1\n1")
    (tmp_path / "007").write_text('v1\n"padded"')
    (tmp_path / "-1").write_text('v1\n"neg"')
    (tmp_path / "3.compact").write_text('v1\n"c"')
    assert log.batch_ids() == [0]
    assert log.get_latest() == (0, "a")


def test_verify_batch_ids():
    verify_batch_ids([1, 2, 3, 4], 1, 4)
    verify_batch_ids([1, 2, 3, 4], None, 4)
    verify_batch_ids([1, 2, 3, 4], 1, None)
    verify_batch_ids([1], 1, 1)
    verify_batch_ids([], None, None)
    with pytest.raises(BatchRangeError, match="batch 1 doesn't exist"):
        verify_batch_ids([], 1, None)
    with pytest.raises(BatchRangeError, match="batch 4 doesn't exist"):
        verify_batch_ids([], None, 4)
    with pytest.raises(BatchRangeError, match="batch 1 doesn't exist"):
        verify_batch_ids([2, 3, 4], 1, 4)
    with pytest.raises(BatchRangeError, match="batch 5 doesn't exist"):
        verify_batch_ids([1, 2, 3, 4], 1, 5)
    with pytest.raises(BatchRangeError, match=r"batches \[3\] are missing"):
        verify_batch_ids([1, 2, 4, 5], 1, 5)
    with pytest.raises(BatchRangeError, match="after end"):
        verify_batch_ids([1], 4, 2)


def test_get_range_names_the_hole(tmp_path):
    log = MetadataLog(str(tmp_path))
    for i in (0, 1, 3):
        log.add(i, i)
    with pytest.raises(BatchRangeError, match=rf"batches \[2\] are missing in {tmp_path}"):
        log.get_range(0, 3)


def test_bad_batch_ids_are_refused(tmp_path):
    log = MetadataLog(str(tmp_path))
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError):
            log.add(bad, "x")


def test_no_partial_file_is_ever_visible(tmp_path):
    """A reader polling while a large value is being added sees nothing or all of it."""
    log = MetadataLog(str(tmp_path))
    big = "x" * 5_000_000
    seen = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            v = log.get(0)
            if v is not None:
                seen.append(len(v))

    t = threading.Thread(target=reader)
    t.start()
    log.add(0, big)
    stop.set()
    t.join()
    assert all(n == len(big) for n in seen)
