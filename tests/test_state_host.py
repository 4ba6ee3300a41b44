"""The state host (engine/state/state_host.py): mapWithState's partitions live in one process per
executor. It answers only at the state a task's record names, refuses a second attempt's layer,
survives garbage and ends with its parent; a stream gives the same records and state with it, without
it, and with it SIGKILLed between batches."""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from pyspark import cloudpickle
from test_map_with_state import run_batches

from sparkwal.engine import State, StateSpec
from sparkwal.engine.state.hosted import update_on_host
from sparkwal.engine.state.map_with_state import _update_partition
from sparkwal.engine.state.state_host import (MAX_FRAME, HostClient, HostLoading, HostUnavailable, StateHost, connect,
                                              host_client, host_name)
from sparkwal.engine.state.state_map import StateMap, StateRecord, new_token, record_after

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its mapping functions run in tasks


def state_of(pairs: dict, time_ms: int = 0) -> StateMap:
    state = StateMap()
    for k, v in pairs.items():
        state.put(k, v, time_ms)
    return state


def layer(time_ms: int, puts: dict, gone=()) -> bytes:
    return pickle.dumps((time_ms, list(puts), list(puts.values()), list(gone), 0))


def test_the_host_answers_only_at_the_state_a_record_names_and_refuses_a_second_attempt():
    host = StateHost()
    record = StateRecord.of(0, state_of({"a": 1, "b": 2, "c": 3}), [])
    assert host.handle(("lookup", "u", 0, record.token, ["a", "x"], None, None)) == ("behind", None)
    catch_up = ("base", record.base, record.layers)
    assert host.handle(("lookup", "u", 0, record.token, ["a", "x"], None, catch_up)) == ("ok", {"a": 1}, [])
    first, second = new_token(), new_token()
    assert host.handle(("apply", "u", 0, record.token, first, layer(500, {"a": 5}, ["b"]), False, None, 100)) \
        == ("ok", 2, None, None)
    # another attempt of the same batch, from the same record: refused, the map stays the first one's
    assert host.handle(("apply", "u", 0, record.token, second, layer(500, {"a": 9}), False, None, 100)) \
        == ("behind", first)
    assert host.handle(("lookup", "u", 0, first, ["a", "b"], None, None)) == ("ok", {"a": 5}, [])
    # a record the host's map is behind: caught up with the layers after the map's token
    after = record_after(StateRecord(0, record.base, [layer(500, {"a": 5}, ["b"])], [],
                                     tokens=[record.token, first]), 1000, layer(1000, {"d": 4}), [], None, 3,
                         second, None)
    assert host.handle(("lookup", "u", 0, after.token, ["d"], None, None)) == ("behind", first)
    assert host.handle(("lookup", "u", 0, after.token, ["d"], None, ("layers", first, after.layers_after(first)))) \
        == ("ok", {"d": 4}, [])
    # idle keys: updated before the threshold, not among the batch's keys, in update order
    assert host.handle(("lookup", "u", 0, after.token, ["c"], 400, None)) == ("ok", {"c": 3}, [])
    assert host.handle(("lookup", "u", 0, after.token, [], 600, None))[2] == [("c", 3), ("a", 5)]
    answer = host.handle(("apply", "u", 0, after.token, new_token(), None, True, 0, 100))
    assert pickle.loads(answer[2]).values == after.state.values  # the host's map is the record's state
    assert sorted(r[0] for r in answer[3]) == ["a", "b", "d"]  # rows since 0: updates and the removal
    stats = host.statistics()
    assert (stats["loads"], stats["catch_ups"], stats["refused"], stats["maps"], stats["keys"]) == (1, 1, 1, 1, 3)


def test_the_host_holds_at_most_live_keys_dropping_the_oldest_maps():
    host = StateHost()
    for index in range(3):
        record = StateRecord.of(0, state_of({f"{index}-{k}": k for k in range(10)}), [])
        host.handle(("lookup", "u", index, record.token, [], None, ("base", record.base, [])))
        host.handle(("apply", "u", index, record.token, record.token, None, False, None, 25))
    assert host.statistics()["maps"] == 2 and host.statistics()["keys"] == 20  # partition 0's went first


