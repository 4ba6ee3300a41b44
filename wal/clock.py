"""Clocks. Every time-dependent class takes one, so tests can drive time by hand."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch (or since any fixed origin, for manual clocks)."""

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never jumps (leases count on it: a wall clock set back
        or forward must not lengthen or shorten one); a manual clock's own time."""

    def wait_till_ms(self, target_ms: int, timeout_s: float | None = None) -> int:
        """Block until ``now_ms() >= target_ms`` (or ``timeout_s`` of real time passed);
        return the time reached, which is before ``target_ms`` only after a timeout."""


#: Linux's monotonic clock that counts a suspended machine's sleep too (a leader whose VM was
#: suspended past its lease must know it on waking); elsewhere the monotonic clock
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class SystemClock:
    """Wall-clock time (and, for leases, a monotonic one: :meth:`monotonic_ms`)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.clock_gettime_ns(_BOOTTIME) // 1_000_000

    def wait_till_ms(self, target_ms: int, timeout_s: float | None = None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            now = self.now_ms()
            if now >= target_ms:
                return now
            pause = min((target_ms - now) / 1000.0, 0.1)
            if deadline is not None:
                pause = min(pause, deadline - time.monotonic())
                if pause <= 0:
                    return now
            time.sleep(pause)


class ManualClock:
    """A clock that only moves when told to: ``advance``/``set_ms`` wake any waiters."""

    def __init__(self, start_ms: int = 0):
        self._now = start_ms
        self._cond = threading.Condition()

    def now_ms(self) -> int:
        with self._cond:
            return self._now

    def monotonic_ms(self) -> int:
        return self.now_ms()

    def set_ms(self, ms: int) -> None:
        with self._cond:
            self._now = ms
            self._cond.notify_all()

    def advance(self, ms: int) -> None:
        with self._cond:
            self._now += ms
            self._cond.notify_all()

    def wait_till_ms(self, target_ms: int, timeout_s: float | None = None) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._now >= target_ms, timeout_s)
            return self._now


SYSTEM_CLOCK = SystemClock()


def monotonic_ms(clock: Clock) -> int:
    """``clock``'s monotonic time (its ``now_ms`` for a clock that has no separate one)."""
    read = getattr(clock, "monotonic_ms", None)
    return read() if read is not None else clock.now_ms()
