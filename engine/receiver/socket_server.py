"""One way to listen: a socket, its accept thread, a bound on open connections, and a stop that
wakes the accept and joins it within a deadline.

The receiver endpoint (:mod:`.endpoint`), each executor's block server (:mod:`.block_server`) and
the acked-line source (:mod:`.acked_lines`) each say only what a connection does. Their guarantees
stay theirs and are described with the channels in :mod:`.wire`: a peer proves the shared secret
before anything else, every length is bounded, and garbage ends its connection, never the server.
This base adds the one guarantee they share: a connection past ``max_connections`` is closed at
once (counted in ``refused`` and logged) instead of taking a thread.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from sparkwal.base.service import Service, spawn

log = logging.getLogger(__name__)


class SocketServer:
    """Listens on ``host``:``port`` (0: any free port; ``address`` is where). ``serve(sock,
    peer)`` runs for each connection, on a thread of its own (``threaded``) or on the accept
    thread (for a handshake that must finish before the next connection is taken); it owns the
    socket (closes it, or hands it on). ``start()`` starts accepting; ``stop()`` ends it."""

    def __init__(self, name: str, serve: Callable[[socket.socket, str], None], host: str = "127.0.0.1",
                 port: int = 0, *, max_connections: int | None = None, threaded: bool = True,
                 on_refused: Callable[[str], None] | None = None):
        self.name = name
        self._serve = serve
        self._threaded = threaded
        self._max = max_connections
        self._slots = threading.BoundedSemaphore(max_connections) if max_connections else None
        self._on_refused = on_refused
        self._server = socket.create_server((host, port))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self.refused = 0  #: connections closed at once: max_connections were open
        self.stopped = False
        self._thread = Service(name, self._accept_loop)

    def start(self) -> SocketServer:
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self.stopped:
            try:
                sock, addr = self._server.accept()
            except OSError:
                return  # closed by stop()
            peer = f"{addr[0]}:{addr[1]}"
            if self._slots is not None and not self._slots.acquire(blocking=False):
                self.refused += 1
                log.warning("%s: dropping the connection from %s: %d connections open", self.name, peer, self._max)
                if self._on_refused is not None:
                    self._on_refused(peer)
                sock.close()
                continue
            if self._threaded:
                spawn(f"{self.name}-{addr[1]}", self._run, sock, peer)
            else:
                self._run(sock, peer)

    def _run(self, sock: socket.socket, peer: str) -> None:
        try:
            self._serve(sock, peer)
        except Exception as e:  # noqa: BLE001  one connection's failure never ends the server
            log.warning("%s: dropped %s: %s", self.name, peer, e)
            sock.close()
        finally:
            if self._slots is not None:
                self._slots.release()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting (open connections are their owners' to close) and join the accept
        thread within ``timeout_s``."""
        self.stopped = True
        try:  # wakes the thread blocked in accept() (close() alone does not, on Linux)
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        self._thread.stop(timeout_s)
