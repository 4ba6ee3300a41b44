"""Receivers that run the stateless part of the graph (``spark.sparkwal.receiver.precompute``).

A batch of a receiver stream costs a Spark job that reads its blocks back, runs the per-record
functions and, for a ``reduceByKey``, a shuffle: about 135-200 ms on two cores before any
streaming engine, more than a 100 ms batch interval. Yet the receiver's long-running task holds
every record in memory as it stores it. With this setting on, that task runs the chain of
per-record operations after the receiver stream (``map``, ``flatMap``, ``filter``,
``mapPartitions``, ``mapValues``, ``flatMapValues``, ``glom``) up to and including the first
``combineByKey`` (``reduceByKey``, ``countByValue``, ``count``, ``reduce``) on each block as it
stores it: exactly the map side of that shuffle, since a batch's RDD has one partition per
block. The block is stored (in the receiver WAL, with its fsync) before its result is reported
with it in ``AddBlock``; a batch whose every block came with its result builds the combined
stream's RDD on the driver from those results (``mergeCombiners`` over the blocks; ``parallelize``
only if a Spark job needs them): no block read, no Python task, no shuffle, and an output operation that
only reads the rows (``collect``, ``take``, ``count``, ``isEmpty``, ``first``) runs no Spark job
either (:class:`~sparkwal.engine.driver_rows.DriverRowsRDD`), nor does a ``mapWithState`` after it
while its state is small (:mod:`sparkwal.engine.state.driver_state`). Any other batch (a block without a
result, a restarted driver, a result too large) takes the ordinary path from the blocks, which
computes the same records: the blocks stay the source of truth, the results only a shortcut.

Results travel as msgpack, never pickled: only tuples of ``str``, ``bytes``, ``int`` (64-bit),
``float``, ``bool`` and ``None`` are sent (they come back exactly as they were); a result with
anything else is not sent and its batch takes the ordinary path. The wire field is described in
:mod:`sparkwal.engine.receiver.wire` (``AddBlock``'s ``results``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import msgpack
from pyspark import cloudpickle
from pyspark.rdd import portable_hash

from sparkwal.base.times import batch_name

from ..driver_rows import DriverRowsRDD

log = logging.getLogger(__name__)

_INT_RANGE = (-(1 << 63), 1 << 64)
#: blocks in a row whose result a plan could not send before the receiver stops running it
UNSENT_BEFORE_STOP = 10


@dataclass(frozen=True)
class BlockPlan:
    """What a receiver runs on each block for one combined stream: ``steps`` (each
    ``records -> records``, per partition), then the map side of ``combineByKey``."""

    plan_id: int  #: the combined stream's index in the graph
    steps: tuple[Callable, ...]
    create_combiner: Callable
    merge_value: Callable


def _exact(value) -> bool:
    """Whether ``value`` comes back from msgpack (``use_list=False``) exactly as it is."""
    kind = type(value)
    if kind is tuple:
        return all(_exact(v) for v in value)
    if kind is int:
        return _INT_RANGE[0] <= value < _INT_RANGE[1]
    return kind in (str, bytes, float, bool, type(None))


def combine_into(combiners: dict, plan: BlockPlan, records) -> dict:
    """Run ``records`` through the plan's steps into ``combiners`` (the map side of its combineByKey)."""
    out = records
    for step in plan.steps:
        out = step(iter(out))
    create, merge = plan.create_combiner, plan.merge_value
    for key, value in out:
        combiners[key] = merge(combiners[key], value) if key in combiners else create(value)
    return combiners


def run_plan(plan: BlockPlan, records: list) -> list:
    """The combiners of one block, as ``(key, combiner)``."""
    return list(combine_into({}, plan, records).items())


