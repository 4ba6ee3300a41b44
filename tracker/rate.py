"""Rate control for receivers (Spark's streaming/src/main/scala/org/apache/spark/streaming/
receiver/RateLimiter.scala and scheduler/rate/PIDRateEstimator.scala): a token bucket, Spark's PID estimator and the
controller that feeds the estimator from completed batches.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor

from sparkwal.wal import SYSTEM_CLOCK, Clock

from .input_info import BatchInfo


class RateLimiter:
    """A token bucket of ``current_limit`` permits per second, with Guava's bursty semantics (the
    one Spark's receivers use): up to one second of unused permits accumulate, and a caller that
    finds no permit waits until the next one is due. ``None`` or a non-positive rate means
    unlimited. Time comes from ``clock``, so tests drive it by hand.
    """

    def __init__(self, max_rate: float | None = None, initial_rate: float | None = None, *,
                 clock: Clock | None = None):
        self._clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self.max_rate = max_rate if max_rate is not None and max_rate > 0 else math.inf
        initial = initial_rate if initial_rate is not None and initial_rate > 0 else math.inf
        self._rate = math.inf
        self._stored = 0.0
        self._next_free = float(self._clock.now_ms())
        self._set_rate(min(initial, self.max_rate))

    @property
    def current_limit(self) -> float:
        """Permits per second (``math.inf`` when unlimited)."""
        return self._rate

    def update_rate(self, rate: float) -> None:
        """Change the rate; ignored when ``rate <= 0``, capped at ``max_rate``."""
        if rate > 0:
            with self._lock:
                self._set_rate(min(rate, self.max_rate))

    def wait_to_push(self, permits: int = 1) -> None:
        """Take ``permits`` permits (one per record), waiting (on the clock) until they are due
        (Guava's ``acquire(n)``: the wait is paid by the next caller)."""
        if self._rate == math.inf:
            return
        with self._lock:
            now = self._clock.now_ms()
            self._resync(now)
            ready_at = self._next_free
            from_stored = min(float(permits), self._stored)
            self._stored -= from_stored
            self._next_free += (permits - from_stored) * 1000.0 / self._rate
        if ready_at > now:
            self._clock.wait_till_ms(math.ceil(ready_at))

    def _resync(self, now: float) -> None:
        if now > self._next_free:
            if self._rate != math.inf:
                self._stored = min(self._rate, self._stored + (now - self._next_free) * self._rate / 1000.0)
            self._next_free = now

    def _set_rate(self, rate: float) -> None:
        """Call with the lock held (or from __init__). Stored permits keep their share of a full
        bucket (one second's worth); a bucket starts empty, and so does one leaving "unlimited"
        (Spark's unlimited is Long.MaxValue, whose share rounds to nothing)."""
        self._resync(float(self._clock.now_ms()))
        if rate == math.inf or self._rate == math.inf:
            self._stored = 0.0
        else:
            self._stored = self._stored * rate / self._rate
        self._rate = rate


class PIDRateEstimator:
    """Spark's proportional-integral-derivative estimator of the rate a stream can sustain."""

    def __init__(self, batch_interval_ms: int, proportional: float = 1.0, integral: float = 0.2,
                 derivative: float = 0.0, min_rate: float = 100):
        if batch_interval_ms <= 0:
            raise ValueError(f"Specified batch interval {batch_interval_ms} in PIDRateEstimator is invalid.")
        if proportional < 0:
            raise ValueError(f"Proportional term {proportional} in PIDRateEstimator should be >= 0.")
        if integral < 0:
            raise ValueError(f"Integral term {integral} in PIDRateEstimator should be >= 0.")
        if derivative < 0:
            raise ValueError(f"Derivative term {derivative} in PIDRateEstimator should be >= 0.")
        if min_rate <= 0:
            raise ValueError(f"Minimum rate in PIDRateEstimator should be > 0, got {min_rate}")
        self.batch_interval_ms = batch_interval_ms
        self.proportional, self.integral, self.derivative = proportional, integral, derivative
        self.min_rate = min_rate
        self._lock = threading.Lock()
        self._first_run = True
        self._latest_time = -1
        self._latest_rate = -1.0
        self._latest_error = -1.0

    def compute(self, time_ms: int, num_elements: int, processing_delay_ms: int,
                scheduling_delay_ms: int) -> float | None:
        """The new rate in elements per second, or None (first call, or no usable sample)."""
        with self._lock:
            if not (time_ms > self._latest_time and num_elements > 0 and processing_delay_ms > 0):
                return None
            delay_since_update = (time_ms - self._latest_time) / 1000.0
            processing_rate = num_elements / processing_delay_ms * 1000.0
            error = self._latest_rate - processing_rate
            # the backlog (scheduling delay) as a rate: what was not processed in time
            historical_error = scheduling_delay_ms * processing_rate / self.batch_interval_ms
            d_error = (error - self._latest_error) / delay_since_update
            new_rate = max(self._latest_rate - self.proportional * error
                           - self.integral * historical_error - self.derivative * d_error,
                           self.min_rate)
            self._latest_time = time_ms
            if self._first_run:
                self._latest_rate, self._latest_error, self._first_run = processing_rate, 0.0, False
                return None
            self._latest_rate, self._latest_error = new_rate, error
            return new_rate


def create_rate_estimator(batch_interval_ms: int, conf: Mapping[str, str] | None = None
                          ) -> PIDRateEstimator:
    """The estimator named by ``spark.streaming.backpressure.rateEstimator`` (only ``pid``)."""
    conf = conf or {}
    name = conf.get("spark.streaming.backpressure.rateEstimator", "pid")
    if name != "pid":
        raise ValueError(f"Unknown rate estimator: {name}")
    key = "spark.streaming.backpressure.pid."
    return PIDRateEstimator(batch_interval_ms, float(conf.get(key + "proportional", 1.0)),
                            float(conf.get(key + "integral", 0.2)),
                            float(conf.get(key + "derived", 0.0)),
                            float(conf.get(key + "minRate", 100)))


class RateController:
    """Feeds ``estimator`` from completed batches of ``stream_id`` (on one background thread, as
    Spark does) and passes each new rate to ``publish`` (e.g. a receiver's ``update_rate``)."""

    def __init__(self, stream_id: int, estimator: PIDRateEstimator, publish: Callable[[float], None],
                 *, executor: Executor | None = None):
        self.stream_id = stream_id
        self._estimator = estimator
        self._publish = publish
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix=f"rate-controller-{stream_id}")
        self._latest_rate = -1.0

    @property
    def latest_rate(self) -> float:
        """The last rate published (-1 before the first)."""
        return self._latest_rate

    def on_batch_completed(self, batch: BatchInfo) -> Future | None:
        """Schedule an estimate from ``batch``; None when the batch lacks what it needs."""
        info = batch.stream_id_to_input_info.get(self.stream_id)
        end, processing, scheduling = (batch.processing_end_time_ms, batch.processing_delay_ms,
                                       batch.scheduling_delay_ms)
        if info is None or end is None or processing is None or scheduling is None:
            return None
        try:
            return self._executor.submit(self._compute, end, info.num_records, processing, scheduling)
        except RuntimeError:  # stopped: a batch that completes during a stop publishes nothing
            return None

    def _compute(self, time_ms: int, elements: int, processing: int, scheduling: int) -> float | None:
        rate = self._estimator.compute(time_ms, elements, processing, scheduling)
        if rate is not None:
            self._latest_rate = rate
            self._publish(rate)
        return rate

    def stop(self) -> None:
        if self._own_executor:
            self._executor.shutdown(wait=True)
