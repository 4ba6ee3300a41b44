"""What an upgrade would carry from a checkpoint to a changed program: per input and stateful
operator, matched by uid, then by identity (:mod:`sparkwal.engine.identity`), it is carried, new,
dropped or refused, with the reason a person can act on.

The rules:

* a uid matches the same uid; the streams left match by identity (so a stream named only in the new
  version still matches the checkpoint's unnamed one);
* an identity that only the program's order tells apart (two unnamed twins) is never matched by
  guessing: the plan refuses it and asks for a uid;
* a match of another kind (an ``updateStateByKey`` become a ``mapWithState``, a file input become
  a Kafka one) is refused: the state's rows or the input's positions mean something else;
* a window's state holds the reductions of its window: another window length or slide is refused;
* a checkpoint's input or state with no match in the program is a loss, refused unless it is
  named (uid or identity) in ``allow_drop``; a queue input holds nothing across a restart and is
  dropped freely;
* a program's stream with no match is new: an input starts as the program says, a state empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .identity import StreamIdentity

_HOLDS_NOTHING = ("queue",)


@dataclass(frozen=True)
class PlannedStream:
    """An identified stream of either side: the checkpoint's (from its record) or the program's."""

    index: int
    identity: str
    uid: str | None
    kind: str
    ambiguous: bool
    input_id: int | None = None
    window_ms: int | None = None
    slide_ms: int | None = None

    @property
    def name(self) -> str:
        return f"uid:{self.uid}" if self.uid is not None else self.identity

    @property
    def is_input(self) -> bool:
        return self.kind in ("files", "direct", "receiver", "queue")

    @classmethod
    def of(cls, ident: StreamIdentity) -> PlannedStream:
        return cls(ident.index, ident.identity, ident.uid, ident.kind, ident.ambiguous, ident.input_id,
                   ident.window_ms, ident.slide_ms)

    @classmethod
    def from_record(cls, index: Any, record: Any) -> PlannedStream:
        """A checkpoint's ``identities`` entry; a malformed one is a ValueError naming it."""
        if not isinstance(record, dict) or not isinstance(record.get("identity"), str) \
                or not isinstance(record.get("kind"), str) or not str(index).isdigit():
            raise ValueError(f"the checkpoint's identity entry {index!r} is malformed: {record!r}")
        return cls(int(index), record["identity"], record.get("uid"), record["kind"], bool(record.get("ambiguous")),
                   record.get("input_id"), record.get("window_ms"), record.get("slide_ms"))


@dataclass
class UpgradePlan:
    carried: list[tuple[PlannedStream, PlannedStream]] = field(default_factory=list)  # (checkpoint's, program's)
    new: list[PlannedStream] = field(default_factory=list)
    dropped: list[PlannedStream] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # one line per loss or mismatch

    @property
    def loses_nothing(self) -> bool:
        return not self.refusals

    def lines(self) -> list[str]:
        """The plan for a person, one line per stream, refusals last."""
        out = [f"carried: {new.name} ({_what(new)}; stream {old.index} -> {new.index})" for old, new in self.carried]
        out += [f"new: {s.name} ({'starts as the program says' if s.is_input else 'starts empty'})" for s in self.new]
        out += [f"dropped: {s.name} ({_what(s)})" for s in self.dropped]
        return out + [f"refused: {r}" for r in self.refusals]

    def to_json(self) -> dict:
        def one(s: PlannedStream) -> dict:
            return {"name": s.name, "identity": s.identity, "uid": s.uid, "kind": s.kind, "stream": s.index}
        return {"carried": [{"from": one(old), "to": one(new)} for old, new in self.carried],
                "new": [one(s) for s in self.new], "dropped": [one(s) for s in self.dropped],
                "refusals": list(self.refusals), "loses_nothing": self.loses_nothing}


def plan_upgrade(recorded: dict, program: dict[int, StreamIdentity], allow_drop: frozenset[str] = frozenset()
                 ) -> UpgradePlan:
    """The plan from a checkpoint's ``identities`` (``recorded``) to a program's (``program``, as
    :func:`sparkwal.engine.identity.identities` gives them)."""
    old = sorted((PlannedStream.from_record(i, r) for i, r in recorded.items()), key=lambda s: s.index)
    new = sorted((PlannedStream.of(i) for i in program.values()), key=lambda s: s.index)
    plan = UpgradePlan()
    pairs: list[tuple[PlannedStream, PlannedStream]] = []
    by_uid = {s.uid: s for s in new if s.uid is not None}
    for s in old:
        if s.uid is not None and s.uid in by_uid:
            pairs.append((s, by_uid[s.uid]))
    matched_old = {id(a) for a, _ in pairs}
    matched_new = {id(b) for _, b in pairs}
    by_identity = {s.identity: s for s in new if id(s) not in matched_new}
    for s in old:
        if id(s) in matched_old or s.identity not in by_identity:
            continue
        other = by_identity.pop(s.identity)
        if s.ambiguous or other.ambiguous:
            plan.refusals.append(f"{s.identity} is told apart from a stream like it only by the program's order: "
                                 f"name it with .uid(...) (the checkpoint's is stream {s.index})")
        else:
            pairs.append((s, other))
        matched_old.add(id(s))
        matched_new.add(id(other))
    for a, b in pairs:
        problem = _mismatch(a, b)
        if problem:
            plan.refusals.append(problem)
        else:
            plan.carried.append((a, b))
    for s in old:
        if id(s) in matched_old:
            continue
        if s.kind in _HOLDS_NOTHING or s.identity in allow_drop or (s.uid is not None and s.uid in allow_drop):
            plan.dropped.append(s)
        else:
            plan.refusals.append(f"the checkpoint's {_what(s)} {s.name} has no stream in this program: it would be "
                                 "lost (name it in spark.sparkwal.upgrade.allowDrop to drop it)")
    plan.new = [s for s in new if id(s) not in matched_new]
    return plan


def _what(s: PlannedStream) -> str:
    return f"{s.kind} input" if s.is_input else f"state of {s.kind}"


def _mismatch(old: PlannedStream, new: PlannedStream) -> str | None:
    if old.kind != new.kind:
        return f"{new.name} was a {_what(old)}, is now a {_what(new)}: its checkpointed data means something else"
    if (old.window_ms, old.slide_ms) != (new.window_ms, new.slide_ms) and old.window_ms is not None:
        return (f"{new.name} keeps the reductions of a {old.window_ms} ms window sliding by {old.slide_ms} ms; "
                f"a {new.window_ms} ms window sliding by {new.slide_ms} ms would count batches it never added")
    return None
