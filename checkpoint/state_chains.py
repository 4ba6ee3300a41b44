"""Which state snapshots a DStream checkpoint references, and reading a stateful stream's state.

A checkpoint's ``state`` entry maps each stateful stream (by its index in the graph) to its name
and its snapshots::

    {"3": {"name": "mapWithState-3",
           "snapshots": {"20000": {"url": "state/3-20000-e1", "base": null, "bytes": 4812345},
                         "30000": {"url": "state/3-30000-e1", "base": 20000, "bytes": 512345}}}}

``url`` is the snapshot's name relative to the checkpoint directory, resolved against where the
checkpoint is now (:meth:`sparkwal.checkpoint.layout.CheckpointLayout.locate`; earlier releases wrote
absolute paths, still read). ``base`` is null for a full snapshot and the previous snapshot of
the chain for a delta (the files' format is :mod:`sparkwal.checkpoint.state_files`'). The first release
wrote ``{"3": {"20000": ".../state/3-20000"}}``, every snapshot full and in version 1: those
entries are still read. In memory (:class:`SnapshotRef`) a snapshot's ``url`` is where it is now.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from .checkpoint_file import read_checkpoint
from .layout import CheckpointLayout
from .state_files import (PICKLED, SnapshotError, arrow_column, merge_chain, part_rows, read_manifest,
                          read_part)


@dataclass(frozen=True)
class SnapshotRef:
    time_ms: int
    url: str
    base_ms: int | None = None  # None: a full snapshot
    bytes: int = 0

    @property
    def kind(self) -> str:
        return "full" if self.base_ms is None else "delta"


@dataclass
class StreamState:
    """One stateful stream's snapshots, as a checkpoint references them."""

    name: str
    snapshots: dict[int, SnapshotRef] = field(default_factory=dict)

    def chain(self, time_ms: int) -> list[SnapshotRef]:
        """The snapshots that make up the state at ``time_ms``, the full one first."""
        out: list[SnapshotRef] = []
        t: int | None = time_ms
        while t is not None:
            ref = self.snapshots.get(t)
            if ref is None:
                raise SnapshotError(f"state {self.name}: the snapshot chain of batch {time_ms} needs "
                                    f"the snapshot of batch {t}, which the checkpoint does not list")
            out.append(ref)
            t = ref.base_ms
        return out[::-1]

    def to_json(self, layout: CheckpointLayout | None = None) -> dict:
        """The checkpoint's entry; with ``layout``, each snapshot named relative to its directory."""
        def name(url: str) -> str:
            return layout.name_of(url) if layout is not None else url
        return {"name": self.name, "snapshots": {
            str(t): {"url": name(r.url), "base": r.base_ms, "bytes": r.bytes} for t, r in self.snapshots.items()}}


def state_names(entry: dict) -> list[str]:
    """Every snapshot name a checkpoint's ``state`` entry records, as recorded."""
    names = []
    for value in entry.values():
        if "snapshots" in value:
            names += [r["url"] for r in value["snapshots"].values()]
        else:
            names += list(value.values())
    return names


def parse_state(entry: dict, layout: CheckpointLayout | None = None) -> dict[int, StreamState]:
    """A checkpoint's ``state`` entry (any release's form), each snapshot located in ``layout``'s
    directory (where the checkpoint is now); without one, names are taken as they are."""
    def where(name: str) -> str:
        return layout.locate(name) if layout is not None else name

    out = {}
    for index, value in entry.items():
        if "snapshots" in value:
            refs = {int(t): SnapshotRef(int(t), where(r["url"]), r.get("base"), r.get("bytes", 0))
                    for t, r in value["snapshots"].items()}
            out[int(index)] = StreamState(value.get("name") or f"state-{index}", refs)
        else:  # the first release: {time: url}, every snapshot full
            out[int(index)] = StreamState(f"state-{index}",
                                          {int(t): SnapshotRef(int(t), where(u)) for t, u in value.items()})
    return out


