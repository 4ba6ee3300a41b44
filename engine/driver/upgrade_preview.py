"""``sparkwal upgrade plan``'s engine side: what an upgrade of a checkpoint to this program would do,
said before the deploy.

A program run with ``SPARKWAL_UPGRADE_PLAN=<file>`` in its environment (the command sets it, with
``SPARKWAL_UPGRADE_CHECKPOINT=<the checkpoint>``) builds its streams as usual; where it would
recover or start them (``StreamingContext.getOrCreate``, or ``start()`` for a program that makes its
context itself), the engine instead writes the plan to ``<file>`` as one JSON object and ends the
process with status 0. Nothing is started: no stream, no Spark job, no leadership; nothing in the
checkpoint directory is written (its files are only read).

The JSON object: :meth:`sparkwal.engine.upgrade_plan.UpgradePlan.to_json`'s fields, plus
``checkpoint`` (the directory planned against), ``program_checkpoint`` (the one the program names;
None: none), ``checkpoint_time_ms``, ``rerun_batch_times`` (the checkpoint's pending batches and the
logged uncommitted ones: they re-run in the new graph, once), ``repartitioned`` (``[{"name", "from",
"to"}]``: a carried state whose number of partitions changes, restored into the new one by one
shuffle), ``batch_change`` (``{"from_ms", "to_ms", "from_batch"}``: the batch duration changes, the
new batches following that one; None: it does not), ``lines`` (the plan for a person) and, when the
plan cannot be made, ``error``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING

from sparkwal.checkpoint import CommitLog, OffsetSeqLog, read_checkpoint
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.checkpoint.resume import resolve_restart
from sparkwal.checkpoint.state_files import read_manifest

from . import recovery, upgrade

if TYPE_CHECKING:
    from .driver import Driver

log = logging.getLogger(__name__)

UPGRADE_PLAN_ENV = "SPARKWAL_UPGRADE_PLAN"
UPGRADE_CHECKPOINT_ENV = "SPARKWAL_UPGRADE_CHECKPOINT"


def requested() -> bool:
    return bool(os.environ.get(UPGRADE_PLAN_ENV))


#: what a deploy of the program would do instead of an upgrade: why the plan refuses it
_NOT_AN_UPGRADE = {
    "recover": "the program calls getOrCreate without upgrade=True: a deploy would run the checkpoint's own "
               "program, not this one (pass upgrade=True)",
    "fresh": "the program starts a new stream (it calls start() without getOrCreate): nothing of the checkpoint "
             "would carry over"}


def write_and_exit(driver: Driver, program_checkpoint: str | None, how: str, storage_options: dict | None) -> None:
    """Write the plan to the file ``SPARKWAL_UPGRADE_PLAN`` names, then end the process (status 0).
    ``how``: "upgrade" (``getOrCreate(..., upgrade=True)``), "recover" (``getOrCreate`` without it) or
    "fresh" (``start()`` of a context the program made)."""
    try:
        if how in _NOT_AN_UPGRADE:
            result = {"error": _NOT_AN_UPGRADE[how], "loses_nothing": False}
        else:
            result = preview(driver, os.environ.get(UPGRADE_CHECKPOINT_ENV) or program_checkpoint, program_checkpoint,
                             storage_options)
    except Exception as e:  # noqa: BLE001 (said to the command, one line)
        result = {"error": f"{type(e).__name__}: {e}", "loses_nothing": False}
    with open(os.environ[UPGRADE_PLAN_ENV], "w") as f:
        json.dump(result, f, sort_keys=True)
    logging.shutdown()
    os._exit(0)  # the program's own code after getOrCreate/start() must not run: it would start things


def preview(driver: Driver, checkpoint: str | None, program_checkpoint: str | None,
            storage_options: dict | None = None) -> dict:
    """The plan from the checkpoint in ``checkpoint`` to ``driver``'s graph (read only)."""
    if checkpoint is None:
        return {"error": "the program names no checkpoint directory, and none was given", "loses_nothing": False}
    options = (storage_options or driver.storage_options) if program_checkpoint == checkpoint else None
    cp = read_checkpoint(checkpoint, storage_options=options)
    if cp is None:
        return {"error": f"{checkpoint} holds no DStream checkpoint", "checkpoint": checkpoint,
                "loses_nothing": False}
    data = cp.data
    plan = upgrade.plan_for(driver.graph, driver.batch_ms, driver.settings, data)
    if plan is None:
        same = data.get("fingerprint") == driver.graph.fingerprint()
        return {"error": None if same else "the checkpoint records no stream identities (an earlier sparkwal "
                "wrote it) and the graph changed: restore the original graph and run it once with this sparkwal",
                "checkpoint": checkpoint, "loses_nothing": same,
                "lines": ["the graph is the checkpoint's: everything is carried"] if same else []}
    batch_change = None
    refused = recovery.batch_change_refusal(driver.graph, driver.batch_ms, driver.checkpoint_dir, data.get("batch_ms"),
                                            "upgrade")
    if refused is not None:
        plan.refusals.append(refused)
    reruns = sorted({*cp.pending_times_ms, *_logged_uncommitted(checkpoint, options)})
    if refused is None and data.get("batch_ms") != driver.batch_ms:
        if reruns or data.get("completed_ms") != cp.checkpoint_time_ms:
            plan.refusals.append(f"the batch duration changes from {data.get('batch_ms')} ms to {driver.batch_ms} ms, "
                                 "but batches of the old duration are left to re-run: stop the old version "
                                 "gracefully (or hand over), which completes them")
        else:
            batch_change = {"from_ms": data.get("batch_ms"), "to_ms": driver.batch_ms,
                            "from_batch": cp.checkpoint_time_ms}
    repartitioned = _repartitioned(driver, data, plan, checkpoint, options)
    lines = plan.lines()
    lines += [f"repartitioned: {r['name']} from {r['from']} to {r['to']} partitions" for r in repartitioned]
    lines.append(f"re-run in the new graph: batches {reruns}" if reruns else "re-run: no batch")
    if batch_change is not None:
        lines.append(f"batch duration: {batch_change['from_ms']} ms -> {batch_change['to_ms']} ms, the new batches "
                     f"after batch {batch_change['from_batch']} (every state kept is per key: exact)")
    return {**plan.to_json(), "checkpoint": checkpoint, "program_checkpoint": program_checkpoint,
            "checkpoint_time_ms": cp.checkpoint_time_ms, "rerun_batch_times": reruns, "batch_change": batch_change,
            "repartitioned": repartitioned, "lines": lines, "error": None}


