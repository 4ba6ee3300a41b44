"""mapWithState after receivers that precompute a ``reduceByKey``: while the state is small
(``spark.sparkwal.state.driverMaxKeys``) it is held on the driver and a batch runs no Spark job;
its snapshots are the executors' files; it moves to the executors when it outgrows the bound and
comes back once it fits again, with every total exact throughout. Under SIGKILL:
tests/test_driver_state_crash.py."""

from __future__ import annotations

import sys
import time

import pytest
from pyspark import cloudpickle

from sparkwal.checkpoint.state_chains import checkpoint_state, summarize_state
from sparkwal.engine import StateSpec, StreamingContext, StreamingListener, read_state
from sparkwal.engine.driver_rows import DriverRowsRDD
from sparkwal.engine.receiver.acked_lines import AckedLineReceiver, AckedLineSource
from sparkwal.engine.state import snapshot_tasks
from sparkwal.engine.state.snapshot_tasks import ChainOnDriver

from test_receiver_precompute import with_conf
from test_receivers import wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its functions run in tasks

SECRET = "driver-state-test"


def running_total(key, value, state):
    if value is None:
        return ("timed out", key)
    total = (state.getOption() or 0) + value
    if total < 0:  # a word "-k" removes k (its count is -1,000,000)
        state.remove()
        return ("removed", key)
    state.update(total)
    return (key, total)


def word_count(word: str) -> tuple:
    return (word[1:], -1_000_000) if word.startswith("-") else (word, 1)


class App:
    """``lines -> (word, 1) -> reduceByKey -> mapWithState(running_total)`` at 0.5 s batches, with
    the mapped records, whether each batch's came from the driver, and the state after each batch."""

    def __init__(self, sc, tmp_path, spec, interval=1.0, mapped_output=True, **conf):
        self.undo = with_conf(sc, **{"spark.sparkwal.receiver.precompute": "true",
                                 "spark.streaming.blockInterval": "100ms", **conf})
        self.source = AckedLineSource(SECRET)
        self.ckpt = str(tmp_path / "ckpt")
        # (batch ms, mapped records, held on the driver); the functions close over these, not the app
        self.batches = []  # type: list[tuple[int, list, bool]]
        self.states = {}  # type: dict[int, dict]
        self.paths = {}  # type: dict[int, dict]  # batch ms -> BatchInfo.paths, as the listeners hear it
        self.offered = 0
        self.create = lambda: self._program(sc, spec, interval, mapped_output)
        self.ssc = self.create()
        self.ssc.start()

    def _program(self, sc, spec, interval, mapped_output) -> StreamingContext:
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(self.ckpt)
        lines = ssc.receiverStream(AckedLineReceiver("127.0.0.1", self.source.address[1], SECRET))
        mapped = (lines.flatMap(str.split).map(word_count).reduceByKey(lambda a, b: a + b)
                  .mapWithState(spec).checkpoint(interval))
        batches, states = self.batches, self.states
        if mapped_output:  # (else only the state is output: no output reaches the mapped records)
            mapped.foreachRDD(lambda t, rdd: batches.append(
                (int(t.timestamp() * 1000), rdd.collect(), isinstance(rdd, DriverRowsRDD))))
        mapped.stateSnapshots().foreachRDD(
            lambda t, rdd: states.__setitem__(int(t.timestamp() * 1000), dict(rdd.collect())))
        paths = self.paths

        class Paths(StreamingListener):
            def onBatchCompleted(self, completed):
                paths[completed.batchInfo().batch_time_ms] = dict(completed.batchInfo().paths)
        ssc.addStreamingListener(Paths())
        return ssc

    def restart(self) -> None:
        """A graceful stop (the receivers' last blocks in a last batch, its state snapshotted),
        then the program again from the checkpoint, beside the same source."""
        self.ssc.stop(stopSparkContext=False, stopGraceFully=True)
        self.ssc = StreamingContext.getOrCreate(self.ckpt, self.create, upgrade=True)
        self.ssc.start()

    def offer(self, lines: list[str]) -> None:
        self.source.offer(lines)
        self.offered += len(lines)
        assert self.source.wait_acked(self.offered, 60)

    def totals(self) -> dict:
        out: dict = {}
        for _, records, _ in sorted(self.batches, key=lambda b: b[0]):
            out.update(r for r in records if r[0] not in ("timed out", "removed"))
        return out

    def stop(self) -> None:
        try:
            self.ssc.stop(stopSparkContext=False, stopGraceFully=True)
        finally:
            self.source.close()
            self.undo()


