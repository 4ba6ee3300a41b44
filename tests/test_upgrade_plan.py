"""What an upgrade would carry from a checkpoint to a changed program (engine/upgrade_plan.py): two
versions of a program as graphs, the first's identities as its checkpoint records them. No batch runs."""

from __future__ import annotations

import pytest

from sparkwal.engine import StateSpec, StreamingContext
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
        "updateStateByKey(files:/in) reads from other streams than the checkpoint's updateStateByKey(files:/in) did "
        "(their own verdicts above): its state was made of theirs",
        "the checkpoint's direct input uid:k1 has no stream in this program: it would be lost"]
    assert sorted(s.name for s in plan.new) == ["files:/in", "uid:k2"]


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


@pytest.mark.parametrize("records, why", [
    ({"3": {"kind": "files"}}, "identity, kind or ambiguous missing"),
    ({"3": "files:/in"}, "written before identities had fields"),
    ({"³": {"identity": "files:/in", "kind": "files", "ambiguous": False}}, "its key is not a stream index"),
    ({"0": {"identity": "files:/in", "kind": "files", "ambiguous": False, "uid": ["x"]}}, "its uid"),
    ({"0": {"identity": "files:/in", "kind": "files", "ambiguous": False, "input_id": "0"}}, "input_id, window_ms"),
    ({"0": {"identity": "updateStateByKey(x)", "kind": "queue", "ambiguous": False}}, "its kind is not"),
])
def test_a_malformed_record_is_named(records, why):
    with pytest.raises(ValueError, match=rf"the checkpoint's identity entry '.*' is malformed \({why}"):
        plan_upgrade(records, {})


def test_one_uid_on_two_of_the_checkpoints_streams_is_refused():
    twice = {str(i): {"identity": f"files:/{i}", "kind": "files", "ambiguous": False, "uid": "same", "input_id": i}
             for i in (0, 1)}
    with pytest.raises(ValueError, match="the checkpoint's identities name one stream twice"):
        plan_upgrade(twice, {})