def _logged_uncommitted(checkpoint: str, options: dict | None) -> list[int]:
    """The times of the logged batches a restart re-runs with their logged offsets (Spark's rules:
    :func:`sparkwal.checkpoint.resume.resolve_restart`, which also refuses logs it cannot resume from)."""
    layout = CheckpointLayout(checkpoint)
    offsets = OffsetSeqLog(layout.offsets, options, create=False)
    restart = resolve_restart(offsets, CommitLog(layout.commits, options, create=False))
    entries = [offsets.get(i) for i in restart.rerun_batches]
    return [e.metadata.batch_timestamp_ms for e in entries if e is not None and e.metadata is not None]


def _repartitioned(driver: Driver, data: dict, plan, checkpoint: str, options: dict | None) -> list[dict]:
    out = []
    layout = CheckpointLayout(checkpoint)
    for old, new in plan.carried:
        stream = driver.graph.streams[new.index]
        wanted = getattr(stream, "num_partitions", None)
        chain = (data.get("state") or {}).get(str(old.index), {}).get("snapshots") or {}
        if wanted is None or not chain:
            continue
        newest = chain[max(chain, key=int)]
        try:
            had = len(read_manifest(layout.locate(newest["url"]), options)["parts"])
        except Exception as e:  # noqa: BLE001 (the restart would name it; the plan says it)
            log.warning("the newest snapshot of %s cannot be read: %s", new.name, e)
            continue
        if had != wanted:
            out.append({"name": new.name, "from": had, "to": wanted})
    return out
