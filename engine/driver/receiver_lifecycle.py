"""The driver's receiver-based inputs: their block tracker (and its WAL), starting and stopping
their receivers."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.tracker import ReceivedBlockTracker

from .. import config
from ..receiver.block_outputs import check_block_outputs  # noqa: F401  (the driver's start checks the graph with it)
from ..receiver.receiver_tracker import ReceiverTracker

if TYPE_CHECKING:
    import threading

    from sparkwal.wal import Clock, Leadership, StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph


def make_block_tracker(graph: DStreamGraph, location: StorageLocation | None, settings: StreamingConf,
                       clock: Clock, restarted: bool, lock: Leadership | None) -> ReceivedBlockTracker:
    """The tracker of ``graph``'s receiver-based inputs' blocks. Its events go to the WAL under the
    checkpoint directory ``location`` (recovered when ``restarted``), under ``lock`` (the
    leadership), unless ``spark.streaming.receiver.writeAheadLog.enable`` is "false" (on by default
    here, unlike Spark: an acknowledged block must survive the driver)."""
    ids = [s.input_id for s in graph.inputs if s.receiver_based]
    logged = bool(ids) and location is not None and settings[config.RECEIVER_WAL]
    layout = CheckpointLayout(location) if logged else None
    return ReceivedBlockTracker(ids, wal_dir=layout.at(layout.block_metadata) if layout is not None else None,
                                clock=clock, recover_from_wal=logged and restarted, lock=lock if logged else None)


def make_receiver_tracker(graph: DStreamGraph, blocks: ReceivedBlockTracker, **collaborators) -> ReceiverTracker | None:
    """The tracker of ``graph``'s inputs with a receiver to run (others get their blocks from elsewhere),
    not started (:func:`start_receivers`): a restart's re-run batches, generated before the receivers
    start, see which streams the receivers precompute; None when there are none. ``collaborators``:
    :class:`ReceiverTracker`'s others, by name."""
    receivers = [s for s in graph.inputs if getattr(s, "receiver", None) is not None]
    return ReceiverTracker(graph=graph, blocks=blocks, inputs=receivers, **collaborators) if receivers else None


def start_receivers(receivers: ReceiverTracker, kind: str | None, settings: StreamingConf,
                    rerun_times: tuple[int, ...]) -> None:
    """Launch the receivers of a start that re-runs the outputs of ``rerun_times`` first. A hot
    standby's takeover runs the first of them before: a deploy's output waits for it (a handover's
    are the batches due while the leadership moved), and its blocks were all received before. The
    receivers launch once it has completed, ``spark.sparkwal.standby.receiverStartWait`` (1 s) at
    most: launching beside it (a Spark job, a Python worker, the backlog its source kept) slowed it."""
    hold_s = settings[config.TAKEOVER_RECEIVER_HOLD] / 1000 if kind == "takeover" and rerun_times else 0.0
    receivers.start(hold_s, min(rerun_times, default=None))


def stop_receivers(receivers: ReceiverTracker, blocks: ReceivedBlockTracker, graceful: bool, timeout_s: float,
                   stopped: threading.Event) -> None:
    """Spark's first stop step: receivers stop (each pushing its last block); a graceful stop
    then waits, up to ``timeout_s`` or until ``stopped``, until every received block is in a batch,
    before the timer stops."""
    receivers.stop(graceful, timeout_s)
    if graceful:
        deadline = time.monotonic() + timeout_s
        while blocks.has_unallocated_blocks() and time.monotonic() < deadline:
            stopped.wait(0.05)  # the timer allocates them to the next batches
