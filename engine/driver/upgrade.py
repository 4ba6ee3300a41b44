"""Applying an upgrade: a new version's graph takes a checkpoint's input positions and state by
the streams' identities (:mod:`sparkwal.engine.upgrade_plan` decides what goes where), whatever
else changed around them.

A checkpoint names what it holds by number: an input's data, its receiver WAL directory and its
start offsets by the input's id, a state's snapshots by its stream's number. So:

* a carried input keeps the id it had (``DStreamGraph.renumber_inputs``), so that its files,
  blocks and offsets need no translation; an input the new version adds gets an id above every id
  the checkpoint knows (a dropped input's files are never taken for a new one's);
* a carried state goes to its stream's new position, its snapshots still named by the number
  they were written under (``StateSnapshots.carry``): another stream that now has that position
  writes under a number of its own, so that its snapshot of a batch never replaces one of the
  carried chain; a state the new version adds starts empty at the first batch the new version runs;
* the offsets log's entries name the input of each line (``sparkwal.inputIds``,
  :mod:`sparkwal.engine.sources.batch_log`): a logged batch re-runs with the ranges of the inputs
  carried, none for an added one, and a dropped input's lines are left alone. An entry an earlier
  release wrote has a line per direct input of the graph that wrote it: the checkpoint's
  ``batch_log_lines``, else the direct inputs its identities record.

What the checkpoint holds of a dropped stream (``spark.sparkwal.upgrade.allowDrop``) stays in the
directory, unread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sparkwal.checkpoint import Checkpoint
from sparkwal.checkpoint.errors import CheckpointMismatchError
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.wal import resolve

from .. import config
from ..identity import identities
from ..upgrade_plan import UpgradePlan, plan_upgrade

if TYPE_CHECKING:
    from sparkwal.wal import StorageLocation

    from ..config import StreamingConf
    from ..graph import DStreamGraph
    from ..state import StateSnapshots

log = logging.getLogger(__name__)

DROP_HINT = " (to drop it, name it in spark.sparkwal.upgrade.allowDrop, by uid or identity)"


def allowed_drops(settings) -> frozenset[str]:
    """``spark.sparkwal.upgrade.allowDrop``: the uids or identities an upgrade may drop."""
    return frozenset(n.strip() for n in (settings[config.UPGRADE_ALLOW_DROP] or "").split(",") if n.strip())


def plan_for(graph: DStreamGraph, batch_ms: int, settings: StreamingConf, data: dict) -> UpgradePlan | None:
    """The plan from checkpoint ``data`` to ``graph`` (run at ``batch_ms``); None: the checkpoint records no
    identities (written before sparkwal recorded them). A damaged record is a ValueError."""
    recorded = data.get("identities")
    if not isinstance(recorded, dict) or not recorded:
        return None
    old_ms = data.get("batch_ms")
    if isinstance(old_ms, int) and old_ms != batch_ms:  # (recovery.batch_change_refusal allows it)
        recorded = {k: _rebatched(r, old_ms, batch_ms) for k, r in recorded.items()}
    return plan_upgrade(recorded, identities(graph), allowed_drops(settings), DROP_HINT)


def _rebatched(record, old_ms: int, new_ms: int):
    """A recorded identity read at a new batch duration: a stream at the old batch's slide is at the
    new one's (a batch duration changes only where every stream slides by one batch)."""
    if not isinstance(record, dict):
        return record
    out = dict(record)
    if out.get("slide_ms") == old_ms:
        out["slide_ms"] = new_ms
    if isinstance(out.get("upstream"), list):
        out["upstream"] = sorted(f"slide {new_ms}" if u == f"slide {old_ms}" else u for u in out["upstream"])
    return out


