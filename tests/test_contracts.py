"""Every name and signature the project's issues spelled out, pinned: a restructuring that breaks one
fails here, not in a user's program. A contract's parameters must stay in order, of the same kind,
with the same defaults; parameters added later must have defaults (added freely, as the brief
says). Names that had to change keep a deprecated alias (listed with the contract they keep).

The sources: issue 2 (``wal``), 3 (``checkpoint``), 4 (``tracker``), 5 and 16 (the engine's
pyspark.streaming API and ``getOrCreate``), 9 (receivers), 10 (direct sources and sinks), 11 and
41 (the command), 17 (``mapWithState``, state as a table), 18 (the hot standby), 32 (the REST API,
metrics), 34 (``prepare_conf``), 42 (``from sparkwal import StreamingContext``), 45 (the exactly-once sinks)."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.compat  # kept under every PySpark the project supports

#: qualified name -> the signature an issue spelled out (``self`` left out of methods)
SIGNATURES = {
    # issue 2: the WAL
    "sparkwal.wal.WriteAheadLog.write": "(data, time_ms)",
    "sparkwal.wal.WriteAheadLog.read": "(handle)",
    "sparkwal.wal.WriteAheadLog.read_all": "()",
    "sparkwal.wal.WriteAheadLog.clean": "(thresh_time_ms, wait_for_completion=False)",
    "sparkwal.wal.WriteAheadLog.close": "()",
    "sparkwal.wal.WriteAheadLog.statistics": "()",
    "sparkwal.wal.WriteAheadLog.write_many": "(records, time_ms)",  # issue 12
    "sparkwal.wal.FileBasedWriteAheadLog": "(log_dir, *, rolling_interval_s=60, max_failures=3, "
                                           "close_file_after_write=None, storage_options=None, clock=None)",
    "sparkwal.wal.BatchedWriteAheadLog": "(wrapped, *, batching_timeout_s=5.0)",
    "sparkwal.wal.RecordHandle": "(path, offset, length)",
    # issue 3: checkpoints
    "sparkwal.checkpoint.MetadataLog.add": "(batch_id, value)",
    "sparkwal.checkpoint.MetadataLog.get": "(batch_id)",
    "sparkwal.checkpoint.MetadataLog.get_latest": "()",
    "sparkwal.checkpoint.MetadataLog.get_range": "(start=None, end=None)",
    "sparkwal.checkpoint.MetadataLog.purge": "(threshold)",
    "sparkwal.checkpoint.MetadataLog.purge_after": "(batch_id)",
    "sparkwal.checkpoint.OffsetSeq": "(offsets, metadata=None)",
    "sparkwal.checkpoint.OffsetSeqMetadata": "(batch_watermark_ms=0, batch_timestamp_ms=0, conf=...)",
    "sparkwal.checkpoint.CommitMetadata": "(next_batch_watermark_ms=0)",
    "sparkwal.checkpoint.OffsetSeqLog": "(path, storage_options=None)",
    "sparkwal.checkpoint.CommitLog": "(path, storage_options=None)",
    "sparkwal.checkpoint.resolve_restart": "(offsets, commits)",
    "sparkwal.checkpoint.Checkpoint": "(checkpoint_time_ms, pending_times_ms=..., data=...)",
    "sparkwal.checkpoint.CheckpointWriter": "(directory, *, keep=10, storage_options=None)",
    "sparkwal.checkpoint.read_checkpoint": "(directory, *, storage_options=None)",
    "sparkwal.checkpoint.copy.copy_checkpoint": "(source, destination, *, source_options=None, "
                                                "destination_options=None)",  # issue 41
    # issue 4: the tracker
    "sparkwal.tracker.ReceivedBlockInfo": "(stream_id, num_records, block_id, wal_handle=None, metadata=None)",
    "sparkwal.tracker.ReceivedBlockTracker": "(stream_ids, checkpoint_dir=None, *, recover_from_wal=False, "
                                             "clock=None, storage_options=None)",
    "sparkwal.tracker.ReceivedBlockTracker.add_block": "(info)",
    "sparkwal.tracker.ReceivedBlockTracker.allocate_blocks_to_batch": "(batch_time_ms)",
    "sparkwal.tracker.ReceivedBlockTracker.get_blocks_of_batch": "(batch_time_ms)",
    "sparkwal.tracker.ReceivedBlockTracker.get_blocks_of_batch_and_stream": "(batch_time_ms, stream_id)",
    "sparkwal.tracker.ReceivedBlockTracker.has_unallocated_blocks": "()",
    "sparkwal.tracker.ReceivedBlockTracker.get_unallocated_blocks": "(stream_id)",
    "sparkwal.tracker.ReceivedBlockTracker.cleanup_old_batches": "(thresh_ms, wait_for_completion=False)",
    "sparkwal.tracker.ReceivedBlockTracker.stop": "()",
    "sparkwal.tracker.ExecutorLocation": "(host, executor_id)",
    "sparkwal.tracker.ReceiverSchedulingPolicy.schedule_receivers": "(receivers, executors)",
    "sparkwal.tracker.RateLimiter": "(max_rate=None, initial_rate=None)",
    "sparkwal.tracker.RateLimiter.wait_to_push": "()",
    "sparkwal.tracker.RateLimiter.update_rate": "(rate)",
    "sparkwal.tracker.PIDRateEstimator": "(batch_interval_ms, proportional=1.0, integral=0.2, derivative=0.0, "
                                         "min_rate=100)",
    "sparkwal.tracker.PIDRateEstimator.compute": "(time_ms, num_elements, processing_delay_ms, "
                                                 "scheduling_delay_ms)",
    # issues 5, 16, 18: pyspark.streaming's StreamingContext
    "sparkwal.StreamingContext": "(sparkContext, batchDuration=None)",
    "sparkwal.StreamingContext.checkpoint": "(directory)",
    "sparkwal.StreamingContext.remember": "(duration)",
    "sparkwal.StreamingContext.queueStream": "(rdds, oneAtATime=True, default=None)",
    "sparkwal.StreamingContext.textFileStream": "(directory, newFilesOnly=True)",
    "sparkwal.StreamingContext.union": "(*dstreams)",
    "sparkwal.StreamingContext.transform": "(dstreams, transformFunc)",
    "sparkwal.StreamingContext.addStreamingListener": "(streamingListener)",
    "sparkwal.StreamingContext.start": "()",
    "sparkwal.StreamingContext.awaitTermination": "(timeout=None)",
    "sparkwal.StreamingContext.awaitTerminationOrTimeout": "(timeout)",
    "sparkwal.StreamingContext.stop": "(stopSparkContext=True, stopGraceFully=False)",
    "sparkwal.StreamingContext.getOrCreate": "(checkpointPath, setupFunc, *, upgrade=False, "
                                             "storage_options=None, standby=False)",
    "sparkwal.StreamingContext.getActive": "()",
    "sparkwal.StreamingContext.getActiveOrCreate": "(checkpointPath, setupFunc, *, upgrade=False)",
    "sparkwal.StreamingContext.awaitLeadership": "(timeout=None)",
    "sparkwal.StreamingContext.isStandby": "()",
    # issue 9: receivers
    "sparkwal.StreamingContext.receiverStream": "(receiver)",
    "sparkwal.StreamingContext.socketTextStream": "(hostname, port, storageLevel=None)",
    "sparkwal.engine.Receiver": "(storageLevel=None)",
    "sparkwal.engine.Receiver.storeBlock": "(records, metadata=None)",
    "sparkwal.engine.Receiver.restart": "(message, error=None)",
    "sparkwal.engine.Receiver.stop": "(message, error=None)",
    "sparkwal.engine.Receiver.reportError": "(message, error)",
    # issue 10: direct sources and sinks
    "sparkwal.StreamingContext.directStream": "(source, fromOffsets=None)",
    "sparkwal.engine.sources.FileLogSource": "(path, storage_options=None)",
    "sparkwal.engine.sources.OffsetRange": "(topic, partition, fromOffset, untilOffset)",
    "sparkwal.engine.kafka.KafkaUtils.createDirectStream": "(ssc, topics, kafkaParams, fromOffsets=None)",
    # issue 45: exactly-once sinks
    "sparkwal.engine.sinks.DeltaSink": "(table_uri, name='sparkwal', *, storage_options=None)",
    "sparkwal.engine.sinks.PostgresSink": "(conninfo, table=None, name='default')",
    "sparkwal.engine.sinks.KafkaSink": "(topic, producer_conf, name='sparkwal')",
    # issue 17: state
    "sparkwal.engine.StateSpec.function": "(mappingFunction)",
    "sparkwal.engine.read_state": "(checkpointPath, storage_options=None)",
    # issue 34: the conf a cluster's SparkContext is made with
    "sparkwal.engine.prepare_conf": "(conf=None)",
    # issue 65: upgrades (stream identities, state versions)
    "sparkwal.engine.DStream.uid": "(name)",
    "sparkwal.engine.StateSpec.stateVersion": "(version, migrate=None)",
    "sparkwal.engine.DStream.updateStateByKey": "(updateFunc, numPartitions=None, initialRDD=None, stateVersion=1, "
                                                "migrate=None)",
}

#: object -> names it must have (issue 5: every public method of pyspark.streaming.DStream ...)
NAMES = {
    "sparkwal": ["StreamingContext", "DStream", "StreamingListener", "__version__"],
    "sparkwal.DStream": [
        "map", "flatMap", "filter", "mapPartitions", "mapPartitionsWithIndex", "reduce", "reduceByKey",
        "combineByKey", "partitionBy", "count", "countByValue", "foreachRDD", "pprint", "mapValues",
        "flatMapValues", "glom", "cache", "persist", "checkpoint", "groupByKey", "union", "cogroup", "join",
        "leftOuterJoin", "rightOuterJoin", "fullOuterJoin", "transform", "transformWith", "repartition",
        "slice", "window", "reduceByWindow", "countByWindow", "countByValueAndWindow",
        "groupByKeyAndWindow", "reduceByKeyAndWindow", "updateStateByKey", "mapWithState",
        "saveAsTextFiles", "context"],
    "sparkwal.StreamingContext": ["sparkContext", "binaryRecordsStream", "uiWebUrl", "currentLeader"],
    "sparkwal.StreamingListener": [
        "onStreamingStarted", "onBatchSubmitted", "onBatchStarted", "onBatchCompleted",
        "onOutputOperationStarted", "onOutputOperationCompleted", "onReceiverStarted", "onReceiverError",
        "onReceiverStopped", "onDriverTakeover"],
    "sparkwal.engine.Receiver": ["onStart", "onStop", "store", "storeBlock", "restart", "stop", "reportError",
                                 "isStarted", "isStopped", "streamId", "preferredLocation"],
    "sparkwal.engine.StateSpec": ["function", "initialState", "numPartitions", "timeout", "stateVersion"],
    "sparkwal.engine.State": ["exists", "get", "getOption", "update", "remove", "isTimingOut"],
    "sparkwal.engine": ["StreamingContext", "DStream", "StreamingListener", "Receiver", "SocketReceiver",
                        "StateSpec", "State", "BatchInfo", "CheckpointMismatchError", "DriverAlreadyActiveError",
                        "prepare_conf", "read_state", "SnapshotError", "BlockReadError"],
    "sparkwal.engine.sources": ["ReplayableSource", "FileLogSource", "OffsetRange", "TopicPartition"],
    "sparkwal.engine.sinks": ["SQLiteSink", "DbApiSink", "DeltaSink", "PostgresSink",
                              "KafkaSink"],  # issue 45: the last three
    "sparkwal.engine.sinks.DeltaSink": ["offsets", "saveStream"],
    "sparkwal.engine.sinks.PostgresSink": ["offsets", "saveStream"],
    "sparkwal.engine.sinks.KafkaSink": ["offsets", "saveStream", "read"],
    "sparkwal.wal": ["WriteAheadLog", "FileBasedWriteAheadLog", "BatchedWriteAheadLog", "RecordHandle",
                     "WalStatistics", "WalError", "CorruptRecordError", "LogLockedError", "Durability"],
    "sparkwal.wal.WalStatistics": ["records_written", "syncs"],
    "sparkwal.checkpoint": ["MetadataLog", "OffsetSeqLog", "CommitLog", "OffsetSeq", "OffsetSeqMetadata",
                            "CommitMetadata", "resolve_restart", "plan_repair", "repair", "RestartPoint",
                            "Checkpoint", "CheckpointWriter", "read_checkpoint"],
    "sparkwal.checkpoint.RestartPoint": ["batch_id", "rerun", "start_offsets", "end_offsets"],
    "sparkwal.tracker": ["ReceivedBlockInfo", "ReceivedBlockTracker", "BlockAdditionEvent",
                         "BatchAllocationEvent", "BatchCleanupEvent", "InputInfoTracker", "ExecutorLocation",
                         "ReceiverSchedulingPolicy", "RateLimiter", "PIDRateEstimator", "RateController"],
    "sparkwal.tracker.ReceivedBlockInfo": ["is_block_id_valid"],
    "sparkwal.tracker.ReceiverSchedulingPolicy": ["schedule_receivers", "reschedule_receiver"],
    "sparkwal.tracker.RateLimiter": ["current_limit"],
}

#: the command's verbs (issues 11, 17, 32, 41, 65)
VERBS = {"wal": ["inspect", "verify", "repair"],
         "checkpoint": ["inspect", "verify", "repair", "state", "copy", "handover"], "upgrade": ["plan"],
         "run": [], "drill": [], "ui": [], "status": []}

#: Spark's streaming REST API, the paths and the fields of each answer (issue 32)
REST = {
    "statistics": ["startTime", "batchDuration", "numReceivers", "numActiveReceivers", "numInactiveReceivers",
                   "numTotalCompletedBatches", "numRetainedCompletedBatches", "numActiveBatches",
                   "numProcessedRecords", "numReceivedRecords", "avgInputRate", "avgSchedulingDelay",
                   "avgProcessingTime", "avgTotalDelay"],
    "batches": ["batchId", "batchTime", "status", "batchDuration", "inputSize", "schedulingDelay",
                "processingTime", "totalDelay", "numActiveOutputOps", "numCompletedOutputOps",
                "numFailedOutputOps", "numTotalOutputOps"],
    "batches/{batch}/operations": ["outputOpId", "name", "description", "startTime", "endTime", "duration",
                                   "jobIds"],
    "recoveries": ["appId", "kind", "epoch", "startTime", "rerunBatches", "skippedBatches", "ended", "id"],
}

#: the Prometheus metrics (issue 32)
METRICS = ["sparkwal_batches_completed_total", "sparkwal_batch_processing_seconds",
           "sparkwal_batch_scheduling_delay_seconds", "sparkwal_records_received_total",
           "sparkwal_unprocessed_batches", "sparkwal_output_operations_failed_total",
           "sparkwal_checkpoint_write_seconds", "sparkwal_wal_sync_seconds", "sparkwal_state_keys",
           "sparkwal_state_snapshot_bytes", "sparkwal_receiver_up", "sparkwal_driver_epoch",
           "sparkwal_driver_restarts_total", "sparkwal_driver_takeovers_total",
           "sparkwal_event_log_dropped_events"]

#: configuration keys the issues named (read by the library; Spark's own names where Spark has them)
CONF_KEYS = [
    "spark.streaming.receiver.writeAheadLog.enable", "spark.streaming.blockInterval",
    "spark.streaming.blockQueueSize", "spark.streaming.backpressure.enabled",
    "spark.streaming.backpressure.initialRate", "spark.streaming.receiver.maxRate",
    "spark.streaming.receiver.maxUnprocessedBytes", "spark.streaming.kafka.maxRatePerPartition",
    "spark.streaming.direct.maxRatePerPartition", "spark.streaming.concurrentJobs",
    "spark.streaming.gracefulStopTimeout", "spark.streaming.stopGracefullyOnShutdown",
    "spark.streaming.driver.leaseTimeout", "spark.streaming.ui.retainedBatches",
    "spark.sparkwal.state.deltasPerFull", "spark.sparkwal.state.maxLineageBatches",
    "spark.sparkwal.standby.preloadState", "spark.sparkwal.storage.deadline", "spark.sparkwal.ui.port",
    "spark.sparkwal.shipCode", "spark.sparkwal.shipEnvironment", "spark.sparkwal.backlog.warnIntervals",
    "spark.sparkwal.recovery.coalesceDowntime",  # issue 44
    "spark.sparkwal.receiver.precompute", "spark.sparkwal.receiver.precompute.maxBytes",  # issue 44's continuous half
    "spark.sparkwal.state.driverMaxKeys",  # issue 44: a small mapWithState state on the driver
    "spark.sparkwal.leader.stallIntervals", "spark.sparkwal.copy.allowLiveSource",  # issue 62
    "spark.sparkwal.leader.allowNetworkFilesystem",  # issue 62
    "spark.sparkwal.upgrade.allowDrop",  # issue 65
]

#: the main job's JSON-line events, which tools read (issues 11, 18, 30, 32)
MAIN_JOB_EVENTS = ["context", "ui", "batch_completed", "batch_committed", "receiver_started", "receiver_stopped",
                   "recovered", "standby", "takeover", "fenced", "failed", "stopping", "stopped"]

#: exit statuses: the command's, and the main job's and the drill's (issues 11, 30, 32, 41)
EXIT_STATUSES = {"sparkwal.cli": {"OK": 0, "PROBLEM": 1, "USAGE": 2},
                 "sparkwal.engine.apps.arguments": {"OK": 0, "FAILED": 1, "USAGE": 2, "FENCED": 3, "STORAGE": 4,
                                                     "LEADER_HELD": 5}}

#: the paths under a checkpoint directory (Spark's names; issues 3, 4, 9, 10, 18, 32)
LAYOUT = {"CHECKPOINT_PREFIX": "checkpoint-", "CODE_PREFIX": "code-", "STATE": "state", "OFFSETS": "offsets",
          "COMMITS": "commits", "SOURCES": "sources", "RECEIVED_BLOCK_METADATA": "receivedBlockMetadata",
          "RECEIVED_DATA": "receivedData", "RDDS": "rdds", "EVENTS": "events", "LEADER_LOCK": ".leader.lock",
          "LEADER_EPOCH": ".leader.epoch", "LEADER_LEASES": ".leader"}


def resolve_name(qualified: str):
    """The object a dotted name names (a module, then attributes)."""
    parts = qualified.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(qualified)


def spec_of(text: str) -> inspect.Signature:
    namespace: dict = {}
    exec(f"def f{text.replace('=...', '=ANY')}: pass", {"ANY": ANY}, namespace)  # noqa: S102
    return inspect.signature(namespace["f"])


class _Any:
    def __repr__(self) -> str:
        return "..."


ANY = _Any()


def contract_breaks(obj, spec: inspect.Signature) -> list[str]:
    """How ``obj``'s signature breaks ``spec`` (empty: it keeps it)."""
    actual = inspect.signature(obj)
    params = [p for p in actual.parameters.values() if p.name != "self"]
    by_name = {p.name: p for p in params}
    wrong = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    wanted_positional = [p.name for p in spec.parameters.values()
                         if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional[:len(wanted_positional)] != wanted_positional:
        wrong.append(f"positional parameters {positional}, the contract's {wanted_positional}")
    for want in spec.parameters.values():
        got = by_name.get(want.name)
        if got is None:
            wrong.append(f"no parameter {want.name!r}")
            continue
        if got.kind != want.kind:
            wrong.append(f"{want.name!r} is {got.kind.description}, the contract's {want.kind.description}")
        if want.default is not want.empty and want.default is not ANY and got.default != want.default:
            wrong.append(f"{want.name!r} defaults to {got.default!r}, the contract's {want.default!r}")
        if want.default is ANY and got.default is got.empty:
            wrong.append(f"{want.name!r} has no default")
    for got in params:
        if got.name not in spec.parameters and got.default is got.empty \
                and got.kind not in (got.VAR_POSITIONAL, got.VAR_KEYWORD):
            wrong.append(f"{got.name!r} was added without a default")
    return wrong


@pytest.mark.parametrize("qualified", sorted(SIGNATURES))
def test_every_signature_an_issue_spelled_out_is_kept(qualified):
    assert contract_breaks(resolve_name(qualified), spec_of(SIGNATURES[qualified])) == []


@pytest.mark.parametrize("qualified", sorted(NAMES))
def test_every_name_an_issue_spelled_out_is_there(qualified):
    obj = resolve_name(qualified)
    fields = getattr(obj, "__dataclass_fields__", {}) or getattr(obj, "_fields", ())
    assert [n for n in NAMES[qualified] if not hasattr(obj, n) and n not in fields] == []


def test_the_contract_check_can_fail():
    """A parameter renamed, reordered, made keyword-only, given another default, or added without
    a default: each is found."""
    def kept(stream_ids, checkpoint_dir=None, *, clock=None, extra=1):
        pass
    spec = spec_of("(stream_ids, checkpoint_dir=None, *, clock=None)")
    assert contract_breaks(kept, spec) == []
    for broken in ("def f(stream_ids, wal_dir=None, *, clock=None): pass",
                   "def f(checkpoint_dir, stream_ids, *, clock=None): pass",
                   "def f(stream_ids, *, checkpoint_dir=None, clock=None): pass",
                   "def f(stream_ids, checkpoint_dir=None, *, clock=0): pass",
                   "def f(stream_ids, checkpoint_dir=None, *, clock=None, needed): pass"):
        namespace: dict = {}
        exec(broken, namespace)  # noqa: S102
        assert contract_breaks(namespace["f"], spec), broken


def test_the_commands_verbs_are_all_listed_and_answer_help():
    from sparkwal.cli import build_parser

    areas = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 (argparse's own)
    assert list(areas) == list(VERBS)
    for area, verbs in VERBS.items():
        if verbs:
            assert list(areas[area]._subparsers._group_actions[0].choices) == verbs  # noqa: SLF001
    for args in (["--help"], ["run", "--help"], ["ui", "--help"], ["status", "--help"], ["drill", "--help"],
                 ["checkpoint", "copy", "--help"], ["--version"]):
        out = subprocess.run([sys.executable, "-m", "sparkwal", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout, (args, out.stderr)


def test_the_rest_api_answers_its_paths_with_sparks_fields(tmp_path):
    from sparkwal.checkpoint.event_log import EventLogWriter
    from sparkwal.engine.ui.catalog import Catalog
    from sparkwal.engine.ui.routes import respond

    run = {"startTime": 1000, "epoch": 1, "appId": "app-1", "appName": "contract", "batchDuration": 500,
           "kind": "new", "streams": [{"id": 0, "name": "File Stream [0]", "receiver": False}]}
    writer = EventLogWriter(str(tmp_path / "events"), run)
    writer.append({"event": "batch", "time": 1600, "batchTime": 1500, "submissionTime": 1500,
                   "processingStartTime": 1510, "processingEndTime": 1590, "inputs": {"0": 3},
                   "ops": [{"id": 0, "name": "foreachRDD", "description": "", "startTime": 1510,
                            "endTime": 1590, "failureReason": None, "jobIds": [0]}]})
    writer.close()
    catalog = Catalog(str(tmp_path / "events"))
    status, _, body = respond(catalog, "/api/v1/applications")
    (app,) = json.loads(body)
    assert status == 200 and {"id", "name", "attempts"} <= set(app)
    base = f"/api/v1/applications/{app['id']}/streaming"
    for path, fields in REST.items():
        status, _, body = respond(catalog, f"{base}/{path.replace('{batch}', '1500')}")
        answer = json.loads(body)
        answer = answer[0] if isinstance(answer, list) else answer
        assert status == 200 and [f for f in fields if f not in answer] == [], path


def test_the_metrics_keep_their_names():
    from prometheus_client import generate_latest

    from sparkwal.engine.ui.metrics import Metrics

    text = generate_latest(Metrics().registry).decode()
    families = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    assert set(METRICS) - families == set()


def test_the_configuration_keys_are_still_read():
    source = "\n".join(p.read_text() for d in ("engine", "wal", "checkpoint", "tracker", "sparkwal")
                       for p in (ROOT / d).rglob("*.py"))
    assert [k for k in CONF_KEYS if f'"{k}"' not in source] == []


def test_the_main_jobs_events_and_every_exit_status_are_kept():
    source = "\n".join((ROOT / "engine" / "apps" / f).read_text() for f in ("wordcount.py", "progress.py"))
    assert [e for e in MAIN_JOB_EVENTS if f'"event": "{e}"' not in source] == []
    for module, statuses in EXIT_STATUSES.items():
        found = importlib.import_module(module)
        assert {name: getattr(found, name) for name in statuses} == statuses


def test_the_checkpoint_layout_keeps_sparks_names():
    from sparkwal.checkpoint import layout
    from sparkwal.tracker.block_tracker import LOG_DIR_NAME

    assert {name: getattr(layout, name) for name in LAYOUT} == LAYOUT
    assert LOG_DIR_NAME == layout.RECEIVED_BLOCK_METADATA


#: the command lines' flags (issues 5, 9, 10, 11, 18, 30, 32, 33, 34, 41, 65)
FLAGS = {
    ("sparkwal.engine.wordcount",): ["--dir", "--batch", "--files", "--seconds", "--upgrade", "--master", "--source",
                                     "--source-port", "--checkpoint", "--input", "--storage-option", "--standby",
                                     "--conf", "--json", "--verbose"],
    ("sparkwal.engine.drill",): ["--kills", "--duration", "--files", "--report", "--batch", "--seed", "--dir",
                                 "--upgrade", "--mode", "--standby", "--nemesis", "--faults", "--master",
                                 "--standalone", "--kinds", "--speculation"],
    ("sparkwal", "wal", "inspect"): ["--records", "--json", "--storage-option"],
    ("sparkwal", "wal", "repair"): ["--yes"],
    ("sparkwal", "checkpoint", "state"): ["--out", "--format", "--stream", "--limit"],
    ("sparkwal", "checkpoint", "copy"): ["--storage-option", "--dst-storage-option", "--json"],
    ("sparkwal", "ui"): ["--port", "--host", "--storage-option", "--json"],
    ("sparkwal", "status"): ["--storage-option", "--json"],
    ("sparkwal", "upgrade", "plan"): ["--json", "--timeout"],  # issue 65
    ("sparkwal", "checkpoint", "handover"): ["--timeout", "--json", "--storage-option"],  # issue 65
}


@pytest.mark.parametrize("command", sorted(FLAGS), ids=" ".join)
def test_the_command_lines_keep_their_flags(command):
    out = subprocess.run([sys.executable, "-m", *command, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [f for f in FLAGS[command] if f not in out.stdout] == []
