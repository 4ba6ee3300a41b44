"""WAL-off receiver blocks between executors: each executor's block server (a real process per
"executor", each with its own local directory) takes copies and serves them; a task elsewhere
fetches a block from any holder; a block is lost only with every copy; garbage, a wrong secret, a
bad tag or a path in a block id changes nothing and the server lives on."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

import pytest
from app_runs import run_app

from sparkwal.engine.receiver import wire
from sparkwal.engine.receiver.block_client import BlockServerError, connect, fetch_block, put_block
from sparkwal.engine.receiver.block_server import INFO, app_block_dir, ensure_block_server
from sparkwal.engine.receiver.blocks import (BlockReadError, LocalBlockHandler, block_tag, read_block,
                                    serialize_block)

APP, SECRET = "app-blocks", os.urandom(32)


@pytest.fixture
def executors(tmp_path, monkeypatch):
    """``at(name)`` makes this process look like executor ``name`` (its own local dirs) and
    returns that executor's block server; every server started is killed at the end."""
    started = []

    def at(name: str):
        monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / name))
        copy = ensure_block_server(APP, SECRET, "127.0.0.1", name)
        with open(os.path.join(app_block_dir(APP), INFO)) as f:
            started.append(json.load(f)["pid"])
        return copy

    yield at
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_server(tmp_path, name: str) -> None:
    with open(tmp_path / name / "sparkwal-blocks" / APP / INFO) as f:
        os.kill(json.load(f)["pid"], signal.SIGKILL)


def test_a_block_is_copied_to_a_peer_and_read_from_any_copy(tmp_path, executors):
    b = executors("b")
    c = executors("c")
    a = executors("a")
    assert executors("a") == a  # found again, not started twice
    handler = LocalBlockHandler(APP, 7, SECRET, server=a, peers=(a, b, c), replication=2)
    copies = handler.store("input-7-1000-ab", serialize_block(["x", ("y", 1)]))
    assert copies[0] == a and len(copies) == 2 and copies[1] in (b, c)
    peer = "b" if copies[1] == b else "c"
    assert (tmp_path / peer / "sparkwal-blocks" / APP / "7" / "input-7-1000-ab").exists()

    executors("d")  # a task on a fourth executor, which holds no copy, reads over the network
    where = [(x.executor_id, x.host, x.port) for x in copies]
    assert read_block(APP, SECRET, 7, "input-7-1000-ab", where) == ["x", ("y", 1)]
    kill_server(tmp_path, "a")  # the receiving executor is gone: the replica serves
    assert read_block(APP, SECRET, 7, "input-7-1000-ab", where) == ["x", ("y", 1)]
    kill_server(tmp_path, peer)  # every copy gone: lost, and the error names each
    with pytest.raises(BlockReadError, match=r"block input-7-1000-ab of stream 7 could not be read "
                       r"\(not in this executor's .*executor a \(127\.0\.0\.1:\d+\).*executor "
                       + peer + r".*writeAheadLog"):
        read_block(APP, SECRET, 7, "input-7-1000-ab", where)


def test_replicas_are_cleaned_with_the_receivers_blocks(tmp_path, executors):
    b = executors("b")
    a = executors("a")
    handler = LocalBlockHandler(APP, 1, SECRET, server=a, peers=(b,), replication=2)
    handler.store("input-1-1000-aa", serialize_block([1]))
    handler.store("input-1-3000-aa", serialize_block([3]))
    handler.cleanup_old_blocks(2000)
    for name in "ab":
        assert sorted(os.listdir(tmp_path / name / "sparkwal-blocks" / APP / "1")) == ["input-1-3000-aa"]


def test_a_block_with_one_copy_asked_for_two_warns_once_and_keeps_its_copy(tmp_path, executors, caplog):
    a = executors("a")
    handler = LocalBlockHandler(APP, 2, SECRET, server=a, peers=(a,), replication=2)
    for t in (1000, 2000):
        assert handler.store(f"input-2-{t}-aa", serialize_block([t])) == [a]
    assert sum("1 of the 2 copies" in r.message for r in caplog.records) == 1


def test_a_damaged_copy_is_never_unpickled_and_the_next_copy_serves(tmp_path, executors):
    b = executors("b")
    a = executors("a")
    handler = LocalBlockHandler(APP, 3, SECRET, server=a, peers=(b,), replication=2)
    handler.store("input-3-1000-aa", serialize_block(["ok"]))
    path = tmp_path / "a" / "sparkwal-blocks" / APP / "3" / "input-3-1000-aa"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    executors("c")
    where = [("a", a.host, a.port), ("b", b.host, b.port)]
    assert read_block(APP, SECRET, 3, "input-3-1000-aa", where) == ["ok"]
    with pytest.raises(BlockReadError, match="HMAC does not match"):
        read_block(APP, SECRET, 3, "input-3-1000-aa", where[:1])


def _frame(kind, args):
    body = wire.encode_frame(kind, 0, args)
    return body


