"""DStream checkpoint files: CheckpointSuite's file behaviours
(streaming/src/test/scala/org/apache/spark/streaming/CheckpointSuite.scala), fallbacks, failures."""

from __future__ import annotations

import os

import pytest

from sparkwal.checkpoint import Checkpoint, CheckpointError, CheckpointWriter, read_checkpoint


def names(d):
    return sorted(n for n in os.listdir(d) if n.startswith("checkpoint-"))


def test_round_trip_keeps_data_not_code(tmp_path):
    cp = Checkpoint(5000, [4000, 4500], {"batch_duration_ms": 500, "graph": "abc123",
                                         "files": {"4500": ["/in/a", "/in/b"]}, "blob": b"\x00\x01"})
    w = CheckpointWriter(str(tmp_path))
    w.write(cp)
    w.stop()
    assert read_checkpoint(str(tmp_path)) == cp
    assert names(tmp_path) == ["checkpoint-5000"]


def test_no_checkpoint_gives_none(tmp_path):
    assert read_checkpoint(str(tmp_path / "nothing-here")) is None
    assert read_checkpoint(str(tmp_path)) is None


def test_spark_11267_late_older_checkpoint_lands_under_the_newest_name(tmp_path):
    """Writing time 2000 then time 1000: the newest name (2000) holds the 1000 write, and its
    .bk the 2000 write, so recovery never goes back to an older name."""
    w = CheckpointWriter(str(tmp_path))
    w.write(Checkpoint(2000, [], {"v": "first"}))
    w.write(Checkpoint(1000, [], {"v": "second"}))
    w.stop()
    assert names(tmp_path) == ["checkpoint-2000", "checkpoint-2000.bk"]
    assert Checkpoint.decode((tmp_path / "checkpoint-2000").read_bytes()).data == {"v": "second"}
    assert Checkpoint.decode((tmp_path / "checkpoint-2000.bk").read_bytes()).data == {"v": "first"}
    assert read_checkpoint(str(tmp_path)).data == {"v": "second"}


def test_a_restarted_writer_writes_under_the_newest_name_an_earlier_run_left(tmp_path):
    """A run that fell behind leaves checkpoints named after batches generated ahead of the
    ones it completed; the next run re-runs those older batches. Its checkpoints go under that
    newest name too (the earlier run's kept as the .bk): under their own, older names, the earlier
    run's file would stay the newest, and a restart would read it after this run deleted what it
    references (the 100-fault drill's job could not restart: a state snapshot it named was gone)."""
    first = CheckpointWriter(str(tmp_path))
    first.write(Checkpoint(9000, [], {"v": "earlier run, generated ahead"}))
    first.stop()
    second = CheckpointWriter(str(tmp_path))
    second.write(Checkpoint(3000, [], {"v": "re-run"}))
    second.stop()
    assert names(tmp_path) == ["checkpoint-9000", "checkpoint-9000.bk"]
    assert read_checkpoint(str(tmp_path)).data == {"v": "re-run"}
    assert second.statistics().latest_time_ms == 9000


def test_each_batch_checkpointed_twice_leaves_main_and_bk(tmp_path):
    """(JobGenerator) generation and completion checkpoints of the latest batch: exactly 2 files."""
    w = CheckpointWriter(str(tmp_path))
    for t in (500, 1000, 1500):
        w.write(Checkpoint(t, [t], {"stage": "generated"}))
        w.write(Checkpoint(t, [], {"stage": "completed"}))
    w.stop()
    latest = [n for n in names(tmp_path) if n.startswith("checkpoint-1500")]
    assert latest == ["checkpoint-1500", "checkpoint-1500.bk"]
    assert read_checkpoint(str(tmp_path)) == Checkpoint(1500, [], {"stage": "completed"})


def test_keeps_at_most_keep_files(tmp_path):
    w = CheckpointWriter(str(tmp_path), keep=4)
    for t in range(1, 11):
        w.write(Checkpoint(t * 1000, [], {}))
    w.stop()
    assert names(tmp_path) == ["checkpoint-10000", "checkpoint-7000", "checkpoint-8000",
                               "checkpoint-9000"]