class InProcess(HostClient):
    """A client of a host in this process: every request and answer pickled as on the wire."""

    def __init__(self, host: StateHost):
        self.host = host

    def call(self, *request):
        answer = pickle.loads(pickle.dumps(self.host.handle(pickle.loads(pickle.dumps(request)))))
        if answer[0] == "error":
            raise HostUnavailable(answer[1])
        return answer

    def send_later(self, *request):
        self.call(*request)


def random_mapping(key, value, state):
    if value is None:
        return ("timed out", key, state.get())
    if value == 0:
        if state.exists() or random.random() < 0.5:
            state.remove()  # (a key not held, removed: nothing to remove)
        return ("removed", key)
    if value == 1:
        return ("read", key, state.getOption())
    state.update((state.getOption() or 0) + value)
    if value == 7:
        state.remove()  # put, then removed in the same call
    return key, state.getOption()


def test_random_batches_give_the_same_records_on_the_host_as_in_the_worker():
    rng, from_layers, loaded = random.Random(1), 0, 0
    for trial in range(200):
        client = InProcess(StateHost())
        state = StateMap()
        for k in range(rng.randint(0, 8)):
            state.put(f"k{k}", k, rng.choice([0, 100, 200]))
        in_worker = on_host = StateRecord.of(0, state, [])
        timeout = rng.choice([None, 300, 1000])
        for b in range(1, 12):
            t = 500 * b
            batch = [(f"k{rng.randint(0, 10)}", rng.choice([0, 1, 2, 3, 7])) for _ in range(rng.randint(0, 6))]
            delta_since, seed = rng.choice([None, t - 1000]), rng.random()
            random.seed(seed)
            worker_run = _update_partition(0, [(0, in_worker), *batch], random_mapping, f"w{trial}", t, timeout,
                                           t - 1500, delta_since, 100, hosted=False)
            after_worker = next(worker_run)[1]
            random.seed(seed)
            try:
                after_host = update_on_host(client, 0, on_host, batch, State(), random_mapping, "h", t, timeout,
                                            t - 1500, delta_since, 100)
            except HostLoading:  # the host loads the state meanwhile; the worker runs this batch, as the task does
                random.seed(seed)
                after_host = next(_update_partition(0, [(0, on_host), *batch], random_mapping, "h", t, timeout,
                                                    t - 1500, delta_since, 100, hosted=False))[1]
                loaded += 1
            where = (trial, b)
            assert after_host.mapped == after_worker.mapped, where
            assert after_host.state.values == after_worker.state.values, where
            assert list(after_host.state.times.items()) == list(after_worker.state.times.items()), where
            assert after_host.keys == after_worker.keys, where
            if delta_since is not None:  # a delta's rows, in the order the state's own rows_since gives
                assert after_host.rows_since(delta_since) == after_worker.state.rows_since(delta_since), where
            for since in range(max(0, t - 1500), t, 250):  # from the layers, where they reach back (removals kept)
                rows = after_host.layer_rows_since(since)
                assert rows is None or rows == after_host.state.rows_since(since), (where, since)
                from_layers += rows is not None
            assert (after_host.tokens == on_host.tokens) == (after_worker.tokens == in_worker.tokens), where
            in_worker, on_host = after_worker, after_host
    assert from_layers > 1000, from_layers  # (the layers did reach back, often)
    assert loaded == 200  # each trial's first batch, while its host loaded the state
    stats = client.statistics()
    # the last trial's host: loaded in the background at its first batch, caught up with that batch's layer at
    # the second (the worker ran the first), never behind after
    assert (stats["loads"], stats["behind"], stats["catch_ups"]) == (1, 2, 1)


