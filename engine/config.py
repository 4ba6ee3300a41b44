"""Every setting sparkwal reads, declared once: key, type, default, Spark's unit for a bare
number, and a line of doc; read once per driver (:class:`StreamingConf`).

Spark's own keys keep Spark's names, defaults and units (``spark.streaming.blockInterval`` is read
with ``getTimeAsMs`` in Spark's ``ReceiverSupervisorImpl.scala``, so a bare ``200`` is 200 ms;
``spark.streaming.fileStream.minRememberDuration`` with ``getTimeAsSeconds`` in
``FileInputDStream.scala``, so a bare ``60`` is 60 s); sparkwal's own are ``spark.sparkwal.*``.
Where sparkwal's default differs from Spark's, the entry's doc says so. A bad value is one
:class:`ConfigError` naming the key and the value, raised when the driver is made (and by the main
job before its JVM starts, :func:`check`). ``docs/configuration.md`` is :func:`settings_table`'s
output (a test keeps them equal: ``python -m sparkwal.engine.config > docs/configuration.md``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import EngineError


class ConfigError(EngineError, ValueError):
    """A setting's value that sparkwal cannot read (the message names the key and the value)."""


#: Spark's time suffixes (JavaUtils.timeSuffixes), read as milliseconds
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|min|h|d)?\s*")
_SCALE_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
BOOLEANS = ("true", "false")


@dataclass(frozen=True)
class ConfEntry:
    """One setting. ``kind``: ``bool``, ``int``, ``float``, ``duration`` (read as milliseconds;
    a bare number is in ``unit``), ``choice`` (one of ``choices``) or ``string``. ``default`` is
    the typed value when the key is unset (None: unset means "not set", as the doc says);
    ``fallback`` names the key read when this one is unset; ``minimum`` bounds numbers."""

    key: str
    kind: str
    default: object
    doc: str
    unit: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    fallback: str | None = None

    def parse(self, value: str):
        text = str(value).strip()
        if self.kind == "bool":
            if text.lower() not in BOOLEANS:
                raise self.error(value, "true or false")
            return text.lower() == "true"
        if self.kind == "choice":
            if text.lower() not in self.choices:
                *most, last = self.choices
                raise self.error(value, f"{', '.join(most)} or {last}" if most else last)
            return text.lower()
        if self.kind == "string":
            return text
        if self.kind == "duration":
            m = _DURATION.fullmatch(text)
            if not m:
                raise self.error(value, "a duration such as 30s or 500ms")
            number: float = int(float(m.group(1)) * _SCALE_MS[m.group(2) or self.unit])
        else:
            parsed: float | None
            try:
                parsed = int(text) if self.kind == "int" else float(text)
            except ValueError:
                parsed = None
            if parsed is None or parsed != parsed:  # not a number, or NaN
                raise self.error(value, self.wanted_number())
            number = parsed
        if (self.minimum is not None and number < self.minimum) or \
                (self.maximum is not None and number > self.maximum):
            raise self.error(value, self.wanted_number())
        return number

    def error(self, value: str, wanted: str) -> ConfigError:
        return ConfigError(f"{self.key} must be {wanted}, got {value!r}")

    def wanted_number(self) -> str:
        what = {"int": "a whole number", "float": "a number", "duration": "a duration"}[self.kind]
        if self.kind == "duration":
            return f"{what} of at least {self.minimum:g} ms" if self.minimum else "a duration such as 30s or 500ms"
        if self.minimum is not None and self.maximum is not None:
            return f"{what} from {self.minimum:g} to {self.maximum:g}"
        return f"{what} of at least {self.minimum:g}" if self.minimum is not None else what

    def default_text(self) -> str:
        if self.default is None:
            return "unset"
        if self.kind == "bool":
            return str(self.default).lower()
        if self.kind == "duration":
            ms = int(str(self.default))
            return f"{ms // 1000}s" if ms % 1000 == 0 and self.unit == "s" else f"{ms}ms"
        return str(self.default)


ENTRIES: dict[str, ConfEntry] = {}


