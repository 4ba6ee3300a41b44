"""What a stream is across versions of a program: the identity an upgrade matches a checkpoint's
inputs and states by, whatever else the new version changed around them.

A stream's position in the graph says nothing once a step is added before it, so a stream that holds
something a checkpoint keeps (an input's position, a stateful operator's state) is known by:

* the name the program gave it, ``stream.uid("clicks")`` (Flink's word): ``uid:clicks``;
* else, for an input, its source: ``files:<directory>`` (``files:<directory>#records=<n>`` for
  fixed-length binary records), ``direct:<the source's own description>`` (``direct:Kafka(...)``,
  ``direct:FileLogSource(...)``), ``receiver:<Receiver.identity()>`` (the receiver's class, or what
  the receiver says it reads from: ``SocketReceiver(host:port)``), ``queue``;
* else, for a stateful operator, its kind and the identities of the nearest inputs or stateful
  operators it reads from, through any stateless steps: ``updateStateByKey(files:/data/in)``,
  ``mapWithState(uid:clicks)``; a union or a join reads from several, joined by ``+`` in sorted order.

Two streams of one identity (two receivers of a class that says nothing of what it reads, two
``updateStateByKey`` on one input) are told apart by the order the program made them: the second
is ``...#2``, and so on. Such an identity is *ambiguous* (reordering the program swaps them) and is
listed as such, so that an upgrade can ask for a uid instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

UID_MAX_CHARS = 200


@dataclass(frozen=True)
class Identities:
    """The identity of each identified stream of a graph, by its index in ``graph.streams``."""

    by_index: dict[int, str] = field(default_factory=dict)
    #: the identities that only the program's order tells apart (``...#2``, and their first)
    ambiguous: tuple[str, ...] = ()

    def of(self, index: int) -> str | None:
        return self.by_index.get(index)


def check_uid(name: object) -> str:
    """``name`` as a stream's uid, or a ValueError saying what a uid must be."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a stream's uid is a non-empty string, got {name!r}")
    if name != name.strip() or len(name) > UID_MAX_CHARS or any(c in name for c in "\r\n\t#"):
        raise ValueError(f"a stream's uid has no surrounding spaces, tabs, newlines or '#' and at most "
                         f"{UID_MAX_CHARS} characters, got {name!r}")
    return name


def is_identified(stream) -> bool:
    """Whether a checkpoint keeps something of this stream: an input, or a stateful operator."""
    return not stream.dependencies or getattr(stream, "state_operator", None) is not None


def identities(graph) -> Identities:
    """The identities of ``graph``'s inputs and stateful operators (the module's rules)."""
    index = {id(s): i for i, s in enumerate(graph.streams)}
    named: dict[int, str] = {}  # final identities: the streams made later read them
    base: dict[int, str] = {}
    counts: dict[str, int] = {}
    for i, stream in enumerate(graph.streams):  # parents first: a stream's sources are named before it
        if is_identified(stream):
            base[i] = key = _own_identity(stream, index, named)
            counts[key] = counts.get(key, 0) + 1
            named[i] = key if counts[key] == 1 else f"{key}#{counts[key]}"
    return Identities(named, tuple(named[i] for i in named if counts[base[i]] > 1))


def _own_identity(stream, index: dict[int, int], named: dict[int, str]) -> str:
    uid = getattr(stream, "stream_uid", None)
    if uid is not None:
        return f"uid:{uid}"
    if stream.dependencies:
        sources = sorted(_nearest_identified(stream, index, named))
        return f"{stream.state_operator}({'+'.join(sources)})"
    return _input_identity(stream)


def _nearest_identified(stream, index: dict[int, int], named: dict[int, str]) -> set[str]:
    found: set[str] = set()
    todo = list(stream.dependencies)
    seen: set[int] = set()
    while todo:
        parent = todo.pop()
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        i = index.get(id(parent))
        if i is not None and i in named:
            found.add(named[i])
        else:
            todo.extend(parent.dependencies)
    return found


def _input_identity(stream) -> str:
    directory = getattr(stream, "directory", None)
    if directory is not None:
        records = getattr(stream, "record_length", None)
        return f"files:{directory}" + (f"#records={records}" if records is not None else "")
    source = getattr(stream, "source_desc", None)
    if source is not None:
        return f"direct:{source}"
    receiver = getattr(stream, "receiver", None)
    if receiver is not None:
        return f"receiver:{receiver.identity()}"
    return "queue"
