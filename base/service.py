"""One way to run a background thread: :class:`Service`.

Every thread sparkwal starts (WAL writers, the checkpoint writer, the event log, timers, lease
renewal, the standby, receivers, socket servers and their connections) is a :class:`Service`: a
name (what a thread dump and a warning show), a ``stopping`` event its loop may wait on, ``start``,
``stop`` and ``join`` with a deadline. ``join`` never waits for the calling thread itself (a
service stopped from its own thread, as a failing loop may, returns at once) nor for a thread
that was not started, and says whether the thread ended; ``stop`` past its deadline logs one
warning naming the thread instead of hanging a shutdown. Importable by every room.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Service:
    """``target(*args)`` on a thread named ``name`` (a daemon unless ``daemon=False``)."""

    def __init__(self, name: str, target: Callable[..., Any], *args: Any, daemon: bool = True):
        self.name = name
        self.stopping = threading.Event()  # set by stop(): the loop's cue to end
        self._thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)

    def start(self) -> Service:
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def is_current(self) -> bool:
        """Whether the caller runs on this service's thread."""
        return self._thread is threading.current_thread()

    def stop(self, timeout: float | None = None) -> bool:
        """Set :attr:`stopping`, then :meth:`join` with ``timeout``; a thread still running then is
        named in one warning (and left: a daemon thread ends with the process)."""
        self.stopping.set()
        if self.join(timeout):
            return True
        log.warning("thread %r did not end within %s s; left running", self.name, timeout)
        return False

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for the thread to end; True once it has
        (or was never started, or the caller is the thread itself)."""
        if self._thread.ident is None or self.is_current():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


def spawn(name: str, target: Callable[..., Any], *args: Any) -> Service:
    """Start ``target(*args)`` on a daemon thread of its own, now (a one-off task: a connection,
    a restart, a stop requested by a signal)."""
    return Service(name, target, *args).start()