def _entry(key: str, kind: str, default: object, doc: str, **more) -> ConfEntry:
    entry = ConfEntry(key, kind, default, doc, **more)
    ENTRIES[key] = entry
    return entry


# ---------------------------------------------------------------- the driver and its batches
CONCURRENT_JOBS = _entry("spark.streaming.concurrentJobs", "int", 1,
                         "Spark's: batches whose jobs may run at once", minimum=1)
GRACEFUL_STOP_TIMEOUT = _entry("spark.streaming.gracefulStopTimeout", "duration", None,
                               "Spark's: how long a graceful stop waits (unset: 10 batch intervals)",
                               unit="ms", minimum=1)
STOP_GRACEFULLY_ON_SHUTDOWN = _entry("spark.streaming.stopGracefullyOnShutdown", "bool", False,
                                     "Spark's: SIGTERM/SIGINT stop the stream gracefully")
MIN_REMEMBER = _entry("spark.streaming.minRememberDuration", "duration", 60_000,
                      "Spark's: how long a file stream remembers the files it took", unit="s", minimum=1)
FILE_MIN_REMEMBER = _entry("spark.streaming.fileStream.minRememberDuration", "duration", None,
                           "Spark's: the same for file streams (unset: spark.streaming.minRememberDuration)",
                           unit="s", minimum=1, fallback=MIN_REMEMBER.key)
LEASE_TIMEOUT = _entry("spark.streaming.driver.leaseTimeout", "duration", 30_000,
                       "how long a dead driver's leadership lease holds on an object store", unit="s", minimum=1)
LEADER_NETWORK_FS = _entry(
    "spark.sparkwal.leader.allowNetworkFilesystem", "bool", False,
    "a local checkpoint directory on a network file system (NFS, SMB, a FUSE mount of a remote store) may be led "
    "though its flock is no lock between machines: only where nothing else ever starts a driver on it; false: "
    "start() refuses, naming the file system")
LEADER_STALL_INTERVALS = _entry(
    "spark.sparkwal.leader.stallIntervals", "int", 0,
    "a leader that completes no batch for this many batch intervals while batches are due gives its leadership "
    "up to a standby and stops as fenced (0: never; set it well above the longest batch)", minimum=0)
COALESCE_DOWNTIME = _entry(
    "spark.sparkwal.recovery.coalesceDowntime", "bool", False,
    "a restart runs the input of the batch times it missed while down as one batch, the first new one, "
    "where the program allows it (no windows; state without timeouts); false: Spark's, every missed batch time runs")
EMPTY_BATCH_SHORTCUT = _entry(
    "spark.sparkwal.emptyBatch.shortcut", "bool", True,
    "a batch whose inputs are empty builds no RDDs for sparkwal's own operations and runs no tasks "
    "for them: their result is an RDD of no partitions (false: Spark's, e.g. N empty partitions after a shuffle)")
BACKLOG_WARN_INTERVALS = _entry("spark.sparkwal.backlog.warnIntervals", "float", 3.0,
                                "a scheduling delay of this many batch intervals is logged as a backlog",
                                minimum=0)
BATCH_LOG = _entry("spark.sparkwal.batchLog.enabled", "choice", "auto",
                   "offsets/commits logs: auto (with a direct input), true (every graph) or false",
                   choices=("auto", "true", "false"))
BATCH_LOG_FSYNC = _entry("spark.sparkwal.batchLog.fsync", "bool", True,
                         "the batch log's files are synced before a batch runs")
MIN_BATCHES_TO_RETAIN = _entry("spark.sql.streaming.minBatchesToRetain", "int", 100,
                               "Spark's: batch log entries kept", minimum=1)
STANDBY_PRELOAD_STATE = _entry("spark.sparkwal.standby.preloadState", "bool", True,
                               "a hot standby reads and caches the leader's state ahead of a takeover")
HANDOVER_TEARDOWN_WAIT = _entry(
    "spark.sparkwal.handover.teardownWait", "duration", 10_000,
    "after sparkwal checkpoint handover, how long the old leader's stop, its leadership given up, waits for the "
    "new leader's first batch before it returns and Spark is stopped (its teardown beside the takeover slowed it); "
    "a checkpoint directory on a local filesystem only; 0: no wait", unit="ms", minimum=0)
