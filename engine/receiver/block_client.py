"""Talking to an executor's block server (:mod:`.block_server`): fetch a block, put a copy,
clean old copies. One connection per call, authenticated with the application's secret; every
length is bounded before anything is read (the wire format is :mod:`.wire`'s)."""

from __future__ import annotations

import socket

from . import wire
from ..errors import EngineError

LABEL = b"sparkwal-block-server"
CONNECT_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 60.0


class BlockServerError(EngineError):
    """The block server refused a request or broke the protocol (the message says which)."""


def connect(address: tuple[str, int], secret: bytes) -> socket.socket:
    sock = socket.create_connection((address[0], address[1]), timeout=CONNECT_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # requests and replies: no Nagle wait
    try:
        sock.settimeout(wire.HANDSHAKE_TIMEOUT_S)
        wire.client_handshake(sock, secret, LABEL)
        sock.settimeout(IO_TIMEOUT_S)
    except (wire.ProtocolError, OSError) as e:
        sock.close()
        raise BlockServerError(f"handshake failed: {e}") from None
    return sock


def send_chunks(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    for i in range(0, len(data), wire.CHUNK):
        sock.sendall(wire.encode_frame(wire.BLOCK_CHUNK, 0, [bytes(view[i:i + wire.CHUNK])]))


def receive_chunks(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes in BLOCK_CHUNK frames (a frame past the end is a protocol error)."""
    buf = bytearray()
    while len(buf) < size:
        kind, _, args = wire.read_frame(sock)
        if kind != wire.BLOCK_CHUNK or len(buf) + len(args[0]) > size:
            raise wire.ProtocolError(f"expected {size - len(buf)} more bytes of the block, got "
                                     f"{wire.NAMES[kind]} of {len(args[0]) if args else 0}")
        buf += args[0]
    return bytes(buf)


def _reply(sock: socket.socket) -> None:
    kind, _, args = wire.read_frame(sock)
    if kind != wire.REPLY:
        raise BlockServerError(f"expected a Reply, got {wire.NAMES[kind]}")
    if not args[0]:
        raise BlockServerError(args[1])


def fetch_block(address: tuple[str, int], secret: bytes, stream_id: int,
                block_id: str) -> tuple[bytes, bytes] | str:
    """``(tag, data)`` of the block, or why the server has no copy."""
    with connect(address, secret) as sock:
        try:
            sock.sendall(wire.encode_frame(wire.FETCH_BLOCK, 0, [stream_id, block_id]))
            kind, _, args = wire.read_frame(sock)
            if kind != wire.BLOCK_HEADER:
                raise BlockServerError(f"expected a BlockHeader, got {wire.NAMES[kind]}")
            found, message, size, tag = args
            if not found:
                return message or "not found"
            if not 0 <= size <= wire.MAX_BLOCK_BYTES or len(tag) != wire.TAG_LEN:
                raise BlockServerError(f"bad block header (size {size}, tag of {len(tag)} bytes)")
            return tag, receive_chunks(sock, size)
        except (wire.ProtocolError, ConnectionError) as e:
            raise BlockServerError(str(e)) from None


def put_block(address: tuple[str, int], secret: bytes, stream_id: int, block_id: str,
              tag: bytes, data: bytes) -> None:
    """Store a copy on the server; returns once it is in the server's directory."""
    with connect(address, secret) as sock:
        try:
            sock.sendall(wire.encode_frame(wire.PUT_BLOCK, 0, [stream_id, block_id, len(data), tag]))
            send_chunks(sock, data)
            _reply(sock)
        except (wire.ProtocolError, ConnectionError) as e:
            raise BlockServerError(str(e)) from None


def clean_blocks(address: tuple[str, int], secret: bytes, stream_id: int, thresh_ms: int) -> None:
    with connect(address, secret) as sock:
        try:
            sock.sendall(wire.encode_frame(wire.CLEAN_BLOCKS, 0, [stream_id, int(thresh_ms)]))
            _reply(sock)
        except (wire.ProtocolError, ConnectionError) as e:
            raise BlockServerError(str(e)) from None
