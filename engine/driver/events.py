"""The driver's event bus: everything the driver publishes goes through one :class:`EventBus`.

What happens in a driver (a batch submitted, started, completed, an output operation run, a
checkpoint written, a restart, a takeover, a fence, a receiver started, failing or stopped, the
app falling behind) is posted as one of :mod:`sparkwal.engine.listener`'s events. Subscribers are
:class:`sparkwal.engine.listener.StreamingListener` objects, each called on the callback the event
names (:data:`sparkwal.engine.listener.CALLBACKS`). A subscriber that raises is logged and the
others still hear of the event, as Spark's ``StreamingListenerBus`` does.

Two kinds of subscriber:

* **queued** (``subscribe(listener, queued=True)``; every listener ``addStreamingListener`` adds):
  called on the bus's own thread, in the order the events were posted, as Spark's
  ``AsyncEventQueue`` does, so a slow listener never stalls a batch, the checkpoint writer or the
  receivers. The queue holds ``spark.scheduler.listenerbus.eventqueue.capacity`` events (Spark's
  key and default, 10,000); past that, events are dropped for the queued listeners, counted
  (:meth:`EventBus.statistics`) and logged: once at the first drop, then at most once a minute
  with the count, as Spark logs them. ``stop()`` delivers what is queued before it returns.
* **synchronous** (the default; the driver's own watchers: the UI's recorder, the backlog watch):
  called on the posting thread before ``post`` returns. They must be cheap.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

from sparkwal.base.service import Service

from ..listener import CALLBACKS

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 10_000
DROP_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class EventBusStatistics:
    """``posted``: events posted; ``delivered``: handed to the queued listeners; ``dropped``:
    not handed to them because the queue was full; ``queued``: waiting now; ``capacity``."""
    posted: int
    delivered: int
    dropped: int
    queued: int
    capacity: int


def deliver(listeners: list, event) -> None:
    """Call each listener's callback for ``event`` (a failing one is logged, the others still hear)."""
    callback = CALLBACKS[type(event)]
    for listener in listeners:
        method = getattr(listener, callback, None)
        if method is None:  # a listener written against an older set of callbacks
            continue
        try:
            method(event)
        except Exception:  # noqa: BLE001
            log.warning("listener %r failed in %s", listener, callback, exc_info=True)


class EventBus:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock=time.monotonic):
        if capacity < 1:
            raise ValueError(f"an event queue holds at least 1 event, got {capacity}")
        self._capacity = capacity
        self._clock = clock
        self._synchronous: list = []
        self._queued_listeners: list = []
        self._lock = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._thread: Service | None = None
        self._stopped = False
        self._busy = False  # the bus's thread is delivering an event
        self._posted = self._delivered = self._dropped = 0
        self._dropped_since_log = 0
        self._last_drop_log: float | None = None

    def subscribe(self, listener, *, queued: bool = False) -> None:
        with self._lock:
            (self._queued_listeners if queued else self._synchronous).append(listener)
            if queued and self._thread is None and not self._stopped:
                self._thread = Service("sparkwal-listener-bus", self._run).start()

    def unsubscribe(self, listener) -> None:
        with self._lock:
            for listeners in (self._synchronous, self._queued_listeners):
                if listener in listeners:
                    listeners.remove(listener)

    def queued_subscribers(self) -> list:
        """The listeners called on the bus's own thread (a program's, ``addStreamingListener``)."""
        with self._lock:
            return list(self._queued_listeners)

    def subscribers(self) -> list:
        with self._lock:
            return [*self._synchronous, *self._queued_listeners]

    def post(self, event) -> None:
        """Hand ``event`` to the synchronous subscribers now and queue it for the others."""
        CALLBACKS[type(event)]  # an unknown event type fails here, on the poster's thread
        with self._lock:
            self._posted += 1
            synchronous = list(self._synchronous)
            if self._queued_listeners and not self._stopped:
                if len(self._queue) < self._capacity:
                    self._queue.append(event)
                    self._lock.notify_all()
                else:
                    self._drop()
        deliver(synchronous, event)

    def _drop(self) -> None:
        """Under the lock: one event not queued (Spark's AsyncEventQueue.onDropEvent)."""
        self._dropped += 1
        self._dropped_since_log += 1
        now = self._clock()
        if self._last_drop_log is None:
            log.error("dropping an event from the listener bus: a listener is too slow to keep up "
                      "with the stream (the queue holds spark.scheduler.listenerbus.eventqueue.capacity "
                      "= %d events)", self._capacity)
        elif now - self._last_drop_log >= DROP_LOG_INTERVAL_S:
            log.warning("dropped %d listener events in the last %.0f s (%d in all): a listener is "
                        "too slow", self._dropped_since_log, now - self._last_drop_log, self._dropped)
        else:
            return
        self._last_drop_log = now
        self._dropped_since_log = 0

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stopped:
                    self._lock.wait()
                if not self._queue:
                    return
                event = self._queue.popleft()
                listeners = list(self._queued_listeners)
                self._busy = True
            try:
                deliver(listeners, event)
            finally:
                with self._lock:
                    self._busy = False
                    self._delivered += 1
                    self._lock.notify_all()

    def wait_until_empty(self, timeout: float | None = None) -> bool:
        """Whether every queued event was delivered within ``timeout`` seconds (Spark's
        ``LiveListenerBus.waitUntilEmpty``)."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._lock:
            while self._queue or self._busy:
                if self._thread is not None and self._thread.is_current():
                    return not self._queue  # called from a listener: this event is the last
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def stop(self, timeout: float | None = None) -> None:
        """Deliver what is queued (within ``timeout``), then end the bus's thread. Called from a
        listener (a callback that stops the context), it does not wait for itself."""
        self.wait_until_empty(timeout)
        with self._lock:
            self._stopped = True
            left = len(self._queue)
            self._lock.notify_all()
            thread = self._thread
        if left:
            log.warning("stopping: %d listener events are still queued after %s s (a listener is slow "
                        "or stuck); they are delivered as the listener gets to them", left, timeout)
        if thread is not None:
            thread.join(timeout)

    def statistics(self) -> EventBusStatistics:
        with self._lock:
            return EventBusStatistics(self._posted, self._delivered, self._dropped, len(self._queue),
                                      self._capacity)
