"""The drill's direct mode: exactly once under SIGKILL.

    python -m sparkwal.engine.drill --mode direct [--kills 20 | --duration S] [--batch 0.5] [--seed 1]
                                    [--kinds driver,executor --master local-cluster[2,1,1024]]

An appender adds lines to the FileLogSource partitions of ``WORKDIR/log`` at a steady pace (also
while the app is down); ``python -m sparkwal.engine.wordcount --source filelog`` counts them into
SQLite (or ``--sink delta|iceberg|postgres|kafka``: a Delta or Iceberg table, PostgreSQL, a Kafka topic) and is
killed (SIGKILL to its process group: driver and JVM) at random moments, during start-up, between
batches or in the middle of one, then restarted on the same work directory. After the last kill
the appender stops and the app runs until it has counted everything. ``--kinds driver,executor``
on ``local-cluster``: each kill takes the driver or one executor JVM at random (an executor killed
between a batch's data files and its commit, or in the middle of its tasks: Spark runs them again
elsewhere, and the sink must keep one attempt's output and delete the rest). Exactly once means: the lines
counted per partition equal the lines appended, and every word total equals the count derived from
the appended lines (a lost or doubled line changes both).

``--speculation --standalone N`` (N >= 2): ``spark.speculation=true``, eagerly, on a standalone
cluster whose workers are hosts of their own (127.0.0.2, 127.0.0.3...: Spark never runs a copy of a
task on a host that runs an attempt of it, so one host never speculates), and the first attempt of
every other task of the batch's output stage slowed until a copy of it has started and had 1 s
(the wait at most 10 s): speculative copies run beside the slowed attempts, which wake and write
too (Delta files, PostgreSQL staged rows) before their executor kills them, and the sink must keep
one (the Kafka and SQLite sinks write from the driver: their copies only compute). A batch interval
under a second falls behind. The report counts the copies that ran (``speculative_attempts``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from sparkwal.base.service import spawn

from .direct_wordcount import (PARTITIONS, SLOW_FIRST_ATTEMPTS_ENV, SPECULATED_DIR_ENV, append_lines,
                               expected_direct_counts, read_results)
from .drill_runs import DrillError, AppRun, kill_budget, kill_remaining, pct


SINK_NAMES = {"delta": "Delta", "iceberg": "Iceberg", "postgres": "PostgreSQL", "kafka": "Kafka"}

#: ``--speculation``: Spark's settings that launch a copy of a task as soon as it runs longer than
#: the others of its stage (checked every 100 ms)
SPECULATION_CONF = ("spark.speculation=true", "spark.speculation.interval=100ms",
                    "spark.speculation.multiplier=1.2", "spark.speculation.quantile=0.5",
                    "spark.speculation.minTaskRuntime=50ms")


#: ``--speculation``: at most how long a slowed first attempt waits for a copy of it to start (then
#: ``direct_wordcount.COPY_HEAD_START_S`` more); a copy's start took 0.3 s to over 1.5 s here
SLOW_FIRST_ATTEMPTS_MS = 10_000


def speculation_args(workdir: str, batch: float) -> tuple[str, ...]:
    """The main job's ``--conf`` arguments of ``--speculation``: Spark's settings, and the executors'
    environment that slows first attempts and counts the copies (in ``WORKDIR/speculation``)."""
    counted = os.path.join(workdir, "speculation")
    os.makedirs(counted, exist_ok=True)
    confs = [*SPECULATION_CONF, f"spark.executorEnv.{SLOW_FIRST_ATTEMPTS_ENV}={SLOW_FIRST_ATTEMPTS_MS}",
             f"spark.executorEnv.{SPECULATED_DIR_ENV}={counted}"]
    return tuple(x for c in confs for x in ("--conf", c))


def run(kills: int | None, batch: float, seed: int, workdir: str, log=print,
        duration_s: float | None = None, master: str = "local[2]", max_lines: int = 100_000,
        standby: bool = False, sink: str = "sqlite", speculation: bool = False,
        kinds: tuple[str, ...] = ("driver",)) -> dict:
    """``standby``: a hot standby driver always runs beside the active one (started once the
    active one runs batches); the killed active driver's stream is taken over by it, and a fresh
    standby is started. ``sink``: the main job's (``sqlite``, ``delta``, ``iceberg``, or ``postgres`` and
    ``kafka`` on a server of the drill's own), read back through its own reader. ``speculation``:
    speculative copies of slowed first attempts (``master``: a standalone cluster with hosts apart).
    ``kinds``: what a kill takes, ``driver`` and ``executor`` (``master``: local-cluster)."""
    if "executor" in kinds and not master.startswith("local-cluster"):
        raise ValueError(f"executor kills in direct mode need executor JVMs of the app's own (local-cluster), "
                         f"not {master}")
    speculate = speculation_args(workdir, batch) if speculation else ()
    if sink == "postgres":
        from .postgres_server import PostgresCluster

        server = PostgresCluster()
        try:
            server.start()
            return _run(kills, batch, seed, workdir, log, duration_s, master, max_lines, standby, sink,
                        ("--postgres", server.conninfo, *speculate), kinds)
        finally:
            server.remove()
    if sink == "kafka":
        from .kafka_server import tansu_broker

        with tansu_broker() as bootstrap:
            return _run(kills, batch, seed, workdir, log, duration_s, master, max_lines, standby, sink,
                        ("--kafka", bootstrap, *speculate), kinds)
    return _run(kills, batch, seed, workdir, log, duration_s, master, max_lines, standby, sink, speculate, kinds)


def _run(kills, batch, seed, workdir, log, duration_s, master, max_lines, standby, sink, sink_args, kinds) -> dict:
    rng = random.Random(seed)
    began, until, kills = kill_budget(kills, duration_s, default_kills=20)
    appended, stop_input, feeder = start_appender(workdir, seed, batch, max_lines)
    args = ("--source", "filelog", "--master", master, "--sink", sink, *sink_args)
    runs: list[AppRun] = []
    recovery_s: list[float] = []
    k = executor_kills = 0
    try:
        waiting = None  # the standby, when there is one
        running = None  # the app that goes on after an executor kill
        while True:
            app = running or waiting or AppRun(workdir, batch, extra_args=args)
            if waiting is None and running is None:
                runs.append(app)
            running = None
            started = time.monotonic()
            if standby and k < kills and (until is None or time.monotonic() < until):
                _wait_first_batch(app, 120)  # leading: a standby started now waits for it
                waiting = AppRun(workdir, batch, extra_args=(*args, "--standby"))
                runs.append(waiting)
                if not waiting.standby_seen.wait(120):
                    raise DrillError("the standby did not report that it waits")
            kind = rng.choice(kinds) if len(kinds) > 1 else kinds[0]  # (one kind: the seed's runs as before)
            if k < kills and (until is None or time.monotonic() < until) and kind == "executor":
                _wait_first_batch(app, 120)
                time.sleep(rng.uniform(0.0, 3 * batch))
                jvms = executor_jvms(app.proc.pid)
                if jvms:
                    os.kill(rng.choice(jvms), signal.SIGKILL)
                    k, executor_kills = k + 1, executor_kills + 1
                    log(f"kill {k}: SIGKILL to an executor JVM of the app, {len(app.batches())} batches")
                running = app
                continue
            if k < kills and (until is None or time.monotonic() < until):
                if not standby and rng.random() < 0.2:  # during start-up or the first batches
                    time.sleep(rng.uniform(1.0, 5.0))
                else:  # while it runs: between batches or in the middle of one
                    first = _wait_first_batch(app, 120)
                    recovery_s.append(first - started)
                    time.sleep(rng.uniform(0.0, 3 * batch))
                app.kill()
                k += 1
                log(f"kill {k}: SIGKILL to process group {app.proc.pid} after "
                    f"{time.monotonic() - started:.1f} s, {len(app.batches())} batches")
                continue
            _wait_first_batch(app, 120)  # the last run also takes lines as they come, not only the backlog
            stop_input.set()
            feeder.join()
            if waiting is not None and waiting is not app:
                waiting.terminate()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if all_counted(workdir, appended):
                    break
                if app.proc.poll() is not None:
                    raise DrillError("the app exited before counting everything")
                time.sleep(0.2)
            app.terminate()
            break
    finally:
        stop_input.set()
        kill_remaining(runs)

    result = verify(workdir, appended, runs)
    result.update({
        "mode": f"direct (FileLogSource -> {SINK_NAMES.get(sink, 'SQLite')}), "
                "exactly once",
        "master": master, "sink": sink,
        "seconds": round(time.monotonic() - began, 1), "kills": k, "executor_kills": executor_kills,
        "restarts": len(runs) - 1,
        "start_to_first_batch_p50_s": pct(recovery_s, 0.5) if recovery_s else None,
        "start_to_first_batch_p95_s": pct(recovery_s, 0.95) if recovery_s else None,
    })
    if "--conf" in sink_args:
        result["speculative_attempts"] = len(os.listdir(os.path.join(workdir, "speculation")))
    return result


def start_appender(workdir: str, seed: int, batch: float, max_lines: int):
    """Lines appended to the FileLogSource partitions of ``WORKDIR/log`` every quarter batch
    until the returned event is set or ``max_lines``: (lines appended by partition, the stop
    event, the appender's thread)."""
    logdir = os.path.join(workdir, "log")
    os.makedirs(logdir, exist_ok=True)
    appended = {p: 0 for p in PARTITIONS}
    stop_input = threading.Event()

    def appender() -> None:
        arng = random.Random(seed + 1)
        while not stop_input.wait(batch / 4) and sum(appended.values()) < max_lines:
            p = arng.choice(PARTITIONS)
            n = arng.randint(1, 5)
            append_lines(logdir, p, appended[p], n)
            appended[p] += n

    feeder = spawn("drill-appender", appender)
    return appended, stop_input, feeder


def all_counted(workdir: str, appended: dict[str, int]) -> bool:
    return read_results(workdir)["lines"] == {p: n for p, n in appended.items() if n}


def verify(workdir: str, appended: dict[str, int], runs: list[AppRun]) -> dict:
    """Exactly once: the lines counted per partition equal the lines appended, and every word
    total the count derived from them (a lost or doubled line changes both)."""
    results = read_results(workdir)
    expected_lines = {p: n for p, n in appended.items() if n}
    completed = [b for r in runs for _, b in r.batches()]
    result = {
        "lines_appended": sum(appended.values()), "lines_counted": sum(results["lines"].values()),
        "lines_by_partition": results["lines"], "appended_by_partition": expected_lines,
        "records_lost": sum(max(0, n - results["lines"].get(p, 0)) for p, n in expected_lines.items()),
        "duplicates": sum(max(0, n - expected_lines.get(p, 0)) for p, n in results["lines"].items()),
        "words_exact": results["words"] == expected_direct_counts(appended),
        "batches_completed": len(set(completed)), "batches_rerun": len(completed) - len(set(completed)),
    }
    result["ok"] = (result["records_lost"] == 0 and result["duplicates"] == 0 and result["words_exact"]
                    and results["lines"] == expected_lines)
    return result


def executor_jvms(group: int) -> list[int]:
    """The executor JVMs in process group ``group`` (the app's, whose local-cluster starts them):
    the processes with an ``--executor-id`` on their command line."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"--executor-id" in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return found


def _wait_first_batch(app: AppRun, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = app.batches()
        if done:
            return done[0][0]
        if app.proc.poll() is not None:
            raise DrillError(f"the app exited (status {app.proc.returncode}) before its first batch")
        time.sleep(0.02)
    raise DrillError(f"no batch completed within {timeout_s} s")
