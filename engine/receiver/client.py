"""A receiver's connection to the driver's endpoint (executor side)."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable

from sparkwal.base.service import Service

from . import wire
from .endpoint import LABEL
from ..errors import EngineError

log = logging.getLogger(__name__)


class DriverUnreachableError(EngineError, ConnectionError):
    """The driver's endpoint is gone (the driver died or stopped): the receiver must stop."""


class DriverConnection:
    """Requests with replies (``request``), one-way messages (``tell``), and the driver's own
    messages delivered to ``on_message(kind, args)`` on a reader thread; ``on_close`` runs once
    when the connection ends for any reason."""

    def __init__(self, address: tuple[str, int], secret: bytes, *,
                 on_message: Callable[[int, list], None], on_close: Callable[[], None],
                 connect_timeout_s: float = 30.0):
        self._sock = socket.create_connection((address[0], address[1]), timeout=connect_timeout_s)
        self._sock.settimeout(wire.HANDSHAKE_TIMEOUT_S)
        wire.client_handshake(self._sock, secret, LABEL)
        self._sock.settimeout(None)
        self._on_message, self._on_close = on_message, on_close
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._waiting: dict[int, list] = {}  # request id -> [event, reply]
        self.closed = False
        self._reader = Service("receiver-driver-conn", self._read_loop).start()

    def _read_loop(self) -> None:
        try:
            while True:
                kind, request_id, args = wire.read_frame(self._sock)
                if kind == wire.REPLY:
                    with self._lock:
                        slot = self._waiting.pop(request_id, None)
                    if slot is not None:
                        slot[1] = args
                        slot[0].set()
                    continue
                if kind not in (wire.STOP_RECEIVER, wire.CLEANUP_OLD_BLOCKS, wire.UPDATE_RATE_LIMIT):
                    raise wire.ProtocolError(f"{wire.NAMES[kind]} is not a message the driver sends")
                try:
                    self._on_message(kind, args)
                except Exception:  # noqa: BLE001
                    log.warning("handling %s from the driver failed", wire.NAMES[kind], exc_info=True)
        except (ConnectionError, OSError, wire.ProtocolError) as e:
            if not self.closed:
                log.warning("connection to the driver ended: %s", e)
        finally:
            self.closed = True
            with self._lock:
                waiting, self._waiting = self._waiting, {}
            for slot in waiting.values():
                slot[0].set()  # reply stays None: the request fails
            try:
                self._sock.close()
            finally:
                self._on_close()

    def request(self, kind: int, args: list, timeout_s: float | None = None) -> tuple[bool, str]:
        """Send and wait for the driver's reply ``(ok, message)``; DriverUnreachableError if the
        connection ends first."""
        if self.closed:
            raise DriverUnreachableError("the connection to the driver is closed")
        request_id = next(self._ids)
        slot: list = [threading.Event(), None]
        with self._lock:
            self._waiting[request_id] = slot
        self._send(kind, args, request_id)
        if not slot[0].wait(timeout_s):
            with self._lock:
                self._waiting.pop(request_id, None)
            raise TimeoutError(f"no reply from the driver to {wire.NAMES[kind]} within {timeout_s} s")
        if slot[1] is None:
            raise DriverUnreachableError(f"the driver went away before replying to {wire.NAMES[kind]}")
        ok, message = slot[1]
        return ok, message

    def tell(self, kind: int, args: list) -> None:
        self._send(kind, args, 0)

    def _send(self, kind: int, args: list, request_id: int) -> None:
        frame = wire.encode_frame(kind, request_id, args)
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as e:
            raise DriverUnreachableError(f"cannot reach the driver: {e}") from None

    def close(self) -> None:
        self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.stop(5)
