"""The drill's standby mode: two drivers always running, the active one killed at random.

    python -m sparkwal.engine.drill --standby [--kills 5 | --duration S] [--files 40] [--batch 1.0] ...

The word count app runs as the active driver and a second one as its hot standby
(``python -m sparkwal.engine.wordcount --standby`` on the same work directory, each in its own process
group). A random 3-10 s after the standby reports that it waits, the active driver's whole process
group gets SIGKILL; the standby must take the stream over, and a fresh standby is started beside
the new active one. The same checks as the restart drill follow (every input file counted in
exactly one batch, word totals and running state exact), plus the takeover times: kill to the
first batch completed by the new active driver that is newer than every batch completed before
the kill, p50/p95, and the takeovers' own durations as the new active reported them.
"""

from __future__ import annotations

import random
import threading
import time

from .drill_runs import (DrillError, AppRun, check_outputs, kill_budget, kill_remaining, pct, start_file_input,
                    wait_until_counted)


def _wait(event: threading.Event, app: AppRun, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not event.wait(0.05):
        if app.proc.poll() is not None:
            raise DrillError(f"the app (pid {app.proc.pid}) exited before {what}; see its log in "
                               "WORKDIR/logs")
        if time.monotonic() > deadline:
            raise DrillError(f"the app (pid {app.proc.pid}) did not report {what} in {timeout_s} s")


def run(kills: int | None, files: int, batch: float, seed: int, workdir: str, log=print,
        duration_s: float | None = None, master: str = "local[2]", extra_args=(),
        gap_s: tuple[float, float] = (3.0, 10.0)) -> dict:
    """``gap_s``: the kill comes a random time in this range after the standby waits."""
    rng = random.Random(seed)
    began, until, kills = kill_budget(kills, duration_s, default_kills=5)
    input_dir, stop, stop_input, generator, generated = start_file_input(workdir, files, batch)
    args = ("--master", master, *extra_args)
    active = AppRun(workdir, batch, extra_args=args)
    runs = [active]
    takeover_s: list[float] = []  # kill to the first newer batch of the new active
    took_ms: list[int] = []  # the takeovers' own durations, as reported
    failures: list[str] = []
    k = 0
    try:
        _wait(active.context_seen, active, "its context")
        while True:
            standby = AppRun(workdir, batch, extra_args=(*args, "--standby"))
            runs.append(standby)
            _wait(standby.standby_seen, standby, "that it waits as a standby")
            if k >= kills or (until is not None and time.monotonic() >= until):
                break
            time.sleep(rng.uniform(*gap_s))
            done_before = [b for r in runs for _, b in r.batches()]
            last = max(done_before) if done_before else 0
            killed_at = active.kill()
            k += 1
            log(f"kill {k}: SIGKILL to the active driver's process group {active.proc.pid}")
            _wait(standby.took_over, standby, "a takeover")
            deadline = time.monotonic() + 60
            while not any(b > last for _, b in standby.batches()):
                if time.monotonic() > deadline or standby.proc.poll() is not None:
                    failures.append(f"kill {k}: no newer batch from the new active driver")
                    break
                time.sleep(0.01)
            newer = [w for w, b in standby.batches() if b > last]
            if newer:
                takeover_s.append(newer[0] - killed_at)
            took_ms.append(int((standby.takeover or {}).get("took_ms", 0)))
            active = standby
        if until is not None:
            stop_input.set()
        generator.join()
        wait_until_counted(workdir, generated)
        runs[-1].terminate()  # the standby first: it must not take over from a stopping active
        active.terminate()
    finally:
        stop.set()
        kill_remaining(runs)
    result = check_outputs(workdir, generated[0], runs)
    result.update({
        "mode": "file stream, hot standby", "seconds": round(time.monotonic() - began, 1),
        "kills": k, "takeovers": len(took_ms), "failures": failures,
        "recovery_p50_s": pct(takeover_s, 0.5) if takeover_s else None,
        "recovery_p95_s": pct(takeover_s, 0.95) if takeover_s else None,
        "recovery_s": takeover_s, "takeover_took_ms": took_ms,
        "recovery_paths": [r.recovery for r in runs], "restarts": len(runs) - 1,
    })
    result["ok"] = result["ok"] and not failures and len(took_ms) == k
    return result
