"""Receivers on local[2]: what a receiver stores reaches the batches, once, through the public API."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import pytest
from pyspark import cloudpickle

from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.engine import Receiver, StreamingContext, StreamingListener
from sparkwal.engine.receiver import ReceiverNotStartedError, SocketReceiver
from sparkwal.engine.cluster import total_cores
from sparkwal.wal import FileBasedWriteAheadLog, ManualClock, RecordHandle

# the receivers below run in Spark's Python workers, which cannot import this test module
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def wait_until(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while time.monotonic() < deadline:
        if predicate():
            return
        pause.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Events(StreamingListener):
    def __init__(self):
        self.started, self.errors, self.stopped, self.batches = [], [], [], []

    def onReceiverStarted(self, e):
        self.started.append(e.receiverInfo())

    def onReceiverError(self, e):
        self.errors.append(e.receiverInfo())

    def onReceiverStopped(self, e):
        self.stopped.append(e.receiverInfo())

    def onBatchCompleted(self, e):
        self.batches.append(e.batchInfo())


class LineServer:
    """A TCP server that sends ``lines`` to the first client and keeps the connection open."""

    def __init__(self, lines):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.done = threading.Event()
        threading.Thread(target=self._serve, args=(list(lines),), daemon=True).start()

    def _serve(self, lines):
        conn, _ = self.server.accept()
        conn.sendall("".join(f"{line}\n" for line in lines).encode())
        self.done.wait(120)
        conn.close()

    def close(self):
        self.done.set()
        self.server.close()


def collect_into(stream, sink: list):
    stream.foreachRDD(lambda rdd: sink.extend(rdd.collect()))


def test_socket_text_stream_gets_every_line_once_with_the_receiver_wal(spark_context, tmp_path):
    lines = [f"line {i} é" for i in range(3000)]
    server = LineServer(lines)
    ssc = StreamingContext(spark_context, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    got: list[str] = []
    collect_into(ssc.socketTextStream("127.0.0.1", server.port), got)
    events = Events()
    ssc.addStreamingListener(events)
    ssc.start()
    try:
        wait_until(lambda: len(got) >= len(lines), what="every line")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        server.close()
    assert sorted(got) == sorted(lines)
    assert sum(b.numRecords() for b in events.batches) == len(lines)  # BatchInfo counts blocks' records
    info = events.started[0]
    assert (info.streamId(), info.name(), info.active(), info.executorId()) == (0, "SocketReceiver", True, "driver")
    assert events.stopped and not events.stopped[-1].active()
    # blocks went through the receiver WAL of this driver's leadership epoch
    (wal_dir,) = (tmp_path / "ckpt" / "receivedData").glob("0-e*")
    assert os.listdir(wal_dir)


def test_without_a_checkpoint_blocks_stay_on_the_receiving_executor(spark_context):
    lines = [f"w{i}" for i in range(500)]
    server = LineServer(lines)
    ssc = StreamingContext(spark_context, 0.5)
    got: list[str] = []
    collect_into(ssc.socketTextStream("127.0.0.1", server.port), got)
    ssc.start()
    try:
        wait_until(lambda: len(got) >= len(lines), what="every line")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        server.close()
    assert sorted(got) == sorted(lines)


class BlockStorer(Receiver):
    """Stores 5 blocks with storeBlock, appending to ``acks`` after each returns."""

    def __init__(self, acks: str):
        super().__init__()
        self.acks = acks

    def onStart(self):
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for i in range(5):
            self.storeBlock([f"b{i}-{j}" for j in range(10)], metadata={"chunk": i})
            with open(self.acks, "a") as f:
                f.write(f"{i}\n")

    def onStop(self):
        pass


@pytest.mark.compat
def test_store_block_returns_once_the_block_is_durable_and_recorded(spark_context, tmp_path):
    clock = ManualClock(1_000_000)
    acks = tmp_path / "acks"
    ssc = StreamingContext(spark_context, 1.0, clock=clock)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    got: list[str] = []
    collect_into(ssc.receiverStream(BlockStorer(str(acks))), got)
    ssc.start()
    try:
        wait_until(lambda: acks.exists() and len(acks.read_text().split()) == 5, what="5 acknowledged blocks")
        # no batch ran (the clock stands still): the driver recorded every acknowledged block
        blocks = ssc.receivedBlockTracker.get_unallocated_blocks(0)
        assert [b.metadata for b in blocks] == [{"chunk": i} for i in range(5)]
        assert all(b.num_records == 10 for b in blocks)
        reader = FileBasedWriteAheadLog(str(tmp_path / "ckpt" / "receivedData" / f"0-e{ssc.leaderEpoch}"))
        # in the WAL, named relative to the checkpoint (which may be copied or moved)
        assert all(b.wal_handle.path.startswith(f"receivedData/0-e{ssc.leaderEpoch}/") for b in blocks)
        layout = CheckpointLayout(str(tmp_path / "ckpt"))
        assert all(reader.read(RecordHandle(layout.locate(b.wal_handle.path), *b.wal_handle[1:]))
                   for b in blocks)
        clock.advance(1_000)  # batch 1,001,000 takes them
        wait_until(lambda: len(got) == 50, what="the batch")
    finally:
        ssc.stop(stopSparkContext=False)
    assert sorted(got) == sorted(f"b{i}-{j}" for i in range(5) for j in range(10))


class RestartsOnce(Receiver):
    """Stores 3 records; the first time it then asks for a restart (the marker file says which)."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def onStart(self):
        first = not os.path.exists(self.marker)
        open(self.marker, "a").close()
        threading.Thread(target=self._run, args=(first,), daemon=True).start()

    def _run(self, first):
        for i in range(3):
            self.store(("first" if first else "second", i))
        if first:
            self.restart("asked to restart", ValueError("test"), millisecondsDelay=10)

    def onStop(self):
        pass


