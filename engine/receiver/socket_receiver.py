"""``socketTextStream``'s receiver: UTF-8 lines from a TCP server (Spark's SocketReceiver).

Unreliable, as in Spark: a line is stored when read and nothing is acknowledged, so lines in the
block being filled when the receiver's executor dies are lost (with the receiver WAL on, every
stored block survives). When the connection drops, the receiver restarts and reconnects.
"""

from __future__ import annotations

import logging
import socket
import threading

from .receiver import Receiver

log = logging.getLogger(__name__)


class SocketReceiver(Receiver):
    def __init__(self, host: str, port: int, storageLevel=None):
        super().__init__(storageLevel)
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
        self.host, self.port = host, port
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._running = False

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_sock"] = state["_thread"] = None
        state["_running"] = False
        return state

    def onStart(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._receive, name=f"socket-receiver-{self.port}", daemon=True)
        self._thread.start()

    def onStop(self) -> None:
        self._running = False
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _receive(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=30)
            sock.settimeout(None)
            self._sock = sock
            log.info("connected to %s:%d", self.host, self.port)
        except OSError as e:
            self.restart(f"Error connecting to {self.host}:{self.port}", e)
            return
        try:
            with sock.makefile("r", encoding="utf-8", errors="replace", newline="\n") as lines:
                for line in lines:
                    if not self._running:
                        return
                    self.store(line.rstrip("\n").rstrip("\r"))
            if self._running:
                self.restart("Socket data stream had no more data")
        except (OSError, ValueError) as e:
            if self._running:
                self.restart(f"Error receiving data from {self.host}:{self.port}", e)
