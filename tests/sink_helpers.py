"""What the exactly-once sinks' tests share: a direct stream of FileLogSource lines as rows
``(partition, line)`` into a sink on a manual clock, the lines expected, and the crash app
(tests/sink_crash_app.py) run in a process group of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.apps.direct_wordcount import append_lines, direct_line
from sparkwal.engine.sources import FileLogSource
from sparkwal.wal import ManualClock

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT_S = 60  # a bound for events that come within seconds unless the engine is broken


class Completed(StreamingListener):
    def __init__(self):
        self.times: list[int] = []
        self.cond = threading.Condition()

    def onBatchCompleted(self, e):
        with self.cond:
            self.times.append(e.batchInfo().batch_time_ms)
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.times) >= n, WAIT_S), f"{n} batches not completed"


def expected(counts: dict[str, int]) -> list[str]:
    """The lines ``append_lines`` wrote: ``counts[p]`` of each partition ``p``, sorted."""
    return sorted(direct_line(p, i) for p, n in counts.items() for i in range(n))


def run_stream(sc, logdir, sink, batches: list[dict[str, int]], start_ms: int = 0, checkpoint=None,
               **save_options) -> None:
    """A direct stream from ``logdir`` into ``sink`` (from ``sink.offsets()``) on a manual clock at
    ``start_ms``: before each batch, the lines ``batches[i]`` says are appended
    (``save_options``: keyword arguments of ``sink.saveStream``)."""
    logdir.mkdir(exist_ok=True)
    clock, completed = ManualClock(start_ms), Completed()
    ssc = StreamingContext(sc, 0.5, clock=clock)
    if checkpoint is not None:
        ssc.checkpoint(str(checkpoint))
    stream = ssc.directStream(FileLogSource(str(logdir)), fromOffsets=sink.offsets())
    # (a lambda: pickled by value, as the tests' modules are not on the executors' path)
    sink.saveStream(stream.map(lambda line: (line.split(" ", 1)[0].rsplit("-", 1)[0], line)), stream, **save_options)
    ssc.addStreamingListener(completed)
    ssc.start()
    try:
        for i, lines in enumerate(batches):
            for p, n in lines.items():
                have = sum(1 for _ in open(logdir / p)) if (logdir / p).exists() else 0
                append_lines(str(logdir), p, have, n)
            clock.advance(500)
            completed.wait_for(i + 1)
    finally:
        ssc.stop(stopSparkContext=False)


def run_app(workdir, seconds: float, crash_at: str | None = None, sink: str = "delta", **env_vars) -> int:
    """tests/sink_crash_app.py on ``workdir`` (its own process group), its exit status."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]),
               **env_vars)
    with open(os.path.join(workdir, "app.log"), "a") as err:
        return subprocess.run([sys.executable, os.path.join(HERE, "sink_crash_app.py"), str(workdir),
                               str(seconds), sink, *([crash_at] if crash_at else [])],
                              stdout=subprocess.DEVNULL, stderr=err, env=env, timeout=180,
                              start_new_session=True).returncode


def drill_exactly_once(workdir, sink: str, seed: int) -> None:
    """CI's share of ``sparkwal drill --mode direct --sink SINK`` (longer runs by hand, figures in
    docs/direct.md): the main job killed once at a random moment (each step of the sink's protocol has
    its deterministic crash test), its output read back through the sink's own reader: every line
    counted exactly once."""
    from sparkwal.engine.apps import direct_drill

    report = direct_drill.run(1, 0.5, seed=seed, workdir=str(workdir), log=lambda *_: None, sink=sink)
    assert report["kills"] == 1 and report["lines_appended"] > 100 and report["sink"] == sink
    assert report["records_lost"] == 0 and report["duplicates"] == 0 and report["words_exact"], report
    assert report["ok"]


def crash_at_each_step_then_recover(workdir, read_lines, sink: str = "delta", steps=("written", "committed"),
                                     **env_vars) -> None:
    """Lines appended and the crash app SIGKILLed at each of ``steps`` in turn (``written``: the rows
    written or staged, the sink's commit not made; ``committed``: the commit made, the stream's
    checkpoint not; the others in tests/sink_crash_app.py), then run until ``read_lines()`` (the
    sink's lines, sorted) holds every line appended (a busy machine may need more than one short run
    for the re-runs): exactly once."""
    logdir = os.path.join(workdir, "log")
    os.makedirs(logdir, exist_ok=True)
    appended = {"p0": 0, "p1": 0}
    for step in steps:
        for p, n in (("p0", 3), ("p1", 2)):
            append_lines(logdir, p, appended[p], n)
            appended[p] += n
        status = run_app(workdir, 60, step, sink, **env_vars)
        assert status == -signal.SIGKILL, f"crash at {step}: exit {status} (see {workdir}/app.log)"
    for _run in range(3):
        assert run_app(workdir, 8, None, sink, **env_vars) == 0, f"see {workdir}/app.log"
        if read_lines() == expected(appended):
            break
    assert read_lines() == expected(appended)
