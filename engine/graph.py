"""DStreamGraph: the input and output streams of a context, and the jobs they make per batch."""

from __future__ import annotations

import hashlib
import os
import sys
from types import FrameType

_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__))
_APPS_DIR = os.path.join(_ENGINE_DIR, "apps") + os.sep


def _is_engine_file(path: str) -> bool:
    """The engine's own code, whose public functions are DStream operations (its apps' are not)."""
    path = os.path.abspath(path)
    return path.startswith(_ENGINE_DIR + os.sep) and not path.startswith(_APPS_DIR)


def creation_site() -> str:
    """``"<operation> at <file>:<line>"``: the public engine call that is creating a stream, and
    where the program called it (for errors that must name a DStream operation)."""
    frame: FrameType | None = sys._getframe(1)
    op = "?"
    while frame is not None and _is_engine_file(frame.f_code.co_filename):
        if not frame.f_code.co_name.startswith("_"):
            op = frame.f_code.co_name
        frame = frame.f_back
    if frame is None:
        return op
    return f"{op} at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class DStreamGraph:
    def __init__(self) -> None:
        self.streams: list = []  # every DStream, parents first
        self.inputs: list = []
        self.outputs: list = []  # the output streams (ForEachDStream)
        self.zero_time_ms: int | None = None
        self.remember_ms: int | None = None
        #: first new batch time -> the last batch time before it, of each downtime a restart
        #: coalesced (``spark.sparkwal.recovery.coalesceDowntime``): checkpointed, as a later
        #: restart re-running the first new batch must build its state on the same batch again
        self.downtimes: dict[int, int] = {}
        #: the last batch of the old duration when an upgrade changed the batch duration (None: never):
        #: the batches up to it are on the old grid, complete; checkpointed as ``batch_grid_from_ms``
        self.batch_grid_from_ms: int | None = None
        #: above every input id this checkpoint directory ever gave (checkpointed as ``next_ids``):
        #: an input an upgrade adds never takes the id, files and blocks of one an earlier one dropped
        self.next_input_id = 0

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("downtimes", {})  # a graph pickled before downtimes were kept
        self.__dict__.setdefault("next_input_id", len(self.inputs))

    def register(self, stream) -> None:
        self.streams.append(stream)

    def add_input(self, stream) -> int:
        """Register an input stream; return its id, as Spark's ``getNewInputStreamId``: its index,
        or after an upgrade renumbered the inputs (:meth:`renumber_inputs`) one above every id."""
        new_id = max([self.next_input_id - 1, *(s.input_id for s in self.inputs)]) + 1
        self.inputs.append(stream)
        self.next_input_id = new_id + 1
        return new_id

    def renumber_inputs(self, ids: dict[int, int]) -> None:
        """Give the inputs new ids (``ids``: graph.inputs position -> id, for every input; an
        upgrade keeps each carried input's checkpointed id, which names its files and blocks),
        before the stream starts; ``inputs`` stays in id order."""
        if sorted(ids) != list(range(len(self.inputs))) or len(set(ids.values())) != len(ids):
            raise ValueError(f"input ids must be given once to each of the {len(self.inputs)} inputs: {ids}")
        for position, stream in enumerate(self.inputs):
            stream.renumber(ids[position])
        self.inputs.sort(key=lambda s: s.input_id)
        self.next_input_id = max([self.next_input_id, *(i + 1 for i in ids.values())])

    def remember(self, duration_ms: int) -> None:
        """Every stream keeps its RDDs for at least ``duration_ms`` (Spark's ``DStreamGraph.remember``)."""
        self.remember_ms = duration_ms

    def max_remember_ms(self) -> int:
        """How long the longest-remembering stream keeps its RDDs (its batches' metadata, input
        reports and blocks are kept that long behind each batch)."""
        return max((s.remember_ms or 0) for s in self.streams) if self.streams else 0

    def generated_streams(self) -> list:
        """The streams some output reads, at any depth, in ``streams``' order: the only ones a batch
        generates. A stream no output reaches (``mapWithState``'s mapped records where only its
        ``stateSnapshots()`` are output) is never computed and keeps no RDD."""
        reached, todo = set(), list(self.outputs)
        while todo:
            stream = todo.pop()
            if id(stream) not in reached:
                reached.add(id(stream))
                todo.extend(stream.dependencies)
        return [s for s in self.streams if id(s) in reached]

    def input_ids_by_creation(self) -> list[int]:
        """The inputs' ids in the order the program made them (checkpointed as ``input_ids``)."""
        inputs = {id(s) for s in self.inputs}
        return [s.input_id for s in self.streams if id(s) in inputs]

    def keep_input_ids(self, ids: list[int]) -> None:
        """Give the inputs, in the order the program made them, ``ids`` (a checkpoint's
        ``input_ids``, of the same graph): a restart of a program an upgrade renumbered."""
        position = {id(s): i for i, s in enumerate(self.inputs)}
        made = [s for s in self.streams if id(s) in position]
        if len(ids) != len(made):
            raise ValueError(f"the checkpoint names {len(ids)} input ids, the graph has {len(made)} inputs")
        if [s.input_id for s in made] != ids:
            self.renumber_inputs({position[id(s)]: i for s, i in zip(made, ids)})

    def add_output(self, stream) -> int:
        """Register an output operation; return its id (its index)."""
        self.outputs.append(stream)
        return len(self.outputs) - 1

    def validate(self) -> None:
        if not self.outputs:
            raise ValueError("No output operations registered, so nothing to execute")

    def start(self, zero_time_ms: int) -> None:
        self.zero_time_ms = zero_time_ms
        for o in self.outputs:
            o.initialize(zero_time_ms)
        for o in self.outputs:
            o.remember_at_least(self.remember_ms)

    def coalesce_downtime(self, last_ms: int, first_new_ms: int) -> None:
        """The batch times after ``last_ms`` run as the batch of ``first_new_ms``, in every stream."""
        self.downtimes[first_new_ms] = last_ms
        for s in self.streams:
            s.coalesce_downtime(last_ms, first_new_ms)

    def coalesced(self, time_ms: int) -> bool:
        """Whether batch time ``time_ms`` is inside a coalesced downtime (it is never generated)."""
        return any(last < time_ms < first for first, last in self.downtimes.items())

    def downtimes_since(self, floor_ms: int) -> list[list[int]]:
        """``[[first new batch time, last batch time before it], ...]`` of the coalesced downtimes
        a restart from ``floor_ms`` on may still cross (a checkpoint's ``downtimes``)."""
        return [[first, last] for first, last in sorted(self.downtimes.items()) if first > floor_ms]

    def generate_jobs(self, time_ms: int) -> list:
        jobs = []
        for o in self.outputs:
            job = o.generate_job(time_ms)
            if job is not None:
                jobs.append(job)
        return jobs

    def clear_metadata(self, time_ms: int) -> None:
        for o in self.outputs:
            o.clear_metadata(time_ms)

    def fingerprint(self) -> str:
        """A hash of the graph's structure (stream kinds, durations, wiring), not of user code:
        a checkpoint may only be restored into a graph with the same fingerprint."""
        return hashlib.sha256(self.describe().encode()).hexdigest()[:16]

    def describe(self) -> str:
        index = {id(s): i for i, s in enumerate(self.streams)}
        parts = []
        for i, s in enumerate(self.streams):
            deps = ",".join(str(index[id(d)]) for d in s.dependencies)
            extra = "".join(f" {k}={getattr(s, k)}" for k in ("window_ms", "directory", "record_length",
                                                          "source_desc")
                            if getattr(s, k, None) is not None)
            parts.append(f"{i}:{type(s).__name__}(slide={s.slide_ms}{extra})<-[{deps}]")
        return "; ".join(parts)
