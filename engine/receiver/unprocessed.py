"""The data received but not yet processed, per receiver stream, and its bound.

``spark.streaming.receiver.maxUnprocessedBytes``: an ``AddBlock`` that would take a stream past it
is answered only once completed batches have processed enough of the stream's blocks, so the
receiver's bounded queue fills and ``store()`` blocks the source (memory stays bounded under a
source faster than processing). A stream with nothing unprocessed takes any one block, so a block
larger than the bound is never refused forever. Part of the driver's
:class:`sparkwal.engine.receiver.receiver_tracker.ReceiverTracker`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .batch_cuts import BatchCuts

#: how often a held AddBlock looks again whether it may go on (a stop wakes it at once)
RECHECK_S = 0.5


class UnprocessedBytes:
    """Bytes received and recorded per stream, until a completed batch processes their block."""

    def __init__(self, stream_ids: Iterable[int], max_bytes: int, batch_cuts: BatchCuts):
        self.max_bytes = max_bytes
        self._batch_cuts = batch_cuts
        self._lock = threading.Condition()
        self._by_stream = dict.fromkeys(stream_ids, 0)
        self._blocks: dict[str, tuple[int, int]] = {}  # block id -> (stream, bytes) unprocessed
        self.most = 0  #: the most ever unprocessed, all streams (bounded by max_bytes plus one block)
        self.waits = 0  #: AddBlocks held back until batches caught up

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._by_stream.values())

    def figures(self) -> tuple[int, int, int]:
        """``(total, most, waits)``, read at one moment."""
        with self._lock:
            return sum(self._by_stream.values()), self.most, self.waits

    def wait_for_room(self, stream_id: int, size: int, holding: Callable[[], bool]) -> None:
        """Until ``size`` more bytes of ``stream_id`` fit, while ``holding()`` (a stop lets the
        receivers' last blocks in regardless); no batch waits for the stream's cut meanwhile."""
        with self._lock:
            waited = False
            while holding() and 0 < self._by_stream[stream_id] and self._by_stream[stream_id] + size > self.max_bytes:
                if not waited:
                    self._batch_cuts.hold(stream_id, True)
                waited = True
                self._lock.wait(RECHECK_S)
            if waited:
                self._batch_cuts.hold(stream_id, False)
            self.waits += waited

    def added(self, stream_id: int, block_id: str, size: int, counted: bool) -> None:
        """A block of ``stream_id`` was recorded; ``counted``: towards :attr:`most` (not at a stop)."""
        with self._lock:
            self._by_stream[stream_id] += size
            self._blocks[block_id] = (stream_id, size)
            if counted:
                self.most = max(self.most, sum(self._by_stream.values()))

    def processed(self, block_ids: Iterable[str]) -> int:
        """A completed batch processed these blocks: their bytes, freed (returned), and the
        AddBlocks held for them go on."""
        freed = 0
        with self._lock:
            for block_id in block_ids:
                entry = self._blocks.pop(block_id, None)
                if entry is not None:
                    self._by_stream[entry[0]] -= entry[1]
                    freed += entry[1]
            self._lock.notify_all()
        return freed

    def wake(self) -> None:
        """A stop: every held AddBlock looks again now."""
        with self._lock:
            self._lock.notify_all()
