"""Output per block (``DStream.foreachBlock``): a combined stream's rows of each receiver block,
output as soon as the block is recorded, before its batch.

A stream the receivers can precompute (per-record operations from one receiver stream up to a
``reduceByKey``/``combineByKey``: :func:`.precompute.find_plans`) has, for every block, the rows
that combine gives over that block alone. ``foreachBlock(func)`` calls ``func`` with them once the
block is stored (in the receiver WAL, with its fsync, where it is on) and its ``AddBlock`` is
logged by the driver: the rule a batch's blocks follow, so what is output is what a restart
recovers. A record then waits for its block (``spark.streaming.blockInterval``, and every batch
time cuts one), not for its batch: at 100 ms batches that is the half of a record's latency a batch
output cannot go under (docs/benchmarks.md).

The rows are the result the receiver sent with the block (precompute), else the block's records
read back (from the receiver WAL; with the WAL off, by a task beside a copy) and the plan run on the
driver. A block whose rows are not output early (its call raised,
the queue was full, the driver restarted) is output by its batch's job, which also waits for a
call in progress: every block of a batch is output before the batch completes, so none is lost,
and the blocks' WAL records are cleaned only after that. Output is at least once: a block id and
its rows are the same in every call for it (the records are the WAL's), so a sink that keys its
writes by the block id writes each block once. One output's calls never overlap; they come in the
order the blocks were recorded, except those its batches make (within one driver: one stopped
without waiting gives a call in progress 2 s).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Callable

from sparkwal.base.service import Service
from sparkwal.base.times import batch_name
from sparkwal.wal import FencedError

from ..driver_rows import DriverRowsRDD
from ..errors import EngineError
from ..dstream import ForEachDStream, Job, arity
from .blocks import block_time_ms
from .precompute import BlockPlan, decode_result, run_plan

log = logging.getLogger(__name__)

#: blocks waiting for their early call (or, after it failed, for their batch), at most; past it a block
#: waits for its batch
MAX_QUEUED_BLOCKS = 1024

_PENDING, _QUEUED, _RUNNING, _DONE, _FAILED = "pending", "queued", "running", "done", "failed"  # (done: in _done)


@dataclass(frozen=True)
class BlockOutputStatistics:
    early: int  #: blocks output as soon as they were recorded
    at_batch: int  #: blocks output by their batch's job (their early call failed or never came)
    read_back: int  #: of all outputs, blocks whose records were read back (no result came with them)
    early_failures: int  #: early calls that failed: raised, or the leadership could not be confirmed
    #: first (their batches output the blocks again)
    not_queued: int  #: blocks left to their batches: the queue held MAX_QUEUED_BLOCKS or max_held_bytes
    lost: int  #: blocks not output: WAL off, and no live executor held them (as a batch drops them)
    queued: int  #: blocks waiting for their early call now
    held_bytes: int  #: the queued blocks' results


def _no_batch_output(_time, _rdd) -> None:
    """(A foreachBlock's batch job outputs blocks, never the batch's RDD.)"""


class ForEachBlockDStream(ForEachDStream):
    """``foreachBlock``: each block's rows as soon as it is recorded (the receiver tracker's
    :class:`BlockOutput` for this output); a batch's job outputs the batch's blocks not output yet."""

    def __init__(self, ssc, parent, func: Callable):
        n = arity(func)
        if n not in (1, 2, 3):
            raise TypeError(f"foreachBlock takes func(rdd), func(time, rdd) or func(time, block_id, rdd), "
                            f"got a function of {n} arguments")
        super().__init__(ssc, parent, _no_batch_output, "foreachBlock")
        self._block_func, self._arity = func, n

    def block_func(self, time: datetime, block_id: str, rdd) -> None:
        """The program's function, called for each block."""
        args = (time, block_id, rdd)[3 - self._arity:] if self._arity != 2 else (time, rdd)
        self._block_func(*args)

    def generate_job(self, time_ms: int) -> Job | None:
        tracker = self._driver.scheduler.receiver_tracker
        output = tracker.block_output(self.output_op_id) if tracker is not None else None
        if output is None:  # (the graph's validation at start refuses such a program)
            raise RuntimeError(f"{self.creation_site}: no receiver feeds this foreachBlock")
        if not self.dependencies[0].is_time_valid(time_ms):
            return None
        run = output.batch_job(time_ms)
        return Job(self.output_op_id, self.op_name, run, self.in_order) if run is not None else None


