"""Saying that the app falls behind, or is catching up: a batch's scheduling delay (Spark's: from its
submission to its start) that passes a few batch intervals means batches are waiting. Spark shows it in
its UI and says nothing; a user learns it from a stale output.

Waiting batches mean one of two things, and the context's :class:`BacklogWatch` tells them apart by
how long the recent batches took to run. Batches that run in less than the interval are catching up
on a backlog (a restart's batches missed while the app was down, a burst of input): it says so once,
with when it will be back on time (``n`` batches due, each run in ``p`` of the interval ``b``, while
new ones keep coming: back in about ``n * p / (1 - p / b)``). Batches that take the
interval or longer fall behind, and the delay only grows: it says so once (a warning line naming the
delay and the backlog), again at most once a minute while the delay keeps growing. Either way it
says when the delay is back under one batch interval. Each is also an ``onBacklog`` listener event
(``state``: "catching_up", "falling_behind", "still_behind", "caught_up").
``spark.sparkwal.backlog.warnIntervals`` (default 3) sets the threshold in batch intervals; 0
turns it off. Until two batches have completed nothing is said: how long batches take is not known yet
(a restart's first batch warms up). From catching up to falling behind, or back, at most once a minute.
"""

from __future__ import annotations

import logging
from collections import deque

from ..listener import StreamingListener, StreamingListenerBacklog

log = logging.getLogger(__name__)

REPEAT_MS = 60_000  # "still behind" at most this often
RECENT_BATCHES = 5  # how long batches take: the mean of the last few completed
MIN_SAMPLES = 2  # ... once this many have (a restart's first batch, warming up, is slow)


class BacklogWatch(StreamingListener):
    """Subscribed by the context; ``backlog()`` counts the batches due and not started, ``post``
    hands an event to the listeners, ``clock`` is the context's (a ManualClock in tests)."""

    def __init__(self, batch_ms: int, warn_intervals: float, clock, backlog, post):
        self.batch_ms, self.threshold_ms = batch_ms, warn_intervals * batch_ms
        self._clock, self._backlog, self._post = clock, backlog, post
        self.state: str | None = None  # None: on time; "catching_up" or "falling_behind"
        self._said_ms = 0  # when it last said so (clock time)
        self._said_delay_ms = 0  # the delay it last named
        self._processing_ms: deque[int] = deque(maxlen=RECENT_BATCHES)

    @property
    def behind(self) -> bool:
        return self.state is not None

    def onBatchCompleted(self, batchCompleted) -> None:
        took = batchCompleted.batchInfo().processing_delay_ms
        if took is not None:
            self._processing_ms.append(took)

    def processing_ms(self) -> float | None:
        """How long the recent batches took to run (None: too few completed yet)."""
        n = len(self._processing_ms)
        return sum(self._processing_ms) / n if n >= MIN_SAMPLES else None

    def onBatchStarted(self, batchStarted) -> None:
        info = batchStarted.batchInfo()
        delay, took = info.scheduling_delay_ms, self.processing_ms()
        if delay is None or self.threshold_ms <= 0:
            return
        now = self._clock.now_ms()
        if self.state is not None and delay <= self.batch_ms:
            self.state = None
            self._say("caught_up", delay, info.batch_time_ms, now, took)
        elif delay > self.threshold_ms and took is not None:
            state = "catching_up" if took < self.batch_ms else "falling_behind"
            if state != self.state and (self.state is None or now - self._said_ms >= REPEAT_MS):
                self.state = state  # (from one to the other at most once a minute: a mean near the interval)
                self._say(state, delay, info.batch_time_ms, now, took)
            elif state == "falling_behind" and delay > self._said_delay_ms and now - self._said_ms >= REPEAT_MS:
                self._say("still_behind", delay, info.batch_time_ms, now, took)

    def _say(self, state: str, delay_ms: int, batch_ms: int, now_ms: int, took_ms: float | None) -> None:
        backlog = self._backlog()
        self._said_ms, self._said_delay_ms = now_ms, delay_ms
        if state == "caught_up":
            log.warning("caught up: scheduling delay back to %.1f s", delay_ms / 1000)
        elif state == "catching_up":
            back_s = backlog * took_ms / (1 - took_ms / self.batch_ms) / 1000
            log.warning("catching up: %d batches due (scheduling delay %.1f s); batches take %.1f s of the %.1f s "
                        "interval, back on time in %s", backlog, delay_ms / 1000, took_ms / 1000,
                        self.batch_ms / 1000, f"about {back_s:.0f} s" if back_s < 3600 else "more than an hour")
        else:
            log.warning("%s: scheduling delay %.1f s (%.0f batch intervals), %d batches queued or running; "
                        "batches take %.1f s, longer than the %.1f s interval",
                        "falling behind" if state == "falling_behind" else "still behind",
                        delay_ms / 1000, delay_ms / self.batch_ms, backlog, took_ms / 1000, self.batch_ms / 1000)
        self._post(StreamingListenerBacklog(state, delay_ms, backlog, batch_ms))
