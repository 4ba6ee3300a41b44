"""The state host: one process per executor that keeps mapWithState's partitions live between batches.

Spark hands a task to whichever Python worker is idle, and a task of a cached state runs two
workers at once (the state's and its reader's), so the worker that kept a partition's map live
(:mod:`sparkwal.engine.state.state_map`) is seldom the one that gets the partition's next batch:
the map was several batches old or rebuilt from the whole partition (docs/benchmarks.md, State at
scale). The host is the one process of an executor that holds each partition's map. A batch's task,
in whichever worker, asks it for the values of the batch's keys (and the keys idle past the
timeout), calls the mapping function itself and hands back the batch's layer, which the host
applies. The host never runs user code: it looks keys up, applies layers and pickles its maps.

The cached :class:`~sparkwal.engine.state.state_map.StateRecord` stays what the state *is*: every
request names the token of the record the task holds, and the host answers only from a map at
that very state; otherwise it says which state it holds, and the task brings it up to date with
the record's layers after it, or the record's base and layers. A host that is gone, slow to start
or answering for another state costs a rebuild in the worker, never a wrong value; a host's map
moved on by another attempt of the batch is refused by token.

**The wire** (this module owns it). A Linux abstract-namespace Unix socket named after the
workers' parent process (the executor's worker daemon, one per application and executor: its pid
and start time) and the user; each side
checks that the other runs as the same user (``SO_PEERCRED``) before reading a byte, so no other
user's process is ever unpickled. Each message is a 4-byte big-endian length (at most
:data:`MAX_FRAME`) and a pickled tuple. Requests and answers:

* ``("path", entries)`` -> ``("ok",)``: the worker's ``sys.path`` (user classes in the values);
* ``("lookup", uid, index, token, keys, idle_before_ms, catch_up)`` -> ``("ok", found, idle)``
  (``found``: ``{key: value}`` of the keys the state holds; ``idle``: ``[(key, value)]`` last
  updated before ``idle_before_ms``, not among ``keys``, in update order) or ``("behind", held)``,
  the token of the map it holds (None: none). ``catch_up`` first: ``("layers", held, layers)`` or
  ``("base", base, layers)``, pickled as in the record;
* ``("apply", uid, index, token, new_token, layer, want_base, delta_since_ms, live_keys)`` ->
  ``("ok", keys, base, delta)`` or ``("behind", held)``: the layer applied to the map at ``token``,
  which is ``new_token`` from then on; ``base`` the pickled map when asked, ``delta`` its rows
  since ``delta_since_ms`` (None: not asked);
* any failure -> ``("error", message)``.

The host ends with the process it was started under (the worker daemon, or the executor where
there is none), and holds at most ``live_keys`` keys in all (oldest maps dropped first).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time

from sparkwal.base.service import spawn

from ..errors import EngineError
from .state_map import LIVE_KEYS, StateMap

log = logging.getLogger(__name__)

MAX_FRAME = 1 << 31
MAX_MAPS = 256  # maps a host keeps, over every state stream it served
ANSWER_WITHIN_S = 120.0  # a host that takes longer is given up on: the task keeps the state itself
SPAWN_EVERY_S = 30.0  # a worker that found no host starts one at most this often
_LEN = struct.Struct(">I")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class HostUnavailable(EngineError):  # noqa: N818  (a signal to fall back, caught by the task)
    """No state host answers for this worker, or not at the task's state: the task keeps the state itself."""


class HostLoading(HostUnavailable):  # noqa: N818
    """The host loads the partition's state from the record's base in the background: the task runs the
    batch itself (in parallel, where the host would load partition after partition)."""


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def _same_user(sock: socket.socket) -> bool:
    _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid == os.getuid()


def _send(sock: socket.socket, message) -> None:
    body = _dumps(message)
    if len(body) >= MAX_FRAME:
        raise ValueError(f"a state host message of {len(body)} bytes is over {MAX_FRAME}")
    sock.sendall(_LEN.pack(len(body)))
    sock.sendall(body)


