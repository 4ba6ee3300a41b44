"""The driver's receiver-based inputs: their block tracker (and its WAL), starting and stopping
their receivers."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.tracker import ReceivedBlockTracker

from .. import config
from ..receiver.host import ReceiverHost
from ..receiver.receiver_tracker import ReceiverTracker

if TYPE_CHECKING:
    import threading

    from sparkwal.checkpoint import Checkpoint
    from sparkwal.wal import Leadership


class ReceiverLifecycleHost(ReceiverHost, Protocol):
    """What the receivers' start and stop read of the driver (which hands itself in; nothing here
    changes it); the receiver tracker it starts reads a :class:`ReceiverHost`."""

    @property
    def restored(self) -> Checkpoint | None: ...
    @property
    def receiver_tracker(self) -> ReceiverTracker | None: ...
    @property
    def terminated(self) -> threading.Event: ...
    def lead(self) -> Leadership | None: ...
    def graceful_remaining_s(self) -> float: ...


def make_block_tracker(driver: ReceiverLifecycleHost) -> ReceivedBlockTracker:
    """The tracker of the receiver-based inputs' blocks. Its events go to the WAL under the
    checkpoint directory (recovered on restart) unless
    ``spark.streaming.receiver.writeAheadLog.enable`` is "false" (on by default here, unlike
    Spark: an acknowledged block must survive the driver)."""
    ids = [s.input_id for s in driver.graph.inputs if s.receiver_based]
    logged = bool(ids) and driver.checkpoint_dir is not None and driver.settings[config.RECEIVER_WAL]
    layout = CheckpointLayout(driver.location) if logged else None
    return ReceivedBlockTracker(ids, wal_dir=layout.at(layout.block_metadata) if layout is not None else None,
                                clock=driver.clock,
                                recover_from_wal=logged and driver.restored is not None,
                                lock=driver.lead() if logged else None)


def make_receiver_tracker(driver: ReceiverLifecycleHost) -> ReceiverTracker | None:
    """The tracker of the inputs with a receiver to run (others get their blocks from elsewhere),
    not started (:func:`start_receivers`): a restart's re-run batches, generated before the
    receivers start, see which streams the receivers precompute; None when there are none."""
    receivers = [s for s in driver.graph.inputs if getattr(s, "receiver", None) is not None]
    return ReceiverTracker(driver, receivers) if receivers else None


def start_receivers(driver: ReceiverLifecycleHost) -> None:
    """Start the receivers of :func:`make_receiver_tracker`'s tracker, if any."""
    if driver.receiver_tracker is not None:
        driver.receiver_tracker.start()


def stop_receivers(driver: ReceiverLifecycleHost, graceful: bool) -> None:
    """Spark's first stop step: receivers stop (each pushing its last block); a graceful stop
    then waits until every received block is in a batch, before the timer stops."""
    if driver.receiver_tracker is None:
        return
    timeout = driver.graceful_remaining_s()
    driver.receiver_tracker.stop(graceful, timeout)
    if graceful:
        deadline = time.monotonic() + timeout
        while driver.block_tracker.has_unallocated_blocks() and time.monotonic() < deadline:
            driver.terminated.wait(0.05)  # the timer allocates them to the next batches
