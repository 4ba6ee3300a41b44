"""Errors raised by the checkpoint layer; each names the file (and batch) it is about."""

from __future__ import annotations

from sparkwal.base.errors import SparkwalError


class CheckpointError(SparkwalError):
    """Base class of every checkpoint-layer error."""


class MalformedLogError(CheckpointError):
    """A metadata log file that cannot be parsed."""

    def __init__(self, path: str, reason: str):
        self.path = path
        super().__init__(f"Failed to read log file {path}. Log file was malformed: {reason}")


class UnsupportedLogVersionError(CheckpointError):
    """A metadata log file written by a newer version than this code reads."""

    def __init__(self, path: str, version: int, max_version: int):
        self.path, self.version, self.max_version = path, version, max_version
        super().__init__(
            f"Failed to read log file {path}. UnsupportedLogVersion: maximum supported log version "
            f"is v{max_version}, but encountered v{version}. The log file was produced by a newer "
            "version of Spark and cannot be read by this version. Please upgrade.")


class BatchRangeError(CheckpointError):
    """A requested range of batch ids is not contiguous or not all present."""


class RestartError(CheckpointError):
    """The offset and commit logs do not determine where to restart; says what to do."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint was written by a different program: another DStream graph or batch
    duration, or an offset log that does not go with it (the checkpoint may be sound; the program
    is not the one that wrote it). A ``ValueError`` too, as it always was."""


class ConcurrentUpdateError(CheckpointError, RuntimeError):
    """Another driver wrote the same batch of a log: two contexts write one checkpoint directory
    (Spark's ``ConcurrentModificationException`` of the offset log)."""


class MissingCodePartError(CheckpointError):
    """The code part a checkpoint names is gone: a running driver deleted it after writing a
    newer checkpoint (which names its own), so reading the newest checkpoint again finds it."""


class SnapshotError(CheckpointError, RuntimeError):
    """A snapshot is missing, incomplete or damaged (the message names the file)."""
