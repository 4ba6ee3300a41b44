"""Ports of RateLimiterSuite and PIDRateEstimatorSuite, plus the token bucket
on a manual clock and the RateController."""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future

import pytest

from sparkwal.tracker import (BatchInfo, InputInfoTracker, PIDRateEstimator, RateController, RateLimiter,
                     StreamInputInfo, TrackerError, create_rate_estimator)
from sparkwal.wal import ManualClock

# ------------------------------------------------------------------------------ RateLimiterSuite


def test_rate_limiter_initializes_even_without_a_max_rate():
    limiter = RateLimiter()
    assert limiter.current_limit == math.inf
    limiter.update_rate(105)
    assert limiter.current_limit == 105


def test_rate_limiter_updates_when_below_max_rate():
    limiter = RateLimiter(max_rate=110)
    limiter.update_rate(105)
    assert limiter.current_limit == 105


def test_rate_limiter_stays_below_max_rate_despite_large_updates():
    limiter = RateLimiter(max_rate=100)
    limiter.update_rate(105)
    assert limiter.current_limit == 100


def test_rate_limiter_ignores_non_positive_rates_and_starts_at_min_of_initial_and_max():
    limiter = RateLimiter(max_rate=50, initial_rate=80)
    assert limiter.current_limit == 50
    limiter.update_rate(0)
    limiter.update_rate(-3)
    assert limiter.current_limit == 50


def test_token_bucket_paces_pushes_on_the_clock():
    clock = ManualClock(0)
    limiter = RateLimiter(initial_rate=10, clock=clock)  # one permit every 100 ms
    limiter.wait_to_push()  # the first permit is free
    pushed = threading.Event()

    def push():
        limiter.wait_to_push()
        pushed.set()

    t = threading.Thread(target=push)
    t.start()
    assert not pushed.wait(0.2)  # blocked: the clock has not moved
    clock.advance(99)
    assert not pushed.wait(0.1)
    clock.advance(1)
    assert pushed.wait(5)
    t.join()


def test_token_bucket_stores_at_most_one_second_of_permits():
    clock = ManualClock(0)
    limiter = RateLimiter(initial_rate=100, clock=clock)
    clock.advance(60_000)  # idle for a minute
    for _ in range(100):  # a second's worth is available at once
        limiter.wait_to_push()
    assert clock.now_ms() == 60_000
    done = threading.Event()
    t = threading.Thread(target=lambda: (limiter.wait_to_push(), limiter.wait_to_push(), done.set()))
    t.start()
    assert not done.wait(0.2)
    clock.advance(20)  # then 10 ms per permit
    assert done.wait(5)
    t.join()


# ------------------------------------------------------------------------------ PIDRateEstimatorSuite


def test_the_right_estimator_is_created():
    assert isinstance(create_rate_estimator(20), PIDRateEstimator)
    est = create_rate_estimator(20, {"spark.streaming.backpressure.pid.minRate": "5"})
    assert est.min_rate == 5
    with pytest.raises(ValueError, match="Unknown rate estimator"):
        create_rate_estimator(20, {"spark.streaming.backpressure.rateEstimator": "fancy"})


@pytest.mark.parametrize("args", [(0,), (-1,), (100, -1), (100, 0, -1), (100, 0, 0, -1),
                                  (100, 0, 0, 0, 0), (100, 0, 0, 0, -1)])
def test_estimator_checks_ranges(args):
    with pytest.raises(ValueError):
        PIDRateEstimator(*args)


def new_estimator(kp=1.0, ki=0.0, kd=0.0, min_rate=10):
    return PIDRateEstimator(20, kp, ki, kd, min_rate)


def test_first_estimate_is_none():
    assert new_estimator().compute(0, 10, 10, 0) is None


def test_second_estimate_is_not_none():
    p = new_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 10, 0) == 1000  # 10 elements in 10 ms = 1000/s


def test_no_estimate_when_no_time_difference_between_successive_calls():
    p = new_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 10, 0) is not None
    assert p.compute(10, 10, 10, 0) is None


@pytest.mark.parametrize("n", [0, -10])
def test_no_estimate_when_no_records_in_previous_batch(n):
    p = new_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, n, 10, 0) is None


@pytest.mark.parametrize("delay", [0, -10])
def test_no_estimate_when_there_is_no_processing_delay(delay):
    p = new_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, delay, 0) is None


def test_estimate_is_never_less_than_min_rate():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 5)
    p.compute(0, 10, 10, 0)  # first: 1000/s
    results = [p.compute(i * 10 + 10, 1, 1000, 10_000) for i in range(49)]
    assert results and all(r == 5 for r in results)


