"""Each executor's block server: serves the WAL-off receiver blocks in the executor's local
directory to tasks on other executors, and takes the copies receivers elsewhere replicate to it
(what Spark's BlockManager does for its receivers' blocks: core/src/main/scala/org/apache/spark/
storage/BlockManager.scala, streaming/.../receiver/ReceivedBlockHandler.scala).

One process per executor and application (``python -m sparkwal.engine.receiver.block_server <dir> <host>
<watch_pid> <lock_fd>``, the secret on its stdin, its port as one JSON line on its stdout), started on demand
by the first Python worker that needs it (:func:`ensure_block_server`: the driver's probe of the
executors, or a receiver's task), which records itself in ``<dir>/server.json`` (pid, host, port,
key id) for the others before it answers that it is up. It listens on
the executor's host and lives as long as its directory and the process that started its worker
(the executor's worker daemon, which Spark ends with the executor; the daemon's process group, to
which the server belongs, is hung up then too), or until ``server.json`` names another server.

``server.json`` also holds the secret's key id (an HMAC of a fixed label, which reveals nothing of
the secret): a later StreamingContext on the same SparkContext has a secret of its own, and finds
the earlier context's server refusing it, so it starts its own, which the earlier one makes way for.

Every connection authenticates with the application's secret (:mod:`.wire`'s handshake, label
``sparkwal-block-server``); a peer that does not, or that sends anything but the block channel's
messages, is dropped, and nothing it sent is kept. Block ids are checked against their pattern
before they name a file, sizes against :data:`.wire.MAX_BLOCK_BYTES` before anything is read, a
copy's tag against its bytes before it is written; connections are bounded in number and time.
Nothing received is unpickled here.
"""

from __future__ import annotations

import fcntl
import hmac
import json
import logging
import os
import select
import socket
import subprocess
import sys
import time

from . import wire
from .block_client import LABEL, BlockServerError, receive_chunks
from .socket_server import SocketServer
from .blocks import (BLOCK_ID, MAX_BLOCK_BYTES, TAG_LEN, BlockCopy, block_tag, clean_block_dir,
                     local_block_dir, read_block_file, write_block_file)

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0
INFO = "server.json"


