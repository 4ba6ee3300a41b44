"""The driver runs' event log: what each run of a driver on a checkpoint did, kept with the checkpoint.

The Streaming page, the REST API and ``sparkwal ui`` / ``sparkwal status`` read it, so a
driver's history outlives the driver (Spark's Streaming tab forgets everything when it dies).

Layout, under the checkpoint's ``events/`` (:class:`sparkwal.checkpoint.layout.CheckpointLayout.events`)::

    events/run-<startMs:013d>-e<epoch>/run.json   one driver run: a JSON object, replaced whole
    events/run-<startMs:013d>-e<epoch>/log/       its events: a wal.FileBasedWriteAheadLog

``run.json`` (written when the run starts, replaced when it learns more)::

    {"version": 1, "kind": "new" | "restart" | "takeover", "appId", "appName", "epoch",
     "startTime": ms, "batchDuration": ms, "checkpointTime": ms | null,
     "rerunBatches": [ms, ...], "skippedBatches": [ms, ...],
     "streams": [{"id", "name", "receiver": bool}, ...], "sparkUser", "sparkVersion",
     later: "firstNewBatch": ms, "takeoverMs": ms, "endTime": ms, "fenced": reason}

Each WAL record is one event, a UTF-8 JSON object with an ``"event"`` key and ``"time"`` (ms)::

    batch       a completed batch: batchTime, submissionTime, processingStartTime,
                processingEndTime, inputs {streamId: records}, ops [{id, name, description,
                startTime, endTime, failureReason | null, jobIds, breakdown {phase: ms}}],
                breakdown {phase: ms} (where its time went; older records have none)
    checkpoint  checkpointTime, epoch, tookMs, bytes
    receiver    kind (started | error | stopped), streamId, name, active, executorId, host,
                lastErrorTime, lastErrorMessage, lastError
    backlog     state, schedulingDelay, backlog
    statistics  wal {log: {syncs, records, bytes, segments, tornTails, syncSeconds}},
                state {stream: {keys, fullBytes, deltaBytes}}  (sampled after batches)
    restarted   recovery (checkpoint | upgrade | takeover), checkpointTime, rerunBatches, skippedBatches
    takeover    epoch, resumedFrom, tookMs (from holding the leadership to running)
    fenced      reason
    stopped     (a stop the driver lived to write)

Retention: the newest ``retained_batches`` batch records over every run (Spark's
``spark.streaming.ui.retainedBatches``), plus every run's ``run.json`` (a few hundred bytes
each); older WAL segments are deleted by batch time. Events are written off the batch's path by
one thread, flushed to the OS (not fsync'ed: a killed driver loses none, a machine crash may
lose the last second; it is a record, not a source of truth). A queue of ``max_queued``
events bounds memory when storage is slower than the driver: past it, events are dropped and
counted (``statistics().dropped``).
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from sparkwal.wal import CorruptRecordError, Durability, FencedError, FileBasedWriteAheadLog, WalError
from sparkwal.wal.inspect import trim_preallocated
from sparkwal.wal.storage import resolve
from sparkwal.base.service import Service

log = logging.getLogger(__name__)

VERSION = 1
RUN_FILE = "run.json"
LOG_DIR = "log"
RUN_DIR = re.compile(r"run-(\d{13})-e(\d+)")


def run_name(start_ms: int, epoch: int | None) -> str:
    return f"run-{start_ms:013d}-e{epoch or 0}"


def encode(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":"), default=str).encode()


@dataclass(frozen=True)
class EventLogStatistics:
    records_written: int
    bytes_written: int
    dropped: int  #: events not written: the queue was full (storage slower than the driver)
    write_failures: int
    queued: int


def read_runs(events_dir: str, storage_options: dict | None = None) -> list[dict]:
    """Every run's ``run.json``, oldest first, each with ``"path"`` (its directory) added. A run
    whose file is missing or unreadable appears with ``"error"`` saying why."""
    storage, root = resolve(events_dir, storage_options)
    if not storage.exists(root):
        return []
    runs = []
    for name in storage.list_dirs(root):
        name = name.rstrip("/").rsplit("/", 1)[-1]
        if not RUN_DIR.fullmatch(name):
            continue
        path = storage.url(storage.join(root, name))  # a URL: callers resolve it again
        run_file = storage.join(storage.join(root, name), RUN_FILE)
        try:
            run = json.loads(storage.read_file(run_file))
            if not isinstance(run, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            matched = RUN_DIR.fullmatch(name)
            assert matched is not None  # the runs are listed by this pattern
            start, epoch = matched.groups()
            run = {"startTime": int(start), "epoch": int(epoch), "error": f"{storage.url(run_file)}: {e}"}
        run["path"] = path
        runs.append(run)
    runs.sort(key=lambda r: (r.get("startTime", 0), r["path"]))
    return runs


def read_events(run_path: str, storage_options: dict | None = None) -> Iterator[dict]:
    """A run's events, oldest first. A damaged record ends the reading with a warning naming it
    (what came before is still given); a torn tail is the WAL's to skip."""
    storage, root = resolve(run_path, storage_options)
    wal = FileBasedWriteAheadLog(storage.url(storage.join(root, LOG_DIR)), storage_options=storage_options)
    try:
        for data in wal.read_all():
            try:
                record = json.loads(data)
            except ValueError:
                log.warning("%s: an event that is not JSON; the rest of this run's log is skipped", run_path)
                return
            if isinstance(record, dict):
                yield record
    except (CorruptRecordError, WalError) as e:
        log.warning("%s: %s; the rest of this run's log is skipped", run_path, e)
    finally:
        wal.close()


