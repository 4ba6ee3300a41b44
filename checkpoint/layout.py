"""Every path under a checkpoint directory, named once.

The engine, the tracker's caller and the inspectors ask this module where things are; nothing
else spells these names. Each file's format is described by the module that owns it (named
below).

* ``checkpoint-<ms>[.bk]``: DStream checkpoints, data only, Spark's names (:mod:`checkpoint.checkpoint_file`)
* ``code-<sha>``: the program, pickled (the code part; :mod:`checkpoint.code`)
* ``state/<stream>-<ms>[-e<epoch>].*``: state snapshots in Arrow, full or delta (:mod:`checkpoint.state_files`)
* ``offsets/<id>``, ``commits/<id>``: Structured Streaming's offset and commit logs (:mod:`checkpoint.offsets`)
* ``sources/<input>/0``: where each direct input started (:mod:`engine.sources.batch_log`)
* ``metadata``: a Structured Streaming query's id, inspected only (Spark's ``StreamMetadata``)
* ``receivedBlockMetadata/``: the block tracker's WAL, Spark's name (records: :mod:`tracker.events`)
* ``receivedData/<stream>-e<epoch>/``: received blocks, a WAL per stream and epoch (:mod:`engine.receiver.blocks`)
* ``rdds/``: Spark's RDD checkpoint directory, for users' own ``rdd.checkpoint()``
* ``events/run-<startMs>-e<epoch>/``: the driver runs' event log, a run file and a WAL each (:mod:`checkpoint.event_log`)
* ``.leader.lock``, ``.leader.epoch``, ``.leader/``: the driver's leadership, a lock or leases (:mod:`wal.locks`)
"""

from __future__ import annotations

from dataclasses import dataclass

from wal.storage import LEADER_EPOCH, LEADER_LEASES, LEADER_LOCK

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

#: Subdirectories a checkpoint directory may hold, for the inspectors.
SUBDIRECTORIES = (STATE, OFFSETS, COMMITS, SOURCES, RECEIVED_BLOCK_METADATA, RECEIVED_DATA, RDDS, EVENTS)

__all__ = ["CHECKPOINT_PREFIX", "CODE_PREFIX", "COMMITS", "CheckpointLayout", "EVENTS", "LEADER_EPOCH",
           "LEADER_LEASES", "LEADER_LOCK", "METADATA", "OFFSETS", "RDDS", "RECEIVED_BLOCK_METADATA", "RECEIVED_DATA",
           "SOURCES", "STATE", "SUBDIRECTORIES"]


@dataclass(frozen=True)
class CheckpointLayout:
    """The paths under ``root``, a local path or any fsspec URL (joined with ``/``, as every
    fsspec filesystem and the local one accept)."""

    root: str

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

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
        """The driver runs' event log (:mod:`checkpoint.event_log`)."""
        return self._join(EVENTS)
