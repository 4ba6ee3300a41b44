"""The driver's receiver endpoint: authentication, and garbage that must change nothing."""

from __future__ import annotations

import socket
import struct
import threading

import msgpack
import pytest

from sparkwal.engine.receiver import wire
from sparkwal.engine.receiver.client import DriverConnection, DriverUnreachableError
from sparkwal.engine.receiver.endpoint import LABEL, ReceiverEndpoint


class RecordingHandler:
    def __init__(self):
        self.calls: list[tuple] = []
        self.disconnected = threading.Event()

    def on_register(self, conn, *args):
        self.calls.append(("register", *args))
        return True, ""

    def on_add_block(self, conn, *args):
        self.calls.append(("add_block", *args))
        return True, ""

    def on_report_error(self, conn, *args):
        self.calls.append(("report_error", *args))

    def on_recorded_up_to(self, conn, *args):
        self.calls.append(("recorded_up_to", *args))

    def on_deregister(self, conn, *args):
        self.calls.append(("deregister", *args))

    def on_disconnect(self, conn):
        self.disconnected.set()


@pytest.fixture
def endpoint():
    handler = RecordingHandler()
    secret = wire.new_secret()
    ep = ReceiverEndpoint(handler, secret, handshake_timeout_s=2)
    yield ep, handler, secret
    ep.stop()


def _wait_for(predicate, timeout=5.0):
    event = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        event.wait(0.01)
    return predicate()


def _authenticated_socket(address, secret) -> socket.socket:
    s = socket.create_connection(address)
    wire.client_handshake(s, secret, LABEL)
    return s


def test_an_authenticated_receiver_registers_and_gets_replies(endpoint):
    ep, handler, secret = endpoint
    pushed = []
    conn = DriverConnection(ep.address, secret, on_message=lambda k, a: pushed.append((k, a)),
                            on_close=lambda: None)
    assert conn.request(wire.REGISTER, [0, "R", "127.0.0.1", "driver", 123], timeout_s=5) == (True, "")
    conn.tell(wire.REPORT_ERROR, [0, "oops", None])
    conn.tell(wire.RECORDED_UP_TO, [0, 1_700_000_000_000])
    assert _wait_for(lambda: len(handler.calls) == 3)
    assert handler.calls == [("register", 0, "R", "127.0.0.1", "driver", 123), ("report_error", 0, "oops", None),
                             ("recorded_up_to", 0, 1_700_000_000_000)]
    conn.close()
    assert handler.disconnected.wait(5)
    assert ep.statistics().messages == 3


def test_a_client_with_the_wrong_secret_is_dropped_before_any_message(endpoint):
    ep, handler, _ = endpoint
    with pytest.raises((wire.AuthenticationError, ConnectionError, OSError)):
        DriverConnection(ep.address, b"x" * 32, on_message=lambda *a: None, on_close=lambda: None)
    assert _wait_for(lambda: ep.statistics().authentication_failures == 1)
    assert handler.calls == []
    assert not handler.disconnected.is_set()  # never authenticated: the handler never heard of it


def test_a_server_without_the_secret_is_refused_by_the_receiver():
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def impostor():
        s, _ = server.accept()
        s.sendall(wire.MAGIC + bytes([wire.VERSION]) + b"n" * 32)
        s.recv(1024)
        s.sendall(b"m" * 32)  # a proof it cannot compute
        done.wait(5)
        s.close()

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(wire.AuthenticationError):
        DriverConnection(server.getsockname()[:2], wire.new_secret(), on_message=lambda *a: None,
                         on_close=lambda: None)
    done.set()
    server.close()


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"A" * 100,  # not the protocol at all
    b"SWRP\x01" + b"\0" * 64,  # the right magic, a wrong proof
    b"SWRP\x07" + b"\0" * 64,  # an unknown version
    b"SW",  # truncated, then closed
])
def test_unauthenticated_garbage_is_dropped_and_logged(endpoint, garbage, caplog):
    ep, handler, _ = endpoint
    s = socket.create_connection(ep.address)
    s.recv(64)
    s.sendall(garbage)
    try:
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        assert s.recv(64) == b""  # the endpoint closed the connection
    except OSError:
        pass  # already closed by the endpoint
    s.close()
    assert _wait_for(lambda: ep.statistics().authentication_failures == 1)
    assert handler.calls == []
    assert "receiver endpoint: dropped" in caplog.text


def test_a_silent_client_is_dropped_after_the_handshake_timeout(endpoint):
    ep, handler, _ = endpoint
    s = socket.create_connection(ep.address)
    s.settimeout(10)
    s.recv(64)
    assert s.recv(64) == b""  # closed by the endpoint (2 s handshake timeout) without our help
    assert ep.statistics().authentication_failures == 1


def _body(v) -> bytes:
    return msgpack.packb(v, use_bin_type=True)


@pytest.mark.parametrize("frame", [
    struct.pack(">I", wire.MAX_FRAME + 1) + b"x" * 16,  # an oversize length
    struct.pack(">I", 0),  # an empty frame
    struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",  # undecodable msgpack
    struct.pack(">I", 3) + _body([1, 2, 3])[:3],  # a frame cut short by its own length
    (lambda b: struct.pack(">I", len(b)) + b)(_body([1, 99, 1, []])),  # an unknown kind
    (lambda b: struct.pack(">I", len(b)) + b)(_body([2, wire.REGISTER, 1, [0, "R", "h", "e", 1]])),  # version
    (lambda b: struct.pack(">I", len(b)) + b)(_body([1, wire.REGISTER, 1, ["0", "R", "h", "e", 1]])),  # types
    (lambda b: struct.pack(">I", len(b)) + b)(_body([1, wire.REGISTER, 1, [0, "R"]])),  # arity
    (lambda b: struct.pack(">I", len(b)) + b)(_body([1, wire.RECORDED_UP_TO, 0, [0, "1000"]])),  # a time not an int
    (lambda b: struct.pack(">I", len(b)) + b)(_body({"kind": 1})),  # not a list
    (lambda b: struct.pack(">I", len(b)) + b)(_body([1, wire.STOP_RECEIVER, 0, []])),  # driver's message
])
def test_malformed_frames_from_an_authenticated_peer_drop_the_connection(endpoint, frame, caplog):
    ep, handler, secret = endpoint
    s = _authenticated_socket(ep.address, secret)
    s.sendall(frame)
    s.settimeout(10)
    try:
        assert s.recv(64) == b""  # closed by the endpoint
    except ConnectionResetError:
        pass
    s.close()
    assert _wait_for(lambda: ep.statistics().protocol_errors == 1)
    assert handler.calls == []
    assert handler.disconnected.wait(5)
    assert "receiver endpoint: dropped" in caplog.text


def test_a_request_fails_when_the_driver_goes_away(endpoint):
    ep, handler, secret = endpoint
    closed = threading.Event()
    conn = DriverConnection(ep.address, secret, on_message=lambda *a: None, on_close=closed.set)
    ep.stop()
    assert closed.wait(5)
    with pytest.raises(DriverUnreachableError):
        conn.request(wire.REGISTER, [0, "R", "h", "e", 1], timeout_s=5)


def test_frames_are_bounded_when_encoded_too():
    with pytest.raises(wire.ProtocolError, match="exceeds"):
        wire.encode_frame(wire.REPORT_ERROR, 0, [0, "x" * (wire.MAX_FRAME + 1), None])
