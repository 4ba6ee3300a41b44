"""A receiver tracker's ``foreachBlock`` outputs (:mod:`.block_output` is one output): which outputs a
graph has and the plan that feeds each (refused at start when the receivers cannot feed one), each
stream's blocks handed to its outputs as they arrive, and their threads started and stopped together."""

from __future__ import annotations

import time
from functools import partial

from .block_output import BlockOutput
from .precompute import find_plans


def _planned(graph, inputs: list) -> dict[int, tuple]:
    """Each ``foreachBlock`` output of ``graph`` by output id: ``(output, stream id, plan)``, its plan
    found as precompute finds plans (whether or not precompute is on); ValueError, naming the output
    and what stops it, for one on a stream the receivers cannot precompute."""
    wanted = [o for o in graph.outputs if getattr(o, "block_func", None) is not None]
    if not wanted:
        return {}
    stopped: dict[int, str] = {}
    heads = {id(head): (sid, plan) for sid, pairs in find_plans(graph, inputs, stopped).items()
             for head, plan in pairs}
    planned = {}
    for out in wanted:
        head = out.dependencies[0]
        if id(head) not in heads:
            why = ("the program has no receiver stream" if not inputs else
                   "; ".join(f"stream {sid}: {reason}" for sid, reason in sorted(stopped.items())))
            raise ValueError(
                f"foreachBlock at {out.creation_site} needs a stream the receivers can precompute (per-record "
                f"operations from one receiver stream up to a reduceByKey/combineByKey, not persisted, checkpointed "
                f"nor used twice); {head.creation_site} is not one" + (f" ({why})" if why else ""))
        planned[out.output_op_id] = (out, *heads[id(head)])
    return planned


def check_block_outputs(graph) -> None:
    """At start, before anything runs: ValueError for a ``foreachBlock`` the receivers cannot feed."""
    _planned(graph, [s for s in graph.inputs if getattr(s, "receiver", None) is not None])


def _built_on(stream) -> list:
    """``stream`` and every stream it is built on, each once."""
    found, todo = {id(stream): stream}, [stream]
    while todo:
        for parent in todo.pop().dependencies:
            if id(parent) not in found:
                found[id(parent)] = parent
                todo.append(parent)
    return list(found.values())


def only_block_outputs_use(graph, head) -> bool:
    """Whether nothing but ``foreachBlock`` outputs reads ``head`` (its batches' RDD is never built)."""
    users = {id(s): s for out in graph.outputs for s in _built_on(out) if any(d is head for d in s.dependencies)}
    return all(getattr(u, "block_func", None) is not None for u in users.values())


def _reads(stream, source) -> bool:
    """Whether ``stream`` is built on ``source``."""
    return any(s is source for s in _built_on(stream))


class BlockOutputs:
    """A receiver tracker's ``foreachBlock`` outputs (:func:`check_block_outputs` is their rule),
    each stream's in one place: its blocks as they arrive, the outputs' threads, their statistics."""

    def __init__(self, sc, graph, inputs: list, **collaborators):
        """``collaborators``: :class:`BlockOutput`'s ``read_records``, ``batch_blocks``, ``report`` and
        ``confirm_leadership``, each taking the input stream first."""
        by_id = {s.input_id: s for s in inputs}
        self._outputs: dict[int, BlockOutput] = {}
        self._of_stream: dict[int, list[BlockOutput]] = {}
        self._only_theirs: set[int] = set()
        for op_id, (out, sid, plan) in _planned(graph, inputs).items():
            bound: dict = {name: partial(f, by_id[sid]) for name, f in collaborators.items()}
            made = self._outputs[op_id] = BlockOutput(sc, out.creation_site, sid, plan, out.block_func,
                                                      num_partitions=out.dependencies[0].block_combine[3],
                                                      output_id=op_id, **bound)
            self._of_stream.setdefault(sid, []).append(made)
            if only_block_outputs_use(graph, out.dependencies[0]):
                self._only_theirs.add(plan.plan_id)
            made.reports_input = all(getattr(o, "block_func", None) is not None
                                     for o in graph.outputs if _reads(o, by_id[sid]))

    def get(self, output_op_id: int) -> BlockOutput | None:
        return self._outputs.get(output_op_id)

    def for_batches(self, results: list) -> list:
        """Of a block's receiver results, those a batch may read: each output keeps its own, so one
        whose stream nothing else reads is not held for its batches."""
        return [r for r in results if r[0] not in self._only_theirs] if self._only_theirs else results

    def offer(self, stream_id: int, info, results: list) -> None:
        for out in self._of_stream.get(stream_id, ()):
            out.offer(info, next((data for plan_id, data in results if plan_id == out.plan_id), None))

    def recorded(self, stream_id: int, block_id: str) -> None:
        for out in self._of_stream.get(stream_id, ()):
            out.recorded(block_id)

    def refused(self, stream_id: int, block_id: str) -> None:
        for out in self._of_stream.get(stream_id, ()):
            out.refused(block_id)

    def start(self) -> None:
        for out in self._outputs.values():
            out.start()

    def stop(self, timeout_s: float) -> None:
        stop_all(list(self._outputs.values()), timeout_s)


def stop_all(outputs: list[BlockOutput], timeout_s: float) -> None:
    """Stop the early calls of ``outputs`` together: every one is told before any is waited for, so a
    call in progress in one does not hold back the others' ends; each left running after the shared
    time (``timeout_s``, at least half a second) has its Spark jobs cancelled."""
    for out in outputs:
        out.tell_stop()
    budget = max(0.5, timeout_s)
    deadline = time.monotonic() + budget
    for out in outputs:
        out.wait_stopped(max(0.0, deadline - time.monotonic()), budget)
