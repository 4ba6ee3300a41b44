"""The ``sparkwal`` command: inspect, verify and repair write-ahead logs and checkpoints.

    sparkwal wal inspect DIR [--records]      segments, records, the writer's lock or lease
    sparkwal wal verify DIR                   every record checked; problems by file and offset
    sparkwal wal repair DIR [--yes]           cut a torn tail; set damaged segments aside
    sparkwal checkpoint inspect DIR           a sparkwal app's or a Structured Streaming checkpoint
    sparkwal checkpoint verify DIR            every checkpoint file checked
    sparkwal checkpoint repair DIR [--yes]    make a checkpoint verify and restart (plan shown first)
    sparkwal checkpoint state DIR [--out F]   the newest state of each stateful stream, as a
                                              table (printed, or written as Parquet or Arrow)
    sparkwal run wordcount [ARGS]             the main job (python -m engine.wordcount ARGS)
    sparkwal drill [ARGS]                     the kill-and-restart drill (python -m engine.drill ARGS)
    sparkwal ui DIR [--port P] | status DIR   a checkpoint's driver runs and batches, served or printed

DIR is a local path or any fsspec URL (``--storage-option key=value``, repeatable, or the
environment's credentials). ``--json`` prints one JSON object instead of text. Exit status, the
same for every verb: 0 all is well, 1 a problem was found (damage, a DIR that does not exist or
is not a directory, a live writer or driver in the way, or a repair only planned), 2 a usage
error. Inspecting and verifying never write and never take a lock; repairing creates nothing
where there is nothing, takes the writer's lock and never deletes data: what it removes from
the way it moves aside, renamed ``<name>.damaged-<ms>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

OK, PROBLEM, USAGE = 0, 1, 2


class UsageError(ValueError):
    """A command line that cannot be carried out as written (exit status 2)."""


class MissingDirectory(ValueError):
    """DIR does not exist or is not a directory (exit status 1: a cron job's mistyped path must
    not verify as a healthy, empty log)."""


def _require_directory(args, what: str) -> None:
    """Raise :class:`MissingDirectory` naming ``args.dir`` unless it is a directory (on an object
    store: unless something is stored under it). Reads only."""
    import os

    from wal.storage import resolve

    try:
        storage, root = resolve(args.dir, _options(args.storage_option))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not storage.exists(root):
        raise MissingDirectory(f"no such {what} directory: {args.dir}")
    if storage.is_local and not os.path.isdir(root):
        raise MissingDirectory(f"not a directory: {args.dir} (a {what} is a directory)")


def _options(pairs: list[str]) -> dict | None:
    from wal.storage import parse_storage_options

    try:
        return parse_storage_options(pairs)
    except ValueError as e:
        raise UsageError(str(e)) from None


class _Progress:
    """A progress bar on stderr for scans that take more than a moment (and only on a terminal)."""

    def __init__(self, what: str):
        self.what, self.started, self.shown = what, time.monotonic(), False

    def __call__(self, done: int, total: int) -> None:
        if not sys.stderr.isatty() or time.monotonic() - self.started < 0.5:
            return
        filled = int(30 * done / max(total, 1))
        sys.stderr.write(f"\r{self.what} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def _emit(args, data: dict, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(data, default=_jsonable, sort_keys=True))
    elif lines:
        print("\n".join(lines))


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


# ------------------------------------------------------------------------------ wal


def _scan(args):
    from wal.inspect import scan_log

    _require_directory(args, "log")
    progress = _Progress("scanning segments")
    try:
        return scan_log(args.dir, _options(args.storage_option), progress)
    finally:
        progress.close()


def _writer_line(writer) -> str:
    if writer is None:
        return "writer: none has locked this directory"
    state = {True: "held", False: "free", None: "unknown"}[writer.held]
    until = f", expires {_ms(writer.expires_ms)}" if writer.expires_ms else ""
    return f"writer: {writer.kind} {state} (last holder: {writer.holder}{until})"


def wal_inspect(args) -> int:
    report = _scan(args)
    lines = [f"log {report.url}: {len(report.segments)} segments, {report.records} records",
             _writer_line(report.writer)]
    for s in report.segments:
        note = (f"  DAMAGED at byte {s.problem[0]}: {s.problem[1]}" if s.problem
                else f"  torn tail of {s.torn_bytes} bytes" if s.torn_bytes else "")
        lines.append(f"  {s.path}  {_ms(s.start_ms)} .. {_ms(s.end_ms)}  {s.size} bytes  "
                     f"{s.records} records{note}")
    data = {"log": report.url, "segments": report.segments, "records": report.records,
            "writer": report.writer}
    if args.records:
        records = list(_records(args))
        data["record_list"] = records
        lines += [f"  {r['segment']}@{r['offset']}: {r['event'] if 'event' in r else r['bytes']}"
                  for r in records]
    _emit(args, data, lines)
    return PROBLEM if report.problems else OK


def _records(args):
    """Every record, with the tracker's events decoded in a ``receivedBlockMetadata`` log."""
    from checkpoint.layout import RECEIVED_BLOCK_METADATA
    from wal.inspect import iter_records

    decode = None
    if args.dir.rstrip("/").endswith(RECEIVED_BLOCK_METADATA):
        from tracker import decode_event

        decode = decode_event
    for segment, offset, payload in iter_records(args.dir, _options(args.storage_option)):
        record = {"segment": segment, "offset": offset, "bytes": len(payload)}
        if decode is not None:
            try:
                event = decode(payload)
                record["event"] = {"type": type(event).__name__, **_plain(event)}
            except ValueError as e:
                record["event"] = {"type": "undecodable", "error": str(e)}
        yield record