def apply(graph: DStreamGraph, batch_ms: int, settings: StreamingConf, location: StorageLocation,
          checkpoint: Checkpoint, difference: str, said: UpgradePlan | None = None) -> UpgradePlan:
    """Renumber ``graph``'s inputs as the plan carries them and return the plan (its state goes
    across in :func:`carry_state`, once restored); refuse, naming each loss, if it loses anything.
    ``difference``: the graphs' first difference, for a checkpoint that cannot be planned from;
    ``said``: the plan already logged (a standby's every look), not logged again."""
    data = checkpoint.data
    where = f"the checkpoint in {location.url}"
    try:
        plan = plan_for(graph, batch_ms, settings, data)
    except ValueError as e:
        raise CheckpointMismatchError(f"the DStream graph changed since {where} was written ({difference}), and "
                                      f"its streams' identities cannot be read: {e}") from None
    if plan is None:
        raise CheckpointMismatchError(
            f"the DStream graph changed since {where} was written ({difference}), and it records no stream "
            "identities (an earlier sparkwal wrote it): restore the original graph and run it once with this "
            "sparkwal, or start from a new checkpoint directory")
    if plan.refusals:
        raise CheckpointMismatchError(
            f"the upgrade cannot take {where} without losing something: {'; '.join(plan.refusals)}. "
            f"(The rest of the plan: {'; '.join(line for line in plan.lines() if not line.startswith('refused'))})")
    _renumber_inputs(graph, location, data, plan)
    if said is None or said.lines() != plan.lines():
        for line in plan.lines():
            log.info("upgrade: %s", line)
    return plan


def _renumber_inputs(graph: DStreamGraph, location: StorageLocation, data: dict, plan: UpgradePlan) -> None:
    position = {id(s): i for i, s in enumerate(graph.streams)}
    kept = {new.index: old.input_id for old, new in plan.carried if old.is_input}
    known = [int(k) for k in (data.get("inputs") or {})] + list(data.get("batch_log_lines") or [])
    known += [r.get("input_id") or 0 for r in data["identities"].values() if isinstance(r, dict)]
    known.append(int((data.get("next_ids") or {}).get("input", 0)) - 1)  # ids earlier upgrades dropped
    known += _ids_with_files(location)  # an upgrade killed before its first checkpoint may have used some
    fresh = max([*known, *kept.values()], default=-1) + 1
    ids = {}
    for i, stream in enumerate(graph.inputs):
        carried = kept.get(position[id(stream)])
        ids[i], fresh = (carried, fresh) if carried is not None else (fresh, fresh + 1)
    graph.renumber_inputs(ids)


def _ids_with_files(location: StorageLocation) -> list[int]:
    """The input ids that name a directory of start offsets or received blocks (read only)."""
    layout = CheckpointLayout(location.url)
    found = []
    for where in (layout.sources, layout.received_data):
        storage, path = resolve(where, location.options)
        try:
            names = storage.list_dirs(path) if storage.exists(path) else []
        except NotImplementedError:  # (memory://, which no upgrade outlives)
            names = []
        found += [int(n.split("-")[0]) for n in names if n.split("-")[0].isdigit()]
    return found


def carry_state(graph: DStreamGraph, snapshots: StateSnapshots, plan: UpgradePlan) -> None:
    """The restored state of each carried stateful stream goes to its new position; the program's
    other stateful streams start empty (``StateSnapshots.carry``)."""
    moved = {old.index: new.index for old, new in plan.carried if not old.is_input}
    added = [i for i, s in enumerate(graph.streams) if s.must_checkpoint and i not in moved.values()]
    snapshots.carry(moved, added)


def earlier_line_ids(checkpoint: Checkpoint | None, upgraded: bool) -> list[int] | None:
    """The input ids of the lines of offsets entries that do not name them: the checkpoint's
    ``batch_log_lines``, else, after an upgrade from a checkpoint of the release before, the
    direct inputs its identities record; None: this graph's direct inputs'."""
    data = checkpoint.data if checkpoint is not None else {}
    if isinstance(data.get("batch_log_lines"), list):
        return [int(i) for i in data["batch_log_lines"]]
    recorded = data.get("identities")
    if not upgraded or not isinstance(recorded, dict):
        return None
    return sorted(r["input_id"] for r in recorded.values()
                  if isinstance(r, dict) and r.get("kind") == "direct" and isinstance(r.get("input_id"), int))
