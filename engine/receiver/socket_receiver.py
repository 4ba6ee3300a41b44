"""``socketTextStream``'s receiver: UTF-8 lines from a TCP server (Spark's SocketReceiver).

Unreliable, as in Spark: a line is stored when read and nothing is acknowledged, so lines in the
block being filled when the receiver's executor dies are lost (with the receiver WAL on, every
stored block survives). When the connection drops, the receiver restarts and reconnects.
"""

from __future__ import annotations

import logging
import socket

from sparkwal.base.service import Service, spawn

from .receiver import Receiver

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


class SocketReceiver(Receiver):
    def __init__(self, host: str, port: int, storageLevel=None):
        super().__init__(storageLevel)
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
        self.host, self.port = host, port
        self._sock: socket.socket | None = None
        self._thread: Service | None = None
        self._running = False

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_sock"] = state["_thread"] = None
        state["_running"] = False
        return state

    def sourceIdentity(self) -> str:
        return f"SocketReceiver({self.host}:{self.port})"

    def onStart(self) -> None:
        self._running = True
        self._thread = spawn(f"socket-receiver-{self.port}", self._receive)

    def onStop(self) -> None:
        self._running = False
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _read_lines(self, sock: socket.socket) -> None:
        """Read in large chunks; store whole lines only (decoded as UTF-8, invalid bytes replaced),
        many at a time: one call per chunk instead of one per line."""
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        pending = b""
        while self._running:
            n = sock.recv_into(view)
            if n == 0:
                if pending and self._running:
                    self.store(pending.decode("utf-8", errors="replace").rstrip("\r"))
                return
            data = pending + view[:n] if pending else bytes(view[:n])
            end = data.rfind(b"\n")
            if end < 0:
                pending = data
                continue
            pending = data[end + 1:]
            text = data[:end].decode("utf-8", errors="replace")
            lines = text.split("\n")
            if "\r" in text:
                lines = [line.rstrip("\r") for line in lines]
            self.storeMany(lines)

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
            self._read_lines(sock)
            if self._running:
                self.restart("Socket data stream had no more data")
        except (OSError, ValueError) as e:
            if self._running:
                self.restart(f"Error receiving data from {self.host}:{self.port}", e)
