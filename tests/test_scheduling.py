"""Port of Spark's ReceiverSchedulingPolicySuite, case by case."""

from __future__ import annotations

from dataclasses import dataclass

from sparkwal.tracker import (ExecutorCacheTaskLocation, HostTaskLocation, ReceiverSchedulingPolicy, ReceiverState,
                     ReceiverTrackingInfo)

policy = ReceiverSchedulingPolicy()


@dataclass
class Receiver:
    stream_id: int
    preferred_location: str | None = None


def ex(host, i=None):
    return ExecutorCacheTaskLocation(host, i or host)


def usage(scheduled, executors, locations_per_receiver):
    """How many receivers list each executor, checking each receiver's number of candidates."""
    counts = {e: 0 for e in executors}
    for locations in scheduled.values():
        assert len(locations) == locations_per_receiver
        for loc in locations:
            counts[loc] += 1
    return set(counts.values())


def test_reschedule_receiver_empty_executors():
    assert policy.reschedule_receiver(0, None, {}, []) == []


def test_reschedule_receiver_preferred_location():
    executors = [ex("host2")]
    got = policy.reschedule_receiver(0, "host1", {}, executors)
    assert set(got) == {HostTaskLocation("host1"), ex("host2")}


def test_reschedule_returns_all_idle_executors():
    executors = [ex(f"host{i}") for i in range(1, 6)]
    infos = {1: ReceiverTrackingInfo(1, ReceiverState.ACTIVE, None, ex("host1"))}
    assert set(policy.reschedule_receiver(0, None, infos, executors)) == set(executors[1:])


def test_reschedule_returns_executors_of_minimum_weight_when_none_is_idle():
    executors = [ex(f"host{i}") for i in range(1, 6)]
    infos = {
        1: ReceiverTrackingInfo(1, ReceiverState.ACTIVE, None, ex("host1")),
        2: ReceiverTrackingInfo(2, ReceiverState.SCHEDULED, (ex("host2"), ex("host3")), None),
        3: ReceiverTrackingInfo(3, ReceiverState.SCHEDULED, (ex("host1"), ex("host3")), None),
        4: ReceiverTrackingInfo(4, ReceiverState.SCHEDULED, (ex("host4"), ex("host5")), None),
        5: ReceiverTrackingInfo(5, ReceiverState.INACTIVE),
    }
    # weights: host1 1.5, host2 0.5, host3 1.0, host4 0.5, host5 0.5
    assert set(policy.reschedule_receiver(0, None, infos, executors)) == \
        {ex("host2"), ex("host4"), ex("host5")}


def test_reschedule_ignores_dead_executors_weights():
    """weights: dead 0.5 (the minimum), host2 1.5, host3 1.0. Spark would return only the dead
    executor; among live executors host3 is the least loaded."""
    alive = [ex("host2"), ex("host3")]
    infos = {1: ReceiverTrackingInfo(1, ReceiverState.SCHEDULED, (ex("dead"), ex("host2")), None),
             2: ReceiverTrackingInfo(2, ReceiverState.ACTIVE, None, ex("host2")),
             3: ReceiverTrackingInfo(3, ReceiverState.ACTIVE, None, ex("host3"))}
    assert policy.reschedule_receiver(0, None, infos, alive) == [ex("host3")]


def test_schedule_receivers_evenly_when_more_receivers_than_executors():
    receivers = [Receiver(i) for i in range(6)]
    executors = [ex(f"host{i}") for i in range(3)]
    assert usage(policy.schedule_receivers(receivers, executors), executors, 1) == {2}


def test_schedule_receivers_evenly_when_more_executors_than_receivers():
    receivers = [Receiver(i) for i in range(3)]
    executors = [ex(f"host{i}") for i in range(6)]
    assert usage(policy.schedule_receivers(receivers, executors), executors, 2) == {1}


def test_schedule_receivers_evenly_when_preferred_locations_are_even():
    receivers = [Receiver(i, f"host{i % 3}") for i in range(3)] + [Receiver(3 + i) for i in range(3)]
    executors = [ExecutorCacheTaskLocation(f"host{h}", f"{h}-{i}") for h in range(3) for i in range(2)]
    scheduled = policy.schedule_receivers(receivers, executors)
    for i in range(3):  # preferred receivers land on their host
        assert scheduled[i][0].host == f"host{i}"
    assert usage(scheduled, executors, 1) == {1}


def test_schedule_receivers_with_an_unknown_preferred_host():
    scheduled = policy.schedule_receivers([Receiver(0, "elsewhere")], [ex("host1")])
    assert scheduled[0][0] == HostTaskLocation("elsewhere")


def test_schedule_receivers_returns_empty_without_receivers():
    assert policy.schedule_receivers([], [ex("host1")]) == {}


def test_schedule_receivers_returns_empty_locations_without_executors():
    assert policy.schedule_receivers([Receiver(0), Receiver(1)], []) == {0: [], 1: []}