def test_a_receiver_restart_reports_its_error_and_keeps_receiving(spark_context, tmp_path):
    ssc = StreamingContext(spark_context, 0.5)
    got: list = []
    collect_into(ssc.receiverStream(RestartsOnce(str(tmp_path / "marker"))), got)
    events = Events()
    ssc.addStreamingListener(events)
    ssc.start()
    try:
        wait_until(lambda: len(got) >= 6, what="records of both starts")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(got) == sorted([("first", i) for i in range(3)] + [("second", i) for i in range(3)])
    assert any("asked to restart" in e.lastErrorMessage() and "ValueError" in e.lastError()
               for e in events.errors)


class FailsFirstStart(Receiver):
    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def onStart(self):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("cannot reach the source yet")
        threading.Thread(target=lambda: [self.store(i) for i in range(20)], daemon=True).start()

    def onStop(self):
        pass


def test_a_receiver_that_fails_to_start_runs_again_as_a_new_job(spark_context, tmp_path):
    ssc = StreamingContext(spark_context, 0.5)
    got: list = []
    collect_into(ssc.receiverStream(FailsFirstStart(str(tmp_path / "marker"))), got)
    events = Events()
    ssc.addStreamingListener(events)
    ssc.start()
    try:
        wait_until(lambda: len(got) >= 20, what="the second start's records")
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert sorted(got) == list(range(20))
    assert "cannot reach the source yet" in events.stopped[0].lastError()
    assert len(events.started) >= 2


class Counter(Receiver):
    """Stores 0, 1, 2, ... until stopped; writes how many store() calls returned to ``done``."""

    def __init__(self, done: str):
        super().__init__()
        self.done = done
        self._running = False

    def onStart(self):
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        n = 0
        while self._running:
            try:
                self.store(n)
            except RuntimeError:
                break
            n += 1
        with open(self.done, "w") as f:
            f.write(str(n))

    def onStop(self):
        self._running = False
        self._thread.join()

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_thread", None)
        return state


