"""A batch waits, briefly, for its receivers' blocks cut at its time (engine/receiver/batch_cuts.py):
receivers cut a block on every batch time and report it once recorded; the driver allocates a
batch's blocks once every on-time receiver has reported, or after at most half a batch interval."""

from __future__ import annotations

import threading

import pytest

from sparkwal.engine.receiver.batch_cuts import BatchCuts
from sparkwal.engine.receiver.supervisor import next_cut_ms


@pytest.mark.parametrize("now, block, batch, cut", [
    (1003, 50, 100, 1050), (1050, 50, 100, 1100), (1099, 50, 100, 1100),  # a cut on each batch time
    (1003, 300, 1000, 1100), (1980, 300, 1000, 2000), (2000, 300, 1000, 2100),  # 2000, then every 300 to 2900
    (1003, 200, None, 1200),  # no batch interval: Spark's multiples of the block interval
])
def test_blocks_are_cut_on_each_batch_time(now, block, batch, cut):
    assert next_cut_ms(now, block, batch) == cut


def test_a_batch_waits_for_an_on_time_receivers_cut_at_its_time():
    waiting = threading.Event()

    def monotonic():
        waiting.set()  # (first read inside the wait: the batch found a receiver behind)
        return 0.0

    cuts = BatchCuts(100, max_wait_s=60, monotonic=monotonic)
    cuts.recorded_up_to(1, 1000)
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(cuts.wait_for(1100)))
    waiter.start()
    assert waiting.wait(10)
    cuts.recorded_up_to(1, 1100)
    waiter.join(10)
    assert result == [()] and (cuts.waits, cuts.late) == (1, 0)


def test_a_receiver_that_is_not_on_time_is_not_waited_for():
    cuts = BatchCuts(100, max_wait_s=60)
    assert cuts.wait_for(1100) == ()  # no receiver has reported: nothing to wait for
    cuts.recorded_up_to(1, 800)  # two batches behind (stuck, or a clock far off)
    cuts.recorded_up_to(2, 1100)  # already there
    cuts.recorded_up_to(2, 1000)  # (an older report does not move it back)
    assert cuts.wait_for(1100) == () and cuts.waits == 0
    cuts.recorded_up_to(3, 1000)
    cuts.forget(3)  # its receiver stopped
    assert cuts.wait_for(1100) == () and cuts.waits == 0


def test_the_wait_is_bounded_and_a_late_cut_is_counted():
    ticks = iter([0.0, 0.6])  # the deadline (0 + 0.5), then a read past it
    cuts = BatchCuts(1000, monotonic=lambda: next(ticks))  # waits at most half a batch: 0.5 s
    cuts.recorded_up_to(7, 1000)
    assert cuts.wait_for(2000) == (7,)
    assert (cuts.waits, cuts.late) == (1, 1)


def test_a_receiver_whose_block_the_driver_holds_back_is_not_waited_for():
    waiting = threading.Event()

    def monotonic():
        waiting.set()
        return 0.0

    cuts = BatchCuts(100, max_wait_s=60, monotonic=monotonic)
    cuts.recorded_up_to(1, 1000)
    cuts.hold(1, True)  # maxUnprocessedBytes: its AddBlock waits for earlier batches to run
    assert cuts.wait_for(1100) == () and cuts.waits == 0
    cuts.hold(1, False)
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(cuts.wait_for(1100)))
    waiter.start()
    assert waiting.wait(10)
    cuts.hold(1, True)  # held back while a batch waits for it: the wait ends
    waiter.join(10)
    assert result == [()] and (cuts.waits, cuts.late) == (1, 0)
