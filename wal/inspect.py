"""Looking into a log directory without writing to it, and repairing it on request.

``scan_log`` reads every segment with all its checks (never taking the writer's lock) and
reports, per segment, its time range, size, records, a torn tail, and the first problem with the
file and byte offset. ``plan_repair`` turns a report into steps and ``repair_log`` scans, plans and
carries them out under the writer's lock: a torn tail is cut (what the next writer would do anyway), and a
damaged segment is never deleted: it is moved aside (renamed ``<name>.damaged-<ms>``, which no
reader takes for a segment) and replaced by the records before the damage.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .clock import SYSTEM_CLOCK
from .errors import CorruptRecordError
from .segment import (
    FRAME_HEADER_LEN,
    HEADER,
    HEADER_LEN,
    ScanResult,
    iter_segment,
    parse_segment_name,
)
from .storage import Storage, WriterInfo, resolve


@dataclass(frozen=True)
class SegmentReport:
    path: str
    start_ms: int
    end_ms: int
    size: int
    records: int
    valid_end: int  #: end of the last good record
    torn_bytes: int = 0  #: a torn tail (newest segment only): readers stop there, silently
    problem: tuple[int, str] | None = None  #: (byte offset, what) of damage: readers fail there
    preallocated: int = 0  #: of the torn bytes, space reserved ahead (zeros), not a cut write

    @property
    def lost_bytes(self) -> int:
        return self.size - self.valid_end


@dataclass(frozen=True)
class LogReport:
    url: str
    segments: list[SegmentReport] = field(default_factory=list)
    writer: WriterInfo | None = None

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)

    @property
    def problems(self) -> list[SegmentReport]:
        return [s for s in self.segments if s.problem is not None]


@dataclass(frozen=True)
class RepairStep:
    action: str  # "cut torn tail", "remove empty segment" or "set aside damaged segment"
    path: str
    keep_bytes: int
    lost_bytes: int


def _segments(storage: Storage, root: str) -> list[tuple[int, int, str, int]]:
    found = []
    for info in storage.list_files(root):
        parsed = parse_segment_name(info.name)
        if parsed is not None:
            found.append((parsed[0], parsed[1], info.path, info.size))
    return sorted(found)


def scan_log(url: str, storage_options: dict | None = None,
             progress: Callable[[int, int], None] | None = None) -> LogReport:
    """Every segment of the log at ``url`` read and checked; ``progress(done, total)`` after each."""
    storage, root = resolve(url, storage_options)
    segments = _segments(storage, root)
    reports = []
    for i, (start, end, path, size) in enumerate(segments):
        result = ScanResult()
        problem = None
        try:
            with storage.open_read(path) as f:
                for _ in iter_segment(f, path, newest=i == len(segments) - 1, result=result):
                    pass
        except CorruptRecordError as e:
            problem, result.valid_end = (e.offset, e.reason), e.offset
        except FileNotFoundError:
            continue  # cleaned while we looked
        reports.append(SegmentReport(storage.url(path), start, end, size, result.records,
                                     result.valid_end, result.torn_bytes, problem, result.preallocated))
        if progress is not None:
            progress(i + 1, len(segments))
    return LogReport(storage.url(root), reports, storage.writer(root, clock=SYSTEM_CLOCK))


def segment_bytes(storage: Storage, path: str, newest: bool) -> tuple[bytes, int]:
    """A segment's bytes as its readers take them: the newest segment of a log without a torn or
    preallocated tail (returns the bytes and how many were left out); a damaged segment whole,
    as it is (its damage stays for ``verify`` to report)."""
    data = storage.read_file(path)
    if not newest:
        return data, 0
    result = ScanResult()
    try:
        for _ in iter_segment(io.BytesIO(data), path, newest=True, result=result):
            pass
    except CorruptRecordError:
        return data, 0
    return data[:result.valid_end], len(data) - result.valid_end


def trim_preallocated(url: str, storage_options: dict | None = None) -> int:
    """Cut the space a killed mapped writer reserved ahead of its records (zeros after the last
    record of the log's newest segment) and return how many bytes went; nothing else is touched.
    Only for a log nobody writes any more (an earlier driver run's, whose leadership is over)."""
    storage, root = resolve(url, storage_options)
    segments = _segments(storage, root)
    if not segments or not storage.is_local:
        return 0
    path = segments[-1][2]
    result = ScanResult()
    try:
        with storage.open_read(path) as f:
            for _ in iter_segment(f, path, newest=True, result=result):
                pass
    except (CorruptRecordError, FileNotFoundError):
        return 0
    if not result.preallocated or result.preallocated != result.torn_bytes:
        return 0
    storage.truncate(path, result.valid_end)
    return result.preallocated


def iter_records(url: str, storage_options: dict | None = None) -> Iterator[tuple[str, int, bytes]]:
    """(segment, byte offset, payload) of every record that reads back, oldest first; stops at
    the first damage of a segment and goes on with the next."""
    storage, root = resolve(url, storage_options)
    segments = _segments(storage, root)
    for i, (_start, _end, path, _size) in enumerate(segments):
        offset = HEADER_LEN
        try:
            with storage.open_read(path) as f:
                for payload in iter_segment(f, path, newest=i == len(segments) - 1):
                    yield storage.url(path), offset, payload
                    offset += FRAME_HEADER_LEN + len(payload)
        except CorruptRecordError:
            continue


def plan_repair(report: LogReport) -> list[RepairStep]:
    steps = []
    for s in report.segments:
        if s.problem is not None:
            steps.append(RepairStep("set aside damaged segment", s.path, s.valid_end, s.lost_bytes))
        elif s.torn_bytes:
            action = "cut torn tail" if s.records else "remove empty segment"
            steps.append(RepairStep(action, s.path, s.valid_end if s.records else 0, s.torn_bytes))
    return steps


def repair_log(url: str, set_aside_damaged: bool, storage_options: dict | None = None,
               progress: Callable[[int, int], None] | None = None
               ) -> tuple[list[RepairStep], list[str], bool]:
    """Repair the log at ``url`` holding its writer lock (LogLockedError while a writer runs):
    scan, plan, cut torn tails, and set damaged segments aside only if ``set_aside_damaged``.
    Returns the plan, the paths damaged segments were moved to, and whether it was applied (a
    plan with damaged segments is not applied without ``set_aside_damaged``)."""
    storage, root = resolve(url, storage_options)
    lock = storage.lock(root)
    try:
        steps = plan_repair(scan_log(url, storage_options, progress))
        if not set_aside_damaged and any(s.action == "set aside damaged segment" for s in steps):
            return steps, [], False
        by_url = {storage.url(p): p for _s, _e, p, _z in _segments(storage, root)}
        moved = []
        for step in steps:
            path = by_url.get(step.path, step.path)
            if step.action == "remove empty segment":
                storage.delete(path)
            elif step.action == "cut torn tail":
                storage.truncate(path, step.keep_bytes)
            else:
                data = storage.read_file(path)
                aside = f"{path}.damaged-{SYSTEM_CLOCK.now_ms()}"
                storage.put(aside, data)
                good = data[:step.keep_bytes] if step.keep_bytes >= HEADER_LEN else HEADER
                storage.put(path, good)  # atomic replace: the records before the damage
                moved.append(storage.url(aside))
        return steps, moved, True
    finally:
        lock.release()
