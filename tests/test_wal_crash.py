"""kill -9 of a writer never loses an acknowledged record; single-writer fencing across processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from sparkwal.wal import FileBasedWriteAheadLog, LogLockedError

HERE = os.path.dirname(__file__)


def start_writer(log_dir, tag, threads, *extra):
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "wal_writer_proc.py"), str(log_dir), tag, str(threads),
         *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("threads,mode", [(1, "fsync"), (4, "fsync"), (1, "flush")],
                         ids=["single", "batched-4-threads", "single-flush-mapped"])
def test_sigkill_loses_no_acknowledged_record(tmp_path, threads, mode):
    """("flush" copies records into a memory-mapped segment: they survive the process, and the
    reserved zeros after them are a torn tail that the next writer cuts off.)"""
    rng = random.Random(threads)
    acked: dict[str, list[str]] = {}
    for round_no in range(6):
        tag = f"r{round_no}"
        proc = start_writer(tmp_path, tag, threads, *(["flush"] if mode == "flush" else []))
        kill_after = rng.randrange(20, 400)
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if len(lines) >= kill_after:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acked[tag] = lines
        # every restart (the next round) recovers the log; check it after each kill too
        with FileBasedWriteAheadLog(str(tmp_path)) as log:
            present = [r.decode()[: len(r) // 20] for r in log.read_all()]
        present_set = set(present)
        for recs in acked.values():
            missing = [r for r in recs if r not in present_set]
            assert not missing, f"acknowledged records lost after kill: {missing[:5]}"
        # per writer thread, records are in order and form a gap-free prefix
        by_thread: dict[str, list[int]] = {}
        for r in present:
            rt, th, i = r.split(":")
            by_thread.setdefault(f"{rt}:{th}", []).append(int(i))
        for key, seq in by_thread.items():
            assert seq == list(range(len(seq))), key


def test_second_writer_is_refused_and_a_new_one_succeeds_after_the_holder_dies(tmp_path):
    holder = start_writer(tmp_path, "h", 1, "hold")
    assert holder.stdout.readline().strip() == "ready"
    log = FileBasedWriteAheadLog(str(tmp_path))
    assert list(log.read_all()) == [b"holder"]  # readers need no lock
    with pytest.raises(LogLockedError, match=f"pid {holder.pid}"):
        log.write(b"intruder", 2)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    log.write(b"successor", 3)
    log.close()
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == [b"holder", b"successor"]


def test_second_writer_in_the_same_process_is_refused(tmp_path):
    first = FileBasedWriteAheadLog(str(tmp_path))
    first.write(b"a", 1)
    second = FileBasedWriteAheadLog(str(tmp_path))
    with pytest.raises(LogLockedError):
        second.write(b"b", 2)
    first.close()
    second.write(b"b", 2)
    second.close()
