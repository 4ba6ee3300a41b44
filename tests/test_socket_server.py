"""The one socket-server base of the receiver endpoint, the block server and the acked-line source:
a connection past the bound is closed at once and counted, a connection whose handler fails never
ends the server, and stop() wakes the accept and joins it."""

from __future__ import annotations

import socket
import threading

from sparkwal.engine.receiver.socket_server import SocketServer


def serve(sock: socket.socket, peer: str) -> None:
    """Holds the connection until ``release``; ``boom`` makes it fail."""
    data = sock.recv(16)
    if data == b"boom":
        raise ValueError("garbage")
    held.set()
    release.wait(30)
    sock.sendall(b"ok")
    sock.close()


held, release = threading.Event(), threading.Event()


def test_a_connection_past_the_bound_is_closed_at_once_and_counted():
    held.clear(), release.clear()
    refused: list[str] = []
    server = SocketServer("test-server", serve, max_connections=1, on_refused=refused.append).start()
    try:
        first = socket.create_connection(server.address, timeout=10)
        first.sendall(b"hold")
        assert held.wait(10)
        second = socket.create_connection(server.address, timeout=10)
        try:
            assert second.recv(16) == b""  # closed at once: one connection is open
        except ConnectionResetError:
            pass
        assert server.refused == 1 and len(refused) == 1
        release.set()
        assert first.recv(16) == b"ok"
    finally:
        release.set()
        server.stop(timeout_s=10)


def test_a_failing_handler_never_ends_the_server_and_stop_ends_it():
    held.clear(), release.set()
    server = SocketServer("test-server", serve).start()
    try:
        broken = socket.create_connection(server.address, timeout=10)
        broken.sendall(b"boom")  # the handler raises: its connection is closed, the server goes on
        try:
            assert broken.recv(16) == b""
        except ConnectionResetError:
            pass
        again = socket.create_connection(server.address, timeout=10)
        again.sendall(b"again")
        assert again.recv(16) == b"ok"
    finally:
        server.stop(timeout_s=10)
    assert server.stopped
    try:
        socket.create_connection(server.address, timeout=5).close()
        raise AssertionError("the stopped server still accepts")
    except ConnectionRefusedError:
        pass
