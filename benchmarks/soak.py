"""The soak: the stateful receiver app with a hot standby, at 1 s batches, for hours; what grows?

    python -m benchmarks.soak [--minutes 120] [--sample 60] [--dir WORKDIR] [--out soak.json]

Starts the main job (``python -m sparkwal.engine.wordcount --source receiver --batch 1``: a reliable
receiver with its WAL, ``updateStateByKey`` running totals, a checkpoint, the Streaming UI and
event log on) and a hot standby of it (``--standby``), each in its own process group. Every
``--sample`` seconds it records, for each of the two drivers: the Python driver's, its JVM's and
its Python workers' resident memory, their open files and threads; and the checkpoint directory's
size and file count. At the end: each series' slope per hour over the second half of the run
(after warm-up), next to its mean, and whether it is flat within noise (the slope times the run's
length under 10% of the mean, or under an absolute floor: 8 MB, 8 files, 4 threads). The job is
then stopped with SIGTERM and must exit 0; the standby too.

By hand (not in CI): its command and figures are in docs/benchmarks.md#soak.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

FLOORS = {"rss_mb": 8.0, "fds": 8, "threads": 4, "checkpoint_mb": 8.0, "checkpoint_files": 8}


def process_tree(root: int) -> list[int]:
    """``root`` and every descendant, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def _kind(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv0 = f.read().split(b"\0", 1)[0]
    return "jvm" if argv0.endswith(b"java") else "workers"


def sample_tree(root: int) -> dict[str, dict[str, float]]:
    """Resident MB, open files and threads of a driver's Python process, its JVM and its workers."""
    parts = {k: {"rss_mb": 0.0, "fds": 0, "threads": 0} for k in ("driver", "jvm", "workers")}
    for pid in process_tree(root):
        try:
            kind, status = _kind(pid, root), _status(pid)
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:  # ended while sampled
            continue
        part = parts[kind]
        part["rss_mb"] += status.get("VmRSS", 0) / 1024
        part["fds"] += fds
        part["threads"] += status.get("Threads", 0)
    return parts


def directory_size(path: str) -> tuple[float, int]:
    total = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
                files += 1
            except OSError:
                pass
    return total / 2**20, files


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mx) * (v - my) for t, v in points) / var * 3600


def series(samples: list[dict]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for role in ("leader", "standby"):
            for part, values in s[role].items():
                for metric, value in values.items():
                    out.setdefault(f"{role}.{part}.{metric}", []).append((s["t"], value))
        out.setdefault("checkpoint.checkpoint_mb", []).append((s["t"], s["checkpoint_mb"]))
        out.setdefault("checkpoint.checkpoint_files", []).append((s["t"], s["checkpoint_files"]))
    return out


def verdicts(samples: list[dict]) -> list[dict]:
    """Per series, over the second half: mean, slope per hour, growth over the whole run, flat?"""
    if not samples:
        return []
    length_h = (samples[-1]["t"] - samples[0]["t"]) / 3600
    half = samples[len(samples) // 2:]
    rows = []
    for name, points in series(half).items():
        mean = sum(v for _, v in points) / len(points)
        slope = slope_per_hour(points)
        growth = slope * length_h
        floor = FLOORS[name.rsplit(".", 1)[1]]
        rows.append({"series": name, "mean": round(mean, 2), "slope_per_hour": round(slope, 3),
                     "growth_over_run": round(growth, 2),
                     "flat": abs(growth) < max(floor, 0.1 * abs(mean))})
    return rows


def _start(args: list[str], log_path: str) -> subprocess.Popen:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    log = open(log_path, "w")  # noqa: SIM115 (the process's lifetime)
    return subprocess.Popen([sys.executable, "-m", "sparkwal.engine.wordcount", *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen, timeout: float = 120) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def run(minutes: float, sample_s: float, workdir: str, out_path: str | None) -> dict:
    files = int(minutes * 60) + 600  # the bundled source: 3 lines a second, outlasting the run
    common = ["--dir", workdir, "--batch", "1", "--json"]
    leader = _start([*common, "--source", "receiver", "--files", str(files), "--seconds", "0"],
                    os.path.join(workdir, "leader.log"))
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(workdir, "checkpoint")) and time.monotonic() < deadline:
        time.sleep(1)
    standby = _start([*common, "--standby"], os.path.join(workdir, "standby.log"))
    samples: list[dict] = []
    start = time.monotonic()
    ended_early = None
    try:
        while time.monotonic() - start < minutes * 60:
            time.sleep(sample_s)
            if leader.poll() is not None or standby.poll() is not None:
                ended_early = (f"a driver ended after {(time.monotonic() - start) / 60:.1f} min (leader "
                               f"{leader.poll()}, standby {standby.poll()}): see {workdir}/*.log")
                break
            mb, count = directory_size(os.path.join(workdir, "checkpoint"))
            samples.append({"t": round(time.monotonic() - start, 1), "leader": sample_tree(leader.pid),
                            "standby": sample_tree(standby.pid), "checkpoint_mb": round(mb, 3),
                            "checkpoint_files": count})
            s = samples[-1]
            print(f"{s['t'] / 60:6.1f} min  leader driver {s['leader']['driver']['rss_mb']:.0f} MB "
                  f"jvm {s['leader']['jvm']['rss_mb']:.0f} MB  standby driver "
                  f"{s['standby']['driver']['rss_mb']:.0f} MB  checkpoint {mb:.1f} MB/{count} files",
                  flush=True)
    finally:
        leader_rc, standby_rc = _stop(leader), _stop(standby)
    delays = []
    with open(os.path.join(workdir, "leader.log")) as f:
        for line in f:
            if line.startswith("{") and json.loads(line).get("event") == "batch_completed":
                delays.append(json.loads(line)["scheduling_ms"])
    batches = len(delays)
    delays.sort()
    scheduling = {q: delays[min(len(delays) - 1, int(len(delays) * f))] if delays else None
                  for q, f in (("p50_ms", 0.5), ("p99_ms", 0.99), ("max_ms", 1.0))}
    report = {"minutes": minutes, "sample_s": sample_s, "batches_completed": batches,
              "scheduling_delay": scheduling, "ended_early": ended_early,
              "leader_exit": leader_rc, "standby_exit": standby_rc, "rows": verdicts(samples),
              "samples": samples}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--minutes", type=float, default=120)
    ap.add_argument("--sample", type=float, default=60, help="seconds between samples")
    ap.add_argument("--dir", help="work directory (default: a new temporary one)")
    ap.add_argument("--out", help="write the samples and verdicts here as JSON")
    args = ap.parse_args(argv)
    workdir = args.dir or tempfile.mkdtemp(prefix="sparkwal-soak-")
    os.makedirs(workdir, exist_ok=True)
    report = run(args.minutes, args.sample, workdir, args.out)
    print(f"\n{report['batches_completed']} batches (scheduling delay {report['scheduling_delay']}); "
          f"leader exit {report['leader_exit']}, standby exit {report['standby_exit']}")
    print("| series | mean | slope per hour | growth over the run | flat |")
    print("|---|---:|---:|---:|---|")
    for row in report["rows"]:
        print(f"| {row['series']} | {row['mean']} | {row['slope_per_hour']} | "
              f"{row['growth_over_run']} | {'yes' if row['flat'] else '**no**'} |")
    if report["ended_early"]:
        print(f"FAILED: {report['ended_early']}")
    ok = (report["ended_early"] is None and report["leader_exit"] == 0 and report["standby_exit"] == 0
          and all(r["flat"] for r in report["rows"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