def chain_rows(chain: list[SnapshotRef], storage_options: dict | None = None) -> dict:
    """The state at the chain's end, read on this process: ``{key: (value, updated_ms)}``."""
    def rows():
        for ref in chain:
            manifest = read_manifest(ref.url, storage_options)
            for i in range(len(manifest["parts"])):
                yield part_rows(ref.url, i, manifest, storage_options)
    return merge_chain(rows())


def state_table(state: dict, name: str) -> pa.Table:
    """``{key: (value, updated_ms)}`` as a ``key``/``value`` table, typed where it can be."""
    keys = list(state)
    key_col, key_pickled = arrow_column(keys)
    value_col, value_pickled = arrow_column([v for v, _ in state.values()])
    pickled = ",".join(n for n, p in (("key", key_pickled), ("value", value_pickled)) if p)
    return pa.table({"key": key_col, "value": value_col}).replace_schema_metadata(
        {PICKLED: pickled.encode(), b"sparkwal.stream": name.encode()})


def checkpoint_state(checkpoint_path: str, storage_options: dict | None = None) -> dict[int, StreamState]:
    """The stateful streams of the newest readable DStream checkpoint in ``checkpoint_path``."""
    cp = read_checkpoint(str(checkpoint_path), storage_options=storage_options)
    if cp is None:
        raise FileNotFoundError(f"no DStream checkpoint in {checkpoint_path}")
    return parse_state(cp.data.get("state", {}), CheckpointLayout(str(checkpoint_path)))


def read_state(checkpointPath, storage_options: dict | None = None) -> dict[str, pa.Table]:
    """The newest complete state of every stateful stream in a checkpoint, by name, as a table
    with columns ``key`` and ``value`` (typed, or ``binary`` pickles named in the schema's
    ``sparkwal.pickled`` metadata). Reads files only: no Spark, no lock, no code."""
    out = {}
    for stream in checkpoint_state(checkpointPath, storage_options).values():
        if not stream.snapshots:
            continue
        chain = stream.chain(max(stream.snapshots))
        out[stream.name] = state_table(chain_rows(chain, storage_options), stream.name)
    return out


@dataclass(frozen=True)
class StateSummary:
    """What ``sparkwal checkpoint inspect``/``verify`` report of one stateful stream."""

    name: str
    newest_ms: int | None
    chain: list[dict]  # {"time_ms", "kind", "rows", "bytes"} of the newest state, full first
    snapshots: int  # every snapshot the checkpoint references
    problems: list[str]


def summarize_state(entry: dict, storage_options: dict | None = None, verify: bool = False,
                    layout: CheckpointLayout | None = None) -> list[StateSummary]:
    """Every stateful stream of a checkpoint's ``state`` entry, its snapshots located in
    ``layout``'s directory; with ``verify``, every part of every referenced snapshot is read and
    checked (size and CRC32C)."""
    out = []
    for stream in parse_state(entry, layout).values():
        problems, chain = [], []
        newest = max(stream.snapshots, default=None)
        for _, ref in sorted(stream.snapshots.items()):
            try:
                manifest = read_manifest(ref.url, storage_options)
                if verify:
                    for i, part in enumerate(manifest["parts"]):
                        read_part(ref.url, i, part, storage_options)
            except SnapshotError as e:
                problems.append(str(e))
        if newest is not None:
            try:
                for ref in stream.chain(newest):
                    manifest = read_manifest(ref.url, storage_options)
                    chain.append({"time_ms": ref.time_ms, "kind": manifest.get("kind", "full"),
                                  "rows": sum(p[0] for p in manifest["parts"]),
                                  "bytes": sum(p[1] for p in manifest["parts"])})
            except SnapshotError as e:
                if str(e) not in problems:
                    problems.append(str(e))
        out.append(StateSummary(stream.name, newest, chain, len(stream.snapshots), problems))
    return out
