"""One place in storage: :class:`StorageLocation`, a URL with everything needed to reach it.

A location is the URL (a local path or any fsspec URL), the fsspec options for it, the retry
policy of its calls (:mod:`sparkwal.wal.retry`; None: the process's default) and, optionally, the
:class:`~sparkwal.wal.storage.Storage` itself, handed in (as httpx takes a transport) so that a
test can give the in-memory or the fault-injecting store directly. Its storage is resolved once
and kept (as fsspec keeps one filesystem per set of options), and :meth:`child` locations share it.

Every function of the seam that takes a URL takes a location as well (:func:`sparkwal.wal.resolve`
accepts both), so a location travels where ``(url, storage_options)`` pairs used to.

A location is picklable, for tasks: its URL, options and policy travel; the storage does not
(a task resolves its own). Options that look like long-lived credentials (``key``, ``secret``,
``token``, ``password``, ``*_secret_access_key``, ``credentials``...) never travel in a task: they
are dropped from the pickled copy, and the executors take credentials from their environment
(docs/cluster.md), as the driver should too.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

import fsspec

from . import retry
from .backends import FsspecStorage, LocalStorage, Storage
from .retry import RetryPolicy

log = logging.getLogger(__name__)

#: fsspec option names that carry a secret (s3fs's key/secret/token, gcsfs's token, adlfs's
#: account_key, client_secret, sas_token, a password...)
CREDENTIAL_OPTION = re.compile(r"(?i)(^|_)(key|secret|token|password|credentials?)$|secret|password")


def credential_options(options: Mapping | None) -> list[str]:
    """The names in ``options`` that look like credentials (see :data:`CREDENTIAL_OPTION`), those
    of nested options (s3fs's ``client_kwargs``...) as ``outer.inner``."""
    found = []
    for k, v in (options or {}).items():
        if CREDENTIAL_OPTION.search(str(k)):
            found.append(str(k))
        elif isinstance(v, Mapping):
            found.extend(f"{k}.{inner}" for inner in credential_options(v))
    return sorted(found)


def without_credentials(options: Mapping | None, mask: str | None = None) -> dict | None:
    """``options`` without what :func:`credential_options` names (at any depth), or with those
    values replaced by ``mask``."""
    kept: dict = {}
    for k, v in (options or {}).items():
        if CREDENTIAL_OPTION.search(str(k)):
            if mask is not None:
                kept[k] = mask
        else:
            kept[k] = (without_credentials(v, mask) or {}) if isinstance(v, Mapping) else v
    return kept or None


#: the sets of option names already said to be dropped from a task: each said once per process (not
#: once per URL: a stream writes a state snapshot of a new name every few batches)
_warned: set[tuple[str, ...]] = set()


class StorageLocation:
    """``url`` (a path or fsspec URL) reached with ``options`` (fsspec's storage options), its calls
    retried under ``policy``; ``storage``: the store to use instead of resolving ``url``'s."""

    __slots__ = ("url", "options", "policy", "_resolved")

    def __init__(self, url: str, options: Mapping | None = None, *, policy: RetryPolicy | None = None,
                 storage: Storage | None = None, path: str | None = None):
        if isinstance(url, StorageLocation) or not isinstance(url, str) or not url:
            raise TypeError(f"a storage location's URL is a non-empty string, got {url!r}")
        self.url = url
        self.options = dict(options) if options else None
        self.policy = policy
        self._resolved: tuple[Storage, str] | None = None
        if storage is not None:  # path: where url lies in it (default: read from the URL)
            self._resolved = (storage, path or _path_in(storage, url))

    @classmethod
    def of(cls, url: str | StorageLocation, options: Mapping | None = None) -> StorageLocation:
        """``url`` as a location (a location given is returned as it is; options then must not be)."""
        if isinstance(url, StorageLocation):
            if options and dict(options) != (url.options or {}):
                raise ValueError(f"storage options given for {url.url}, a location that has its own")
            return url
        return cls(url, options)

    def resolve(self) -> tuple[Storage, str]:
        """``(storage, path inside it)``, resolved at the first call and kept."""
        if self._resolved is None:
            self._resolved = resolve_url(self.url, self.options, self.policy)
        return self._resolved

    @property
    def storage(self) -> Storage:
        return self.resolve()[0]

    @property
    def path(self) -> str:
        return self.resolve()[1]

    def child(self, *names: str) -> StorageLocation:
        """The location of ``names`` under this one (``/``-joined), with the same options, policy
        and storage."""
        url = "/".join([self.url.rstrip("/"), *names])
        if self._resolved is None:
            return StorageLocation(url, self.options, policy=self.policy)
        storage, path = self._resolved
        for name in names:
            path = storage.join(path, name)
        return StorageLocation(url, self.options, policy=self.policy, storage=storage, path=path)

    def at(self, url: str) -> StorageLocation:
        """The location of ``url``, which lies under this one (its options, policy and storage)."""
        if url == self.url:
            return self
        prefix = self.url.rstrip("/") + "/"
        if not url.startswith(prefix):
            raise ValueError(f"{url} is not under {self.url}")
        return self.child(*url[len(prefix):].strip("/").split("/"))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"StorageLocation({self.url!r}, {without_credentials(self.options, mask='***')!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StorageLocation) and (self.url, self.options, self.policy)
                == (other.url, other.options, other.policy))

    def __hash__(self) -> int:
        return hash((self.url, repr(sorted((self.options or {}).items())), self.policy))

    def __getstate__(self) -> tuple:
        dropped = credential_options(self.options)
        if dropped and tuple(dropped) not in _warned:
            _warned.add(tuple(dropped))
            log.warning("%s: the storage options %s look like credentials and are not sent to tasks "
                        "(executors take credentials from their environment)", self.url, ", ".join(dropped))
        return (self.url, without_credentials(self.options), self.policy)

    def __setstate__(self, state: tuple) -> None:
        self.url, self.options, self.policy = state
        self._resolved = None


