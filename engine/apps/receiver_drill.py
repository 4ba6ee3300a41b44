"""The drill's receiver mode: the word count app reading a reliable receiver, killed at random.

The drill process hosts the source (an :class:`AckedLineSource`, which survives every kill) and
offers ``lines_per_s`` lines per second. The app (``python -m sparkwal.engine.wordcount --source receiver``)
runs on ``master`` in its own process group. Each kill is, at random among ``kinds``: the
driver's whole process group (then a restart with ``getOrCreate``), the executor JVM that runs
the receiver (``local-cluster``/standalone only), or the receiver's Python worker. The check:
every line the source saw acknowledged is counted, no line is lost, and the only duplicates are
lines the source had to send again (stored, but not acknowledged before a kill), reported.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from sparkwal.base.service import spawn

from .drill_runs import DrillError, AppRun, pct, read_outputs
from .wordcount_data import expected_line_counts, receiver_line
from ..receiver.acked_lines import AckedLineSource

SECRET_ENV = "SPARKWAL_DRILL_SOURCE_SECRET"


def executor_jvm_of(worker_pid: int) -> int | None:
    """The executor JVM a Python worker descends from (its ``--executor-id`` command line)."""
    pid = worker_pid
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--executor-id" in f.read().split(b"\0"):
                    return pid
        except (OSError, ValueError, IndexError):
            return None
    return None


def _wait_for_receiver(app: AppRun, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and app.proc.poll() is None:
        with app.lock:
            if app.receivers:
                return
        time.sleep(0.05)


def run(kills: int, lines: int, batch: float, seed: int, workdir: str, *, master: str = "local[2]",
        kinds: tuple[str, ...] | None = None, lines_per_s: float = 30.0, duration_s: float | None = None,
        log=print, min_gap_s: float = 3.0, max_gap_s: float = 10.0, cycle: bool = False,
        standby: bool = False) -> dict:
    """``cycle``: kill each of ``kinds`` in turn instead of at random. ``standby``: a hot standby
    driver always runs beside the active one and takes over a killed driver's stream (a fresh
    standby is started after each takeover)."""
    rng = random.Random(seed)
    cluster = not master.startswith("local[") and master != "local"
    kinds = kinds or (("driver", "executor", "worker") if cluster else ("driver", "worker"))
    if "executor" in kinds and not cluster:
        raise ValueError(f"executor kills need separate executor JVMs (local-cluster or a cluster), not {master}")
    secret = os.urandom(16).hex()
    source = AckedLineSource(secret, chunk_lines=50)
    began = time.monotonic()
    until = began + duration_s if duration_s else None
    os.makedirs(os.path.join(workdir, "output"), exist_ok=True)
    stop = threading.Event()
    feeder, offered = start_feeder(source, lines, lines_per_s, stop)
    args = ["--source", "receiver", "--source-port", str(source.address[1]), "--source-secret-env",
            SECRET_ENV, "--master", master]
    runs: list[AppRun] = []
    killed: list[dict] = []
    try:
        app = AppRun(workdir, batch, extra_args=args, env={SECRET_ENV: secret})
        runs.append(app)
        k = 0
        waiting = None
        while k < kills and (until is None or time.monotonic() < until):
            _wait_for_receiver(app)  # kill a running app, not one still starting its JVMs
            if standby and waiting is None:
                waiting = AppRun(workdir, batch, extra_args=[*args, "--standby"], env={SECRET_ENV: secret})
                runs.append(waiting)
                if not waiting.standby_seen.wait(120):
                    raise DrillError("the standby did not report that it waits")
            time.sleep(rng.uniform(min_gap_s, max_gap_s))
            kind = kinds[k % len(kinds)] if cycle else rng.choice(kinds)
            with app.lock:
                started = [e for _, e in app.receivers]
            if kind != "driver" and not started:
                kind = "driver"  # the receiver has not started yet: nothing else to kill
            k += 1
            record = {"kind": kind, "at_s": round(time.monotonic() - began, 1)}
            if kind == "driver":
                killed_at = app.kill()
                if waiting is not None:  # the standby takes the stream over
                    app, waiting = waiting, None
                else:
                    app = AppRun(workdir, batch, extra_args=args, env={SECRET_ENV: secret})
                    runs.append(app)
                previous = 0
            else:
                worker = int(started[-1]["worker_pid"])
                target = worker if kind == "worker" else executor_jvm_of(worker)
                if target is None:
                    raise DrillError(f"no executor JVM above the receiver's worker {worker}")
                previous = len(started)
                killed_at = time.monotonic()
                os.kill(target, signal.SIGKILL)
            log(f"kill {k}: SIGKILL to the {kind}")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # recovered: a receiver registered again
                with app.lock:
                    now_started = len(app.receivers)
                    at = app.receivers[-1][0] if app.receivers else None
                if now_started > previous:
                    record["recovery_s"] = round(at - killed_at, 2)
                    break
                if app.proc.poll() is not None:
                    raise DrillError(f"the app exited after the {kind} kill")
                time.sleep(0.05)
            killed.append(record)
        stop.set()
        feeder.join()
        if waiting is not None:
            waiting.terminate()
        source.wait_acked(offered[0], 120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all_counted(workdir, offered[0]):
            time.sleep(0.2)
        app.terminate()
    finally:
        stop.set()
        source.close()
        for r in runs:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
    result = verify(workdir, offered[0], source, runs)
    recovery = [r["recovery_s"] for r in killed if "recovery_s" in r]
    by_kind: dict[str, dict] = {}
    for kill in killed:
        entry = by_kind.setdefault(kill["kind"], {"kills": 0, "recovery_s": []})
        entry["kills"] += 1
        if "recovery_s" in kill:
            entry["recovery_s"].append(kill["recovery_s"])
    result.update({
        "mode": f"receiver (reliable, acknowledged lines) on {master}",
        "seconds": round(time.monotonic() - began, 1), "kills": len(killed), "restarts": len(runs) - 1,
        "kills_by_kind": by_kind,
        "recovery_p50_s": pct(recovery, 0.5) if recovery else None,
        "recovery_p95_s": pct(recovery, 0.95) if recovery else None, "kill_log": killed,
    })
    return result


def start_feeder(source: AckedLineSource, lines: int, lines_per_s: float, stop: threading.Event):
    """Offer ``lines`` lines to ``source`` at ``lines_per_s`` until ``stop``: (the feeder's
    thread, ``offered``: offered[0] lines offered so far)."""
    offered = [0]

    def feed() -> None:
        for i in range(lines):
            if stop.is_set():
                return
            source.offer([receiver_line(i)])
            offered[0] = i + 1
            time.sleep(1 / lines_per_s)

    feeder = spawn("drill-feeder", feed)
    return feeder, offered


def all_counted(workdir: str, offered: int) -> bool:
    return len({f for o in read_outputs(workdir) for f in o["files"]}) >= offered


def verify(workdir: str, offered: int, source: AckedLineSource, runs) -> dict:
    """Every line the source saw acknowledged is counted, none is lost, the only duplicates are
    lines the source had to send again, and the running state agrees with the counts."""
    outputs = read_outputs(workdir)
    seen: dict[str, int] = {}
    observed: dict[str, int] = {}
    for o in outputs:
        for f, n in o["file_counts"].items():
            seen[f] = seen.get(f, 0) + n
        for w, n in o["counts"].items():
            observed[w] = observed.get(w, 0) + n
    stats = source.statistics()
    lost = [i for i in range(offered) if f"r{i}" not in seen]
    unknown = sorted(set(seen) - {f"r{i}" for i in range(offered)})
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    expected = expected_line_counts(i for i in range(offered) for _ in range(seen.get(f"r{i}", 0)))
    running: dict[str, int] = {}
    state_mismatches = 0
    for o in sorted(outputs, key=lambda o: o["batch_ms"]):
        for w, n in o["counts"].items():
            running[w] = running.get(w, 0) + n
        state_mismatches += o["totals"] != running
    completed = [b for r in runs for _, b in r.batches()]
    result = {
        "lines_offered": offered, "lines_acked": stats.lines_acked,
        "lines_resent": stats.lines_resent, "records_lost": len(lost), "lost_ids": lost[:20],
        "unknown_ids": unknown[:20], "duplicates": duplicates,
        "duplicates_within_resent": duplicates <= stats.lines_resent,
        "words_exact": observed == expected, "state_mismatches": state_mismatches,
        "batches_completed": len(set(completed)), "batches_rerun": len(completed) - len(set(completed)),
    }
    result["ok"] = (not lost and not unknown and stats.lines_acked == offered
                    and result["duplicates_within_resent"] and result["words_exact"]
                    and not state_mismatches)
    return result
