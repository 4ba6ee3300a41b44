"""``sparkwal wal inspect|verify|repair DIR``: a write-ahead log directory, looked into, checked and
repaired (:mod:`sparkwal.wal.inspect`)."""

from __future__ import annotations

import dataclasses
import json

from .common import OK, PROBLEM, MissingDirectory, Progress, emit, require_directory, storage_options, when


def _require_log(args) -> None:
    """A directory with no segment and no writer's lock or lease is not a log: one line, exit 1
    (an inspector never says OK about nothing, and repair creates nothing there)."""
    from sparkwal.wal.segment import parse_segment_name
    from sparkwal.wal.storage import resolve

    require_directory(args, "log")
    storage, root = resolve(args.dir, storage_options(args.storage_option))
    if any(parse_segment_name(f.name) for f in storage.list_files(root)) or storage.writer(root) is not None:
        return
    raise MissingDirectory(f"{args.dir} is not a write-ahead log: it holds no segment (log-<start>-<end>) "
                           "and no writer's lock")


def _scan(args):
    from sparkwal.wal.inspect import scan_log

    _require_log(args)
    progress = Progress("scanning segments")
    try:
        return scan_log(args.dir, storage_options(args.storage_option), progress)
    finally:
        progress.close()


def _lost_blocks(args, report) -> list:
    """A receiver's WAL in a checkpoint: the blocks its tracker names that do not read back."""
    from .received import checkpoint_of_receiver_log, lost_blocks

    checkpoint = checkpoint_of_receiver_log(report.url)
    if checkpoint is None:
        return []
    return lost_blocks(checkpoint, storage_options(args.storage_option), only_log=report.url)


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
                else f"  {s.torn_bytes} bytes reserved ahead (zeros)" if s.torn_bytes and s.preallocated == s.torn_bytes
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
    from sparkwal.checkpoint.layout import RECEIVED_BLOCK_METADATA
    from sparkwal.wal.inspect import iter_records

    decode = None
    if args.dir.rstrip("/").endswith(RECEIVED_BLOCK_METADATA):
        from sparkwal.tracker import decode_event

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
            for s in report.segments if s.torn_bytes and s.preallocated != s.torn_bytes]
    reserved = [{"file": s.path, "offset": s.valid_end, "bytes": s.preallocated}
                for s in report.segments if s.torn_bytes and s.preallocated == s.torn_bytes]
    lost = _lost_blocks(args, report)
    lines = [f"{p['file']} at byte offset {p['offset']}: {p['problem']} "
             f"({p['records_before']} records before it read back)" for p in problems]
    lines += [f"{t['file']}: torn tail of {t['torn_bytes']} bytes after offset {t['offset']}: no whole "
              "record there (what a write cut short by a crash leaves, or a file cut short; the next "
              "writer cuts it)" for t in torn]
    lines += [f"{r['file']}: {r['bytes']} bytes of space reserved ahead after offset {r['offset']} (zeros "
              "a writer that was killed did not cut off; not damage: the next writer cuts them)" for r in reserved]
    lines += [f"LOST: {b.describe()}" for b in lost]
    failed = problems or lost
    lines.append(f"{'FAILED' if failed else 'OK'}: {report.records} records in "
                 f"{len(report.segments)} segments verified, {len(problems)} damaged"
                 + (f", {len(lost)} blocks its checkpoint needs lost" if lost else ""))
    emit(args, {"log": report.url, "records": report.records, "problems": problems, "torn_tails": torn,
                "reserved_tails": reserved,
                "lost_blocks": [dataclasses.asdict(b) for b in lost], "ok": not failed}, lines)
    return PROBLEM if failed else OK


def wal_repair(args) -> int:
    from sparkwal.wal import LogLockedError
    from sparkwal.wal.inspect import repair_log

    _require_log(args)  # repairing creates nothing where there is no log
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
