"""A batch waits, briefly, for its receivers' blocks cut at its time.

Spark allocates a batch's blocks at the batch time from whatever its receivers have recorded,
and its receivers cut blocks on multiples of the block interval: the block cut at a batch time
races the allocation and usually loses, so its records wait a whole batch more. Here every
receiver cuts a block on each batch time (``supervisor.next_cut_ms``) and, once every record
added before that cut is recorded (its ``AddBlock`` replied), tells the driver ``RecordedUpTo``
(``wire.py``). Allocating batch ``T``'s blocks first waits until each receiver that reported the
batch before ``T`` has reported ``T`` (it is alive and on time: its cut at ``T`` is due in
milliseconds), for at most half a batch interval. A receiver that did not report the batch before
(just started, stopped, or on a clock far from the driver's) is not waited for, nor is one whose
``AddBlock`` the driver is holding back (``spark.streaming.receiver.maxUnprocessedBytes``): its
cut cannot be recorded before earlier batches run, so the wait would only delay this one.

The reports only end the wait: which blocks a batch holds is still what the block tracker has
recorded when the wait ends, so a late or lost report costs at most the wait, never a record.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class BatchCuts:
    """Per stream, the latest batch time its receiver has recorded up to."""

    def __init__(self, batch_ms: int, *, max_wait_s: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        self._batch_ms = batch_ms
        self._max_wait_s = batch_ms / 2000 if max_wait_s is None else max_wait_s
        self._monotonic = monotonic
        self._recorded: dict[int, int] = {}
        self._held: set[int] = set()  # streams whose AddBlock the driver is holding back
        self._cond = threading.Condition()
        self.waits = 0  #: batches that waited for a receiver's cut
        self.late = 0  #: of those, batches whose wait ended with a receiver's cut still missing

    def recorded_up_to(self, stream_id: int, batch_ms: int) -> None:
        with self._cond:
            if batch_ms > self._recorded.get(stream_id, -1):
                self._recorded[stream_id] = batch_ms
                self._cond.notify_all()

    def recorded_batch(self, stream_id: int) -> int | None:
        """The latest batch time the stream's receiver reported its cut at (None: none yet)."""
        with self._cond:
            return self._recorded.get(stream_id)

    def forget(self, stream_id: int) -> None:
        """The stream's receiver stopped: no batch waits for it until it reports again."""
        with self._cond:
            self._recorded.pop(stream_id, None)
            self._cond.notify_all()

    def hold(self, stream_id: int, held: bool) -> None:
        """The driver holds back (or no longer holds back) an ``AddBlock`` of the stream."""
        with self._cond:
            (self._held.add if held else self._held.discard)(stream_id)
            self._cond.notify_all()

    def _behind(self, time_ms: int) -> list[int]:
        return [sid for sid, t in self._recorded.items()
                if time_ms - self._batch_ms <= t < time_ms and sid not in self._held]

    def wait_for(self, time_ms: int) -> tuple[int, ...]:
        """Wait until every receiver that recorded up to the batch before ``time_ms`` has recorded
        up to ``time_ms``, at most the maximum wait; the streams still behind then."""
        with self._cond:
            behind = self._behind(time_ms)
            if not behind:
                return ()
            self.waits += 1
            deadline = self._monotonic() + self._max_wait_s
            while behind and (left := deadline - self._monotonic()) > 0:
                self._cond.wait(left)
                behind = self._behind(time_ms)
            self.late += bool(behind)
            return tuple(behind)
