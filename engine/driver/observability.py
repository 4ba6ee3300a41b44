"""What a driver shows of itself: its events recorded (:mod:`sparkwal.engine.ui.recorder`) into its run's
status, its metrics and its checkpoint's event log, served at ``StreamingContext.uiWebUrl``.

Conf keys: ``spark.ui.enabled`` (Spark's; "false": no server, ``uiWebUrl`` None; events are still
recorded), ``spark.sparkwal.ui.port`` (unset: the first free port from 4050; 0: any free port),
``spark.streaming.ui.retainedBatches`` (Spark's, 1000: batches kept in memory and in the event
log), ``spark.sparkwal.eventLog.enabled`` ("true": a driver with a checkpoint keeps its events
under it).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkwal.checkpoint.event_log import EventLogWriter, read_events, read_runs
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.base.errors import SparkwalError

from .. import config
from ..errors import one_line
from ..ui.catalog import Catalog
from ..ui.metrics import Metrics
from ..ui.recorder import Recorder
from ..ui.server import UiServer
from ..ui.status import RunStatus

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkwal.checkpoint import Checkpoint
    from sparkwal.tracker import ReceivedBlockTracker
    from sparkwal.wal import Clock, LeaderInfo, Leadership, StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from ..state import StateSnapshots
    from ..upgrade_plan import UpgradePlan
    from .events import EventBus
    from .recovery import RestartFacts
    from .standby import Standby


log = logging.getLogger(__name__)


def stream_name(stream) -> str:
    """Spark's input stream names: ``SocketInputDStream`` #0 is "Socket Stream [0]"."""
    base = type(stream).__name__.replace("InputDStream", "Stream").replace("DStream", "Stream")
    return " ".join(re.findall(r"[A-Z][a-z0-9]*|[a-z0-9]+", base)) + f" [{stream.input_id}]"


