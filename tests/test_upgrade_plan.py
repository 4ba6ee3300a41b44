"""What an upgrade would carry from a checkpoint to a changed program (engine/upgrade_plan.py): two
versions of a program as graphs, the first's identities as its checkpoint records them. No batch runs."""

from __future__ import annotations

import pytest

from sparkwal.engine import Receiver, StateSpec, StreamingContext
from sparkwal.engine.identity import identities
from sparkwal.engine.kafka import KafkaSource
from sparkwal.engine.sources.filelog import FileLogSource
from sparkwal.engine.upgrade_plan import plan_upgrade
from sparkwal.wal import ManualClock


def _add(values, state):
    return sum(values) + (state or 0)


def _mapped(key, value, state):
    return value


def graph_of(sc, build) -> dict:
    ssc = StreamingContext(sc, 1, clock=ManualClock(0))
    try:
        build(ssc)
        return identities(ssc.driver.graph)
    finally:
        ssc.stop(stopSparkContext=False)


def recorded(sc, build) -> dict:
    """The identities a checkpoint of this program records."""
    return {str(i): ident.record() for i, ident in graph_of(sc, build).items()}


def counts(ssc, *, filtered=False, uid=None):
    pairs = ssc.textFileStream("/in").flatMap(str.split)
    if filtered:
        pairs = pairs.filter(lambda w: w != "the")
    totals = pairs.map(lambda w: (w, 1)).updateStateByKey(_add)
    if uid:
        totals.uid(uid)
    totals.pprint()
    return pairs


def test_added_steps_outputs_and_a_new_state_carry_the_input_and_the_state(spark_context):
    def v2(ssc):
        pairs = counts(ssc, filtered=True)
        pairs.count().pprint()
        pairs.map(lambda w: (w, 1)).mapWithState(StateSpec.function(_mapped)).pprint()
        ssc.textFileStream("/more").pprint()

    plan = plan_upgrade(recorded(spark_context, counts), graph_of(spark_context, v2))
    assert plan.loses_nothing
    assert [(a.identity, b.identity) for a, b in plan.carried] == [
        ("files:/in", "files:/in"), ("updateStateByKey(files:/in)", "updateStateByKey(files:/in)")]
    assert [line.split(" (")[0] for line in plan.lines()] == [
        "carried: files:/in", "carried: updateStateByKey(files:/in)", "new: mapWithState(files:/in)",
        "new: files:/more"]
    assert "new: files:/more (starts as the program says)" in plan.lines()
    assert "new: mapWithState(files:/in) (starts empty)" in plan.lines()
    assert plan.to_json()["loses_nothing"] is True


def test_a_state_left_out_is_a_loss_unless_the_program_drops_it_by_name(spark_context):
    def v2(ssc):
        ssc.textFileStream("/in").pprint()
        ssc.queueStream([]).pprint()

    def v1(ssc):
        counts(ssc, uid="totals")
        ssc.queueStream([]).pprint()
        ssc.queueStream([]).pprint()  # queues hold nothing: dropped freely

    old, new = recorded(spark_context, v1), graph_of(spark_context, v2)
    plan = plan_upgrade(old, new)
    assert plan.refusals == ["the checkpoint's state of updateStateByKey uid:totals has no stream in this program: "
                             "it would be lost"]
    assert [s.identity for s in plan.dropped] == ["queue#2"]
    for name in ("totals", "updateStateByKey(files:/in)"):  # its uid or its identity
        dropping = plan_upgrade(old, new, allow_drop=frozenset({name}))
        assert dropping.loses_nothing and [s.name for s in dropping.dropped] == ["uid:totals", "queue#2"]


def test_a_uid_matches_across_spelling_but_not_across_kinds_or_windows(spark_context):
    def v1(ssc):
        pairs = ssc.textFileStream("/in").uid("lines").map(lambda w: (w, 1))
        pairs.updateStateByKey(_add).uid("totals").pprint()
        pairs.reduceByKeyAndWindow(lambda a, b: a + b, lambda a, b: a - b, 4, 2).uid("recent").pprint()

    def v2(ssc):
        pairs = ssc.textFileStream("/data/moved").uid("lines").map(lambda w: (w, 1))  # moved: the uid holds
        pairs.mapWithState(StateSpec.function(_mapped)).uid("totals").pprint()
        pairs.reduceByKeyAndWindow(lambda a, b: a + b, lambda a, b: a - b, 6, 2).uid("recent").pprint()

    plan = plan_upgrade(recorded(spark_context, v1), graph_of(spark_context, v2))
    assert [(a.identity, b.identity) for a, b in plan.carried] == [("files:/in", "files:/data/moved")]
    assert plan.refusals == [
        "uid:totals was a state of updateStateByKey (updateStateByKey(files:/in)), is now a state of mapWithState "
        "(mapWithState(files:/data/moved)): its checkpointed data means something else",
        "uid:recent keeps the reductions of a 4000 ms window sliding by 2000 ms; a 6000 ms window sliding by "
        "2000 ms would count batches it never added"]


