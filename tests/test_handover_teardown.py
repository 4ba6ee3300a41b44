"""The old leader of a handover lets its process go on to stop Spark only once its successor ran a
batch, or its wait ran out (engine/driver/handover.py); what it waits for is read from the checkpoint
directory (sparkwal.checkpoint.progress), the same read the handover command makes."""

from sparkwal.checkpoint import Checkpoint, CheckpointWriter, CommitLog, CommitMetadata
from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.checkpoint.progress import batch_done_at_epoch
from sparkwal.engine.driver import handover
from sparkwal.wal import StorageLocation


class _Clock:
    """A clock that the wait's sleeps move (no real sleep)."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_the_wait_ends_when_the_successor_ran_a_batch(tmp_path):
    clock, answers = _Clock(), iter([False, False, True])
    ran = handover.await_successor(StorageLocation(str(tmp_path)), 3, 10.0, ran=lambda: next(answers),
                                   clock=clock, sleep=clock.sleep)
    assert ran and clock.slept == [handover.POLL_S, handover.POLL_S]


def test_the_wait_is_bounded_local_only_and_can_be_turned_off(tmp_path):
    clock, looks = _Clock(), []
    local = StorageLocation(str(tmp_path))

    def never() -> bool:
        looks.append(clock.now)
        return False

    assert not handover.await_successor(local, 3, 1.0, ran=never, clock=clock, sleep=clock.sleep)
    assert 1.0 <= clock.now <= 1.0 + 2 * handover.POLL_S  # no successor: the stop goes on, in bounded time

    looks.clear()
    assert not handover.await_successor(local, 3, 0, ran=never)  # spark.sparkwal.handover.teardownWait=0
    assert not handover.await_successor(StorageLocation("memory://sparkwal-handover"), 3, 10.0, ran=never)
    assert not handover.await_successor(local, None, 10.0, ran=never)  # (no leadership was held)
    assert looks == []


def _checkpoint(directory: str, epoch: int, completed_ms: int) -> None:
    writer = CheckpointWriter(directory)
    writer.write(Checkpoint(completed_ms, [], {"leader_epoch": epoch, "completed_ms": completed_ms}))
    writer.stop()


def test_only_a_batch_the_successor_completed_counts(tmp_path):
    directory = str(tmp_path)
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("not a commit")  # garbage in the log: a no, not an error
    assert not handover.successor_ran(directory, None, epoch=3)()

    (tmp_path / "commits" / "0").unlink()
    _checkpoint(directory, 3, 5_000)  # the old leader's own last batch
    ran = handover.successor_ran(directory, None, epoch=3)
    assert not ran()
    _checkpoint(directory, 4, 5_000)  # a new leader's first checkpoint on a new batch grid: the same batch
    assert not ran()
    _checkpoint(directory, 4, 5_100)  # its first batch
    assert ran()
    assert batch_done_at_epoch(directory, None, 4) and not batch_done_at_epoch(directory, None, 5)


def test_a_commit_of_the_successor_counts(tmp_path):
    directory = str(tmp_path)
    ran = handover.successor_ran(directory, None, epoch=3)
    assert not ran()  # nothing there yet: no, and no error
    commits = CommitLog(CheckpointLayout(directory).commits, None)
    commits.add(0, CommitMetadata(leader_epoch=3))
    assert not ran()
    commits.add(1, CommitMetadata(leader_epoch=4))
    assert ran()