class RunningResults:
    """The plans' combiners of the records added since the last :meth:`take`, built as records
    arrive, so a block's result is ready when it is cut: only for plans whose every step is
    ``per_record`` (:func:`sparkwal.engine.stream_machinery.per_record`; a ``mapPartitions``
    function sees a whole block, as its partition)."""

    def __init__(self, stream_id: int, plans: tuple[BlockPlan, ...], max_bytes: int, failed: set,
                 unsent: dict[int, int] | None = None):
        """``failed``: the plans this receiver stopped running (shared by its results); ``unsent``: each
        plan's blocks in a row whose result could not be sent (shared too; see :meth:`take`)."""
        self._stream_id, self._plans, self._max_bytes, self._failed = stream_id, plans, max_bytes, failed
        self._unsent = unsent if unsent is not None else {}
        self._combiners: dict[int, dict] = {p.plan_id: {} for p in plans}

    @staticmethod
    def possible(plans: tuple[BlockPlan, ...]) -> bool:
        return bool(plans) and all(getattr(s, "per_record", False) for p in plans for s in p.steps)

    def add(self, records: list) -> None:
        for plan in self._plans:
            if plan.plan_id not in self._failed:
                try:
                    combine_into(self._combiners[plan.plan_id], plan, records)
                except Exception as e:  # noqa: BLE001  (the user's function: its batch reports it)
                    _stopped(self._stream_id, plan, e, self._failed)

    def take(self) -> list:
        """``AddBlock``'s results for the records added since the last take; starts anew
        (:meth:`peek`, then :meth:`commit`)."""
        results, outcome = self.peek()
        self.commit(outcome)
        return results

    def peek(self) -> tuple[list, dict[int, bool]]:
        """``(results, outcome)``: ``AddBlock``'s results for the records added so far, without
        starting anew, so that a block not queued after all keeps its combiners with its records;
        ``outcome`` says of each plan with combiners whether its result was sent (for :meth:`commit`)."""
        out, room, outcome = [], self._max_bytes, {}
        for plan in self._plans:
            combiners = self._combiners[plan.plan_id]
            if plan.plan_id in self._failed:
                continue
            try:
                data = encode_result(with_hashes(combiners), room)
            except Exception:  # noqa: BLE001  (msgpack refuses a lone surrogate, a nesting too deep: not sent)
                data = None
            if combiners:  # (an empty result, sent or not, says nothing of the plan's)
                outcome[plan.plan_id] = data is not None
            if data is not None:
                out.append([plan.plan_id, data])
                room -= len(data)
        return out, outcome

    def commit(self, outcome: dict[int, bool]) -> None:
        """The results :meth:`peek` gave went with their block: start anew. A plan whose result
        could not be sent for :data:`UNSENT_BEFORE_STOP` blocks with combiners in a row stops: on by
        default, precompute must not double a receiver's work for results that never reach the
        driver (its batches read their blocks either way)."""
        self._combiners = {p.plan_id: {} for p in self._plans}
        for plan in self._plans:
            sent = outcome.get(plan.plan_id)
            if sent is None:
                continue  # (no combiners: says nothing)
            if sent:
                self._unsent.pop(plan.plan_id, None)
                continue
            self._unsent[plan.plan_id] = self._unsent.get(plan.plan_id, 0) + 1
            if self._unsent[plan.plan_id] >= UNSENT_BEFORE_STOP:
                _stopped(self._stream_id, plan, f"the results of its last {UNSENT_BEFORE_STOP} blocks were not "
                         f"sent (larger than the room left of the block's {self._max_bytes} bytes, "
                         "spark.sparkwal.receiver.precompute.maxBytes, or holding values other than str, bytes, "
                         "int, float, bool, None and tuples)", self._failed)


def _stopped(stream_id: int, plan: BlockPlan, why: Exception | str, failed: set) -> None:
    failed.add(plan.plan_id)
    said = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
    log.warning("receiver precompute of stream %d's plan %d stopped: %s (its batches read their blocks "
                "instead)", stream_id, plan.plan_id, said)


def key_hash(key) -> int | None:
    """``portable_hash(key)`` as the executors' Python workers work it out (it depends on their
    ``PYTHONHASHSEED``, which a driver may not share): the partition a state run on the driver puts
    the key in (:mod:`sparkwal.engine.state.driver_state`). None where it cannot be worked out."""
    try:
        return portable_hash(key)
    except Exception:  # noqa: BLE001  (no PYTHONHASHSEED: not in a Spark worker; an unhashable key)
        return None


def with_hashes(combiners: dict) -> list:
    """A block's result items: ``(key, combiner, key_hash(key))``."""
    return [(key, combiner, key_hash(key)) for key, combiner in combiners.items()]


def encode_result(items: list, max_bytes: int) -> bytes | None:
    """``items`` as msgpack, or None when they would not come back exactly or exceed ``max_bytes``."""
    if not all(_exact(item) for item in items):
        return None
    data = msgpack.packb(items, use_bin_type=True)
    return data if len(data) <= max_bytes else None


def decode_result(data: bytes) -> tuple:
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


def block_results(stream_id: int, plans: tuple[BlockPlan, ...], records: list, max_bytes: int,
                  failed: set, unsent: dict[int, int] | None = None) -> list:
    """``[[plan_id, bytes], ...]`` for ``AddBlock``, at most ``max_bytes`` in all. A plan whose
    function raises is logged once and skipped (its batches take the ordinary path, where the
    error surfaces as the batch's own), as is one whose results are not sent (:meth:`RunningResults.take`)."""
    running = RunningResults(stream_id, plans, max_bytes, failed, unsent)  # the same steps, on the whole block
    running.add(records)
    return running.take()


