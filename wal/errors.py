"""Errors raised by the write-ahead log and the storage layer."""

from __future__ import annotations

from sparkwal.base.errors import SparkwalError


class WalError(SparkwalError):
    """Base class of every error the WAL and its storage layer raise."""


class CorruptRecordError(WalError):
    """A record failed its checksum or framing check somewhere a torn tail cannot explain.

    ``path`` and ``offset`` locate the bad frame; records before it stay readable.
    """

    def __init__(self, path: str, offset: int, reason: str):
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(f"corrupt record in {path} at byte offset {offset}: {reason}")


class LogLockedError(WalError):
    """Another writer holds the log directory (single-writer fencing)."""

    def __init__(self, path: str, holder: str = ""):
        self.path = path
        self.holder = holder
        detail = f" (held by {holder})" if holder else ""
        super().__init__(f"{path} is locked by another writer{detail}")


class LeaderHeldError(LogLockedError):
    """A live driver leads the checkpoint directory; ``info`` (a ``sparkwal.wal.storage.LeaderInfo``) says
    who, since when, at which epoch and, for a lease, until when it holds unless renewed.
    ``wait_ms``: how long (on the lease's monotonic clock) before another attempt may find the
    lease lapsed; None when the holder is known to be alive (a live process's flock, or a lease
    renewed since this process first saw it)."""

    def __init__(self, path: str, info, wait_ms: int | None = None):
        self.info = info
        self.wait_ms = wait_ms
        super().__init__(path, info.describe())
        self.args = (f"{path} is led by another live driver: {info.describe()}",)

    def __str__(self) -> str:
        return self.args[0]


class LeadershipRefusedError(WalError):
    """Leading this directory could not be made safe, so it was refused: a network filesystem
    whose ``flock`` is not a lock between machines, a store without a conditional write, or an
    epoch that would go backwards (the leader records were lost). The message names the
    directory, the reason and what to do."""


class FencedError(WalError):
    """This process's leadership epoch is no longer the current one (another driver took over, or
    its lease lapsed before it could renew it): it must write nothing more."""


class StorageUnavailableError(WalError):
    """A storage call kept failing transiently past its deadline: the store is unavailable."""

    def __init__(self, operation: str, url: str, attempts: int, elapsed_s: float, last_error: BaseException):
        self.operation, self.url, self.attempts = operation, url, attempts
        self.elapsed_s, self.last_error = elapsed_s, last_error
        super().__init__(f"storage unavailable: {operation} {url} still failing after {attempts} "
                         f"attempts in {elapsed_s:.1f} s; last error: {_error_text(last_error)}")


def _error_text(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
