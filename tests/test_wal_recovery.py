"""Torn tails are cut off; corruption anywhere else is loud and names the file and offset."""

from __future__ import annotations

import os
import random
import shutil
import struct

import pytest

from sparkwal.wal import CorruptRecordError, FileBasedWriteAheadLog, WalError
from sparkwal.wal.segment import FRAME_HEADER_LEN, HEADER_LEN, iter_segment, parse_segment_name

RECORDS = [bytes([i]) * (10 + 7 * i) for i in range(6)]


def segments(d):
    return sorted((n for n in os.listdir(d) if parse_segment_name(n)), key=parse_segment_name)


def write_one_segment(d):
    with FileBasedWriteAheadLog(str(d)) as log:
        handles = [log.write(r, 1000) for r in RECORDS]
    (name,) = segments(d)
    return d / name, handles


def test_torn_tail_at_every_byte_offset_of_the_last_record(tmp_path):
    src = tmp_path / "src"
    seg, handles = write_one_segment(src)
    pristine = seg.read_bytes()
    last = handles[-1]
    assert last.offset + FRAME_HEADER_LEN + last.length == len(pristine)
    for cut in range(last.offset, len(pristine)):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(src, d)
        (d / seg.name).write_bytes(pristine[:cut])
        reader = FileBasedWriteAheadLog(str(d))
        assert list(reader.read_all()) == RECORDS[:-1], cut  # a reader stops at the tear
        reader.close()
        with FileBasedWriteAheadLog(str(d)) as log:
            log.write(b"after", 5000)
            stats = log.statistics()
            assert stats.torn_tails_truncated == (1 if cut > last.offset else 0)
            assert stats.torn_bytes_truncated == cut - last.offset
        assert (d / seg.name).stat().st_size == last.offset  # truncated exactly at the tear
        with FileBasedWriteAheadLog(str(d)) as log:  # the old segment is now sealed: strict
            assert list(log.read_all()) == RECORDS[:-1] + [b"after"]
        shutil.rmtree(d)


@pytest.mark.parametrize("garbage", [b"\x00" * 4096, b"\xff" * 7, None])
def test_garbage_after_the_last_record_is_a_torn_tail(tmp_path, garbage):
    seg, _ = write_one_segment(tmp_path)
    tail = garbage if garbage is not None else random.Random(7).randbytes(3000)
    with open(seg, "ab") as f:
        f.write(tail)
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == RECORDS
        log.write(b"next", 9000)
        assert log.statistics().torn_bytes_truncated == len(tail)
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == RECORDS + [b"next"]


def sealed_then_newest(d):
    """Two segments: the first sealed (RECORDS), the second newest (one record)."""
    with FileBasedWriteAheadLog(str(d), rolling_interval_s=1) as log:
        handles = [log.write(r, 1000) for r in RECORDS]
        log.write(b"newest", 5000)
    return d / segments(d)[0], handles


def test_flipped_bit_anywhere_in_a_sealed_segment_is_loud(tmp_path):
    src = tmp_path / "src"
    seg, handles = sealed_then_newest(src)
    pristine = seg.read_bytes()
    starts = [h.offset for h in handles]
    for pos in range(len(pristine)):
        for bit in (0, 5):
            d = tmp_path / "case"
            shutil.copytree(src, d)
            data = bytearray(pristine)
            data[pos] ^= 1 << bit
            (d / seg.name).write_bytes(bytes(data))
            frame = max((i for i, s in enumerate(starts) if s <= pos), default=None)
            with FileBasedWriteAheadLog(str(d)) as log:
                it = log.read_all()
                good = RECORDS[:frame] if frame is not None else []
                assert [next(it) for _ in good] == good
                with pytest.raises((CorruptRecordError, WalError)) as err:
                    next(it)
                if isinstance(err.value, CorruptRecordError):
                    assert err.value.path == str(d / seg.name)
                    assert err.value.offset == (starts[frame] if frame is not None else 0)
                if frame is not None:  # random reads of that record fail too; others work
                    h = handles[frame]
                    bad = type(h)(str(d / seg.name), h.offset, h.length)
                    with pytest.raises(WalError):
                        log.read(bad)
                    other = handles[frame - 1] if frame else handles[frame + 1]
                    ok = type(h)(str(d / seg.name), other.offset, other.length)
                    assert log.read(ok) in RECORDS
            shutil.rmtree(d)


def test_corrupt_record_in_the_middle_of_the_newest_segment_is_loud(tmp_path):
    seg, handles = write_one_segment(tmp_path)
    data = bytearray(seg.read_bytes())
    data[handles[2].offset + FRAME_HEADER_LEN + 3] ^= 0x10
    seg.write_bytes(bytes(data))
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        it = log.read_all()
        assert [next(it), next(it)] == RECORDS[:2]
        with pytest.raises(CorruptRecordError, match=f"{seg}.*offset {handles[2].offset}"):
            next(it)
        # a writer refuses to "repair" real corruption rather than silently dropping records,
        # and says so at once instead of retrying
        with pytest.raises(CorruptRecordError, match=f"offset {handles[2].offset}"):
            log.write(b"x", 99999)
        assert log.statistics().write_failures == 0
    assert seg.read_bytes() == bytes(data)


