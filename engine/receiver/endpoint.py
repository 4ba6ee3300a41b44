"""The driver's receiver endpoint: a TCP server that receivers' tasks connect to.

It listens on ``spark.driver.host``, authenticates every connection (wire.py's handshake on the
application's secret), then reads frames and hands each message to a handler (the
ReceiverTracker). Anything else is dropped and logged, and changes nothing: a peer that fails the
handshake, a garbage or oversize frame, a message of an unknown kind or with wrong argument
types. Replies and the driver's own messages (StopReceiver, CleanupOldBlocks, UpdateRateLimit) go
back on the same connection. One thread per connection; the number of connections is bounded.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Protocol

from . import wire
from .socket_server import SocketServer

log = logging.getLogger(__name__)

LABEL = b"sparkwal-receiver-endpoint"


@dataclass(frozen=True)
class EndpointStatistics:
    connections_accepted: int = 0
    connections_open: int = 0
    authentication_failures: int = 0  #: peers that did not prove the secret (dropped)
    protocol_errors: int = 0  #: authenticated peers that sent something malformed (dropped)
    connections_refused: int = 0  #: over max_connections (dropped)
    messages: int = 0  #: well-formed messages handled


class Handler(Protocol):
    def on_register(self, conn: Connection, stream_id: int, typ: str, host: str,
                    executor_id: str, worker_pid: int) -> tuple[bool, str]: ...

    def on_add_block(self, conn: Connection, block: list, host: str, executor_id: str,
                     size: int, copies: list, results: list) -> tuple[bool, str]: ...

    def on_report_error(self, conn: Connection, stream_id: int, message: str, error: str | None) -> None: ...

    def on_recorded_up_to(self, conn: Connection, stream_id: int, batch_ms: int) -> None: ...

    def on_deregister(self, conn: Connection, stream_id: int, message: str, error: str | None) -> None: ...

    def on_disconnect(self, conn: Connection) -> None: ...


class Connection:
    """One authenticated receiver connection; ``send`` is thread-safe."""

    def __init__(self, sock: socket.socket, peer: str):
        self._sock = sock
        self.peer = peer
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, kind: int, args: list | tuple = (), request_id: int = 0) -> bool:
        """False if the connection is gone (the receiver will learn it from its side)."""
        frame = wire.encode_frame(kind, request_id, args)
        try:
            with self._send_lock:
                self._sock.sendall(frame)
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __repr__(self) -> str:
        return f"<receiver connection from {self.peer}>"


class ReceiverEndpoint:
    """Listens on ``host`` (port 0: any free port); ``address`` is what receivers connect to."""

    def __init__(self, handler: Handler, secret: bytes, host: str = "127.0.0.1", port: int = 0, *,
                 max_connections: int = 256, handshake_timeout_s: float = wire.HANDSHAKE_TIMEOUT_S):
        self._handler = handler
        self._secret = secret
        self._handshake_timeout = handshake_timeout_s
        self._lock = threading.Lock()
        self._conns: set[Connection] = set()
        self._stats = EndpointStatistics()
        self._stopped = False
        self._server = SocketServer("receiver-endpoint", self._serve, host, port, max_connections=max_connections,
                                    on_refused=lambda peer: self._count(connections_refused=1))
        self.address = self._server.address
        self._server.start()

    def statistics(self) -> EndpointStatistics:
        with self._lock:
            return self._stats

    def _count(self, **deltas: int) -> None:
        with self._lock:
            values = {k: getattr(self._stats, k) + v for k, v in deltas.items()}
            self._stats = EndpointStatistics(**{**self._stats.__dict__, **values})

    def _serve(self, sock: socket.socket, peer: str) -> None:
        conn = Connection(sock, peer)
        with self._lock:
            self._conns.add(conn)
        self._count(connections_accepted=1, connections_open=1)
        authenticated = False
        try:
            sock.settimeout(self._handshake_timeout)
            wire.server_handshake(sock, self._secret, LABEL)
            sock.settimeout(None)
            authenticated = True
            while not self._stopped:
                kind, request_id, args = wire.read_frame(sock)
                self._count(messages=1)
                self._dispatch(conn, kind, request_id, args)
        except wire.AuthenticationError as e:
            self._count(authentication_failures=1)
            log.warning("receiver endpoint: dropped %s: %s", peer, e)
        except wire.ProtocolError as e:
            self._count(**({"protocol_errors": 1} if authenticated else {"authentication_failures": 1}))
            log.warning("receiver endpoint: dropped %s: %s", peer, e)
        except (ConnectionError, OSError) as e:
            if not authenticated and not self._stopped:
                self._count(authentication_failures=1)
                log.warning("receiver endpoint: dropped %s before it authenticated: %s", peer, e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            self._count(connections_open=-1)
            conn.close()
            if authenticated:
                self._handler.on_disconnect(conn)

    def _dispatch(self, conn: Connection, kind: int, request_id: int, args: list) -> None:
        h = self._handler
        if kind == wire.REGISTER:
            ok, message = h.on_register(conn, *args)
        elif kind == wire.ADD_BLOCK:
            ok, message = h.on_add_block(conn, *args)
        elif kind == wire.REPORT_ERROR:  # one-way
            h.on_report_error(conn, *args)
            return
        elif kind == wire.RECORDED_UP_TO:  # one-way
            h.on_recorded_up_to(conn, *args)
            return
        elif kind == wire.DEREGISTER:
            h.on_deregister(conn, *args)
            ok, message = True, ""
        else:
            raise wire.ProtocolError(f"{wire.NAMES[kind]} is not a message a receiver sends")
        if request_id:
            conn.send(wire.REPLY, [bool(ok), message], request_id)

    def stop(self) -> None:
        self._stopped = True
        self._server.stop()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()