def checked_results(results: list) -> list:
    """``AddBlock``'s results as sent: ``[[plan_id, bytes], ...]``; ValueError on anything else."""
    for r in results:
        if not (isinstance(r, list) and len(r) == 2 and type(r[0]) is int and isinstance(r[1], bytes)):
            raise ValueError(f"a result must be [plan_id, bytes], got {type(r).__name__}")
    return results


def find_plans(graph, inputs, stopped: dict[int, str] | None = None) -> dict[int, list]:
    """Each receiver stream's ``[(combined stream, BlockPlan), ...]``: every branch from it through
    per-record operations (none persisted or checkpointed, none feeding another stream) to a
    ``combineByKey`` that only an output or later streams use. ``stopped``, when given, gets for
    each receiver stream with no plan what stops its first branch (one line, naming the operation)."""
    children: dict[int, list] = {}
    seen, todo = set(), list(graph.outputs)
    while todo:
        stream = todo.pop()
        for parent in stream.dependencies:
            children.setdefault(id(parent), []).append(stream)
            if id(parent) not in seen:
                seen.add(id(parent))
                todo.append(parent)
    index = {id(s): i for i, s in enumerate(graph.streams)}
    plans: dict[int, list] = {}
    for stream in inputs:
        reasons = []
        for child in children.get(id(stream), []):
            found = _branch(stream, child, children)
            if isinstance(found, str):
                reasons.append(found)
                continue
            head, steps = found
            plans.setdefault(stream.input_id, []).append(
                (head, BlockPlan(index[id(head)], tuple(steps), head.block_combine[0], head.block_combine[1])))
        if stopped is not None and stream.input_id not in plans:
            stopped[stream.input_id] = reasons[0] if reasons else "no output uses it"
    return plans


def _branch(stream, child, children: dict[int, list]):
    """``(combined stream, steps)`` of the branch from ``stream`` through ``child``, or why there is none."""
    steps, cur = [], child
    while getattr(cur, "block_step", None) is not None and _plain(cur):
        steps.append(cur.block_step)
        kids = children.get(id(cur), [])
        if len(kids) != 1:
            return f"{cur.creation_site} feeds {len(kids)} streams (a receiver runs one path to a combineByKey)"
        cur = kids[0]
    if getattr(cur, "block_combine", None) is None:
        if getattr(cur, "block_step", None) is not None:  # per-record, but its RDD is kept
            kids = children.get(id(cur), [])
            windowed = [k for k in kids if getattr(k, "window_ms", None) is not None]
            kept = ("checkpointed" if cur.checkpoint_ms or cur.must_checkpoint else
                    f"persisted for {windowed[0].creation_site}" if windowed else "persisted")
            return f"{cur.creation_site} is {kept} (its RDD is built, so its blocks are read)"
        return f"{cur.creation_site} is not a per-record operation nor a combineByKey/reduceByKey"
    if len(cur.dependencies) != 1:
        return f"{cur.creation_site} combines more than one stream"
    if cur.slide_ms != stream.slide_ms:
        return f"{cur.creation_site} slides every {cur.slide_ms} ms, not every batch"
    return cur, steps


def _plain(stream) -> bool:
    """A per-record stream the receiver may run in place of the batch (its RDD is never built)."""
    return (len(stream.dependencies) == 1 and stream.storage_level is None and not stream.checkpoint_ms
            and not stream.must_checkpoint)