def test_follows_the_processing_speed_with_no_accumulated_or_positive_error():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 10)
    times = [i * 500 for i in range(50)]
    rng_elements = [(i + 1) * 1000 for i in range(50)]  # speed grows each batch
    results = [p.compute(t, n, 1000, 0) for t, n in zip(times, rng_elements, strict=True)]
    assert results[0] is None
    assert results[1:] == [float((i + 1) * 1000) for i in range(1, 50)]


def test_follows_the_processing_speed_with_no_accumulated_but_some_positive_error():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 10)
    times = [i * 500 for i in range(50)]
    elements = [(50 - i) * 1000 for i in range(50)]  # speed falls each batch
    results = [p.compute(t, n, 1000, 0) for t, n in zip(times, elements, strict=True)]
    assert results[0] is None
    assert results[1:] == [float((50 - i) * 1000) for i in range(1, 50)]


def test_stays_below_the_processing_speed_with_accumulated_and_positive_error():
    p = PIDRateEstimator(20, 1.0, 0.01, 0.0, 10)
    times = [i * 500 for i in range(50)]
    speed = 1000.0  # elements per second
    results = []
    for i, t in enumerate(times):
        n = int(speed * 1.0)  # processed in 1000 ms
        results.append(p.compute(t, n, 1000, 2000 if i > 0 else 0))
    assert results[0] is None
    assert all(10 <= r < speed for r in results[1:])


# ------------------------------------------------------------------------------ RateController


class InlineExecutor:
    def submit(self, fn, *args):
        f = Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self, wait=True):
        pass


def batch(t, n, start=None, end=None, submitted=None, stream=0):
    return BatchInfo(t, {stream: StreamInputInfo(stream, n)}, submitted if submitted is not None else t,
                     start, end)


def test_rate_controller_feeds_the_estimator_and_publishes_rates():
    published = []
    rc = RateController(0, PIDRateEstimator(1000, 1.0, 0.0, 0.0, 10), published.append,
                        executor=InlineExecutor())
    assert rc.latest_rate == -1
    assert rc.on_batch_completed(batch(1000, 100, None, None)) is None  # not processed yet
    assert rc.on_batch_completed(batch(1000, 100, 1000, 1100)).result() is None  # first sample
    assert rc.on_batch_completed(batch(2000, 500, 2000, 2100)).result() == 5000
    assert published == [5000] and rc.latest_rate == 5000
    assert rc.on_batch_completed(batch(3000, 5, 3000, 3100, stream=7)) is None  # other stream


def test_rate_controller_runs_on_a_background_thread_by_default():
    published = threading.Event()
    rc = RateController(0, PIDRateEstimator(1000, min_rate=10), lambda r: published.set())
    rc.on_batch_completed(batch(1000, 100, 1000, 1100)).result(5)
    rc.on_batch_completed(batch(2000, 100, 2000, 2100)).result(5)
    assert published.is_set()
    rc.stop()
    assert rc.on_batch_completed(batch(3000, 100, 3000, 3100)) is None  # completed during a stop


def test_batch_info_delays():
    b = BatchInfo(1000, {0: StreamInputInfo(0, 3), 1: StreamInputInfo(1, 4)}, 1000, 1200, 1700)
    assert (b.scheduling_delay_ms, b.processing_delay_ms, b.total_delay_ms, b.num_records) == \
        (200, 500, 700, 7)
    assert BatchInfo(1000, {}, 1000).processing_delay_ms is None


# ------------------------------------------------------------------------------ InputInfoTracker


def test_report_and_get_input_info():
    tracker = InputInfoTracker()
    info1 = StreamInputInfo(0, 100, {"offsets": "0-100"})
    info2 = StreamInputInfo(1, 200)
    tracker.report_info(1000, info1)
    tracker.report_info(1000, info2)
    assert tracker.get_info(1000) == {0: info1, 1: info2}
    assert tracker.get_info(2000) == {}
    with pytest.raises(TrackerError, match="stream 0 for batch 1000 was already reported"):
        tracker.report_info(1000, StreamInputInfo(0, 1))


def test_cleanup_input_info():
    tracker = InputInfoTracker()
    for t in (1000, 2000, 3000):
        tracker.report_info(t, StreamInputInfo(0, t))
    tracker.cleanup(2000)
    assert tracker.get_info(1000) == {}
    assert tracker.get_info(2000) == {0: StreamInputInfo(0, 2000)}
