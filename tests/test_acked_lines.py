"""The acked-line receiver's stop: a chunk being stored when the receiver stops (a graceful stop, a
handover to a standby) is acknowledged before the connection closes, so the next receiver is not
sent it again (a duplicate that only a crash may cause)."""

from __future__ import annotations

import threading

from sparkwal.engine.receiver.acked_lines import AckedLineReceiver, AckedLineSource

SECRET = "acked-lines-test-secret"


class BlockingStore:
    """The receiver's supervisor as the receiver calls it: ``push_block`` (``storeBlock``) waits
    until the test releases it, as a WAL write and the driver's record of the block may."""

    receiver_started, stopped = True, False

    def __init__(self):
        self.storing, self.release = threading.Event(), threading.Event()
        self.blocks: list[list[str]] = []
        self.restarts: list[str] = []

    def push_block(self, records, metadata) -> None:
        self.storing.set()
        assert self.release.wait(30)
        self.blocks.append(list(records))

    def restart_receiver(self, message, error=None, delay=None) -> None:
        self.restarts.append(message)


def receiver_of(source: AckedLineSource, store: BlockingStore) -> AckedLineReceiver:
    receiver = AckedLineReceiver("127.0.0.1", source.address[1], SECRET)
    receiver.bind(0, store)
    receiver.onStart()
    return receiver


def test_a_stop_during_a_store_acknowledges_the_chunk_and_the_next_receiver_gets_only_new_lines():
    source = AckedLineSource(SECRET)
    try:
        first = BlockingStore()
        receiver = receiver_of(source, first)
        source.offer(["a", "b", "c"])
        assert first.storing.wait(30)
        stopped = threading.Event()
        stopper = threading.Thread(target=lambda: (receiver.onStop(), stopped.set()))
        stopper.start()
        # the stop waits for the chunk being stored (closing now would lose its acknowledgement)
        assert not stopped.wait(0.2)
        first.release.set()
        stopper.join(30)
        assert stopped.is_set() and first.blocks == [["a", "b", "c"]]
        assert source.wait_acked(3, 30), source.statistics()
        assert first.restarts == []

        second = BlockingStore()
        second.release.set()
        receiver_of(source, second)
        assert source.wait_connections(2, 30)  # (offered before, it would go to the closing first one)
        source.offer(["d"])
        assert source.wait_acked(4, 30), source.statistics()
        assert second.blocks == [["d"]]
        assert source.statistics().lines_resent == 0
    finally:
        source.close()


def test_a_stop_with_no_chunk_under_way_ends_the_connection_and_the_next_receiver_takes_over():
    source = AckedLineSource(SECRET)
    try:
        first = BlockingStore()
        first.release.set()
        receiver = receiver_of(source, first)
        source.offer(["x"])
        assert source.wait_acked(1, 30)
        stopper = threading.Thread(target=receiver.onStop)
        stopper.start()
        stopper.join(30)
        assert not stopper.is_alive()
        second = BlockingStore()
        second.release.set()
        receiver_of(source, second)
        assert source.wait_connections(2, 30)  # (offered before, it would go to the closing first one)
        source.offer(["y"])
        assert source.wait_acked(2, 30), source.statistics()
        assert first.blocks == [["x"]] and second.blocks == [["y"]]
        assert first.restarts == [] and source.statistics().lines_resent == 0
    finally:
        source.close()
