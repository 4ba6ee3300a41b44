"""``--op hosted`` of :mod:`benchmarks.state_app`: the bound of a ``mapWithState`` whose state is
out of Spark's cache, kept and run by host processes. Not a contender: nothing recovers its
state, and it writes no snapshot.

Each of ``defaultParallelism`` host processes, forked from the driver, keeps the maps of the
partitions ``index % hosts`` sends it, and runs the mapping function itself. A batch is one pass
of its shuffled records, pipelined into the output: each partition's task sends its records to
its host, which calls the function once per record (sparkwal's :class:`~sparkwal.engine.State`,
as the engine calls it), keeps the values the keys it touched had before the batch (what a retried
attempt and a delta snapshot need: :class:`_Partition`) and answers the mapped records. Nothing is
cached but an anchor of one record a partition, once (placement: :func:`hosted_batch`), no second
Python worker reads a result, and no state crosses the socket: the work left is the batch's
shuffle, the calls, and the records' way to the host and back (pickled a second time: a Python
worker hands on records, not the shuffle's bytes). docs/benchmarks.md
(issue 67 part 3) says what a real design of this shape would add.

The wire, between a task and its host on this machine: a Linux abstract Unix socket named after
the driver's pid, 4-byte big-endian lengths and pickles (a benchmark's own processes only).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import select
import socket
import struct

_LEN = struct.Struct(">I")
_HOSTED: dict = {"hosts": None, "previous_ms": None, "anchor": None}  # the driver's: hosts, last batch, anchor
_MISSING = object()
UNDONE_BATCHES = 2  # the benchmark's snapshot interval, in batches


def _send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LEN.pack(len(data)) + data)


def _receive(sock: socket.socket):
    (n,) = _LEN.unpack(_exactly(sock, 4))
    return pickle.loads(_exactly(sock, n))


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the host closed the connection")
        buf += chunk
    return bytes(buf)


class _Partition:
    """One partition's state on its host: its values, the batch it is at, and, for each batch since
    the last snapshot (:data:`UNDONE_BATCHES`), the values its keys had before it. That is all a
    state with no timeout needs: a retried attempt undoes the newest batch, and a delta snapshot's
    rows are the keys those batches touched (stamped with the newest batch that touched each), so
    no update time is kept per key."""

    __slots__ = ("values", "at_ms", "undo")

    def __init__(self):
        self.values: dict = {}
        self.at_ms = None
        self.undo: list[tuple] = []  # (the batch before, the batch, {key: its value before or _MISSING})

    def roll_back(self) -> None:
        previous_ms, _, old = self.undo.pop()
        values = self.values
        for key, was in old.items():
            if was is _MISSING:
                values.pop(key, None)
            else:
                values[key] = was
        self.at_ms = previous_ms

    def run(self, records, previous_ms, batch_ms, func, st) -> list:
        values, old = self.values, {}
        mapped: list = []
        emit, wrap = mapped.append, st.wrap
        self.undo.append((self.at_ms, batch_ms, old))
        try:
            for key, value in records:
                current = values.get(key, _MISSING)
                if key not in old:
                    old[key] = current
                if current is _MISSING:
                    wrap(False, None)
                else:
                    wrap(True, current)
                emit(func(key, value, st))
                if st.isRemoved():
                    values.pop(key, None)
                elif st.isUpdated():
                    values[key] = st.getOption()
        except BaseException:
            self.roll_back()  # (a function that raised: the partition stays at the batch before)
            raise
        self.at_ms = batch_ms
        del self.undo[:-UNDONE_BATCHES]
        return mapped


def _serve(listener: socket.socket, func) -> None:
    """A host's loop: ``("batch", index, previous_ms, batch_ms, records)`` -> ``("ok", mapped)``;
    ``("behind", at_ms)`` when the partition is at neither the batch before nor this batch (a
    retried attempt: the batch is undone and run again); ``("error", message)`` when the function
    raised (the partition stays at the batch before)."""
    from sparkwal.engine import State

    st = State()
    partitions: dict[int, _Partition] = {}
    open_ = [listener]
    while True:
        for sock in select.select(open_, [], [])[0]:
            if sock is listener:
                open_.append(listener.accept()[0])
                continue
            try:
                _, index, previous_ms, batch_ms, records = _receive(sock)
            except (EOFError, OSError):
                open_.remove(sock)
                sock.close()
                continue
            part = partitions.setdefault(index, _Partition())
            if part.at_ms == batch_ms and part.undo and part.undo[-1][:2] == (previous_ms, batch_ms):
                part.roll_back()
            try:
                if part.at_ms != previous_ms:
                    answer = ("behind", part.at_ms)
                else:
                    answer = ("ok", part.run(records, previous_ms, batch_ms, func, st))
            except Exception as e:  # noqa: BLE001  the function's failure is the task's
                answer = ("error", f"{type(e).__name__}: {e}")
            try:
                _send(sock, answer)
            except OSError:  # a task killed meanwhile, or a zombie's: the next attempt asks again
                open_.remove(sock)
                sock.close()


def start_hosts(count: int, func) -> list[bytes]:
    """``count`` host processes forked from the driver (they end with its process group), each
    listening on an abstract socket: their addresses."""
    context = multiprocessing.get_context("fork")
    addresses = []
    for i in range(count):
        address = f"\0sparkwal-bench-hosted-{os.getpid()}-{i}".encode()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(64)
        context.Process(target=_serve, args=(listener, func), daemon=True).start()
        listener.close()
        addresses.append(address)
    return addresses


def hosted_batch(time, rdd):
    """The batch's partitioned records, run by the hosts: the mapped records (a ``transform``
    function, named in the checkpoint by module). The records are unioned with a cached anchor, one
    record a partition cached once: its blocks send each partition's task to the executor that
    cached it, whose hosts hold the partition (the placement a cluster needs; one executor here)."""
    from pyspark import StorageLevel

    from benchmarks.state_app import count_map

    n = rdd.getNumPartitions()
    if n == 0:  # an empty batch: no job, as the engine runs none for it
        return rdd
    if _HOSTED["hosts"] is None:
        _HOSTED["hosts"] = start_hosts(rdd.context.defaultParallelism, count_map)
        anchor = rdd.context.parallelize([(i, None) for i in range(n)], n).partitionBy(n)
        _HOSTED["anchor"] = anchor.persist(StorageLevel.MEMORY_ONLY)
    hosts, previous_ms, anchor = _HOSTED["hosts"], _HOSTED["previous_ms"], _HOSTED["anchor"]
    batch_ms = int(time.timestamp() * 1000)
    _HOSTED["previous_ms"] = batch_ms
    both = anchor.union(rdd)
    if both.getNumPartitions() != n:
        raise ValueError(f"the batch of {batch_ms} is not partitioned as the anchor ({both.getNumPartitions()} "
                         f"partitions after their union, not {n})")

    def run(index, records):
        records = iter(records)
        next(records)  # the anchor's record (the union's order)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(hosts[index % len(hosts)])
            _send(sock, ("batch", index, previous_ms, batch_ms, list(records)))
            answer = _receive(sock)
        if answer[0] != "ok":
            raise RuntimeError(f"partition {index}'s host answered {answer[0]}: {answer[1]}")
        return answer[1]

    return both.mapPartitionsWithIndex(run, preservesPartitioning=True)
