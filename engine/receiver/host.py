"""What the receiver tracker reads of the driver that runs it: the driver hands itself in as a
:class:`ReceiverHost`, and the tracker changes nothing of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..host import DriverFacts

if TYPE_CHECKING:
    from sparkwal.tracker import ReceivedBlockTracker


class EventPoster(Protocol):
    def post(self, event) -> None: ...


class ReceiverHost(DriverFacts, Protocol):
    """What the receiver tracker reads of the driver that runs it (the driver hands itself in;
    nothing here changes it)."""

    @property
    def block_tracker(self) -> ReceivedBlockTracker | None: ...
    @property
    def events(self) -> EventPoster: ...
