"""The context's receiver-based inputs: their block tracker (and its WAL), starting and stopping
their receivers."""

from __future__ import annotations

import time

from tracker import ReceivedBlockTracker


def make_block_tracker(ssc) -> ReceivedBlockTracker:
    """The tracker of the receiver-based inputs' blocks. Its events go to the WAL under the
    checkpoint directory (recovered on restart) unless
    ``spark.streaming.receiver.writeAheadLog.enable`` is "false" (on by default here, unlike
    Spark: an acknowledged block must survive the driver)."""
    ids = [s.input_id for s in ssc._graph.inputs if s.receiver_based]
    enabled = ssc._conf.get("spark.streaming.receiver.writeAheadLog.enable", "true")
    logged = bool(ids) and ssc._checkpoint_dir is not None and enabled.lower() == "true"
    return ReceivedBlockTracker(ids, ssc._checkpoint_dir if logged else None, clock=ssc._clock,
                                storage_options=ssc._storage_options if logged else None,
                                recover_from_wal=logged and ssc._restored is not None,
                                lock=ssc._lead() if logged else None)


def start_receivers(ssc) -> None:
    # receiver-based inputs with a receiver to run (others get their blocks from elsewhere)
    receivers = [s for s in ssc._graph.inputs if getattr(s, "receiver", None) is not None]
    if receivers:
        from .receiver.tracker import ReceiverTracker

        ssc._receiver_tracker = ReceiverTracker(ssc, receivers)
        ssc._receiver_tracker.start()


def stop_receivers(ssc, graceful: bool) -> None:
    """Spark's first stop step: receivers stop (each pushing its last block); a graceful stop
    then waits until every received block is in a batch, before the timer stops."""
    if ssc._receiver_tracker is None:
        return
    timeout = ssc._graceful_remaining_s()
    ssc._receiver_tracker.stop(graceful, timeout)
    if graceful:
        deadline = time.monotonic() + timeout
        while ssc._block_tracker.has_unallocated_blocks() and time.monotonic() < deadline:
            ssc._terminated.wait(0.05)  # the timer allocates them to the next batches
