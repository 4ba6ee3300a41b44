"""sparkwal's write-ahead log: the lowest layer, and the owner of the storage seam.

Public API::

    FileBasedWriteAheadLog(log_dir, *, rolling_interval_s=60, max_failures=3,
                           close_file_after_write=False, storage_options=None, clock=None,
                           durability="fsync")
    BatchedWriteAheadLog(wrapped, *, batching_timeout_s=5.0)
    log.write(data, time_ms) -> RecordHandle;  log.read(handle);  log.read_all()
    log.clean(thresh_ms, wait_for_completion=False);  log.close();  log.statistics()
"""

from .base import Durability, RecordHandle, WalStatistics, WriteAheadLog
from .batched import BatchedWriteAheadLog
from .clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from .errors import (CorruptRecordError, FencedError, LeaderHeldError, LeadershipRefusedError, LogLockedError,
                     StorageUnavailableError, WalError)
from .file_log import FileBasedWriteAheadLog
from .location import StorageLocation
from .retry import RetryPolicy, RetryStatistics, retry_statistics, set_default_policy
from .storage import FileInfo, LeaderInfo, Leadership, Storage, resolve

__all__ = [
    "BatchedWriteAheadLog",
    "Clock",
    "CorruptRecordError",
    "Durability",
    "FencedError",
    "FileBasedWriteAheadLog",
    "FileInfo",
    "LeaderHeldError",
    "LeaderInfo",
    "LeadershipRefusedError",
    "Leadership",
    "LogLockedError",
    "ManualClock",
    "RecordHandle",
    "RetryPolicy",
    "RetryStatistics",
    "SYSTEM_CLOCK",
    "Storage",
    "StorageLocation",
    "StorageUnavailableError",
    "SystemClock",
    "WalError",
    "WalStatistics",
    "WriteAheadLog",
    "resolve",
    "retry_statistics",
    "set_default_policy",
]
