"""Whether the leader at an epoch has completed a batch, read from a checkpoint directory without
writing or locking anything: what ``sparkwal checkpoint handover`` waits for before it reports
success, and what the old leader waits for before it stops its SparkContext
(:mod:`sparkwal.engine.driver.handover`)."""

from __future__ import annotations

from .checkpoint_file import read_checkpoint
from .layout import CheckpointLayout
from .offsets import CommitLog


def last_completed_ms(directory: str, storage_options: dict | None) -> int | None:
    """The newest checkpoint's last completed batch time, or None."""
    cp = read_checkpoint(directory, storage_options=storage_options)
    return cp.data.get("completed_ms") if cp is not None else None


def batch_done_at_epoch(directory: str, storage_options: dict | None, epoch: int,
                        after_ms: int | None = None) -> bool:
    """Whether a leader at ``epoch`` (or a newer one) completed a batch in ``directory``: a
    checkpoint it wrote after a batch's outputs succeeded (a batch after ``after_ms``, when given:
    a new leader's first checkpoint on a new batch grid repeats the old leader's last batch), or a
    commit it wrote (read only; no log is created)."""
    cp = read_checkpoint(directory, storage_options=storage_options)
    done = cp.data.get("completed_ms") if cp is not None else None
    if cp is not None and cp.leader_epoch >= epoch and done is not None and done > (after_ms or -1):
        return True
    newest = CommitLog(CheckpointLayout(directory).commits, storage_options, create=False).get_latest()
    return newest is not None and (newest[1].leader_epoch or 0) >= epoch