def test_a_graceful_stop_processes_every_record_stored_before_it(spark_context, tmp_path):
    done = tmp_path / "done"
    ssc = StreamingContext(spark_context, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    got: list = []
    collect_into(ssc.receiverStream(Counter(str(done))), got)
    ssc.start()
    wait_until(lambda: len(got) > 1000, what="some records")
    ssc.stop(stopSparkContext=False, stopGraceFully=True)
    stored = int(done.read_text())
    assert sorted(got) == list(range(stored))  # the last block was pushed, allocated and processed


def test_receiver_api_misuse_is_refused_clearly(spark_context):
    with pytest.raises(ReceiverNotStartedError, match="only on an executor"):
        Counter("x").store(1)
    with pytest.raises(NotImplementedError):
        Receiver().onStart()
    with pytest.raises(ValueError, match="port"):
        SocketReceiver("127.0.0.1", 0)
    ssc = StreamingContext(spark_context, 1.0)
    with pytest.raises(TypeError, match="engine.Receiver"):
        ssc.receiverStream(object())
    assert ssc.socketTextStream("127.0.0.1", 9).receiver.streamId == 0


def test_total_cores_of_each_master():
    assert total_cores("local[2]", 8) == 2
    assert total_cores("local", 8) == 1
    assert total_cores("local-cluster[2,1,1024]", 8) == 2
    assert total_cores("spark://h:7077", 6) == 6


def test_garbage_at_the_running_apps_endpoint_changes_nothing(spark_context, tmp_path):
    lines = [f"g{i}" for i in range(2000)]
    server = LineServer(lines)
    ssc = StreamingContext(spark_context, 0.5)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    got: list[str] = []
    collect_into(ssc.socketTextStream("127.0.0.1", server.port), got)
    ssc.start()
    try:
        endpoint = ssc.receiverTracker.endpoint
        for garbage in [b"\x00" * 10_000, b"SWRP\x01" + os.urandom(64), b"\xff\xff\xff\xff" * 4, b"SW"]:
            s = socket.create_connection(endpoint.address)
            s.recv(64)
            try:
                s.sendall(garbage)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(10)
                s.recv(64)
            except OSError:
                pass
            s.close()
        wait_until(lambda: len(got) >= len(lines), what="every line")
        wait_until(lambda: endpoint.statistics().authentication_failures == 4, what="4 drops")
        stats = ssc.receiverTracker.statistics()
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        server.close()
    assert sorted(got) == sorted(lines)  # the app kept running and counted exactly its own data
    assert stats.blocks_refused == 0
    assert endpoint.statistics().protocol_errors == 0 and endpoint.statistics().messages > 0


class Idle(Receiver):
    """Stores nothing: only its launch is watched."""

    def onStart(self):
        pass

    def onStop(self):
        pass


class _Posted:
    def __init__(self):
        self.events: list = []

    def post(self, event) -> None:
        self.events.append(event)


def test_a_takeover_launches_its_receivers_once_its_first_batch_completed(spark_context, caplog):
    """A hot standby that takes over with batches to re-run (a handover's: those due while the
    leadership moved) runs the first before its receivers launch (spark.sparkwal.standby.receiverStartWait:
    receivers starting beside it slowed a handover's first output); that batch completed launches
    them, or the wait running out; other starts launch at once."""
    from sparkwal.engine.config import StreamingConf
    from sparkwal.engine.driver.receiver_lifecycle import make_receiver_tracker, start_receivers
    from sparkwal.tracker import ReceivedBlockTracker

    class Launches:
        def __init__(self):
            self.calls: list[tuple[float, int]] = []

        def start(self, hold_s: float, first_ms: int | None) -> None:
            self.calls.append((hold_s, first_ms))

    launches = Launches()
    settings = StreamingConf({"spark.sparkwal.standby.receiverStartWait": "30s"})
    start_receivers(launches, "takeover", settings, (10_100, 10_000))  # held until batch 10,000 completed
    start_receivers(launches, "takeover", settings, ())  # nothing to run first: at once
    start_receivers(launches, "restart", settings, (10_000,))  # a cold restart: at once
    start_receivers(launches, "takeover", StreamingConf({"spark.sparkwal.standby.receiverStartWait": "0"}),
                    (10_000,))
    assert launches.calls == [(30.0, 10_000), (0.0, None), (0.0, 10_000), (0.0, 10_000)]

    clock = ManualClock(10_000)
    caplog.set_level("INFO", logger="sparkwal.engine.receiver.receiver_tracker")
    for hold_s, completes, said in ((0.2, False, "0.2 s after the start, no batch completed yet"),
                                    (60.0, True, "once the first batch completed")):
        ssc = StreamingContext(spark_context, 0.5)
        stream = ssc.receiverStream(Idle())
        blocks = ReceivedBlockTracker([stream.input_id], clock=clock)
        tracker = make_receiver_tracker(ssc.driver.graph, blocks, sc=spark_context, settings=StreamingConf({}),
                                        clock=clock, events=_Posted(), batch_ms=500, report_input=lambda *a: None,
                                        checkpoint=None, leader_epoch=None)
        caplog.clear()
        tracker.on_batch_completed(10_000, None)  # before the start: launches nothing
        tracker.start(hold_s=hold_s, first_ms=10_000)
        try:
            tracker.on_batch_completed(9_500, None)  # an earlier batch: still held
            if completes:
                tracker.on_batch_completed(10_000, None)  # (a batch of no blocks)
            wait_until(lambda: tracker.statistics().receiver_jobs_launched == 1, what="the receiver's launch")
            assert any(said in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        finally:
            tracker.stop(graceful=False)
            blocks.stop()
