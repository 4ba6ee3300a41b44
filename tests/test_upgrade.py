"""Upgrades to a changed program (``getOrCreate(..., upgrade=True)``): each input's position and
each stateful operator's state go to the stream of the same identity, wherever the new version
put it; a state the new version adds starts empty at its first batch; a loss is refused by name
unless the program drops it; a direct stream's logged uncommitted batch re-runs in the new graph
exactly once, and an input the new version adds reads from its own start."""

from __future__ import annotations

import json
import operator
import os

import pytest
from test_cli import sparkwal
from test_direct_stream import append
from test_engine_recovery import Completed, ms, put_file

from sparkwal.checkpoint import CommitLog, OffsetSeqLog, read_checkpoint
from sparkwal.engine import CheckpointMismatchError, StateSpec, StreamingContext
from sparkwal.engine.sources import FileLogSource
from sparkwal.wal import ManualClock


class Totals:
    """Word totals (``updateStateByKey``, snapshotted every batch); the new version adds a
    lower-casing step before them, a line count state and a second output."""

    def __init__(self, sc, tmp_path):
        self.sc, self.indir, self.ckpt = sc, tmp_path / "in", tmp_path / "ckpt"
        self.indir.mkdir(exist_ok=True)
        self.totals: dict[int, list] = {}
        self.lines: dict[int, list] = {}

    def setup(self, clock, done, version: int):
        def create():
            ssc = StreamingContext(self.sc, 0.5, clock=clock)
            ssc.checkpoint(str(self.ckpt))
            lines = ssc.textFileStream(str(self.indir))
            if version >= 2:
                lines = lines.map(str.lower) if version != 5 else lines.filter(bool).map(str.lower)

                def count(key, value, state):  # (defined here: the workers cannot import this module)
                    state.update((state.get() if state.exists() else 0) + value)

                line_total = lines.map(lambda _: ("lines", 1)).mapWithState(StateSpec.function(count))
                line_total.checkpoint(0.5)
                kept_lines = self.lines
                line_total.stateSnapshots().foreachRDD(lambda t, rdd: kept_lines.__setitem__(ms(t), rdd.collect()))
            if version == 4:  # a second state of the kind and input of the totals: told apart by order only
                lines.map(lambda w: (w, 1)).updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).foreachRDD(
                    lambda rdd: None)
            if version != 3:  # version 3 drops the totals
                words = lines.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(operator.add)
                totals = words.updateStateByKey(lambda vs, s: sum(vs) + (s or 0))
                totals.checkpoint(0.5)
                kept = self.totals
                totals.foreachRDD(lambda t, rdd: kept.__setitem__(ms(t), sorted(rdd.collect())))
            ssc.addStreamingListener(done)
            return ssc
        return create

    def run(self, version: int, start_ms: int, until_ms: int, files: dict[int, str]):
        clock, done = ManualClock(start_ms), Completed()
        ssc = StreamingContext.getOrCreate(str(self.ckpt), self.setup(clock, done, version), upgrade=True)
        ssc.start()
        t = start_ms
        while t < until_ms:
            t += 500
            if t in files:
                put_file(self.indir, f"{t}.txt", files[t], t - 100)
            clock.advance(500)
            done.wait_for(t)
        ssc.stop(stopSparkContext=False)
        return ssc


