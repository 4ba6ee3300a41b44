"""``spark.streaming.concurrentJobs`` above 1 (Spark's pipelining): batches overlap, yet an
exactly-once sink's output operation runs in batch order (engine/driver/output_order.py), and a
SIGKILL while two batches overlap loses and doubles nothing (tests/direct_crash_app.py)."""

from __future__ import annotations

import signal
import sqlite3
import threading

import pytest

from sparkwal.checkpoint import CommitLog, OffsetSeqLog
from sparkwal.engine import StreamingContext, StreamingListener
from sparkwal.engine.apps.direct_wordcount import append_lines, logged_lines, read_results
from sparkwal.engine.sinks import SQLiteSink
from sparkwal.engine.sources import FileLogSource
from sparkwal.wal import ManualClock

from test_direct_crash import run_app, runs_count_every_line_once

WAIT_S = 60  # a bound for events that come within a second unless the engine is broken
T1, T2 = 500, 1000  # the first two batch times on a manual clock at 0.5 s batches


class Timeline(StreamingListener):
    """Every output operation's start and end, and batch submission, in the order they came."""

    def __init__(self):
        self.seen: list[tuple[str, int, int]] = []
        self.cond = threading.Condition()

    def _add(self, what: str, time_ms: int, op: int) -> None:
        with self.cond:
            self.seen.append((what, time_ms, op))
            self.cond.notify_all()

    def onBatchSubmitted(self, e):
        self._add("submitted", e.batchInfo().batch_time_ms, -1)

    def onBatchCommitted(self, e):
        self._add("committed", e.batchId(), -1)

    def onOutputOperationStarted(self, e):
        o = e.outputOperationInfo()
        self._add("started", o.batch_time_ms, o.output_op_id)

    def onOutputOperationCompleted(self, e):
        o = e.outputOperationInfo()
        self._add("completed" if o.failure is None else "failed", o.batch_time_ms, o.output_op_id)

    def wait_for(self, event: tuple[str, int, int]) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: event in self.seen, WAIT_S)

    def wait_for_any(self, events: list[tuple[str, int, int]]) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: any(e in self.seen for e in events), WAIT_S)

    def index(self, event: tuple[str, int, int]) -> int:
        with self.cond:
            return self.seen.index(event)


TIMELINE: list[Timeline] = []  # the running test's (the sink's function is pickled by reference)


def write(cur, batch_ms, records):
    timeline = TIMELINE[0]
    cur.execute("CREATE TABLE IF NOT EXISTS seen (batch_ms INTEGER, line TEXT)")
    cur.executemany("INSERT INTO seen VALUES (?, ?)", [(batch_ms, r) for r in records])
    timeline._add("write", batch_ms, 1)


def note_turns(monkeypatch) -> None:
    """Each in-order operation's wait for its turn noted on the running test's timeline."""
    from sparkwal.engine.driver import scheduler

    wait_turn = scheduler.wait_turn

    def noted_wait(cond, pending, time_ms, op, abandoned, *failed):
        TIMELINE[0]._add("turn", time_ms, op)
        return wait_turn(cond, pending, time_ms, op, abandoned, *failed)

    monkeypatch.setattr(scheduler, "wait_turn", noted_wait)


def start_stream(spark_context, tmp_path, outputs) -> tuple[StreamingContext, ManualClock, Timeline, SQLiteSink]:
    """A direct stream of ``tmp_path/log`` on a manual clock with two concurrent jobs, checkpointed;
    ``outputs(stream, sink)`` adds its outputs (``sink``: SQLite, ``write`` in batch order); started,
    the timeline listening."""
    logdir = tmp_path / "log"
    logdir.mkdir()
    clock, timeline = ManualClock(), Timeline()
    ssc = StreamingContext(spark_context, 0.5, clock=clock, concurrentJobs=2)
    ssc.checkpoint(str(tmp_path / "ckpt"))
    stream = ssc.directStream(FileLogSource(str(logdir)))
    sink = SQLiteSink(str(tmp_path / "out.db"), "lines")
    outputs(stream, sink)
    TIMELINE[:] = [timeline]
    ssc.addStreamingListener(timeline)
    ssc.start()
    return ssc, clock, timeline, sink


def test_a_later_batch_waits_for_the_sink_commit_of_an_earlier_one_while_other_outputs_overlap(
        spark_context, tmp_path, monkeypatch):
    """Batch 1's sink output is held (before its transaction) until batch 2's has either waited
    for its turn or tried to commit first: two hooks make the overlap deterministic, the
    scheduler's wait and the sink's commit, each noted on the timeline."""
    commit_batch = SQLiteSink.commit_batch

    def held_commit(self, batch_ms, ranges, write):
        if batch_ms == T1:
            assert TIMELINE[0].wait_for_any([("turn", T2, 1), ("tried", T2, 1)]), "batch 2 never overlapped"
        try:
            return commit_batch(self, batch_ms, ranges, write)
        finally:
            TIMELINE[0]._add("tried", batch_ms, 1)

    note_turns(monkeypatch)
    monkeypatch.setattr(SQLiteSink, "commit_batch", held_commit)

    def outputs(stream, sink):
        stream.foreachRDD(lambda rdd: rdd.count())  # output 0: no order asked
        sink.saveStream(stream, stream, write)  # output 1: in batch order

    ssc, clock, timeline, sink = start_stream(spark_context, tmp_path, outputs)
    logdir = tmp_path / "log"
    try:
        append_lines(str(logdir), "p0", 0, 3)
        clock.advance(500)
        assert timeline.wait_for(("submitted", T1, -1))  # batch 1 planned with the first lines
        append_lines(str(logdir), "p0", 3, 2)  # the same partition: batch 2 starts where 1 ends
        clock.advance(500)
        assert timeline.wait_for_any([("committed", 1, -1), ("failed", T2, 1)]), timeline.seen
    finally:
        ssc.stop(stopSparkContext=False)
    assert [e[1] for e in timeline.seen if e[0] == "write"] == [T1, T2]
    assert timeline.index(("turn", T2, 1)) < timeline.index(("write", T1, 1))  # it waited its turn
    assert timeline.index(("completed", T2, 0)) < timeline.index(("completed", T1, 1))  # others ran on
    assert not [e for e in timeline.seen if e[0] == "failed"], timeline.seen
    with sqlite3.connect(tmp_path / "out.db") as db:
        rows = db.execute("SELECT batch_ms, line FROM seen ORDER BY rowid").fetchall()
    assert [b for b, _ in rows] == [T1] * 3 + [T2] * 2
    assert timeline.index(("committed", 0, -1)) < timeline.index(("committed", 1, -1))


