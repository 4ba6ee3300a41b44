"""Which driver runs a UI shows: the live one (if any) and every run in a checkpoint's event log.

Each run is an application, as Spark lists them under ``/api/v1/applications``: its id is the
run's ``sc.applicationId`` (a run that shares its id with a later one, as a restart in the same
SparkContext does, gets ``<appId>-<run>``, so every run stays reachable). Runs other than the live
one are replayed from the event log when first asked for and kept (at most ``CACHED`` of them);
the newest run of a log that may still be written is replayed again after ``FRESH_S``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from sparkwal.checkpoint.event_log import read_events, read_runs
from sparkwal.wal.storage import resolve

from .status import RunStatus, recoveries, spark_date

log = logging.getLogger(__name__)

CACHED = 8
RENDERED = 64
FRESH_S = 2.0


class Catalog:
    def __init__(self, events_dir: str | None, *, storage_options: dict | None = None, live: RunStatus | None = None,
                 prior_runs: list[dict] | None = None, retained_batches: int = 1000, metrics=None, extras=None,
                 spark_version: str = ""):
        self.events_dir = events_dir
        self.storage_options = storage_options
        self.live = live
        self._prior = prior_runs  # None: read the log at every listing (the history server)
        self.retained_batches = retained_batches
        self.metrics = metrics
        self.extras = extras or (dict)
        self.spark_version = spark_version
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._last_event: dict = {}  # run path -> its last event's time
        self._rendered: collections.OrderedDict = collections.OrderedDict()  # see cached()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ runs

    def runs(self) -> list[dict]:
        if self._prior is None:
            runs = read_runs(self.events_dir, self.storage_options) if self.events_dir else []
        else:
            runs = list(self._prior)
        if self.live is not None:
            runs.append(self.live.run)
        return runs

    def app_ids(self, runs: list[dict]) -> list[str]:
        ids = []
        for i, run in enumerate(runs):
            app = str(run.get("appId") or run.get("path", "").rstrip("/").rsplit("/", 1)[-1] or f"run-{i}")
            later = {str(r.get("appId")) for r in runs[i + 1:]}
            run_dir = run["path"].rstrip("/").rsplit("/", 1)[-1] if run.get("path") else None
            ids.append(f"{app}-{run_dir}" if app in later and run_dir else app)
        return ids

    def default_app(self) -> str | None:
        runs = self.runs()
        return self.app_ids(runs)[-1] if runs else None

    def find(self, app_id: str) -> tuple[dict, RunStatus] | None:
        runs = self.runs()
        for run, rid in zip(runs, self.app_ids(runs)):
            if rid == app_id:
                return run, self.status_of(run, newest=run is runs[-1])
        return None

    def status_of(self, run: dict, newest: bool = False) -> RunStatus:
        if self.live is not None and run is self.live.run:
            return self.live
        key = run.get("path")
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and not (newest and not run.get("endTime") and time.monotonic() - hit[0] > FRESH_S):
                self._cache.move_to_end(key)
                return hit[1]
        status = RunStatus(run, self.retained_batches)
        if key:
            for record in read_events(key, self.storage_options):
                if record.get("event") == "batch":
                    record["replayed"] = True
                status.apply(record)
        with self._lock:
            self._cache[key] = (time.monotonic(), status)
            while len(self._cache) > CACHED:
                self._cache.popitem(last=False)
        return status

    def last_events(self, runs: list[dict]) -> dict:
        """Run path -> its last recorded event's time (a run that is not the newest wrote its
        last event long ago: it is read once and remembered; the newest is read again)."""
        for run in runs[:-1]:
            key = run.get("path")
            if key not in self._last_event:
                self._last_event[key] = self.status_of(run, newest=False).last_event_ms
        out = dict(self._last_event)
        if runs and not self.is_live(runs[-1]):
            out[runs[-1].get("path")] = self.status_of(runs[-1], newest=True).last_event_ms
        return out

    def is_live(self, run: dict) -> bool:
        return self.live is not None and run is self.live.run

    def endings(self, runs: list[dict]) -> list[str]:
        """How each run ended: "stopped" (its end recorded), "fenced", "running" (this process's
        run, or the newest run while a driver leads the checkpoint at its epoch) or "killed" (no
        end recorded: it ended at its last recorded event). Reads the leadership, takes nothing."""
        leader = None
        if runs and not runs[-1].get("endTime") and not self.is_live(runs[-1]) and self.events_dir:
            try:
                storage, root = resolve(self.events_dir.rstrip("/").rpartition("/")[0], self.storage_options)
                leader = storage.leader(root)
            except Exception as e:  # noqa: BLE001  unknown: said as killed, the safe reading
                log.warning("could not read the leadership of %s: %s", self.events_dir, e)
        out = []
        for i, run in enumerate(runs):
            if run.get("fenced"):
                out.append("fenced")
            elif run.get("endTime"):
                out.append("stopped")
            elif self.is_live(run) or (i == len(runs) - 1 and leader is not None and leader.held
                                       and leader.epoch == run.get("epoch")):
                out.append("running")
            else:
                out.append("killed")
        return out

    def recoveries(self) -> list[dict]:
        """Every run, with the downtime before it, how it ended and its page's id."""
        runs = self.runs()
        return recoveries(runs, self.last_events(runs), self.endings(runs), self.app_ids(runs))

    def cached(self, key, version, render):
        """``render()``, or what it returned for ``key`` at the same ``version`` (a page asked for
        again before the next event costs a dictionary lookup; at most ``RENDERED`` are kept)."""
        with self._lock:
            hit = self._rendered.get(key)
            if hit is not None and hit[0] == version:
                self._rendered.move_to_end(key)
                return hit[1]
        value = render()
        with self._lock:
            self._rendered[key] = (version, value)
            while len(self._rendered) > RENDERED:
                self._rendered.popitem(last=False)
        return value

    # ------------------------------------------------------------------ Spark's application list

    def applications(self) -> list[dict]:
        """Spark's application list. A run whose end was recorded is ``completed``; one still
        running is not, with Spark's "no end yet" (``endTimeEpoch`` -1); a killed run is not
        completed either, and ends at its last recorded event (``ended: "killed"`` says so)."""
        runs = self.runs()
        last, endings = self.last_events(runs), self.endings(runs)
        out = []
        for run, app_id, ended in zip(runs, self.app_ids(runs), endings):
            start = run.get("startTime") or 0
            end = run.get("endTime")
            if ended == "killed":
                end = max(last.get(run.get("path")) or start, start)
            updated = end or int(time.time() * 1000)
            out.append({"id": app_id, "name": run.get("appName", ""), "attempts": [{
                "startTime": spark_date(start), "endTime": spark_date(end) or "1969-12-31T23:59:59.999GMT",
                "lastUpdated": spark_date(updated), "duration": (end or updated) - start,
                "sparkUser": run.get("sparkUser", ""), "completed": ended in ("stopped", "fenced"),
                "ended": ended, "appSparkVersion": run.get("sparkVersion", self.spark_version),
                "startTimeEpoch": start, "endTimeEpoch": end if end else -1, "lastUpdatedEpoch": updated}]})
        return sorted(out, key=lambda a: -a["attempts"][0]["startTimeEpoch"])
