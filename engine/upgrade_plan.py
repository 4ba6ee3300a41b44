"""What an upgrade would carry from a checkpoint to a changed program: per input and stateful
operator (:mod:`sparkwal.engine.identity`), carried, new, dropped or refused, with the reason a
person can act on.

The rules, stream by stream in the checkpoint's order (a state's sources are settled before it):

* a uid matches the same uid; two different uids never match (a renamed stream starts anew);
* otherwise an input matches the program's input of the same identity (so a stream named only in the
  new version still matches the checkpoint's unnamed one), and a state the program's state of the
  same kind made of the streams its own sources were carried to; a state whose sources are not all
  carried is not;
* twins (inputs only the program's order tells apart, two states of one kind on the same sources)
  are never matched by guessing: the plan refuses them and asks for a uid;
* a match of another kind (an ``updateStateByKey`` become a ``mapWithState``, a file input become a
  direct one, a Kafka source a file log, text files fixed-length records) is refused: the state's
  rows or the input's positions mean something else;
* a state is read through the same windows and slides as before (a state of raw batches is not one
  of windowed ones), and a window's state holds the reductions of its window: another window length
  or slide is refused;
* a checkpoint's input or state with no match in the program is a loss, refused unless it is named
  (uid or identity) in ``allow_drop``; a queue input holds nothing across a restart and goes freely;
* a program's stream with no match is new: an input starts as the program says, a state empty (a
  window's from its parent's batches).

Applied by :mod:`sparkwal.engine.driver.upgrade`. Outputs are not matched: a batch pending or logged
uncommitted re-runs the new graph's outputs (an output the new version removed does not get it). An
input no output reaches has no identity and is not in the plan: it gets a new id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .identity import INPUT_KINDS as _INPUT_KINDS, StreamIdentity, check_uid

_HOLDS_NOTHING = ("queue",)


#: an identified stream of either side: the checkpoint's (from its record) or the program's
PlannedStream = StreamIdentity


def from_record(index: Any, record: Any) -> StreamIdentity:
    """A checkpoint's ``identities`` entry, checked field by field; a malformed one is a ValueError
    naming it."""
    def bad(why: str) -> ValueError:
        return ValueError(f"the checkpoint's identity entry {index!r} is malformed ({why}): {record!r}"[:500])

    if not isinstance(index, str) or not index.isascii() or not index.isdigit():
        raise bad("its key is not a stream index")
    if not isinstance(record, dict):
        raise bad("written before identities had fields" if isinstance(record, str) else "not a map")
    identity, kind, uid = record.get("identity"), record.get("kind"), record.get("uid")
    if not isinstance(identity, str) or not isinstance(kind, str) or not isinstance(record.get("ambiguous"), bool):
        raise bad("identity, kind or ambiguous missing")
    if uid is not None:
        try:
            check_uid(uid)
        except ValueError:
            raise bad("its uid") from None
    ints = [record.get(k) for k in ("input_id", "window_ms", "slide_ms")]
    sources, upstream, source_kind = record.get("sources"), record.get("upstream"), record.get("source_kind")
    if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in ints) \
            or not isinstance(sources, list) or not all(isinstance(v, int) for v in sources) \
            or not isinstance(upstream, list) or not all(isinstance(v, str) for v in upstream) \
            or not isinstance(source_kind, str):
        raise bad("input_id, window_ms, slide_ms, sources, upstream or source_kind")
    if kind not in _INPUT_KINDS and not identity.startswith(f"{kind}(") or \
            kind in _INPUT_KINDS and not identity.startswith(kind):
        raise bad("its kind is not its identity's")
    version, migrates = record.get("state_version", 1), record.get("migrates", False)  # (absent before versions)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1 or not isinstance(migrates, bool):
        raise bad("state_version or migrates")
    input_id, window_ms, slide_ms = ints
    return StreamIdentity(int(index), kind, identity, uid, record["ambiguous"], input_id, window_ms, slide_ms,
                          tuple(sources), tuple(upstream), source_kind, version, migrates)


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
        out = [f"carried: {new.name} ({_what(new)}; stream {old.index} -> {new.index}"
               + (f"; migrated from state version {old.state_version} to {new.state_version}"
                  if old.state_version != new.state_version else "")
               + (f"; was {old.name})" if old.name != new.name else ")") for old, new in self.carried]
        out += [f"new: {s.name} ({_start(s)})" for s in self.new]
        out += [f"dropped: {s.name} ({_what(s)})" for s in self.dropped]
        return out + [f"refused: {r}" for r in self.refusals]

    def to_json(self) -> dict:
        def one(s: PlannedStream) -> dict:
            return {"name": s.name, "identity": s.identity, "uid": s.uid, "kind": s.kind, "stream": s.index,
                    "state_version": s.state_version}
        return {"carried": [{"from": one(old), "to": one(new)} for old, new in self.carried],
                "new": [one(s) for s in self.new], "dropped": [one(s) for s in self.dropped],
                "refusals": list(self.refusals), "loses_nothing": self.loses_nothing}


def plan_upgrade(recorded: dict, program: dict[int, StreamIdentity], allow_drop: frozenset[str] = frozenset(),
                 drop_hint: str = "") -> UpgradePlan:
    """The plan from a checkpoint's ``identities`` (``recorded``) to a program's (``program``, as
    :func:`sparkwal.engine.identity.identities` gives them). ``drop_hint``: how a program drops a
    stream, said after each loss."""
    old = sorted((from_record(i, r) for i, r in recorded.items()), key=lambda s: s.index)
    new = sorted(program.values(), key=lambda s: s.index)
    for side, streams in (("checkpoint", old), ("program", new)):
        uids = [s.uid for s in streams if s.uid is not None]
        if len(set(uids)) != len(uids) or len({s.identity for s in streams}) != len(streams):
            raise ValueError(f"the {side}'s identities name one stream twice: {[s.name for s in streams]}"[:500])
    plan = UpgradePlan()
    unmatched = {s.index: s for s in new}
    by_uid = {s.uid: s for s in new if s.uid is not None}
    named = {s.index: by_uid[s.uid] for s in old if s.uid is not None and s.uid in by_uid}
    for b in named.values():
        del unmatched[b.index]
    carried_to: dict[int, int] = {}  # the checkpoint's stream index -> the program's, of each carried stream
    twins: dict[int, PlannedStream] = {}  # the program's streams refused as twins (neither new nor carried)

    def settle(a: PlannedStream, b: PlannedStream) -> None:
        unmatched.pop(b.index, None)
        problem = _mismatch(a, b, carried_to)
        if problem:
            plan.refusals.append(problem)
        else:
            plan.carried.append((a, b))
            carried_to[a.index] = b.index

    for s in old:  # in the checkpoint's order: a state's sources are settled before it
        if s.index in named:
            settle(s, named[s.index])
            continue
        if not s.is_input and not all(i in carried_to for i in s.sources):
            plan.refusals.append(f"the checkpoint's {_what(s)} {s.name} cannot be carried: not all the streams it "
                                 "was made of are (above)")
            continue
        found = [n for n in [*unmatched.values(), *twins.values()]
                 if _same_stream(s, n, carried_to) and not (s.uid and n.uid)]
        if len(found) == 1 and found[0].index in unmatched and not (s.is_input and (s.ambiguous or found[0].ambiguous)):
            settle(s, found[0])
        elif found:
            for n in found:
                twins[n.index] = unmatched.pop(n.index, n)
            plan.refusals.append(f"{s.name} is told apart from a stream like it only by the program's order (the "
                                 f"checkpoint's is stream {s.index}): give both versions a uid for it")
        elif s.kind in _HOLDS_NOTHING or s.identity in allow_drop or (s.uid is not None and s.uid in allow_drop):
            plan.dropped.append(s)
        else:
            plan.refusals.append(f"the checkpoint's {_what(s)} {s.name} has no stream in this program: it would be "
                                 f"lost{drop_hint}")
    plan.new = list(unmatched.values())
    return plan


def _same_stream(old: PlannedStream, new: PlannedStream, carried_to: dict[int, int]) -> bool:
    """An input is its identity (no uid on one side); a state its kind and where its sources went."""
    if old.is_input or new.is_input:
        return old.identity == new.identity
    return old.kind == new.kind and sorted(carried_to[i] for i in old.sources) == sorted(new.sources)


def _start(s: PlannedStream) -> str:
    if s.is_input:
        return "starts as the program says"
    return "starts from its parent's batches" if s.window_ms is not None else "starts empty"


def _what(s: PlannedStream) -> str:
    return f"{s.kind} input" if s.is_input else f"state of {s.kind}"


def _mismatch(old: PlannedStream, new: PlannedStream, carried_to: dict[int, int]) -> str | None:
    if old.kind != new.kind or old.source_kind != new.source_kind:
        return (f"{new.name} was a {_what(old)} ({old.identity}), is now a {_what(new)} ({new.identity}): its "
                "checkpointed data means something else")
    if old.is_input:
        return None
    if sorted(carried_to.get(i, -1) for i in old.sources) != sorted(new.sources):
        return (f"{new.name} reads from other streams than the checkpoint's {old.name} did (their own "
                "verdicts above): its state was made of theirs")
    if old.upstream != new.upstream:
        return (f"{new.name} reads its sources through other windows or slides ({', '.join(new.upstream)}) "
                f"than the checkpoint's ({', '.join(old.upstream)}): its state was made of those")
    if old.state_version > new.state_version:
        return (f"{new.name} holds state of version {old.state_version}, newer than this program's "
                f"({new.state_version}): no function brings values back to an older version")
    if old.state_version < new.state_version and not new.migrates:
        return (f"{new.name} holds state of version {old.state_version}, and this program's is {new.state_version} "
                "with no migrate function (stateVersion(version, migrate=g), g(from_version, value) -> value)")
    if (old.window_ms, old.slide_ms) != (new.window_ms, new.slide_ms):
        return (f"{new.name} keeps the reductions of a {old.window_ms} ms window sliding by {old.slide_ms} ms; "
                f"a {new.window_ms} ms window sliding by {new.slide_ms} ms would count batches it never added")
    return None