TAKEOVER_RECEIVER_HOLD = _entry(
    "spark.sparkwal.standby.receiverStartWait", "duration", 1_000,
    "a hot standby that takes over with batches to re-run (a handover's: those due while the leadership moved) "
    "launches its receivers once the first has completed (its blocks were all received before; receivers starting "
    "beside it slowed it), at most this long after the takeover; 0: at once", unit="ms", minimum=0)
UPGRADE_ALLOW_DROP = _entry(
    "spark.sparkwal.upgrade.allowDrop", "string", None,
    "getOrCreate(..., upgrade=True): the checkpoint's inputs and states (uids or identities, comma-separated) the "
    "new version may drop; unset: an upgrade that would lose one is refused, naming it")
ALLOW_OTHER_APP = _entry(
    "spark.sparkwal.recover.allowOtherApp", "bool", False,
    "getOrCreate recovers a checkpoint written by an application of another spark.app.name, running that "
    "checkpoint's program; false: refused in one line naming both applications")
CONSOLE_QUIET = _entry(
    "spark.sparkwal.console.quiet", "bool", True,
    "when the stream starts, Spark's console progress bar is stopped and its default WARN log level made ERROR "
    "(see sparkwal.engine.console); false, or a level or progress bar the app set itself: left as they are")
ALLOW_LIVE_SOURCE = _entry(
    "spark.sparkwal.copy.allowLiveSource", "bool", False,
    "a driver starts on a copy (sparkwal checkpoint copy) while a live driver leads the copy's source, both then "
    "consuming the same inputs; false: start() refuses, naming both directories and the source's driver")

# ---------------------------------------------------------------- storage
STORAGE_DEADLINE = _entry("spark.sparkwal.storage.deadline", "duration", 60_000,
                          "how long a storage call may keep failing transiently before the app stops",
                          unit="s", minimum=1)

# ---------------------------------------------------------------- receivers
RECEIVER_WAL = _entry("spark.streaming.receiver.writeAheadLog.enable", "bool", True,
                      "receivers' blocks go to a WAL under the checkpoint (Spark's default: false)")
RECEIVER_WAL_ROLLING = _entry("spark.streaming.receiver.writeAheadLog.rollingIntervalSecs", "float", 60.0,
                              "Spark's: seconds per receiver WAL segment", minimum=1)
BLOCK_INTERVAL = _entry("spark.streaming.blockInterval", "duration", 200,
                        "Spark's: how often a receiver cuts a block", unit="ms", minimum=1)
BLOCK_QUEUE_SIZE = _entry("spark.streaming.blockQueueSize", "int", 10,
                          "Spark's: blocks a receiver queues for storing", minimum=1)
MAX_BUFFERED_RECORDS = _entry("spark.streaming.receiver.maxBufferedRecords", "int", 100_000,
                              "records a receiver buffers before store() waits", minimum=1)
MAX_UNPROCESSED_BYTES = _entry("spark.streaming.receiver.maxUnprocessedBytes", "int", 256 << 20,
                               "bytes of received blocks not yet processed before receivers wait", minimum=1)
RECEIVER_PRECOMPUTE = _entry(
    "spark.sparkwal.receiver.precompute", "bool", True,
    "receivers run each block through the per-record operations after their stream up to the first "
    "combineByKey/reduceByKey as they store it; a batch whose every block came with its result builds that "
    "stream's RDD from them on the driver, with no job reading the blocks (docs/receivers.md). On by default "
    "where the graph allows it; a receiver stops a plan whose results it cannot send (false: never)")
RECEIVER_PRECOMPUTE_MAX_BYTES = _entry(
    "spark.sparkwal.receiver.precompute.maxBytes", "int", 256 << 10,
    "the largest result a receiver sends with a block (msgpack bytes; a larger one is not sent and its batch "
    "reads its blocks)", minimum=1, maximum=512 << 10)
