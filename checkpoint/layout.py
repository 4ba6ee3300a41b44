"""Every path under a checkpoint directory, named once.

The engine, the tracker's caller and the inspectors ask this module where things are; nothing
else spells these names. Each file's format is described by the module that owns it (named
below).

* ``checkpoint-<ms>[.bk]``: DStream checkpoints, data only, Spark's names (:mod:`sparkwal.checkpoint.checkpoint_file`)
* ``code-<sha>``: the program, pickled (the code part; :mod:`sparkwal.checkpoint.code`)
* ``state/<stream>-<ms>[-e<epoch>].*``: state snapshots in Arrow, full or delta (:mod:`sparkwal.checkpoint.state_files`)
* ``offsets/<id>``, ``commits/<id>``: Structured Streaming's offset and commit logs (:mod:`sparkwal.checkpoint.offsets`)
* ``sources/<input>/0``: where each direct input started (:mod:`sparkwal.engine.sources.batch_log`)
* ``metadata``: a Structured Streaming query's id, inspected only (Spark's ``StreamMetadata``)
* ``receivedBlockMetadata/``: the block tracker's WAL, Spark's name (records: :mod:`sparkwal.tracker.events`)
* ``receivedData/<stream>-e<epoch>/``: received blocks, a WAL per stream and epoch
  (:mod:`sparkwal.engine.receiver.blocks`)
* ``rdds/``: Spark's RDD checkpoint directory, for users' own ``rdd.checkpoint()``
* ``events/run-<startMs>-e<epoch>/``: the driver runs' event log, a run file and a WAL each
  (:mod:`sparkwal.checkpoint.event_log`)
* ``.leader.lock``, ``.leader.epoch``, ``.leader/``: the driver's leadership, a lock or leases
  (:mod:`sparkwal.wal.locks`)
* ``copied-from.json``: in a copy made by ``sparkwal checkpoint copy``, where it was copied from
  (:mod:`sparkwal.checkpoint.copy`)

A checkpoint names the files it references (state snapshots, received blocks' WAL records) by
*relative* names, ``state/3-20000-e1`` or ``receivedData/0-e1/log-...``, resolved against where
the checkpoint directory is now (:meth:`CheckpointLayout.locate`): a copied or moved checkpoint
reads its own files, and a driver on a copy never reads, writes or deletes its original's.
Checkpoints written before sparkwal did so name them by absolute path: under the directory, they
are its own; elsewhere (a copy made of such a checkpoint), the part from the layout's directory
name on (``state/...``) is taken from this directory, and :meth:`CheckpointLayout.written_at`
says where the names point, for the one line a reader logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from sparkwal.wal.storage import LEADER_EPOCH, LEADER_LEASES, LEADER_LOCK, StorageLocation

CHECKPOINT_PREFIX = "checkpoint-"
CODE_PREFIX = "code-"
STATE = "state"
OFFSETS = "offsets"
COMMITS = "commits"
SOURCES = "sources"
METADATA = "metadata"
RECEIVED_BLOCK_METADATA = "receivedBlockMetadata"
RECEIVED_DATA = "receivedData"
RDDS = "rdds"
EVENTS = "events"
COPIED_FROM = "copied-from.json"

#: Subdirectories a checkpoint directory may hold, for the inspectors.
SUBDIRECTORIES = (STATE, OFFSETS, COMMITS, SOURCES, RECEIVED_BLOCK_METADATA, RECEIVED_DATA, RDDS, EVENTS)
#: The directories whose files a checkpoint names (relative names start with one of them).
_NAMED = (STATE, RECEIVED_DATA)
_RELATIVE = re.compile(rf"(?:{'|'.join(_NAMED)})/[^/]")
#: an absolute name's part from the last of those directories on (an older release's names)
_TAIL = re.compile(rf"(?:^|/)((?:{'|'.join(_NAMED)})/[^/][^/]*(?:/[^/]+)?)$")


def _normal(url: str) -> str:
    """``url`` compared as text: a local path absolute and normalised, ``file://`` dropped, no
    trailing slash."""
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        return os.path.normpath(os.path.abspath(url))
    return url.rstrip("/")


def _under(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` (both normalised), or None when it lies outside."""
    if path == root:
        return ""
    prefix = root if root.endswith("/") else root + "/"
    return path[len(prefix):] if path.startswith(prefix) else None

__all__ = ["CHECKPOINT_PREFIX", "CODE_PREFIX", "COMMITS", "COPIED_FROM", "CheckpointLayout", "EVENTS", "LEADER_EPOCH",
           "LEADER_LEASES", "LEADER_LOCK", "METADATA", "OFFSETS", "RDDS", "RECEIVED_BLOCK_METADATA", "RECEIVED_DATA",
           "SOURCES", "STATE", "SUBDIRECTORIES"]


