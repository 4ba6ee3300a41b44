"""An HTTP fault proxy in front of an S3-compatible server (moto in the tests and the nemesis drill).

Per request it forwards to the server, or injects a fault: answer 500, answer 503 SlowDown (S3's
throttling reply), reset the connection before forwarding (nothing happened), reset it after
forwarding (the request took effect; the client cannot tell), or delay by a chosen time first.
Faults come from rates and a seed (reproducible: the same seed and the same request sequence
give the same faults) or from a plan of the next requests matching a method and a path part.
Every request is logged with its fault and status, so tests and the object-store bill can count
requests by kind. ``hold()`` plays a network partition that keeps a client's writes: every write
request arriving from then on waits in the proxy (its client waits, then times out) until
``release()`` forwards them all, whether their client still listens or not: a paused leader's
writes landing after a takeover (``stop_holding()`` first lets new requests through again).

    proxy = FaultProxy(upstream="http://127.0.0.1:5000", seed=7, rates={"503": 0.1})
    proxy.url  # give this to s3fs as its endpoint_url
    proxy.plan("PUT", "/checkpoint-", "reset_after")  # the next matching request
    proxy.log  # [Request(method, path, fault, status), ...]
    proxy.hold(); ...; proxy.stop_holding(); ...; proxy.release()  # writes held, landing late
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from sparkwal.base.service import spawn

FAULTS = ("500", "503", "reset_before", "reset_after", "delay")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
            b"<Message>We encountered an internal error. Please try again.</Message></Error>")


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def handle_error(self, request, client_address) -> None:
        """A client gone mid-answer: nothing to report."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    fault: str | None  # None: forwarded untouched
    status: int | None  # what the client got (None: its connection was reset)

    @property
    def kind(self) -> str:
        """The object-store bill's kind: GET, HEAD, PUT, LIST, DELETE (a batch delete is a POST
        with ``?delete``), or the method."""
        path, _, query = self.path.partition("?")
        if self.method == "GET" and ("list-type" in query or "prefix=" in query or path.count("/") <= 1):
            return "LIST"
        if self.method == "POST" and query.startswith("delete"):
            return "DELETE"
        return self.method


class FaultProxy:
    def __init__(self, upstream: str, *, seed: int = 0, rates: dict[str, float] | None = None,
                 delay_s: float = 2.0):
        unknown = set(rates or {}) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rates = dict(rates or {})
        self.delay_s = delay_s
        self.log: list[Request] = []
        self._random = random.Random(seed)
        self._plans: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._holding: frozenset[str] = frozenset()  # the methods held (see hold())
        self._released = threading.Event()
        self.held = 0  # requests held so far
        self._server = _ProxyServer(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = spawn("fault-proxy", self._server.serve_forever)

    def plan(self, method: str, path_part: str, fault: str) -> None:
        """The next request with ``method`` whose path contains ``path_part`` gets ``fault``."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
        with self._lock:
            self._plans.append((method, path_part, fault))

    def hold(self, methods: tuple[str, ...] = ("PUT", "POST", "DELETE")) -> None:
        """From now on, requests with these methods wait in the proxy until :meth:`release`."""
        self._released.clear()
        self._holding = frozenset(methods)

    def stop_holding(self) -> None:
        """New requests pass again; those held so far stay held until :meth:`release`."""
        self._holding = frozenset()

    def release(self) -> None:
        """Forward every held request now (late: their clients may have given up on them)."""
        self._holding = frozenset()
        self._released.set()

    def wait_if_held(self, method: str) -> bool:
        """True, once released, for a request that was held (see :meth:`hold`)."""
        if method not in self._holding:
            return False
        with self._lock:
            self.held += 1
        self._released.wait()
        return True

    def choose(self, method: str, path: str) -> str | None:
        with self._lock:
            for i, (m, part, fault) in enumerate(self._plans):
                if m == method and part in path:
                    del self._plans[i]
                    return fault
            roll = self._random.random()  # one draw per request: the seed fixes the sequence
            for fault in FAULTS:
                rate = self.rates.get(fault, 0.0)
                if roll < rate:
                    return fault
                roll -= rate
        return None

    def record(self, request: Request) -> None:
        with self._lock:
            self.log.append(request)

    def counts(self, since: int = 0) -> dict[str, int]:
        """Requests by kind (:attr:`Request.kind`), of the log from index ``since`` on."""
        out: dict[str, int] = {}
        with self._lock:
            for r in self.log[since:]:
                out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def stop(self) -> None:
        self._holding = frozenset()
        self._released.set()  # no handler left waiting
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: _ProxyServer

    protocol_version = "HTTP/1.1"  # keep-alive and Expect: 100-continue, as S3 clients use them

    def log_message(self, format, *args):  # noqa: A002
        pass

    def _reset(self) -> None:
        """Close with an RST (SO_LINGER 0): the client sees 'connection reset', not an answer."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _forward(self, body: bytes):
        host, port = self.server.proxy.upstream
        conn = http.client.HTTPConnection(host, port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "expect"}
        conn.request(self.command, self.path, body=body if body else None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response, data

    def _send(self, status: int, headers: list[tuple[str, str]], data: bytes, length: str | None = None) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                self.send_header(k, v)
        self.send_header("Content-Length", length if length is not None else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _handle(self) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if proxy.wait_if_held(self.command):
            response, data = self._forward(body)
            proxy.record(Request(self.command, self.path, "held", response.status))
            return self._send(response.status, response.getheaders(), data)
        fault = proxy.choose(self.command, self.path)
        if fault == "delay":
            time.sleep(proxy.delay_s)
        if fault == "reset_before":
            proxy.record(Request(self.command, self.path, fault, None))
            return self._reset()
        if fault in ("500", "503"):
            proxy.record(Request(self.command, self.path, fault, int(fault)))
            data = SLOW_DOWN if fault == "503" else INTERNAL
            return self._send(int(fault), [("Content-Type", "application/xml")], data)
        response, data = self._forward(body)
        if fault == "reset_after":  # it happened upstream; the client never hears of it
            proxy.record(Request(self.command, self.path, fault, None))
            return self._reset()
        proxy.record(Request(self.command, self.path, fault, response.status))
        self._send(response.status, response.getheaders(), data,
                   length=response.getheader("Content-Length") if self.command == "HEAD" else None)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle  # noqa: N815