def _plain(event) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(event), default=str))


def wal_verify(args) -> int:
    report = _scan(args)
    problems = [{"file": s.path, "offset": s.problem[0], "problem": s.problem[1],
                 "records_before": s.records} for s in report.problems]
    torn = [{"file": s.path, "offset": s.valid_end, "torn_bytes": s.torn_bytes}
            for s in report.segments if s.torn_bytes]
    lines = [f"{p['file']} at byte offset {p['offset']}: {p['problem']} "
             f"({p['records_before']} records before it read back)" for p in problems]
    lines += [f"{t['file']}: torn tail of {t['torn_bytes']} bytes after offset {t['offset']} "
              "(a write cut short by a crash; never acknowledged; the next writer cuts it)" for t in torn]
    lines.append(f"{'FAILED' if problems else 'OK'}: {report.records} records in "
                 f"{len(report.segments)} segments verified, {len(problems)} damaged")
    _emit(args, {"log": report.url, "records": report.records, "problems": problems, "torn_tails": torn,
                 "ok": not problems}, lines)
    return PROBLEM if problems else OK


def wal_repair(args) -> int:
    from wal import LogLockedError
    from wal.inspect import repair_log

    _require_directory(args, "log")  # repairing creates nothing where there is nothing
    progress = _Progress("scanning segments")
    try:
        steps, moved, applied = repair_log(args.dir, args.yes, _options(args.storage_option), progress)
    except LogLockedError as e:
        _emit(args, {"log": args.dir, "error": str(e), "applied": False}, [f"cannot repair: {e}"])
        return PROBLEM
    finally:
        progress.close()
    lines = [f"{s.action}: {s.path} (keeps {s.keep_bytes} bytes, loses {s.lost_bytes} bytes)"
             for s in steps] or [f"nothing to repair in {args.dir}"]
    if not applied:
        lines.append("damaged segments are set aside only with --yes (nothing was changed)")
    else:
        lines += [f"damaged segment kept as {p}" for p in moved] + (["repaired"] if steps else [])
    _emit(args, {"log": args.dir, "steps": steps, "applied": applied, "moved_aside": moved}, lines)
    return OK if applied else PROBLEM


# ------------------------------------------------------------------------------ checkpoint


def checkpoint_inspect(args) -> int:
    from checkpoint.inspect import inspect_checkpoint

    _require_directory(args, "checkpoint")
    # everything checked, as `wal inspect` checks every record: the exit status says the same
    r = inspect_checkpoint(args.dir, _options(args.storage_option), verify_state=True)
    lines = [f"checkpoint {r.url} ({r.kind})"]
    if r.newest is not None:
        data = r.newest.data
        lines += [f"newest checkpoint: {r.newest_file} (batch {_ms(r.newest.checkpoint_time_ms)}, "
                  f"pending {[_ms(t) for t in r.newest.pending_times_ms]})",
                  f"  batch duration {data.get('batch_ms')} ms, graph: {data.get('graph', '?')}",
                  f"  program: {data.get('code') or 'none (recover with upgrade=True)'}"]
        lines += [_state_line(s) for s in r.state]
    if r.metadata is not None:
        lines.append(f"query id: {r.metadata.get('id')}")
    if r.offsets is not None:
        lines.append(f"last planned batch: {r.offsets.latest}, last committed batch: {r.commits.latest}")
        if r.restart is not None:
            lines.append(f"a restart resumes at batch {r.restart.batch_id}"
                         + (" (re-running its logged offsets)" if r.restart.rerun else ""))
    if r.sources:
        lines.append(f"sources: {', '.join(r.sources)}")
    if r.leader is not None:
        state = {True: "active", False: "none (free)", None: "unknown"}[r.leader.held]
        lines.append(f"leader: {state}; epoch {r.leader.epoch}, {r.leader.describe()}")
    lines += [f"also: {d}/" for d in r.other] + [f"PROBLEM: {p}" for p in r.problems]
    out = {"checkpoint": r.url, "kind": r.kind, "newest_file": r.newest_file, "files": r.files,
           "newest": r.newest, "code_parts": r.code_parts, "offsets": r.offsets, "commits": r.commits,
           "restart": r.restart, "metadata": r.metadata, "sources": r.sources, "state": r.state,
           "leader": r.leader, "problems": r.problems}
    _emit(args, out, lines)
    return PROBLEM if r.problems else OK


