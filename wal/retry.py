"""Retries of the storage seam's calls: bounded, jittered backoff under a per-operation deadline.

Object stores fail transiently every day: S3 answers 500 InternalError or 503 SlowDown, a
connection is reset, a request times out. The client libraries retry some of these themselves
(botocore, s3fs), each its own way and without a bound on the whole operation; the seam wraps each
of its calls to a remote store (:class:`sparkwal.wal.backends.FsspecStorage`) in one more loop, the one
that decides:

* **what is transient**: errors with errno EBUSY (s3fs's 503 SlowDown), EREMOTEIO (its 500),
  ECONNRESET, ECONNABORTED, ECONNREFUSED, ETIMEDOUT, EPIPE, EAGAIN, EHOSTUNREACH, ENETUNREACH;
  ``TimeoutError`` and ``ConnectionError``; the clients' connection and timeout errors (by class
  name, so no client is imported here); a ``ClientError`` with an HTTP status of 500 or more.
  Anything else (not found, access denied, precondition failed, a full disk) is raised at once.
* **how long**: full-jitter exponential backoff (AWS's recommendation: a random pause between 0
  and ``min(max_backoff, first_backoff * 2**attempt)``), never past the operation's deadline.
* **when to give up**: once ``deadline_s`` has passed since the operation began, with
  :class:`StorageUnavailableError` naming the operation, the object, the attempts and the last
  error. The engine stops the app on it (the main job's exit status 4); the checkpoint resumes it.

Only idempotent calls are retried blindly (reads, listings, deletes, whole-object puts). An
ambiguous conditional create (the connection reset after the store took it) comes back as
"already exists" on its retry and is settled by reading the object back (:mod:`sparkwal.wal.atomic`), so a
record is never written twice. The process-wide :func:`retry_statistics` count what was retried.

The default policy is set once per process with :func:`set_default_policy` (the engine's driver
does, from ``spark.sparkwal.storage.deadline``). The Spark conf does not reach executors' Python
workers, so the driver also hands the deadline to them in their environment (``DEADLINE_ENV``,
through Spark's executor environment): a worker's calls (a receiver's WAL, state snapshot parts)
take it from there, else 60 s.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import StorageUnavailableError

T = TypeVar("T")

TRANSIENT_ERRNOS = frozenset({
    errno.EBUSY, errno.EREMOTEIO, errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED,
    errno.ETIMEDOUT, errno.EPIPE, errno.EAGAIN, errno.EHOSTUNREACH, errno.ENETUNREACH})
TRANSIENT_CLASS_NAMES = frozenset({
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ConnectionError", "ServerDisconnectedError", "ClientOSError", "ClientConnectorError",
    "ClientPayloadError", "IncompleteRead", "ResponseParserError", "HTTPClientError",
    "ProtocolError", "FSTimeoutError"})


@dataclass(frozen=True)
class RetryPolicy:
    """``deadline_s``: how long an operation may keep failing transiently; ``request_timeout_s``:
    the longest one request may wait for its answer (None: half the deadline, at most 30 s) — a
    leader's is kept below its lease's margin, so that no request it sent lands after the lease
    could be taken over (:func:`sparkwal.wal.leases.request_timeout_s`)."""

    deadline_s: float = 60.0
    first_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.deadline_s > 0 or self.first_backoff_s < 0 or self.max_backoff_s < self.first_backoff_s:
            raise ValueError(f"a retry policy needs deadline_s > 0 and 0 <= first_backoff_s <= "
                             f"max_backoff_s, got {self}")


@dataclass(frozen=True)
class RetryStatistics:
    """What the seam retried in this process: ``operations`` that needed a retry, ``retries`` made,
    ``recovered`` (succeeded after retrying), ``gave_up`` (deadline passed), ``by_error``:
    retries per error kind (its errno name or class name)."""
    operations: int
    retries: int
    recovered: int
    gave_up: int
    by_error: dict[str, int]


def error_kind(error: BaseException) -> str:
    number = getattr(error, "errno", None)
    if isinstance(number, int) and number in errno.errorcode:
        return errno.errorcode[number]
    return type(error).__name__


#: a transient error the store answered with (503 SlowDown or ServiceUnavailable, 500 InternalError, as
#: s3fs raises them): the store is there and refuses (a timeout or a reset is no answer: a partition,
#: or this process paused, looks the same)
ANSWERED_ERRNOS = frozenset({errno.EBUSY, errno.EREMOTEIO})


def _http_status(error: BaseException):
    """The HTTP status of a botocore-style error's answer, if it carries one."""
    response = getattr(error, "response", None)
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None


