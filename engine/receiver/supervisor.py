"""The executor side of a receiver: its supervisor, running inside a long-lived Spark task.

``run_receiver_task`` is the task's body. The supervisor registers with the driver's endpoint,
starts the user's receiver, and turns what it stores into blocks: ``store()`` goes through the
:class:`BlockGenerator` (rate-limited, cut every block interval, bounded), ``storeBlock()``
directly; each block is stored by a block handler (the receiver WAL, or the executor's local
directory) and then reported to the driver with ``AddBlock``. It stops when the driver says so,
when the receiver calls ``stop()``, or when the driver is unreachable (nobody would record its
blocks). A retried task attempt exits at once, as in Spark: the driver restarts receivers itself,
wherever its scheduling policy says.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import traceback
from dataclasses import dataclass

from sparkwal.base.service import Service, spawn
from sparkwal.tracker import RateLimiter, ReceivedBlockInfo
from sparkwal.wal import SYSTEM_CLOCK, Clock, RecordHandle, StorageLocation

from . import wire
from .blocks import BlockCopy, LocalBlockHandler, WalBlockHandler, serialize_block
from .block_client import BlockServerError
from .block_server import ensure_block_server
from .client import DriverConnection, DriverUnreachableError
from .placement import this_executor
from .precompute import RunningResults, block_results
from ..errors import EngineError
from .receiver import Receiver, ReceiverStoppedError

log = logging.getLogger(__name__)


class BlockNotRecordedError(EngineError, RuntimeError):
    """The driver refused to record a stored block (its answer names why): nothing acknowledged."""


@dataclass(frozen=True)
class SupervisorConfig:
    """Everything a receiver's task needs, made by the driver (it travels with the task). The
    secret is the application's own, generated per run: it dies with the application."""

    stream_id: int
    endpoint: tuple[str, int]
    secret: bytes
    app_id: str
    driver_host: str
    #: the checkpoint directory, the receiver WAL's home (None: the WAL is off); it travels
    #: without credentials: the executor takes its own from its environment
    checkpoint: StorageLocation | None
    block_interval_ms: int = 200
    block_queue_size: int = 10
    max_buffered_records: int = 100_000  #: store() blocks beyond this many records not yet in a block
    max_rate: float | None = None
    initial_rate: float | None = None
    restart_delay_ms: int = 2000
    store_timeout_s: float = 30.0
    wal_rolling_interval_s: float = 60
    leader_epoch: int | None = None  #: the driver's leadership epoch: names the receiver WAL
    serve_blocks: bool = False  #: WAL off, off local mode: blocks served to other executors
    block_peers: tuple = ()  #: other executors' block servers, ``(executor_id, host, port)``
    replication: int = 1  #: copies of each WAL-off block (the receiver's storage level's)
    plans: tuple = ()  #: what to run on each block for the driver (precompute.py; empty: nothing)
    precompute_max_bytes: int = 256 << 10
    batch_interval_ms: int | None = None  #: a block is cut on each batch time (next_cut_ms)