@pytest.mark.slow
def test_a_changed_program_keeps_its_state_and_a_new_state_starts_empty(spark_context, tmp_path):
    app = Totals(spark_context, tmp_path)
    app.run(1, 0, 1000, {500: "X y", 1000: "x"})
    assert app.totals[1000] == [("X", 1), ("x", 1), ("y", 1)]
    before = read_checkpoint(str(app.ckpt)).data
    old_state = next(iter(before["state"]))  # the totals' stream index in version 1

    ssc = app.run(2, 1000, 1500, {1500: "Y z"})
    plan = ssc._driver.upgrade_plan.lines()
    assert any(line.startswith(f"carried: updateStateByKey(files:{app.indir})") for line in plan), plan
    assert any(line.startswith("new: mapWithState(") for line in plan), plan
    # the totals went on from version 1's; the lower-casing applies to what version 2 reads
    assert app.totals[1500] == [("X", 1), ("x", 1), ("y", 2), ("z", 1)]
    # the new state counts only the lines version 2 read (its first batch is 1500)
    assert app.lines[1500] == [("lines", 1)]
    after = read_checkpoint(str(app.ckpt)).data
    slots = {int(i): n for i, n in after["state_slots"].items()}
    carried = next(i for i, n in slots.items() if n == int(old_state))
    assert carried != int(old_state)  # the totals moved: the map came before them
    assert all(ref["url"].startswith(f"state/{old_state}-")
               for ref in after["state"][str(carried)]["snapshots"].values())
    added = next(i for i in slots if i != carried)
    assert slots[added] > max(int(i) for i in before["identities"])  # a number no stream had
    assert after["state_starts"] == {str(added): 1500}

    # the same version again: where the upgrade put things is the checkpoint's now
    ssc = app.run(2, 1500, 2000, {2000: "x"})
    assert ssc._driver.upgrade_plan is None
    assert app.totals[2000] == [("X", 1), ("x", 2), ("y", 2), ("z", 1)]
    assert app.lines[2000] == [("lines", 2)]

    # every run is on record, an upgrade with its plan (sparkwal status, the Streaming page's recoveries)
    runs = json.loads(sparkwal("status", app.ckpt, "--json", expect=0).stdout)["runs"]
    assert [("upgradePlan" in r) for r in runs] == [False, True, False]
    assert runs[1]["upgradePlan"][2].startswith("new: mapWithState(")

    # a second upgrade: the state the first added keeps its start and its number
    ssc = app.run(5, 2000, 2500, {2500: "z"})
    assert ssc._driver.upgrade_plan is not None
    assert app.totals[2500] == [("X", 1), ("x", 2), ("y", 2), ("z", 2)] and app.lines[2500] == [("lines", 3)]
    again = read_checkpoint(str(app.ckpt)).data
    line_state = next(i for i, n in again["state_slots"].items() if n == slots[added])
    assert again["state_starts"] == {line_state: 1500}
    assert again["next_ids"]["input"] == 1 and again["next_ids"]["state"] > slots[added]


def test_an_upgrade_that_loses_a_state_is_refused_unless_the_program_drops_it(spark_context, tmp_path,
                                                                                live_settings):
    app = Totals(spark_context, tmp_path)
    app.run(1, 0, 500, {500: "a"})
    with pytest.raises(CheckpointMismatchError) as refused:
        StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(600), Completed(), 3), upgrade=True)
    said = str(refused.value)
    assert f"the checkpoint's state of updateStateByKey updateStateByKey(files:{app.indir}) has no stream" in said
    assert "spark.sparkwal.upgrade.allowDrop" in said and "carried: files:" in said
    with pytest.raises(CheckpointMismatchError, match=r"told apart from a stream like it only by the program's order"):
        StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(600), Completed(), 4), upgrade=True)

    live_settings({"spark.sparkwal.upgrade.allowDrop": f"updateStateByKey(files:{app.indir})"})
    ssc = app.run(3, 500, 1000, {1000: "b c"})
    assert any(line.startswith("dropped: updateStateByKey(") for line in ssc._driver.upgrade_plan.lines())

    assert app.lines[1000] == [("lines", 1)]  # the new state: only what version 3 read