def test_spark_28912_listing_ignores_directories_and_other_names(tmp_path):
    parent = tmp_path / "checkpoint-01"  # a parent directory that looks like a checkpoint
    w = CheckpointWriter(str(parent))
    w.write(Checkpoint(1000, [], {"ok": 1}))
    w.stop()
    (parent / "checkpoint-1000000000").mkdir()
    (parent / "checkpoint-9999.tmp").write_bytes(b"junk")
    (parent / "checkpoint-abc").write_bytes(b"junk")
    assert read_checkpoint(str(parent)).data == {"ok": 1}


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "magic"])
def test_damaged_newest_file_falls_back_to_bk_then_older(tmp_path, damage, caplog):
    w = CheckpointWriter(str(tmp_path))
    w.write(Checkpoint(1000, [], {"v": 1}))
    w.write(Checkpoint(2000, [], {"v": 2}))
    w.write(Checkpoint(2000, [], {"v": 3}))
    w.stop()
    newest = tmp_path / "checkpoint-2000"
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[:-3]
    elif damage == "flip":
        data[-1] ^= 0x40
    elif damage == "empty":
        data = bytearray()
    else:
        data[:4] = b"JAVA"
    newest.write_bytes(bytes(data))
    assert read_checkpoint(str(tmp_path)).data == {"v": 2}  # the .bk
    assert str(newest) in caplog.text  # the skipped file is logged with its reason
    (tmp_path / "checkpoint-2000.bk").write_bytes(b"")
    assert read_checkpoint(str(tmp_path)).data == {"v": 1}  # then older


def test_no_valid_checkpoint_names_every_file_tried(tmp_path):
    for n in ("checkpoint-1000", "checkpoint-2000", "checkpoint-2000.bk"):
        (tmp_path / n).write_bytes(b"garbage")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(str(tmp_path))
    for n in ("checkpoint-1000", "checkpoint-2000", "checkpoint-2000.bk"):
        assert str(tmp_path / n) in str(err.value)


def test_newer_format_version_is_refused_clearly(tmp_path):
    blob = bytearray(Checkpoint(1, [], {}).encode())
    blob[5] = 9  # version 9
    (tmp_path / "checkpoint-1").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="format version 9 is newer"):
        read_checkpoint(str(tmp_path))


def test_failed_write_is_retried_then_reported_never_dropped(faulty, memory_url):
    url = memory_url.replace("memory://", "faulty://")
    errors, written = [], []
    faulty.fail("pipe", times=2)  # two failed attempts, the third works
    w = CheckpointWriter(url, on_written=written.append, on_error=errors.append)
    w.write(Checkpoint(1000, [], {}))
    w.stop()
    assert written == [1000] and not errors and w.statistics().failed_attempts == 2

    faulty.fail("pipe", times=3)  # every attempt fails: reported, and raised by write and stop
    w = CheckpointWriter(url, on_written=written.append, on_error=errors.append, max_attempts=3)
    w.write(Checkpoint(2000, [], {}))
    with pytest.raises(CheckpointError, match="writing a checkpoint failed"):
        w.stop()
    assert len(errors) == 1 and written == [1000]
    with pytest.raises(CheckpointError):
        w.write(Checkpoint(3000, [], {}))
    assert read_checkpoint(url).checkpoint_time_ms == 1000


def test_full_queue_raises_instead_of_blocking_forever(faulty, memory_url):
    import threading

    gate = threading.Event()
    w = CheckpointWriter(memory_url, queue_size=1, put_timeout_s=0.2,
                         on_written=lambda t: gate.wait(10))
    w.write(Checkpoint(1, [], {}))  # taken by the writer thread, which then waits at the gate
    w.write(Checkpoint(2, [], {}))  # fills the queue
    with pytest.raises(CheckpointError, match="not queued within 0.2 s"):
        w.write(Checkpoint(3, [], {}))
    gate.set()
    w.stop()
    assert read_checkpoint(memory_url).checkpoint_time_ms == 2


def test_stop_drains_the_queue(tmp_path):
    w = CheckpointWriter(str(tmp_path), keep=100)
    for t in range(1, 51):
        w.write(Checkpoint(t, [], {"t": t}))
    w.stop()
    assert w.statistics().written == 50 and w.statistics().queued == 0
    assert read_checkpoint(str(tmp_path)).data == {"t": 50}
    with pytest.raises(CheckpointError, match="after stop"):
        w.write(Checkpoint(99, [], {}))


def test_argument_validation(tmp_path):
    with pytest.raises(ValueError):
        CheckpointWriter(str(tmp_path), keep=1)
    with pytest.raises(ValueError):
        CheckpointWriter(str(tmp_path), max_attempts=0)


def test_on_every_backend(storage_url):
    base, options = storage_url
    d = f"{base}/ckpt"
    w = CheckpointWriter(d, storage_options=options, keep=3)
    for t in (1000, 2000, 2000, 3000):
        w.write(Checkpoint(t, [t], {"t": t}))
    w.stop()
    assert read_checkpoint(d, storage_options=options) == Checkpoint(3000, [3000], {"t": 3000})