@pytest.mark.compat
def test_a_small_state_is_held_on_the_driver_exact_and_snapshotted_as_in_the_executors(spark_context, tmp_path):
    app = App(spark_context, tmp_path, StateSpec.function(running_total).numPartitions(3))
    expected: dict = {}
    try:
        for step in range(6):
            lines = [f"w{(step * 50 + i) % 40} é{i % 3}" for i in range(200)]
            app.offer(lines)
            for line in lines:
                for w in line.split():
                    expected[w] = expected.get(w, 0) + 1
            time.sleep(0.3)  # a source's pace: the steps land in several batches
        wait_until(lambda: app.totals() == expected, what="every running total")
        newest = max(app.states)
        wait_until(lambda: any(t > newest for t in app.states), what="one more batch")
    finally:
        app.stop()
    with_records = [b for b in app.batches if b[1]]
    assert len(with_records) >= 3 and all(on_driver for _, _, on_driver in with_records), with_records
    # the listeners' batch info says where each batch ran: the receivers' results, the state on the driver
    [seen] = {tuple(sorted((site.split(" at ")[0], path) for site, path in app.paths[t].items()))
              for t, _, _ in with_records if t in app.paths}
    assert seen == (("mapWithState", "driver"), ("receiverStream", "precomputed")), app.paths
    assert app.states[max(app.states)] == expected
    (summary,) = summarize_state({str(i): s.to_json() for i, s in checkpoint_state(app.ckpt).items()}, verify=True)
    assert summary.problems == [] and summary.chain[-1]["time_ms"] in app.states
    table = read_state(app.ckpt)[summary.name]  # written by the driver, read as any snapshot
    assert dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist())) == \
        app.states[summary.chain[-1]["time_ms"]]


@pytest.mark.slow
@pytest.mark.parametrize("mapped_output", [True, False], ids=["mapped-records-and-state", "state-alone"])
def test_restarts_hold_the_snapshotted_state_on_the_driver_from_their_first_batch(spark_context, tmp_path, monkeypatch,
                                                                                 mapped_output):
    """A graceful stop snapshots its last batch (here the first snapshot: the interval is longer
    than the run), and a restart starts from it. The restarted driver's first batches (before the
    receivers' first blocks: empty) run on the driver at once: the driver reads the state from its
    snapshot itself, no job; after the second stop, whose last batch (with records) is re-generated
    from an earlier snapshot and its inputs, the driver reads that batch's own snapshot instead, and
    builds nothing of that batch: its blocks are not read back (they came without results, which
    only the stopped driver held). The same where only ``stateSnapshots()`` is output: the mapped
    records, which no output reaches, are never computed and do not count as read later."""
    app = App(spark_context, tmp_path, StateSpec.function(running_total).numPartitions(3), interval=60.0,
              mapped_output=mapped_output)
    restarts, fallbacks = [], []

    def newest() -> int:
        return max(app.states) if app.states else 0

    try:
        app.offer(["a b"] * 30)
        wait_until(lambda: app.states.get(newest()) == {"a": 30, "b": 30}, what="the first lines")
        for step in range(2):
            app.offer(["a c"] * 10)  # stored and recorded: the stop's last batch takes them
            app.restart()
            restarts.append(newest())
            wait_until(lambda: len([t for t in app.states if t > restarts[-1]]) >= 2,
                       what=f"two batches after restart {step + 1}")
            fallbacks.append(app.ssc.receiverTracker.statistics().precompute_fallbacks)
        app.offer(["a"] * 5)
        wait_until(lambda: app.states.get(newest()) == {"a": 55, "b": 30, "c": 20},
                   what="every total after the restarts")
    finally:
        app.stop()
    if mapped_output:
        assert app.totals() == {"a": 55, "b": 30, "c": 20}
        after = sorted(b for b in app.batches if b[0] > restarts[0])
        assert after and all(on_driver for _, _, on_driver in after), after  # the empty first ones too
    # the stops' last batches, committed, are not built again: no block of theirs is read back
    assert fallbacks == [0, 0]
    if not mapped_output:
        return  # (the driver's read of a chain below is the same in both)

    # the driver's read of a chain: exact, and refused where the executors must read it
    (index, state), = checkpoint_state(app.ckpt).items()
    newest = max(state.snapshots)
    chain = ChainOnDriver(state.chain(newest), None, 1)
    parts = chain.read(spark_context, 3, 100_000)
    assert parts is not None and {k: v for part in parts for k, v, _ in part} == app.states[newest]
    monkeypatch.setattr(snapshot_tasks, "DRIVER_READERS", 2)  # more parts than readers: read at once, by a pool
    assert chain.read(spark_context, 3, 100_000) == parts
    assert chain.read(spark_context, 2, 100_000) is None  # another partition count: shuffled by the executors
    assert chain.read(spark_context, 3, 2) is None  # more keys than the bound, by its manifests
    assert ChainOnDriver(state.chain(newest), None, 2).read(spark_context, 3, 100_000) is None  # to migrate


