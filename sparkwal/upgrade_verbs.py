"""``sparkwal upgrade plan CHECKPOINT -- PROGRAM [ARGS...]``: what deploying PROGRAM (a Python file,
as ``spark-submit`` takes it, with its own arguments) on CHECKPOINT would carry over, start anew,
drop, migrate, repartition and re-run, before the deploy.

PROGRAM runs in a process of its own with ``SPARKWAL_UPGRADE_PLAN`` set
(:mod:`sparkwal.engine.driver.upgrade_preview`): it builds its streams, and where it would recover
or start them the engine writes the plan and ends it, nothing started and nothing in CHECKPOINT
written. Exit status: 0 nothing is lost, 1 one line per loss (or the program could not be planned:
it failed, or ended without building a StreamingContext), 2 bad arguments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

from .common import OK, PROBLEM, UsageError, emit, require_directory


def upgrade_plan(args) -> int:
    from sparkwal.engine import UPGRADE_CHECKPOINT_ENV, UPGRADE_PLAN_ENV

    if not args.program:
        raise UsageError("upgrade plan needs the program: sparkwal upgrade plan CHECKPOINT -- PROGRAM [ARGS...]")
    program, *program_args = args.program
    if not os.path.isfile(program):
        raise UsageError(f"no such program file: {program}")
    require_directory(args, "checkpoint")
    with tempfile.TemporaryDirectory(prefix="sparkwal-plan-") as work:
        out = os.path.join(work, "plan.json")
        env = {**os.environ, UPGRADE_PLAN_ENV: out, UPGRADE_CHECKPOINT_ENV: args.dir}
        proc = subprocess.Popen([sys.executable, program, *program_args], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        try:
            _, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            err = None
        finally:  # whatever the program left running (its JVM, workers) goes with it; Ctrl-C too
            _kill_group(proc)
        if err is None and not os.path.exists(out):
            return _cannot(args, f"{program} built no StreamingContext within {args.timeout:g} s (--timeout)")
        if not os.path.exists(out):
            said = [line for line in (err or "").splitlines() if line.strip()]
            why = f": {said[-1].strip()[:300]}" if said else ""
            return _cannot(args, f"{program} ended (status {proc.returncode}) without building a StreamingContext{why}")
        with open(out) as f:
            result = json.load(f)
    if result.get("error"):
        return _cannot(args, result["error"], result)
    lines = [f"upgrade plan: {program} on {result['checkpoint']}", *result.get("lines", [])]
    emit(args, result, lines)
    return OK if result.get("loses_nothing") else PROBLEM


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # a descendant of its own session holds the pipe: not waited for
        pass


def _cannot(args, why: str, result: dict | None = None) -> int:
    emit(args, {**(result or {}), "error": why, "loses_nothing": False, "checkpoint": args.dir}, [])
    print(f"sparkwal: {why}", file=sys.stderr)
    return PROBLEM
