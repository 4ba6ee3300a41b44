"""The old leader's side of ``sparkwal checkpoint handover``: stop gracefully, then wait for the
successor's first batch before stopping the SparkContext.

A handover's graceful stop finishes the batches generated, writes the last checkpoint and gives the
leadership up (as SIGTERM with ``spark.streaming.stopGracefullyOnShutdown`` does). What is left is
stopping the SparkContext (its executors, their Python workers) and the JVM's exit. On a host the
old and the new leader share (a deploy beside the running version), that teardown used to run at the
very moment the new leader read the checkpoint and ran its first batch, and slowed both: the takeover
took 89-301 ms against 43-80 ms with the teardown held back, its first batch's generation up to 5
times its usual time (docs/benchmarks.md). So the old leader, its stream stopped and its leadership
given up, stays idle until a leader at a newer epoch has completed a batch (read from the checkpoint
directory, as the handover command reads it), at most ``spark.sparkwal.handover.teardownWait``
(10 s; 0: no wait), and only then stops Spark.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from sparkwal.checkpoint.progress import batch_done_at_epoch

log = logging.getLogger(__name__)

POLL_S = 0.05  # as the handover command polls


def successor_ran(directory: str, storage_options: dict | None, epoch: int) -> Callable[[], bool]:
    """Whether a leader after ``epoch`` (this driver's) completed a batch in ``directory``; a
    failed read is a no (the wait is bounded)."""
    def ran() -> bool:
        try:
            return batch_done_at_epoch(directory, storage_options, epoch + 1)
        except (OSError, ValueError) as e:  # (a checkpoint being replaced, a store failing: look again)
            log.debug("a handover's wait for the new leader: %s", e)
            return False
    return ran


def hand_over(context, sc, ran: Callable[[], bool] | None, wait_s: float,
              stopped: threading.Event | None = None) -> None:
    """The stop a handover asks for: ``context`` stopped gracefully (the leadership given up), then,
    with ``ran`` (:func:`successor_ran`; None: no checkpoint to read), up to ``wait_s`` seconds for
    the successor's first batch, then the SparkContext ``sc`` stopped. ``stopped``: set to end the
    wait early (for tests; a signal ends the process anyway)."""
    context.stop(stopSparkContext=False, stopGraceFully=True)
    stopped = stopped or threading.Event()
    deadline = time.monotonic() + wait_s
    waited = ran is not None and wait_s > 0
    while waited and not ran():
        if stopped.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))) or time.monotonic() >= deadline:
            log.info("handed over: no new leader completed a batch within %.1f s; stopping Spark now", wait_s)
            break
    sc.stop()
