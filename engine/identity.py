"""What a stream is across versions of a program: the identity an upgrade matches a checkpoint's
inputs and states by, whatever else the new version changed around them.

A stream's position in the graph says nothing once a step is added before it. So each stream that
holds something a checkpoint keeps (an input's position, a stateful operator's state), and that an
output reaches, carries two names:

* its **uid**, if the program gave it one: ``stream.uid("clicks")`` (Flink's word). A uid given to a
  stateless step names the one input or stateful operator it reads from (``countByValueAndWindow``
  and ``stateSnapshots()`` are stateless steps on a state);
* its **identity**, from its source and kind alone, never from a uid (so that naming a stream in a
  new version still matches the checkpoint of the version that did not):

  - an input by its source: ``files:<directory>`` (absolute; ``...#records=<n>`` for fixed-length
    binary records), ``direct:<the source's identity()>`` (``direct:FileLogSource(/data/log)``,
    ``direct:Kafka(clicks,views)``: topics sorted), ``receiver:<Receiver.sourceIdentity()>`` (the
    receiver's class, or what it says it reads: ``SocketReceiver(host:port)``), ``queue``;
  - a stateful operator by its kind and the identities of the nearest inputs or stateful operators
    it reads from, through any stateless steps, sorted and joined by ``+``:
    ``updateStateByKey(files:/data/in)``, ``reduceByKeyAndWindow(direct:Kafka(clicks))``.

Two streams of one identity (two receivers of a class that says nothing of what it reads, two
windows of different lengths on one input) are told apart by the order the program made them: the
second is ``...#2``. Such a stream, and every state made from an unnamed one, is *ambiguous*:
reordering the program would swap them, so an upgrade asks for a uid instead of guessing. (Queue inputs hold
nothing across a restart and are never ambiguous themselves.) Window length and slide are recorded
beside the identity, not in it, so that an upgrade can say which change it accepts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .errors import StreamingContextStateError

log = logging.getLogger(__name__)

UID_MAX_CHARS = 200
_ESCAPED = {c: f"%{ord(c):02X}" for c in "%#+()"}
INPUT_KINDS = ("files", "direct", "receiver", "queue")
_NOT_IN_UIDS = "#+()\r\n\t"


@dataclass(frozen=True)
class StreamIdentity:
    """One input's or stateful operator's names, and what an upgrade checks beside them."""

    index: int  # in graph.streams
    kind: str  # files, direct, receiver, queue, or the state operator (updateStateByKey, ...)
    identity: str  # from sources and kinds only (the module's rules); unique in its graph
    uid: str | None
    ambiguous: bool
    input_id: int | None = None
    window_ms: int | None = None
    slide_ms: int | None = None
    #: a state's sources (the indexes of the inputs and states it reads through stateless steps),
    #: and the windows and slides on the way (``window 4000/2000``, ``slide 1000``), which change
    #: what the state holds
    sources: tuple[int, ...] = ()
    upstream: tuple[str, ...] = ()
    #: what an input's positions mean: ``files``, ``files#records=8``, ``direct:KafkaSource``,
    #: ``receiver:SocketReceiver``, ``queue``; a state's kind
    source_kind: str = ""
    #: a state's version (:mod:`sparkwal.engine.state.versions`), and whether it migrates older ones
    state_version: int = 1
    migrates: bool = False

    @property
    def name(self) -> str:
        """How to name it to a person: its uid, else its identity."""
        return f"uid:{self.uid}" if self.uid is not None else self.identity

    @property
    def is_input(self) -> bool:
        return self.kind in INPUT_KINDS

    def record(self) -> dict:
        """The checkpoint's entry (msgpack: strings, integers, booleans, None)."""
        return {"identity": self.identity, "uid": self.uid, "kind": self.kind, "ambiguous": self.ambiguous,
                "input_id": self.input_id, "window_ms": self.window_ms, "slide_ms": self.slide_ms,
                "sources": list(self.sources), "upstream": list(self.upstream), "source_kind": self.source_kind,
                "state_version": self.state_version, "migrates": self.migrates}


