"""The UI's HTTP server: read-only, on one port, a thread per request.

Only GET and HEAD are answered (any other method: 405). Every length is bounded: the request
line and headers by http.server's own limits (64 KiB a line, 100 headers), the target by
:data:`sparkwal.engine.ui.routes.MAX_TARGET`; a client that sends nothing for ``TIMEOUT_S`` is dropped.
Whatever a request holds, the answer is a 2xx, 3xx or 4xx, never a crash of the driver.
"""

from __future__ import annotations

import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sparkwal.base.service import Service

from .routes import TEXT, respond

log = logging.getLogger(__name__)

TIMEOUT_S = 10
FIRST_PORT = 4050  #: the first port tried by default (Spark's own UI counts up from 4040)
PORT_TRIES = 16  #: as spark.port.maxRetries


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "sparkwal-ui"
    timeout = TIMEOUT_S
    protocol_version = "HTTP/1.0"
    default_request_version = "HTTP/1.0"  # errors to a garbled request line get a status line too

    def _answer(self, head_only: bool) -> None:
        try:
            status, content_type, body = respond(self.server.catalog, self.path)
        except Exception as e:
            log.warning("the UI failed on %r", self.path, exc_info=True)
            status, content_type, body = 400, TEXT, f"could not answer: {type(e).__name__}\n".encode()
        if status == 302:
            self.send_response(302)
            self.send_header("Location", content_type)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(head_only=False)

    def do_HEAD(self) -> None:
        self._answer(head_only=True)

    def _refuse(self) -> None:
        self.send_error(405, "read-only: GET and HEAD only")

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # any other method: 405, not http.server's 501
            return self._refuse
        raise AttributeError(name)

    def log_message(self, format, *args) -> None:
        log.debug("ui: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    catalog: Any = None  # what the handlers serve (engine.ui.catalog.Catalog)

    def handle_error(self, request, client_address) -> None:
        log.debug("ui: a request from %s failed", client_address, exc_info=True)


class UiServer:
    """Serves ``catalog`` on ``host``: ``port`` None tries FIRST_PORT and up, 0 takes any."""

    def __init__(self, catalog, host: str, port: int | None, public_host: str | None = None):
        self.catalog = catalog
        self._server = _bind(host, port)
        self._server.catalog = catalog
        self.port = self._server.server_address[1]
        shown = public_host or (host if host not in ("0.0.0.0", "::", "") else socket.gethostname())
        self.url = f"http://{shown}:{self.port}"
        self._thread = Service("sparkwal-ui", self._server.serve_forever, 0.2).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.stop(5)


def _bind(host: str, port: int | None) -> _Server:
    candidates = [port] if port is not None else [FIRST_PORT + i for i in range(PORT_TRIES)]
    error = None
    for candidate in candidates:
        try:
            return _Server((host, candidate), _Handler)
        except OSError as e:
            error = e
    tried = f"port {port}" if port is not None else f"ports {candidates[0]}-{candidates[-1]}"
    reason = (error.strerror or error) if error is not None else "no port to try"
    raise OSError(f"the sparkwal UI could not listen on {host} ({tried}): {reason}")
