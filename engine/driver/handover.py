"""The old leader's side of ``sparkwal checkpoint handover``: after its graceful stop, it waits for
the new leader's first batch before it lets its process go on to stop Spark.

A handover's graceful stop finishes the batches generated, writes the last checkpoint and gives the
leadership up (as SIGTERM with ``spark.streaming.stopGracefullyOnShutdown`` does). What is left is
stopping the SparkContext (its executors, their Python workers) and the JVM's exit. On a host the
old and the new leader share (a deploy beside the running version), that teardown ran at the very
moment the new leader read the checkpoint and ran its first batch, and slowed both: 0.1 s batches,
10 handovers each way back to back, paused output 0.45 s p50 / 0.67 s p99 with it, 0.36 / 0.48 s
without; the takeover took 62-255 ms against 45-109 ms (docs/benchmarks.md). So the stop, its
leadership given up, waits until a leader at a newer epoch has completed a batch (read from the
checkpoint directory, as the handover command reads it) before it returns (``awaitTermination``
returns then too, and ``stop()``'s SparkContext stop follows): at most
``spark.sparkwal.handover.teardownWait`` (10 s; 0: no wait).

Only where it helps and costs nothing: a checkpoint directory on a local filesystem (where leaders
share a host, and a look is a few file reads; on an object store it would be requests every 50 ms
against the store the new leader is taking over), and a stop that left no batch to re-run (a batch
still running after a graceful stop's timeout must not have a live SparkContext beside the new
leader's re-run of it).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from sparkwal.base.errors import SparkwalError
from sparkwal.checkpoint.progress import batch_done_at_epoch, last_completed_ms
from sparkwal.wal import StorageLocation

log = logging.getLogger(__name__)

POLL_S = 0.05  # as the handover command polls


def successor_ran(directory: str, storage_options: dict | None, epoch: int) -> Callable[[], bool]:
    """Whether a leader after ``epoch`` (this driver's) completed a batch in ``directory`` after the
    last one this driver's checkpoint records; a failed read is a no (the wait is bounded)."""
    def look(read: Callable):
        try:
            return read()
        except (OSError, ValueError, SparkwalError) as e:  # (a file being replaced, a store failing: look again)
            log.debug("a handover's wait for the new leader: %s", e)
            return None

    after_ms = look(lambda: last_completed_ms(directory, storage_options))
    return lambda: bool(look(lambda: batch_done_at_epoch(directory, storage_options, epoch + 1, after_ms)))


def await_successor(location: StorageLocation | None, epoch: int | None, wait_s: float, *,
                    ran: Callable[[], bool] | None = None, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """After a handover's stop gave the leadership at ``epoch`` up: wait, at most ``wait_s``
    seconds, for the new leader's first batch in ``location`` (a local directory only: see the
    module's docstring); True once it ran. ``ran``, ``clock`` and ``sleep`` are for tests."""
    if location is None or epoch is None or wait_s <= 0 or not location.storage.is_local:
        return False
    ran = ran or successor_ran(location.url, location.options, epoch)
    deadline = clock() + wait_s
    while not ran():
        if clock() >= deadline:
            log.info("handed over: no new leader completed a batch within %.1f s; stopping anyway", wait_s)
            return False
        sleep(POLL_S)
    return True
