"""What the receiver tracker reads of the driver that runs it: the driver hands itself in as a
:class:`ReceiverHost`, and the tracker changes nothing of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkwal.tracker import ReceivedBlockTracker
    from sparkwal.wal import Clock

    from ..config import StreamingConf


class EventPoster(Protocol):
    def post(self, event) -> None: ...


class ReceiverHost(Protocol):
    """What the receiver tracker reads of the driver that runs it (the driver hands itself in;
    nothing here changes it)."""
    sc: SparkContext
    settings: StreamingConf
    batch_ms: int
    clock: Clock

    @property
    def checkpoint_dir(self) -> str | None: ...

    @property
    def storage_options(self) -> dict | None: ...
    block_tracker: ReceivedBlockTracker | None

    @property
    def events(self) -> EventPoster: ...

    @property
    def leader_epoch(self) -> int | None: ...
