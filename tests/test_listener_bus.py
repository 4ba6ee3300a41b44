"""Users' listeners are called on the listener bus's own thread, as Spark's asynchronous listener
bus calls them: a slow listener never stalls the stream, events keep their order, a full queue
drops events for the listeners and counts and logs what it dropped, and ``stop()`` delivers what
is queued before it returns."""

from __future__ import annotations

import threading

from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.driver.events import EventBus
from sparkwal.engine.listener import StreamingListenerStreamingStarted
from sparkwal.wal import ManualClock


class Blocking(StreamingListener):
    """Holds the bus on its first completed batch until released; records what it heard."""

    def __init__(self):
        self.heard: list[int] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def onBatchCompleted(self, event):
        self.entered.set()
        assert self.release.wait(60)
        self.heard.append(event.batchInfo().batch_time_ms)


def test_a_slow_listener_does_not_stall_the_batches(spark_context):
    clock, outputs, all_ran = ManualClock(0), [], threading.Event()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)

    def output(t, rdd):
        outputs.append(t)
        if len(outputs) == 4:
            all_ran.set()

    ssc.queueStream([], default=spark_context.parallelize([1], 1)).foreachRDD(
        lambda t, rdd: output(t, rdd.collect()))
    slow = Blocking()
    ssc.addStreamingListener(slow)
    ssc.start()
    try:
        for _ in range(4):
            clock.advance(500)
        # the listener holds the first completion; the batches after it run all the same
        assert all_ran.wait(60), f"only {len(outputs)} of 4 batches ran while a listener was slow"
        assert slow.entered.is_set() and slow.heard == []
    finally:
        slow.release.set()
        ssc.stop(stopSparkContext=False)
    assert slow.heard == [500, 1000, 1500, 2000]  # all of them, in order, by the time stop() returned


def test_a_full_queue_drops_events_for_the_listeners_counts_them_and_logs_once_a_minute(caplog):
    now = [0.0]
    bus = EventBus(capacity=2, clock=lambda: now[0])
    heard, entered, release = [], threading.Event(), threading.Event()

    class Slow(StreamingListener):
        def onStreamingStarted(self, event):
            entered.set()
            assert release.wait(60)
            heard.append(event.time_ms)

    bus.subscribe(Slow(), queued=True)
    with caplog.at_level("WARNING", logger="sparkwal.engine.driver.events"):
        bus.post(StreamingListenerStreamingStarted(0))
        assert entered.wait(30)  # the bus's thread holds event 0
        for t in range(1, 6):  # 1 and 2 are queued; 3, 4 and 5 are dropped
            bus.post(StreamingListenerStreamingStarted(t))
        now[0] = 61.0
        bus.post(StreamingListenerStreamingStarted(6))  # dropped, and a minute since the first drop
        release.set()
        bus.stop(30)
    assert heard == [0, 1, 2]
    stats = bus.statistics()
    assert (stats.posted, stats.delivered, stats.dropped, stats.queued) == (7, 3, 4, 0)
    drops = [r.getMessage() for r in caplog.records]
    assert len(drops) == 2 and "spark.scheduler.listenerbus.eventqueue.capacity = 2" in drops[0]
    assert drops[1].startswith("dropped 3 listener events in the last 61 s (4 in all)")


def test_a_listener_may_stop_the_context_from_its_callback(spark_context):
    """The callback runs on the bus's thread: stop() there does not wait for itself."""
    clock, stopped = ManualClock(0), threading.Event()
    ssc = StreamingContext(spark_context, 0.5, clock=clock)
    ssc.queueStream([], default=spark_context.parallelize([1], 1)).foreachRDD(lambda rdd: rdd.count())

    class StopsIt(StreamingListener):
        def onBatchCompleted(self, event):
            ssc.stop(stopSparkContext=False)
            stopped.set()

    ssc.addStreamingListener(StopsIt())
    ssc.start()
    clock.advance(500)
    assert stopped.wait(60)
    assert ssc.awaitTerminationOrTimeout(30)


def test_the_queues_capacity_is_sparks_setting(spark_context, live_settings):
    live_settings({"spark.scheduler.listenerbus.eventqueue.capacity": "7"})
    ssc = StreamingContext(spark_context, 1)
    assert ssc.driver.events.statistics().capacity == 7
    assert StreamingContext(spark_context, 1) is not ssc