def test_without_upgrade_a_changed_graph_is_refused_saying_what_an_upgrade_would_do(spark_context, tmp_path):
    """A checkpoint's own program (recovered with its code) must be the program that runs: a
    changed setup is only taken with upgrade=True; the refusal says what that would carry."""
    app = Totals(spark_context, tmp_path)
    app.run(1, 0, 500, {500: "a"})
    ckpt = read_checkpoint(str(app.ckpt))
    ssc = app.setup(ManualClock(600), Completed(), 2)()
    with pytest.raises(CheckpointMismatchError) as refused:
        ssc._driver.restore(ckpt, "checkpoint")
    assert "An upgrade (getOrCreate(..., upgrade=True) with this program) would match them by identity: " \
           f"carried: files:{app.indir} (files input; stream 0 -> 0)" in str(refused.value)


class TwoLogs:
    """Version 1 reads log ``a``; version 2 reads a new log ``b`` (made first: input 0 of its
    program) and ``a``, each recorded by batch time; ``a``'s output fails from ``fail_from`` on."""

    def __init__(self, sc, tmp_path):
        self.sc = sc
        self.logs = {n: tmp_path / n for n in "ab"}
        for d in self.logs.values():
            d.mkdir()
        self.ckpt = tmp_path / "ckpt"
        self.got: dict[str, dict[int, list]] = {"a": {}, "b": {}}

    def setup(self, clock, version: int, fail_from: int | None, *listeners):
        def create():
            ssc = StreamingContext(self.sc, 0.5, clock=clock)
            ssc.checkpoint(str(self.ckpt))
            names = "ba" if version == 2 else "a"
            for name in names:
                stream = ssc.directStream(FileLogSource(str(self.logs[name])))
                got = self.got[name]

                def record(t, rdd, got=got, name=name):
                    if name == "a" and fail_from is not None and ms(t) >= fail_from:
                        raise RuntimeError("output failed")
                    got[ms(t)] = sorted(rdd.collect())
                stream.foreachRDD(record)
            for listener in listeners:
                ssc.addStreamingListener(listener)
            return ssc
        return create


def test_a_logged_uncommitted_batch_reruns_in_the_new_graph_once_and_a_new_input_reads_from_its_start(
        spark_context, tmp_path):
    app = TwoLogs(spark_context, tmp_path)
    append(app.logs["a"] / "p", "a0")
    append(app.logs["b"] / "p", "b0", "b1")
    clock, done = ManualClock(0), Completed()
    ssc = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock, 1, 1000, done))
    ssc.start()
    clock.advance(500)
    done.wait_for(500)
    append(app.logs["a"] / "p", "a1")
    clock.advance(500)  # batch 1000 is logged, its output fails: not committed
    with pytest.raises(RuntimeError):
        ssc.awaitTermination(30)
    ssc.stop(stopSparkContext=False)
    assert CommitLog(str(app.ckpt / "commits")).batch_ids() == [0]
    assert OffsetSeqLog(str(app.ckpt / "offsets")).get(1).metadata.conf["sparkwal.inputIds"] == "0"

    append(app.logs["a"] / "p", "a2")
    clock2, done2 = ManualClock(1000), Completed()
    ssc2 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock2, 2, None, done2), upgrade=True)
    ssc2.start()
    assert ssc2.rerun_batch_times == [1000]
    done2.wait_for(1000)
    clock2.advance(500)
    done2.wait_for(1500)
    ssc2.stop(stopSparkContext=False)

    assert app.got["a"] == {500: ["a0"], 1000: ["a1"], 1500: ["a2"]}  # the logged range once, then on
    assert app.got["b"][1000] == [] and app.got["b"][1500] == ["b0", "b1"]  # from its own start
    offsets = OffsetSeqLog(str(app.ckpt / "offsets"))
    # log a keeps input id 0 (its start offsets and logged lines), log b gets 1 though made first
    assert offsets.get(2).metadata.conf["sparkwal.inputIds"] == "0,1"
    assert (app.ckpt / "sources" / "1" / "0").exists()
    assert CommitLog(str(app.ckpt / "commits")).batch_ids() == [0, 1, 2]

    # the same version again (upgrade=True, as a redeploy would): each log keeps its id, though
    # the program makes b first
    append(app.logs["a"] / "p", "a3")
    append(app.logs["b"] / "p", "b2")
    clock3, done3 = ManualClock(1500), Completed()
    ssc3 = StreamingContext.getOrCreate(str(app.ckpt), app.setup(clock3, 2, None, done3), upgrade=True)
    ssc3.start()
    clock3.advance(500)
    done3.wait_for(2000)
    ssc3.stop(stopSparkContext=False)
    assert app.got["a"][2000] == ["a3"] and app.got["b"][2000] == ["b2"]
    assert OffsetSeqLog(str(app.ckpt / "offsets")).get(3).metadata.conf["sparkwal.inputIds"] == "0,1"


