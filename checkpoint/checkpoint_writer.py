"""The DStream checkpoints' writer: one background thread writing them in order, each durable
before the next, under the driver's leadership (the files' format and how readers choose among
them: :mod:`sparkwal.checkpoint.checkpoint_file`)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sparkwal.base.service import Service
from sparkwal.wal.errors import FencedError
from sparkwal.wal.storage import Lock, StorageLocation, resolve

from .checkpoint_file import CHECKPOINT_FILE, Checkpoint, checkpoint_files
from .errors import CheckpointError
from .layout import CHECKPOINT_PREFIX

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointWriterStatistics:
    written: int
    failed_attempts: int
    queued: int
    latest_time_ms: int


class CheckpointWriter:
    """Writes checkpoints on one background thread, in submission order.

    ``write`` encodes on the caller's thread and queues; when the queue (``queue_size``) is full it
    waits up to ``put_timeout_s`` and then raises rather than block forever or drop silently. A
    failed write is retried ``max_attempts`` times; if it still fails, the error is reported to
    ``on_error`` and raised by the next ``write`` and by ``stop``. ``on_written(time_ms)`` runs after
    each checkpoint is durable (the engine cleans its WAL from there). ``lock``: the driver's
    leadership of the directory; a write is refused (FencedError, not retried) once it is lost.
    """

    def __init__(self, directory: str | StorageLocation, *, keep: int = 10, storage_options: dict | None = None,
                 max_attempts: int = 3, queue_size: int = 1000, put_timeout_s: float = 10.0,
                 on_written: Callable[[int], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None, lock: Lock | None = None):
        if keep < 2:
            raise ValueError(f"keep must be >= 2 (a checkpoint and its .bk), got {keep}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.directory = directory
        self._storage, self._dir = resolve(directory, storage_options)
        self.keep = keep  #: checkpoint files kept (mains and .bk together)
        self._max_attempts = max_attempts
        self._put_timeout = put_timeout_s
        self._on_written = on_written
        self._on_error = on_error
        self._lock = lock
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._latest = -1
        self.last_written_bytes = 0  #: the size of the newest checkpoint written
        #: checkpoints queued so far, and the number in that order of the last one written (all
        #: are written in order): a checkpoint queued after some moment is durable once
        #: ``last_written_seq`` passes ``queued`` as it was then
        self.queued = 0
        self.last_written_seq = 0
        self._written = 0
        self._failed_attempts = 0
        self._error: BaseException | None = None
        self._stopped = False
        #: what this writer knows of its directory, so that a write costs no listing and no read
        #: (it leads the directory: nobody else writes checkpoints there): the checkpoint files'
        #: paths, listed once, then kept up to date; the last file written and its bytes
        self._files: list[tuple[int, bool, str]] | None = None
        self._last_written: tuple[str, bytes] | None = None
        self._versions: dict[str, str] = {}  # on object stores: the version of each file it wrote
        self._progress = threading.Condition()  # notified when a checkpoint is written or fails
        self._thread = Service("CheckpointWriter", self._run).start()

    def write(self, checkpoint: Checkpoint) -> None:
        """Queue ``checkpoint`` (its number in order is :attr:`queued` after the call)."""
        self._raise_if_failed()
        if self._stopped:
            raise CheckpointError(f"{self.directory}: write after stop()")
        blob = checkpoint.encode()
        try:
            self._queue.put((checkpoint.checkpoint_time_ms, blob, self.queued + 1), timeout=self._put_timeout)
            self.queued += 1
        except queue.Full:
            raise CheckpointError(
                f"{self.directory}: {self._queue.qsize()} checkpoints are waiting to be written; "
                f"checkpoint {checkpoint.checkpoint_time_ms} not queued within "
                f"{self._put_timeout} s (storage too slow?)") from None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far is durable (not for ``on_written``, which runs
        after); raises if a checkpoint failed, or :class:`CheckpointError` after ``timeout``
        seconds."""
        wanted = self.queued
        with self._progress:
            done = self._progress.wait_for(
                lambda: self.last_written_seq >= wanted or self._error is not None, timeout)
        self._raise_if_failed()
        if not done:
            raise CheckpointError(f"{self.directory}: checkpoint {wanted} not written within {timeout} s")

    def stop(self, timeout: float | None = None) -> None:
        """Write everything queued, then stop the thread; raises if a checkpoint failed."""
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
        if not self._thread.join(timeout):
            raise CheckpointError(f"{self.directory}: checkpoint writer did not finish in {timeout} s")
        self._raise_if_failed()

    def statistics(self) -> CheckpointWriterStatistics:
        return CheckpointWriterStatistics(self._written, self._failed_attempts, self._queue.qsize(),
                                          self._latest)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CheckpointError(f"{self.directory}: writing a checkpoint failed: {self._error}"
                                  ) from self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._write_one(*item)
            finally:
                with self._progress:
                    self._progress.notify_all()

    def _write_one(self, time_ms: int, blob: bytes, seq: int) -> None:
        path = self._storage.join(self._dir, f"{CHECKPOINT_PREFIX}{max(self._latest, time_ms)}")
        for attempt in range(1, self._max_attempts + 1):
            try:
                if self._lock is not None:
                    self._lock.check()
                if self._files is None:
                    self._storage.makedirs(self._dir)
                    self._files = checkpoint_files(self._storage, self._dir)
                    # an earlier run's newest name too: see the module's docstring
                    self._latest = max([self._latest, *(t for t, _main, _p in self._files)])
                self._latest = max(self._latest, time_ms)
                path = self._storage.join(self._dir, f"{CHECKPOINT_PREFIX}{self._latest}")
                previous = self._previous(path)
                if previous is not None:
                    self._put(path + ".bk", previous)
                    self._note(path + ".bk")
                self._put(path, blob)
                self._note(path)
                self._last_written = (path, blob)
                break
            except FencedError as e:  # another driver leads now: nothing more may be written
                self._error = e
                if self._on_error is not None:
                    self._on_error(e)
                return
            except Exception as e:  # noqa: BLE001
                self._failed_attempts += 1
                log.warning("writing checkpoint %s failed (attempt %d of %d): %s",
                            path, attempt, self._max_attempts, e)
                if attempt == self._max_attempts:
                    log.error("checkpoint %s NOT written after %d attempts", path, attempt)
                    self._error = e
                    if self._on_error is not None:
                        self._on_error(e)
                    return
        self._written += 1
        self.last_written_bytes = len(blob)  # read by on_written (the same thread)
        with self._progress:  # durable: flush() returns, whatever on_written does next
            self.last_written_seq = seq
            self._progress.notify_all()
        self._retain()
        if self._on_written is not None:
            self._on_written(time_ms)

    def _put(self, path: str, blob: bytes) -> None:
        """Write ``path``; on a store with conditional writes, only over the version this writer
        last wrote or read there (none: only if absent), so that a late write of an old leader,
        held in the network, cannot land over what this one wrote since: it finds the object
        changed. A condition that fails means another driver writes here: FencedError."""
        if not self._storage.conditional_writes:  # a local disk: its leader cannot be paused and replaced
            self._storage.put(path, blob)
            return
        if path in self._versions:
            version = self._versions[path]
        elif all(p != path for _t, _m, p in self._files or ()):  # not there when listed: create it
            version = None
        else:
            found = self._storage.read_versioned(path)
            version = found[1] if found is not None else None
        new = self._storage.put_if_version(path, blob, version, fenced=True)
        if new is None:
            raise FencedError(f"{self._storage.url(path)} changed since this writer wrote or read it: "
                              "another driver writes checkpoints here")
        self._versions[path] = new

    def _previous(self, path: str) -> bytes | None:
        """What ``path`` holds now (to keep as its ``.bk``): known without a read when this
        writer wrote it last or it is not there."""
        if self._last_written is not None and self._last_written[0] == path:
            return self._last_written[1]
        if all(p != path for _t, _m, p in self._files or ()):
            return None
        try:
            return self._storage.read_file(path)
        except FileNotFoundError:
            return None

    def _note(self, path: str) -> None:
        m = CHECKPOINT_FILE.fullmatch(path.rsplit("/", 1)[-1])
        if m is None or self._files is None:
            return
        entry = (int(m.group(1)), m.group(2) is None, path)
        if entry not in self._files:
            self._files.append(entry)
            self._files.sort()

    def _retain(self) -> None:
        files = self._files or []
        for entry in files[:max(0, len(files) - self.keep)]:
            try:
                self._storage.delete(entry[2])
                files.remove(entry)
                self._versions.pop(entry[2], None)
            except Exception as e:  # noqa: BLE001  tried again after the next write
                log.warning("could not delete old checkpoint %s: %s", entry[2], e)
