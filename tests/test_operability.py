"""A ported app runs where pyspark.streaming ran, and every mistake a user makes gets one clear
line: the workers' interpreter, the checkpoint directory, the main job's and the drill's
arguments and environment, signals and the graceful stop's timeout, falling behind, packaging.
Driven as a user would: subprocesses in their own process groups, their exit status and output."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.driver.backlog import BacklogWatch
from sparkwal.wal import ManualClock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT_APP = os.path.join(ROOT, "tests", "port_app.py")
TRACES = ("Traceback", "Py4J", "py4j.protocol", "RejectedExecutionException", "ConnectionRefusedError",
          "\tat org.apache")


def _env(**changes) -> dict:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    env.pop("PYSPARK_PYTHON", None)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _script(path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def run_port_app(tmp_path, env: dict, batches: int, *conf: str, timeout: float = 180
                 ) -> tuple[int, list[dict], str]:
    proc = subprocess.run([sys.executable, PORT_APP, str(tmp_path), str(batches), *conf], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path), timeout=timeout,
                          start_new_session=True)
    return proc.returncode, _events(proc.stdout), proc.stderr


# ------------------------------------------------------------------ 1. the workers' interpreter


@pytest.mark.slow
@pytest.mark.driver
def test_a_ported_app_runs_its_workers_on_the_drivers_interpreter_and_stops_on_sigterm(tmp_path):
    """The README's set-up runs ``.venv/bin/python app.py`` with the virtualenv not activated:
    ``python3`` on PATH is another interpreter, without sparkwal's dependencies (here one that
    cannot even import PySpark). The workers must run the driver's own. And Spark's
    ``spark.streaming.stopGracefullyOnShutdown``: SIGTERM to the app's process group (its JVM
    included) stops it gracefully with no trace."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "python3", f"#!/bin/sh\nexec {sys._base_executable} -S \"$@\"\n")
    env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen([sys.executable, PORT_APP, str(tmp_path), "0",
                             "spark.streaming.stopGracefullyOnShutdown=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(tmp_path), start_new_session=True)
    events: list[dict] = []
    try:
        for line in proc.stdout:
            events += _events(line)
            if any(e["event"] == "batch" and e["totals"] == {"a": 2, "b": 2, "c": 1} for e in events):
                os.killpg(proc.pid, signal.SIGTERM)
                break
        rest, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    events += _events(rest)
    started = [e for e in events if e["event"] == "started"]
    assert started and started[0]["python"] == sys.executable, (events, stderr[-3000:])
    assert proc.returncode == 0 and events[-1]["event"] == "stopped", (events[-3:], stderr[-3000:])
    assert not any(t in stderr for t in TRACES), stderr[-3000:]
    assert "SIGTERM received: stopping the streaming context gracefully" in stderr


@pytest.mark.slow
@pytest.mark.driver
def test_a_configured_interpreter_that_lacks_a_module_fails_start_naming_both(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "crc32c.py").write_text("raise ImportError('crc32c is not installed here')\n")
    python = _script(tmp_path / "python-without-crc32c",
                     f"#!/bin/sh\nPYTHONPATH={hide}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    status, events, stderr = run_port_app(tmp_path, _env(PYSPARK_PYTHON=python), 4)
    errors = [e for e in events if e["event"] == "error"]
    assert status == 3 and errors, (status, events, stderr[-3000:])
    assert errors[0]["type"] == "ExecutorEnvironmentError"
    assert python in errors[0]["message"] and "crc32c" in errors[0]["message"]


# ------------------------------------------------------------------ 2. the checkpoint directory


def test_checkpoint_creates_its_directory_at_once(spark_context, tmp_path, memory_url):
    ssc = StreamingContext(spark_context, 1)
    ssc.checkpoint(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()  # as Spark's checkpoint() mkdirs it
    ssc.checkpoint(memory_url + "/ckpt")
    from sparkwal.wal import resolve

    storage, root = resolve(memory_url + "/ckpt")
    assert storage.exists(root)
    fresh = tmp_path / "made-by-getOrCreate"  # Spark's test_get_or_create_and_get_active_or_create
    StreamingContext.getOrCreate(str(fresh), lambda: StreamingContext(spark_context, 1))
    assert fresh.is_dir()  # removes it in its tearDown: it must exist before start()
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        ssc.checkpoint(str(tmp_path / "file" / "ckpt"))


# ------------------------------------------------------------------ 4. mistakes before the JVM


def _job(module: str, *args, python: list[str] | None = None, cwd=None, timeout: float = 60):
    return subprocess.run([*(python or [sys.executable]), "-m", module, *map(str, args)],
                          capture_output=True, text=True, env=_env(), cwd=cwd or ROOT, timeout=timeout)


@pytest.mark.parametrize("module, args, names", [
    ("sparkwal.engine.wordcount", ["--batch", "0"], "argument --batch: must be a positive number of seconds, got '0'"),
    ("sparkwal.engine.wordcount", ["--batch", "nan"], "argument --batch"),
    ("sparkwal.engine.wordcount", ["--files", "-3"], "argument --files"),
    ("sparkwal.engine.wordcount", ["--master", "locl[2]"], "--master 'locl[2]': not a Spark master"),
    ("sparkwal.engine.wordcount", ["--conf", "spark.x"], "--conf takes KEY=VALUE, got 'spark.x'"),
    ("sparkwal.engine.wordcount", ["--conf", "spark.sparkwal.storage.deadline=abc"],
     "--conf spark.sparkwal.storage.deadline must be a duration such as 30s or 500ms, got 'abc'"),
    ("sparkwal.engine.wordcount", ["--conf", "spark.sparkwal.state.maxLineageBatches=0"],
     "--conf spark.sparkwal.state.maxLineageBatches must be a whole number of at least 1, got '0'"),
    ("sparkwal.engine.wordcount", ["--storage-option", "x"], "key=value"),
    ("sparkwal.engine.wordcount", ["--source-port", "0"], "argument --source-port"),
    ("sparkwal.engine.drill", ["--batch", "-1"], "argument --batch"),
    ("sparkwal.engine.drill", ["--kills", "x"], "argument --kills"),
    ("sparkwal.engine.drill", ["--kinds", "driver"], "--kinds is for --mode receiver"),
    ("sparkwal.engine.drill", ["--sink", "delta"], "--sink delta is for --mode direct"),
    ("sparkwal.engine.drill", ["--sink", "kafka"], "--sink kafka is for --mode direct"),
    ("sparkwal.engine.drill", ["--speculation"], "--speculation is for --mode direct"),
    ("sparkwal.engine.drill", ["--mode", "direct", "--speculation"], "--speculation needs --standalone N with N >= 2"),
    ("sparkwal.engine.drill", ["--mode", "direct", "--sink", "hudi"], "argument --sink: invalid choice: 'hudi'"),
    ("sparkwal.engine.drill", ["--mode", "direct", "--kinds", "executor"],
     "--kinds executor in direct mode needs executor JVMs of the app's own: --master local-cluster[2,1,1024]"),
    ("sparkwal.engine.drill", ["--mode", "direct", "--kinds", "driver,worker"], "choose among driver,executor"),
    ("sparkwal.engine.wordcount", ["--source", "filelog", "--sink", "kafka"], "--sink kafka needs --kafka HOST:PORT"),
    ("sparkwal.engine.wordcount", ["--kafka", "127.0.0.1:9092"], "--kafka is for --sink kafka"),
    ("sparkwal.engine.wordcount", ["--sink", "delta"], "--sink delta: only with --source filelog"),
    ("sparkwal.engine.wordcount", ["--input", "logs"], "--input is for --source filelog (--source files reads "
     "WORKDIR/input)"),
    ("sparkwal.engine.wordcount", ["--source", "receiver", "--input", "logs"], "--input is for --source filelog"),
    ("sparkwal.engine.wordcount", ["--source", "filelog", "--source-port", "9"],
     "--source-port is for --source receiver"),
    ("sparkwal.engine.wordcount", ["--source", "filelog", "--sink", "postgres"],
     "--sink postgres needs --postgres CONNINFO"),
    ("sparkwal.engine.wordcount", ["--postgres", "host=x"], "--postgres is for --sink postgres"),
    ("sparkwal.engine.drill", ["--mode", "receiver", "--kinds", "driver,disk"], "choose among driver,executor,worker"),
])
def test_argument_mistakes_are_one_line_and_exit_2_before_any_jvm(module, args, names, tmp_path):
    proc = _job(module, *args, "--dir", tmp_path / "work")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]
    assert names in last and "Traceback" not in proc.stderr
    assert "SparkContext" not in proc.stderr and "log4j" not in proc.stderr  # no JVM started
    assert not (tmp_path / "work").exists()  # found before anything was made


def test_a_work_directory_keeps_the_sink_its_output_began_with(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "output.db").write_bytes(b"")
    proc = _job("sparkwal.engine.wordcount", "--source", "filelog", "--sink", "delta", "--dir", work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"--sink delta: {work / 'output.db'} holds this work directory's output from another sink: "
        "use that sink, or another --dir")


@pytest.mark.parametrize("module", ["sparkwal.engine.wordcount", "sparkwal.engine.drill"])
def test_an_unusable_dir_is_named(module, tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("not a directory")
    proc = _job(module, "--dir", regular)
    assert proc.returncode == 2 and f"--dir {regular}: not a directory" in proc.stderr.splitlines()[-1]
    proc = _job(module, "--dir", regular / "below")
    assert proc.returncode == 2 and f"--dir {regular / 'below'}: cannot create it" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_interpreter_without_the_packages_is_told_what_to_install(tmp_path):
    """``python3 -m sparkwal.engine.wordcount`` from a checkout, with an interpreter that has no PySpark
    (-S: no site-packages): one line naming the interpreter and the packages."""
    proc = _job("sparkwal.engine.wordcount", "--dir", tmp_path / "work", python=[sys._base_executable, "-S"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "lacks pyspark" in last and ".venv/bin/python" in last


def test_a_workers_interpreter_that_cannot_serve_is_named_before_the_jvm(tmp_path):
    bare = _script(tmp_path / "bare-python", f"#!/bin/sh\nexec {sys._base_executable} -S \"$@\"\n")
    for python, says in ((bare, "the workers' interpreter cannot import pyspark"),
                         (str(tmp_path / "no-such-python"), "the workers' interpreter does not run")):
        proc = subprocess.run([sys.executable, "-m", "sparkwal.engine.wordcount", "--dir", str(tmp_path / "work")],
                              capture_output=True, text=True, env=_env(PYSPARK_PYTHON=python), cwd=ROOT,
                              timeout=60)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and f"PYSPARK_PYTHON={python}: {says}" in last, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "log4j" not in proc.stderr


# ------------------------------------------------------------------ 5. stopping


class MainJob:
    """``python -m sparkwal.engine.wordcount --json`` in its own process group, its events read as they come."""

    def __init__(self, workdir, *args):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparkwal.engine.wordcount", "--dir", str(workdir), "--seconds", "0", "--json",
             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
            cwd=ROOT, start_new_session=True)
        self.events: list[dict] = []
        self.changed = threading.Condition()
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        for event in map(_events, self.proc.stdout):
            with self.changed:
                self.events += event
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def _read_stderr(self) -> None:
        self.stderr = self.proc.stderr.read()

    def wait_for(self, predicate, timeout: float = 180) -> list[dict]:
        with self.changed:
            ok = self.changed.wait_for(lambda: predicate(self.events) or self.proc.poll() is not None, timeout)
        assert ok and predicate(self.events), (self.events[-5:], self.proc.poll())
        return self.events

    def finish(self, timeout: float = 120) -> int:
        status = self.proc.wait(timeout)
        self.proc.stdout.close()
        return status


def _batches(events) -> int:
    return sum(e["event"] == "batch_completed" for e in events)


def _stopped_by(job: MainJob, sig: str) -> int:
    """The job's exit status after a signal, its ``stopped`` event naming ``sig`` and no trace on its
    standard error; the number of files it had counted."""
    assert job.finish() == 0
    job._err_reader.join(60)
    stopped = [e for e in job.events if e["event"] == "stopped"]
    assert stopped and stopped[0]["signal"] == sig, job.events[-5:]
    assert not any(t in job.stderr for t in TRACES), job.stderr[-3000:]
    return stopped[0]["files"]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie is gone too
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.driver
def test_signals_stop_the_main_job_gracefully_a_second_job_is_refused_and_a_kill_leaves_no_noise(tmp_path):
    """Three runs of the main job on one checkpoint, each ending another way:

    1. a second main job on the checkpoint it leads: one line naming the leader and ``--standby``,
       exit 5, before any JVM and before anything is recovered; then SIGTERM to its process group
       (the Python driver and its JVM both get it): a graceful stop, no trace;
    2. it resumes from the checkpoint; SIGINT to the Python driver alone: the same;
    3. it resumes again; ``kill -9`` of its Python process alone: its JVM sees it gone and leaves no
       shutdown trace, and its default output has no start-up lines of the JVM.

    Nothing is lost or counted twice across the three."""
    first = MainJob(tmp_path, "--files", "30")
    first.wait_for(lambda es: _batches(es) >= 2)
    second = _job("sparkwal.engine.wordcount", "--dir", tmp_path, "--json")
    assert second.returncode == 5 and second.stdout == "", (second.stdout, second.stderr)
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {first.proc.pid}" in lines[0] and "--standby" in lines[0]
    assert "recovered" not in second.stderr and "SparkContext" not in second.stderr
    first.wait_for(lambda es: _batches(es) >= 3)
    os.killpg(first.proc.pid, signal.SIGTERM)
    done = _stopped_by(first, "SIGTERM")

    again = MainJob(tmp_path, "--files", "30")
    again.wait_for(lambda es: any(e["event"] == "context" for e in es))
    assert [e["recovery"] for e in again.events if e["event"] == "context"] == ["checkpoint"]
    again.wait_for(lambda es: _batches(es) >= 2)
    os.kill(again.proc.pid, signal.SIGINT)
    _stopped_by(again, "SIGINT")

    last = MainJob(tmp_path, "--files", "30")
    last.wait_for(lambda es: _batches(es) >= 2)
    jvms = _children(last.proc.pid)
    os.kill(last.proc.pid, signal.SIGKILL)  # the Python driver alone: its JVM sees it gone
    last.proc.wait(60)
    deadline = time.monotonic() + 60
    while not all(_gone(j) for j in jvms) and time.monotonic() < deadline:
        time.sleep(0.2)
    last._err_reader.join(60)
    for noise in ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level",
                  "EOF reached before Python server acknowledged", "ERROR DAGScheduler", *TRACES):
        assert noise not in last.stderr, last.stderr[-3000:]
    outputs = [json.load(open(tmp_path / "output" / n)) for n in os.listdir(tmp_path / "output")]
    counted = sorted(f for o in outputs for f in o["files"])
    assert len(counted) == len(set(counted)) and len(counted) >= done  # nothing lost or doubled


def test_a_graceful_stop_gives_up_after_its_timeout_and_leaves_the_rest_to_the_restart(spark_context):
    """Batches queued behind a slow one: after ``spark.streaming.gracefulStopTimeout`` (Spark's
    default, 10 batch intervals: 1 s here) the stop cancels the running batch and returns; the
    batches not done are named and never run (a restart runs them), where it used to run every
    queued batch first."""
    clock = ManualClock(0)
    ssc = StreamingContext(spark_context, 0.1, clock=clock)
    running, submitted, ran = threading.Event(), [], []

    def output(t, rdd):
        ran.append(int(t.timestamp() * 1000))
        if len(ran) == 1:
            running.set()
            rdd.map(slow_task).count()  # a long Spark job: the next batches queue up behind it

    def slow_task(x):  # by value in the task (a test module is not importable by the workers)
        import time

        time.sleep(120)  # the workload of a slow batch (the stop cancels it long before)
        return x

    class Submitted(StreamingListener):
        def onBatchSubmitted(self, batchSubmitted):
            submitted.append(batchSubmitted.batchInfo().batch_time_ms)

    ssc.queueStream([], default=spark_context.parallelize([1], 1)).foreachRDD(output)
    ssc.addStreamingListener(Submitted())
    ssc.start()
    for _ in range(6):
        clock.advance(100)
    assert running.wait(60)
    while len(submitted) < 6:  # the timer thread has fired every batch due
        ssc.awaitTerminationOrTimeout(0.05)
    ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert ssc.batches_left_for_restart == [100, 200, 300, 400, 500, 600]
    assert ran == [100], "no batch left for the restart ran, and the slow one was cancelled"


# ------------------------------------------------------------------ 6. falling behind


class _Info:
    def __init__(self, batch_ms: int, delay_ms: int, processing_ms: int | None = None):
        self.batch_time_ms, self.scheduling_delay_ms, self.processing_delay_ms = batch_ms, delay_ms, processing_ms


class _Started:
    def __init__(self, batch_ms, delay_ms, processing_ms=None):
        self.info = _Info(batch_ms, delay_ms, processing_ms)

    def batchInfo(self):
        return self.info


def test_falling_behind_is_said_once_then_at_most_once_a_minute_and_when_it_recovers(caplog):
    clock, posted = ManualClock(0), []
    watch = BacklogWatch(1000, 3, clock, lambda: 7, posted.append)
    with caplog.at_level("WARNING", logger="sparkwal.engine.driver.backlog"):
        watch.onBatchStarted(_Started(clock.now_ms(), 9000))  # no batch completed: how long they take is unknown
        watch.onBatchCompleted(_Started(clock.now_ms(), 0, 1400))  # batches take longer than the interval
        watch.onBatchStarted(_Started(clock.now_ms(), 9000))  # one sample is not enough (a first batch warms up)
        watch.onBatchCompleted(_Started(clock.now_ms(), 0, 1600))
        for delay in (500, 2000, 3500, 5000, 9000):  # passes 3 intervals at 3.5 s
            clock.advance(1000)
            watch.onBatchStarted(_Started(clock.now_ms(), delay))
        clock.advance(60_000)
        watch.onBatchStarted(_Started(clock.now_ms(), 3200))  # a minute on, not grown since said
        watch.onBatchStarted(_Started(clock.now_ms(), 8000))  # grown: said again
        clock.advance(10_000)
        watch.onBatchStarted(_Started(clock.now_ms(), 20000))  # growing, but within the minute
        watch.onBatchStarted(_Started(clock.now_ms(), 900))  # under one interval: caught up
        watch.onBatchStarted(_Started(clock.now_ms(), 800))
    assert [(e.state, e.scheduling_delay_ms, e.backlog) for e in posted] == [
        ("falling_behind", 3500, 7), ("still_behind", 8000, 7), ("caught_up", 900, 7)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "falling behind: scheduling delay 3.5 s" in lines[0]
    assert "7 batches queued or running; batches take 1.5 s, longer than the 1.0 s interval" in lines[0]
    assert lines[2].startswith("caught up")


def test_a_backlog_of_batches_that_run_faster_than_the_interval_is_catching_up_not_falling_behind(caplog):
    """A restart's batches missed while down: delayed, but each runs in 0.4 s of a 1 s interval."""
    clock, posted = ManualClock(0), []
    watch = BacklogWatch(1000, 3, clock, lambda: 9, posted.append)
    with caplog.at_level("WARNING", logger="sparkwal.engine.driver.backlog"):
        for delay in (9000, 8600, 8200, 7800, 3000, 1200, 1000):
            watch.onBatchStarted(_Started(clock.now_ms(), delay))
            clock.advance(400)
            watch.onBatchCompleted(_Started(clock.now_ms(), delay, 400))
    assert [(e.state, e.scheduling_delay_ms) for e in posted] == [("catching_up", 8200), ("caught_up", 1000)]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("catching up: 9 batches due (scheduling delay 8.2 s); batches take 0.4 s of the 1.0 s "
                        "interval, back on time in about 6 s")
    assert not any("behind" in line for line in lines)


# ------------------------------------------------------------------ 7. packaging


def test_one_import_package_is_installed(tmp_path):
    """Run from outside the checkout, the installed project offers one import package, sparkwal:
    no benchmarks, no top-level engine, wal, checkpoint or tracker for a user's folder to shadow."""
    names = ("benchmarks", "engine", "wal", "checkpoint", "tracker", "sparkwal", "sparkwal.engine", "sparkwal.wal")
    proc = subprocess.run([sys.executable, "-c", "import importlib.util as u, json, sys; print(json.dumps("
                           "[u.find_spec(n) is not None for n in sys.argv[1:]]))", *names],
                          capture_output=True, text=True, cwd=str(tmp_path), env=_env(PYTHONPATH=None))
    assert json.loads(proc.stdout) == [False, False, False, False, False, True, True, True], proc.stderr