def test_a_failed_output_stops_the_same_output_of_every_later_batch(spark_context, tmp_path, monkeypatch):
    """Batch 1's sink output fails while batch 2's waits for its turn: batch 2's must not run (a
    sink judges a range ending at or before its stored end as in, because outputs go in batch
    order; batch 2's output over a failed batch 1 would make the restart skip batch 1's records)."""
    commit_batch = SQLiteSink.commit_batch

    def failing_commit(self, batch_ms, ranges, write):
        if batch_ms == T1:
            assert TIMELINE[0].wait_for(("turn", T2, 0)), "batch 2 never waited for its turn"
            raise RuntimeError("the database refused batch 1")
        TIMELINE[0]._add("tried", batch_ms, 0)
        return commit_batch(self, batch_ms, ranges, write)

    note_turns(monkeypatch)
    monkeypatch.setattr(SQLiteSink, "commit_batch", failing_commit)
    ssc, clock, timeline, sink = start_stream(
        spark_context, tmp_path, lambda stream, sink: sink.saveStream(stream, stream, write))  # output 0: in order
    logdir = tmp_path / "log"
    try:
        append_lines(str(logdir), "p0", 0, 3)
        clock.advance(500)
        assert timeline.wait_for(("submitted", T1, -1))
        append_lines(str(logdir), "p1", 0, 2)  # a partition the sink has no end for
        clock.advance(500)
        assert timeline.wait_for(("failed", T2, 0)), timeline.seen
    finally:
        ssc.stop(stopSparkContext=False)
    assert ("failed", T1, 0) in timeline.seen and ("tried", T2, 0) not in timeline.seen
    assert sink.offsets() == {}  # nothing of batch 2 stored: the restart runs both batches


def test_a_batch_logged_but_never_run_stops_the_in_order_output_of_later_batches(spark_context, tmp_path):
    """Batch 1's jobs fail to be made after its ranges were logged (a transform raising at job
    generation): batch 2's sink output must not run, or the restart would take batch 1's ranges
    for in (a later batch stored their ends) and skip its records."""
    def fails_at_batch_1(t, rdd):
        if int(round(t.timestamp() * 1000)) == T1:
            raise RuntimeError("batch 1's jobs cannot be made")
        return rdd

    def outputs(stream, sink):
        sink.saveStream(stream, stream, write)  # output 0: in batch order
        stream.transform(fails_at_batch_1).foreachRDD(lambda rdd: None)  # output 1

    ssc, clock, timeline, sink = start_stream(spark_context, tmp_path, outputs)
    logdir = tmp_path / "log"
    try:
        append_lines(str(logdir), "p0", 0, 3)
        clock.advance(500)
        append_lines(str(logdir), "p1", 0, 2)
        clock.advance(500)
        assert timeline.wait_for(("failed", T2, 0)), timeline.seen
    finally:
        ssc.stop(stopSparkContext=False)
    assert ("write", T2, 1) not in timeline.seen and sink.offsets() == {}


@pytest.mark.driver
def test_a_kill_while_two_batches_overlap_loses_and_doubles_nothing(tmp_path):
    """The direct word count with two concurrent jobs, SIGKILLed while the first batch with
    records is inside its sink output (before its transaction, then after it) and the next batch
    has started; restarts count every line exactly once."""
    logdir = tmp_path / "log"
    logdir.mkdir()
    ckpt = tmp_path / "checkpoint"
    for i, step in enumerate(["overlap", "overlap_output"]):
        lines = logged_lines(str(logdir))
        append_lines(str(logdir), "p0", lines.get("p0", 0), 4 + i)
        status = run_app(tmp_path, 60, step)
        assert status == -signal.SIGKILL, f"crash at {step}: exit {status} (see {tmp_path}/app.log)"
        offsets = OffsetSeqLog(str(ckpt / "offsets")).batch_ids()
        commits = CommitLog(str(ckpt / "commits")).batch_ids()
        assert commits == offsets[:len(commits)], (step, offsets, commits)
        assert len(offsets) - len(commits) >= 2, (step, offsets, commits)  # two batches in flight
        appended = logged_lines(str(logdir))
        counted = read_results(str(tmp_path))["lines"]
        assert all(counted.get(p, 0) <= n for p, n in appended.items()), (step, counted, appended)
    runs_count_every_line_once(tmp_path, logged_lines(str(logdir)), "pipelined")