RECEIVER_MAX_RATE = _entry("spark.streaming.receiver.maxRate", "float", 0.0,
                           "Spark's: records per second per receiver (0: no limit)", minimum=0)
RECEIVER_RESTART_DELAY = _entry("spark.streaming.receiverRestartDelay", "duration", 2000,
                                "Spark's: the wait before a receiver restarts", unit="ms", minimum=0)

# ---------------------------------------------------------------- rate control
BACKPRESSURE = _entry("spark.streaming.backpressure.enabled", "bool", False,
                      "Spark's: rates follow the processing speed (PID estimator)")
INITIAL_RATE = _entry("spark.streaming.backpressure.initialRate", "float", 0.0,
                      "Spark's: the rate before the first estimate (0: none)", minimum=0)
RATE_ESTIMATOR = _entry("spark.streaming.backpressure.rateEstimator", "choice", "pid",
                        "Spark's: the rate estimator", choices=("pid",))
PID_PROPORTIONAL = _entry("spark.streaming.backpressure.pid.proportional", "float", 1.0,
                          "Spark's: the PID's proportional gain", minimum=0)
PID_INTEGRAL = _entry("spark.streaming.backpressure.pid.integral", "float", 0.2,
                      "Spark's: the PID's integral gain", minimum=0)
PID_DERIVED = _entry("spark.streaming.backpressure.pid.derived", "float", 0.0,
                     "Spark's: the PID's derivative gain", minimum=0)
PID_MIN_RATE = _entry("spark.streaming.backpressure.pid.minRate", "float", 100.0,
                      "Spark's: the lowest rate the PID sets", minimum=0)
KAFKA_MAX_RATE = _entry("spark.streaming.kafka.maxRatePerPartition", "float", None,
                        "Spark's: records per second per partition of a direct stream")
DIRECT_MAX_RATE = _entry("spark.streaming.direct.maxRatePerPartition", "float", 0.0,
                         "the same for any direct source (unset kafka key: this; 0: no limit)", minimum=0)
KAFKA_MIN_RATE = _entry("spark.streaming.kafka.minRatePerPartition", "float", 1.0,
                        "Spark's: records per partition per batch at least", minimum=0)

# ---------------------------------------------------------------- state
DELTAS_PER_FULL = _entry("spark.sparkwal.state.deltasPerFull", "int", 10,
                         "state snapshots: delta snapshots between two full ones", minimum=0)
MAX_LINEAGE_BATCHES = _entry("spark.sparkwal.state.maxLineageBatches", "int", 50,
                             "a state RDD's lineage is cut by a full snapshot within this many batches",
                             minimum=1)
LIVE_KEYS = _entry("spark.sparkwal.state.liveKeysPerWorker", "int", 4_000_000,
                   "mapWithState keys a Python worker keeps live between batches", minimum=0)
STATE_HOST = _entry("spark.sparkwal.state.host", "bool", True,
                    "mapWithState's partitions stay live between batches in one state host process per executor "
                    "(false: in each Python worker, which seldom gets the same partition twice in a row)")
DRIVER_STATE_KEYS = _entry("spark.sparkwal.state.driverMaxKeys", "int", 100_000,
                           "mapWithState after a precomputed reduceByKey keeps a state of at most this many keys "
                           "on the driver, and runs its batches there (0: never)", minimum=0)

# ---------------------------------------------------------------- UI, metrics, event log
UI_ENABLED = _entry("spark.ui.enabled", "bool", True,
                    "Spark's: false serves nothing (events are still recorded)")
UI_PORT = _entry("spark.sparkwal.ui.port", "int", None,
                 "the Streaming UI's port (unset: the first free from 4050; 0: any free port)", minimum=0,
                 maximum=65535)
RETAINED_BATCHES = _entry("spark.streaming.ui.retainedBatches", "int", 1000,
                          "Spark's: completed batches kept in memory and in the event log", minimum=1)
LISTENER_QUEUE_CAPACITY = _entry("spark.scheduler.listenerbus.eventqueue.capacity", "int", 10_000,
                                 "Spark's: events queued for slow listeners before they are dropped",
                                 minimum=1)
