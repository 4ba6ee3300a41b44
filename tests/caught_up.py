"""The end of a crash app's recovery run: it stops as soon as it has caught up instead of running
out a fixed time (each second of a driver doing empty batches is CPU of the suite's budget)."""

from __future__ import annotations

import threading
import time


def run_until_caught_up(ssc, seconds: float, stop_when_caught_up: bool = True) -> None:
    """Start ``ssc`` and stop it gracefully after ``seconds`` or, with ``stop_when_caught_up``, once
    a batch that read nothing has completed: the test appended every line before the run, batches
    complete in order, so every record is in an earlier batch. A run that stopped early anyway is
    safe: the tests run the app again until every line is counted, checking after each run that
    nothing was counted twice."""
    from sparkwal.engine import StreamingListener

    caught_up = threading.Event()

    class CaughtUp(StreamingListener):
        def onBatchCompleted(self, e):
            if e.batchInfo().num_records == 0:
                caught_up.set()

    if stop_when_caught_up:
        ssc.addStreamingListener(CaughtUp())
    ssc.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not caught_up.is_set() and not ssc.awaitTerminationOrTimeout(0.1):
        pass
    ssc.stop(stopSparkContext=True, stopGraceFully=True)
