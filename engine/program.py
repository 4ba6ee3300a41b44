"""The program in a checkpoint: the DStream graph with its functions, pickled as pyspark does.

pyspark's contract for ``StreamingContext.getOrCreate`` is that the setup function runs only when
there is no checkpoint; otherwise the context, functions included, comes back from it. So when a
context with a checkpoint directory starts, its graph is pickled with pyspark's cloudpickle (the
streams leave out their context and everything that lives only in a running driver: see
``DStream._transient``) and stored as the checkpoint's code part (format and file rules in
:mod:`checkpoint.code`); every DStream checkpoint names the code part it goes with and carries the
SparkConf to recover with (data, readable without unpickling). Recovering unpickles the graph and
binds it to a new context on the active SparkContext, or on one made from that conf.
"""

from __future__ import annotations

import logging
import re

from pyspark import SparkConf, SparkContext, cloudpickle

from checkpoint import Checkpoint, CheckpointError, read_code

from . import cluster

log = logging.getLogger(__name__)

PROGRAM_VERSION = 1
#: Set anew by every run (ids, ports, the driver's address), as Spark reloads them on recovery.
_PER_RUN_KEYS = {"spark.app.id", "spark.app.startTime", "spark.app.submitTime", "spark.driver.port",
                 "spark.driver.host", "spark.driver.bindAddress", "spark.ui.port",
                 "spark.blockManager.port", "spark.driver.blockManager.port",
                 # this process's Unix sockets to its Python workers (engine.cluster sets them)
                 cluster.UDS_ENABLED, cluster.UDS_DIR}
#: Spark's default ``spark.redaction.regex``: such values are not written into the checkpoint;
#: the recovering run takes them from its own environment.
_SECRET = re.compile(r"(?i)secret|password|token|access[.]?key")


class CheckpointSerializationError(TypeError):
    """A function of the graph cannot be pickled, so the context cannot be checkpointed."""


def serialize_program(ssc) -> bytes:
    """The pickled program of ``ssc`` (before its graph is started), or an error naming the
    DStream operation whose function cannot be pickled."""
    program = {"version": PROGRAM_VERSION, "graph": ssc._graph, "batch_ms": ssc._batch_ms,
               "concurrent_jobs": ssc._scheduler.concurrent_jobs}
    try:
        return cloudpickle.dumps(program)
    except Exception as failure:  # noqa: BLE001 (any pickling failure, pyspark's own errors included)
        error, where = failure, "the DStream graph"
    for index, stream in enumerate(ssc._graph.streams):  # parents come first: the first fails
        try:
            cloudpickle.dumps(stream)
        except Exception as failure:  # noqa: BLE001
            error = failure
            where = f"DStream {index} ({type(stream).__name__}, made by {stream.creation_site})"
            break
    raise CheckpointSerializationError(
        f"cannot checkpoint {where}: its function cannot be serialised for the checkpoint in "
        f"{ssc._checkpoint_dir}: {error}") from error


def checkpoint_conf(sc: SparkContext) -> list[list[str]]:
    """The SparkConf pairs a recovery without an active SparkContext starts from."""
    return sorted([k, v] for k, v in sc.getConf().getAll()
                  if k not in _PER_RUN_KEYS and not _SECRET.search(k))


def recover(cls, checkpoint: Checkpoint, path: str, storage_options: dict | None, clock=None):
    """A context of class ``cls`` rebuilt from ``checkpoint`` and its code part."""
    body = read_code(path, checkpoint.data["code"], storage_options)
    program = cloudpickle.loads(body)
    if program.get("version") != PROGRAM_VERSION:
        raise ValueError(f"{path}: the checkpoint's program has version {program.get('version')}; "
                         f"this sparkwal reads version {PROGRAM_VERSION}")
    sc = SparkContext._active_spark_context
    if sc is None:
        conf = SparkConf().setAll([(k, v) for k, v in checkpoint.data.get("conf", [])])
        sc = SparkContext(conf=conf)
        cluster.warm_workers_early(sc)
    ssc = cls(sc, program["batch_ms"] / 1000, concurrentJobs=program["concurrent_jobs"], clock=clock)
    ssc._graph = program["graph"]
    for stream in ssc._graph.streams:
        stream._attach(ssc)
    ssc.checkpoint(path, storage_options=storage_options)
    from .restart import restore

    restore(ssc, checkpoint)
    log.info("recovered the program and its state from the checkpoint in %s", path)
    return ssc


def get_or_create(cls, path: str, setup, upgrade: bool, storage_options: dict | None, clock=None):
    """getOrCreate's choice: the context rebuilt from the checkpoint in ``path`` (program and
    data), or ``setup()``'s, checkpointed there, with the checkpoint's data when ``upgrade``."""
    from checkpoint import read_checkpoint

    from .restart import CheckpointMismatchError, restore

    if SparkContext._active_spark_context is not None:  # while the checkpoint is read
        cluster.warm_workers_early(SparkContext._active_spark_context)
    for attempt in range(3):
        checkpoint = read_checkpoint(path, storage_options=storage_options)
        if checkpoint is None or upgrade:
            break
        if not checkpoint.data.get("code"):
            raise CheckpointMismatchError(
                f"the checkpoint in {path} holds no program code (it was written by an earlier "
                "sparkwal, code-free): recover it with getOrCreate(..., upgrade=True), which "
                "applies its data to the graph that setupFunc builds")
        try:
            ssc = recover(cls, checkpoint, path, storage_options, clock)
        except CheckpointError as e:
            # a running driver (this one's standby reads beside it) deletes an earlier run's code
            # part once no checkpoint names it: a newer checkpoint names the current one
            if "code part named by the checkpoint is missing" not in str(e) or attempt == 2:
                raise
            log.info("%s; reading the newest checkpoint again", e)
            continue
        ssc.recovery = "checkpoint"
        return ssc
    ssc = setup()
    if ssc._checkpoint_dir is None:
        ssc.checkpoint(path, storage_options=storage_options)
    if checkpoint is not None:
        restore(ssc, checkpoint)
        ssc.recovery = "upgrade"
    return ssc
