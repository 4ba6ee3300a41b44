"""BatchedWriteAheadLog: group commit for many concurrent writers, led by the writers themselves.

Writers queue their records and block. There is no writer thread: the first writer to queue a
record while no group is being written becomes the *leader*. It takes everything queued, sorts it
by time (stable) and hands it to the wrapped log's ``write_prepared`` at the group's *newest* time,
so the whole group costs one write and one sync, and ``clean(t)`` can never drop a segment that
still holds a record newer than ``t`` (Spark's rule). It then wakes the group's writers and hands
the leadership to the oldest writer still queued (records queued during its sync), or gives it up
when the queue is empty. As in RocksDB's and MySQL's group commit, no record waits for a separate
thread to be scheduled: the leader's own record costs no wake-up, and a group costs one wake-up
per other writer plus one hand-off. Every record keeps its own :class:`RecordHandle`, so unlike
Spark's batched log, ``read(handle)`` works and ``read_all`` yields the original records: a group
is just consecutive frames, with no aggregation format to undo.

Why the linger: after a sync, the writers it released need a moment (thread wake-ups under the
GIL) to queue their next record; a leader that syncs whatever happens to be queued catches about
half of them. So when at most half of the writers seen recently are queued, the leader waits
until all of them are, but no longer than half a recent group write (and at most
``max_linger_s``): at worst a group's latency grows by half, at best its sync carries twice the
records. It does not wait when more than half are queued (the rest queue during this group's sync
anyway), when 256 KiB are queued (the write is bound by bandwidth, not by the per-sync latency
that grouping amortises), or with more than 16 writers (waking them all costs more than a sync).

Per-record work (framing, CRCs) runs on each writer's own thread through the wrapped log's
``prepare`` before it queues, so the leader only joins, writes, syncs and wakes.

``batching_timeout_s`` bounds how long a writer waits for *another* writer's group; a leader is
inside the wrapped log's write itself, as a caller of an unbatched log would be.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace

from .base import RecordHandle, WalStatistics, WriteAheadLog
from .errors import WalError

log = logging.getLogger(__name__)


class _Pending:
    """One caller's records (one for ``write``, several for ``write_many``), queued together."""

    __slots__ = ("data", "size", "time_ms", "done", "handles", "error", "lead")

    def __init__(self, data: list, size: int, time_ms: int, done):
        self.data = data  # prepared records
        self.size = size
        self.time_ms = time_ms
        self.done = done  # a lock held until the records are written, or leadership handed over
        self.handles: list[RecordHandle] | None = None
        self.error: BaseException | None = None
        self.lead = False  # set (with ``done`` released) when this writer must lead the next group


_by_time = operator.attrgetter("time_ms")
_allocate_lock = threading.Lock
#: Past this many queued bytes a group write is bandwidth-bound: waiting for more only adds latency.
LINGER_MAX_BYTES = 256 * 1024
#: Gathering W writers costs W thread wake-ups (10-30 µs each in CPython on a VM); past this many
#: that exceeds a sync, and with so many writers the queue refills during each sync anyway.
LINGER_MAX_WRITERS = 16
#: Groups a leader writes in a row before it hands the leadership on (see ``_lead``).
LEAD_MAX_GROUPS = 8


