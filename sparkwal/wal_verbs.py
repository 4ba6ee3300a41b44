"""``sparkwal wal inspect|verify|repair DIR``: a write-ahead log directory, looked into, checked and
repaired (:mod:`wal.inspect`)."""

from __future__ import annotations

import dataclasses
import json

from .common import OK, PROBLEM, Progress, emit, require_directory, storage_options, when


def _scan(args):
    from wal.inspect import scan_log

    require_directory(args, "log")
    progress = Progress("scanning segments")
    try:
        return scan_log(args.dir, storage_options(args.storage_option), progress)
    finally:
        progress.close()


def _writer_line(writer) -> str:
    if writer is None:
        return "writer: none has locked this directory"
    state = {True: "held", False: "free", None: "unknown"}[writer.held]
    until = f", expires {when(writer.expires_ms)}" if writer.expires_ms else ""
    return f"writer: {writer.kind} {state} (last holder: {writer.holder}{until})"


def wal_inspect(args) -> int:
    report = _scan(args)
    lines = [f"log {report.url}: {len(report.segments)} segments, {report.records} records",
             _writer_line(report.writer)]
    for s in report.segments:
        note = (f"  DAMAGED at byte {s.problem[0]}: {s.problem[1]}" if s.problem
                else f"  torn tail of {s.torn_bytes} bytes" if s.torn_bytes else "")
        lines.append(f"  {s.path}  {when(s.start_ms)} .. {when(s.end_ms)}  {s.size} bytes  "
                     f"{s.records} records{note}")
    data = {"log": report.url, "segments": report.segments, "records": report.records,
            "writer": report.writer}
    if args.records:
        records = list(_records(args))
        data["record_list"] = records
        lines += [f"  {r['segment']}@{r['offset']}: {r['event'] if 'event' in r else r['bytes']}"
                  for r in records]
    emit(args, data, lines)
    return PROBLEM if report.problems else OK


def _records(args):
    """Every record, with the tracker's events decoded in a ``receivedBlockMetadata`` log."""
    from checkpoint.layout import RECEIVED_BLOCK_METADATA
    from wal.inspect import iter_records

    decode = None
    if args.dir.rstrip("/").endswith(RECEIVED_BLOCK_METADATA):
        from tracker import decode_event

        decode = decode_event
    for segment, offset, payload in iter_records(args.dir, storage_options(args.storage_option)):
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
    emit(args, {"log": report.url, "records": report.records, "problems": problems, "torn_tails": torn,
                 "ok": not problems}, lines)
    return PROBLEM if problems else OK


def wal_repair(args) -> int:
    from wal import LogLockedError
    from wal.inspect import repair_log

    require_directory(args, "log")  # repairing creates nothing where there is nothing
    progress = Progress("scanning segments")
    try:
        steps, moved, applied = repair_log(args.dir, args.yes, storage_options(args.storage_option), progress)
    except LogLockedError as e:
        emit(args, {"log": args.dir, "error": str(e), "applied": False}, [f"cannot repair: {e}"])
        return PROBLEM
    finally:
        progress.close()
    lines = [f"{s.action}: {s.path} (keeps {s.keep_bytes} bytes, loses {s.lost_bytes} bytes)"
             for s in steps] or [f"nothing to repair in {args.dir}"]
    if not applied:
        lines.append("damaged segments are set aside only with --yes (nothing was changed)")
    else:
        lines += [f"damaged segment kept as {p}" for p in moved] + (["repaired"] if steps else [])
    emit(args, {"log": args.dir, "steps": steps, "applied": applied, "moved_aside": moved}, lines)
    return OK if applied else PROBLEM
