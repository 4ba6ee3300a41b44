"""The nemesis drill: the main job with its checkpoint on S3 behind a fault proxy, while process
kills and storage faults come at random; nothing may be lost or counted twice.

    python -m sparkwal.engine.drill --nemesis [--mode files|receiver|direct] [--standby]
                           [--faults 6 | --duration S] [--seed 1] [--files 60] [--batch 1.0]

A real S3-compatible server (moto) runs on 127.0.0.1 behind the fault proxy
(:mod:`sparkwal.engine.apps.fault_proxy`); the main job (its checkpoint, WALs, batch log, lease and event
log on ``s3://``, ``spark.sparkwal.storage.deadline`` 4 s, a 10 s lease, files remembered for 2 h
so that none falls out of the window while it is down) runs in its own process group, fed by its
mode's source (:mod:`sparkwal.engine.apps.nemesis_workloads`: one file per batch interval, a reliable
receiver's acknowledged lines, or a direct source's partitions), with ``updateStateByKey``
running totals for files and the receiver. With ``--standby`` a hot standby runs beside it.
Once the job has completed a batch newer than any before (it is back at work), a random 3-8 s
later (the seed fixes the sequence) one nemesis strikes:

* ``kill``: SIGKILL to the active driver's process group; it is restarted from its checkpoint,
  or its standby takes the stream over;
* ``storm``: for 3-6 s a third of the requests fail (503 SlowDown, 500, a reset before or after
  the store took the request, a 1 s delay): the job (and its standby) must absorb them and go on;
* ``outage``: every request answered 503 for longer than the deadline: the active driver must
  stop with its storage exit status (4) and one line naming the operation and the object, a
  standby must wait it out; once the store is back the standby takes over, or the drill restarts
  the job;
* ``zombie``: the active driver's writes are held in the proxy (a partition that keeps them), and
  a batch interval and a half later its process group is paused (SIGSTOP) past its lease; its standby takes
  over (or the drill starts a new driver, which waits the lease out); once the new leader has
  completed a batch, the held writes are forwarded (landing after the takeover: a checkpoint,
  offsets, a lease renewal of the old epoch), then the old driver resumes: it must exit fenced
  (status 3) or, started with ``--standby``, rejoin as the new leader's standby, and the new leader
  must not stop.

Then the job runs until everything offered is counted, and the outputs are checked as in the kill
drills: exactly once for files (every file in exactly one batch, word totals exact) and direct
(lines per partition and word totals exact), at least once for the receiver (every acknowledged
line counted, duplicates only of lines the source sent again), running totals equal to the sum of
the batches' counts. Reported: faults injected by kind, requests the job retried past a fault
(the proxy's faults that did not end a run), kills, storms, outages, clean stops (status 4 with
its line), unclean stops, restarts, takeovers, records lost and doubled.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time

from .drill_runs import DrillError, AppRun, kill_remaining
from .nemesis_workloads import WORKLOADS

NEMESES = ("kill", "storm", "outage", "zombie")
STORM = {"503": 0.12, "500": 0.06, "reset_before": 0.05, "reset_after": 0.05, "delay": 0.05}
DEADLINE_S = 4
LEASE_S = 10


def _store(seed: int):
    """moto on 127.0.0.1, the fault proxy in front, a bucket of this run's own (moto keeps its
    buckets per process, across its servers): (server, proxy, bucket)."""
    import uuid

    import boto3
    from moto.server import ThreadedMotoServer

    from .fault_proxy import FaultProxy

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    bucket = f"nemesis-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", aws_access_key_id="nemesis",
                 aws_secret_access_key="nemesis", region_name="us-east-1").create_bucket(Bucket=bucket)
    return server, FaultProxy(f"http://{host}:{port}", seed=seed, delay_s=1.0), bucket


def plan(faults: int, rng: random.Random, kinds_first: tuple[str, ...] = NEMESES) -> list[str]:
    """The nemeses in order: every kind of ``kinds_first`` at least once when there are enough,
    the rest at random."""
    first = list(kinds_first[:faults])
    kinds = first + [rng.choice(NEMESES) for _ in range(max(0, faults - len(first)))]
    rng.shuffle(kinds)
    return kinds


def run(faults: int | None, files: int, batch: float, seed: int, workdir: str, log=print,
        duration_s: float | None = None, mode: str = "files", standby: bool = False,
        kinds: tuple[str, ...] = NEMESES, gap_s: tuple[float, float] = (3, 8)) -> dict:
    """``mode``: the job's source (files, receiver, direct: :mod:`sparkwal.engine.apps.nemesis_workloads`);
    ``kinds``: the nemeses that come first, in a random order, the rest drawn from all.
    ``standby``: a hot standby always runs beside the active driver; a killed or stopped active
    driver's stream is taken over by it, and a fresh standby is started. ``gap_s``: the range of the
    random wait before each nemesis, once the active driver runs."""
    rng = random.Random(seed)
    began = time.monotonic()
    until = began + duration_s if duration_s else None
    unknown = set(kinds) - set(NEMESES)
    if unknown:
        raise DrillError(f"unknown nemeses {sorted(unknown)}; known: {', '.join(NEMESES)}")
    nemeses = plan(faults if faults is not None else (1 << 20 if until else 6), rng, kinds)
    server, proxy, bucket = _store(seed)
    args = ("--checkpoint", f"s3://{bucket}/ckpt", "--storage-option", "use_listings_cache=false",
            "--storage-option", "client_kwargs=" + json.dumps({"endpoint_url": proxy.url, "region_name": "us-east-1"}),
            "--conf", f"spark.sparkwal.storage.deadline={DEADLINE_S}s", "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.streaming.driver.leaseTimeout={LEASE_S}s",  # a killed driver's lease
            # files that arrive while the job is down or behind are all to be counted, however long
            "--conf", "spark.streaming.fileStream.minRememberDuration=2h")
    workload = WORKLOADS[mode](workdir, files, batch, seed)
    env = {"AWS_ACCESS_KEY_ID": "nemesis", "AWS_SECRET_ACCESS_KEY": "nemesis", **workload.env}
    pair = _Pair(workdir, batch, (*args, *workload.args), env, standby)
    counts = {"kills": 0, "storms": 0, "outages": 0, "zombies": 0, "zombies_fenced": 0, "zombies_rejoined": 0,
              "zombie_writes_late": 0,
              "clean_stops": 0, "unclean_stops": 0}
    unclean: list[str] = []
    struck: list[str] = []
    try:
        for i, nemesis in enumerate(nemeses):
            if until is not None and time.monotonic() >= until:
                break
            pair.ensure()
            time.sleep(rng.uniform(*gap_s))
            ended = pair.ended_by_themselves()
            if ended:
                unclean.extend(ended)
                counts["unclean_stops"] += len(ended)
                continue
            log(f"nemesis {i + 1}: {nemesis}")
            struck.append(nemesis)
            if nemesis == "kill":
                pair.active.kill()
                counts["kills"] += 1
            elif nemesis == "zombie":
                counts["zombies"] += 1
                outcome, late = pair.zombie(proxy)
                counts["zombie_writes_late"] += late
                if outcome in ("fenced", "rejoined"):
                    counts["zombies_fenced"] += 1
                    counts["zombies_rejoined"] += outcome == "rejoined"
                else:
                    counts["unclean_stops"] += 1
                    unclean.append(f"zombie: the resumed driver {outcome}")
            elif nemesis == "storm":
                proxy.rates = dict(STORM)
                time.sleep(rng.uniform(3, 6))
                proxy.rates = {}
                counts["storms"] += 1
                time.sleep(DEADLINE_S + 1)  # a call that gave up in the storm has ended its run by now
                ended = pair.ended_by_themselves()
                if ended:  # a storm is to be absorbed
                    counts["unclean_stops"] += len(ended)
                    unclean.extend(f"storm: {e}" for e in ended)
            else:
                counts["outages"] += 1
                proxy.rates = {"503": 1.0}
                try:
                    status = pair.active.proc.wait(DEADLINE_S + 90)
                except Exception:  # noqa: BLE001  it did not stop: a hang is a failure
                    pair.active.kill()
                    status = None
                proxy.rates = {}
                line = _last_line(pair.active)
                if status == 4 and line.startswith("sparkwal-wordcount: ") and "storage" in line:
                    counts["clean_stops"] += 1
                else:
                    counts["unclean_stops"] += 1
                    unclean.append(f"outage: status {status}, last line {line!r}")
                if pair.spare is not None and pair.spare.proc.poll() is not None:
                    counts["unclean_stops"] += 1
                    unclean.append(f"outage: the standby ended with status {pair.spare.proc.returncode}, "
                                   f"last line {_last_line(pair.spare)!r}")
        pair.ensure(spare=False)
        workload.stop_input()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not workload.all_counted():
            time.sleep(0.2)
        pair.stop()
    finally:
        workload.close()
        kill_remaining(pair.runs)
        proxy.stop()
        server.stop()
    result = workload.verify(pair.runs)
    injected: dict[str, int] = {}
    for r in proxy.log:
        if r.fault:
            injected[r.fault] = injected.get(r.fault, 0) + 1
    result.update(counts)
    result.update({
        "mode": f"nemesis ({workload.name}{', hot standby' if standby else ''}, checkpoint on S3 "
                "behind the fault proxy)",
        "seconds": round(time.monotonic() - began, 1), "seed": seed, "nemeses": struck,
        "faults_injected": injected, "faulted_requests": sum(injected.values()),
        "requests": len(proxy.log), "restarts": pair.starts - 1, "takeovers": pair.takeovers,
        "unclean": unclean + pair.failures, "exactly_once": workload.exactly_once,
    })
    result["ok"] = result["ok"] and counts["unclean_stops"] == 0 and not pair.failures
    return result


class _Pair:
    """The active driver and, with ``standby``, its hot standby; ``runs``: every run so far."""

    def __init__(self, workdir: str, batch: float, args: tuple, env: dict, standby: bool):
        self._workdir, self._batch, self._args, self._env = workdir, batch, args, env
        self._standby = standby
        self.active: AppRun | None = None
        self.spare: AppRun | None = None
        self.runs: list[AppRun] = []
        self.starts = self.takeovers = 0
        self.failures: list[str] = []

    def _start(self, *extra: str) -> AppRun:
        run = AppRun(self._workdir, self._batch, extra_args=(*self._args, *extra), env=self._env)
        self.runs.append(run)
        self.starts += extra == ()
        return run

    def ensure(self, spare: bool = True) -> None:
        """An active driver back at work (the standby's takeover, else a restart), then a
        standby beside it waiting."""
        if self.active is None or self.active.proc.poll() is not None:
            if self.spare is not None and self.spare.proc.poll() is None:
                if self.spare.took_over.wait(LEASE_S + 60):
                    self.active, self.spare = self.spare, None
                    self.takeovers += 1
                else:
                    self.failures.append("the standby did not take over within the lease and a minute")
                    self.spare.kill()
                    self.spare = None
            if self.active is None or self.active.proc.poll() is not None:
                self.active = self._start()
        if not self.active.context_seen.wait(180) and self.active.proc.poll() is not None:
            raise DrillError(f"the job exited ({self.active.proc.returncode}) before it reported its context")
        _await_progress(self.active, self.runs)  # back at work before the next strike
        if spare and self._standby and (self.spare is None or self.spare.proc.poll() is not None):
            self.spare = self._start("--standby")
            if not self.spare.standby_seen.wait(180):
                self.failures.append("a standby did not report that it waits")

    def zombie(self, proxy) -> tuple[str, int]:
        """The active driver paused past its lease with writes in flight, a new leader, the old
        writes landing late, the old driver resumed: (what it did, the writes that landed). It
        must exit fenced (status 3: "fenced"), or, started with ``--standby``, rejoin as the
        new leader's standby ("rejoined"; it is the pair's spare from then on)."""
        old = self.active
        proxy.hold()
        time.sleep(1.5 * self._batch)  # its writes of a batch and a half wait in the "network"
        os.killpg(old.proc.pid, signal.SIGSTOP)
        proxy.stop_holding()
        try:
            if self.spare is not None and self.spare.proc.poll() is None:
                if not self.spare.took_over.wait(LEASE_S + 60):
                    self.failures.append("zombie: the standby did not take over from the paused driver")
                    return "was not taken over", 0
                self.active, self.spare = self.spare, None
                self.takeovers += 1
            else:  # a new driver waits the paused one's lease out, then leads
                self.active = self._start()
            _await_progress(self.active, self.runs)
            landed_before = _landed(proxy)
            proxy.release()  # the old epoch's writes land now, after the new leader began
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _landed(proxy) < proxy.held:
                time.sleep(0.1)
            late = _landed(proxy) - landed_before
        finally:
            os.killpg(old.proc.pid, signal.SIGCONT)
        if old.standby:
            deadline = time.monotonic() + 120
            while old.rejoined is None and old.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if old.rejoined is None or old.proc.poll() is not None or not old.rejoined.get("standby"):
                old.kill()
                return f"did not rejoin as a standby ({old.rejoined or f'status {old.proc.returncode}'})", late
            if self.spare is None or self.spare.proc.poll() is not None:
                self.spare = old
            else:
                old.terminate()
            return "rejoined", late
        try:
            status = old.proc.wait(60)
        except Exception:  # noqa: BLE001  it did not stop: a zombie that goes on is a failure
            old.kill()
            return "did not stop", late
        return "fenced" if status == 3 else f"ended with status {status}, not 3 (fenced)", late

    def ended_by_themselves(self) -> list[str]:
        out = []
        if self.active.proc.poll() is not None:
            out.append(f"run {len(self.runs)} ended by itself with status {self.active.proc.returncode}")
        if self.spare is not None and self.spare.proc.poll() is not None:
            out.append(f"a standby ended by itself with status {self.spare.proc.returncode}")
            self.spare = None
        return out

    def stop(self) -> None:
        if self.spare is not None:  # first: it must not take over from a stopping active driver
            self.spare.terminate()
        self.active.terminate()


def _await_progress(app: AppRun, runs: list[AppRun], timeout_s: float = 120) -> None:
    """Until ``app`` completed a batch newer than any before it (or ended, or the timeout)."""
    done = [b for r in runs[:-1] for _, b in r.batches()]
    newest = max(done) if done else 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and app.proc.poll() is None:
        if any(b > newest for _, b in app.batches()):
            return
        time.sleep(0.1)


def _landed(proxy) -> int:
    return sum(r.fault == "held" for r in proxy.log)


def _last_line(app: AppRun) -> str:
    try:
        with open(app.log_path) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""