def test_the_server_drops_strangers_garbage_bad_tags_and_paths_and_lives_on(tmp_path, executors):
    a = executors("a")
    with pytest.raises(BlockServerError, match="handshake"):
        connect((a.host, a.port), os.urandom(32))
    with socket.create_connection((a.host, a.port)) as s:  # garbage instead of a handshake
        s.sendall(b"GET / HTTP/1.1\r\n\r\n" * 10)
    data = serialize_block(["evil"])
    with pytest.raises(BlockServerError):  # a tag that does not match the bytes
        put_block((a.host, a.port), SECRET, 4, "input-4-1000-aa", b"\0" * 32, data)
    assert not (tmp_path / "a" / "sparkwal-blocks" / APP / "4" / "input-4-1000-aa").exists()
    for bad in ("../../x", "input-4-1000-aa/../../x", "input-5-1000-aa"):  # not a block of stream 4
        with pytest.raises(BlockServerError):
            put_block((a.host, a.port), SECRET, 4, bad, block_tag(SECRET, bad, data), data)
    for kind, args in ((wire.FETCH_BLOCK, [4, "input-4-1000-aa", "extra"]), (wire.REGISTER, [0, "R", "h", "e", 1])):
        with connect((a.host, a.port), SECRET) as s:
            s.sendall(_frame(kind, args) if kind != wire.FETCH_BLOCK else
                      struct.pack(">I", 4) + b"\xff\xff\xff\xff")
            assert s.recv(1) == b""  # dropped
    with connect((a.host, a.port), SECRET) as s:  # a length over the bound: dropped unread
        s.sendall(struct.pack(">I", wire.MAX_FRAME + 1))
        assert s.recv(1) == b""
    put_block((a.host, a.port), SECRET, 4, "input-4-1000-aa", block_tag(SECRET, "input-4-1000-aa", data), data)
    assert fetch_block((a.host, a.port), SECRET, 4, "input-4-1000-aa")[1] == data
    assert "No such file" in fetch_block((a.host, a.port), SECRET, 4, "input-4-9999-aa")
    big = os.urandom(3 * wire.CHUNK + 5)  # several chunks
    put_block((a.host, a.port), SECRET, 4, "input-4-2000-aa", block_tag(SECRET, "input-4-2000-aa", big), big)
    assert fetch_block((a.host, a.port), SECRET, 4, "input-4-2000-aa") == (
        block_tag(SECRET, "input-4-2000-aa", big), big)


def test_a_later_context_with_a_secret_of_its_own_gets_its_own_server_and_the_earlier_one_makes_way(
        tmp_path, monkeypatch):
    """A second StreamingContext on the same SparkContext: the same application id, a new secret.
    The first context's server would refuse it; its driver's probe starts a server of its own, the
    earlier one exits, and neither context's tasks take the executor from the other."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "a"))
    info = os.path.join(app_block_dir(APP), INFO)
    earlier_secret, later_secret = os.urandom(32), os.urandom(32)
    pids = []
    try:
        earlier = ensure_block_server(APP, earlier_secret, "127.0.0.1", "a")
        pids.append(json.load(open(info))["pid"])
        assert ensure_block_server(APP, earlier_secret, "127.0.0.1", "a") == earlier  # found again
        with pytest.raises(BlockServerError, match="executor a's block server holds another StreamingContext's"):
            ensure_block_server(APP, later_secret, "127.0.0.1", "a")  # a receiver's task: no takeover
        later = ensure_block_server(APP, later_secret, "127.0.0.1", "a", replace=True)  # the driver's probe
        pids.append(json.load(open(info))["pid"])
        assert later.port != earlier.port and pids[1] != pids[0]
        assert ensure_block_server(APP, later_secret, "127.0.0.1", "a") == later
        with pytest.raises(BlockServerError, match="another StreamingContext's"):  # a late task of the
            ensure_block_server(APP, earlier_secret, "127.0.0.1", "a")  # earlier context cannot take it back
        assert earlier_secret.hex() not in open(info).read() and later_secret.hex() not in open(info).read()

        data = serialize_block(["x"])
        tag = block_tag(later_secret, "input-3-1000-aa", data)
        put_block((later.host, later.port), later_secret, 3, "input-3-1000-aa", tag, data)
        assert fetch_block((later.host, later.port), later_secret, 3, "input-3-1000-aa") == (tag, data)
        with pytest.raises(BlockServerError, match="handshake"):
            connect((later.host, later.port), earlier_secret)
        deadline = time.monotonic() + 15  # the earlier server looks at server.json once a second
        while os.waitpid(pids[0], os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the earlier context's server did not make way"
            time.sleep(0.05)
        assert os.waitpid(pids[1], os.WNOHANG) == (0, 0)  # the later one serves on
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("replication", [1, 2])
@pytest.mark.driver
def test_wal_off_blocks_are_read_on_the_executor_that_did_not_receive_them(tmp_path, replication):
    """Two executor JVMs of one core each: the receiver fills one, so every batch task runs on the
    other and reads each block from its copy there (replication 2) or over the network from the
    receiving executor (replication 1). Before block servers, every such batch failed."""
    report = run_app("block_fetch_app.py", ["local-cluster[2,1,1024]", "3000", str(replication)],
                     cwd=tmp_path, env={"PYSPARK_PYTHON": sys.executable}, timeout_s=240)
    assert report["failed_batches"] == 0, report["stderr"]
    assert report["lines"] == report["total"] == 3000, report["stderr"]  # each line once
    assert report["receiver_executor"] not in report["reading_executors"]
