"""Where receivers run: Spark's ReceiverSchedulingPolicy
(streaming/src/main/scala/org/apache/spark/streaming/scheduler/ReceiverSchedulingPolicy.scala).

``schedule_receivers`` places all receivers at start-up in three steps: (1) receivers with a
preferred host go to that host's least-loaded executor (or to the bare host when it has none);
(2) every receiver still without a place goes to the globally least-loaded executor; (3) every
executor still idle is added as a candidate to the receiver with the fewest candidates, so a
restart can use it. ``reschedule_receiver`` places one receiver when it (re)starts: its preferred
host, plus every idle executor, or else every executor of minimum weight, where an active receiver
weighs 1 on its executor and a scheduled one 1/n on each of its n candidates.

Unlike Spark, weights of executors that are no longer alive are ignored when choosing the
minimum, so a receiver is never rescheduled onto a dead executor.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class HostTaskLocation:
    """Where a receiver may run: any executor on ``host`` (Spark's ``HostTaskLocation``)."""
    host: str


@dataclass(frozen=True)
class ExecutorCacheTaskLocation:
    """Where a receiver may run: that executor (Spark's ``ExecutorCacheTaskLocation``)."""
    host: str
    executor_id: str


#: Where a task may run (Spark's ``TaskLocation``); "location" alone is a place in storage
#: (``sparkwal.wal.StorageLocation``).
TaskLocation = HostTaskLocation | ExecutorCacheTaskLocation
#: deprecated names
HostLocation = HostTaskLocation
ExecutorLocation = ExecutorCacheTaskLocation


class ReceiverState(enum.Enum):
    INACTIVE = "INACTIVE"
    SCHEDULED = "SCHEDULED"
    ACTIVE = "ACTIVE"


@dataclass(frozen=True)
class ReceiverTrackingInfo:
    receiver_id: int
    state: ReceiverState
    scheduled_locations: tuple[TaskLocation, ...] | None = None
    running_executor: ExecutorCacheTaskLocation | None = None


class ReceiverLike(Protocol):
    stream_id: int
    preferred_location: str | None


class ReceiverSchedulingPolicy:
    def schedule_receivers(self, receivers: Sequence[ReceiverLike],
                           executors: Sequence[ExecutorCacheTaskLocation]) -> dict[int, list[TaskLocation]]:
        if not receivers:
            return {}
        if not executors:
            return {r.stream_id: [] for r in receivers}
        by_host: dict[str, list[ExecutorCacheTaskLocation]] = {}
        for e in executors:
            by_host.setdefault(e.host, []).append(e)
        load = {e: 0 for e in executors}
        scheduled: list[list[TaskLocation]] = [[] for _ in receivers]

        for i, r in enumerate(receivers):  # 1. preferred hosts
            if r.preferred_location:
                candidates = by_host.get(r.preferred_location)
                if candidates:
                    e = min(candidates, key=load.__getitem__)
                    scheduled[i].append(e)
                    load[e] += 1
                else:
                    scheduled[i].append(HostTaskLocation(r.preferred_location))
        for i in range(len(receivers)):  # 2. everyone else: the least-loaded executor
            if not scheduled[i]:
                e = min(load, key=load.__getitem__)
                scheduled[i].append(e)
                load[e] += 1
        for e in [e for e, n in load.items() if n == 0]:  # 3. idle executors as spare candidates
            min(scheduled, key=len).append(e)
        return {r.stream_id: scheduled[i] for i, r in enumerate(receivers)}

    def reschedule_receiver(self, receiver_id: int, preferred_location: str | None,
                            receiver_tracking_info: Mapping[int, ReceiverTrackingInfo],
                            executors: Sequence[ExecutorCacheTaskLocation]) -> list[TaskLocation]:
        if not executors:
            return []
        out: list[TaskLocation] = []
        if preferred_location:
            out.append(HostTaskLocation(preferred_location))
        weights: dict[ExecutorCacheTaskLocation, float] = {}
        for info in receiver_tracking_info.values():
            for e, w in _weights(info):
                weights[e] = weights.get(e, 0.0) + w
        idle = [e for e in executors if e not in weights]
        if idle:
            out += idle
        else:
            alive = {e: w for e, w in weights.items() if e in set(executors)}
            least = min(alive.values())
            out += [e for e in executors if alive.get(e) == least]
        return out


def _weights(info: ReceiverTrackingInfo) -> list[tuple[ExecutorCacheTaskLocation, float]]:
    if info.state is ReceiverState.ACTIVE and info.running_executor is not None:
        return [(info.running_executor, 1.0)]
    if info.state is ReceiverState.SCHEDULED and info.scheduled_locations:
        n = len(info.scheduled_locations)
        return [(loc, 1.0 / n) for loc in info.scheduled_locations if isinstance(loc, ExecutorCacheTaskLocation)]
    return []