def check_uid(name: object) -> str:
    """``name`` as a stream's uid, or a ValueError saying what a uid must be."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a stream's uid is a non-empty string, got {name!r}")
    if name != name.strip() or len(name) > UID_MAX_CHARS or any(c in name for c in _NOT_IN_UIDS):
        raise ValueError(f"a stream's uid has no surrounding spaces, no tab, newline, '#', '+', '(' or ')' "
                         f"and at most {UID_MAX_CHARS} characters, got {name!r}")
    return name


def name_stream(stream, graph, name: str) -> None:
    """``stream.uid(name)``: the uid goes to ``stream`` or to the one input or stateful operator it
    reads from through stateless steps; refused after the start, for several or none, or taken."""
    name = check_uid(name)
    if graph.zero_time_ms is not None:
        raise StreamingContextStateError(f"uid {name!r}: naming a stream after its context started is "
                                         "not supported (name it where the program makes it)")
    named = nearest_identified(stream)
    if len(named) != 1:
        raise ValueError(
            f"uid {name!r} names an input or a stateful operator, and the stream made by {stream.creation_site} "
            f"reads from {len(named)} of them: name "
            + ("each where the program makes it" if named else "its input where the program makes it"))
    target = named[0]
    for other in graph.streams:
        if other is not target and other.stream_uid == name:
            raise ValueError(f"uid {name!r} already names the stream made by {other.creation_site}")
    target.stream_uid = name


def holds_state_or_position(stream) -> bool:
    """Whether a checkpoint keeps something of this stream: an input, or a stateful operator."""
    return not stream.dependencies or getattr(stream, "state_operator", None) is not None


def nearest_identified(stream) -> list:
    """The inputs and stateful operators ``stream`` reads from through stateless steps (itself if
    it is one), in the order first reached."""
    found: list = []
    todo, seen = [stream], set()
    while todo:
        s = todo.pop(0)
        if id(s) in seen:
            continue
        seen.add(id(s))
        if holds_state_or_position(s):
            found.append(s)
        else:
            todo.extend(s.dependencies)
    return found


def identities(graph) -> dict[int, StreamIdentity]:
    """The identities of ``graph``'s inputs and stateful operators that an output reaches, by
    their index in ``graph.streams``."""
    index = {id(s): i for i, s in enumerate(graph.streams)}
    live = _reached_by_outputs(graph)
    named: dict[int, tuple[str, str, list[int], str]] = {}  # index -> (kind, identity, sources, source kind)
    bases: dict[int, str] = {}
    counts: dict[str, int] = {}
    taken: set[str] = set()
    for i, stream in enumerate(graph.streams):  # parents first: a stream's sources are named before it
        if id(stream) not in live or not holds_state_or_position(stream):
            continue
        sources = sorted({index[id(s)] for dep in stream.dependencies for s in nearest_identified(dep)})
        kind, base, source_kind = _own_identity(stream, [named[j][1] for j in sources])
        bases[i] = base
        counts[base] = counts.get(base, 0) + 1
        identity, n = base, counts[base]
        while identity in taken:  # ...#2, and never a name another stream has (a directory "in#2")
            identity, n = f"{base}#{n}", n + 1
        taken.add(identity)
        named[i] = (kind, identity, sources, source_kind)
    order_dependent: dict[int, bool] = {}
    found: dict[int, StreamIdentity] = {}
    for i, (kind, identity, sources, source_kind) in named.items():  # parents first: sources decided
        stream = graph.streams[i]
        # a source with a uid is matched by it, and a state only follows its own sources (upgrade_plan)
        order_dependent[i] = counts[bases[i]] > 1 or any(
            order_dependent[j] and graph.streams[j].stream_uid is None for j in sources)
        found[i] = StreamIdentity(
            i, kind, identity, stream.stream_uid, ambiguous=order_dependent[i] and kind != "queue",
            input_id=None if stream.dependencies else stream.input_id,
            window_ms=getattr(stream, "window_ms", None) if stream.dependencies else None,
            slide_ms=stream.slide_ms if stream.dependencies else None,
            sources=tuple(sources), upstream=_upstream(stream), source_kind=source_kind,
            state_version=stream.state_version, migrates=stream.state_migrate is not None)
    return found


def _upstream(stream) -> tuple[str, ...]:
    """The slides a state's parents have and the windows between it and its sources."""
    if not stream.dependencies:
        return ()
    marks = {f"slide {d.slide_ms}" for d in stream.dependencies}
    todo, seen = list(stream.dependencies), set()
    while todo:
        s = todo.pop()
        if id(s) in seen or holds_state_or_position(s):
            continue
        seen.add(id(s))
        if getattr(s, "window_ms", None) is not None:
            marks.add(f"window {s.window_ms}/{s.slide_ms}")
        todo.extend(s.dependencies)
    return tuple(sorted(marks))