def test_twins_told_apart_only_by_order_are_not_guessed_and_uids_settle_them(spark_context):
    def twins(*names):
        def build(ssc):
            pairs = ssc.textFileStream("/in").map(lambda w: (w, 1))
            for name in names:
                state = pairs.updateStateByKey(_add)
                if name:
                    state.uid(name)
                state.pprint()
        return build

    guessed = plan_upgrade(recorded(spark_context, twins(None, None)), graph_of(spark_context, twins("a", "b")))
    assert guessed.refusals == [
        "updateStateByKey(files:/in) is told apart from a stream like it only by the program's order (the "
        "checkpoint's is stream 2): give both versions a uid for it",
        "updateStateByKey(files:/in)#2 is told apart from a stream like it only by the program's order (the "
        "checkpoint's is stream 4): give both versions a uid for it"]
    settled = plan_upgrade(recorded(spark_context, twins("a", "b")), graph_of(spark_context, twins("b", "a")))
    assert settled.loses_nothing and sorted((a.index, b.index) for a, b in settled.carried if a.uid) == [(2, 4), (4, 2)]


def test_a_renamed_uid_starts_anew_and_a_state_follows_only_its_own_sources(spark_context):
    """Two different uids never pair (a Kafka stream renamed to start a new cluster's offsets); a
    state whose named input now reads elsewhere is not the state of the stream that took its place."""
    def v1(ssc):
        ssc.textFileStream("/in").uid("lines").map(lambda w: (w, 1)).updateStateByKey(_add).pprint()
        ssc.directStream(KafkaSource(["clicks"], {"bootstrap.servers": "127.0.0.1:1"})).uid("k1").pprint()

    def v2(ssc):
        ssc.textFileStream("/data/moved").uid("lines").pprint()
        ssc.textFileStream("/in").map(lambda w: (w, 1)).updateStateByKey(_add).pprint()  # another feed on /in
        ssc.directStream(KafkaSource(["clicks"], {"bootstrap.servers": "127.0.0.1:2"})).uid("k2").pprint()

    plan = plan_upgrade(recorded(spark_context, v1), graph_of(spark_context, v2))
    assert [(a.name, b.name) for a, b in plan.carried] == [("uid:lines", "uid:lines")]
    assert plan.refusals == [
        "the checkpoint's state of updateStateByKey updateStateByKey(files:/in) has no stream in this program: it "
        "would be lost",
        "the checkpoint's direct input uid:k1 has no stream in this program: it would be lost"]
    assert sorted(s.name for s in plan.new) == ["files:/in", "uid:k2", "updateStateByKey(files:/in)"]


def test_a_window_upstream_or_another_source_kind_under_a_uid_is_refused(spark_context, tmp_path):
    def version(windowed: bool, kafka: bool):
        def build(ssc):
            pairs = ssc.textFileStream("/in").map(lambda w: (w, 1))
            if windowed:
                pairs = pairs.window(4, 2)
            pairs.reduceByKeyAndWindow(lambda a, b: a + b, lambda a, b: a - b, 10, 2).pprint()
            source = (KafkaSource(["log"], {"bootstrap.servers": "127.0.0.1:1"}) if kafka
                      else FileLogSource(str(tmp_path / "log")))
            ssc.directStream(source).uid("log").pprint()
        return build

    plan = plan_upgrade(recorded(spark_context, version(False, True)), graph_of(spark_context, version(True, False)))
    assert plan.refusals == [
        "reduceByKeyAndWindow(files:/in) reads its sources through other windows or slides (slide 2000, window "
        "4000/2000) than the checkpoint's (slide 1000): its state was made of those",
        f"uid:log was a direct input (direct:Kafka(log)), is now a direct input (direct:FileLogSource({tmp_path}/log)):"
        " its checkpointed data means something else"]


FULL = {"identity": "files:/0", "kind": "files", "ambiguous": False, "uid": None, "input_id": 0, "window_ms": None,
        "slide_ms": None, "sources": [], "upstream": [], "source_kind": "files"}


