"""``StreamingContext.getOrCreate``'s choice: the context rebuilt from a checkpoint (its program and
data), or the setup function's, checkpointed there, with the checkpoint's data on an upgrade.

Recovering runs the program stored in the checkpoint, not the caller's. A checkpoint written by an
application of another name (``spark.app.name``) is almost always a directory shared by mistake, so
that recovery is refused in one line naming both applications, unless the caller allows it
(``getOrCreate(..., allow_other_app=True)`` or ``spark.sparkwal.recover.allowOtherApp``). An upgrade
runs the caller's own code on the checkpoint's data: another name there is one warning.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from pyspark import SparkContext

from sparkwal.checkpoint import read_checkpoint
from sparkwal.checkpoint.errors import CheckpointMismatchError, MissingCodePartError

from . import config
from .config import StreamingConf
from .driver import upgrade_preview
from .driver.program import active_spark_context, load_program, warm_active_workers
from .errors import AnotherApplicationError

if TYPE_CHECKING:
    from .context import StreamingContext

log = logging.getLogger(__name__)


def checkpoint_path(value, name: str = "checkpointPath") -> str | None:
    """``value`` as a path string (None stays None), or a TypeError naming the parameter."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
    raise TypeError(f"{name} must be a non-empty path or URL string (or None for no checkpoint), "
                    f"got {value!r} of type {type(value).__name__}")


def check_setup_func(setupFunc) -> None:
    if setupFunc is None:
        raise ValueError("setupFunc cannot be None")
    if not callable(setupFunc):
        raise TypeError(f"setupFunc must be callable, got {type(setupFunc).__name__}")


def setup_context(setupFunc, context_class: type[StreamingContext]) -> StreamingContext:
    ssc = setupFunc()
    if not isinstance(ssc, context_class):
        raise TypeError(f"setupFunc must return a StreamingContext, got {type(ssc).__name__}")
    return ssc


def written_by(checkpoint) -> str | None:
    """The ``spark.app.name`` of the application that wrote ``checkpoint`` (None: not recorded)."""
    return dict(checkpoint.data.get("conf") or []).get("spark.app.name")


def check_written_by(checkpoint, path: str, sc: SparkContext | None, allow_other_app: bool) -> None:
    """Before a recovery unpickles anything: refuse a checkpoint written by an application of another
    name than the active SparkContext's (none active: the recovery makes one from the checkpoint's
    conf, its own name), unless allowed; allowed, one warning names both."""
    theirs = written_by(checkpoint)
    if sc is None or not theirs or theirs == sc.appName:
        return
    if not (allow_other_app or StreamingConf.of(sc.getConf())[config.ALLOW_OTHER_APP]):
        raise AnotherApplicationError(path, theirs, sc.appName)
    log.warning("the checkpoint in %s was written by application %r, and this SparkContext is %r: the "
                "checkpoint's program runs, as allowed (getOrCreate(..., allow_other_app=True))",
                path, theirs, sc.appName)


def _recover(context_class: type[StreamingContext], checkpoint, path: str, storage_options: dict | None,
             clock) -> StreamingContext:
    """A context rebuilt from ``checkpoint`` and its code part (:mod:`sparkwal.engine.driver.program`)."""
    sc, program = load_program(checkpoint, path, storage_options)
    ssc = context_class(sc, program.batch_ms / 1000, concurrentJobs=program.concurrent_jobs, clock=clock)
    ssc.driver.use_graph(program.graph)
    for stream in program.graph.streams:
        stream.attach(ssc)
    ssc.checkpoint(path, storage_options=storage_options)
    ssc.driver.restore(checkpoint, "checkpoint")
    log.info("recovered the program and its state from the checkpoint in %s", path)
    return ssc


def get_or_create(context_class: type[StreamingContext], path: str, setup, upgrade: bool,
                  storage_options: dict | None, clock, allow_other_app: bool = False) -> StreamingContext:
    """getOrCreate's choice: the context rebuilt from the checkpoint in ``path`` (program and
    data), or ``setup()``'s, checkpointed there, with the checkpoint's data when ``upgrade``."""
    if upgrade_preview.requested():  # sparkwal upgrade plan: the new program's plan, nothing started
        upgrade_preview.write_and_exit(setup().driver, path, "upgrade" if upgrade else "recover", storage_options)
    warm_active_workers()  # while the checkpoint is read
    checkpoint = None
    for attempt in range(3):
        checkpoint = read_checkpoint(path, storage_options=storage_options)
        if checkpoint is None or upgrade:
            break
        check_written_by(checkpoint, path, active_spark_context(), allow_other_app)  # before any unpickling
        if not checkpoint.data.get("code"):
            raise CheckpointMismatchError(
                f"the checkpoint in {path} holds no program code (it was written by an earlier "
                "sparkwal, code-free): recover it with getOrCreate(..., upgrade=True), which "
                "applies its data to the graph that setupFunc builds")
        try:
            return _recover(context_class, checkpoint, path, storage_options, clock)
        except MissingCodePartError as e:
            # a running driver (this one's standby reads beside it) deletes an earlier run's code
            # part once no checkpoint names it: a newer checkpoint names the current one
            if attempt == 2:
                raise
            log.info("%s; reading the newest checkpoint again", e)
    ssc = setup()
    if ssc.driver.checkpoint_dir is None:
        ssc.checkpoint(path, storage_options=storage_options)
    if checkpoint is not None:
        ssc.driver.restore(checkpoint, "upgrade")
        theirs = written_by(checkpoint)
        if theirs and theirs != ssc.sparkContext.appName:
            log.warning("the checkpoint in %s was written by application %r, and this SparkContext is %r: "
                        "its inputs and state go on in this program (upgrade=True)",
                        path, theirs, ssc.sparkContext.appName)
    return ssc