class EventLogWriter:
    """Writes one run: its ``run.json`` at once, then its events from a thread of its own.

    ``prior_batch_times``: the batches earlier runs' logs retain (the oldest are cleaned first),
    or a callable that reads them: it is called on the writer's thread, before the first write,
    so that a driver taking over does not wait for earlier runs' logs to be read."""

    def __init__(self, events_dir: str, run: dict, *, storage_options: dict | None = None,
                 retained_batches: int = 1000,
                 prior_batch_times: Iterable[int] | Callable[[], Iterable[int]] = (),
                 prior_runs: Sequence[str] = (), lock=None, max_queued: int = 10_000):
        self._storage, root = resolve(events_dir, storage_options)
        self._storage_options = storage_options
        self.run = {"version": VERSION, **run}
        self._dir = self._storage.join(root, run_name(run["startTime"], run.get("epoch")))
        self.path = self._storage.url(self._dir)  #: this run's directory, as a URL
        self._storage.makedirs(self._dir)
        self._put_run()
        batch_ms = max(1, int(run.get("batchDuration") or 1000))
        # segments of about a tenth of the retained batches: the log holds at most ~10% more
        rolling_s = max(1.0, batch_ms * retained_batches / 10 / 1000)
        self._wal = FileBasedWriteAheadLog(self._storage.url(self._storage.join(self._dir, LOG_DIR)),
                                           rolling_interval_s=rolling_s,
                                           storage_options=storage_options, durability=Durability.FLUSH, lock=lock)
        self._retained: collections.deque = collections.deque(maxlen=retained_batches)
        self._prior_batch_times = prior_batch_times
        self._clean_every = max(1, retained_batches // 10)
        self._since_clean = 0
        self._prior_runs = list(prior_runs)
        self._queue: queue.Queue = queue.Queue(max_queued)
        self._lock = threading.Lock()
        self._records = self._bytes = self._dropped = self._failures = 0
        self._fenced: FencedError | None = None  # another driver leads: nothing more is written
        self._thread = Service("sparkwal-event-log", self._write_loop).start()

    def append(self, record: dict) -> None:
        """Queue one event (never blocks the caller)."""
        try:
            self._queue.put_nowait(("event", record))
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def update_run(self, **fields) -> None:
        """Add ``fields`` to ``run.json`` (replaced whole, after the events queued before)."""
        try:
            self._queue.put_nowait(("run", fields))
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until what was queued before is written; False on timeout."""
        done = threading.Event()
        self._queue.put(("flush", done))
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then close the log."""
        self._queue.put(("close", None))
        if not self._thread.join(timeout_s):
            log.warning("the event log %s did not finish writing in %s s", self.path, timeout_s)
            return
        self._wal.close()

    def wal_statistics(self):
        """The statistics of this run's WAL (:class:`sparkwal.wal.WalStatistics`)."""
        return self._wal.statistics()

    def statistics(self) -> EventLogStatistics:
        with self._lock:
            return EventLogStatistics(self._records, self._bytes, self._dropped, self._failures,
                                      self._queue.qsize())

    # ------------------------------------------------------------------ the writer's thread

    def _put_run(self) -> None:
        self._storage.put(self._storage.join(self._dir, RUN_FILE), encode(self.run))

    def _read_prior_batch_times(self) -> None:
        prior = self._prior_batch_times
        try:
            self._retained.extend(sorted(prior() if callable(prior) else prior))
        except Exception as e:  # noqa: BLE001  earlier runs' segments are then cleaned later
            log.warning("could not read the earlier runs' batches in %s: %s", self._dir, e)
        self._prior_batch_times = ()

    def _trim_prior_runs(self) -> None:
        """Earlier runs killed while writing left space reserved ahead of their last records:
        cut it (this run leads the checkpoint now; they write nothing more)."""
        for run_path in self._prior_runs:
            try:
                trim_preallocated(f"{run_path.rstrip('/')}/{LOG_DIR}", self._storage_options)
            except Exception as e:  # noqa: BLE001  left for the next run
                log.warning("could not trim the event log of %s: %s", run_path, e)

    def _write_loop(self) -> None:
        self._read_prior_batch_times()
        self._trim_prior_runs()
        closing = False
        while not closing:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            events, run_changed, flushed = [], False, []
            for kind, value in items:
                if kind == "event":
                    events.append(value)
                elif kind == "run":
                    self.run.update(value)
                    run_changed = True
                elif kind == "flush":
                    flushed.append(value)
                else:
                    closing = True
            try:
                if self._fenced is not None:
                    raise self._fenced
                self._write(events)
                if run_changed:
                    self._put_run()
            except FencedError as e:  # said once: every later write would be refused alike
                with self._lock:
                    self._failures += 1
                if self._fenced is None:
                    self._fenced = e
                    log.warning("the event log %s stops: %s", self.path, e)
            except Exception as e:  # noqa: BLE001  counted and said in one line; the app goes on
                with self._lock:
                    self._failures += 1
                log.warning("could not write %d events to %s: %s", len(events), self.path, e)
            for done in flushed:
                done.set()

    def _write(self, events: list[dict]) -> None:
        if not events:
            return
        data = [encode(e) for e in events]
        self._wal.write_many(data, max(int(e.get("time", 0)) for e in events))
        with self._lock:
            self._records += len(data)
            self._bytes += sum(map(len, data))
        batches = [e["batchTime"] for e in events if e.get("event") == "batch"]
        self._retained.extend(batches)
        self._since_clean += len(batches)
        if self._since_clean >= self._clean_every and len(self._retained) == self._retained.maxlen:
            self._since_clean = 0
            self._clean(self._retained[0])

    def _clean(self, thresh_ms: int) -> None:
        """Delete segments holding only batches older than the retained ones, in every run."""
        self._wal.clean(thresh_ms)
        for run_path in self._prior_runs:
            reader = FileBasedWriteAheadLog(f"{run_path.rstrip('/')}/{LOG_DIR}", storage_options=self._storage_options)
            try:
                reader.clean(thresh_ms, wait_for_completion=True)
            finally:
                reader.close()
