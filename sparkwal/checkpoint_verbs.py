"""``sparkwal checkpoint inspect|verify|repair|state|copy DIR``: a checkpoint directory, looked into,
checked, repaired, its state shown and the whole copied (:mod:`sparkwal.checkpoint.inspect`,
:mod:`sparkwal.checkpoint.copy`)."""

from __future__ import annotations

import dataclasses

from .common import OK, PROBLEM, MissingDirectory, UsageError, emit, require_directory, storage_options, when


def _inspected(args, verify: bool):
    """The checkpoint in DIR, inspected (with ``verify``: every state part read and every block
    the tracker names checked, as ``wal verify`` checks every record); a directory holding none
    of a checkpoint's files is one line, exit 1, never an OK about nothing."""
    from sparkwal.checkpoint.inspect import inspect_checkpoint

    from .received import lost_blocks

    require_directory(args, "checkpoint")
    options = storage_options(args.storage_option)
    r = inspect_checkpoint(args.dir, options, verify_state=verify)
    if r.kind == "empty":
        raise MissingDirectory(f"{args.dir} is not a checkpoint: it holds no checkpoint file, code part, "
                               "offset or commit log, or write-ahead log")
    if verify and r.kind == "sparkwal":
        r.problems += [b.describe() for b in lost_blocks(r.url, options)]
    return r


def checkpoint_inspect(args) -> int:
    # everything checked, as `wal inspect` checks every record: the exit status says the same
    r = _inspected(args, verify=True)
    lines = [f"checkpoint {r.url} ({r.kind})"]
    if r.newest is not None:
        data = r.newest.data
        lines += [f"newest checkpoint: {r.newest_file} (batch {when(r.newest.checkpoint_time_ms)}, "
                  f"pending {[when(t) for t in r.newest.pending_times_ms]})",
                  f"  batch duration {data.get('batch_ms')} ms, graph: {data.get('graph', '?')}",
                  f"  program: {data.get('code') or 'none (recover with upgrade=True)'}"]
        if isinstance(data.get("identities"), dict) and data["identities"]:  # what an upgrade matches by
            known = sorted(data["identities"].items(), key=lambda kv: (len(str(kv[0])), str(kv[0])))
            lines.append("  streams known by: " + ", ".join(f"{_known_by(entry)} (stream {index})"
                                                            for index, entry in known))
        lines += [_state_line(s) for s in r.state]
    if r.metadata is not None:
        lines.append(f"query id: {r.metadata.get('id')}")
    if r.offsets is not None:
        lines.append(f"last planned batch: {r.offsets.latest}, last committed batch: {r.commits.latest}")
        if r.restart is not None:
            lines.append(f"a restart resumes at batch {r.restart.batch_id}"
                         + (" (re-running its logged offsets)" if r.restart.rerun else ""))
    if r.sources:  # sources/<id>/: each source's own log, by Spark's source id (a direct input's id)
        identities = (r.newest.data.get("identities") or {}) if r.newest is not None else {}
        by_input = {str(e.get("input_id")): e for e in identities.values() if isinstance(e, dict)}
        lines.append(f"sources: {len(r.sources)}: " + ", ".join(
            f"sources/{s}/" + (f" ({_known_by(by_input[s])})" if s in by_input else "") for s in r.sources))
    if r.leader is not None:
        state = {True: "active", False: "none (free)", None: "unknown"}[r.leader.held]
        lines.append(f"leader: {state}; epoch {r.leader.epoch}, {r.leader.describe()}")
    lines += [f"also: {d}/" for d in r.other] + [f"PROBLEM: {p}" for p in r.problems]
    out = {"checkpoint": r.url, "kind": r.kind, "newest_file": r.newest_file, "files": r.files,
           "newest": r.newest, "code_parts": r.code_parts, "offsets": r.offsets, "commits": r.commits,
           "restart": r.restart, "metadata": r.metadata, "sources": r.sources, "state": r.state,
           "leader": r.leader, "problems": r.problems}
    emit(args, out, lines)
    return PROBLEM if r.problems else OK


def _known_by(entry) -> str:
    """A checkpoint's identity entry (sparkwal.engine.identity), on one line whatever it holds."""
    if not isinstance(entry, dict):
        return "?"
    name = f"uid:{entry['uid']}" if entry.get("uid") else str(entry.get("identity", "?"))
    name += " (ambiguous: named by the program's order)" if entry.get("ambiguous") else ""
    return name.replace("\n", " ").replace("\r", " ")[:300]


