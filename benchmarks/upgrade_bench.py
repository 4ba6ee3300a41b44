"""Upgrade benchmark: how long output pauses when a changed program replaces the running one, two
ways side by side, and what a new checkpoint (pyspark.streaming's only way) would lose.

    python -m benchmarks.upgrade_bench [--handovers 10] [--cold 5] [--keys 2000] [--batch 1.0]

The app is :mod:`benchmarks.state_app` (a file stream of keys counted with ``updateStateByKey``, its
state snapshotted every two batches, the checkpoint on the local disk, ``local[2]``), fed one file of
a tenth of the keys every batch interval (the first: every key). Its two versions differ in the graph
(version 2 adds a step before the state), so every deploy is an upgrade of a changed program
(``getOrCreate(..., upgrade=True)``) that carries the state by identity; the deploys alternate
1 -> 2 -> 1 ...

* **handover**: the new version waits as a hot standby beside the old (``upgrade=True,
  standby=True``), taking each of the old one's checkpoints by the upgrade's plan; ``sparkwal
  checkpoint handover`` asks the old one to stop gracefully (it finishes the batches it has, writes
  its checkpoint, gives the leadership up and exits); the standby takes over.
* **cold upgrade**: SIGTERM as above, then the new version started (``getOrCreate(...,
  upgrade=True)``) once the old one exited.

Output pause: from the last batch the old version completed to the first newer batch the new one
completed (each batch outputs: the state's total is written every batch). Records lost and doubled:
once the feeder stops and the last version caught up, the state's total against the lines fed
(every line counted once: must be equal). A new checkpoint instead of an upgrade starts with no
state: it loses every count the old one held (reported as the keys and counts in the state at the
end). Durability: checkpoints and snapshots on the local disk, fsync'd, in every row.
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
import tempfile
import time

from benchmarks.standby_bench import App, Feeder

CONF = ("--conf", "spark.streaming.stopGracefullyOnShutdown=true", "--totals")


def _start(workdir: str, version: int, batch_s: float, standby: bool, upgrade: bool) -> App:
    return App(workdir, "sparkwal", batch_s, standby,
               extra=(*CONF, "--version", str(version), *(["--upgrade"] if upgrade else [])))


def _done(app: App) -> list[dict]:
    return [e for e in app.events() if e["event"] == "batch"]


def _stop(app: App) -> float:
    """SIGTERM (a graceful stop), and the time of its last completed batch once it exited."""
    os.killpg(app.proc.pid, signal.SIGTERM)
    app.proc.wait(timeout=120)
    return max(e["at"] for e in _done(app))


def _hand_over(workdir: str, app: App) -> float:
    """``sparkwal checkpoint handover``, and the time of the old version's last completed batch once
    it exited."""
    done = subprocess.run([sys.executable, "-m", "sparkwal", "checkpoint", "handover", os.path.join(workdir, "ckpt"),
                           "--timeout", "120"], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"the handover failed: {done.stdout}{done.stderr}")
    app.proc.wait(timeout=120)
    return max(e["at"] for e in _done(app))


def _fed(workdir: str) -> int:
    folder = os.path.join(workdir, "in")
    return sum(open(os.path.join(folder, n)).read().count("\n") for n in os.listdir(folder) if not n.startswith("."))


def run(handovers: int, cold: int, keys: int, batch_s: float) -> dict:
    workdir = tempfile.mkdtemp(prefix="upgrade-bench-")
    os.makedirs(os.path.join(workdir, "in"))
    version, apps = 1, []
    pauses: dict[str, list[float]] = {"handover": [], "cold upgrade": []}
    feeder = None
    try:
        active = _start(workdir, version, batch_s, False, False)
        apps.append(active)
        active.wait(lambda e: e["event"] == "batch")
        feeder = Feeder(workdir, keys, batch_s)  # after the start: a new file stream skips older files
        active.wait(lambda e: e["event"] == "total" and e["total"] > 0)
        for kind, n in (("handover", handovers), ("cold upgrade", cold)):
            for _ in range(n):
                version = 2 if version == 1 else 1
                if kind == "handover":
                    new = _start(workdir, version, batch_s, True, True)
                    apps.append(new)
                    new.wait(lambda e: e["event"] == "hot")
                    time.sleep(2 * batch_s)  # it has taken the old version's newest checkpoints
                    last_at = _hand_over(workdir, active)
                else:
                    last_at = _stop(active)
                    new = _start(workdir, version, batch_s, False, True)
                    apps.append(new)
                last = max(e["time_ms"] for e in _done(active))
                first = new.wait(lambda e, last=last: e["event"] == "batch" and e["time_ms"] > last)
                pauses[kind].append(first["at"] - last_at)
                active = new
                time.sleep(2 * batch_s)
        feeder.stop()
        fed = _fed(workdir)
        deadline = time.monotonic() + 60  # the last version catches up with every line fed
        totals = []
        while time.monotonic() < deadline:
            totals = [e["total"] for e in active.events() if e["event"] == "total"]
            if totals and totals[-1] >= fed:
                break
            time.sleep(batch_s)
        time.sleep(2 * batch_s)
        totals = [e["total"] for e in active.events() if e["event"] == "total"]
        counted = totals[-1] if totals else 0
        _stop(active)
    finally:
        if feeder is not None:
            feeder.stop()
        for a in apps:
            if a.proc.poll() is None:
                os.killpg(a.proc.pid, signal.SIGKILL)
                a.proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)
    return {"pauses_s": pauses, "fed": fed, "counted": counted, "lost": max(0, fed - counted),
            "doubled": max(0, counted - fed), "keys": keys, "batch_s": batch_s}


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
    p.add_argument("--batch", type=float, default=1.0)
    p.add_argument("--repartition-keys", type=int, default=0,
                   help="also: a mapWithState state of this many keys read back from 2 into 8 partitions")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args(argv)
    if args.repartition_keys:
        moved = repartition(args.repartition_keys, 2.0, 8)
        print(f"mapWithState, {args.repartition_keys} keys: the first batch after a restart reads the state: "
              + ", ".join(f"{k} partitions {v:.2f} s" for k, v in moved.items()))
        if not (args.handovers or args.cold):
            return
    r = run(args.handovers, args.cold, args.keys, args.batch)
    print(f"upgrade of a changed program, {args.batch:g} s batches, {args.keys} keys, local disk (fsync'd)")
    print(f"{'row':<14} {'n':>3} {'pause p50':>10} {'p99':>8}   lost  doubled")
    for kind, values in r["pauses_s"].items():
        if values:
            p50, p99 = _quantiles(values)
            print(f"{kind:<14} {len(values):>3} {p50:>9.2f}s {p99:>7.2f}s   {r['lost']:>4}  {r['doubled']:>7}")
    print(f"lines fed {r['fed']}, counted in the state {r['counted']}; a new checkpoint instead (pyspark.streaming's "
          f"only way for a changed program) would start with none of these {r['counted']} counts")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