class Versioned:
    """Word totals as ints (state version 1), then as {"n": total} dicts (version 2, migrating)."""

    def __init__(self, sc, tmp_path):
        self.sc, self.indir, self.ckpt = sc, tmp_path / "in", tmp_path / "ckpt"
        self.indir.mkdir(exist_ok=True)
        self.totals: dict[int, list] = {}
        self.migrated: list = []

    def setup(self, clock, done, version: int):
        def create():
            ssc = StreamingContext(self.sc, 0.5, clock=clock)
            ssc.checkpoint(str(self.ckpt))
            words = ssc.textFileStream(str(self.indir)).flatMap(str.split).map(lambda w: (w, 1))
            if version == 1:
                totals = words.updateStateByKey(lambda vs, s: sum(vs) + (s or 0))
            else:
                def to_v2(from_version, value):
                    assert from_version == 1
                    return {"n": value}

                totals = words.updateStateByKey(lambda vs, s: {"n": sum(vs) + (s["n"] if s else 0)},
                                                stateVersion=2, migrate=to_v2 if version == 2 else None)
            totals.checkpoint(0.5)
            kept = self.totals
            totals.foreachRDD(lambda t, rdd: kept.__setitem__(ms(t), sorted(rdd.collect(), key=str)))
            ssc.addStreamingListener(done)
            return ssc
        return create

    def run(self, version: int, start_ms: int, until_ms: int, files: dict[int, str]):
        return Totals.run(self, version, start_ms, until_ms, files)  # type: ignore[arg-type]


def test_a_state_version_migrates_every_older_value_once_and_snapshots_record_it(spark_context, tmp_path):
    app = Versioned(spark_context, tmp_path)
    app.run(1, 0, 500, {500: "a b a"})
    assert app.totals[500] == [("a", 2), ("b", 1)]
    with pytest.raises(CheckpointMismatchError, match=r"written at state version 1, and this program's is 2 with "
                                                      r"no migrate function"):
        app.run(3, 500, 500, {})  # version 2 without migrate: refused at the restart, naming the snapshot
    app.run(2, 500, 1000, {1000: "b"})
    assert app.totals[1000] == [("a", {"n": 2}), ("b", {"n": 2})]  # migrated, then updated by the new code
    data = read_checkpoint(str(app.ckpt)).data
    (chain,) = data["state"].values()
    newest = chain["snapshots"][str(max(int(t) for t in chain["snapshots"]))]
    manifest = json.loads((app.ckpt / (newest["url"] + ".manifest")).read_text())
    assert manifest["state_version"] == 2 and manifest["kind"] == "full"  # a chain never mixes versions
    assert data["identities"][next(iter(data["state"]))]["state_version"] == 2
    with pytest.raises(CheckpointMismatchError, match=r"written at state version 2, newer than this program's \(1\)"):
        app.run(1, 1000, 1000, {})  # a rollback cannot read the later version's state