class BlockServer:
    """Serves ``directory`` (``<streamId>/<blockId>`` files) on ``host``; threads, one per connection."""

    def __init__(self, directory: str, secret: bytes, host: str = "127.0.0.1", port: int = 0):
        self.directory, self._secret = directory, secret
        self._stopped = False
        self.dropped = 0  #: connections dropped for failing authentication or the protocol
        self._server = SocketServer("block-server", self._serve, host, port, max_connections=MAX_CONNECTIONS)
        self.address = self._server.address
        self._server.start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(wire.HANDSHAKE_TIMEOUT_S)
            wire.server_handshake(sock, self._secret, LABEL)
            sock.settimeout(IDLE_TIMEOUT_S)
            while not self._stopped:
                kind, _, args = wire.read_frame(sock)
                self._dispatch(sock, kind, args)
        except wire.ProtocolError as e:
            self.dropped += 1
            log.warning("block server: dropped %s: %s", peer, e)
        except (ConnectionError, OSError):
            pass
        finally:
            sock.close()

    def _path(self, stream_id: int, block_id: str) -> str:
        if stream_id < 0 or not BLOCK_ID.fullmatch(block_id) or not block_id.startswith(f"input-{stream_id}-"):
            raise wire.ProtocolError(f"{block_id!r} is not a block id of stream {stream_id}")
        return os.path.join(self.directory, str(stream_id), block_id)

    def _dispatch(self, sock: socket.socket, kind: int, args: list) -> None:
        if kind == wire.FETCH_BLOCK:
            path = self._path(*args)
            try:
                tag, data = read_block_file(path)
            except Exception as e:  # noqa: BLE001  absent or damaged: the reader tries elsewhere
                sock.sendall(wire.encode_frame(wire.BLOCK_HEADER, 0, [False, str(e), 0, b""]))
                return
            sock.sendall(wire.encode_frame(wire.BLOCK_HEADER, 0, [True, "", len(data), tag]))
            view = memoryview(data)
            for i in range(0, len(data), wire.CHUNK):
                sock.sendall(wire.encode_frame(wire.BLOCK_CHUNK, 0, [bytes(view[i:i + wire.CHUNK])]))
        elif kind == wire.PUT_BLOCK:
            stream_id, block_id, size, tag = args
            path = self._path(stream_id, block_id)
            if not 0 <= size <= MAX_BLOCK_BYTES or len(tag) != TAG_LEN:
                raise wire.ProtocolError(f"bad PutBlock size {size} or tag length {len(tag)}")
            data = receive_chunks(sock, size)
            if not hmac.compare_digest(tag, block_tag(self._secret, block_id, data)):
                raise wire.ProtocolError(f"block {block_id}'s bytes do not match its tag")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_block_file(path, tag, data)
            sock.sendall(wire.encode_frame(wire.REPLY, 0, [True, ""]))
        elif kind == wire.CLEAN_BLOCKS:
            stream_id, thresh_ms = args
            if stream_id < 0:
                raise wire.ProtocolError(f"bad stream id {stream_id}")
            clean_block_dir(os.path.join(self.directory, str(stream_id)), thresh_ms)
            sock.sendall(wire.encode_frame(wire.REPLY, 0, [True, ""]))
        else:
            raise wire.ProtocolError(f"{wire.NAMES[kind]} is not a block server request")

    def stop(self) -> None:
        self._stopped = True
        self._server.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _named_pid(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, INFO)) as f:
            return int(json.load(f)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str]) -> int:
    directory, host, watch_pid, lock_fd = argv[0], argv[1], int(argv[2]), int(argv[3])
    secret = bytes.fromhex(sys.stdin.readline().strip())
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = BlockServer(directory, secret, host)
    tmp = os.path.join(directory, f"{INFO}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "host": host, "port": server.address[1], "key": key_id(secret)}, f)
    os.replace(tmp, os.path.join(directory, INFO))  # named while it holds the lock with its starter (a
    os.close(lock_fd)  # starter killed meanwhile leaves it held: no second server starts beside it)
    try:
        print(json.dumps({"port": server.address[1]}), flush=True)
    except BrokenPipeError:
        pass  # its starter is gone; the next worker finds it in server.json
    while _alive(watch_pid) and os.path.isdir(directory) and _named_pid(directory) in (os.getpid(), None):
        time.sleep(1)
    server.stop()
    return 0


def app_block_dir(app_id: str) -> str:
    return os.path.dirname(local_block_dir(app_id, 0))


def key_id(secret: bytes) -> str:
    """Which secret a server holds, as ``server.json`` records it (revealing nothing of it)."""
    return hmac.new(secret, b"sparkwal block server key id", "sha256").hexdigest()[:32]


def ensure_block_server(app_id: str, secret: bytes, host: str, executor_id: str,
                        replace: bool = False) -> BlockCopy:
    """This executor's block server for ``app_id`` and ``secret``: the running one, or one started
    now (by at most one worker at a time: a lock file in its directory). A running one that holds
    another secret (an earlier StreamingContext's on the same SparkContext) is replaced only where
    ``replace`` (the driver's probe, at its context's start): a late task of the earlier context
    gets an error instead of taking the executor back."""
    directory = app_block_dir(app_id)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "server.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(os.path.join(directory, INFO)) as f:
                info = json.load(f)
            live = _alive(info["pid"]) and info["host"] == host
            if live and info.get("key") == key_id(secret):
                return BlockCopy(executor_id, host, info["port"])
            if live and not replace:
                raise BlockServerError(f"executor {executor_id}'s block server holds another StreamingContext's "
                                       "secret (the driver's probe replaces it when a context starts)")
        except (OSError, ValueError, KeyError, TypeError):
            pass
        port = _start(directory, secret, host, lock.fileno())  # which names itself in server.json
        return BlockCopy(executor_id, host, port)


_started: list[subprocess.Popen] = []  # kept, so that Python reaps them


def _start(directory: str, secret: bytes, host: str, lock_fd: int) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with open(os.path.join(directory, "server.log"), "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "sparkwal.engine.receiver.block_server", directory, host,
                                 str(os.getppid()), str(lock_fd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, env=env, close_fds=True, pass_fds=(lock_fd,))
    _started.append(proc)
    proc.stdin.write(secret.hex().encode() + b"\n")
    proc.stdin.close()
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    try:
        return int(json.loads(line)["port"])
    except (ValueError, KeyError, TypeError):
        proc.kill()
        proc.wait()  # reaped: a zombie would look alive to the next worker
        if _named_pid(directory) == proc.pid:
            os.unlink(os.path.join(directory, INFO))
        raise BlockServerError(f"the block server did not start within {START_TIMEOUT_S:.0f} s (its log: "
                           f"{os.path.join(directory, 'server.log')})") from None


def probe_block_server(app_id: str, secret: bytes, default_host: str, _item) -> list:
    """A task of the driver's executor probe: this executor's block server as
    ``[executor_id, host, port]`` (started if need be)."""
    from .placement import this_executor

    here = this_executor(default_host)
    copy = ensure_block_server(app_id, secret, here.host, here.executor_id, replace=True)
    return [copy.executor_id, copy.host, copy.port]


def discover_block_servers(sc, app_id: str, secret: bytes, default_host: str,
                           executors: int) -> tuple[BlockCopy, ...]:
    """The driver's probe: start (or find) the block server of every executor a task of a
    ``2 * executors``-task job lands on; returns them. A failed probe is logged: receivers then
    keep their blocks' only copy."""
    from functools import partial

    n = max(2 * executors, 2)
    try:
        found = sc.parallelize(range(n), n).map(
            partial(probe_block_server, app_id, secret, default_host)).collect()
    except Exception as e:  # noqa: BLE001
        log.warning("could not start the executors' block servers: %s", str(e).splitlines()[0])
        return ()
    return tuple(sorted({BlockCopy(*c) for c in found}, key=lambda c: c.executor_id))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