class BatchedWriteAheadLog(WriteAheadLog):
    def __init__(
        self,
        wrapped: WriteAheadLog,
        *,
        batching_timeout_s: float = 5.0,
        max_linger_s: float = 0.002,
    ):
        if batching_timeout_s <= 0:
            raise ValueError(f"batching_timeout_s must be > 0, got {batching_timeout_s}")
        self.wrapped = wrapped
        self._prepare = wrapped.prepare
        self._timeout = batching_timeout_s
        self._max_linger = max_linger_s
        self._queue: list[_Pending] = []
        self._queued_records = 0
        # A plain lock for the queue, not a Condition: its Python-level enter/exit/notify would
        # cost more per record than everything else a writer does.
        self._qlock = threading.Lock()
        self._leading = False  # a leader is taking or writing a group
        self._lingering = False  # the leader waits on ``_linger_wake`` for more writers
        self._linger_wake = threading.Event()
        self._idle = threading.Event()  # no leader and nothing queued (close() waits for it)
        self._idle.set()
        self._active = True
        self._target = 1  # queued writers worth waiting for
        self._recent_writers: deque[int] = deque(maxlen=4)
        self._write_time_s = 0.0  # moving average of one group write

    # ---------------------------------------------------------------- callers

    def write(self, data: bytes, time_ms: int) -> RecordHandle:
        return self._submit([self._prepare(data)], len(data), time_ms)[0]

    def write_many(self, records: Sequence[bytes], time_ms: int) -> list[RecordHandle]:
        """Queue ``records`` together: they go into one group, in order, each with its handle."""
        if not records:
            return []
        prepare = self._prepare
        return self._submit([prepare(r) for r in records], sum(map(len, records)), time_ms)

    def _submit(self, prepared: list, size: int, time_ms: int) -> list[RecordHandle]:
        done = _allocate_lock()
        done.acquire()
        p = _Pending(prepared, size, time_ms, done)
        with self._qlock:
            if not self._active:
                raise WalError("close() was called on BatchedWriteAheadLog before write request "
                               f"with time {time_ms} could be fulfilled")
            queue = self._queue
            queue.append(p)
            self._queued_records += len(prepared)
            lead = not self._leading
            if lead:
                self._leading = True
                self._idle.clear()
            elif self._lingering and len(queue) >= self._target:
                self._lingering = False
                self._linger_wake.set()
        if not lead:
            if not done.acquire(timeout=self._timeout):
                self._give_up(p)
            if not p.lead:
                return self._result(p)
        self._lead()
        return self._result(p)

    def _give_up(self, p: _Pending) -> None:
        """A writer's wait timed out: withdraw its records if they are still queued (they will
        never be written), else report that they may still become durable."""
        with self._qlock:
            if p.lead or p.handles is not None or p.error is not None:
                p.done.acquire()  # released just now: take the outcome (or the leadership)
                return
            if p in self._queue:
                self._queue.remove(p)
                self._queued_records -= len(p.data)
                raise WalError(f"write at time {p.time_ms} not confirmed within {self._timeout} s "
                               "(withdrawn: it was not written)")
        raise WalError(f"write at time {p.time_ms} not confirmed within {self._timeout} s "
                       "(it may still become durable)")

    @staticmethod
    def _result(p: _Pending) -> list[RecordHandle]:
        if p.error is not None:
            raise WalError(f"group write at time {p.time_ms} failed: {p.error}") from p.error
        return p.handles

    def read(self, handle: RecordHandle) -> bytes:
        return self.wrapped.read(handle)

    def read_all(self) -> Iterator[bytes]:
        return self.wrapped.read_all()

    def clean(self, thresh_time_ms: int, wait_for_completion: bool = False) -> None:
        self.wrapped.clean(thresh_time_ms, wait_for_completion)

    def statistics(self) -> WalStatistics:
        with self._qlock:
            queued = self._queued_records
        return replace(self.wrapped.statistics(), queued_records=queued)

    def close(self) -> None:
        """Stop accepting writes, let the leaders write what is already queued (bounded by the
        batching timeout), fail whatever is left, close the wrapped log."""
        with self._qlock:
            if not self._active:
                return
            self._active = False
            if self._lingering:
                self._lingering = False
                self._linger_wake.set()
        drained = self._idle.wait(self._timeout)
        with self._qlock:
            leftover, self._queue = self._queue, []
            self._queued_records = 0
        for p in leftover:
            p.error = WalError("BatchedWriteAheadLog closed before the record was written")
            p.done.release()
        if not drained:
            log.error("BatchedWriteAheadLog: a group write is stuck; the wrapped log %r is left "
                      "open", self.wrapped)
            return
        self.wrapped.close()

    # ---------------------------------------------------------------- the leader

    def _take_group(self) -> list[_Pending]:
        """Everything queued (the leader's own record among it), after lingering if worth it."""
        with self._qlock:
            queue = self._queue
            target = self._target
            # Linger only when the pipeline is not saturated (if half the expected writers are
            # queued, the rest queue during this group's sync anyway) and the group is not
            # bandwidth-bound.
            if (target <= LINGER_MAX_WRITERS and len(queue) * 2 <= target and self._active
                    and sum(p.size for p in queue) < LINGER_MAX_BYTES):
                deadline = time.monotonic() + min(self._max_linger, self._write_time_s / 2)
                while len(self._queue) < target and self._active:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._lingering = True
                    self._linger_wake.clear()
                    self._qlock.release()
                    try:
                        self._linger_wake.wait(remaining)
                    finally:
                        self._qlock.acquire()
                        self._lingering = False
            group, self._queue = self._queue, []
            self._queued_records = 0
            return group

    def _lead(self) -> None:
        """Write groups while records are queued, up to ``LEAD_MAX_GROUPS`` of them, then pass
        the leadership to the oldest queued writer (or end it when nothing is queued).

        Going on with the next group at once keeps the disk busy: a hand-off puts a thread
        wake-up (tens of µs on a VM) between two syncs, so the leader hands off only after a few
        groups, which bounds how long it works for others after its own record is durable."""
        for rounds in range(1, LEAD_MAX_GROUPS + 1):
            group = self._take_group()
            try:
                self._write_group(group)
            except BaseException:  # (it catches the write's errors: this is a bug, or an interrupt)
                self._after_group(group, hand_off=True)
                raise
            if not self._after_group(group, hand_off=rounds == LEAD_MAX_GROUPS):
                return

    def _after_group(self, group: list[_Pending], hand_off: bool) -> bool:
        """True when the leader should write the next group itself; else the leadership has
        passed to the oldest queued writer, or ended with the queue empty."""
        with self._qlock:
            # every blocked writer has exactly one entry in the group or in the queue
            self._recent_writers.append(len(group) + len(self._queue))
            self._target = max(self._recent_writers)
            if not self._queue:
                self._leading = False
                self._idle.set()
                return False
            if not hand_off:
                return True
            nxt = self._queue[0]
            nxt.lead = True
            nxt.done.release()
            return False

    def _write_group(self, group: list[_Pending]) -> None:
        if not group:  # the queue was failed by a close() that gave up waiting
            return
        group.sort(key=_by_time)
        started = time.perf_counter()
        try:
            records = group[0].data if len(group) == 1 else [d for p in group for d in p.data]
            handles = self.wrapped.write_prepared(records, group[-1].time_ms)
            if len(handles) != len(records):
                raise WalError(f"{self.wrapped!r} returned {len(handles)} handles for "
                               f"{len(records)} records")
        except BaseException as exc:  # every writer of the group learns it; none is stranded
            for p in group:
                p.error = exc
                p.done.release()
            return
        elapsed = time.perf_counter() - started
        self._write_time_s = elapsed if not self._write_time_s else (
            0.8 * self._write_time_s + 0.2 * elapsed)
        i = 0
        for p in group:
            n = len(p.data)
            p.handles = handles[i:i + n]
            i += n
            p.done.release()

    def __repr__(self) -> str:
        return f"BatchedWriteAheadLog({self.wrapped!r})"