def _tree(root) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.slow
def test_the_plan_command_says_what_a_deploy_would_do_writing_nothing(spark_context, tmp_path):
    """``sparkwal upgrade plan CHECKPOINT -- PROGRAM ARGS``: the new program's streams built, none
    started; carried, new, migrated, repartitioned and re-run said, exit 0; a loss exit 1."""
    app = Totals(spark_context, tmp_path)
    app.run(1, 0, 500, {500: "a b"})
    before = _tree(app.ckpt)
    program = os.path.join(os.path.dirname(__file__), "upgrade_plan_app.py")

    ok = sparkwal("upgrade", "plan", app.ckpt, "--json", "--", program, app.ckpt, app.indir, "2", expect=0)
    plan = json.loads(ok.stdout)
    assert plan["loses_nothing"] and plan["checkpoint"] == str(app.ckpt)
    lines = "\n".join(plan["lines"])
    assert f"carried: files:{app.indir} (files input; stream 0 -> 0)" in lines
    assert "carried: updateStateByKey(files:" in lines and "migrated from state version 1 to 2" in lines
    assert "new: mapWithState(" in lines
    assert f"repartitioned: updateStateByKey(files:{app.indir}) from 2 to 3 partitions" in lines
    assert plan["rerun_batch_times"] == [] and "started" not in ok.stdout

    lost = sparkwal("upgrade", "plan", app.ckpt, "--", program, app.ckpt, app.indir, "3", expect=1)
    assert f"refused: the checkpoint's state of updateStateByKey updateStateByKey(files:{app.indir}) has no " \
           "stream in this program" in lost.stdout
    assert _tree(app.ckpt) == before  # nothing written, nothing created
    plain = sparkwal("upgrade", "plan", app.ckpt, "--", program, app.ckpt, app.indir, "2", "plain", expect=1)
    assert plain.stderr.strip() == ("sparkwal: the program calls getOrCreate without upgrade=True: a deploy would "
                                    "run the checkpoint's own program, not this one (pass upgrade=True)")

    missing = sparkwal("upgrade", "plan", app.ckpt, "--", tmp_path / "nope.py", expect=2)
    assert missing.stderr.strip() == f"sparkwal: no such program file: {tmp_path / 'nope.py'}"
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('the program needs its config file')\n")
    failed = sparkwal("upgrade", "plan", app.ckpt, "--", broken, expect=1)
    assert failed.stderr.strip() == (f"sparkwal: {broken} ended (status 1) without building a StreamingContext: "
                                     "the program needs its config file")


def test_a_handover_is_asked_of_one_epoch_and_refused_where_no_driver_leads(tmp_path):
    from sparkwal.wal.storage import resolve

    storage, root = resolve(str(tmp_path))
    storage.request_handover(root, 3, 1000)
    assert storage.handover_requested(root, 3) and not storage.handover_requested(root, 4)
    storage.withdraw_handover(root, 4)  # another epoch's leaves it
    assert storage.handover_requested(root, 3)
    storage.withdraw_handover(root, 3)
    assert not storage.handover_requested(root, 3)
    (tmp_path / ".leader.handover").write_text('{"epoch": 3')  # half a request is none
    assert not storage.handover_requested(root, 3)

    nobody = sparkwal("checkpoint", "handover", tmp_path, expect=1)
    assert nobody.stderr.strip() == f"sparkwal: no live driver leads {tmp_path}: there is nothing to hand over"


