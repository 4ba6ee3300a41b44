"""Every verdict of the ``sparkwal`` command is true: no OK about a directory that holds no
checkpoint or log, no repair that creates something there, a receiver WAL cut short is lost data
when a batch still needs what was cut (and harmless only when nothing does), the event logs are
verified, space reserved ahead of a killed writer's records is neither damage nor kept, and a bad
number is a usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkwal.base.times import batch_name
from sparkwal.tracker import ReceivedBlockInfo, ReceivedBlockTracker
from sparkwal.wal import FileBasedWriteAheadLog, RecordHandle
from sparkwal.wal.append_files import MappedAppendFile

ROOT = Path(__file__).resolve().parent.parent


def sparkwal(*args, expect: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sparkwal", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == expect, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc


@pytest.fixture
def not_ours(tmp_path):
    """An empty directory, and one of unrelated files (an app's input directory)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "words.txt").write_text("a b c\n")
    return [tmp_path / "empty", tmp_path / "input"]


@pytest.mark.parametrize("area, verb", [("checkpoint", "inspect"), ("checkpoint", "verify"),
                                        ("checkpoint", "repair"), ("wal", "inspect"), ("wal", "verify"),
                                        ("wal", "repair")])
def test_a_directory_that_is_not_a_checkpoint_or_a_log_is_said_so(not_ours, area, verb):
    what = "a checkpoint" if area == "checkpoint" else "a write-ahead log"
    for directory in not_ours:
        before = sorted(p.name for p in directory.iterdir())
        for extra in ([], ["--yes"]) if verb == "repair" else ([],):
            proc = sparkwal(area, verb, directory, *extra, expect=1)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"sparkwal: {directory} is not {what}: ")
            assert "OK" not in proc.stdout
        assert json.loads(sparkwal(area, verb, directory, "--json", expect=1).stdout)["ok"] is False
        assert sorted(p.name for p in directory.iterdir()) == before  # no .writer.lock, nothing


def test_a_bad_row_limit_is_a_usage_error(tmp_path):
    proc = sparkwal("checkpoint", "state", tmp_path, "--limit", "-1", expect=2)
    assert "argument --limit: must be a whole number of rows, 0 or more, got '-1'" in proc.stderr


def receiver_checkpoint(tmp_path, records: int = 10):
    """A checkpoint whose block tracker names ``records`` blocks in a receiver's WAL (as a
    receiver stores them: handles relative to the checkpoint), the first five allocated to batch
    1000, the rest not yet allocated."""
    ckpt = tmp_path / "ckpt"
    wal_dir = ckpt / "receivedData" / "0-e1"
    handles = []
    with FileBasedWriteAheadLog(str(wal_dir)) as log:
        for i in range(records):
            path, offset, length = log.write(b"block %d " % i * 20, 100 + i)
            handles.append(RecordHandle(f"receivedData/0-e1/{Path(path).name}", offset, length))
    tracker = ReceivedBlockTracker([0], wal_dir=str(ckpt / "receivedBlockMetadata"))
    for i, h in enumerate(handles):
        assert tracker.add_block(ReceivedBlockInfo(0, 1, f"input-0-{100 + i}-0", h))
        if i == 4:
            tracker.allocate_blocks_to_batch(1000)
    tracker.stop()
    (segment,) = wal_dir.glob("log-*")
    return ckpt, wal_dir, segment, handles


def test_a_receiver_wal_cut_short_is_lost_data_when_a_batch_needs_the_cut(tmp_path):
    ckpt, wal_dir, segment, handles = receiver_checkpoint(tmp_path)
    sparkwal("wal", "verify", wal_dir, expect=0)
    os.truncate(segment, handles[1].offset + 5)  # 10 records to 1, the cut inside the second
    out = sparkwal("wal", "verify", wal_dir, expect=1).stdout
    assert "torn tail" in out and "never acknowledged" not in out
    lost = [line for line in out.splitlines() if line.startswith("LOST: ")]
    assert len(lost) == 9 and f"block input-0-101-0 of stream 0, which {batch_name(1000)} reads, is lost" in lost[0]
    assert "which the next batch reads" in lost[-1]
    assert out.splitlines()[-1].startswith("FAILED: ") and "9 blocks its checkpoint needs lost" in out
    report = json.loads(sparkwal("checkpoint", "verify", ckpt, "--json", expect=1).stdout)
    assert sum("is lost" in p for p in report["problems"]) == 9


def test_a_torn_tail_no_batch_needs_passes(tmp_path):
    """A record written after the tracker's last event (its block never reported) was never
    acknowledged: cutting it loses nothing a batch reads."""
    ckpt, wal_dir, _segment, _handles = receiver_checkpoint(tmp_path)
    with FileBasedWriteAheadLog(str(wal_dir)) as log:
        log.write(b"a block never reported", 5000)
    newest = max(wal_dir.glob("log-*"), key=lambda p: int(p.name.split("-")[1]))
    os.truncate(newest, newest.stat().st_size - 3)
    out = sparkwal("wal", "verify", wal_dir, expect=0).stdout
    assert "torn tail" in out and "LOST" not in out and out.splitlines()[-1].startswith("OK: ")


def test_checkpoint_verify_reads_the_event_logs(tmp_path):
    from sparkwal.checkpoint.event_log import EventLogWriter

    events = tmp_path / "ckpt" / "events"
    writer = EventLogWriter(str(events), {"startTime": 1000, "epoch": 1, "appId": "app", "batchDuration": 500})
    for t in range(10):
        writer.append({"event": "batch", "time": 1000 + t, "batchTime": 1000 + 500 * t})
    writer.close()
    sparkwal("checkpoint", "verify", tmp_path / "ckpt", expect=0)
    (segment,) = (events / "run-0000000001000-e1" / "log").glob("log-*")
    data = bytearray(segment.read_bytes())
    data[30] ^= 0xFF
    segment.write_bytes(bytes(data))
    out = sparkwal("checkpoint", "verify", tmp_path / "ckpt", expect=1).stdout
    assert f"PROBLEM: {segment} at byte offset" in out


def test_space_reserved_by_a_killed_writer_is_not_damage_and_the_next_run_cuts_it(tmp_path):
    """A mapped writer (Durability.FLUSH) reserves space ahead; killed, it leaves zeros after its
    records: reported as reserved space, and cut when the log is next opened."""
    log_dir = tmp_path / "log"
    code = (f"import os; from wal import FileBasedWriteAheadLog\n"
            f"log = FileBasedWriteAheadLog({str(log_dir)!r}, durability='flush')\n"
            f"[log.write(b'event %d' % i, 100 + i) for i in range(20)]\n"
            f"os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    (segment,) = log_dir.glob("log-*")
    reserved = segment.stat().st_size
    assert MappedAppendFile.FIRST_STEP <= reserved < MappedAppendFile.STEP  # a small log reserves little
    out = sparkwal("wal", "verify", log_dir, expect=0).stdout
    assert "bytes of space reserved ahead" in out and "torn tail" not in out and "20 records" in out
    from sparkwal.wal.inspect import trim_preallocated

    assert trim_preallocated(str(log_dir)) > 0
    assert segment.stat().st_size < 1000 and len(list(FileBasedWriteAheadLog(str(log_dir)).read_all())) == 20