def test_corrupt_length_field_in_the_newest_segment_is_not_mistaken_for_a_tear(tmp_path):
    seg, handles = write_one_segment(tmp_path)
    data = bytearray(seg.read_bytes())
    struct.pack_into(">I", data, handles[1].offset, 10**9)  # length now runs past EOF
    seg.write_bytes(bytes(data))
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        with pytest.raises(CorruptRecordError) as err:
            list(log.read_all())
    assert err.value.offset == handles[1].offset


@pytest.mark.parametrize("written", [b"SW", b""], ids=["part-of-the-header", "empty"])
def test_newest_segment_with_a_torn_header_is_removed(tmp_path, written):
    """A crash right after creating a segment: part of its header written, or none (an empty file,
    which was left behind, then failed every read once a later segment was written)."""
    seg, _ = write_one_segment(tmp_path)
    (tmp_path / "log-9000-69000").write_bytes(written)
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == RECORDS
        log.write(b"z", 10000)
    assert not (tmp_path / "log-9000-69000").exists()
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == RECORDS + [b"z"]


def test_newer_format_version_is_refused_with_the_file_named(tmp_path):
    seg, _ = write_one_segment(tmp_path)
    data = bytearray(seg.read_bytes())
    struct.pack_into(">H", data, 4, 7)
    seg.write_bytes(bytes(data))
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        with pytest.raises(WalError, match=f"{seg}: segment format version 7 is newer"):
            list(log.read_all())


def test_a_foreign_file_with_a_segment_name_is_corruption(tmp_path):
    with FileBasedWriteAheadLog(str(tmp_path), rolling_interval_s=1) as log:
        log.write(b"a", 1000)
        log.write(b"b", 5000)
    first = tmp_path / segments(tmp_path)[0]
    first.write_bytes(b"\x00\x00\x00\x05hello")  # Spark's unchecksummed framing
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        with pytest.raises(CorruptRecordError, match="bad magic"):
            list(log.read_all())


def test_listing_accepts_only_regular_files_matching_the_grammar(tmp_path):
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        log.write(b"a", 1000)
    (tmp_path / "log-5-6").mkdir()  # a directory with a segment name
    (tmp_path / "log-7-8.tmp").write_bytes(b"junk")
    (tmp_path / "xlog-9-10").write_bytes(b"junk")
    (tmp_path / "log-11-12-13").write_bytes(b"junk")
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == [b"a"]
        assert len(log.segment_paths()) == 1


def test_segment_names_stay_unique_when_times_repeat(tmp_path):
    """Spark re-opened log-T-E when two files started in the same millisecond; sparkwal moves
    the start forward by 1 ms, so names are unique and increasing across restarts too."""
    for _ in range(3):
        with FileBasedWriteAheadLog(str(tmp_path), close_file_after_write=True) as log:
            log.write(b"a", 1000)
            log.write(b"b", 1000)
    starts = [parse_segment_name(n)[0] for n in segments(tmp_path)]
    assert starts == list(range(1000, 1006))
    with FileBasedWriteAheadLog(str(tmp_path)) as log:
        assert list(log.read_all()) == [b"a", b"b"] * 3


def test_records_are_never_older_than_their_segment_end(tmp_path):
    """clean(t) may only drop records older than t: every record's time <= its segment's end."""
    rng = random.Random(3)
    times = sorted(rng.randrange(0, 20_000) for _ in range(200))
    with FileBasedWriteAheadLog(str(tmp_path), rolling_interval_s=1) as log:
        handles = [(t, log.write(str(t).encode(), t)) for t in times]
        for t, h in handles:
            assert t <= parse_segment_name(os.path.basename(h.path))[1]
        log.clean(10_000, wait_for_completion=True)
        left = [int(r) for r in log.read_all()]
    assert set(t for t in times if t >= 10_000) <= set(left)  # nothing newer than t was lost
    assert len(left) < len(times)  # and something older was cleaned


def test_header_and_frame_sizes_are_as_documented():
    assert HEADER_LEN == 8 and FRAME_HEADER_LEN == 12


def test_a_flush_mode_segment_is_mapped_read_live_and_cut_to_size_when_sealed(tmp_path):
    """Durability "flush" copies records into a memory map of space reserved ahead: a reader
    sees every record while the writer runs (the reserved zeros read as the end), and sealing
    cuts the file to its records, so no sealed segment ends in zeros."""
    log = FileBasedWriteAheadLog(str(tmp_path), durability="flush", rolling_interval_s=1)
    records = [b"r%d" % i * 50 for i in range(100)]
    handles = [log.write(r, 10) for r in records]
    live = handles[0].path
    assert os.path.getsize(live) > handles[-1].offset + 12 + handles[-1].length  # reserved ahead
    with FileBasedWriteAheadLog(str(tmp_path)) as reader:
        assert list(reader.read_all()) == records
        assert reader.read(handles[42]) == records[42]
    log.write(b"next segment", 5000)  # rolls: the first segment is sealed
    assert os.path.getsize(live) == handles[-1].offset + 12 + handles[-1].length
    log.close()
    with open(live, "rb") as f:
        assert list(iter_segment(f, live, newest=False)) == records
    with FileBasedWriteAheadLog(str(tmp_path)) as again:
        again.write(b"more", 6000)
        assert again.statistics().torn_tails_truncated == 0
        assert list(again.read_all()) == records + [b"next segment", b"more"]