class Batches:
    """Word totals of a file stream and a direct stream, by ``updateStateByKey`` and by
    ``mapWithState`` (both snapshotted every second), at a batch duration of the version's choosing;
    ``window=True`` adds a window over the words."""

    def __init__(self, sc, tmp_path):
        self.sc, self.indir, self.ckpt, self.log = sc, tmp_path / "in", tmp_path / "ckpt", tmp_path / "log"
        self.indir.mkdir()
        self.log.mkdir()
        (self.log / "p").write_text("")
        self.totals: dict[int, list] = {}
        self.mapped: dict[int, list] = {}

    def setup(self, clock, done, batch_s: float, window: bool = False):
        def create():
            ssc = StreamingContext(self.sc, batch_s, clock=clock)
            ssc.checkpoint(str(self.ckpt))
            lines = ssc.textFileStream(str(self.indir)).union(ssc.directStream(FileLogSource(str(self.log))))
            words = lines.flatMap(str.split).map(lambda w: (w, 1))
            totals = words.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(1.0)
            kept, mapped = self.totals, self.mapped
            totals.foreachRDD(lambda t, rdd: kept.__setitem__(ms(t), sorted(rdd.collect())))

            def count(key, value, state):  # (defined here: the workers cannot import this module)
                state.update((state.get() if state.exists() else 0) + value)

            counted = words.mapWithState(StateSpec.function(count))
            counted.checkpoint(1.0)
            counted.stateSnapshots().foreachRDD(lambda t, rdd: mapped.__setitem__(ms(t), sorted(rdd.collect())))
            if window:
                words.reduceByKeyAndWindow(operator.add, operator.sub, 2.0, 1.0).checkpoint(2.0).foreachRDD(
                    lambda rdd: None)
            ssc.addStreamingListener(done)
            return ssc
        return create

    def run(self, batch_s: float, start_ms: int, times: list[int], files: dict[int, str], graceful: bool):
        clock, done = ManualClock(start_ms), Completed()
        ssc = StreamingContext.getOrCreate(str(self.ckpt), self.setup(clock, done, batch_s), upgrade=True)
        ssc.start()
        for t in times:
            if t in files:
                put_file(self.indir, f"{t}.txt", files[t], t - 100)
                append(self.log / "p", f"d{t % 3}")  # and a line of the direct stream
            clock.advance(t - clock.now_ms())
            done.wait_for(t)
        ssc.stop(stopSparkContext=False, stopGraceFully=graceful)
        return ssc


@pytest.mark.slow
def test_a_batch_duration_change_keeps_every_state_exact_after_a_graceful_stop_and_is_refused_otherwise(
        spark_context, tmp_path):
    """Version 1 at 0.5 s batches, version 2 at 1 s: the new batches follow the last one the old
    version completed, on a grid of their own, with every count and every file seen carried. Refused,
    naming why and what to do: after a stop that left the last batch's state unsnapshotted (its
    interval is 1 s), and for a window (its state holds slices of the old batches)."""
    from collections import Counter

    app = Batches(spark_context, tmp_path)
    files = {500: "a b", 1000: "a", 1500: "b b", 2000: "a", 2500: "c b", 3500: "c", 4500: "c a", 5500: "b"}
    app.run(0.5, 0, [500, 1000, 1500], files, graceful=False)  # its last snapshot: of batch 1000
    with pytest.raises(CheckpointMismatchError, match=r"from 500 ms to 1000 ms.*newest snapshot .* of batch 1000, "
                                                      r"not of the last batch \(1500\).*gracefully"):
        app.run(1.0, 1600, [], files, graceful=False)
    with pytest.raises(CheckpointMismatchError, match=r"500 ms, this program uses 1000 ms, and .*windowed"):
        StreamingContext.getOrCreate(str(app.ckpt), app.setup(ManualClock(1600), Completed(), 1.0, window=True),
                                     upgrade=True)
    app.run(0.5, 1600, [2000, 2500], files, graceful=True)  # 2500: between two intervals, snapshotted
    ssc = app.run(1.0, 2600, [3500, 4500], files, graceful=True)
    assert ssc.rerun_batch_times == [] and read_checkpoint(str(app.ckpt)).data["batch_ms"] == 1000
    app.run(1.0, 4600, [5500], files, graceful=False)  # a restart on the new grid: the old grid's offsets stay
    assert sorted(app.totals) == [500, 1000, 1500, 2000, 2500, 3500, 4500, 5500]
    expected: Counter = Counter()
    for t in sorted(app.totals):
        expected.update([*files[t].split(), f"d{t % 3}"])
        assert app.totals[t] == sorted(expected.items()), f"totals at {t}"
        assert app.mapped[t] == sorted(expected.items()), f"mapWithState at {t}"