def _path_in(storage: Storage, url: str) -> str:
    """Where ``url`` lies in a storage handed in: a local path made absolute, else the URL's path."""
    if "://" not in url:
        return os.path.abspath(url)
    scheme, rest = url.split("://", 1)  # fsspec's reading of the rest: memory://a is /a
    if scheme == "file" or scheme.endswith("+file"):
        return os.path.abspath(rest)
    try:
        return fsspec.core.strip_protocol(url).rstrip("/") or "/"
    except ValueError:  # a protocol fsspec does not know, of a store handed in
        raise ValueError(f"{url}: fsspec does not know this protocol; give the location the path "
                         "inside the storage handed in (path=...)") from None


def resolve_url(url: str, storage_options: dict | None = None,
                policy: retry.RetryPolicy | None = None) -> tuple[Storage, str]:
    """``resolve`` of a URL, its remote calls retried under ``policy`` (None: the default)."""
    if url.startswith("faulty+file://"):  # a local disk that fails on command (wal.disk_faults)
        from .disk_faults import FaultyLocalStorage

        path = os.path.abspath(url[len("faulty+file://"):])
        return FaultyLocalStorage(path), path
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://"):] if url.startswith("file://") else url
        if storage_options:
            raise ValueError(f"storage_options given for local path {url!r}")
        return LocalStorage(), os.path.abspath(path)
    if url.split("://", 1)[0] in ("s3", "s3a"):
        storage_options = s3_defaults(storage_options, policy)
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return FsspecStorage(fs, policy), path.rstrip("/") or "/"


def s3_defaults(storage_options: dict | None, policy: retry.RetryPolicy | None = None) -> dict:
    """The seam's retry loop owns retries (wal.retry): botocore makes one attempt per call, and no
    call waits longer than half the deadline for a connection or an answer, nor a leader's longer
    than its request timeout for both (what the caller sets in ``config_kwargs`` stays). The
    read timeout bounds each wait for bytes, not a whole upload: a leader's writes are small."""
    options = dict(storage_options or {})
    config = dict(options.get("config_kwargs") or {})
    policy = policy or retry.default_policy()
    deadline = policy.deadline_s
    request = policy.request_timeout_s or 40.0  # a leader's: see RetryPolicy
    config.setdefault("retries", {"max_attempts": 1})
    config.setdefault("connect_timeout", min(10.0, deadline / 2, request / 4))
    config.setdefault("read_timeout", min(30.0, deadline / 2, request * 3 / 4))
    options["config_kwargs"] = config
    return options
