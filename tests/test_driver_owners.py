"""The job generator and the checkpoints, each built alone with fakes of its collaborators: what
each owns, and whom it calls, is handed to its constructor and to its start (issue 66 §1).
No SparkContext: the collaborators are plain objects that record their calls."""

from __future__ import annotations

import threading

from sparkwal.engine.driver.batches import BatchPlanner
from sparkwal.engine.driver.checkpointing import CheckpointedRun, Checkpointing
from sparkwal.engine.driver.generator import BatchSteps, JobGenerator
from sparkwal.engine.driver.output_order import ANY_OPERATION
from sparkwal.engine.graph import DStreamGraph
from sparkwal.tracker import InputInfoTracker, StreamInputInfo
from sparkwal.wal import FencedError, ManualClock


class Calls(list):
    def record(self, *call):
        self.append(call)


class FakeScheduler:
    def __init__(self, calls: Calls, pending=()):
        self.calls, self.pending = calls, list(pending)

    def submit(self, time_ms, jobs, input_infos, due_ms=None, breakdown=None, paths=None):
        self.calls.record("submit", time_ms, list(jobs), dict(input_infos))

    def output_failed(self, output_op_id, time_ms):
        self.calls.record("output_failed", output_op_id, time_ms)

    def cleanup_old_blocks(self, thresh_ms):
        self.calls.record("cleanup_old_blocks", thresh_ms)

    def pending_times(self):
        return list(self.pending)


class FakeSnapshots:
    """No state, unless ``waits`` names batch times held for a state's lineage, or ``due`` ones
    whose completion snapshots it."""

    def __init__(self, calls: Calls, waits=(), due=()):
        self.calls, self.waits, self.due, self.each_batch = calls, set(waits), set(due), False

    def generation_waits(self, time_ms):
        return "its state reaches back too far" if time_ms in self.waits else None

    def any_due(self, time_ms):
        return time_ms in self.due

    def snapshot_due(self, time_ms):
        self.calls.record("snapshot", time_ms)

    def floor(self, time_ms):
        return time_ms - 3000

    def checkpoint_data(self):
        return {}

    def placement_data(self):
        return {}, {}, 0

    def on_checkpoint_written(self):
        self.calls.record("snapshots told")


class FakeCheckpoints:
    def __init__(self, calls: Calls):
        self.calls = calls

    def checkpoint_batch(self, time_ms, clear_later):
        self.calls.record("checkpoint", time_ms, clear_later)


class FakeGraph:
    inputs: list = []
    streams: list = []

    def __init__(self, calls: Calls):
        self.calls = calls

    def generate_jobs(self, time_ms):
        self.calls.record("graph", time_ms)
        return [f"job of {time_ms}"]

    def clear_metadata(self, time_ms):
        self.calls.record("clear_metadata", time_ms)

    def max_remember_ms(self):
        return 2000


class FakeBlocks:
    def __init__(self, calls: Calls):
        self.calls = calls

    def allocate_blocks_to_batch(self, time_ms):
        self.calls.record("blocks", time_ms)


def make_generator(calls, *, confirm=None, checkpointing=True, snapshots=None, skip=()):
    errors: list = []
    infos = InputInfoTracker()
    generator = JobGenerator(FakeScheduler(calls), ManualClock(0), 1000, snapshots or FakeSnapshots(calls),
                             FakeCheckpoints(calls), infos, lambda e, t: errors.append((type(e), t)), lambda: None)
    generator.use(BatchSteps(FakeGraph(calls), FakeBlocks(calls), None, BatchPlanner(None, [], set(skip)),
                             confirm or (lambda: calls.record("confirm")), lambda t: calls.record("done", t),
                             checkpointing))
    return generator, infos, errors


def test_the_generator_plans_confirms_submits_then_checkpoints_each_batch_in_that_order():
    calls = Calls()
    generator, infos, errors = make_generator(calls, skip={2000})
    infos.report_info(1000, StreamInputInfo(0, 5))
    generator.generate_jobs(1000)
    generator.generate_jobs(2000)  # completed before a restart: regenerated without outputs
    assert calls == [("blocks", 1000), ("confirm",), ("graph", 1000),
                     ("submit", 1000, ["job of 1000"], {0: StreamInputInfo(0, 5)}), ("checkpoint", 1000, False),
                     ("blocks", 2000)]
    assert errors == []
    generator.stop()


