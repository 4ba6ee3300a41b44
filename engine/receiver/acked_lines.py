"""A reliable receiver and its source: UTF-8 lines over TCP, acknowledged only once stored.

This module is the one description of the protocol. After wire.py's handshake (label
``sparkwal-acked-lines``, on a secret the source and the app share) the source sends chunks and
the receiver acknowledges them::

    source -> receiver   seq:u64 length:u32 payload        (lines joined by "\\n"; 1..MAX_CHUNK bytes)
    receiver -> source   seq:u64                            (every chunk up to seq is stored)

The receiver turns each chunk into one block with ``storeBlock`` and acknowledges it only after
``storeBlock`` returns, that is once the block is durable in the receiver WAL and recorded by the
driver. The source keeps every line not yet acknowledged and, when a receiver (re)connects, sends
them again from the oldest. So nothing acknowledged is ever lost, and the only duplicates are
chunks that were stored but whose acknowledgement did not reach the source before a crash; the
source counts the lines it re-sent (``statistics().lines_resent``), which bounds them. A stop
(a graceful one, a handover to a standby) is no crash: the receiver shuts its reading side, and
the chunk being stored is acknowledged before the connection closes (:meth:`AckedLineReceiver.onStop`).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass

from sparkwal.base.service import Service, spawn

from . import wire
from ..sources.protocol import SourceError
from .receiver import Receiver
from .socket_server import SocketServer

log = logging.getLogger(__name__)

LABEL = b"sparkwal-acked-lines"
MAX_CHUNK = 4 << 20
STOP_WAIT_S = 10.0  # a stop's wait for the chunk being stored to be acknowledged
CLOSE_DRAIN_S = 0.5  # then, the wait for the source to close its side (what it sends meanwhile is dropped)
_CHUNK = struct.Struct(">QI")
_ACK = struct.Struct(">Q")


def _secret_bytes(secret: bytes | str) -> bytes:
    return secret.encode() if isinstance(secret, str) else bytes(secret)


@dataclass(frozen=True)
class SourceStatistics:
    lines_offered: int
    lines_acked: int
    lines_sent: int
    lines_resent: int  #: sent again after a reconnect (an upper bound on duplicates)
    connections: int
    rejected_connections: int


class AckedLineSource:
    """The sending side: lines given to ``offer`` are sent in chunks of up to ``chunk_lines`` to
    the one connected receiver and kept until acknowledged. ``offer`` blocks while
    ``max_unacked`` lines wait for acknowledgement (back-pressure to the producer)."""

    def __init__(self, secret: bytes | str, host: str = "127.0.0.1", port: int = 0, *,
                 chunk_lines: int = 1000, max_unacked: int = 1_000_000):
        self._secret = _secret_bytes(secret)
        self._chunk, self._max_unacked = chunk_lines, max_unacked
        self._cond = threading.Condition()
        self._lines: deque[str] = deque()  # unacknowledged, oldest first; index 0 = line _base
        self._base = 0  # number of lines acknowledged
        self._offered = 0
        self._sent_upto = 0  # lines handed to the current connection
        self._high_sent = 0  # the furthest line ever sent
        self._chunks: dict[int, int] = {}  # seq -> line number after the chunk
        self._seq = 0
        self._conn: socket.socket | None = None
        self._stats = dict(lines_sent=0, lines_resent=0, connections=0, rejected_connections=0)
        self._closed = False
        # one connection at a time, its handshake on the accept thread: a newer one replaces it
        self._server = SocketServer("acked-line-source", self._accept, host, port, threaded=False)
        self.address = self._server.address
        self._server.start()

    def offer(self, lines) -> None:
        for line in lines:
            if "\n" in line:
                raise ValueError(f"a line cannot contain a newline: {line!r}")
            with self._cond:
                while len(self._lines) >= self._max_unacked and not self._closed:
                    self._cond.wait(0.5)
                self._lines.append(line)
                self._offered += 1
                self._cond.notify_all()

    def statistics(self) -> SourceStatistics:
        with self._cond:
            return SourceStatistics(self._offered, self._base, self._stats["lines_sent"],
                                    self._stats["lines_resent"], self._stats["connections"],
                                    self._stats["rejected_connections"])

    def wait_acked(self, n: int, timeout_s: float) -> bool:
        """True once ``n`` lines are acknowledged."""
        with self._cond:
            return self._cond.wait_for(lambda: self._base >= n, timeout_s)

    def wait_connections(self, n: int, timeout_s: float) -> bool:
        """True once ``n`` receivers have connected (handshake done) since the source started."""
        with self._cond:
            return self._cond.wait_for(lambda: self._stats["connections"] >= n, timeout_s)

    def _accept(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.settimeout(wire.HANDSHAKE_TIMEOUT_S)
            wire.server_handshake(sock, self._secret, LABEL)
            sock.settimeout(None)
        except (wire.ProtocolError, OSError) as e:
            log.warning("acked-line source: dropped %s: %s", peer, e)
            with self._cond:
                self._stats["rejected_connections"] += 1
            sock.close()
            return
        with self._cond:
            old, self._conn = self._conn, sock
            self._sent_upto = self._base  # resend everything not acknowledged
            self._stats["connections"] += 1
            self._cond.notify_all()
        if old is not None:
            _close(old)
        spawn("acked-lines-send", self._send_loop, sock)
        spawn("acked-lines-acks", self._ack_loop, sock)

    def _send_loop(self, sock: socket.socket) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._conn is not sock or self._closed
                                        or self._sent_upto < self._base + len(self._lines), 0.5)
                    if self._conn is not sock or self._closed:
                        return
                    start = self._sent_upto - self._base
                    if start < 0:
                        start, self._sent_upto = 0, self._base
                    lines = [self._lines[i] for i in range(start, min(len(self._lines), start + self._chunk))]
                    if not lines:
                        continue
                    self._seq += 1
                    seq, self._sent_upto = self._seq, self._sent_upto + len(lines)
                    self._chunks[seq] = self._sent_upto
                    resent = max(0, min(self._high_sent, self._sent_upto) - (self._sent_upto - len(lines)))
                    self._high_sent = max(self._high_sent, self._sent_upto)
                    self._stats["lines_sent"] += len(lines)
                    self._stats["lines_resent"] += resent
                payload = "\n".join(lines).encode("utf-8")
                sock.sendall(_CHUNK.pack(seq, len(payload)) + payload)
        except OSError:
            return

    def _ack_loop(self, sock: socket.socket) -> None:
        try:
            while True:
                (seq,) = _ACK.unpack(wire.recv_exact(sock, _ACK.size))
                with self._cond:
                    end = self._chunks.get(seq)
                    if end is None:
                        log.warning("acked-line source: ignoring an acknowledgement of unknown chunk %d", seq)
                        continue
                    for s in [s for s in self._chunks if s <= seq]:
                        del self._chunks[s]
                    while self._base < end and self._lines:
                        self._lines.popleft()
                        self._base += 1
                    self._cond.notify_all()
        except (OSError, ConnectionError):
            with self._cond:
                if self._conn is sock:
                    self._conn = None
            _close(sock)

    def close(self) -> None:
        self._closed = True
        self._server.stop()
        with self._cond:
            conn, self._conn = self._conn, None
            self._cond.notify_all()
        if conn is not None:
            _close(conn)


def _close(sock: socket.socket, drain_s: float = 0.0) -> None:
    """Close ``sock``; with ``drain_s``, first end the sending side and read what is left for up to
    that long: closing with unread bytes (the source's next chunk) sends a reset, which may discard
    the last acknowledgement before the source reads it."""
    try:
        if drain_s > 0:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(drain_s)
            deadline = time.monotonic() + drain_s
            while time.monotonic() < deadline and sock.recv(1 << 16):
                pass
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class AckedLineReceiver(Receiver):
    """The reliable receiver of an :class:`AckedLineSource`: one block per chunk, acknowledged
    after ``storeBlock`` returns. The secret is given directly, or (better: it then does not
    travel with the task) named by ``secret_env``, an environment variable set on executors."""

    def __init__(self, host: str, port: int, secret: bytes | str | None = None, *,
                 secret_env: str | None = None, storageLevel=None):
        super().__init__(storageLevel)
        if (secret is None) == (secret_env is None):
            raise ValueError("give exactly one of secret and secret_env")
        self.host, self.port = host, port
        self._secret = None if secret is None else _secret_bytes(secret)
        self.secret_env = secret_env
        self._sock: socket.socket | None = None
        self._running: object | None = None  # this start's token: a thread of an earlier start ends
        self._receiving: Service | None = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_sock"], state["_running"], state["_receiving"] = None, None, None
        return state

    def _secret_value(self) -> bytes:
        if self._secret is not None:
            return self._secret
        value = os.environ.get(self.secret_env or "")
        if not value:
            raise SourceError(f"environment variable {self.secret_env} (the source's secret) is not set")
        return _secret_bytes(value)

    def onStart(self) -> None:
        self._running = token = object()
        self._receiving = spawn(f"acked-lines-{self.port}", self._receive, token)

    def onStop(self) -> None:
        """Stop receiving. A chunk being stored is still acknowledged: the connection's reading side
        is shut (the wait for the next chunk ends), and the receiving thread, which then sends the
        acknowledgement and closes the connection, is waited for (up to ``STOP_WAIT_S``). Closing
        the connection at once would leave a chunk stored but unacknowledged, sent again to the next
        receiver: a duplicate at every stop that met a chunk, where only a crash may leave one."""
        self._running = None
        sock, receiving = self._sock, self._receiving
        if sock is None:  # (connecting: it closes the connection itself once made)
            return
        try:
            sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass
        if receiving is not None and not receiving.join(STOP_WAIT_S):
            log.warning("acked-line receiver: a chunk from %s:%d was still being stored after %.0f s; "
                        "closing (the source sends it again)", self.host, self.port, STOP_WAIT_S)
            _close(sock)

    def _failed(self, token: object, message: str, error: BaseException) -> None:
        """Restart this receiver, unless it was stopped or started again since ``token``'s start."""
        if self._running is token and not self.isStopped():
            self.restart(message, error)

    def _receive(self, token: object) -> None:
        sock = None
        try:
            sock = socket.create_connection((self.host, self.port), timeout=30)
            sock.settimeout(wire.HANDSHAKE_TIMEOUT_S)
            wire.client_handshake(sock, self._secret_value(), LABEL)
            sock.settimeout(None)
        except (OSError, wire.ProtocolError, RuntimeError) as e:
            if sock is not None:
                _close(sock)
            self._failed(token, f"Error connecting to {self.host}:{self.port}", e)
            return
        self._sock = sock
        if self._running is not token:  # (stopped while connecting)
            self._sock = None
            _close(sock)
            return
        try:
            while self._running is token:
                seq, n = _CHUNK.unpack(wire.recv_exact(sock, _CHUNK.size))
                if not 0 < n <= MAX_CHUNK:
                    raise wire.ProtocolError(f"chunk {seq} of {n} bytes outside 1..{MAX_CHUNK}")
                lines = wire.recv_exact(sock, n).decode("utf-8", errors="replace").split("\n")
                self.storeBlock(lines, {"seq": seq})  # durable and recorded when it returns
                sock.sendall(_ACK.pack(seq))
        except (OSError, ConnectionError, wire.ProtocolError) as e:
            self._failed(token, f"Error receiving from {self.host}:{self.port}", e)
        except RuntimeError as e:  # storeBlock failed (or the receiver stopped): nothing acknowledged
            self._failed(token, "Could not store a block", e)
        finally:
            if self._sock is sock:
                self._sock = None
            _close(sock, drain_s=CLOSE_DRAIN_S)
