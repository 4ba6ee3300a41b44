"""Upgrade benchmark: how long output pauses when a changed program replaces the running one, two
ways side by side, and what a new checkpoint (pyspark.streaming's only way) would lose.

    python -m benchmarks.upgrade_bench [--handovers 10] [--cold 5] [--keys 2000]
        [--apps files,direct,receiver] [--batches 1.0[,0.1]] [--runs receiver:0.1,files:1.0,...]

The app is :mod:`benchmarks.state_app` (its state snapshotted every two batches, the checkpoint on
the local disk, ``local[2]``), fed a tenth of the keys every batch interval (the first time: every
key), in one of three shapes (``--apps``):

* ``files``: a file stream (a file each interval) counted with ``updateStateByKey``, whose total
  is output every batch;
* ``direct``: a direct stream (``FileLogSource``: the lines appended to one log) counted with
  ``mapWithState``, each batch's new counts written into SQLite with the batch's offsets in one
  transaction (``SQLiteSink``: exactly once);
* ``receiver``: a receiver with its WAL (``AckedLineSource``, which keeps a line until a receiver
  stored it), each batch's counts precomputed by the receiver into ``mapWithState`` run on the
  driver (``spark.sparkwal.receiver.precompute``), its state's total output every batch.

Its two versions differ in the graph (version 2 adds a step before the state), so every deploy is
an upgrade of a changed program (``getOrCreate(..., upgrade=True)``) that carries the state by
identity; the deploys alternate 1 -> 2 -> 1 ...

* **handover**: the new version waits as a hot standby beside the old (``upgrade=True,
  standby=True``), taking each of the old one's checkpoints by the upgrade's plan; ``sparkwal
  checkpoint handover`` asks the old one to stop gracefully (it finishes the batches it has, writes
  its checkpoint, gives the leadership up and exits); the standby takes over.
* **cold upgrade**: SIGTERM as above, then the new version started (``getOrCreate(...,
  upgrade=True)``) once the old one exited.
* **no deploy (steady)**: the time between two consecutive batches' outputs of one driver, past its
  first five: the floor under a pause (one batch interval, plus how much longer the later batch took).

A deploy is asked for only once the running version keeps up (its three newest batches each started
less than a batch interval after their time; at most 30 s waited, then the deploy goes ahead and the
row says how many did so behind), as the standalone kill benchmark kills only a driver that keeps up:
a version still draining a backlog (its own start, or a slow second of the machine's) would put that
backlog into the pause.

Output pause: from the last batch the old version completed to the first newer batch the new one
completed (each batch outputs). Records lost and doubled: once the feeder stops and the last
version caught up (a batch after the last line is done; a version still behind 60 s later shows
``?`` and the lines not counted yet: no loss it can show), the lines fed against the state's total
and (``direct``) the records the sink holds (every line counted once: must be equal). A new
checkpoint instead of an upgrade starts with no state: it loses every count the old one held.
Durability: checkpoints, snapshots and the receiver's WAL on the local disk, fsync'd, in every row;
``direct``'s sink commits each batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import random
import sqlite3
import tempfile
import threading
import time

from benchmarks.standby_bench import App, Feeder

CONF = ("--conf", "spark.streaming.stopGracefullyOnShutdown=true")


SECRET = os.urandom(16).hex()  # the receiver app's source's


def _app_args(workdir: str, app: str) -> tuple:
    if app == "direct":  # mapWithState over a direct stream, into SQLite exactly once
        return ("--source", "filelog", "--op", "map", "--input", os.path.join(workdir, "log"),
                "--sink", os.path.join(workdir, "out.db"))
    if app == "receiver":  # a receiver with its WAL, precomputing each batch's counts, into mapWithState
        port = open(os.path.join(workdir, "source-port")).read()
        return ("--source", "receiver", "--source-port", port, "--precompute", "--op", "map")
    return ("--totals",)


def _start(workdir: str, version: int, batch_s: float, standby: bool, upgrade: bool, app: str = "files") -> App:
    return App(workdir, "sparkwal", batch_s, standby, env={"STATE_APP_SOURCE_SECRET": SECRET},
               extra=(*CONF, *_app_args(workdir, app), "--version", str(version), *(["--upgrade"] if upgrade else [])))


class LogFeeder:
    """``--apps direct``'s input: every batch interval, a tenth of the keys (the first time: every
    key) appended to ``workdir/log/p0`` in one write; ``receiver``'s: offered to an
    ``AckedLineSource`` (its port in ``workdir/source-port``), which keeps each line until a
    receiver acknowledges it stored."""

    def __init__(self, workdir: str, keys: int, batch_s: float, source=None):
        self.path = os.path.join(workdir, "log", "p0")
        self.source = source
        self._keys, self._batch_s = [f"k{i}" for i in range(keys)], batch_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng, first = random.Random(7), True
        while not self._stop.wait(self._batch_s):
            chosen = self._keys if first else rng.sample(self._keys, len(self._keys) // 10)
            if self.source is not None:
                self.source.offer(chosen)
            else:
                with open(self.path, "a") as f:
                    f.write("\n".join(chosen) + "\n")
            first = False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _counted(workdir: str, app: App, kind: str) -> tuple[int, int]:
    """(records output once, the state's total): the sink's for ``direct``; else the state's total
    of the newest batch, twice."""
    if kind != "direct":
        totals = [e["total"] for e in app.events() if e["event"] == "total"]
        return (totals[-1],) * 2 if totals else (0, 0)
    path = os.path.join(workdir, "out.db")
    if not os.path.exists(path):
        return 0, 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return (conn.execute("SELECT COALESCE(SUM(records), 0) FROM batches").fetchone()[0],
                conn.execute("SELECT COALESCE(SUM(n), 0) FROM counts").fetchone()[0])
    except sqlite3.OperationalError:  # no batch written yet
        return 0, 0
    finally:
        conn.close()


def _done(app: App) -> list[dict]:
    return [e for e in app.events() if e["event"] == "batch"]


def _stop(app: App) -> float:
    """SIGTERM (a graceful stop), and the time of its last completed batch once it exited."""
    os.killpg(app.proc.pid, signal.SIGTERM)
    app.proc.wait(timeout=120)
    return max(e["at"] for e in _done(app))


def _keeps_up(app: App, batch_s: float, wait_s: float = 30.0) -> bool:
    """Wait (at most ``wait_s``) until the app's three newest batches each started less than a batch
    interval after their time; whether they did."""
    deadline = time.monotonic() + wait_s
    while True:
        newest = _done(app)[-3:]
        if len(newest) == 3 and all((e["scheduling_ms"] or 0) < batch_s * 1000 for e in newest):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(batch_s / 2)


def _hand_over(workdir: str, app: App) -> float:
    """``sparkwal checkpoint handover``, and the time of the old version's last completed batch once
    it exited."""
    done = subprocess.run([sys.executable, "-m", "sparkwal", "checkpoint", "handover", os.path.join(workdir, "ckpt"),
                           "--timeout", "120"], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"the handover failed: {done.stdout}{done.stderr}")
    app.proc.wait(timeout=120)
    return max(e["at"] for e in _done(app))


def _fed(workdir: str, app: str = "files", feeder=None) -> int:
    if app == "receiver":
        return feeder.source.statistics().lines_offered
    folder = os.path.join(workdir, "log" if app == "direct" else "in")
    return sum(open(os.path.join(folder, n)).read().count("\n") for n in os.listdir(folder) if not n.startswith("."))


def run(handovers: int, cold: int, keys: int, batch_s: float, app: str = "files") -> dict:
    workdir = tempfile.mkdtemp(prefix="upgrade-bench-")
    os.makedirs(os.path.join(workdir, "log" if app == "direct" else "in"))
    source = None
    if app == "receiver":
        from sparkwal.engine.receiver.acked_lines import AckedLineSource

        source = AckedLineSource(SECRET)
        with open(os.path.join(workdir, "source-port"), "w") as f:
            f.write(str(source.address[1]))
    version, apps = 1, []
    pauses: dict[str, list[float]] = {"handover": [], "cold upgrade": []}
    behind = {"handover": 0, "cold upgrade": 0}  # deploys asked for while the running version was behind
    feeder: Feeder | LogFeeder | None = None
    try:
        active = _start(workdir, version, batch_s, False, False, app)
        apps.append(active)
        active.wait(lambda e: e["event"] == "batch")
        # after the start: a new file stream skips older files
        feeder = Feeder(workdir, keys, batch_s) if app == "files" else LogFeeder(workdir, keys, batch_s, source)
        deadline = time.monotonic() + 180
        while _counted(workdir, active, app)[1] == 0 and time.monotonic() < deadline:
            time.sleep(batch_s)
        for kind, n in (("handover", handovers), ("cold upgrade", cold)):
            for _ in range(n):
                version = 2 if version == 1 else 1
                if kind == "handover":
                    new = _start(workdir, version, batch_s, True, True, app)
                    apps.append(new)
                    new.wait(lambda e: e["event"] == "hot")
                    time.sleep(max(2.0, 2 * batch_s))  # it has taken the old version's newest checkpoints
                    behind[kind] += not _keeps_up(active, batch_s)
                    last_at = _hand_over(workdir, active)
                else:
                    behind[kind] += not _keeps_up(active, batch_s)
                    last_at = _stop(active)
                    new = _start(workdir, version, batch_s, False, True, app)
                    apps.append(new)
                last = max(e["time_ms"] for e in _done(active))
                first = new.wait(lambda e, last=last: e["event"] == "batch" and e["time_ms"] > last)
                pauses[kind].append(first["at"] - last_at)
                active = new
                time.sleep(max(2.0, 2 * batch_s))
        feeder.stop()
        fed_until_ms = int(time.time() * 1000)
        fed = _fed(workdir, app, feeder)
        deadline = time.monotonic() + 60  # the last version catches up with every line fed
        while time.monotonic() < deadline and min(_counted(workdir, active, app)) < fed:
            time.sleep(batch_s)
        time.sleep(max(2.0, 2 * batch_s))
        output, state = _counted(workdir, active, app)
        # caught up: a batch after the last line fed is done (else what is not counted yet is no loss it can show)
        caught_up = any(e["time_ms"] > fed_until_ms + batch_s * 1000 for e in _done(active))
        _stop(active)
    finally:
        if feeder is not None:
            feeder.stop()
        for a in apps:
            if a.proc.poll() is None:
                os.killpg(a.proc.pid, signal.SIGKILL)
                a.proc.wait()
        if source is not None:
            source.close()
    gaps = _steady_gaps(apps)
    shutil.rmtree(workdir, ignore_errors=True)
    return {"app": app, "pauses_s": pauses, "deployed_behind": behind, "steady_gaps_s": gaps, "fed": fed,
            "counted": state,
            "output": output, "lost": max(0, fed - min(state, output)) if caught_up else None,
            "behind": 0 if caught_up else max(0, fed - min(state, output)),
            "doubled": max(0, max(state, output) - fed), "keys": keys, "batch_s": batch_s}


def _steady_gaps(apps: list[App]) -> list[float]:
    """The time between consecutive batches' outputs of one driver, past its first five: what
    output waits for with no deploy at all (the floor under a pause; one batch interval plus how
    much longer the later batch took)."""
    gaps = []
    for a in apps:
        done = _done(a)[5:]
        gaps += [b["at"] - a_["at"] for a_, b in zip(done, done[1:]) if b["time_ms"] > a_["time_ms"]]
    return gaps


def repartition(keys: int, batch_s: float, to: int) -> dict:
    """A ``mapWithState`` state of ``keys`` keys in 2 partitions, snapshotted; the driver stopped
    gracefully; then started again with 2 partitions and with ``to`` (one shuffle when its state
    is read back). Measured: the processing time of the first batch after each start, which reads
    the state (the batch itself holds one line)."""
    workdir = tempfile.mkdtemp(prefix="upgrade-bench-repartition-")
    folder = os.path.join(workdir, "in")
    os.makedirs(folder)
    out: dict[str, float] = {}
    try:
        for label, partitions in (("build", 2), ("2 -> 2", 2), (f"2 -> {to}", to)):
            app = App(workdir, "sparkwal", batch_s, extra=(*CONF[:2], "--op", "map", "--partitions", str(partitions)))
            app.wait(lambda e: e["event"] == "started", timeout=600)
            if label == "build":
                _write(folder, "all", (f"k{i}" for i in range(keys)))
                app.wait(lambda e: e["event"] == "batch" and e["records"] >= keys, timeout=600)
                time.sleep(3 * batch_s)  # its snapshot (every two batches)
            else:
                _write(folder, f"one-{len(out)}", ["k0"])
                first = app.wait(lambda e: e["event"] == "batch" and e["records"] > 0, timeout=600)
                out[label] = first["processing_ms"] / 1000
            _stop(app)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _write(folder: str, name: str, lines) -> None:
    staged = os.path.join(folder, f".{name}")
    with open(staged, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(staged, os.path.join(folder, name))


def _quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--handovers", type=int, default=10)
    p.add_argument("--cold", type=int, default=5)
    p.add_argument("--keys", type=int, default=2000)
    p.add_argument("--batches", default="1.0", help="batch durations in seconds, comma-separated (e.g. 1.0,0.1)")
    p.add_argument("--batch", type=float, help="deprecated alias: --batches with one duration")
    p.add_argument("--apps", default="files,direct,receiver",
                   help="files: a file stream into updateStateByKey; direct: a direct stream into mapWithState "
                        "and SQLite, exactly once; receiver: a receiver with its WAL, precomputed, into "
                        "mapWithState on the driver")
    p.add_argument("--runs", help="app:batch pairs, comma-separated, in place of every --apps x --batches pair "
                                  "(e.g. receiver:0.1,receiver:1.0,files:1.0,direct:1.0: each shape at the batch "
                                  "durations it keeps up with, in one run)")
    p.add_argument("--repartition-keys", type=int, default=0,
                   help="also: a mapWithState state of this many keys read back from 2 into 8 partitions")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args(argv)
    if args.batch is not None:
        args.batches = str(args.batch)
    try:
        pairs = ([(a, float(b)) for a, _, b in (r.partition(":") for r in args.runs.split(","))] if args.runs
                 else [(a, float(b)) for a in args.apps.split(",") for b in args.batches.split(",")])
    except ValueError:
        p.error(f"--batches or --runs: {args.runs or args.batches!r} names a batch duration that is not seconds")
    if unknown := sorted({a for a, _ in pairs if a not in ("files", "direct", "receiver")}):
        p.error(f"--apps or --runs: no app {', '.join(unknown)} (files, direct, receiver)")
    if args.repartition_keys:
        moved = repartition(args.repartition_keys, 2.0, 8)
        print(f"mapWithState, {args.repartition_keys} keys: the first batch after a restart reads the state: "
              + ", ".join(f"{k} partitions {v:.2f} s" for k, v in moved.items()))
        if not (args.handovers or args.cold):
            return
    results = [run(args.handovers, args.cold, args.keys, batch_s, app) for app, batch_s in pairs]
    print(f"upgrade of a changed program, {args.keys} keys, checkpoints on the local disk (fsync'd)")
    print(f"{'app':<8} {'batch':>6} {'row':<19} {'n':>4} {'pause p50':>10} {'p99':>8}   lost  doubled")
    for r in results:
        rows = [*r["pauses_s"].items(), ("no deploy (steady)", r["steady_gaps_s"])]
        for kind, values in rows:
            if values:
                p50, p99 = _quantiles(values)
                print(f"{r['app']:<8} {r['batch_s']:>5g}s {kind:<19} {len(values):>4} {p50:>9.2f}s {p99:>7.2f}s   "
                      f"{'?' if r['lost'] is None else r['lost']:>4}  {r['doubled']:>7}")
    for r in results:
        for kind, n in r["deployed_behind"].items():
            if n:
                print(f"{r['app']} at {r['batch_s']:g} s: {n} {kind}s asked for while the running version was still "
                      "behind after 30 s (their pauses include its backlog)")
        if r["lost"] is None:
            print(f"{r['app']} at {r['batch_s']:g} s: the last version had not caught up 60 s after the feed stopped: "
                  f"{r['behind']} lines not counted yet, so 'lost' is unknown (it fell behind: no loss shown)")
        print(f"{r['app']} at {r['batch_s']:g} s: lines fed {r['fed']}, counted in the state {r['counted']}, output "
              f"once {r['output']}; a new checkpoint instead (pyspark.streaming's only way for a changed program) "
              f"would start with none of these {r['counted']} counts")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