def _state_line(s) -> str:
    if s.newest_ms is None:
        return f"  state {s.name}: no snapshot yet"
    links = " + ".join(f"{c['kind']}@{when(c['time_ms'])} ({c['rows']} rows, {c['bytes']} bytes)"
                       for c in s.chain)
    return f"  state {s.name}: batch {when(s.newest_ms)} = {links or '?'}; {s.snapshots} snapshots kept"


def checkpoint_state(args) -> int:
    import pyarrow.feather as feather
    import pyarrow.parquet as parquet

    from sparkwal.checkpoint.state_chains import read_state

    require_directory(args, "checkpoint")
    tables = read_state(args.dir, storage_options(args.storage_option))
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
    emit(args, data, lines)
    return OK


def _per_stream(out: str, name: str) -> str:
    stem, dot, suffix = out.rpartition(".")
    return f"{stem}.{name}.{suffix}" if dot and "/" not in suffix else f"{out}.{name}"


def checkpoint_verify(args) -> int:
    r = _inspected(args, verify=True)
    lines = [f"PROBLEM: {p}" for p in r.problems]
    lines.append(f"{'FAILED' if r.problems else 'OK'}: {r.url} ({r.kind}), {len(r.files)} checkpoint "
                 f"files, {len(r.code_parts)} code parts, "
                 f"{len(r.offsets.ids) if r.offsets else 0} offsets, {len(r.commits.ids) if r.commits else 0} commits, "
                 f"{sum(s.snapshots for s in r.state)} state snapshots, "
                 f"{sum(log.records for log in r.logs)} records in {len(r.logs)} write-ahead logs")
    emit(args, {"checkpoint": r.url, "kind": r.kind, "problems": r.problems, "ok": not r.problems}, lines)
    return PROBLEM if r.problems else OK


