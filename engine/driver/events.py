"""The driver's event bus: everything the driver publishes goes through one :class:`EventBus`.

What happens in a driver (a batch submitted, started, completed, an output operation run, a
checkpoint written, a restart, a takeover, a fence, a receiver started, failing or stopped, the
app falling behind) is posted as one of :mod:`sparkwal.engine.listener`'s events. Subscribers are
:class:`sparkwal.engine.listener.StreamingListener` objects (``StreamingContext.addStreamingListener``
subscribes one; so do the driver's own watchers), each called on the callback the event names
(:data:`sparkwal.engine.listener.CALLBACKS`), in the order they subscribed, on the thread that posts
(the scheduler's, the checkpoint writer's, the receiver tracker's): keep callbacks short. A
subscriber that raises is logged and the others still hear of the event, as Spark's
``StreamingListenerBus`` does.
"""

from __future__ import annotations

import logging
import threading

from ..listener import CALLBACKS

log = logging.getLogger(__name__)


class EventBus:
    def __init__(self):
        self._subscribers: list = []
        self._lock = threading.Lock()

    def subscribe(self, listener) -> None:
        with self._lock:
            self._subscribers.append(listener)

    def unsubscribe(self, listener) -> None:
        with self._lock:
            if listener in self._subscribers:
                self._subscribers.remove(listener)

    def subscribers(self) -> list:
        with self._lock:
            return list(self._subscribers)

    def post(self, event) -> None:
        """Hand ``event`` to every subscriber's callback for its type."""
        callback = CALLBACKS[type(event)]
        for listener in self.subscribers():
            method = getattr(listener, callback, None)
            if method is None:  # a listener written against an older set of callbacks
                continue
            try:
                method(event)
            except Exception:  # noqa: BLE001
                log.warning("listener %r failed in %s", listener, callback, exc_info=True)
