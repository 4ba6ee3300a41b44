"""Saying that the app falls behind: a batch's scheduling delay (Spark's: from its submission to
its start) that passes a few batch intervals means batches arrive faster than they run, and the
delay only grows. Spark shows it in its UI and says nothing; a user learns it from a stale output.

The context's :class:`BacklogWatch` measures each batch as it starts and says so once (a warning
line naming the delay and the backlog, and an ``onBacklog`` listener event), again at most once a
minute while the delay keeps growing, and once when it is back under one batch interval.
``spark.sparkwal.backlog.warnIntervals`` (default 3) sets the threshold in batch intervals; 0
turns it off.
"""

from __future__ import annotations

import logging

from ..listener import StreamingListener, StreamingListenerBacklog

log = logging.getLogger(__name__)

REPEAT_MS = 60_000  # "still behind" at most this often


class BacklogWatch(StreamingListener):
    """Subscribed by the context; ``backlog()`` counts the batches due and not started, ``post``
    hands an event to the listeners, ``clock`` is the context's (a ManualClock in tests)."""

    def __init__(self, batch_ms: int, warn_intervals: float, clock, backlog, post):
        self.batch_ms, self.threshold_ms = batch_ms, warn_intervals * batch_ms
        self._clock, self._backlog, self._post = clock, backlog, post
        self.behind = False
        self._said_ms = 0  # when it last said so (clock time)
        self._said_delay_ms = 0  # the delay it last named

    def onBatchStarted(self, batchStarted) -> None:
        info = batchStarted.batchInfo()
        delay = info.scheduling_delay_ms
        if delay is None or self.threshold_ms <= 0:
            return
        now = self._clock.now_ms()
        if not self.behind and delay > self.threshold_ms:
            self.behind = True
            self._say("falling_behind", delay, info.batch_time_ms, now)
        elif self.behind and delay <= self.batch_ms:
            self.behind = False
            self._say("caught_up", delay, info.batch_time_ms, now)
        elif self.behind and delay > self._said_delay_ms and now - self._said_ms >= REPEAT_MS:
            self._say("still_behind", delay, info.batch_time_ms, now)

    def _say(self, state: str, delay_ms: int, batch_ms: int, now_ms: int) -> None:
        backlog = self._backlog()
        self._said_ms, self._said_delay_ms = now_ms, delay_ms
        if state == "caught_up":
            log.warning("caught up: scheduling delay back to %.1f s", delay_ms / 1000)
        else:
            log.warning("%s: scheduling delay %.1f s (%.0f batch intervals), %d batches queued or running; "
                        "batches take longer than the %.1f s interval",
                        "falling behind" if state == "falling_behind" else "still behind",
                        delay_ms / 1000, delay_ms / self.batch_ms, backlog, self.batch_ms / 1000)
        self._post(StreamingListenerBacklog(state, delay_ms, backlog, batch_ms))