EVENT_LOG = _entry("spark.sparkwal.eventLog.enabled", "bool", True,
                   "a driver with a checkpoint keeps its events under it")

# ---------------------------------------------------------------- executors and their Python
SHIP_CODE = _entry("spark.sparkwal.shipCode", "choice", "auto",
                   "ship sparkwal's code to the executors: auto (off local mode), true or false",
                   choices=("auto", "true", "false"))
CHECK_EXECUTORS = _entry("spark.sparkwal.checkExecutors", "choice", "auto",
                         "probe the executors' Python before the first batch: auto, true or false",
                         choices=("auto", "true", "false"))
PREIMPORT_WORKERS = _entry("spark.sparkwal.preimportWorkers", "bool", True,
                           "Python workers fork from a daemon that imported sparkwal once")
SHIP_ENVIRONMENT = _entry("spark.sparkwal.shipEnvironment", "bool", False,
                          "pack the driver's virtualenv and ship it to the executors")
SHIP_ENVIRONMENT_CACHE = _entry("spark.sparkwal.shipEnvironment.cacheDir", "string", None,
                                "where packed environments are kept (unset: ~/.cache/sparkwal/environments)")


class StreamingConf:
    """A driver's settings, read once from its configuration's pairs: every declared key is
    checked when it is made (a bad value is one :class:`ConfigError`), and read typed with
    ``settings[ENTRY]``; :meth:`raw` passes Spark core's own keys through unread."""

    def __init__(self, pairs: Mapping[str, str] | Iterable[tuple[str, str]]):
        self._raw = dict(pairs)
        self._values = {key: self._read(entry) for key, entry in ENTRIES.items()}

    @classmethod
    def of(cls, conf) -> StreamingConf:
        """From a SparkConf (one JVM round trip: ``getAll``)."""
        return cls(conf.getAll())

    def _read(self, entry: ConfEntry):
        value = self._raw.get(entry.key)
        if value is None or str(value).strip() == "":
            if entry.fallback is not None:
                return self._read(ENTRIES[entry.fallback])
            return entry.default
        return entry.parse(value)

    def __getitem__(self, entry: ConfEntry):
        return self._values[entry.key]

    def raw(self, key: str, default: str | None = None) -> str | None:
        return self._raw.get(key, default)


def rate_conf(settings: StreamingConf) -> dict[str, str]:
    """The PID estimator's settings as :func:`sparkwal.tracker.create_rate_estimator` reads them
    (the tracker sits below the engine: it takes a plain map of checked values)."""
    entries = (RATE_ESTIMATOR, PID_PROPORTIONAL, PID_INTEGRAL, PID_DERIVED, PID_MIN_RATE)
    return {entry.key: str(settings[entry]) for entry in entries}


def check(pairs: Iterable[tuple[str, str]]) -> None:
    """Raise the :class:`ConfigError` of the first bad value among ``pairs`` (the main job's
    ``--conf`` before its JVM starts)."""
    StreamingConf(pairs)


def settings_table() -> str:
    """``docs/configuration.md``: every setting, its type, default and doc."""
    lines = ["# Configuration", "",
             "Every setting sparkwal reads, generated from `engine/config.py` "
             "(`python -m sparkwal.engine.config > docs/configuration.md`; a test keeps them equal).",
             "Set them as Spark settings (`SparkConf().set(...)`, `--conf KEY=VALUE`); a bad value stops",
             "the driver with one line naming the key and the value. A duration takes a unit (`500ms`, "
             "`30s`, `2min`, `1h`);", "a bare number is in the unit the table gives, Spark's own for Spark's keys.", "",
             "| key | type | default | what it does |", "|---|---|---|---|"]
    for entry in ENTRIES.values():
        kind = {"duration": f"duration (bare: {entry.unit})",
                "choice": " / ".join(entry.choices)}.get(entry.kind, entry.kind)
        lines.append(f"| `{entry.key}` | {kind} | `{entry.default_text()}` | {entry.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(settings_table(), end="")