class Precomputed:
    """The driver's side: the plans, the results the receivers sent with their blocks (at most
    ``max_held`` bytes, the oldest dropped first: their batches read their blocks), and each
    combined stream's RDD from them."""

    def __init__(self, sc, inputs: list, blocks, report_input, plans: dict[int, list], max_held: int,
                 stopped: dict[int, str] | None = None):
        """``inputs``: the receiver streams; ``blocks``: the driver's block tracker; ``report_input``: the
        driver's record of a batch's input; ``stopped``: why a receiver stream has no plan (:func:`find_plans`)."""
        self._sc, self._inputs, self._blocks, self._report_input = sc, inputs, blocks, report_input
        self._heads = [(head, (sid, plan)) for sid, pairs in plans.items() for head, plan in pairs]
        self._plans = {id(head): entry for head, entry in self._heads}
        self._by_stream = {sid: tuple(plan for _, plan in pairs) for sid, pairs in plans.items()}
        self._results: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._held, self._max_held = 0, max_held
        self._lock = threading.Lock()
        self._stopped = dict(stopped or {})
        self.batches = self.fallbacks = 0

    @classmethod
    def of_graph(cls, sc, graph, inputs: list, blocks, report_input, max_held: int,
                 asked: bool = True) -> Precomputed:
        """The plans :func:`find_plans` finds in ``graph``, logged in one line at start, naming the
        operation that stops each receiver stream not precomputed: a WARNING where the program
        ``asked`` for precompute (set ``spark.sparkwal.receiver.precompute`` itself), INFO under the default."""
        stopped: dict[int, str] = {}
        plans = find_plans(graph, inputs, stopped)
        for sid, pairs in list(plans.items()):  # a receiver's job carries them: one that cannot is left out
            try:
                cloudpickle.dumps([plan for _, plan in pairs])
            except Exception as e:  # noqa: BLE001  (pickling raises what the user's objects raise)
                del plans[sid]
                stopped[sid] = f"its functions cannot be pickled ({type(e).__name__}: {e})"
        made = cls(sc, inputs, blocks, report_input, plans, max_held, stopped)
        (log.warning if stopped and asked else log.info)("spark.sparkwal.receiver.precompute: %s", made.describe())
        return made

    def describe(self) -> str:
        """One line for the log: which receiver streams run what, and why each other one runs nothing
        (its batches read their blocks)."""
        runs = [f"stream {sid} runs the per-record operations up to {head.creation_site}"
                for head, (sid, _) in self._heads]
        stops = [f"stream {sid} is not precomputed: {why}" for sid, why in sorted(self._stopped.items())]
        if not runs and not stops:
            return ("no receiver stream has per-record operations ending in a combineByKey/reduceByKey "
                    "(not persisted, checkpointed, nor used twice): every batch reads its blocks")
        return "; ".join(runs + stops)

    @property
    def held_bytes(self) -> int:
        return self._held

    def covers(self, head) -> bool:
        """Whether ``head``'s batches may come from the receivers' results."""
        return id(head) in self._plans

    def plans_of(self, stream_id: int) -> tuple[BlockPlan, ...]:
        return self._by_stream.get(stream_id, ())

    def add(self, stream_id: int, block_id: str, results: list) -> None:
        """Keep a recorded block's results (``AddBlock``'s, checked: known plans of its stream)."""
        known = {p.plan_id for p in self.plans_of(stream_id)}
        with self._lock:
            for plan_id, data in results:
                if plan_id in known:
                    replaced = self._results.pop((block_id, plan_id), None)  # (an AddBlock sent again)
                    self._held += len(data) - (len(replaced) if replaced is not None else 0)
                    self._results[(block_id, plan_id)] = data
            while self._held > self._max_held and self._results:
                self._held -= len(self._results.popitem(last=False)[1])

    def discard(self, block_id: str) -> None:
        """Forget a block's results (the block was refused after all)."""
        with self._lock:
            for key in [k for k in self._results if k[0] == block_id]:
                self._held -= len(self._results.pop(key))

    def rdd(self, head, time_ms: int):
        """``head``'s RDD at ``time_ms`` from its blocks' results, or None (the ordinary path)."""
        entry = self._plans.get(id(head))
        if entry is None:
            return None
        sid, plan = entry
        stream = next(s for s in self._inputs if s.input_id == sid)
        blocks = self._blocks.get_blocks_of_batch_and_stream(time_ms, sid)
        with self._lock:
            found = [self._results.pop((b.block_id, plan.plan_id), None) for b in blocks]
            self._held -= sum(len(d) for d in found if d is not None)
        if not blocks:
            return None  # the ordinary path's empty batch
        if any(d is None for d in found):
            self.fallbacks += 1
            return None
        try:
            parts = [decode_result(d) for d in found]
            if not all(type(item) is tuple and len(item) == 3 for part in parts for item in part):
                raise ValueError("an item is not [key, combiner, hash]")
        except Exception as e:  # noqa: BLE001  (msgpack raises several types on garbage)
            log.warning("%s: a receiver's result did not decode (%s); reading its blocks", batch_name(time_ms), e)
            self.fallbacks += 1
            return None
        self._report_input(time_ms, stream, sum(b.num_records or 0 for b in blocks),
                                {"blocks": len(blocks), "precomputed": True})
        self.batches += 1
        merge = head.block_combine[2]
        merged: dict = {}
        hashes: dict = {}
        for part in parts:
            for key, combiner, hashed in part:
                merged[key] = merge(merged[key], combiner) if key in merged else combiner
                hashes[key] = hashed
        return DriverRowsRDD(self._sc, list(merged.items()), num_partitions=head.block_combine[3],
                             key_hashes=hashes if None not in hashes.values() else None)
