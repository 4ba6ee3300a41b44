"""sparkwal's driver-side tracking: received blocks on the WAL, input infos, receiver scheduling,
rate control. Built on :mod:`wal`."""

from .block_tracker import ReceivedBlockTracker
from .events import (BatchAllocationEvent, BatchCleanupEvent, BlockAdditionEvent, EventFormatError,
                     ReceivedBlockInfo, decode_event, encode_event)
from .input_info import BatchInfo, InputInfoTracker, StreamInputInfo, TrackerError
from .rate import PIDRateEstimator, RateController, RateLimiter, create_rate_estimator
from .scheduling import (ExecutorLocation, HostLocation, ReceiverSchedulingPolicy, ReceiverState,
                         ReceiverTrackingInfo)

__all__ = [
    "BatchAllocationEvent", "BatchCleanupEvent", "BatchInfo", "BlockAdditionEvent",
    "EventFormatError", "ExecutorLocation", "HostLocation", "InputInfoTracker", "PIDRateEstimator",
    "RateController", "RateLimiter", "ReceivedBlockInfo", "ReceivedBlockTracker",
    "ReceiverSchedulingPolicy", "ReceiverState", "ReceiverTrackingInfo", "StreamInputInfo",
    "TrackerError", "create_rate_estimator", "decode_event", "encode_event",
]
