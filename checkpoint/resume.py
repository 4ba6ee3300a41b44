"""Where a restarted query resumes: Spark's rules for pairing the offset and commit logs
(``MicroBatchExecution.populateStartOffsets``, sql/core/src/main/scala/org/apache/spark/sql/
execution/streaming/MicroBatchExecution.scala), with errors that say what is wrong and a repair
plan where Spark only says "batch N doesn't exist".

Rules, with ``N`` the latest batch in ``offsets/`` and ``C`` the latest in ``commits/``:

===========================  =====================================================================
state                        resume
===========================  =====================================================================
no offsets, no commits       batch 0, from the sources' start
``C == N``                   batch ``N+1``, starting after ``offsets/N``; watermark from ``commits/N``
``C == N-1`` or no commits   re-run ``N`` with exactly ``offsets/N`` (and its timestamp/watermark),
                             starting after ``offsets/N-1``
``C < N-1``                  re-run ``N`` as above, with Spark's warning (batches in between have
                             offsets but no commit)
``offsets/N-1`` missing and  RestartError naming the missing file (Spark: "batch N-1 doesn't exist";
``N`` must re-run            Spark also fails this way when ``N`` is committed, which needs no N-1)
``C > N``, or commits only   RestartError: the commit log is ahead of the offset log
===========================  =====================================================================

``plan_repair`` turns the two error states into a list of files to delete after which the rules
apply again; ``repair`` carries it out. Nothing committed is lost: a repaired query re-plans the
next batch from the committed offsets, so it may re-read data (at-least-once), never skip it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .errors import RestartError
from .offsets import CommitLog, OffsetMap, OffsetSeq, OffsetSeqLog, OffsetSeqMetadata

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPoint:
    batch_id: int  #: the batch to run next
    rerun: bool  #: True: that batch's offsets are logged; run it again with exactly those
    start_offsets: list | dict | None  #: the offsets it starts after (None: the sources' start)
    end_offsets: list | dict | None  #: when re-running: the logged end offsets, else None
    metadata: OffsetSeqMetadata | None  #: when re-running: the logged timestamp/watermark/conf
    watermark_ms: int  #: the event-time watermark to resume with
    warnings: tuple[str, ...] = ()
    #: every logged but uncommitted batch, oldest first: a restart re-runs all of them with their
    #: logged offsets, in order (Spark re-runs only the last, ``batch_id``, and warns)
    rerun_batches: tuple[int, ...] = ()


def _offsets_of(value: OffsetSeq | OffsetMap | None) -> list | dict | None:
    return None if value is None else value.offsets


def resolve_restart(offsets: OffsetSeqLog, commits: CommitLog) -> RestartPoint:
    offset_ids = offsets.batch_ids()
    commit_ids = commits.batch_ids()
    if not offset_ids:
        if commit_ids:
            raise RestartError(
                f"{commits.path} has batches {_span(commit_ids)} but {offsets.path} is empty: the "
                "offset log was lost. Restore it, or run checkpoint.plan_repair()/repair() to drop the "
                "commit log and start again from the sources' start.")
        return RestartPoint(0, False, None, None, None, 0)

    n = offset_ids[-1]
    latest = offsets.get(n)
    c = commit_ids[-1] if commit_ids else None
    if c is not None and c > n:
        raise RestartError(
            f"the commit log is ahead of the offset log: {commits.file_url(c)} exists but the latest "
            f"offsets file is {offsets.file_url(n)}. Offsets of batches {n + 1}..{c} are lost; run "
            "checkpoint.plan_repair()/repair() to re-run them from the offsets of batch "
            f"{n} (at-least-once), or restore the missing offsets files.")
    assert latest is not None  # n is the newest offsets entry
    metadata = latest.metadata
    watermark = metadata.batch_watermark_ms if metadata is not None else 0
    if c == n:  # resuming after a committed batch needs only its own offsets
        commit = commits.get(c)
        assert commit is not None  # c is the newest commit
        return RestartPoint(n + 1, False, _offsets_of(latest), None, None,
                            max(watermark, commit.next_batch_watermark_ms))

    previous = None
    if n > 0:  # re-running batch n needs the offsets it starts after
        previous = offsets.get(n - 1)
        if previous is None:
            raise RestartError(
                f"batch {n - 1} doesn't exist: {offsets.file_url(n - 1)} is missing, so batch {n} "
                f"({offsets.file_url(n)}) cannot be re-run (its start offsets are unknown). The "
                f"offset log holds {_span(offset_ids)}, the commit log "
                f"{_span(commit_ids) if commit_ids else 'nothing'}. Run checkpoint.plan_repair()/"
                "repair() to drop the unusable offsets files and re-plan from the last committed batch.")
    warnings: tuple[str, ...] = ()
    first = 0 if c is None else c + 1
    if c is not None and c < n - 1:
        msg = (f"Batch completion log latest batch id is {c}, which is not trailing batchid {n} "
               f"by one: batches {first}..{n} are re-run, in order")
        log.warning(msg)
        warnings = (msg,)
    missing = [i for i in range(first, n) if i not in set(offset_ids)]
    if missing:
        raise RestartError(
            f"batches {_span(missing)} have no offsets file ({offsets.file_url(missing[0])} is "
            f"missing) but batch {n} is logged and the last commit is "
            f"{'none' if c is None else c}: they cannot be re-run. Run checkpoint.plan_repair()/"
            "repair() to re-plan from the last committed batch.")
    return RestartPoint(n, True, _offsets_of(previous), _offsets_of(latest), metadata, watermark,
                        warnings, tuple(range(first, n + 1)))


@dataclass(frozen=True)
class RepairPlan:
    delete: tuple[str, ...]  #: file URLs to delete, offsets first
    reason: str
    offsets_after: tuple[int, ...]  #: offsets batch ids dropped
    commits_after: tuple[int, ...]  #: commit batch ids dropped


def plan_repair(offsets: OffsetSeqLog, commits: CommitLog) -> RepairPlan:
    """Files to delete so that ``resolve_restart`` succeeds without skipping committed data."""
    offset_ids = offsets.batch_ids()
    commit_ids = commits.batch_ids()
    have = set(offset_ids)
    drop_commits: list[int] = []
    if commit_ids and (not offset_ids or commit_ids[-1] > offset_ids[-1]):
        keep_to = offset_ids[-1] if offset_ids else -1
        drop_commits = [i for i in commit_ids if i > keep_to]
        commit_ids = [i for i in commit_ids if i <= keep_to]
    c = commit_ids[-1] if commit_ids else -1
    if c + 1 in have and (c + 1 == 0 or c in have):
        keep = c + 1  # the uncommitted batch after the last commit can be re-run
    elif c in have:
        keep = c  # the last committed batch: resume right after it
    elif c == -1:
        keep = -1  # nothing usable: start from the sources' start
    else:
        raise RestartError(
            f"cannot repair: the latest committed batch is {c} but {offsets.file_url(c)} is missing, "
            "so there is no offset to resume from; restore it from a backup")
    drop_offsets = [i for i in offset_ids if i > keep]
    urls = tuple([offsets.file_url(i) for i in drop_offsets] + [commits.file_url(i) for i in drop_commits])
    reason = (f"keep offsets up to batch {keep}" if keep >= 0 else "drop everything") + (
        f", drop offsets {_span(drop_offsets)}" if drop_offsets else "") + (
        f", drop commits {_span(drop_commits)}" if drop_commits else "")
    return RepairPlan(urls, reason, tuple(drop_offsets), tuple(drop_commits))


def repair(offsets: OffsetSeqLog, commits: CommitLog) -> RepairPlan:
    """Carry out ``plan_repair``: delete the files it names (offsets first, then commits)."""
    plan = plan_repair(offsets, commits)
    if plan.offsets_after:
        offsets.purge_after(plan.offsets_after[0] - 1)
    if plan.commits_after:
        commits.purge_after(plan.commits_after[0] - 1)
    log.warning("repaired %s / %s: %s", offsets.path, commits.path, plan.reason)
    return plan


def _span(ids: list[int]) -> str:
    if not ids:
        return "nothing"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ", ".join(map(str, ids[:20])) + (" ..." if len(ids) > 20 else "")
