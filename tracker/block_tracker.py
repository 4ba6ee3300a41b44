"""ReceivedBlockTracker: which received blocks exist and which batch owns them, rebuilt from the WAL.

Strictly write-ahead (Spark's semantics, with SPARK-23991's lesson applied everywhere): memory
changes only after the event describing the change is durable in the WAL. A failed write leaves
memory untouched: ``add_block`` returns False, and ``allocate_blocks_to_batch`` leaves the blocks
queued for a later batch. Recovery replays the events in log order.

Concurrency: ``add_block`` writes its event without holding the tracker's lock, so concurrent
receivers' additions share the WAL's group-commit syncs; it then appends under the lock.
Allocation holds the lock across its write, so the snapshot it logs is exactly what it clears.
Either interleaving of an addition with an allocation leaves the log and memory agreeing (the
block is in the allocation in both, or unallocated in both).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections import deque
from collections.abc import Iterable

from sparkwal.base.times import batch_name
from sparkwal.wal import (SYSTEM_CLOCK, BatchedWriteAheadLog, Clock, Durability, StorageLocation,
                          FileBasedWriteAheadLog, WriteAheadLog)

from .events import (ADD, ALLOC, CLEAN, BatchAllocationEvent, BatchCleanupEvent,
                     BlockAdditionEvent, Event, EventFormatError, ReceivedBlockInfo, block_from_raw,
                     decode_raw, encode_event)

log = logging.getLogger(__name__)



#: the tracker's log under a checkpoint directory: Spark's name (``ReceivedBlockTracker``'s
#: ``checkpointDirToLogDir``), as :mod:`sparkwal.checkpoint.layout` lists it
LOG_DIR_NAME = "receivedBlockMetadata"


def checkpoint_dir_to_log_dir(checkpoint_dir: str) -> str:
    """Where the tracker of a checkpoint directory logs: ``<checkpoint_dir>/receivedBlockMetadata``."""
    return f"{str(checkpoint_dir).rstrip('/')}/{LOG_DIR_NAME}"


class ReceivedBlockTracker:
    """Driver-side tracking of received blocks for ``stream_ids``.

    With ``checkpoint_dir`` (Spark's ``checkpointDirOption``) the events go to the WAL at
    ``<checkpoint_dir>/receivedBlockMetadata``; ``wal_dir`` names the WAL's directory itself
    instead. The WAL is a :class:`BatchedWriteAheadLog` over a durable
    :class:`FileBasedWriteAheadLog` (one object per group on stores without append); with neither,
    nothing is logged and nothing survives a restart. ``lock``: the driver's leadership of the
    checkpoint directory (a ``wal.Leadership``), which the WAL then writes under instead of taking
    a lock of its own.
    """

    def __init__(self, stream_ids: Iterable[int], checkpoint_dir: str | None = None, *,
                 recover_from_wal: bool = False, clock: Clock | None = None,
                 storage_options: dict | None = None, wal_dir: str | StorageLocation | None = None,
                 rolling_interval_s: float = 60, batching_timeout_s: float = 5.0,
                 durability: Durability | str = Durability.FSYNC, lock=None):
        if checkpoint_dir is not None and wal_dir is not None:
            raise ValueError("give the checkpoint directory or the WAL's directory, not both")
        if checkpoint_dir is not None:
            wal_dir = checkpoint_dir_to_log_dir(checkpoint_dir)
        self.stream_ids = list(stream_ids)
        self._clock = clock or SYSTEM_CLOCK
        self._lock = threading.RLock()
        self._unallocated: dict[int, deque[ReceivedBlockInfo]] = {s: deque() for s in self.stream_ids}
        self._allocations: dict[int, dict[int, list[ReceivedBlockInfo]]] = {}
        self._last_allocated: int | None = None
        self.wal: WriteAheadLog | None = None
        if wal_dir is not None:
            self.wal = BatchedWriteAheadLog(
                FileBasedWriteAheadLog(wal_dir, rolling_interval_s=rolling_interval_s, clock=self._clock,
                                       storage_options=storage_options, durability=durability, lock=lock),
                batching_timeout_s=batching_timeout_s)
            if recover_from_wal:
                self._recover()

    # ---------------------------------------------------------------- log

    def _write(self, event: Event) -> bool:
        if self.wal is None:
            return True
        try:
            self.wal.write(encode_event(event), self._clock.now_ms())
            return True
        except Exception as e:  # noqa: BLE001
            log.warning("could not write %s to the WAL: %s", type(event).__name__, e)
            return False

    # ---------------------------------------------------------------- blocks

    def add_block(self, info: ReceivedBlockInfo) -> bool:
        """Log the block, then queue it as unallocated; False (nothing queued) if logging failed."""
        if info.stream_id not in self._unallocated:
            raise ValueError(f"stream {info.stream_id} is not tracked (streams: {self.stream_ids})")
        if not self._write(BlockAdditionEvent(info)):
            log.error("block %s of stream %d NOT added: its event could not be logged",
                      info.block_id, info.stream_id)
            return False
        with self._lock:
            self._unallocated[info.stream_id].append(info)
        return True

    def allocate_blocks_to_batch(self, batch_time_ms: int) -> bool:
        """Give every unallocated block to batch ``batch_time_ms``. A time at or before the last
        allocated one is a no-op (re-run batches keep their allocation). False if the allocation
        could not be logged: the blocks then stay queued for a later batch."""
        with self._lock:
            if self._last_allocated is not None and batch_time_ms <= self._last_allocated:
                log.info("batch %d is not after the last allocated batch %d: allocation kept",
                         batch_time_ms, self._last_allocated)
                return True
            snapshot = {sid: list(q) for sid, q in self._unallocated.items()}
            if not self._write(BatchAllocationEvent(batch_time_ms, snapshot)):
                log.warning("possibly processed %s needs to be processed again in WAL "
                            "recovery: its allocation could not be logged", batch_name(batch_time_ms))
                return False
            for q in self._unallocated.values():
                q.clear()
            self._allocations[batch_time_ms] = snapshot
            self._last_allocated = batch_time_ms
            return True

    def get_blocks_of_batch(self, batch_time_ms: int) -> dict[int, list[ReceivedBlockInfo]]:
        """Stream id -> blocks of that batch; every tracked stream is present (maybe empty)."""
        with self._lock:
            allocated = self._allocations.get(batch_time_ms, {})
            return {sid: list(allocated.get(sid, ())) for sid in self.stream_ids}

    def get_blocks_of_batch_and_stream(self, batch_time_ms: int, stream_id: int
                                       ) -> list[ReceivedBlockInfo]:
        with self._lock:
            return list(self._allocations.get(batch_time_ms, {}).get(stream_id, ()))

    def has_unallocated_blocks(self) -> bool:
        with self._lock:
            return any(self._unallocated.values())

    def get_unallocated_blocks(self, stream_id: int) -> list[ReceivedBlockInfo]:
        with self._lock:
            return list(self._unallocated.get(stream_id, ()))

    @property
    def last_allocated_batch_ms(self) -> int | None:
        return self._last_allocated

    def allocated_batch_times(self) -> list[int]:
        with self._lock:
            return sorted(self._allocations)

    def cleanup_old_batches(self, thresh_ms: int, wait_for_completion: bool = False) -> None:
        """Forget batches before ``thresh_ms`` (logged first, even when there are none), then let
        the WAL delete segments that end before it."""
        now = self._clock.now_ms()
        if thresh_ms >= now:
            raise ValueError(f"cleanup threshold {thresh_ms} must be before the current time {now}")
        with self._lock:
            times = sorted(t for t in self._allocations if t < thresh_ms)
            if not self._write(BatchCleanupEvent(times)):
                log.warning("failed to log the cleanup of batches before %d; kept them", thresh_ms)
                return
            for t in times:
                del self._allocations[t]
        if self.wal is not None:
            self.wal.clean(thresh_ms, wait_for_completion)

    def stop(self) -> None:
        if self.wal is not None:
            self.wal.close()

    # ---------------------------------------------------------------- recovery

    #: blocks whose additions a restart replayed from the WAL (0: a fresh tracker)
    recovered_block_additions = 0

    def _recover(self) -> None:
        """Replay the WAL. Every recovered block is marked invalid: executors' memory did not
        survive the driver, so its data must be read from the WAL.

        Works on the raw event lists (a driver's WAL can hold millions of events), and takes an
        allocation's blocks from the queue where their additions put them instead of decoding
        them a second time.
        """
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a million long-lived objects: collections would rescan them over and over
        try:
            self._replay()
        finally:
            if gc_was_enabled:
                gc.enable()

    def _replay(self) -> None:
        added = allocated = cleaned = 0
        queues, allocations = self._unallocated, self._allocations
        assert self.wal is not None  # replayed only when there is a WAL
        for record in self.wal.read_all():
            v = decode_raw(record)
            kind = v[1]
            if kind == ADD:
                info = block_from_raw(v[2])
                info.is_block_id_valid = False
                queue = queues.get(info.stream_id)
                if queue is None:
                    log.warning("ignoring block %s of untracked stream %d", info.block_id, info.stream_id)
                    continue
                queue.append(info)
                added += 1
            elif kind == ALLOC:
                time_ms, by_stream = v[2], dict(v[3])
                allocations[time_ms] = {sid: self._take_allocated(sid, by_stream.get(sid, ()))
                                        for sid in self.stream_ids}
                self._last_allocated = time_ms  # the last in log order, as Spark
                allocated += 1
            elif kind == CLEAN:
                for t in v[2]:
                    allocations.pop(t, None)
                cleaned += 1
            else:
                raise EventFormatError(f"unknown tracker event kind {kind} in {self.wal}")
        self.recovered_block_additions = added
        log.info("recovered %d block additions, %d allocations, %d cleanups from %s",
                 added, allocated, cleaned, self.wal)

    def _take_allocated(self, stream_id: int, raw_blocks) -> list[ReceivedBlockInfo]:
        """Remove an allocation's blocks from the stream's queue; return them as infos."""
        queue = self._unallocated.get(stream_id)
        ids = [b[2] for b in raw_blocks]
        if queue is None or not ids:
            return []
        n = len(ids)
        if len(queue) >= n and all(queue[i].block_id == ids[i] for i in (0, n - 1)):
            head = [queue.popleft() for _ in range(n)]  # the usual case: the queue's oldest blocks
            if [b.block_id for b in head] == ids:
                return head
            queue.extendleft(reversed(head))
        by_id = {b.block_id: b for b in queue}
        taken = set(ids)
        self._unallocated[stream_id] = deque(b for b in queue if b.block_id not in taken)
        out = []
        for raw in raw_blocks:  # blocks whose addition was cleaned away are decoded here
            info = by_id.get(raw[2]) or block_from_raw(raw)
            info.is_block_id_valid = False
            out.append(info)
        return out