def _reached_by_outputs(graph) -> set[int]:
    live: set[int] = set()
    todo = list(graph.outputs)
    while todo:
        s = todo.pop()
        if id(s) not in live:
            live.add(id(s))
            todo.extend(s.dependencies)
    return live


def _own_identity(stream, sources: list[str]) -> tuple[str, str, str]:
    """(kind, identity, source kind) of one stream."""
    if stream.dependencies:
        kind = stream.state_operator
        return kind, f"{kind}({'+'.join(sorted(set(sources)))})", kind
    directory = getattr(stream, "directory", None)
    if directory is not None:
        records = getattr(stream, "record_length", None)
        suffix = f"#records={records}" if records is not None else ""
        return "files", f"files:{normal_location(directory)}{suffix}", f"files{suffix}"
    source = getattr(stream, "source", None)
    if source is not None and getattr(stream, "source_desc", None) is not None:
        return "direct", f"direct:{_source_identity(source, stream.source_desc)}", f"direct:{type(source).__name__}"
    receiver = getattr(stream, "receiver", None)
    if receiver is not None:
        return "receiver", f"receiver:{receiver_identity(receiver)}", f"receiver:{type(receiver).__qualname__}"
    return "queue", "queue", "queue"


def _source_identity(source, described: str) -> str:
    try:
        said = getattr(source, "identity", None)
        if not callable(said):
            return described
        value = said()
    except Exception as e:  # noqa: BLE001  a user's source: its failure is logged, the stream goes on
        log.warning("%s.identity() failed (%s): the source is known by %s", type(source).__name__, e, described)
        return described
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "#\r\n\t"):
        log.warning("%s.identity() returned %r: the source is known by %s", type(source).__name__, value, described)
        return described
    return value


def normal_location(path: str) -> str:
    """One spelling of a directory: ``file:`` URLs and relative paths as absolute paths, no
    trailing slash (``/data/in``, ``./in/`` and ``file:///data/in`` are one directory), and the
    characters identities are built with (``#+()``, and ``%``) percent-encoded, so that no
    directory's name reads as another identity's."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith("file:/"):  # Hadoop's spelling
        path = path[len("file:"):]
    if "://" in path:
        path = path.rstrip("/") or path
    else:
        path = os.path.abspath(os.path.expanduser(path))
    return "".join(_ESCAPED.get(c, c) for c in path)


def receiver_identity(receiver) -> str:
    """What a receiver says it reads (``Receiver.sourceIdentity()``), or its class where it says
    nothing usable (logged)."""
    fallback = type(receiver).__qualname__
    said = getattr(type(receiver), "sourceIdentity", None)
    if not callable(said):
        return fallback
    try:
        value = said(receiver)
    except Exception as e:  # noqa: BLE001  a user's hook: its failure names the receiver, the stream goes on
        log.warning("%s.sourceIdentity() failed (%s): the receiver is known by its class", fallback, e)
        return fallback
    if (not isinstance(value, str) or not value.strip() or len(value) > UID_MAX_CHARS
            or any(c in value for c in "#\r\n\t")):
        log.warning("%s.sourceIdentity() returned %r, not a one-line name of at most %d characters "
                    "without '#': the receiver is known by its class", fallback, value, UID_MAX_CHARS)
        return fallback
    return value
