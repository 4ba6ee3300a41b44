"""What every component of the driver may read of it: :class:`DriverFacts`.

The driver hands the components not yet given their collaborators itself, typed as a narrow
``Protocol`` of what each reads and calls (``SnapshotHost``, ``StandbyHost``, ...; the job scheduler,
the job generator and the checkpoints are handed theirs, see docs/architecture.md). Those protocols start from these
facts, fixed once the driver is made and its checkpoint directory set (the leadership's epoch
once it leads), and add what the component needs beyond them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

    from sparkwal.tracker import ReceivedBlockTracker
    from sparkwal.wal import Clock, StorageLocation

    from .config import StreamingConf
    from .graph import DStreamGraph
    from .receiver.receiver_tracker import ReceiverTracker


class DriverFacts(Protocol):
    @property
    def sc(self) -> SparkContext: ...
    @property
    def settings(self) -> StreamingConf: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def batch_ms(self) -> int: ...
    @property
    def graph(self) -> DStreamGraph: ...
    @property
    def location(self) -> StorageLocation | None: ...
    @property
    def checkpoint_dir(self) -> str | None: ...
    @property
    def storage_options(self) -> dict | None: ...
    @property
    def leader_epoch(self) -> int | None: ...


class StreamHost(DriverFacts, Protocol):
    """What a stream reads and calls of the driver that runs it (``stream.host``): the trackers
    of received blocks, the input report of each batch and the RDD checkpoints."""

    @property
    def block_tracker(self) -> ReceivedBlockTracker | None: ...
    @property
    def receiver_tracker(self) -> ReceiverTracker | None: ...
    def report_input(self, time_ms: int, stream, num_records: int, metadata: dict) -> None: ...
    def checkpoint_rdd(self, stream, time_ms: int, rdd: RDD) -> None: ...
