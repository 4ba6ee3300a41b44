"""What every drill does with the apps it runs: start the main job in its own process group
and follow its JSON events (:class:`AppRun`), kill it, write its input, and check its per-batch
outputs against what was written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from sparkwal.base.errors import SparkwalError
from sparkwal.base.service import Service, spawn

from .wordcount_data import expected_counts, file_lines, write_input_file


class DrillError(SparkwalError, RuntimeError):
    """A drill could not go on: its app exited or never reported what the drill waits for (the
    message says which, and where the app's log is)."""


class AppRun:
    """One run of the app; collects (wall time, batch ms) of each completed batch it prints."""

    def __init__(self, workdir: str, batch: float, upgrade: bool = False, extra_args=(),
                 env: dict | None = None):
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1", **(env or {}))
        self.started = time.monotonic()
        self.recovery: str | None = None  # the path the app's restart took
        self.context_seen = threading.Event()  # set when the app reports its context
        self.standby_seen = threading.Event()  # a standby: set when it reports it waits
        self.takeover: dict | None = None  # a standby's takeover event, once it took over
        self.took_over = threading.Event()
        self.fenced: dict | None = None  # the app's "fenced" event: its leadership was lost
        self.rejoined: dict | None = None  # fenced, started with --standby: its "rejoined" event
        self.standby = "--standby" in extra_args  # started with getOrCreate(..., standby=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparkwal.engine.wordcount", "--dir", workdir, "--batch", str(batch),
             "--files", "0", "--seconds", "0", "--json", *(["--upgrade"] if upgrade else []),
             *extra_args],
            stdout=subprocess.PIPE, stderr=self._log_file(workdir), text=True, env=env,
            start_new_session=True)
        self.completed: list[tuple[float, int]] = []
        self.receivers: list[tuple[float, dict]] = []  # (wall time, receiver_started event)
        self.lock = threading.Lock()
        self.reader = spawn("drill-app-output", self._read)

    def _log_file(self, workdir: str):
        """The app's stderr, kept per run for post-mortems: ``WORKDIR/logs/app-<n>.log``."""
        logs = os.path.join(workdir, "logs")
        os.makedirs(logs, exist_ok=True)
        self.log_path = os.path.join(logs, f"app-{len(os.listdir(logs))}.log")
        return open(self.log_path, "w")

    def _read(self) -> None:
        assert self.proc.stdout is not None  # started with stdout=PIPE
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not an event (anything else the app prints)
            if not isinstance(event, dict):
                continue
            if event.get("event") == "context":
                self.recovery = event.get("recovery")
                self.context_seen.set()
            elif event.get("event") == "standby":
                self.standby_seen.set()
            elif event.get("event") == "fenced":
                self.fenced = event
            elif event.get("event") == "rejoined":  # fenced, it waits again as a standby
                self.fenced = self.rejoined = event
                self.took_over.clear()
                self.standby_seen.set()
            elif event.get("event") == "takeover":
                self.takeover = event
                self.took_over.set()
            elif event.get("event") == "receiver_started":
                with self.lock:
                    self.receivers.append((time.monotonic(), event))
            elif event.get("event") == "batch_completed":
                with self.lock:
                    self.completed.append((time.monotonic(), int(event["batch_ms"])))

    def batches(self) -> list[tuple[float, int]]:
        with self.lock:
            return list(self.completed)

    def kill(self) -> float:
        killed_at = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.reader.join(5)
        return killed_at

    def terminate(self, timeout: float = 60) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.reader.join(5)


def kill_budget(kills: int | None, duration_s: float | None, default_kills: int
                ) -> tuple[float, float | None, int]:
    """(start, deadline or None, kills): a drill ends after ``kills`` kills or ``duration_s``
    seconds, whichever comes first; with only a duration, kills are unbounded."""
    began = time.monotonic()
    until = began + duration_s if duration_s else None
    return began, until, kills if kills is not None else (1 << 30 if until else default_kills)


def kill_remaining(runs: list[AppRun]) -> None:
    """SIGKILL the process group of every run still alive (a drill's last word)."""
    for r in runs:
        if r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()


def write_report(report: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


def read_outputs(workdir: str) -> list[dict]:
    out = os.path.join(workdir, "output")
    return [json.load(open(os.path.join(out, n))) for n in sorted(os.listdir(out)) if n.endswith(".json")]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


def start_input(input_dir: str, files: int, batch: float, stop: threading.Event,
                stop_input: threading.Event) -> tuple[Service, list[int]]:
    """Write input file i at i+1 batch intervals, until ``files`` or a stop; ``generated[0]``:
    how many were written."""
    generated = [0]

    def generate() -> None:
        for i in range(files):
            if stop.wait(batch) or stop_input.is_set():
                return
            write_input_file(input_dir, i)
            generated[0] = i + 1

    return spawn("drill-input", generate), generated


def start_file_input(workdir: str, files: int, batch: float):
    """The files mode's work directory (``input``, ``output``) and its input writer: returns
    (input directory, stop event, stop-input event, the writer's thread, ``generated``)."""
    input_dir = os.path.join(workdir, "input")
    os.makedirs(input_dir, exist_ok=True)
    os.makedirs(os.path.join(workdir, "output"), exist_ok=True)
    stop, stop_input = threading.Event(), threading.Event()
    generator, generated = start_input(input_dir, files, batch, stop, stop_input)
    return input_dir, stop, stop_input, generator, generated


def wait_until_counted(workdir: str, generated: list[int], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len({f for o in read_outputs(workdir) for f in o["files"]}) >= generated[0]:
            return
        time.sleep(0.2)


def check_outputs(workdir: str, files: int, runs: list[AppRun]) -> dict:
    """The per-batch outputs against the first ``files`` input files: every file counted in
    exactly one batch, word totals exact, running totals equal to the sum of the counts."""
    outputs = read_outputs(workdir)
    seen: dict[str, int] = {}
    observed: dict[str, int] = {}
    for o in outputs:
        for f in o["files"]:
            seen[f] = seen.get(f, 0) + 1
        for w, n in o["counts"].items():
            observed[w] = observed.get(w, 0) + n
    expected = expected_counts(range(files))
    records_expected = sum(len(file_lines(i)) for i in range(files))
    missing_files = [f"f{i}" for i in range(files) if f"f{i}" not in seen]
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    lost_words = sum(max(0, n - observed.get(w, 0)) for w, n in expected.items())
    extra_words = sum(max(0, n - expected.get(w, 0)) for w, n in observed.items())
    running: dict[str, int] = {}
    state_mismatches = 0  # batches whose running totals (updateStateByKey) disagree with the counts
    for o in sorted(outputs, key=lambda o: o["batch_ms"]):
        for w, n in o["counts"].items():
            running[w] = running.get(w, 0) + n
        state_mismatches += o["totals"] != running
    final_totals = max(outputs, key=lambda o: o["batch_ms"])["totals"] if outputs else {}
    completed = [b for r in runs for _, b in r.batches()]
    result = {
        "files": files, "records": records_expected,
        "batches_completed": len(set(completed)),
        "batches_rerun": len(completed) - len(set(completed)),
        "records_lost": sum(len(file_lines(int(f[1:]))) for f in missing_files),
        "files_missing": missing_files, "duplicate_files": duplicates,
        "words_lost": lost_words, "words_extra": extra_words,
        "state_mismatches": state_mismatches, "final_totals_exact": final_totals == expected,
    }
    result["ok"] = (not missing_files and not duplicates and not lost_words and not extra_words
                    and not state_mismatches and result["final_totals_exact"])
    return result
