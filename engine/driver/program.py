"""The program in a checkpoint: the DStream graph with its functions, pickled as pyspark does.

pyspark's contract for ``StreamingContext.getOrCreate`` is that the setup function runs only when
there is no checkpoint; otherwise the context, functions included, comes back from it. So when a
context with a checkpoint directory starts, its graph is pickled with pyspark's cloudpickle (the
streams leave out their context and everything that lives only in a running driver: see
``DStream.transient_fields``) and stored as the checkpoint's code part (format and file rules in
:mod:`sparkwal.checkpoint.code`); every DStream checkpoint names the code part it goes with and carries the
SparkConf to recover with (data, readable without unpickling). Recovering unpickles the graph and
binds it to a new context on the active SparkContext, or on one made from that conf. The program's
layout, and every earlier one, is :mod:`.program_layouts`'.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark import SparkConf, SparkContext, cloudpickle

from sparkwal.checkpoint import Checkpoint, read_code

from .. import cluster
from ..environment import prepare_conf
from ..errors import EngineError
from . import program_layouts
from .program_layouts import PROGRAM_VERSION

if TYPE_CHECKING:
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)


#: Set anew by every run (ids, ports, the driver's address), as Spark reloads them on recovery.
_PER_RUN_KEYS = {"spark.app.id", "spark.app.startTime", "spark.app.submitTime", "spark.driver.port",
                 "spark.driver.host", "spark.driver.bindAddress", "spark.ui.port",
                 "spark.blockManager.port", "spark.driver.blockManager.port",
                 # this process's Unix sockets to its Python workers (engine.cluster sets them)
                 cluster.UDS_ENABLED, cluster.UDS_DIR,
                 # the rest of Spark's propertiesToReload (streaming/.../Checkpoint.scala): the pod
                 # a driver runs in (a standby's pod is another) and per-launch credentials
                 "spark.kubernetes.driver.pod.name", "spark.kubernetes.executor.podNamePrefix",
                 "spark.yarn.jars", "spark.yarn.keytab", "spark.yarn.principal", "spark.kerberos.keytab",
                 "spark.kerberos.principal", "spark.ui.filters"}
#: Spark's default ``spark.redaction.regex``: such values are not written into the checkpoint;
#: the recovering run takes them from its own environment.
_SECRET = re.compile(r"(?i)secret|password|token|access[.]?key")


class CheckpointSerializationError(EngineError, TypeError):
    """A function of the graph cannot be pickled, so the context cannot be checkpointed."""


def serialize_program(graph: DStreamGraph, batch_ms: int, concurrent_jobs: int, checkpoint_dir: str | None) -> bytes:
    """The pickled program (``graph``, before it is started, and how it runs), or an error naming
    the DStream operation whose function cannot be pickled (and ``checkpoint_dir``)."""
    program = {"version": PROGRAM_VERSION, "graph": graph, "batch_ms": batch_ms, "concurrent_jobs": concurrent_jobs}
    try:
        return program_layouts.encode(program)
    except Exception as failure:  # noqa: BLE001 (any pickling failure, pyspark's own errors included)
        error, where = failure, "the DStream graph"
    for index, stream in enumerate(graph.streams):  # parents come first: the first fails
        try:
            cloudpickle.dumps(stream)
        except Exception as failure:  # noqa: BLE001
            error = failure
            where = f"DStream {index} ({type(stream).__name__}, made by {stream.creation_site})"
            break
    raise CheckpointSerializationError(
        f"cannot checkpoint {where}: its function cannot be serialised for the checkpoint in "
        f"{checkpoint_dir}: {error}") from error


def checkpoint_conf(sc: SparkContext) -> list[list[str]]:
    """The SparkConf pairs a recovery without an active SparkContext starts from."""
    return sorted([k, v] for k, v in sc.getConf().getAll()
                  if k not in _PER_RUN_KEYS and not _SECRET.search(k))


@dataclass(frozen=True)
class Program:
    """What a checkpoint's code part holds: the DStream graph with its functions, unpickled."""

    graph: DStreamGraph  # its streams not yet attached to a context
    batch_ms: int
    concurrent_jobs: int


def active_spark_context() -> SparkContext | None:
    """PySpark's active SparkContext (PySpark names it only in a private attribute)."""
    return SparkContext._active_spark_context


def warm_active_workers() -> None:
    """Start the active SparkContext's Python workers while a checkpoint is read."""
    sc = active_spark_context()
    if sc is not None:
        cluster.warm_workers_early(sc)


def load_program(checkpoint: Checkpoint, path: str, storage_options: dict | None
                 ) -> tuple[SparkContext, Program]:
    """``checkpoint``'s program (its code part, unpickled), and the SparkContext to run it on:
    the active one, or one made from the checkpoint's conf."""
    program = program_layouts.decode(read_code(path, checkpoint.data["code"], storage_options), path)
    sc = active_spark_context()
    if sc is None:
        conf = SparkConf().setAll([(k, v) for k, v in checkpoint.data.get("conf", [])])
        sc = SparkContext(conf=prepare_conf(conf))  # the archive cached: not packed again
        cluster.warm_workers_early(sc)
    return sc, Program(program["graph"], program["batch_ms"], program["concurrent_jobs"])