def _state_line(s) -> str:
    if s.newest_ms is None:
        return f"  state {s.name}: no snapshot yet"
    links = " + ".join(f"{c['kind']}@{_ms(c['time_ms'])} ({c['rows']} rows, {c['bytes']} bytes)"
                       for c in s.chain)
    return f"  state {s.name}: batch {_ms(s.newest_ms)} = {links or '?'}; {s.snapshots} snapshots kept"


def checkpoint_state(args) -> int:
    import pyarrow.feather as feather
    import pyarrow.parquet as parquet

    from checkpoint.state_chains import read_state

    _require_directory(args, "checkpoint")
    tables = read_state(args.dir, _options(args.storage_option))
    if args.stream:
        if args.stream not in tables:
            raise UsageError(f"no stateful stream {args.stream!r} in {args.dir} "
                             f"(there are: {', '.join(tables) or 'none'})")
        tables = {args.stream: tables[args.stream]}
    written, lines = {}, []
    for name, table in tables.items():
        pickled = (table.schema.metadata or {}).get(b"sparkwal.pickled", b"").decode()
        lines.append(f"{name}: {table.num_rows} keys, key {table.schema.field('key').type}, "
                     f"value {table.schema.field('value').type}"
                     + (f" (pickled: {pickled})" if pickled else ""))
        if args.out:
            path = args.out if len(tables) == 1 else _per_stream(args.out, name)
            fmt = args.format or ("parquet" if path.endswith(".parquet") else "arrow")
            (parquet.write_table if fmt == "parquet" else feather.write_feather)(table, path)
            written[name] = path
            lines.append(f"  written to {path} ({fmt})")
        else:
            for k, v in zip(table.column("key").to_pylist()[:args.limit],
                            table.column("value").to_pylist()[:args.limit]):
                lines.append(f"  {k!r}: {v!r}")
            if table.num_rows > args.limit:
                lines.append(f"  ... {table.num_rows - args.limit} more (--limit, or --out FILE)")
    if not tables:
        lines.append(f"no stateful stream has a snapshot in {args.dir}")
    data = {name: {"rows": t.num_rows, "schema": str(t.schema), "written": written.get(name),
                   "head": None if args.out else [{"key": k, "value": v} for k, v in zip(
                       t.column("key").to_pylist()[:args.limit], t.column("value").to_pylist()[:args.limit])]}
            for name, t in tables.items()}
    _emit(args, data, lines)
    return OK


def _per_stream(out: str, name: str) -> str:
    stem, dot, suffix = out.rpartition(".")
    return f"{stem}.{name}.{suffix}" if dot and "/" not in suffix else f"{out}.{name}"


def checkpoint_verify(args) -> int:
    from checkpoint.inspect import inspect_checkpoint

    _require_directory(args, "checkpoint")
    r = inspect_checkpoint(args.dir, _options(args.storage_option), verify_state=True)
    lines = [f"PROBLEM: {p}" for p in r.problems]
    lines.append(f"{'FAILED' if r.problems else 'OK'}: {r.url} ({r.kind}), {len(r.files)} checkpoint "
                 f"files, {len(r.code_parts)} code parts, "
                 f"{len(r.offsets.ids) if r.offsets else 0} offsets, {len(r.commits.ids) if r.commits else 0} commits, "
                 f"{sum(s.snapshots for s in r.state)} state snapshots, "
                 f"{sum(log.records for log in r.logs)} records in {len(r.logs)} write-ahead logs")
    _emit(args, {"checkpoint": r.url, "kind": r.kind, "problems": r.problems, "ok": not r.problems}, lines)
    return PROBLEM if r.problems else OK


