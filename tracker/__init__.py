"""sparkwal's driver-side tracking: received blocks on the WAL, input infos, receiver scheduling,
rate control. Built on :mod:`wal`."""

from .block_tracker import ReceivedBlockTracker
from .events import (BatchAllocationEvent, BatchCleanupEvent, BlockAdditionEvent, EventFormatError,
                     ReceivedBlockInfo, decode_event, encode_event)
from .input_info import BatchInfo, InputInfoTracker, StreamInputInfo, TrackerError
from .rate import PIDRateEstimator, RateController, RateLimiter, create_rate_estimator
from .scheduling import (ExecutorCacheTaskLocation, ExecutorLocation, HostLocation, HostTaskLocation,
                         ReceiverSchedulingPolicy, ReceiverState, ReceiverTrackingInfo, TaskLocation)

__all__ = [
    "BatchAllocationEvent", "BatchCleanupEvent", "BatchInfo", "BlockAdditionEvent",
    "EventFormatError", "ExecutorCacheTaskLocation", "ExecutorLocation", "HostLocation", "HostTaskLocation",
    "InputInfoTracker", "PIDRateEstimator",
    "RateController", "RateLimiter", "ReceivedBlockInfo", "ReceivedBlockTracker",
    "ReceiverSchedulingPolicy", "ReceiverState", "ReceiverTrackingInfo", "StreamInputInfo",
    "TaskLocation", "TrackerError", "create_rate_estimator", "decode_event", "encode_event",
]
