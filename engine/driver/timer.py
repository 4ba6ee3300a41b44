"""The batch timer: Spark's ``RecurringTimer`` (streaming/src/main/scala/org/apache/spark/streaming/
util/RecurringTimer.scala), on an injectable clock: calls back at every multiple of its period,
each time once, after the one before has returned."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sparkwal.base.service import Service


class RecurringTimer:
    def __init__(self, clock, period_ms: int, callback: Callable[[int], None], name: str):
        self._clock, self.period_ms, self._callback, self.name = clock, period_ms, callback, name
        self._next: int | None = None
        self.last_fired_ms: int | None = None
        self.first_ms: int | None = None  # the first time it fires
        self._stopped = threading.Event()
        self._thread: Service | None = None

    def start_time(self) -> int:
        """The next multiple of the period strictly after now."""
        return (self._clock.now_ms() // self.period_ms + 1) * self.period_ms

    def restart_time(self, zero_ms: int) -> int:
        now = self._clock.now_ms()
        return zero_ms + ((now - zero_ms) // self.period_ms + 1) * self.period_ms

    def start(self, first_ms: int) -> None:
        self._next = self.first_ms = first_ms
        self._thread = Service(self.name, self._loop).start()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            now = self._clock.wait_till_ms(self._next, timeout_s=0.05)
            if now >= self._next and not self._stopped.is_set():
                self._callback(self._next)
                self.last_fired_ms = self._next
                self._next += self.period_ms

    def stop(self) -> int | None:
        """Stop after the callback in progress, if any; return the last time fired."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        return self.last_fired_ms
