"""sparkwal's checkpoints: atomic metadata logs, Spark's offsets/commits pair, DStream checkpoints.

Built on the storage seam of :mod:`sparkwal.wal.storage` (atomic create-if-absent, atomic replace).
"""

from .code import read_code, write_code
from .checkpoint_file import Checkpoint, CheckpointFollower, read_checkpoint
from .checkpoint_writer import CheckpointWriter, CheckpointWriterStatistics
from .errors import (BatchRangeError, CheckpointError, CheckpointMismatchError, MalformedLogError,
                     MissingCodePartError, RestartError, SnapshotError, UnsupportedLogVersionError)
from .metadata_log import MetadataLog, parse_version, verify_batch_ids
from .offsets import CommitLog, CommitMetadata, OffsetMap, OffsetSeq, OffsetSeqLog, OffsetSeqMetadata
from .resume import RepairPlan, RestartPoint, plan_repair, repair, resolve_restart

__all__ = [
    "CheckpointFollower",
    "BatchRangeError", "Checkpoint", "CheckpointError", "CheckpointMismatchError", "CheckpointWriter",
    "CheckpointWriterStatistics", "CommitLog", "CommitMetadata", "MalformedLogError", "MetadataLog",
    "MissingCodePartError",
    "OffsetMap", "OffsetSeq", "OffsetSeqLog", "OffsetSeqMetadata", "RepairPlan", "RestartError",
    "RestartPoint", "SnapshotError", "UnsupportedLogVersionError", "parse_version", "plan_repair", "read_checkpoint",
    "read_code", "repair", "resolve_restart", "verify_batch_ids", "write_code",
]