def checkpoint_repair(args) -> int:
    """Everything that keeps a checkpoint from verifying, in one plan: damaged ``checkpoint-<t>``
    files set aside (a restart reads the newest good one), its write-ahead logs repaired as
    ``wal repair`` does, the offsets/commits made restartable. Refused while a driver leads it."""
    from sparkwal.checkpoint import CommitLog, OffsetSeqLog, plan_repair, repair
    from sparkwal.checkpoint.checkpoint_file import set_aside_damaged
    from sparkwal.checkpoint.layout import CheckpointLayout
    from sparkwal.wal import LogLockedError
    from sparkwal.wal.inspect import plan_repair as plan_log_repair, repair_log

    options = storage_options(args.storage_option)
    r = _inspected(args, verify=False)
    if r.leader is not None and r.leader.held:
        emit(args, {"checkpoint": r.url, "error": "a driver leads it", "applied": False},
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
                emit(args, {**data, "error": str(e)}, lines + [f"cannot repair: {e}"])
                return PROBLEM
        data["logs"].append({"log": log.url, "steps": steps, "moved_aside": moved})
        lines += [f"{s.action}: {s.path} (keeps {s.keep_bytes} bytes, loses {s.lost_bytes} bytes)"
                  for s in steps] + [f"damaged segment kept as {p}" for p in moved]
    if r.offsets is not None:
        paths = CheckpointLayout(r.url)
        offsets = OffsetSeqLog(paths.offsets, options, create=False)
        commits = CommitLog(paths.commits, options, create=False)
        plan = plan_repair(offsets, commits)
        data["plan"] = plan
        lines += [f"offsets/commits: {plan.reason}"] + [f"  delete {u}" for u in plan.delete]
        if plan.delete:
            changes = True
            if args.yes:
                repair(offsets, commits)
    if not changes:
        emit(args, data, lines + [f"nothing to repair in {r.url}"])
        return OK
    if not args.yes:
        emit(args, data, lines + ["applied only with --yes (nothing was changed)"])
        return PROBLEM
    data["applied"] = True
    emit(args, data, lines + ["repaired"])
    return OK


def checkpoint_copy(args) -> int:
    """``sparkwal checkpoint copy SRC DST``: :func:`sparkwal.checkpoint.copy.copy_checkpoint`, verified."""
    from sparkwal.checkpoint.copy import CopyError, copy_checkpoint

    from .received import lost_blocks

    require_directory(args, "checkpoint")
    try:
        r = copy_checkpoint(args.dir, args.dst, source_options=storage_options(args.storage_option),
                            destination_options=storage_options(args.dst_storage_option))
    except CopyError as e:
        emit(args, {"source": args.dir, "destination": args.dst, "error": str(e), "ok": False},
             [f"FAILED: {e}"])
        return PROBLEM
    # verified as checkpoint verify verifies: the received blocks its batches need too
    r.problems.extend(b.describe() for b in lost_blocks(r.destination, storage_options(args.dst_storage_option)))
    resumes = (f"a restart resumes from the checkpoint of batch {when(r.checkpoint_time_ms)}"
               if r.checkpoint_time_ms is not None else "no DStream checkpoint yet: its logs only")
    lines = [f"PROBLEM: {p}" for p in r.problems]
    lines.append(f"{'FAILED' if r.problems else 'OK'}: copied {r.source} to {r.destination}: {r.files} files, "
                 f"{r.bytes} bytes" + (f" ({r.trimmed_bytes} bytes of torn or preallocated WAL tails left out)"
                                       if r.trimmed_bytes else "")
                 + (f", {r.attempts} attempts (its driver cleaned up meanwhile)" if r.attempts > 1 else "")
                 + f"; {resumes}")
    if r.fork is not None:  # a copy of a running stream: a second driver on it would consume its inputs
        lines.append(f"FORK: {r.fork}")
    inputs = inputs_not_copied(r.destination, storage_options(args.dst_storage_option))
    if inputs:
        lines.append(f"NOT COPIED: the inputs its program reads ({', '.join(inputs)}): a copy carries their "
                     "positions, not the inputs; a restart's batches read a file stream's files again, from the "
                     "directory as the program names it (a relative one from where it runs): copy them along")
    emit(args, {**dataclasses.asdict(r), "inputs_not_copied": inputs, "ok": not r.problems}, lines)
    return PROBLEM if r.problems else OK


def inputs_not_copied(url: str, options: dict | None) -> list[str]:
    """The inputs the checkpoint's program reads, as its identities name them (``files:/data/in
    (stream 0)``): a copy carries their positions, not the inputs themselves."""
    from sparkwal.checkpoint import read_checkpoint

    try:
        checkpoint = read_checkpoint(url, storage_options=options)
    except Exception:  # noqa: BLE001 (verified above: a checkpoint that does not read names no inputs)
        return []
    identities = (checkpoint.data.get("identities") or {}) if checkpoint is not None else {}
    ordered = [identities[k] for k in sorted(identities, key=int)]
    return [f"{i['identity']} (stream {i['input_id']})" for i in ordered if i.get("input_id") is not None]


def checkpoint_handover(args) -> int:
    """Ask DIR's leader to finish its batches, write its checkpoint and give the leadership up;
    wait (``--timeout``) for a standby to lead at a newer epoch and complete its first batch.
    The request is a file in DIR (the storage seam's :meth:`request_handover`), read by the leader
    after a batch; one not answered in time is taken back."""
    import time

    from sparkwal.checkpoint.progress import batch_done_at_epoch
    from sparkwal.wal.storage import resolve

    require_directory(args, "checkpoint")
    options = storage_options(args.storage_option)
    storage, root = resolve(args.dir, options)
    leader = storage.leader(root)
    if leader is None or leader.held is False:
        raise MissingDirectory(f"no live driver leads {args.dir}: there is nothing to hand over")
    old, began = leader.epoch, time.monotonic()
    storage.request_handover(root, old, int(time.time() * 1000))
    new = None
    while time.monotonic() - began < args.timeout:
        now = storage.leader(root)
        if now is not None and now.epoch > old and now.held is not False:
            new = now.epoch
            if batch_done_at_epoch(args.dir, options, new):
                took = time.monotonic() - began
                emit(args, {"dir": args.dir, "from_epoch": old, "to_epoch": new, "took_s": round(took, 3),
                            "ok": True}, [f"handed over {args.dir}: epoch {old} -> {new}, the new leader's first "
                                          f"batch done {took:.1f} s after the request"])
                return OK
        time.sleep(0.05)
    storage.withdraw_handover(root, old)
    now = storage.leader(root)
    if new is not None:
        why = f"a standby leads at epoch {new} but completed no batch within {args.timeout:g} s"
    elif now is not None and now.epoch == old and now.held is not False:
        why = (f"the leader (epoch {old}) did not hand over within {args.timeout:g} s; it leads on (the request is "
               "taken back)")
    else:
        why = (f"the leader (epoch {old}) stopped, and no standby took over within {args.timeout:g} s: start the "
               "new version (getOrCreate(..., upgrade=True))")
    emit(args, {"dir": args.dir, "from_epoch": old, "error": why, "ok": False}, [])
    print(f"sparkwal: {why}")
    return PROBLEM
