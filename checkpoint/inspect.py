"""Looking into a checkpoint directory without writing to it (and without running its code).

Understands a sparkwal app's directory (``checkpoint-<ms>`` data files, ``code-<sha>`` parts,
``offsets/`` and ``commits/``, ``receivedBlockMetadata/``, ``state/``) and a Structured Streaming
checkpoint written by Spark itself (``metadata``, ``offsets/``, ``commits/``, ``sources/``): which
checkpoint a restart would use, the last planned and last committed batch, where a restart would
resume (``resolve_restart``), and every file that fails its checks, by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkwal.wal.inspect import LogReport, scan_log
from sparkwal.wal.storage import LeaderInfo, resolve

from . import layout
from .code import CODE_FILE, read_code
from .checkpoint_file import CHECKPOINT_FILE, Checkpoint, checkpoint_rank
from .errors import CheckpointError
from .event_log import LOG_DIR
from .offsets import CommitLog, OffsetSeqLog
from .resume import RestartPoint, resolve_restart
from .state_chains import StateSummary, summarize_state


@dataclass(frozen=True)
class LogSummary:
    """An ``offsets/`` or ``commits/`` log: its batch ids and the files that fail to parse."""

    ids: list[int]
    problems: list[str]

    @property
    def latest(self) -> int | None:
        return self.ids[-1] if self.ids else None


@dataclass
class CheckpointReport:
    url: str
    kind: str  # "sparkwal", "structured streaming" or "empty" (none of a checkpoint's files)
    newest: Checkpoint | None = None  # the DStream checkpoint a restart would use
    newest_file: str | None = None
    files: list[str] = field(default_factory=list)  # DStream checkpoint files, oldest first
    code_parts: list[str] = field(default_factory=list)
    offsets: LogSummary | None = None
    commits: LogSummary | None = None
    restart: RestartPoint | None = None
    restart_problem: str | None = None
    metadata: dict | None = None  # Structured Streaming's ``metadata`` file (query id)
    sources: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # sub-directories known to sparkwal
    state: list[StateSummary] = field(default_factory=list)  # stateful streams' snapshots
    leader: LeaderInfo | None = None  # the driver leading the directory (or that last led it)
    logs: list[LogReport] = field(default_factory=list)  # the write-ahead logs under it
    problems: list[str] = field(default_factory=list)


def _log_summary(log) -> LogSummary:
    ids, problems = [], []
    for batch_id in log.batch_ids():
        try:
            log.get(batch_id)
            ids.append(batch_id)
        except (CheckpointError, ValueError) as e:
            problems.append(str(e))
    return LogSummary(ids, problems)




def _write_ahead_logs(storage, root: str, subdirs: set[str]) -> list[str]:
    """The URLs of the write-ahead logs a sparkwal checkpoint holds: the block tracker's, each
    receiver's data log, and each driver run's event log."""
    paths = layout.CheckpointLayout(storage.url(root))
    logs = [paths.block_metadata] if layout.RECEIVED_BLOCK_METADATA in subdirs else []
    if layout.RECEIVED_DATA in subdirs:
        data = storage.join(root, layout.RECEIVED_DATA)
        logs += [storage.url(storage.join(data, d)) for d in sorted(storage.list_dirs(data))]
    if layout.EVENTS in subdirs:
        events = storage.join(root, layout.EVENTS)
        for run in sorted(storage.list_dirs(events)):
            if LOG_DIR in storage.list_dirs(storage.join(events, run)):
                logs.append(storage.url(storage.join(storage.join(events, run), LOG_DIR)))
    return logs


def inspect_checkpoint(url: str, storage_options: dict | None = None, verify_state: bool = False
                       ) -> CheckpointReport:
    """What is in the checkpoint directory ``url``; with ``verify_state``, every part of every
    state snapshot the newest checkpoint references is read and checked too."""
    storage, root = resolve(url, storage_options)
    entries = storage.list_files(root)
    names = {e.name: e for e in entries}
    report = CheckpointReport(storage.url(root), "empty")
    try:
        subdirs = set(storage.list_dirs(root))
    except FileNotFoundError:
        report.problems.append(f"{report.url}: no such directory")
        return report

    dstream_files = sorted((int(m.group(1)), m.group(2) is None, e.path)
                           for e in entries if (m := CHECKPOINT_FILE.fullmatch(e.name)))
    report.files = [storage.url(p) for _t, _main, p in dstream_files]
    best = None  # the one a restart takes: see checkpoint_rank
    for t, main, path in reversed(dstream_files):
        try:
            checkpoint = Checkpoint.decode(storage.read_file(path), storage.url(path))
        except CheckpointError as e:
            report.problems.append(str(e))
            continue
        if best is None or checkpoint_rank(checkpoint, t, main) > best:
            best = checkpoint_rank(checkpoint, t, main)
            report.newest, report.newest_file = checkpoint, storage.url(path)
    report.code_parts = sorted(n for n in names if CODE_FILE.fullmatch(n))
    for name in report.code_parts:
        try:
            read_code(url, name, storage_options)
        except CheckpointError as e:
            report.problems.append(str(e))
    code = report.newest.data.get("code") if report.newest is not None else None
    if code and code not in report.code_parts:
        report.problems.append(f"{report.newest_file} names code part {code}, which is missing")
    if report.newest is not None:
        report.state = summarize_state(report.newest.data.get("state", {}), storage_options,
                                       verify=verify_state, layout=layout.CheckpointLayout(url))
        report.problems += [p for s in report.state for p in s.problems]

    if layout.METADATA in names:
        try:
            report.metadata = json.loads(storage.read_file(names[layout.METADATA].path))
        except ValueError as e:
            report.problems.append(f"{storage.url(names[layout.METADATA].path)}: not JSON ({e})")
    if layout.OFFSETS in subdirs or layout.COMMITS in subdirs:
        paths = layout.CheckpointLayout(report.url)
        offsets = OffsetSeqLog(paths.offsets, storage_options, create=False)
        commits = CommitLog(paths.commits, storage_options, create=False)
        report.offsets, report.commits = _log_summary(offsets), _log_summary(commits)
        report.problems += report.offsets.problems + report.commits.problems
        try:
            report.restart = resolve_restart(offsets, commits)
        except (CheckpointError, ValueError) as e:
            report.restart_problem = str(e)
            report.problems.append(str(e))
    if layout.SOURCES in subdirs:
        report.sources = sorted(storage.list_dirs(storage.join(root, layout.SOURCES)))
    report.other = sorted(d for d in subdirs if d in (layout.RECEIVED_BLOCK_METADATA, layout.RECEIVED_DATA,
                                                      layout.STATE, layout.RDDS))
    for log_url in _write_ahead_logs(storage, root, subdirs):
        log_report = scan_log(log_url, storage_options)
        report.logs.append(log_report)
        report.problems += [f"{s.path} at byte offset {offset}: {what}"
                            for s in log_report.problems if s.problem is not None
                            for offset, what in [s.problem]]
    report.leader = storage.leader(root)  # read only: inspectors take no lock
    if report.newest is not None or report.code_parts or report.files or report.logs or report.leader:
        report.kind = "sparkwal"  # (a driver leading it before its first checkpoint, too)
    elif report.metadata is not None or report.offsets is not None:
        report.kind = "structured streaming"
    return report