def checkpoint_repair(args) -> int:
    """Everything that keeps a checkpoint from verifying, in one plan: damaged ``checkpoint-<t>``
    files set aside (a restart reads the newest good one), its write-ahead logs repaired as
    ``wal repair`` does, the offsets/commits made restartable. Refused while a driver leads it."""
    from checkpoint import CommitLog, OffsetSeqLog, plan_repair, repair
    from checkpoint.checkpoint_file import set_aside_damaged
    from checkpoint.layout import CheckpointLayout
    from checkpoint.inspect import inspect_checkpoint
    from wal import LogLockedError
    from wal.inspect import plan_repair as plan_log_repair, repair_log

    _require_directory(args, "checkpoint")
    options = _options(args.storage_option)
    r = inspect_checkpoint(args.dir, options)
    if r.leader is not None and r.leader.held:
        _emit(args, {"checkpoint": r.url, "error": "a driver leads it", "applied": False},
              [f"cannot repair {r.url}: a running driver leads it ({r.leader.describe()}); stop it first"])
        return PROBLEM
    data: dict = {"checkpoint": r.url, "applied": False}
    damaged = set_aside_damaged(r.url, options, apply=args.yes)
    data["checkpoint_files"] = [{"file": f, "problem": why, "moved_to": aside} for f, why, aside in damaged]
    lines = [f"set aside damaged checkpoint file: {f} ({why})" + (f" -> {aside}" if aside else "")
             for f, why, aside in damaged]
    changes = bool(damaged)
    data["logs"] = []
    for log in r.logs:
        steps = plan_log_repair(log)
        if not steps:
            continue
        changes = True
        moved: list[str] = []
        if args.yes:
            try:
                steps, moved, _ = repair_log(log.url, True, options)
            except LogLockedError as e:
                _emit(args, {**data, "error": str(e)}, lines + [f"cannot repair: {e}"])
                return PROBLEM
        data["logs"].append({"log": log.url, "steps": steps, "moved_aside": moved})
        lines += [f"{s.action}: {s.path} (keeps {s.keep_bytes} bytes, loses {s.lost_bytes} bytes)"
                  for s in steps] + [f"damaged segment kept as {p}" for p in moved]
    if r.offsets is not None:
        paths = CheckpointLayout(r.url)
        offsets = OffsetSeqLog(paths.offsets, options)
        commits = CommitLog(paths.commits, options)
        plan = plan_repair(offsets, commits)
        data["plan"] = plan
        lines += [f"offsets/commits: {plan.reason}"] + [f"  delete {u}" for u in plan.delete]
        if plan.delete:
            changes = True
            if args.yes:
                repair(offsets, commits)
    if not changes:
        _emit(args, data, lines + [f"nothing to repair in {r.url}"])
        return OK
    if not args.yes:
        _emit(args, data, lines + ["applied only with --yes (nothing was changed)"])
        return PROBLEM
    data["applied"] = True
    _emit(args, data, lines + ["repaired"])
    return OK


# ------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkwal", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    areas = parser.add_subparsers(dest="area", required=True, metavar="{wal,checkpoint,run,drill,ui,status}")
    verbs = {
        "wal": {"inspect": (wal_inspect, "segments, records and the writer's lock or lease"),
                "verify": (wal_verify, "read every record with its checks"),
                "repair": (wal_repair, "cut a torn tail; set damaged segments aside (with --yes)")},
        "checkpoint": {
            "inspect": (checkpoint_inspect, "what a restart would use and where it would resume"),
            "verify": (checkpoint_verify, "check every checkpoint file"),
            "repair": (checkpoint_repair, "set damaged checkpoint files and log segments aside, make "
                       "the offsets/commits restartable (with --yes)"),
            "state": (checkpoint_state, "the newest state of each stateful stream, as a table")},
    }
    for area, commands in verbs.items():
        sub = areas.add_parser(area, help=f"{area} commands").add_subparsers(
            dest="verb", required=True, metavar="{" + ",".join(commands) + "}")
        for verb, (func, text) in commands.items():
            p = sub.add_parser(verb, help=text, description=text)
            p.add_argument("dir", metavar="DIR", help="a local path or an fsspec URL")
            p.add_argument("--json", action="store_true", help="print one JSON object")
            p.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[],
                           help="an fsspec storage option (repeatable)")
            if verb == "repair":
                p.add_argument("--yes", action="store_true", help="apply the plan")
            if verb == "state":
                p.add_argument("--out", metavar="FILE", help="write the table (Parquet if FILE ends "
                               "in .parquet, else Arrow IPC); one file per stream when there are several")
                p.add_argument("--format", choices=["parquet", "arrow"], help="the --out file's format")
                p.add_argument("--stream", metavar="NAME", help="only this stream (names: checkpoint inspect)")
                p.add_argument("--limit", type=int, default=20, help="rows printed per stream (20)")
            if area == "wal" and verb == "inspect":
                p.add_argument("--records", action="store_true",
                               help="list records (tracker events decoded)")
            p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("run", "drill", "ui", "status"):  # the apps, with their own arguments
        from engine.apps import run_from_command

        return run_from_command(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"sparkwal: {e}", file=sys.stderr)
        return USAGE
    except MissingDirectory as e:
        _emit(args, {"dir": args.dir, "error": str(e), "ok": False}, [])
        print(f"sparkwal: {e}", file=sys.stderr)
        return PROBLEM
    except Exception as e:  # noqa: BLE001 (one clear line, not a traceback)
        print(f"sparkwal: {e}", file=sys.stderr)
        return PROBLEM


if __name__ == "__main__":
    sys.exit(main())