def test_a_tick_after_the_generator_stopped_queues_nothing_and_raises_nothing():
    """An app ended by an error exits without stop(): its timer may tick after Python shut the
    event thread's pool down (an "Exception in thread JobGenerator" trace on the console before)."""
    calls = Calls()
    generator, _, errors = make_generator(calls)
    generator.stop()
    generator.rerun([3000])  # queued as the timer's tick queues it
    assert generator.queued_times() == [] and calls == [] and errors == []


def test_a_batch_whose_leadership_is_not_confirmed_is_not_submitted_and_stops_later_in_order_outputs():
    calls = Calls()

    def fenced():
        raise FencedError("another driver leads (epoch 3)")

    generator, _, errors = make_generator(calls, confirm=fenced)
    generator.generate_jobs(1000)
    assert calls == [("blocks", 1000), ("output_failed", ANY_OPERATION, 1000)]
    assert errors == [(FencedError, 1000)]
    generator.stop()


def test_a_completed_batch_is_checkpointed_and_its_blocks_cleaned_at_once_without_a_checkpoint_directory():
    calls = Calls()
    generator, _, _ = make_generator(calls, checkpointing=False)
    generator.generate_jobs(5000)
    calls.clear()
    generator.on_batch_completion(5000)
    assert generator.drain(10)
    assert calls == [("clear_metadata", 5000), ("checkpoint", 5000, True), ("cleanup_old_blocks", 3000)]
    assert generator.last_processed_ms == 5000
    generator.stop()


def test_a_batch_held_for_its_states_lineage_is_generated_once_the_batch_in_flight_completes():
    calls = Calls()
    generator, _, _ = make_generator(calls, snapshots=FakeSnapshots(calls, waits={2000}))
    generator.rerun([1000, 2000, 3000])
    assert generator.drain(10)
    assert generator.queued_times() == [2000, 3000]  # held, and the next one behind it
    assert [c for c in calls if c[0] == "submit"] == [("submit", 1000, ["job of 1000"], {})]
    generator.on_batch_completion(1000)
    assert generator.drain(10)
    assert generator.queued_times() == []
    assert [c[1] for c in calls if c[0] == "submit"] == [1000, 2000, 3000]
    generator.stop()


class FakeWriter:
    keep = 10

    def __init__(self):
        self.written: list = []
        self.flushed = threading.Event()

    def write(self, checkpoint):
        self.written.append(checkpoint)

    def flush(self):
        self.flushed.set()


def make_checkpoints(calls, writer, pending=(), due=()):
    checkpoints = Checkpointing(1000, FakeSnapshots(calls, due=due), lambda: 7)
    graph = DStreamGraph()
    graph.start(0)
    checkpoints.start(CheckpointedRun(writer, None, graph, None, "code-1", [["spark.app.name", "t"]],
                                      FakeScheduler(calls, pending)))
    return checkpoints


def test_the_checkpoints_say_which_batch_completed_under_which_epoch_and_what_is_pending():
    calls, writer = Calls(), FakeWriter()
    checkpoints = make_checkpoints(calls, writer, pending=[5000])
    checkpoints.checkpoint_batch(5000, clear_later=False)  # at its generation
    checkpoints.batch_succeeded(4000)
    checkpoints.checkpoint_batch(4000, clear_later=True)  # at its completion, every output succeeded
    first, second = writer.written
    assert (first.checkpoint_time_ms, first.pending_times_ms, first.data["completed_ms"]) == (5000, [5000], None)
    assert (second.checkpoint_time_ms, second.data["completed_ms"]) == (4000, 4000)
    assert second.data["leader_epoch"] == 7 and second.data["code"] == "code-1"
    assert second.data["floor_ms"] == 1000  # the snapshots' floor of the oldest batch it may re-run


def test_a_completion_that_snapshots_state_is_written_before_and_after_the_snapshot():
    calls, writer = Calls(), FakeWriter()
    checkpoints = make_checkpoints(calls, writer, due={3000})
    checkpoints.checkpoint_batch(3000, clear_later=True)
    assert [c.checkpoint_time_ms for c in writer.written] == [3000, 3000]
    assert calls == [("snapshot", 3000)]


