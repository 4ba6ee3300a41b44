"""OffsetSeqLog and CommitLog: Spark Structured Streaming's ``offsets/`` and ``commits/`` files.

Byte-for-byte Spark's text formats (UTF-8, lines joined by ``\\n``, no trailing newline written,
one tolerated on reading)::

    offsets/<N>, version 1          offsets/<N>, version 2 (Spark 4.x "OffsetMap")
      v1                              v2
      <OffsetSeqMetadata JSON or "">  <OffsetSeqMetadata JSON>
      <source 0 offset JSON or "-">   <sourceId>:<offset JSON or "-">
      <source 1 offset JSON or "-">   ...
      ...

    commits/<N>
      v1                                    (v2 when stateUniqueIds are present)
      {"nextBatchWatermarkMs":<long>}       (a missing line reads as {})

    OffsetSeqMetadata JSON: {"batchWatermarkMs":<long>,"batchTimestampMs":<long>,"conf":{<str>:<str>}}

sparkwal's one addition, the leadership epoch of the driver that wrote a file
(:data:`LEADER_EPOCH_FIELD`, ``"sparkwal.leaderEpoch"``): in an offsets file, a conf entry (a
string, ``"2"``); in a commit file, a field of the JSON object after the others
(``{"nextBatchWatermarkMs":0,"sparkwal.leaderEpoch":2}``), which Spark's reader (json4s, reading
a case class) ignores. A file without one (Spark's own, or an earlier release's) has epoch 0
(:func:`offsets_epoch`) or none (``CommitMetadata.leader_epoch`` None). The engine's batch log
(:mod:`sparkwal.engine.sources.batch_log`) tells by them a late write of a driver that lost its
leadership from the current leader's, and replaces it (``replace``: the logs' one write that is
not a create-if-absent).

Offsets stay opaque JSON strings: only the source that wrote one can interpret it. Reading follows
Spark: missing metadata fields default to 0/0/{}, unknown fields and trailing text after the object
are ignored, numeric conf values become strings.

A value read from a log remembers its file's bytes (``source_bytes``), and serialising it again
returns them unchanged, so files written by any Spark version round-trip exactly; values built in
code serialise in the form current Spark writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .metadata_log import MetadataLog

_COMPACT: dict[str, Any] = dict(separators=(",", ":"), ensure_ascii=False)
#: where an offsets file's metadata conf, and a commit file's JSON, hold the writer's leadership epoch
LEADER_EPOCH_FIELD = "sparkwal.leaderEpoch"
_V = TypeVar("_V")
_decoder = json.JSONDecoder()


def _read_json_object(text: str) -> dict:
    """The first JSON object in ``text``; trailing text is ignored, as json4s does."""
    value, _ = _decoder.raw_decode(text.strip())
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text[:80]!r}")
    return value


class _Remembers:
    """Mixin: ``source_bytes`` is set when a value is read from a file (excluded from equality)."""

    def with_source_bytes(self, data: bytes):
        object.__setattr__(self, "source_bytes", data)
        return self


@dataclass(frozen=True)
class OffsetSeqMetadata:
    batch_watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    conf: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"batchWatermarkMs": self.batch_watermark_ms,
                           "batchTimestampMs": self.batch_timestamp_ms,
                           "conf": self.conf}, **_COMPACT)

    @classmethod
    def from_json(cls, text: str) -> OffsetSeqMetadata:
        obj = _read_json_object(text)
        conf = obj.get("conf") or {}
        if not isinstance(conf, dict):
            raise ValueError(f"conf must be a JSON object, got {conf!r}")
        return cls(int(obj.get("batchWatermarkMs", 0)), int(obj.get("batchTimestampMs", 0)),
                   {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in conf.items()})


@dataclass(frozen=True)
class OffsetSeq(_Remembers):
    """Version-1 offsets: one opaque offset JSON per source, in source order (None: no offset)."""

    offsets: list[str | None]
    metadata: OffsetSeqMetadata | None = None
    source_bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class OffsetMap(_Remembers):
    """Version-2 offsets (Spark 4.x): source id -> opaque offset JSON (None: no offset)."""

    offsets: dict[str, str | None]
    metadata: OffsetSeqMetadata
    source_bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)


def offsets_epoch(value: OffsetSeq | OffsetMap) -> int:
    """The leadership epoch an offsets file records; 0 without one (or an unreadable one)."""
    conf = value.metadata.conf if value.metadata is not None else {}
    try:
        return int(conf.get(LEADER_EPOCH_FIELD, 0))
    except ValueError:
        return 0


class _ReplaceableLog(MetadataLog[_V]):
    def replace(self, batch_id: int, value: _V) -> None:
        """Write ``value`` as batch ``batch_id`` whether or not it exists (one atomic replace):
        only for a leader replacing a file an older leader epoch's late write left there."""
        self._storage.put(self.file_path(batch_id), self.serialize(value))