def next_cut_ms(now_ms: int, block_ms: int, batch_ms: int | None) -> int:
    """When to cut the next block: every ``block_ms``, on a grid that puts a cut on each batch
    time (a multiple of ``batch_ms``), where the driver waits for it (batch_cuts.py) instead of
    allocating whatever is recorded (Spark cuts on multiples of the block interval, so its block
    cut at a batch time races the allocation and its records wait a whole batch more). Without a
    batch interval: on multiples of ``block_ms``, as Spark."""
    if not batch_ms:
        return (now_ms // block_ms + 1) * block_ms
    cut = (now_ms // batch_ms + 1) * batch_ms
    return cut - (cut - now_ms - 1) // block_ms * block_ms


class BlockGenerator:
    """Spark's BlockGenerator, with memory bounded: records buffer until the next block
    interval (or until ``max_buffered`` records, which cut a block early), blocks wait in a queue
    of ``queue_size`` for the pusher thread, and ``add`` blocks while the buffer is full and the
    queue has no room: at most ``max_buffered * (queue_size + 2)`` records are in memory (Spark's
    buffer is unbounded: a fast source fills the heap)."""

    def __init__(self, push, *, interval_ms: int, queue_size: int, max_buffered: int,
                 rate_limiter: RateLimiter, clock: Clock, on_error, new_block_id, batch_ms: int | None = None,
                 running: RunningResults | None = None, on_batch_cut=None):
        if interval_ms <= 0:
            raise ValueError(f"spark.streaming.blockInterval must be positive, got {interval_ms} ms")
        self._push, self._on_error, self._new_block_id = push, on_error, new_block_id
        self._interval, self._max, self._batch_ms, self._running = interval_ms, max_buffered, batch_ms, running
        #: told ``batch_ms`` once every record added before the cut at that batch time is recorded
        self._on_batch_cut, self._last_batch_cut = on_batch_cut, -1
        self.rate_limiter, self._clock = rate_limiter, clock
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._buffer: list = []
        self._cond = threading.Condition()
        self._adding = True
        self._generating = threading.Event()  # set: stop cutting blocks
        self._timer = Service("block-generator", self._timer_loop)
        self._pusher = Service("block-pusher", self._push_loop)

    def start(self) -> None:
        self._timer.start()
        self._pusher.start()

    def add(self, record) -> None:
        self.add_many([record])

    def add_many(self, records: list) -> None:
        """Add records in one go (one lock per ``max_buffered`` records, one permit each). Under
        a rate limit, permits are taken at most a block interval's worth at a time: a large
        chunk taken at once would stall the next one for chunk/rate seconds, leaving whole
        batches empty, and an empty batch gives the rate estimator nothing to raise the rate on."""
        i = 0
        while i < len(records):
            step = self._max
            limit = self.rate_limiter.current_limit
            if limit != math.inf:
                step = max(1, min(step, int(limit * self._interval / 1000)))
            part = records[i:i + step]
            i += len(part)
            self.rate_limiter.wait_to_push(len(part))
            with self._cond:
                while len(self._buffer) >= self._max and self._adding:
                    # the results start anew only once the block is queued: while this waits for room, a
                    # cut may take the buffer, and its combiners must go with it
                    results, outcome = self._running.peek() if self._running else (None, {})
                    try:
                        self._queue.put_nowait((self._new_block_id(), self._buffer, results, None))
                    except queue.Full:
                        self._cond.wait(0.1)
                        continue
                    if self._running is not None:
                        self._running.commit(outcome)
                    self._buffer = []
                    break
                if not self._adding:
                    raise ReceiverStoppedError("cannot add data: the block generator has stopped")
                self._buffer.extend(part)
                if self._running is not None:
                    self._running.add(part)

    def _cut(self, now_ms: int) -> None:
        """Cut a block of the records added so far; on or after a batch time, it carries that time
        (a marker alone when there are no records): the pusher reports it once it is recorded."""
        batch_cut = None
        if self._batch_ms and self._on_batch_cut:
            time_ms = now_ms // self._batch_ms * self._batch_ms
            if time_ms > self._last_batch_cut:  # (not reported already)
                batch_cut = self._last_batch_cut = time_ms
        with self._cond:
            results = self._running.take() if self._running is not None else None
            records, self._buffer = self._buffer, []
            self._cond.notify_all()
        if records or batch_cut is not None:
            block_id = self._new_block_id() if records else None
            self._queue.put((block_id, records, results, batch_cut))  # waits while full

    def _timer_loop(self) -> None:
        next_ms = next_cut_ms(self._clock.now_ms(), self._interval, self._batch_ms)
        while not self._generating.is_set():
            now = self._clock.wait_till_ms(next_ms, timeout_s=0.05)
            if now >= next_ms:
                self._cut(now)
                next_ms = next_cut_ms(max(now, next_ms), self._interval, self._batch_ms)
        self._cut(self._clock.now_ms())  # the final block: what was added before stop()

    def _push_loop(self) -> None:
        while True:
            try:
                block_id, records, results, batch_cut = self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._generating.is_set() and not self._timer.is_alive():
                    return
                continue
            try:
                if records:
                    self._push(block_id, records, None, results)
                if batch_cut is not None:
                    self._on_batch_cut(batch_cut)
            except Exception as e:  # noqa: BLE001
                self._on_error(f"Error in block pushing thread: {len(records)} records of block "
                               f"{block_id} were not stored", e)

    def stop(self) -> None:
        with self._cond:
            self._adding = False
            self._cond.notify_all()
        self._generating.set()
        for t in (self._timer, self._pusher):
            t.join()


class ReceiverSupervisor:
    def __init__(self, config: SupervisorConfig, receiver: Receiver, *, clock: Clock | None = None):
        self.config, self.receiver = config, receiver
        self._clock = clock or SYSTEM_CLOCK
        self.location = this_executor(config.driver_host)
        self._stop_event = threading.Event()
        self._lock = threading.RLock()
        self.receiver_started = False
        self._last_block_ms = 0
        self._suffix = os.urandom(3).hex()
        self.stop_message = ""
        self.stop_error: str | None = None
        self._conn: DriverConnection | None = None
        self._handler: WalBlockHandler | LocalBlockHandler | None = None
        self._generator: BlockGenerator | None = None
        self._failed_plans: set[int] = set()
        self._unsent_results: dict[int, int] = {}  # plan -> blocks in a row whose result was not sent

    @property
    def stopped(self) -> bool:
        return self._stop_event.is_set()

    def _new_block_id(self) -> str:
        with self._lock:
            ms = max(self._clock.now_ms(), self._last_block_ms + 1)
            self._last_block_ms = ms
        return f"input-{self.config.stream_id}-{ms}-{self._suffix}"

    # ---------------------------------------------------------------- lifecycle

    def run(self) -> str:
        """Receive until stopped; return why it stopped."""
        c = self.config
        self._conn = DriverConnection(c.endpoint, c.secret, on_message=self._on_driver_message,
                                      on_close=self._on_driver_gone)
        ok, message = self._conn.request(wire.REGISTER, [c.stream_id, type(self.receiver).__name__,
                                                         self.location.host, self.location.executor_id,
                                                         os.getpid()])
        if not ok:
            self._conn.close()
            return f"registration refused by the driver: {message}"
        try:
            if c.checkpoint is not None:
                self._handler = WalBlockHandler(c.checkpoint, c.stream_id,
                                                rolling_interval_s=c.wal_rolling_interval_s,
                                                stopped=self._stop_event, epoch=c.leader_epoch)
            else:
                self._handler = LocalBlockHandler(
                    c.app_id, c.stream_id, c.secret, server=self._block_server(),
                    peers=tuple(BlockCopy(*p) for p in c.block_peers), replication=c.replication)
            self._generator = BlockGenerator(
                self._store_and_report, interval_ms=c.block_interval_ms, queue_size=c.block_queue_size,
                max_buffered=c.max_buffered_records, clock=self._clock, on_error=self.report_error,
                rate_limiter=RateLimiter(c.max_rate, c.initial_rate, clock=self._clock),
                new_block_id=self._new_block_id, batch_ms=c.batch_interval_ms, on_batch_cut=self._report_batch_cut,
                running=RunningResults(c.stream_id, c.plans, c.precompute_max_bytes, self._failed_plans,
                                       self._unsent_results)
                if RunningResults.possible(c.plans) else None)
            self._generator.start()
            self.receiver.bind(c.stream_id, self)
            self._start_receiver()
            self._stop_event.wait()
        finally:
            self._shutdown()
        return self.stop_message

    def _block_server(self) -> BlockCopy | None:
        """This executor's block server (WAL off, off local mode), or None."""
        if not self.config.serve_blocks:
            return None
        try:
            return ensure_block_server(self.config.app_id, self.config.secret, self.location.host,
                                       self.location.executor_id)
        except (OSError, RuntimeError, BlockServerError) as e:
            self.report_error("no block server on this executor: its blocks are readable here only", e)
            return None

    def _start_receiver(self) -> None:
        try:
            self.receiver.onStart()
            self.receiver_started = True
        except Exception as e:  # noqa: BLE001
            self.stop("Error starting receiver", e)

    def _stop_receiver(self) -> None:
        with self._lock:
            started, self.receiver_started = self.receiver_started, False
        if started:
            try:
                self.receiver.onStop()
            except Exception as e:  # noqa: BLE001
                log.warning("receiver %s: onStop failed: %s", self.config.stream_id, e)

    def _shutdown(self) -> None:
        self._stop_receiver()
        if self._generator is not None:
            self._generator.stop()  # pushes the last block while the driver is still there
        if self._handler is not None:
            self._handler.close()
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                conn.request(wire.DEREGISTER, [self.config.stream_id, self.stop_message, self.stop_error],
                             timeout_s=10)
            except (DriverUnreachableError, TimeoutError):
                pass
            conn.close()

    def stop(self, message: str, error: BaseException | None = None) -> None:
        if not self._stop_event.is_set():
            self.stop_message = message
            self.stop_error = _describe(error)
            log.info("stopping receiver %d: %s", self.config.stream_id, message)
        self._stop_event.set()

    def restart_receiver(self, message: str, error: BaseException | None = None,
                         delay_ms: int | None = None) -> None:
        """Spark's restart: onStop, a delay, onStart, on a thread of its own (the caller may be one
        of the receiver's threads that onStop ends)."""
        delay = self.config.restart_delay_ms if delay_ms is None else delay_ms

        def go() -> None:
            log.warning("restarting receiver %d in %d ms: %s", self.config.stream_id, delay, message)
            self.report_error(f"Restarting receiver with delay {delay} ms: {message}", error)
            self._stop_receiver()
            if self._stop_event.wait(delay / 1000):
                return
            self._start_receiver()

        spawn(f"receiver-{self.config.stream_id}-restart", go)

    # ---------------------------------------------------------------- data

    def push_single(self, record) -> None:
        if self.stopped:
            raise ReceiverStoppedError(f"receiver {self.config.stream_id} has stopped: {self.stop_message}")
        self._generator.add(record)

    def push_many(self, records: list) -> None:
        if self.stopped:
            raise ReceiverStoppedError(f"receiver {self.config.stream_id} has stopped: {self.stop_message}")
        self._generator.add_many(records)

    def push_block(self, records: list, metadata) -> None:
        if self.stopped:
            raise ReceiverStoppedError(f"receiver {self.config.stream_id} has stopped: {self.stop_message}")
        self._store_and_report(self._new_block_id(), records, metadata)

    def _store_and_report(self, block_id: str, records: list, metadata=None, results: list | None = None) -> None:
        """Durable in the handler, then recorded by the driver with the plans' ``results`` (made
        here when the generator did not make them as the records came); raises if either fails."""
        data = serialize_block(records)
        handler = self._handler
        handle: RecordHandle | None = None
        copies: list = []
        if isinstance(handler, WalBlockHandler):
            handle = handler.store(block_id, data)
        else:
            copies = handler.store(block_id, data)
        info = ReceivedBlockInfo(self.config.stream_id, len(records), block_id, handle, metadata)
        if results is None:
            results = block_results(self.config.stream_id, self.config.plans, records,
                                    self.config.precompute_max_bytes, self._failed_plans,
                                    self._unsent_results) if self.config.plans else []
        ok, message = self._conn.request(
            wire.ADD_BLOCK, [info.to_raw(), self.location.host, self.location.executor_id, len(data),
                             [[c.executor_id, c.host, c.port] for c in copies], results],
            timeout_s=None)
        if not ok:
            raise BlockNotRecordedError(f"the driver did not record block {block_id}: {message}")

    # ---------------------------------------------------------------- driver

    def report_error(self, message: str, error: BaseException | None) -> None:
        log.warning("receiver %d: %s: %s", self.config.stream_id, message, error)
        try:
            if self._conn is not None:
                self._conn.tell(wire.REPORT_ERROR, [self.config.stream_id, message, _describe(error)])
        except DriverUnreachableError:
            pass

    def _report_batch_cut(self, batch_ms: int) -> None:
        """Every record added before the cut at batch time ``batch_ms`` is recorded: the driver may
        allocate that batch's blocks (it waits for this, briefly: batch_cuts.py)."""
        try:
            if self._conn is not None:
                self._conn.tell(wire.RECORDED_UP_TO, [self.config.stream_id, batch_ms])
        except DriverUnreachableError:
            pass

    def _on_driver_message(self, kind: int, args: list) -> None:
        if kind == wire.STOP_RECEIVER:
            self.stop("Stopped by driver")
        elif kind == wire.CLEANUP_OLD_BLOCKS:
            if self._handler is not None:
                self._handler.cleanup_old_blocks(args[0])
        elif kind == wire.UPDATE_RATE_LIMIT:
            if self._generator is not None:
                self._generator.rate_limiter.update_rate(float(args[0]))

    def _on_driver_gone(self) -> None:
        if not self._stop_event.is_set():
            self.stop("the driver is unreachable (it stopped or died)")


def _describe(error: BaseException | None) -> str | None:
    if error is None:
        return None
    return "".join(traceback.format_exception_only(type(error), error)).strip()


def run_receiver_task(config: SupervisorConfig, receiver: Receiver) -> list[str]:
    """The body of a receiver's Spark task: supervise until stopped. A retried attempt returns at
    once (the driver restarts receivers through its scheduling policy, as Spark does)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() > 0:
        return [f"attempt {ctx.attemptNumber()} of a receiver task: exiting, the driver reschedules"]
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return [ReceiverSupervisor(config, receiver).run()]


def receiver_partition(config: SupervisorConfig, receiver: Receiver, _rows) -> list[str]:
    """The receiver job's function of its one partition: :func:`run_receiver_task`."""
    return run_receiver_task(config, receiver)