def _receive_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the state host's peer hung up")
        got += k
    return buf


def _receive(sock: socket.socket):
    (n,) = _LEN.unpack(_receive_exactly(sock, _LEN.size))
    if n >= MAX_FRAME:
        raise ConnectionError(f"a state host message of {n} bytes is over {MAX_FRAME}")
    return pickle.loads(_receive_exactly(sock, n))


def host_name(owner: str) -> str:
    """The abstract socket name of the host that ``owner`` (:func:`executor_identity`) has."""
    digest = hashlib.sha256(f"{os.getuid()}:{owner}".encode()).hexdigest()[:24]
    return f"\0sparkwal-state-{digest}"


def executor_identity(pid: int) -> str:
    """Process ``pid`` (a worker's parent: the executor's worker daemon, or the executor itself
    where there is none) as one name for its lifetime: its pid and start time (a pid is reused).
    ``SparkFiles``' directory would not do: every cluster executor's is ``.``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    start = stat[stat.rindex(b")") + 2:].split()[19]  # field 22, counted after the command's name
    return f"{pid}:{start.decode()}"


# ---------------------------------------------------------------------- the host

class StateHost:
    """The maps, by (state stream's run id, partition): ``(token, StateMap)``, oldest first."""

    def __init__(self):
        self.maps: dict[tuple[str, int], tuple[bytes, StateMap]] = {}
        self._lock = threading.Lock()  # one request at a time: its work is Python's, under the GIL anyway
        self._live_keys = LIVE_KEYS  # the last apply's bound (catch-ups keep it too)
        self._counts = {"lookups": 0, "behind": 0, "loads": 0, "catch_ups": 0, "applied": 0, "refused": 0}

    def statistics(self) -> dict:
        """Requests served (``lookups``, ``applied``), answered ``behind`` (by lookups) or
        ``refused`` (applies at another state), maps brought up to date from a record (``loads``: its
        whole base; ``catch_ups``: its layers), the maps and keys held, and the host's ``pid``."""
        with self._lock:
            return {**self._counts, "maps": len(self.maps), "keys": sum(len(m.values) for _, m in self.maps.values()),
                    "pid": os.getpid()}

    def handle(self, request: tuple):
        op, *args = request
        if op == "statistics":
            return ("ok", self.statistics())
        with self._lock:
            if op == "lookup":
                return self._lookup(*args)
            if op == "apply":
                return self._apply(*args)
            if op == "path":
                sys.path.extend(p for p in args[0] if p not in sys.path)
                return ("ok",)
        return ("error", f"unknown state host request {op!r}")

    def _held(self, uid: str, index: int) -> bytes | None:
        held = self.maps.get((uid, index))
        return None if held is None else held[0]

    def _lookup(self, uid, index, token, keys, idle_before_ms, catch_up):
        self._counts["lookups"] += 1
        if catch_up is not None:
            self._catch_up(uid, index, token, catch_up)
        if self._held(uid, index) != token:
            self._counts["behind"] += 1
            return ("behind", self._held(uid, index))
        values = self.maps[(uid, index)][1].values
        found = {k: values[k] for k in keys if k in values}
        idle = []
        if idle_before_ms is not None:
            asked = set(keys)
            state = self.maps[(uid, index)][1]
            idle = [(k, values[k]) for k in state.idle_before(idle_before_ms) if k not in asked]
        return ("ok", found, idle)

    def _catch_up(self, uid, index, token, catch_up) -> None:
        kind, first, layers = catch_up
        if kind == "base":
            state = pickle.loads(first)
            self._counts["loads"] += 1
        elif self._held(uid, index) == first:
            state = self.maps.pop((uid, index))[1]
            self._counts["catch_ups"] += 1
        else:
            return  # it moved on meanwhile: the lookup says what it holds
        self.maps.pop((uid, index), None)  # a failure half-way leaves no map behind
        for layer in layers:
            state.apply(pickle.loads(layer))
        self.maps[(uid, index)] = (token, state)
        self._bound(self._live_keys)

    def _apply(self, uid, index, token, new_token, layer, want_base, delta_since_ms, live_keys=LIVE_KEYS):
        if self._held(uid, index) != token:
            self._counts["refused"] += 1
            return ("behind", self._held(uid, index))
        self._counts["applied"] += 1
        state = self.maps.pop((uid, index))[1]
        if layer is not None:
            state.apply(pickle.loads(layer))
        base = _dumps(state) if want_base else None
        delta = None if delta_since_ms is None else state.rows_since(delta_since_ms)
        self.maps[(uid, index)] = (new_token, state)
        self._live_keys = live_keys
        self._bound(live_keys)
        return ("ok", len(state.values), base, delta)

    def _bound(self, live_keys: int) -> None:
        """The newest maps, at most :data:`MAX_MAPS` of them holding at most ``live_keys`` keys in all
        (beyond that, the newest map alone)."""
        held = sum(len(m.values) for _, m in self.maps.values())
        while len(self.maps) > 1 and (held > live_keys or len(self.maps) > MAX_MAPS):
            held -= len(self.maps.pop(next(iter(self.maps)))[1].values)

    def serve(self, conn: socket.socket) -> None:
        with conn:
            if not _same_user(conn):
                return
            while True:
                try:
                    request = _receive(conn)
                except Exception:  # noqa: BLE001  a peer that hung up or sent what is no request: closed
                    return
                try:
                    answer = self.handle(request)
                except Exception as e:  # noqa: BLE001  the task falls back and reports it
                    answer = ("error", f"{type(e).__name__}: {e}")
                try:
                    _send(conn, answer)
                except (ConnectionError, OSError, ValueError):
                    return


def _end_with(pid: int) -> None:
    """Exit when process ``pid`` does."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    while True:
        if fd is not None:
            select.select([fd], [], [])
            os._exit(0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:
            pass
        time.sleep(1.0)


def main(argv: list[str]) -> int:
    name, parent = "\0" + argv[0], int(argv[1])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(name)
    except OSError:
        return 0  # another host was started first: it serves
    server.listen(64)
    spawn("state-host-parent", _end_with, parent)
    host = StateHost()
    while True:
        conn, _ = server.accept()
        spawn("state-host-connection", host.serve, conn)


# ---------------------------------------------------------------------- the worker's side

class HostClient:
    """A Python worker's connection to its executor's state host (one, kept across tasks)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._unread = 0  # answers to :meth:`apply_later` not read yet
        self.path: tuple = ()  # the sys.path the host was last given

    def close(self) -> None:
        self._sock.close()

    def call(self, *request):
        try:
            while self._unread:  # an earlier apply's: a refusal leaves the host behind, which the next lookup sees
                _receive(self._sock)
                self._unread -= 1
            _send(self._sock, request)
            answer = _receive(self._sock)
        except (OSError, ValueError, pickle.PickleError, EOFError) as e:
            _forget(self)
            raise HostUnavailable(f"the state host did not answer: {e}") from e
        if answer[0] == "error":
            raise HostUnavailable(f"the state host refused {request[0]}: {answer[1]}")
        return answer

    def lookup(self, uid: str, index: int, record, keys: list, idle_before_ms: int | None) -> tuple[dict, list]:
        """``(found, idle)`` at ``record``'s state (see the module's wire), bringing the host's map to
        it with the layers after the one it holds. Raises :class:`HostLoading` when that takes the
        record's whole base: sent for the host to load in the background, and this batch runs in the worker."""
        answer = self.call("lookup", uid, index, record.token, keys, idle_before_ms, None)
        if answer[0] == "behind":
            held = answer[1]
            layers = None if held is None else record.layers_after(held)
            if layers is None:
                self.send_later("lookup", uid, index, record.token, [], None, ("base", record.base, record.layers))
                raise HostLoading(f"the state host loads partition {index}'s state")
            answer = self.call("lookup", uid, index, record.token, keys, idle_before_ms, ("layers", held, layers))
        if answer[0] != "ok":
            raise HostUnavailable("another attempt moved the state host's map on")
        return answer[1], answer[2]

    def apply_later(self, uid: str, index: int, token: bytes, new_token: bytes, layer: bytes, live_keys: int) -> None:
        """:meth:`apply` without waiting (the task goes on while the host applies; if it does not, its
        map stays at ``token`` and the next lookup catches it up)."""
        self.send_later("apply", uid, index, token, new_token, layer, False, None, live_keys)

    def send_later(self, *request) -> None:
        """Send ``request`` without waiting for its answer, which the next call reads and drops."""
        try:
            _send(self._sock, request)
            self._unread += 1
        except (OSError, ValueError) as e:
            _forget(self)
            warn_once(f"the state host did not take a {request[0]}: {e}")

    def give_path(self, path: list[str]) -> None:
        """Tell the host this worker's ``sys.path`` (user classes in keys and values), when it changed."""
        if tuple(path) != self.path:
            self.call("path", list(path))
            self.path = tuple(path)

    def statistics(self) -> dict:
        """The host's :meth:`StateHost.statistics`."""
        return self.call("statistics")[1]

    def apply(self, uid: str, index: int, token: bytes, new_token: bytes, layer: bytes | None, want_base: bool,
              delta_since_ms: int | None, live_keys: int) -> tuple[int, bytes | None, list | None]:
        answer = self.call("apply", uid, index, token, new_token, layer, want_base, delta_since_ms, live_keys)
        if answer[0] != "ok":
            raise HostUnavailable("another attempt moved the state host's map on")
        return answer[1], answer[2], answer[3]


_CLIENT: HostClient | None = None
_SPAWNED_AT = float("-inf")
_WARNED = False


def _forget(client: HostClient) -> None:
    global _CLIENT
    client.close()
    if _CLIENT is client:
        _CLIENT = None


def warn_once(reason: str) -> None:
    """One WARNING per worker: the state was kept in the worker for a reason other than a host starting."""
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning("mapWithState keeps its state in this Python worker: %s", reason)


def connect(name: str) -> HostClient:
    """A client of the state host listening on ``name`` (:func:`host_name`); OSError if none does,
    :class:`HostUnavailable` if it is not this user's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_WITHIN_S)
        sock.connect(name)
        if not _same_user(sock):
            raise HostUnavailable("the state host's socket belongs to another user")
        client = HostClient(sock)
        client.give_path(sys.path)
        return client
    except BaseException:
        sock.close()
        raise


def _spawn(name: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.Popen([sys.executable, "-m", "sparkwal.engine.state.state_host", name.lstrip("\0"), str(os.getppid())],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env=env, close_fds=True)


def host_client() -> HostClient | None:
    """This worker's client of its executor's state host; None where there is none yet (started in
    the background, at most every :data:`SPAWN_EVERY_S`: this task keeps the state itself) or
    can be none (not in an executor's Python worker, not Linux)."""
    global _CLIENT, _SPAWNED_AT
    if _CLIENT is not None:
        try:
            _CLIENT.give_path(sys.path)  # (a task's addPyFile)
        except HostUnavailable as e:
            warn_once(str(e))
        return _CLIENT
    from pyspark import TaskContext

    if TaskContext.get() is None or not sys.platform.startswith("linux"):
        return None
    try:
        name = host_name(executor_identity(os.getppid()))
    except (OSError, IndexError, ValueError) as e:
        warn_once(f"its executor has no identity to name a state host by: {e}")
        return None
    try:
        _CLIENT = connect(name)
        return _CLIENT
    except (ConnectionRefusedError, FileNotFoundError):
        pass
    except (OSError, HostUnavailable) as e:
        warn_once(str(e))
        return None
    if time.monotonic() - _SPAWNED_AT >= SPAWN_EVERY_S:
        _SPAWNED_AT = time.monotonic()
        try:
            _spawn(name)
        except OSError as e:
            warn_once(f"no state host could be started: {e}")
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