@dataclass(frozen=True)
class CheckpointLayout:
    """The paths under ``root``, a local path or any fsspec URL (joined with ``/``, as every
    fsspec filesystem and the local one accept), or a :class:`~sparkwal.wal.StorageLocation`:
    its paths are then named by its URL, and :meth:`at` gives each as a location of its own
    (the root's options, retry policy and storage)."""

    root: str
    location: StorageLocation | None = field(default=None, compare=False, repr=False)

    def __init__(self, root: str | StorageLocation):
        object.__setattr__(self, "root", str(root))
        object.__setattr__(self, "location", root if isinstance(root, StorageLocation) else None)

    def at(self, path: str) -> str | StorageLocation:
        """``path`` (one of this layout's) as a location when the root is one, else as it is."""
        return self.location.at(path) if self.location is not None else path

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def relative(self, url: str) -> str | None:
        """``url``'s name relative to this directory, or None when it lies outside (symbolic
        links of a local path followed)."""
        root, path = _normal(self.root), _normal(url)
        rel = _under(path, root)
        if rel is None and "://" not in root and "://" not in path:
            rel = _under(os.path.realpath(path), os.path.realpath(root))
        return rel

    def name_of(self, url: str) -> str:
        """The name a checkpoint records for ``url``, a file of this directory (see the module's
        docstring); a URL outside it is an error, never recorded."""
        rel = self.relative(url)
        if not rel:
            raise ValueError(f"{url} is not inside the checkpoint directory {self.root}")
        return rel

    def name_of_stored(self, path: str) -> str:
        """The name a checkpoint records for ``path``, a file of this directory named as the root
        location's storage names it (a WAL's handle: ``bucket/ckpt/...`` on S3, not the URL)."""
        if self.location is None:
            return self.name_of(path)
        root = self.location.path.rstrip("/") or "/"
        rel = _under(path.rstrip("/"), root)
        if not rel:
            raise ValueError(f"{path} is not inside the checkpoint directory {self.root}")
        return rel

    def own_name(self, name: str) -> str | None:
        """The relative name a name a checkpoint records stands for in this directory (see the
        module's docstring): itself, an older release's absolute name made relative, or None
        when it fits nothing this layout writes."""
        if _RELATIVE.match(name):
            return name
        rel = self.relative(name)
        if rel:
            return rel
        tail = _TAIL.search(name.rstrip("/"))
        return tail.group(1) if tail else None

    def locate(self, name: str) -> str:
        """Where the file a checkpoint names as ``name`` is now: a relative name, or an older
        release's absolute one, resolved against this directory (see the module's docstring). A
        name that fits nothing this layout writes is returned as it is."""
        own = self.own_name(name)
        return self._join(own) if own is not None else name

    def written_at(self, names: Iterable[str]) -> str | None:
        """Where a checkpoint that names ``names`` was written, when it names files by absolute
        path outside this directory (a copy of an older release's checkpoint): the directory those
        names point into, for the one line a reader logs. None: its names are its own."""
        for name in names:
            if _RELATIVE.match(name) or self.relative(name) is not None:
                continue
            tail = _TAIL.search(name.rstrip("/"))
            if tail:
                return name.rstrip("/")[:tail.start(1)].rstrip("/") or "/"
        return None

    def checkpoint_file(self, time_ms: int) -> str:
        return self._join(f"{CHECKPOINT_PREFIX}{time_ms}")

    def code_part(self, name: str) -> str:
        return self._join(name)

    @property
    def state(self) -> str:
        return self._join(STATE)

    def state_snapshot(self, stream_index: int, time_ms: int) -> str:
        """The base name of a state snapshot's files (``<base>.*``)."""
        return self._join(STATE, f"{stream_index}-{time_ms}")

    @property
    def offsets(self) -> str:
        return self._join(OFFSETS)

    @property
    def commits(self) -> str:
        return self._join(COMMITS)

    def source_start(self, input_id: int) -> str:
        return self._join(SOURCES, str(input_id))

    @property
    def sources(self) -> str:
        return self._join(SOURCES)

    @property
    def metadata(self) -> str:
        return self._join(METADATA)

    @property
    def block_metadata(self) -> str:
        """The block tracker's write-ahead log."""
        return self._join(RECEIVED_BLOCK_METADATA)

    @property
    def received_data(self) -> str:
        return self._join(RECEIVED_DATA)

    def received_data_stream(self, stream_id: int) -> str:
        """The prefix of a stream's received-block logs (``<prefix>-e<epoch>``)."""
        return self._join(RECEIVED_DATA, str(stream_id))

    @property
    def rdds(self) -> str:
        return self._join(RDDS)

    @property
    def events(self) -> str:
        """The driver runs' event log (:mod:`sparkwal.checkpoint.event_log`)."""
        return self._join(EVENTS)

    @property
    def copied_from(self) -> str:
        """A copy's record of its source (:mod:`sparkwal.checkpoint.copy`)."""
        return self._join(COPIED_FROM)