@pytest.mark.compat
@pytest.mark.slow
def test_the_state_moves_to_the_executors_past_the_bound_and_back_once_it_fits(spark_context, tmp_path):
    app = App(spark_context, tmp_path, StateSpec.function(running_total).numPartitions(2), interval=0.5,
              **{"spark.sparkwal.state.driverMaxKeys": "4"})
    counts: dict = {}

    def offer(lines):
        app.offer(lines)
        for w in (w for line in lines for w in line.split() if not w.startswith("-")):
            counts[w] = counts.get(w, 0) + 1

    def sequence() -> list[bool]:
        """Where each batch with records ran, runs of the same place merged."""
        out: list[bool] = []
        for _, records, on_driver in sorted(app.batches, key=lambda b: b[0]):
            if records and (not out or out[-1] != on_driver):
                out.append(on_driver)
        return out

    def feed_a_until(done, what: str) -> None:
        """Offer "a" lines every 0.25 s (batches with records) until ``done()``."""
        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, f"no {what}: {sequence()}"
            offer(["a"] * 5)
            time.sleep(0.25)

    removed = ["b", *(f"k{i}" for i in range(10))]
    try:
        offer(["a b"] * 50)  # two keys: on the driver
        wait_until(lambda: app.totals().get("a") == 50, what="the first batch")
        offer([" ".join(f"k{i}" for i in range(10))] * 20 + ["a"] * 10)  # 12 keys: past the bound
        feed_a_until(lambda: sequence()[-1:] == [False], "batch in the executors")
        offer([" ".join(f"-{k}" for k in removed)])  # all but "a" removed: the state fits again
        feed_a_until(lambda: sequence()[-1:] == [True], "batch back on the driver")
        wait_until(lambda: app.totals().get("a") == counts["a"], what="a's every line")
    finally:
        app.stop()
    assert sequence()[:3] == [True, False, True], sequence()
    assert {p.get(s) for p in app.paths.values() for s in p if s.startswith("mapWithState at")} == \
        {"driver", "executors"}  # as the listeners' batch info says
    totals = app.totals()
    assert {k: totals[k] for k in counts} == counts  # exact across both moves
    assert sorted(r[1] for _, records, _ in app.batches for r in records if r[0] == "removed") == sorted(removed)
    assert app.states[max(app.states)] == {"a": counts["a"]}


def test_an_idle_key_times_out_once_in_a_batch_on_the_driver(spark_context, tmp_path):
    app = App(spark_context, tmp_path, StateSpec.function(running_total).numPartitions(2).timeout(1.0))
    try:
        app.offer(["t"])
        wait_until(lambda: any(("timed out", "t") in records for _, records, _ in app.batches),
                   what="the idle key's timeout")
        timed_out = [b for b in app.batches if ("timed out", "t") in b[1]]
        wait_until(lambda: max(app.states) > timed_out[0][0], what="a batch after it")
    finally:
        app.stop()
    (batch_ms, records, on_driver), = timed_out
    assert records == [("timed out", "t")] and on_driver
    assert [r for _, records, _ in app.batches for r in records] == [("t", 1), ("timed out", "t")]
    assert batch_ms - min(t for t, records, _ in app.batches if records) > 1000  # idle for longer than the timeout


def test_driver_max_keys_zero_keeps_the_state_in_the_executors(spark_context, tmp_path):
    app = App(spark_context, tmp_path, StateSpec.function(running_total).numPartitions(2),
              **{"spark.sparkwal.state.driverMaxKeys": "0"})
    try:
        app.offer(["x y", "x"] * 100)
        wait_until(lambda: app.totals() == {"x": 200, "y": 100}, what="every running total")
    finally:
        app.stop()
    assert not any(on_driver for _, records, on_driver in app.batches if records)