class OffsetSeqLog(_ReplaceableLog["OffsetSeq | OffsetMap"]):
    """``<checkpoint>/offsets``: the input of each batch, written before the batch runs."""

    max_version = 2

    def serialize(self, value: OffsetSeq | OffsetMap) -> bytes:
        if value.source_bytes is not None:
            return value.source_bytes
        if isinstance(value, OffsetMap):
            lines = ["v2", value.metadata.to_json()]
            lines += [f"{k}:{'-' if v is None else v}" for k, v in value.offsets.items()]
        else:
            lines = ["v1", value.metadata.to_json() if value.metadata is not None else ""]
            lines += ["-" if o is None else o for o in value.offsets]
        return "\n".join(lines).encode()

    def decode(self, data: bytes, path: str) -> OffsetSeq | OffsetMap:
        return super().decode(data, path).with_source_bytes(data)

    def parse(self, version: int, lines: list[str], path: str) -> OffsetSeq | OffsetMap:
        meta_line = lines[0].strip() if lines else ""
        metadata = OffsetSeqMetadata.from_json(meta_line) if meta_line else None
        rest = lines[1:]
        if version == 1:
            return OffsetSeq([None if line == "-" else line for line in rest], metadata)
        if metadata is None:
            raise ValueError("an OffsetMap (v2) file needs its metadata line")
        offsets: dict[str, str | None] = {}
        for line in rest:
            source_id, sep, offset = line.partition(":")
            if not sep:
                raise ValueError(f"Invalid OffsetMap format: {line!r}")
            offsets[source_id] = None if offset == "-" else offset
        return OffsetMap(offsets, metadata)


@dataclass(frozen=True)
class CommitMetadata(_Remembers):
    next_batch_watermark_ms: int = 0
    #: Spark 4.x checkpoint format v2: operator id -> per-partition state store unique ids
    state_unique_ids: dict[int, list[list[str]]] | None = None
    #: the writing driver's leadership epoch (sparkwal's field; None: the file has none)
    leader_epoch: int | None = None
    source_bytes: bytes | None = field(default=None, init=False, repr=False, compare=False)


class CommitLog(_ReplaceableLog[CommitMetadata]):
    """``<checkpoint>/commits``: written after a batch's sink committed it."""

    max_version = 2

    def serialize(self, value: CommitMetadata) -> bytes:
        if value.source_bytes is not None:
            return value.source_bytes
        body: dict = {"nextBatchWatermarkMs": value.next_batch_watermark_ms}
        if value.state_unique_ids is not None:
            body["stateUniqueIds"] = {str(k): v for k, v in value.state_unique_ids.items()}
        if value.leader_epoch is not None:
            body[LEADER_EPOCH_FIELD] = value.leader_epoch
        return f"v{1 if value.state_unique_ids is None else 2}\n{json.dumps(body, **_COMPACT)}".encode()

    def decode(self, data: bytes, path: str) -> CommitMetadata:
        return super().decode(data, path).with_source_bytes(data)

    def parse(self, version: int, lines: list[str], path: str) -> CommitMetadata:
        obj = _read_json_object(lines[0]) if lines and lines[0].strip() else {}
        ids = obj.get("stateUniqueIds")
        epoch = obj.get(LEADER_EPOCH_FIELD)
        return CommitMetadata(int(obj.get("nextBatchWatermarkMs", 0)),
                              None if ids is None else {int(k): v for k, v in ids.items()},
                              None if epoch is None else int(epoch))
