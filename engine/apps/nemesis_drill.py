"""The nemesis drill: the main job with its checkpoint on S3 behind a fault proxy, while process
kills and storage faults come at random; nothing may be lost or counted twice.

    python -m engine.drill --nemesis [--faults 6 | --duration S] [--seed 1] [--files 60] [--batch 1.0]

A real S3-compatible server (moto) runs on 127.0.0.1 behind the fault proxy
(:mod:`engine.apps.fault_proxy`); the main job (file stream, ``updateStateByKey`` running
totals, the checkpoint and its WALs and event log on ``s3://``, ``spark.sparkwal.storage.deadline``
4 s, a 10 s lease, files remembered for 2 h so that none falls out of the window while it is down) runs in its own process group while the drill writes one input file per batch interval.
Once the job has completed a batch newer than any before (it is back at work), a random 3-8 s
later (the seed fixes the sequence) one nemesis strikes:

* ``kill``: SIGKILL to the job's process group; it is restarted from its checkpoint;
* ``storm``: for 3-6 s a third of the requests fail (503 SlowDown, 500, a reset before or after
  the store took the request, a 1 s delay): the job must absorb them and go on;
* ``outage``: every request answered 503 for longer than the deadline: the job must stop with
  its storage exit status (4) and one line naming the operation and the object; the drill
  restarts it once the store is back.

Then the job runs until every file is counted, and the outputs are checked as in the kill drill:
every file counted in exactly one batch, word totals exact, running totals equal to the sum of
the batches' counts. Reported: faults injected by kind, requests the job retried past a fault
(the proxy's faults that did not end a run), kills, storms, outages, clean stops (status 4 with
its line), unclean stops, restarts, records lost and doubled.
"""

from __future__ import annotations

import json
import logging
import random
import time

from .drill_runs import AppRun, check_outputs, kill_remaining, start_file_input, wait_until_counted

NEMESES = ("kill", "storm", "outage")
STORM = {"503": 0.12, "500": 0.06, "reset_before": 0.05, "reset_after": 0.05, "delay": 0.05}
DEADLINE_S = 4


def _store(seed: int):
    """moto on 127.0.0.1, the fault proxy in front, a bucket: (server, proxy)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from .fault_proxy import FaultProxy

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", aws_access_key_id="nemesis",
                 aws_secret_access_key="nemesis", region_name="us-east-1").create_bucket(Bucket="nemesis")
    return server, FaultProxy(f"http://{host}:{port}", seed=seed, delay_s=1.0)


def plan(faults: int, rng: random.Random) -> list[str]:
    """The nemeses in order: every kind at least once when there are enough, the rest at random."""
    kinds = list(NEMESES[:faults]) + [rng.choice(NEMESES) for _ in range(max(0, faults - len(NEMESES)))]
    rng.shuffle(kinds)
    return kinds


def run(faults: int | None, files: int, batch: float, seed: int, workdir: str, log=print,
        duration_s: float | None = None) -> dict:
    rng = random.Random(seed)
    began = time.monotonic()
    until = began + duration_s if duration_s else None
    nemeses = plan(faults if faults is not None else (1 << 20 if until else 6), rng)
    server, proxy = _store(seed)
    args = ("--checkpoint", "s3://nemesis/ckpt", "--storage-option", "use_listings_cache=false",
            "--storage-option", "client_kwargs=" + json.dumps({"endpoint_url": proxy.url, "region_name": "us-east-1"}),
            "--conf", f"spark.sparkwal.storage.deadline={DEADLINE_S}s", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.streaming.driver.leaseTimeout=10s",  # a killed driver's lease: 10 s
            # files that arrive while the job is down or behind are all to be counted, however long
            "--conf", "spark.streaming.fileStream.minRememberDuration=2h")
    env = {"AWS_ACCESS_KEY_ID": "nemesis", "AWS_SECRET_ACCESS_KEY": "nemesis"}
    _input_dir, stop, stop_input, generator, generated = start_file_input(workdir, files, batch)
    runs: list[AppRun] = []
    counts = {"kills": 0, "storms": 0, "outages": 0, "clean_stops": 0, "unclean_stops": 0}
    unclean: list[str] = []
    struck: list[str] = []
    try:
        app = None
        for i, nemesis in enumerate(nemeses):
            if until is not None and time.monotonic() >= until:
                break
            if app is None or app.proc.poll() is not None:
                app = AppRun(workdir, batch, extra_args=args, env=env)
                runs.append(app)
            if not app.context_seen.wait(180) and app.proc.poll() is not None:
                raise RuntimeError(f"the job exited ({app.proc.returncode}) before it reported its context")
            _await_progress(app, runs)  # the job back at work before the next strike
            time.sleep(rng.uniform(3, 8))
            if app.proc.poll() is not None:
                unclean.append(f"run {len(runs)} ended by itself with status {app.proc.returncode}")
                counts["unclean_stops"] += 1
                continue
            log(f"nemesis {i + 1}: {nemesis}")
            struck.append(nemesis)
            if nemesis == "kill":
                app.kill()
                counts["kills"] += 1
            elif nemesis == "storm":
                proxy.rates = dict(STORM)
                time.sleep(rng.uniform(3, 6))
                proxy.rates = {}
                counts["storms"] += 1
            else:
                counts["outages"] += 1
                proxy.rates = {"503": 1.0}
                try:
                    status = app.proc.wait(DEADLINE_S + 90)
                except Exception:  # noqa: BLE001  it did not stop: a hang is a failure
                    app.kill()
                    status = None
                proxy.rates = {}
                line = _last_line(app)
                if status == 4 and line.startswith("sparkwal-wordcount: ") and "storage" in line:
                    counts["clean_stops"] += 1
                else:
                    counts["unclean_stops"] += 1
                    unclean.append(f"outage: status {status}, last line {line!r}")
        if app is None or app.proc.poll() is not None:
            app = AppRun(workdir, batch, extra_args=args, env=env)
            runs.append(app)
        stop_input.set()
        generator.join()
        wait_until_counted(workdir, generated, 180)
        app.terminate()
    finally:
        stop.set()
        kill_remaining(runs)
        proxy.stop()
        server.stop()
    result = check_outputs(workdir, generated[0], runs)
    injected: dict[str, int] = {}
    for r in proxy.log:
        if r.fault:
            injected[r.fault] = injected.get(r.fault, 0) + 1
    result.update(counts)
    result.update({
        "mode": "nemesis (file stream, checkpoint on S3 behind the fault proxy)",
        "seconds": round(time.monotonic() - began, 1), "seed": seed, "nemeses": struck,
        "faults_injected": injected, "faulted_requests": sum(injected.values()),
        "requests": len(proxy.log), "restarts": len(runs) - 1, "unclean": unclean,
        "records_doubled": result["duplicate_files"],
    })
    result["ok"] = result["ok"] and counts["unclean_stops"] == 0
    return result


def _await_progress(app: AppRun, runs: list[AppRun], timeout_s: float = 120) -> None:
    """Until ``app`` completed a batch newer than any before it (or ended, or the timeout)."""
    done = [b for r in runs[:-1] for _, b in r.batches()]
    newest = max(done) if done else 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and app.proc.poll() is None:
        if any(b > newest for _, b in app.batches()):
            return
        time.sleep(0.1)


def _last_line(app: AppRun) -> str:
    try:
        with open(app.log_path) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""
