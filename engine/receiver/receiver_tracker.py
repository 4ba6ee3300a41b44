"""The driver side of receivers: Spark's ReceiverTracker
(streaming/src/main/scala/org/apache/spark/streaming/scheduler/ReceiverTracker.scala).

It owns the endpoint receivers connect to, runs every receiver as a one-partition Spark job
placed by :class:`sparkwal.tracker.ReceiverSchedulingPolicy`, and starts it again (as a new job, wherever
the policy and the scheduler allow) whenever that job ends while the context runs: local mode
does not retry failed tasks, and a retried attempt exits at once anyway. It records reported
blocks in the context's ReceivedBlockTracker (the driver's WAL), publishes rate limits
(backpressure), tells receivers to clean old blocks, and bounds the data received but not yet
processed (:mod:`.unprocessed`).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

from sparkwal.base.service import Service, spawn
from sparkwal.tracker import (BatchInfo, ExecutorCacheTaskLocation, RateController, ReceiverSchedulingPolicy,
                              ReceiverState, ReceiverTrackingInfo, create_rate_estimator)

from .. import config
from ..cluster import total_cores
from ..listener import (ReceiverInfo, StreamingListenerReceiverError,
                        StreamingListenerReceiverStarted, StreamingListenerReceiverStopped)
from . import wire
from .batch_cuts import BatchCuts
from .block_output import BlockOutput
from .block_outputs import BlockOutputs
from .block_server import discover_block_servers
from .blocks import (BlockCopy, block_from_wire, block_time_ms, copies_from_wire, oldest_kept_block_ms,
                     remove_local_blocks)
from .endpoint import Connection, ReceiverEndpoint
from .placement import (DRIVER_EXECUTOR_ID, live_executor_ids, location_string,
                        rdd_with_locations, this_executor)
from .precompute import Precomputed, checked_results
from .supervisor import SupervisorConfig, receiver_partition
from .unprocessed import UnprocessedBytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark import SparkContext

    from sparkwal.tracker import ReceivedBlockTracker
    from sparkwal.wal import Clock, StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from .input import ReceiverInputDStream


class EventPoster(Protocol):
    def post(self, event) -> None: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverTrackerStatistics:
    receiver_jobs_launched: int  #: one per receiver start; more than the receivers means restarts
    blocks_added: int
    blocks_refused: int  #: AddBlock answered False (not its stream, or the driver WAL failed)
    unprocessed_bytes: int  #: received and recorded, not yet in a completed batch (all streams)
    max_unprocessed_bytes: int  #: the most ever (bounded by maxUnprocessedBytes + one block)
    add_block_waits: int  #: AddBlocks held back until batches caught up
    precomputed_batches: int = 0  #: batches built from the receivers' results (precompute.py)
    precompute_fallbacks: int = 0  #: batches with a block that came without its result: read back
    cut_waits: int = 0  #: batches that waited for a receiver's block cut at their time (batch_cuts.py)
    cuts_late: int = 0  #: of those, batches allocated with a receiver's cut still unrecorded


class ReceiverTracker:
    def __init__(self, sc: SparkContext, settings: StreamingConf, clock: Clock, events: EventPoster,
                 graph: DStreamGraph, blocks: ReceivedBlockTracker, inputs: list[ReceiverInputDStream], *,
                 batch_ms: int, report_input: Callable, checkpoint: StorageLocation | None, leader_epoch: int | None,
                 confirm_leadership: Callable[[], None] = lambda: None):
        """Its collaborators, from the driver's start: ``events`` takes the receivers' listener events,
        ``blocks`` their blocks, ``report_input`` a precomputed batch's input; ``checkpoint`` is the
        checkpoint directory (the receivers' WAL, where enabled, lives there) led at ``leader_epoch``;
        ``confirm_leadership`` raises unless this driver still leads (before each ``foreachBlock`` call)."""
        self._sc, self._settings, self._clock, self._events, self._blocks = sc, settings, clock, events, blocks
        self._inputs = {s.input_id: s for s in inputs}
        self._secret = wire.new_secret()
        self.wal_enabled = checkpoint is not None and settings[config.RECEIVER_WAL]
        self._driver_host = settings.raw("spark.driver.host", "127.0.0.1")
        self._policy = ReceiverSchedulingPolicy()
        self._lock = threading.Condition()
        self._tracking: dict[int, ReceiverTrackingInfo] = {
            sid: ReceiverTrackingInfo(sid, ReceiverState.INACTIVE) for sid in self._inputs}
        self._infos: dict[int, ReceiverInfo] = {}
        self._conns: dict[int, Connection] = {}
        self._conn_stream: dict[Connection, int] = {}
        self._known_executors: dict[str, ExecutorCacheTaskLocation] = {}
        self._block_locations: dict[str, tuple[BlockCopy, ...]] = {}  # WAL off: each block's copies
        self._block_servers: tuple[BlockCopy, ...] = ()  # WAL off, off local mode: executors' servers
        self._counts = dict(receiver_jobs_launched=0, blocks_added=0, blocks_refused=0)
        self._active = False
        self._stopped = threading.Event()
        self._launch, self._hold_s = threading.Event(), 0.0  # the receivers' jobs may launch (start(hold_s=...))
        self._hold_until_ms: int | None = None  # (completions before start(): no launch)
        self._threads: list[Service] = []
        self.endpoint: ReceiverEndpoint | None = None
        self._rate_controllers: dict[int, RateController] = {}
        self.precomputed: Precomputed | None = None
        self.batch_cuts = BatchCuts(batch_ms)  #: each batch waits (briefly) for its time's cuts
        self._unprocessed = UnprocessedBytes(self._inputs, settings[config.MAX_UNPROCESSED_BYTES], self.batch_cuts)
        if settings[config.RECEIVER_PRECOMPUTE]:
            self.precomputed = Precomputed.of_graph(sc, graph, inputs, blocks, report_input,
                                                    min(64 << 20, self._unprocessed.max_bytes),
                                                    asked=settings.raw(config.RECEIVER_PRECOMPUTE.key) is not None)
        self.block_outputs = BlockOutputs(  # (foreachBlock)
            sc, graph, inputs, read_records=lambda stream, info: stream.block_records(info),
            batch_blocks=lambda stream, time_ms: blocks.get_blocks_of_batch_and_stream(time_ms, stream.input_id),
            report=lambda stream, time_ms, found: report_input(
                time_ms, stream, sum(b.num_records or 0 for b in found), {"blocks": len(found), "perBlock": True}),
            confirm_leadership=lambda _stream: confirm_leadership())
        if settings[config.BACKPRESSURE]:
            conf_map = config.rate_conf(settings)
            for sid in self._inputs:
                self._rate_controllers[sid] = RateController(
                    sid, create_rate_estimator(batch_ms, conf_map), partial(self.update_rate_limit, sid))
        self._base_config = dict(
            app_id=self._sc.applicationId, driver_host=self._driver_host,
            checkpoint=checkpoint if self.wal_enabled else None,
            block_interval_ms=settings[config.BLOCK_INTERVAL],
            block_queue_size=settings[config.BLOCK_QUEUE_SIZE],
            max_buffered_records=settings[config.MAX_BUFFERED_RECORDS],
            max_rate=settings[config.RECEIVER_MAX_RATE] or None,
            initial_rate=settings[config.INITIAL_RATE] or None,
            restart_delay_ms=settings[config.RECEIVER_RESTART_DELAY],
            wal_rolling_interval_s=settings[config.RECEIVER_WAL_ROLLING],
            leader_epoch=leader_epoch,
            serve_blocks=not self.wal_enabled and live_executor_ids(self._sc) is not None,
            precompute_max_bytes=settings[config.RECEIVER_PRECOMPUTE_MAX_BYTES], batch_interval_ms=batch_ms)

    # ---------------------------------------------------------------- lifecycle

    def start(self, hold_s: float = 0.0, first_ms: int | None = None) -> None:
        """Register the receivers and launch their jobs; with ``hold_s``, the launch waits until
        batch ``first_ms`` has completed (:meth:`on_batch_completed`) or ``hold_s`` has passed."""
        self._hold_s, self._hold_until_ms = hold_s, first_ms
        if hold_s <= 0 or first_ms is None:
            self._launch.set()
        self.endpoint = ReceiverEndpoint(self, self._secret, self._driver_host)
        cores = total_cores(self._sc.master, self._sc.defaultParallelism)
        if len(self._inputs) >= cores:
            log.warning("%d receiver(s) will occupy all %d core(s) of %s: no core is left to process batches, which "
                        "will queue forever. Give the application more cores than receivers (e.g. local[%d])",
                        len(self._inputs), cores, self._sc.master, len(self._inputs) + 1)
        self._active = True
        self.block_outputs.start()
        executors = self._executors()
        if self._base_config["serve_blocks"]:  # while the cores are free, before the receivers
            self._block_servers = discover_block_servers(self._sc, self._sc.applicationId, self._secret,
                                                         self._driver_host, len(executors))
        receivers = [_Placement(sid, s.receiver.preferredLocation()) for sid, s in self._inputs.items()]
        schedule = self._policy.schedule_receivers(receivers, executors)
        for sid in self._inputs:
            with self._lock:
                self._tracking[sid] = ReceiverTrackingInfo(sid, ReceiverState.SCHEDULED,
                                                           tuple(schedule.get(sid, ())))
            self._threads.append(spawn(f"receiver-launcher-{sid}", self._receiver_loop, sid))

    def _executors(self) -> list[ExecutorCacheTaskLocation]:
        """Live executors: in local mode the driver; else those Spark lists, with the hosts the
        receivers and a probe job reported."""
        live = live_executor_ids(self._sc)
        if live is None:
            return [ExecutorCacheTaskLocation(self._driver_host, DRIVER_EXECUTOR_ID)]
        unknown = live - set(self._known_executors)
        if unknown:
            host = self._driver_host
            n = max(2 * len(live), 2)
            try:
                found = self._sc.parallelize(range(n), n).map(lambda _: this_executor(host)).distinct().collect()
            except Exception:  # noqa: BLE001
                log.warning("could not probe executors", exc_info=True)
                found = []
            for e in found:
                self._known_executors[e.executor_id] = e
        return [e for eid, e in sorted(self._known_executors.items()) if eid in live]

    def _receiver_loop(self, sid: int) -> None:
        if self._hold_s > 0:  # a takeover's first batch runs before the receivers launch
            done = self._launch.wait(self._hold_s)
            if self._active:  # (not woken by a stop)
                log.info("receiver of stream %d launched %s", sid, "once the first batch completed" if done
                         else f"{self._hold_s:.1f} s after the start, no batch completed yet")
        stream = self._inputs[sid]
        backoff = 0.1
        first = True
        while self._active:
            locations = self._next_locations(sid, first)
            first = False
            level = stream.receiver.storageLevel
            config = SupervisorConfig(
                stream_id=sid, endpoint=(self.endpoint.address[0], self.endpoint.address[1]), secret=self._secret,
                **self._base_config, replication=2 if level is None else max(1, int(level.replication)),
                block_peers=tuple((c.executor_id, c.host, c.port) for c in self._block_servers),
                plans=self.precomputed.plans_of(sid) if self.precomputed is not None else ())
            rdd = rdd_with_locations(self._sc, [str(sid)], [[location_string(x) for x in locations]])
            self._sc.setJobGroup(f"sparkwal-receiver-{sid}", f"receiver of stream {sid}",
                                 interruptOnCancel=True)
            started = time.monotonic()
            with self._lock:
                self._counts["receiver_jobs_launched"] += 1
            try:
                outcome = self._sc.runJob(rdd, partial(receiver_partition, config, stream.receiver))
                log.info("receiver job of stream %d ended: %s", sid, outcome)
            except Exception as e:  # noqa: BLE001
                if self._active:
                    log.warning("receiver job of stream %d failed: %s", sid, str(e).splitlines()[0])
            if not self._active:
                break
            backoff = 0.1 if time.monotonic() - started > 10 else min(backoff * 2, 5.0)
            log.info("restarting the receiver of stream %d in %.1f s", sid, backoff)
            if self._stopped.wait(backoff):
                break

    def _next_locations(self, sid: int, first: bool):
        with self._lock:
            info = self._tracking[sid]
        if first and info.scheduled_locations:
            return list(info.scheduled_locations)
        executors = self._executors()
        with self._lock:
            scheduled = [x for x in (info.scheduled_locations or ())
                         if not isinstance(x, ExecutorCacheTaskLocation) or x in executors]
            if not scheduled or info.state is not ReceiverState.SCHEDULED:
                scheduled = self._policy.reschedule_receiver(
                    sid, self._inputs[sid].receiver.preferredLocation(), self._tracking, executors)
            self._tracking[sid] = ReceiverTrackingInfo(sid, ReceiverState.SCHEDULED, tuple(scheduled))
        return scheduled

    def stop(self, graceful: bool, timeout_s: float = 10.0) -> None:
        """Stop every receiver (each pushes its last block first), wait for their jobs to end
        (cancelling them after ``timeout_s``), then close the endpoint."""
        self._active = False
        self._stopped.set()
        self._launch.set()  # (a launch held back ends at once)
        with self._lock:
            conns = list(self._conns.values())
        self._unprocessed.wake()
        for c in conns:
            c.send(wire.STOP_RECEIVER)
        deadline = time.monotonic() + (timeout_s if graceful else 2.0)
        ended = [t.join(max(0.0, deadline - time.monotonic())) for t in self._threads]
        if not all(ended):
            for sid in self._inputs:
                self._sc.cancelJobGroup(f"sparkwal-receiver-{sid}")
            for t in self._threads:
                t.stop(5)
        if self.endpoint is not None:
            self.endpoint.stop()
        self.block_outputs.stop(max(0.0, deadline - time.monotonic()) if graceful else 2.0)
        for controller in self._rate_controllers.values():
            controller.stop()
        if not self.wal_enabled and self._sc.master.startswith("local["):
            remove_local_blocks(self._sc.applicationId,
                                self._settings.raw("spark.local.dir", tempfile.gettempdir()).split(",")[0])

    @property
    def running(self) -> bool:
        with self._lock:
            return bool(self._conns)

    def statistics(self) -> ReceiverTrackerStatistics:
        with self._lock:
            pre = self.precomputed
            total, most, waits = self._unprocessed.figures()
            return ReceiverTrackerStatistics(
                unprocessed_bytes=total, max_unprocessed_bytes=most, add_block_waits=waits,
                **self._counts,
                cut_waits=self.batch_cuts.waits, cuts_late=self.batch_cuts.late,
                **(dict(precomputed_batches=pre.batches, precompute_fallbacks=pre.fallbacks) if pre else {}))

    def receiver_infos(self) -> dict[int, ReceiverInfo]:
        with self._lock:
            return dict(self._infos)

    # ---------------------------------------------------------------- endpoint handler

    def on_register(self, conn: Connection, stream_id: int, typ: str, host: str,
                    executor_id: str, worker_pid: int) -> tuple[bool, str]:
        with self._lock:
            if not self._active:
                return False, "the receiver tracker is stopping"
            if stream_id not in self._inputs:
                return False, f"no receiver input has stream id {stream_id}"
            other = self._conns.get(stream_id)
            if other is not None and not other.closed:
                return False, f"stream {stream_id} already has a running receiver ({other.peer})"
            if conn in self._conn_stream:
                return False, "this connection already registered a receiver"
            location = ExecutorCacheTaskLocation(host, executor_id)
            self._known_executors.setdefault(executor_id, location)
            self._conns[stream_id] = conn
            self._conn_stream[conn] = stream_id
            self._tracking[stream_id] = ReceiverTrackingInfo(stream_id, ReceiverState.ACTIVE, None, location)
            info = self._infos[stream_id] = ReceiverInfo(stream_id, typ, True, host, executor_id,
                                                         worker_pid=worker_pid)
        log.info("registered receiver for stream %d on executor %s (%s)", stream_id, executor_id, host)
        self._events.post(StreamingListenerReceiverStarted(info))
        return True, ""

    def on_add_block(self, conn: Connection, block: list, host: str, executor_id: str,
                     size: int, copies: list, results: list) -> tuple[bool, str]:
        with self._lock:
            sid = self._conn_stream.get(conn)
        if sid is None:
            raise wire.ProtocolError("AddBlock before RegisterReceiver")
        info = block_from_wire(block)
        if size < 0:
            raise wire.ProtocolError(f"negative block size {size}")
        try:
            held_by = copies_from_wire(copies, executor_id, host)
            results = checked_results(results)
        except ValueError as e:
            raise wire.ProtocolError(f"AddBlock {info.block_id}: {e}") from None
        if info.stream_id != sid or not info.block_id.startswith(f"input-{sid}-"):
            with self._lock:
                self._counts["blocks_refused"] += 1
            log.warning("refused block %r from %s: not a block of its stream %d", info.block_id, conn, sid)
            return False, f"block {info.block_id!r} is not a block of stream {sid}"
        self._unprocessed.wait_for_room(sid, size, lambda: self._active and not self._stopped.is_set())
        if results and self.precomputed is not None:  # held first: a batch that allocates the block finds them
            self.precomputed.add(sid, info.block_id, self.block_outputs.for_batches(results))
        self.block_outputs.offer(sid, info, results)  # (first too: its batch's job may run before recorded())
        try:
            logged = self._blocks.add_block(info)
        except BaseException:
            self.block_outputs.refused(sid, info.block_id)
            raise
        if not logged:
            if self.precomputed is not None:
                self.precomputed.discard(info.block_id)
            self.block_outputs.refused(sid, info.block_id)
            with self._lock:
                self._counts["blocks_refused"] += 1
            return False, f"block {info.block_id} could not be logged in the driver's WAL"
        with self._lock:  # (the bound's lock inside the tracker's: statistics() reads both at once)
            self._unprocessed.added(sid, info.block_id, size, counted=self._active)
            self._counts["blocks_added"] += 1
            if info.wal_handle is None:
                self._block_locations[info.block_id] = held_by
        self.block_outputs.recorded(sid, info.block_id)  # (after its copies are known: an early call may read them)
        return True, ""

    def on_report_error(self, conn: Connection, stream_id: int, message: str, error: str | None) -> None:
        with self._lock:
            if self._conn_stream.get(conn) != stream_id:
                log.warning("dropped an error report for stream %d from %s (not its receiver)", stream_id, conn)
                return
            old = self._infos[stream_id]
            info = self._infos[stream_id] = ReceiverInfo(
                stream_id, old.name_, old.active_, old.location_, old.executor_id_, message, error or "",
                self._clock.now_ms(), old.worker_pid)
        log.warning("receiver of stream %d reported: %s %s", stream_id, message, error or "")
        self._events.post(StreamingListenerReceiverError(info))

    def on_recorded_up_to(self, conn: Connection, stream_id: int, batch_ms: int) -> None:
        if self._conn_stream.get(conn) == stream_id:  # (a stopped receiver's late report: dropped)
            self.batch_cuts.recorded_up_to(stream_id, batch_ms)

    def on_deregister(self, conn: Connection, stream_id: int, message: str, error: str | None) -> None:
        if self._conn_stream.get(conn) == stream_id:
            self._deactivate(conn, message, error)

    def on_disconnect(self, conn: Connection) -> None:
        self._deactivate(conn, "the receiver's connection was lost (its executor or worker died?)",
                         "connection lost")

    def _deactivate(self, conn: Connection, message: str, error: str | None) -> None:
        with self._lock:
            sid = self._conn_stream.pop(conn, None)
            if sid is None:
                return
            if self._conns.get(sid) is conn:
                del self._conns[sid]
            self._tracking[sid] = ReceiverTrackingInfo(sid, ReceiverState.INACTIVE)
            self.batch_cuts.forget(sid)
            old = self._infos[sid]
            info = self._infos[sid] = ReceiverInfo(
                sid, old.name_, False, old.location_, old.executor_id_,
                message if error else old.last_error_message, error or old.last_error,
                self._clock.now_ms() if error else old.last_error_time_ms, old.worker_pid)
        log.info("receiver of stream %d stopped: %s", sid, message)
        self._events.post(StreamingListenerReceiverStopped(info))

    # ---------------------------------------------------------------- from the engine

    def block_output(self, output_op_id: int) -> BlockOutput | None:
        """The ``foreachBlock`` output with this id (None: not one)."""
        return self.block_outputs.get(output_op_id)

    def block_copies(self, block_id: str) -> tuple[BlockCopy, ...]:
        """Where a WAL-off block's copies are (none: not received by this driver)."""
        with self._lock:
            return self._block_locations.get(block_id, ())

    @property
    def secret(self) -> bytes:
        """The application's secret: receivers' and block servers' authentication, block tags."""
        return self._secret

    def live_executor_ids(self) -> set[str] | None:
        return live_executor_ids(self._sc)

    def on_batch_completed(self, time_ms: int, batch: BatchInfo | None) -> None:
        """A batch finished: its blocks no longer count as unprocessed; feed the rate controllers;
        receivers held back until then launch (:meth:`start`)."""
        if self._hold_until_ms is not None and time_ms >= self._hold_until_ms:  # (not an earlier batch)
            self._launch.set()
        blocks = self._blocks.get_blocks_of_batch(time_ms)
        freed = self._unprocessed.processed(b.block_id for infos in blocks.values() for b in infos)
        log.debug("batch %d done: %d bytes of %d blocks no longer unprocessed", time_ms, freed,
                  sum(map(len, blocks.values())))
        if batch is not None:
            for c in self._rate_controllers.values():
                c.on_batch_completed(batch)

    def update_rate_limit(self, stream_id: int, rate: float) -> None:
        with self._lock:
            conn = self._conns.get(stream_id)
        log.info("rate limit of stream %d: %.0f records/s", stream_id, rate)
        if conn is not None:
            conn.send(wire.UPDATE_RATE_LIMIT, [float(rate)])

    def cleanup_old_blocks(self, thresh_ms: int) -> None:
        thresh_ms = oldest_kept_block_ms(self._blocks, thresh_ms)
        with self._lock:
            conns = list(self._conns.values())
            for bid in [b for b in self._block_locations if block_time_ms(b) < thresh_ms]:
                del self._block_locations[bid]
        for c in conns:
            c.send(wire.CLEANUP_OLD_BLOCKS, [int(thresh_ms)])


class _Placement:
    def __init__(self, stream_id: int, preferred: str | None):
        self.stream_id, self.preferred_location = stream_id, preferred