class _Unconfirmed(EngineError):
    """The driver's leadership could not be confirmed before an early call (its cause says why)."""


class BlockOutput:
    """One ``foreachBlock`` output: its early calls (a thread of its own) and its batches' jobs."""

    def __init__(self, sc, name: str, stream_id: int, plan: BlockPlan, func: Callable, *, num_partitions: int,
                 read_records: Callable[[object], list], batch_blocks: Callable[[int], list],
                 report: Callable[[int, list], None] = lambda time_ms, blocks: None,
                 confirm_leadership: Callable[[], None] = lambda: None, max_held_bytes: int = 64 << 20,
                 output_id: int | None = None):
        """``name``: the output, for log lines (its creation site); ``output_id``: its output operation's id,
        which names its thread and its Spark job group (default: the plan's id); ``plan``: what turns a block's records
        into its rows (:func:`.precompute.run_plan`); ``func(time, block_id, rdd)``; ``read_records(info)``:
        a recorded block's records, read on the driver; ``batch_blocks(time_ms)``: the stream's blocks of
        a batch; ``report(time_ms, blocks)``: a batch's input; ``confirm_leadership()``: raises unless this
        driver still leads (before every early call: a fenced driver's, a paused one's that woke up
        past its lease, output nothing more; its batches' jobs are fenced by the scheduler)."""
        self._sc, self.name, self.stream_id, self.plan, self._func = sc, name, stream_id, plan, func
        self._num_partitions, self._read_records = num_partitions, read_records
        self._batch_blocks, self._report, self._confirm = batch_blocks, report, confirm_leadership
        self._max_held = max_held_bytes
        self._id = plan.plan_id if output_id is None else output_id
        self._cond = threading.Condition()
        self._calling = threading.Lock()  # one call at a time
        self._states: dict[str, str] = {}  # blocks not output yet (pending, queued, running, failed)
        self._done: set[str] = set()  # blocks output early, until their batch's job
        self._closed = False  # no more early calls (stopped, or this driver no longer leads)
        self._infos: dict[str, object] = {}
        self._data: dict[str, bytes] = {}
        self._queue: dict[str, None] = {}  # queued blocks in the order recorded (a batch that takes one removes it)
        self._held = 0
        self._warned: set[str] = set()
        self._counts = dict(early=0, at_batch=0, read_back=0, early_failures=0, not_queued=0, lost=0)
        self._service: Service | None = None
        #: whether its batches report the receiver stream's input (not where another output reads that
        #: stream: that one's report says where its batches ran)
        self.reports_input = True

    @property
    def plan_id(self) -> int:
        return self.plan.plan_id

    def start(self) -> None:
        if self._service is None:
            self._service = Service(self.job_group, self._run)
            self._service.start()

    @property
    def job_group(self) -> str:
        """The Spark job group of the early calls' jobs (a block read back with the WAL off, the function's): the
        output's own (two outputs of one stream share its plan; a stop that cancels one's jobs leaves the other's)."""
        return f"sparkwal-block-output-{self._id}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the early calls (the one in progress ends first, its Spark jobs cancelled after
        ``timeout_s``); batches output what is left."""
        self.tell_stop()
        self.wait_stopped(timeout_s)

    def tell_stop(self) -> None:
        """Stop taking blocks early; the call in progress, if any, goes on (:meth:`wait_stopped`)."""
        if self._service is not None:
            self._service.stopping.set()
            with self._cond:
                self._cond.notify_all()

    def wait_stopped(self, timeout_s: float, budget_s: float | None = None) -> None:
        """Wait up to ``timeout_s`` for the early calls' thread to end, then cancel its Spark jobs and say
        so (``budget_s``: the stop's whole time, where several outputs shared it; else ``timeout_s``)."""
        if self._service is not None and not self._service.join(timeout_s):
            log.warning("foreachBlock at %s: the call in progress did not end within the stop's %.1f s; its Spark "
                        "jobs are cancelled and it is left running", self.name,
                        timeout_s if budget_s is None else budget_s)
            self._sc.cancelJobGroup(self.job_group)

    # -- the receiver tracker's side: a block arrives --------------------------------------------

    def offer(self, info, data: bytes | None) -> None:
        """A block of the stream, before its ``AddBlock`` is logged; ``data``: the receiver's result
        for this output's plan, if it sent one. Nothing is called until :meth:`recorded`."""
        block_id = info.block_id
        with self._cond:
            if block_id in self._states or block_id in self._done:
                return  # (an AddBlock sent again)
            size = len(data) if data is not None else 0
            if self._closed or len(self._states) >= MAX_QUEUED_BLOCKS or self._held + size > self._max_held:
                self._counts["not_queued"] += 1
                return  # its batch outputs it
            self._states[block_id], self._infos[block_id] = _PENDING, info
            if data is not None:
                self._data[block_id] = data
                self._held += size

    def recorded(self, block_id: str) -> None:
        """The block's ``AddBlock`` is logged: it may be output."""
        with self._cond:
            if self._states.get(block_id) == _PENDING:  # (else its batch already took it, or it was not offered)
                self._states[block_id] = _QUEUED
                if not self._closed:  # (else its batch takes it)
                    self._queue[block_id] = None
                    self._cond.notify_all()

    def refused(self, block_id: str) -> None:
        """The block's ``AddBlock`` could not be logged: it is not the stream's, never output."""
        with self._cond:
            if self._states.get(block_id) == _PENDING:
                self._forget(block_id)

    def _forget(self, block_id: str) -> None:
        self._states.pop(block_id, None)
        self._queue.pop(block_id, None)
        self._infos.pop(block_id, None)
        self._drop_data(block_id)

    def _drop_data(self, block_id: str) -> None:
        data = self._data.pop(block_id, None)
        if data is not None:
            self._held -= len(data)

    def _run(self) -> None:
        try:
            self._calls(self._service.stopping)
        finally:  # (stopped, fenced, or a BaseException: the batches output whatever is left)
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _calls(self, stopping: threading.Event) -> None:
        self._sc.setJobGroup(self.job_group, f"foreachBlock at {self.name}", interruptOnCancel=True)
        pause = 0.0  # after a leadership not confirmed: a short wait before the next call, doubling
        while not stopping.wait(pause):
            with self._cond:
                while not self._queue and not stopping.is_set():
                    self._cond.wait()
                if stopping.is_set():
                    return
                block_id = next(iter(self._queue))
                del self._queue[block_id]
                self._states[block_id] = _RUNNING
                info, data = self._infos[block_id], self._data.get(block_id)
            outcome = _FAILED
            try:
                self._output(info, data, confirm=True)
                outcome, pause = _DONE, 0.0
            except FencedError as e:  # another driver leads: nothing more from this one
                log.warning("foreachBlock at %s: no more early output on this driver (%s)", self.name, e)
                return
            except _Unconfirmed as e:  # its lease could not be confirmed now: its batch outputs it
                self._warn_once(block_id, e.__cause__ or e)
                pause = min(2 * pause or 0.05, 1.0)
            except Exception as e:  # noqa: BLE001  (the user's function: its batch outputs the block again)
                self._warn_once(block_id, e)
            finally:  # (whatever ended the call: a batch waiting for it goes on)
                self._settle(block_id, outcome)

    def _settle(self, block_id: str, outcome: str) -> None:
        """An early call ended: ``outcome`` is the block's state, unless its batch forgot it meanwhile."""
        with self._cond:
            if self._states.get(block_id) == _RUNNING:
                if outcome == _DONE:
                    self._counts["early"] += 1
                    self._forget(block_id)
                    self._done.add(block_id)
                else:
                    self._states[block_id] = outcome
                    self._counts["early_failures"] += 1
            self._cond.notify_all()

    def _warn_once(self, block_id: str, e: BaseException) -> None:
        said = f"{type(e).__name__}: {e}"
        with self._cond:
            new = said not in self._warned and len(self._warned) < 100
            if new:
                self._warned.add(said)
            last = new and len(self._warned) == 100
        if last:
            log.warning("foreachBlock at %s: block %s's output failed (%s); its batch outputs it again. That "
                        "is 100 different errors: later ones are only counted (statistics().early_failures)",
                        self.name, block_id, said)
        elif new:
            log.warning("foreachBlock at %s: block %s's output failed (%s); its batch outputs it again",
                        self.name, block_id, said)

    # -- a batch's job ----------------------------------------------------------------------------

    def batch_job(self, time_ms: int) -> Callable[[], None] | None:
        """What batch ``time_ms``'s job runs (None: the batch has no block of the stream); its input
        is reported now, at the batch's generation (:attr:`reports_input`)."""
        blocks = self._batch_blocks(time_ms)
        if self.reports_input:
            self._report(time_ms, blocks)
        return partial(self.output_batch, time_ms, blocks) if blocks else None

    def output_batch(self, time_ms: int, blocks: list) -> None:
        """Output every block of batch ``time_ms`` not output yet (waiting for one being output);
        raises what the function raised, naming the batch and the block. Every block of the batch
        is forgotten after, whatever happened (a failed batch is re-run by the driver's restart)."""
        try:
            for info in blocks:
                block_id = info.block_id
                with self._cond:
                    while self._states.get(block_id) == _RUNNING:
                        self._cond.wait()
                    if block_id in self._done:
                        continue
                    self._states[block_id] = _RUNNING
                    data = self._data.get(block_id)
                try:
                    self._output(info, data)
                except Exception as e:
                    e.add_note(f"foreachBlock at {self.name}: block {block_id} of {batch_name(time_ms)}")
                    raise
                with self._cond:
                    self._counts["at_batch"] += 1
        finally:
            with self._cond:
                for info in blocks:
                    self._forget(info.block_id)
                    self._done.discard(info.block_id)
                self._cond.notify_all()

    # -- both ------------------------------------------------------------------------------------

    def rows(self, info, data: bytes | None) -> DriverRowsRDD | None:
        """The block's rows: the receiver's result, else its records read back through the plan (None: lost)."""
        if data is not None:
            try:
                items = decode_result(data)
                hashes = {key: hashed for key, _, hashed in items}
                rows = [(key, combiner) for key, combiner, _ in items]
                return DriverRowsRDD(self._sc, rows, num_partitions=self._num_partitions,
                                     key_hashes=hashes if None not in hashes.values() else None)
            except Exception as e:  # noqa: BLE001  (msgpack raises several types on garbage)
                log.warning("foreachBlock at %s: block %s's result did not decode (%s); reading the block",
                            self.name, info.block_id, e)
        records = self._read_records(info)
        with self._cond:
            self._counts["read_back" if records is not None else "lost"] += 1
        if records is None:
            return None
        return DriverRowsRDD(self._sc, run_plan(self.plan, records), num_partitions=self._num_partitions)

    def _output(self, info, data: bytes | None, confirm: bool = False) -> None:
        """Call the function with the block's rows (none for a lost block: no call). ``confirm``: an early
        call, which confirms the driver's leadership right before it (FencedError, or _Unconfirmed)."""
        rdd = self.rows(info, data)
        if rdd is None:
            return
        when = datetime.fromtimestamp(block_time_ms(info.block_id) / 1000.0)  # (as foreachRDD's batch time)
        with self._calling:
            if confirm:
                try:
                    self._confirm()
                except FencedError:
                    raise
                except Exception as e:
                    raise _Unconfirmed() from e
            self._func(when, info.block_id, rdd)

    def statistics(self) -> BlockOutputStatistics:
        with self._cond:
            queued = sum(1 for state in self._states.values() if state == _QUEUED)
            return BlockOutputStatistics(**self._counts, queued=queued, held_bytes=self._held)
