"""The old leader of a handover stops Spark only once its successor ran a batch, or its wait ran out
(engine/driver/handover.py); and what it waits for is read from the checkpoint directory
(sparkwal.checkpoint.progress), the same read the handover command makes."""

import threading

from sparkwal.checkpoint import CommitLog, CommitMetadata
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.checkpoint.progress import batch_done_at_epoch
from sparkwal.engine.driver import handover


class _Recorder:
    def __init__(self, calls: list):
        self.calls = calls

    def stop(self, **kwargs):
        self.calls.append("context.stop" if kwargs == {"stopSparkContext": False, "stopGraceFully": True}
                          else "sc.stop")


def test_spark_stops_after_the_successor_ran_a_batch():
    calls: list = []
    answers = iter([False, False, True])

    def ran():
        calls.append("looked")
        return next(answers)

    recorder = _Recorder(calls)
    handover.hand_over(recorder, recorder, ran, wait_s=60)
    assert calls == ["context.stop", "looked", "looked", "looked", "sc.stop"]


def test_the_wait_is_bounded_and_can_be_turned_off():
    calls: list = []
    recorder = _Recorder(calls)
    handover.hand_over(recorder, recorder, lambda: False, wait_s=0.2)  # no successor: Spark stops anyway
    assert calls[0] == "context.stop" and calls[-1] == "sc.stop"

    calls.clear()
    handover.hand_over(recorder, recorder, lambda: calls.append("looked"), wait_s=0)  # teardownWait=0
    assert calls == ["context.stop", "sc.stop"]

    calls.clear()
    stopped = threading.Event()
    stopped.set()
    handover.hand_over(recorder, recorder, lambda: False, wait_s=60, stopped=stopped)
    assert calls == ["context.stop", "sc.stop"]


def test_a_batch_done_is_read_from_the_successors_commit_only(tmp_path):
    directory = str(tmp_path)
    ran = handover.successor_ran(directory, None, epoch=3)
    assert not ran()  # nothing there yet: no, and no error
    commits = CommitLog(CheckpointLayout(directory).commits, None)
    commits.add(0, CommitMetadata(leader_epoch=3))  # the old leader's own last batch
    assert not ran()
    assert batch_done_at_epoch(directory, None, 3)
    commits.add(1, CommitMetadata(leader_epoch=4))  # the new leader's first
    assert ran()
