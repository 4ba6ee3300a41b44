"""ReceiverInputDStream: each batch's RDD is the blocks its receiver stored (one partition per
block), read back from wherever they live (Spark's
``ReceiverInputDStream`` and ``WriteAheadLogBackedBlockRDD``:
streaming/src/main/scala/org/apache/spark/streaming/dstream/ReceiverInputDStream.scala,
rdd/WriteAheadLogBackedBlockRDD.scala)."""

from __future__ import annotations

import logging
from functools import partial

from pyspark import RDD

from sparkwal.base.times import batch_name
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.tracker import ExecutorCacheTaskLocation

from ..inputs import InputDStream
from ..stream_machinery import empty_rdd
from .blocks import read_block, read_wal_block, receiver_wal_dir
from .placement import location_string, rdd_with_locations
from .receiver import Receiver

log = logging.getLogger(__name__)


def _read_wal_blocks(wal_dir, storage_options, stream_id, item):
    block_id, handle = item
    return read_wal_block(wal_dir, storage_options, stream_id, block_id, handle)


def _read_local_blocks(app_id, secret, stream_id, copies, block_id):
    return read_block(app_id, secret, stream_id, block_id, copies[block_id])


class ReceiverInputDStream(InputDStream):
    """The stream of what ``receiver`` stores (``ssc.receiverStream``)."""

    receiver_based = True

    def __init__(self, ssc, receiver: Receiver):
        if not isinstance(receiver, Receiver):
            raise TypeError(f"receiverStream takes an engine.Receiver, got {type(receiver).__name__}")
        super().__init__(ssc)
        self.receiver = receiver
        receiver.bind(self.input_id)

    def renumber(self, input_id: int) -> None:
        super().renumber(input_id)
        self.receiver.bind(input_id)

    def compute(self, time_ms: int) -> RDD | None:
        scheduler = self._driver.scheduler
        blocks = scheduler.block_tracker.get_blocks_of_batch_and_stream(time_ms, self.input_id)
        scheduler.report_input(time_ms, self, sum(b.num_records or 0 for b in blocks), {"blocks": len(blocks)})
        if not blocks:
            return empty_rdd(self._sc)
        logged = [b for b in blocks if b.wal_handle is not None]
        if len(logged) == len(blocks):
            wal = self._driver.location.at(receiver_wal_dir(self._driver.checkpoint_dir, self.input_id))
            items = [(b.block_id, [self._segment_path(b.wal_handle[0]), *b.wal_handle[1:]]) for b in blocks]
            return self._sc.parallelize(items, len(items)).flatMap(  # credentials stay here
                partial(_read_wal_blocks, wal, None, self.input_id))
        if logged:
            log.error("stream %d, %s: mixes blocks in the WAL and on executors", self.input_id, batch_name(time_ms))
        return self._local_blocks_rdd(time_ms, [b for b in blocks if b.wal_handle is None])

    def block_records(self, block) -> list | None:
        """One recorded block's records, read on the driver (``foreachBlock``'s rows of a block that
        came without its result): from the receiver WAL; with the WAL off, by a task on an executor
        holding a copy (None when every one is gone: the block is lost, with a warning, as a batch drops it)."""
        if block.wal_handle is not None:
            wal = self._driver.location.at(receiver_wal_dir(self._driver.checkpoint_dir, self.input_id))
            handle = [self._segment_path(block.wal_handle[0]), *block.wal_handle[1:]]
            return read_wal_block(wal, None, self.input_id, block.block_id, handle)
        rdd = self._local_blocks_rdd(None, [block])  # (a task beside its copy: only it knows its dirs)
        return rdd.collect() if rdd.getNumPartitions() else None  # (no partition: lost, said by the warning)

    def _segment_path(self, name: str) -> str:
        """The storage path of the receiver-WAL segment a block's handle names (relative to the
        checkpoint directory, wherever it is now: :mod:`sparkwal.checkpoint.layout`)."""
        location = self._driver.location
        storage, root = location.resolve()
        own = CheckpointLayout(location).own_name(name)
        return storage.join(root, own) if own is not None else name

    def _local_blocks_rdd(self, time_ms: int | None, blocks) -> RDD:
        """WAL off: blocks on the executors holding their copies (tasks prefer those executors
        and fetch from one when they run elsewhere); a block whose every holder is gone is
        dropped with a warning (Spark's behaviour)."""
        tracker = self._driver.scheduler.receiver_tracker
        live = tracker.live_executor_ids() if tracker is not None else None
        ids, locations, copies = [], [], {}
        for b in blocks:
            held = tracker.block_copies(b.block_id) if tracker is not None else ()
            alive = [c for c in held if live is None or c.executor_id in live]
            if not alive:
                log.warning("%s: block %s of stream %d is lost (%s); enable "
                            "spark.streaming.receiver.writeAheadLog.enable to survive executor loss",
                            batch_name(time_ms) if time_ms is not None else "foreachBlock", b.block_id, self.input_id,
                            "every executor holding it is gone" if held else "not received by this driver")
                continue
            ids.append(b.block_id)
            locations.append([location_string(ExecutorCacheTaskLocation(c.host, c.executor_id)) for c in alive])
            copies[b.block_id] = [(c.executor_id, c.host, c.port) for c in alive]
        if not ids:
            return self._sc.emptyRDD()
        return rdd_with_locations(self._sc, ids, locations).flatMap(
            partial(_read_local_blocks, self._sc.applicationId, tracker.secret, self.input_id, copies))