def test_a_durable_checkpoint_cleans_up_the_blocks_behind_its_floor_and_tells_the_snapshots():
    calls, writer = Calls(), FakeWriter()
    checkpoints = make_checkpoints(calls, writer)
    checkpoints.checkpoint_batch(6000, clear_later=True)
    checkpoints.on_written(6000)
    assert calls == [("cleanup_old_blocks", 3000), ("snapshots told",)]
    assert checkpoints.written == 1 and checkpoints.write_ms.get(6000) is not None


def test_nothing_is_written_without_a_checkpoint_directory():
    calls = Calls()
    checkpoints = Checkpointing(1000, FakeSnapshots(calls), lambda: None)
    checkpoints.start(CheckpointedRun(None, None, DStreamGraph(), None, None, [], FakeScheduler(calls)))
    checkpoints.checkpoint_batch(1000, clear_later=True)
    assert calls == []


class FakeSparkContext:
    def setJobGroup(self, *args, **kwargs):
        pass

    def setLocalProperty(self, key, value):
        pass


class FakePlanner:
    def __init__(self, calls: Calls, fail=False):
        self.calls, self.fail = calls, fail

    def plan_batch(self, time_ms):
        return True

    def batch_ran(self, time_ms, info, ok):
        self.calls.record("commit", time_ms, ok)
        if self.fail:
            raise OSError("the commits log could not be written")


class FakeReceivers:
    def __init__(self, calls: Calls):
        self.calls = calls

    def on_batch_completed(self, time_ms, info):
        self.calls.record("receivers told", time_ms)


class SnapshotsTold(FakeSnapshots):
    def on_batch_done(self, time_ms):
        self.calls.record("snapshots told", time_ms)


class SucceededCheckpoints(FakeCheckpoints):
    write_ms: dict = {}

    def batch_succeeded(self, time_ms):
        self.calls.record("succeeded", time_ms)


def make_scheduler(calls, planner):
    from sparkwal.engine.driver.events import EventBus
    from sparkwal.engine.driver.scheduler import JobScheduler

    errors: list = []
    reported = threading.Event()

    def on_error(error, time_ms):
        errors.append((type(error), time_ms))
        reported.set()

    scheduler = JobScheduler(FakeSparkContext(), ManualClock(0), 1000, 1, EventBus(), SnapshotsTold(calls),
                             SucceededCheckpoints(calls), on_error, lambda: None)
    scheduler.start(BatchSteps(FakeGraph(calls), FakeBlocks(calls), FakeReceivers(calls), planner,
                               lambda: None, lambda t: calls.record("driver told", t), True))
    return scheduler, errors, reported


def test_the_scheduler_commits_a_batch_then_tells_the_checkpoints_state_receivers_and_driver_in_order():
    calls = Calls()
    scheduler, errors, _ = make_scheduler(calls, FakePlanner(calls))
    scheduler.submit(4000, [], {})  # a batch without jobs is committed at once
    assert calls == [("succeeded", 4000), ("commit", 4000, True), ("snapshots told", 4000),
                     ("receivers told", 4000), ("driver told", 4000)]
    assert errors == []
    scheduler.stop(wait=True)
    scheduler.generator.stop()


def test_a_batch_whose_commit_fails_is_not_checkpointed_as_completed():
    """Its jobs ran, its commit failed: the error ends the context, and no completion comes for the
    generator to checkpoint (a restart re-runs the batch)."""
    from sparkwal.engine.dstream import Job

    calls = Calls()
    scheduler, errors, reported = make_scheduler(calls, FakePlanner(calls, fail=True))
    scheduler.submit(5000, [Job(0, "foreachRDD", lambda: calls.record("job ran"))], {})
    assert reported.wait(10) and scheduler.generator.drain(10)
    assert ("job ran",) in calls and ("commit", 5000, True) in calls
    assert not any(c[0] in ("checkpoint", "driver told") for c in calls)
    assert errors == [(OSError, 5000)]
    scheduler.stop(wait=True)
    scheduler.generator.stop()