@pytest.fixture
def host_process():
    """A state host on a name of this test's own, under a parent this test can end."""
    parent = subprocess.Popen(["sleep", "600"], start_new_session=True)
    name = host_name(f"test-{uuid.uuid4().hex}")
    host = subprocess.Popen([sys.executable, "-m", "sparkwal.engine.state.state_host", name.lstrip("\0"),
                             str(parent.pid)], start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            client = connect(name)
            break
        except OSError:
            assert time.monotonic() < deadline, "the state host did not listen within 30 s"
            time.sleep(0.05)
    yield name, client, parent, host
    client.close()
    for p in (host, parent):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def counted(key, value, state):
    if value is None:
        return ("timed out", key)
    state.update((state.getOption() or 0) + value)
    return key, state.get()


def test_a_batch_on_the_host_makes_the_record_the_worker_would(host_process):
    name, client, _, _ = host_process
    record = StateRecord.of(0, state_of({"a": 1, "old": 7}, time_ms=0), [])
    batch = [("a", 2), ("b", 1), ("a", 1)]
    with pytest.raises(HostLoading):  # a host without the state: it loads it while the worker runs the batch
        update_on_host(client, 0, record, batch, State(), counted, "u", 5000, 4000, 0, 0, 100)
    assert client.statistics()["loads"] == 1
    after = update_on_host(client, 0, record, batch, State(), counted, "u", 5000, 4000, 0, 0, 100)
    assert after.mapped == [("a", 3), ("b", 1), ("a", 4), ("timed out", "old")]
    assert after.state.values == {"a": 4, "b": 1}
    assert sorted((k, removed) for k, _, _, removed in after.delta[1]) == [("a", False), ("b", False), ("old", True)]
    again = update_on_host(client, 0, after, [], State(), counted, "u", 5500, None, 0, None, 100)
    assert again.tokens == after.tokens and again.mapped == []  # nothing touched: the same state, no layer
    stats = client.statistics()
    assert (stats["loads"], stats["applied"]) == (1, 1)


def test_the_host_survives_garbage_and_ends_with_its_parent(host_process):
    name, client, parent, host = host_process
    for garbage in (b"\xff\xff\xff\xff", (5).to_bytes(4, "big") + b"nopkl", (MAX_FRAME + 1).to_bytes(4, "big")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(name)
            sock.sendall(garbage)
            sock.settimeout(10)
            assert sock.recv(1) == b""  # hung up on, nothing unpickled into an answer
    assert client.statistics()["lookups"] == 0  # still serving
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait()
    assert host.wait(timeout=10) == 0


@pytest.fixture
def host_setting(spark_context):
    """Sets ``spark.sparkwal.state.host`` for the streaming contexts the test makes."""
    conf = spark_context._jsc.sc().conf()  # the live SparkConf, which getConf() copies
    yield lambda on: conf.set("spark.sparkwal.state.host", str(on).lower())
    conf.remove("spark.sparkwal.state.host")


# 0.5 s batches: "b" and "c" idle past the 1 s timeout, "gone" removed, batches with nothing
BATCHES = [[("a", 1), ("b", 1), ("c", 1), ("gone", 1), ("a", 2)], [("a", 1), ("gone", -5)], [("a", 1), ("b", 1)],
           [], [("a", 1), ("gone", 2), ("gone", -9)], [], [("d", 1)], [], [], []]


def signed(key, value, state):
    if value is None:
        return ("timed out", key, state.get())
    total = (state.getOption() or 0) + value
    if total < 0:
        state.remove()
        return ("removed", key)
    state.update(total)
    return key, total


def host_statistics(sc) -> list:
    return sc.parallelize(range(4), 4).map(lambda _: host_client() and host_client().statistics()).collect()


@pytest.mark.slow
def test_a_stream_gives_the_same_records_and_state_with_the_host_without_it_and_with_it_killed(spark_context,
                                                                                             host_setting):
    def spec():
        return StateSpec.function(signed).timeout(1.0).numPartitions(2)

    host_setting(False)
    with_none = run_batches(spark_context, BATCHES, spec(), interval=1.0)
    host_setting(True)
    host_statistics(spark_context)  # started in the background by the first worker that finds none
    deadline = time.monotonic() + 30
    while not all(host_statistics(spark_context)):
        assert time.monotonic() < deadline, "no state host within 30 s"
        time.sleep(0.1)
    before = host_statistics(spark_context)[0]
    hosted = run_batches(spark_context, BATCHES, spec(), interval=1.0)
    after = host_statistics(spark_context)[0]
    assert after["applied"] > before["applied"] and after["pid"] == before["pid"]
    assert hosted == with_none
    records, states = with_none
    assert ("timed out", "b", 2) in records[3000] and ("removed", "gone") in records[1000]  # (what it covers)
    assert records[4000] == [("timed out", "a", 6)] and records[4500] == [] and states[4500] == {"d": 1}

    killed = []

    def kill_the_host(_ssc, time_ms):
        if time_ms == 1500:
            pid = host_statistics(spark_context)[0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    assert run_batches(spark_context, BATCHES, spec(), interval=1.0, between=kill_the_host) == with_none
    assert killed