@pytest.mark.parametrize("records, why", [
    ({"3": {"kind": "files"}}, "identity, kind or ambiguous missing"),
    ({"3": "files:/in"}, "written before identities had fields"),
    ({"³": {"identity": "files:/in", "kind": "files", "ambiguous": False}}, "its key is not a stream index"),
    ({"0": {**FULL, "uid": ["x"]}}, "its uid"),
    ({"0": {**FULL, "input_id": "0"}}, "input_id, window_ms"),
    ({"0": {**FULL, "identity": "updateStateByKey(x)", "kind": "queue"}}, "its kind is not"),
    ({"0": {**FULL, "sources": [None]}}, "input_id, window_ms, slide_ms, sources"),
    ({"0": {k: v for k, v in FULL.items() if k != "source_kind"}}, "input_id, window_ms, slide_ms, sources"),
])
def test_a_malformed_record_is_named(records, why):
    with pytest.raises(ValueError, match=rf"the checkpoint's identity entry '.*' is malformed \({why}"):
        plan_upgrade(records, {})


@pytest.mark.parametrize("second", [{"identity": "files:/1", "uid": "same"}, {"identity": "files:/0", "uid": None}])
def test_one_uid_or_identity_on_two_of_the_checkpoints_streams_is_refused(second):
    twice = {"0": {**FULL, "uid": "same"}, "1": {**FULL, "input_id": 1, **second}}
    with pytest.raises(ValueError, match="the checkpoint's identities name one stream twice"):
        plan_upgrade(twice, {})


class Ticks(Receiver):
    def onStart(self) -> None:
        pass

    def onStop(self) -> None:
        pass


def test_named_twins_go_by_their_uids_whatever_their_order(spark_context):
    """The remedy the plan asks for: twin receivers (known by their class) and their states named."""
    def version(order):
        def build(ssc):
            for name in order:
                ssc.receiverStream(Ticks()).uid(name).map(lambda w: (w, 1)).updateStateByKey(_add).pprint()
        return build

    plan = plan_upgrade(recorded(spark_context, version("ab")), graph_of(spark_context, version("ba")))
    assert plan.refusals == []
    assert sorted((a.name, b.name, a.index != b.index) for a, b in plan.carried if a.is_input) == [
        ("uid:a", "uid:a", True), ("uid:b", "uid:b", True)]
    assert len(plan.carried) == 4  # and each state with its own input


def test_text_files_become_records_under_a_uid_are_refused_and_no_directory_reads_as_records(spark_context):
    def text(ssc):
        ssc.textFileStream("/d#records=8").uid("in").pprint()

    def records(ssc):
        ssc.binaryRecordsStream("/d", 8).uid("in").pprint()

    def records_unnamed(ssc):
        ssc.binaryRecordsStream("/d", 8).pprint()

    def text_unnamed(ssc):
        ssc.textFileStream("/d#records=8").pprint()

    plan = plan_upgrade(recorded(spark_context, text), graph_of(spark_context, records))
    assert plan.refusals == ["uid:in was a files input (files:/d%23records=8), is now a files input "
                             "(files:/d#records=8): its checkpointed data means something else"]
    unnamed = plan_upgrade(recorded(spark_context, text_unnamed), graph_of(spark_context, records_unnamed))
    assert unnamed.carried == [] and len(unnamed.refusals) == 1  # lost, not carried as records


class Broken(FileLogSource):
    @property
    def identity(self):
        raise RuntimeError("no catalog yet")


def test_a_source_whose_identity_fails_is_known_by_its_description_and_a_new_window_by_its_parent(
        spark_context, tmp_path, caplog):
    def build(ssc):
        pairs = ssc.directStream(Broken(str(tmp_path / "log"))).map(lambda r: (r, 1))
        pairs.reduceByKeyAndWindow(lambda a, b: a + b, lambda a, b: a - b, 4, 2).pprint()

    with caplog.at_level("WARNING", logger="sparkwal.engine.identity"):
        program = graph_of(spark_context, build)
    assert f"direct:FileLogSource({tmp_path}/log)" in {i.identity for i in program.values()}
    assert any("Broken.identity() failed (no catalog yet)" in r.getMessage() for r in caplog.records)
    assert "new: reduceByKeyAndWindow(direct:FileLogSource(%s/log)) (starts from its parent's batches)" % tmp_path \
        in plan_upgrade({}, program).lines()