def answered_by_store(error: BaseException) -> bool:
    """A transient error that the store answered with, not a timeout or a lost connection."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "errno", None) in ANSWERED_ERRNOS:
            return True
        if _http_status(error) in (500, 503):  # (502 and 504 come from a proxy in front of a store that did not answer)
            return True
        error = error.__cause__ or error.__context__
    return False


def is_transient(error: BaseException) -> bool:
    """Worth retrying: the store or the network, not the request (see the module's list)."""
    seen = set()
    while error is not None and id(error) not in seen:  # the cause chain: clients wrap errors
        seen.add(id(error))
        if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError)):
            return False
        if getattr(error, "errno", None) in TRANSIENT_ERRNOS:
            return True
        if isinstance(error, (TimeoutError, ConnectionError)):
            return True
        if any(c.__name__ in TRANSIENT_CLASS_NAMES for c in type(error).__mro__):
            return True
        status = _http_status(error)
        if isinstance(status, int) and status >= 500:
            return True
        cause = error.__cause__ or error.__context__
        if cause is None:
            return False
        error = cause
    return False


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.operations = self.retries = self.recovered = self.gave_up = 0
        self.by_error: dict[str, int] = {}

    def snapshot(self) -> RetryStatistics:
        with self.lock:
            return RetryStatistics(self.operations, self.retries, self.recovered, self.gave_up,
                                   dict(self.by_error))


_counters = _Counters()
#: seconds; set for executors' Python workers by the driver (see the module's docstring)
DEADLINE_ENV = "SPARKWAL_STORAGE_DEADLINE_S"


def _from_environment() -> RetryPolicy:
    try:
        return RetryPolicy(deadline_s=float(os.environ.get(DEADLINE_ENV, "60")))
    except ValueError:
        return RetryPolicy()


_default = _from_environment()


def retry_statistics() -> RetryStatistics:
    return _counters.snapshot()


def set_default_policy(policy: RetryPolicy) -> None:
    global _default
    _default = policy


def default_policy() -> RetryPolicy:
    return _default


def call(operation: str, url: str, fn: Callable[[], T], *, policy: RetryPolicy | None = None,
         sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
         rng: random.Random | None = None, fence=None,
         refused: Callable[[BaseException], None] | None = None) -> T:
    """Run ``fn`` until it succeeds, fails with a non-transient error (raised as is), or keeps
    failing transiently past the deadline (:class:`StorageUnavailableError`). ``fence``: the
    leadership a write is made under (``remaining_ms()``): checked before every attempt and
    after every failure (:class:`sparkwal.wal.FencedError` comes first: a paused leader that
    resumes learns that before it learns of the store), and the retries stop where it could
    lapse. ``refused``: told of each error the store answered with (:func:`answered_by_store`),
    before the fence is looked at (a leadership's ``store_refused``: a lapse then is the store's)."""
    policy = policy or _default
    uniform = (rng or random).uniform
    start, attempts = monotonic(), 0
    deadline_s = policy.deadline_s
    while True:
        attempts += 1
        if fence is not None:
            remaining = fence.remaining_ms()
            if remaining is not None:
                deadline_s = min(policy.deadline_s, monotonic() - start + remaining / 1000)
        try:
            result = fn()
        except BaseException as e:
            if not isinstance(e, Exception) or not is_transient(e):
                raise
            if refused is not None and answered_by_store(e):
                refused(e)
            if fence is not None:
                fence.remaining_ms()
            elapsed = monotonic() - start
            given_up = elapsed >= deadline_s
            with _counters.lock:
                _counters.operations += attempts == 1
                kind = error_kind(e)
                _counters.by_error[kind] = _counters.by_error.get(kind, 0) + 1
                if given_up:
                    _counters.gave_up += 1
                else:
                    _counters.retries += 1
            if given_up:
                raise StorageUnavailableError(operation, url, attempts, elapsed, e) from e
            backoff = min(policy.max_backoff_s, policy.first_backoff_s * 2 ** min(attempts - 1, 30))
            pause = min(uniform(0, backoff), deadline_s - elapsed)
            sleep(pause)
            continue
        if attempts > 1:
            with _counters.lock:
                _counters.recovered += 1
        return result