class Observer:
    """A driver's UI, metrics and event log, handed what they show: the SparkContext, the settings,
    the clock, the batch duration, the event bus, the state snapshots and the checkpoint location;
    who leads the directory now (``current_leader``, its lock's record) and the standby still
    waiting, if any (``waiting_standby``). :meth:`open` and :meth:`on_active` are handed the
    rest as the start makes it."""

    def __init__(self, sc: SparkContext, settings: StreamingConf, clock: Clock, batch_ms: int, events: EventBus,
                 snapshots: StateSnapshots, location: StorageLocation | None,
                 current_leader: Callable[[], LeaderInfo | None], waiting_standby: Callable[[], Standby | None]):
        self._sc, self._settings, self._clock, self._batch_ms = sc, settings, clock, batch_ms
        self._events, self._snapshots, self._location = events, snapshots, location
        self._current_leader, self._waiting_standby = current_leader, waiting_standby
        self._block_tracker: ReceivedBlockTracker | None = None  # the leader's: its WAL's statistics
        directory = location.url if location is not None else None
        self.retained = settings[config.RETAINED_BATCHES]
        self.ui_enabled = settings[config.UI_ENABLED]
        self.port = settings[config.UI_PORT]
        self.log_enabled = settings[config.EVENT_LOG] and directory is not None
        self.events_dir = CheckpointLayout(directory).events if directory else None
        self.metrics = Metrics()
        self.status: RunStatus | None = None
        self.recorder: Recorder | None = None
        self.writer: EventLogWriter | None = None
        self.server: UiServer | None = None
        self.prior_runs: list[dict] = []
        self._leader_unreadable: str | None = None  # why the leadership could not be read, while it cannot

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    @property
    def _storage_options(self) -> dict | None:
        return self._location.options if self._location is not None else None

    def open(self, graph: DStreamGraph, standby: bool) -> None:
        """At ``start()``: the run of ``graph`` as far as it is known, and the server (a
        ``standby`` shows itself)."""
        sc = self._sc
        if self.events_dir is not None:
            try:
                self.prior_runs = read_runs(self.events_dir, self._storage_options)
            except Exception as e:  # noqa: BLE001  (a store's error: the UI shows this run only, WARNING says why)
                log.warning("could not read the event log in %s: %s", self.events_dir, e)
        run = {"kind": "standby" if standby else "new", "appId": sc.applicationId,
               "appName": sc.appName, "epoch": None, "startTime": self._clock.now_ms(),
               "batchDuration": self._batch_ms, "sparkUser": sc.sparkUser(), "sparkVersion": sc.version,
               "streams": [{"id": s.input_id, "name": stream_name(s), "receiver": bool(s.receiver_based)}
                           for s in graph.inputs]}
        self.status = RunStatus(run, self.retained)
        self.recorder = Recorder(self.status, self.metrics, clock=self._clock, sample=self.sample)
        self._events.subscribe(self.recorder)
        if self.ui_enabled:
            catalog = Catalog(self.events_dir, storage_options=self._storage_options, live=self.status,
                              prior_runs=self.prior_runs, retained_batches=self.retained, metrics=self.metrics,
                              extras=self.extras, spark_version=sc.version)
            host = os.environ.get("SPARK_LOCAL_IP") or self._settings.raw("spark.driver.bindAddress") or "0.0.0.0"
            self.server = UiServer(catalog, host, self.port, public_host=self._settings.raw("spark.driver.host"))
            log.info("the streaming UI is at %s/streaming/", self.server.url)

    def use_block_tracker(self, block_tracker: ReceivedBlockTracker | None) -> None:
        """The leading driver's block tracker, its WAL's statistics among the storage samples from
        the moment it is made (a restart's first re-run batches are sampled too)."""
        self._block_tracker = block_tracker

    def on_active(self, restart: RestartFacts, restored: Checkpoint | None, upgrade_plan: UpgradePlan | None,
                  lead: Leadership | None, block_tracker: ReceivedBlockTracker | None) -> None:
        """This driver leads now (fresh, restarted or took over): the run's facts (how it came to be,
        the checkpoint it restarted from, what an upgrade carried, the directory's held lock), its
        log, and its block tracker's WAL among the storage statistics."""
        self.use_block_tracker(block_tracker)
        kind = ("takeover" if restart.kind == "takeover" else
                "restart" if restored is not None or restart.rerun_batch_times or restart.skipped_batch_times
                else "new")
        facts = {"kind": kind, "epoch": lead.epoch if lead is not None else None, "startTime": self._clock.now_ms(),
                 "checkpointTime": restored.checkpoint_time_ms if restored is not None else None,
                 "rerunBatches": list(restart.rerun_batch_times), "skippedBatches": list(restart.skipped_batch_times)}
        if upgrade_plan is not None:  # what the upgrade to a changed program carried (bounded)
            facts["upgradePlan"] = [line[:500] for line in upgrade_plan.lines()[:100]]
        self.status.run.update(facts)
        self.recorder.expect_reruns(restart.rerun_batch_times)
        self.metrics.on_run(self.status.run, self.prior_runs)
        if not self.log_enabled:
            return
        try:
            self.writer = EventLogWriter(self.events_dir, self.status.run, storage_options=self._storage_options,
                                         retained_batches=self.retained, prior_batch_times=self._prior_batch_times,
                                         prior_runs=[r["path"] for r in self.prior_runs], lock=lead)
            self.recorder.log_to(self.writer)
        except Exception as e:  # noqa: BLE001  (a store's error: the stream runs on, WARNING says why)
            log.warning("could not open the event log in %s; the stream runs without it: %s",
                        self.events_dir, e)

    def _prior_batch_times(self) -> list[int]:
        times: list[int] = []
        for run in self.prior_runs[-3:]:  # older runs' batches are older than the retained ones anyway
            times.extend(r["batchTime"] for r in read_events(run["path"], self._storage_options)
                         if r.get("event") == "batch")
        return times

    def sample(self) -> dict:
        """The storage statistics shown beside the batches."""
        out: dict[str, dict] = {"wal": {}, "state": {}}
        logs = {"receivedBlockMetadata": getattr(self._block_tracker, "wal", None), "events": self.writer}
        for name, log_ in logs.items():
            if log_ is None:
                continue
            s = log_.wal_statistics() if log_ is self.writer else log_.statistics()
            out["wal"][name] = {
                "syncs": s.syncs, "syncSeconds": s.sync_seconds, "records": s.records_written,
                "bytes": s.bytes_written, "segments": s.segments, "tornTails": s.torn_tails_truncated}
        out["state"] = {name: dict(sizes) for name, sizes in self._snapshots.sizes.items()}
        return out

    def extras(self) -> dict:
        """What only the live driver knows: leadership, a standby's lag, Spark's own UI."""
        directory = self._location.url if self._location is not None else None
        out: dict = {"spark_ui": self._sc.uiWebUrl}
        try:
            leader = self._current_leader()
        except (OSError, SparkwalError) as e:  # the page says so (not "no leader"); the log once per outage
            if self._leader_unreadable is None:
                log.warning("could not read who leads %s (the streaming page says so until it can): %s",
                            directory, one_line(e))
            self._leader_unreadable = one_line(e)[:300]
            out["leader"] = {"epoch": "-", "holder": "-", "role": f"unknown: the leadership could not be read "
                                                                  f"({self._leader_unreadable})"}
            return out
        if self._leader_unreadable is not None:
            log.warning("who leads %s can be read again", directory)
            self._leader_unreadable = None
        standby = self._waiting_standby()
        if leader is not None:
            out["leader"] = {"epoch": leader.epoch, "holder": getattr(leader, "holder", None),
                             "role": "a standby" if standby is not None else "the leader"}
        if standby is not None:
            cp = getattr(standby.tail, "checkpoint", None)
            behind = (f"{(time.time() * 1000 - cp.checkpoint_time_ms) / 1000:.1f} s"
                      if cp is not None else "no checkpoint read yet")
            out["standby"] = {"holder": getattr(leader, "holder", None), "epoch": getattr(leader, "epoch", None),
                              "behind": behind}
        return out

    def close(self) -> None:
        """At stop (once; a second call does nothing). The server goes last: a page asked for
        during the stop still gets its answer."""
        recorder, writer, server = self.recorder, self.writer, self.server
        self.recorder = self.writer = self.server = None
        if recorder is not None:
            recorder.stopped()
            self._events.unsubscribe(recorder)
        if writer is not None:
            writer.close()
        if server is not None:
            server.stop()
