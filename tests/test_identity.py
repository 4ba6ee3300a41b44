"""What a stream is across versions of a program (``DStream.uid`` and the identities an upgrade
matches a checkpoint's inputs and states by: sparkwal.engine.identity). Graphs only: no batch runs."""

from __future__ import annotations

import logging

import pytest

from sparkwal.engine import Receiver, StateSpec, StreamingContext, StreamingContextStateError
from sparkwal.engine.identity import identities
from sparkwal.engine.kafka import KafkaSource
from sparkwal.engine.sources.filelog import FileLogSource
from sparkwal.wal import ManualClock


class Ticks(Receiver):
    def onStart(self) -> None:
        pass

    def onStop(self) -> None:
        pass


class Says(Ticks):
    def __init__(self, said):
        super().__init__()
        self.said = said

    def sourceIdentity(self):
        if isinstance(self.said, Exception):
            raise self.said
        return self.said


@pytest.fixture
def ssc(spark_context):
    context = StreamingContext(spark_context, 1, clock=ManualClock(0))
    yield context
    context.stop(stopSparkContext=False)


def _add(values, state):
    return sum(values) + (state or 0)


def found(ssc) -> dict[str, tuple]:
    """identity -> (uid, ambiguous)"""
    return {i.identity: (i.uid, i.ambiguous) for i in identities(ssc.driver.graph).values()}


def test_inputs_are_known_by_their_sources_in_one_spelling(ssc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ssc.textFileStream("in/").map(str.upper).pprint()  # relative, with a slash: one spelling
    ssc.textFileStream("file:///data/other/").pprint()
    ssc.binaryRecordsStream("memory://bucket/bin/", 8).count().pprint()
    ssc.directStream(FileLogSource("log/")).pprint()
    ssc.directStream(KafkaSource(["views", "clicks"], {"bootstrap.servers": "127.0.0.1:1"})).pprint()
    ssc.socketTextStream("127.0.0.1", 9999).pprint()
    ssc.receiverStream(Ticks()).pprint()
    ssc.queueStream([]).pprint()
    ssc.textFileStream("/never/output")  # no output reaches it: it keeps nothing
    assert sorted(found(ssc)) == sorted([
        f"files:{tmp_path / 'in'}", "files:/data/other", "files:memory://bucket/bin#records=8",
        f"direct:FileLogSource({tmp_path / 'log'})", "direct:Kafka(clicks,views)",
        "receiver:SocketReceiver(127.0.0.1:9999)", "receiver:Ticks", "queue"])
    assert not any(ambiguous for _, ambiguous in found(ssc).values())


def test_a_state_keeps_its_identity_when_steps_are_added_before_it_or_it_is_named_later(spark_context):
    """Version 2 filters before the state, adds a second output and names the input: the state's
    index moves, its identity does not."""
    def state_of(version: int):
        ssc = StreamingContext(spark_context, 1, clock=ManualClock(0))
        try:
            words = ssc.textFileStream("/data/in").flatMap(str.split)
            if version == 2:
                words.uid("words")  # a stateless step: names the input it reads
                words = words.filter(lambda w: w != "the")
                words.count().pprint()
            words.map(lambda w: (w, 1)).updateStateByKey(_add).pprint()
            return {i.kind: i for i in identities(ssc.driver.graph).values()}
        finally:
            ssc.stop(stopSparkContext=False)

    v1, v2 = state_of(1), state_of(2)
    assert v1["updateStateByKey"].identity == v2["updateStateByKey"].identity == "updateStateByKey(files:/data/in)"
    assert v1["updateStateByKey"].index != v2["updateStateByKey"].index
    assert (v1["files"].identity, v1["files"].uid, v2["files"].identity, v2["files"].uid) == (
        "files:/data/in", None, "files:/data/in", "words")
    assert v2["files"].input_id == 0 and v2["files"].name == "uid:words"


def test_a_state_reads_through_stateless_steps_to_every_input_and_state_it_is_made_from(ssc):
    a = ssc.textFileStream("/a").map(lambda w: (w, 1))
    b = ssc.textFileStream("/b").map(lambda w: (w, 1))
    totals = a.union(b).updateStateByKey(_add)
    totals.map(lambda kv: kv).mapWithState(StateSpec.function(lambda k, v, s: v)).pprint()
    a.reduceByKeyAndWindow(lambda x, y: x + y, lambda x, y: x - y, 4, 2).pprint()
    ids = {i.identity: i for i in identities(ssc.driver.graph).values()}
    assert sorted(ids) == ["files:/a", "files:/b", "mapWithState(updateStateByKey(files:/a+files:/b))",
                           "reduceByKeyAndWindow(files:/a)", "updateStateByKey(files:/a+files:/b)"]
    window = ids["reduceByKeyAndWindow(files:/a)"]
    assert (window.window_ms, window.slide_ms) == (4000, 2000)  # recorded beside the identity


def test_unnamed_twins_are_told_apart_by_order_and_ambiguous_down_to_their_states(ssc):
    pairs = ssc.textFileStream("/in").map(lambda w: (w, 1))
    pairs.updateStateByKey(_add).pprint()
    pairs.updateStateByKey(_add).uid("second").pprint()  # named, but its identity is still a twin's
    ssc.receiverStream(Ticks()).map(lambda w: (w, 1)).updateStateByKey(_add).pprint()
    ssc.receiverStream(Ticks()).pprint()
    ssc.queueStream([]).pprint()
    ssc.queueStream([]).pprint()
    assert found(ssc) == {
        "files:/in": (None, False),
        "updateStateByKey(files:/in)": (None, True), "updateStateByKey(files:/in)#2": ("second", True),
        "receiver:Ticks": (None, True), "receiver:Ticks#2": (None, True),
        "updateStateByKey(receiver:Ticks)": (None, True),  # reordering the receivers swaps its input
        "queue": (None, False), "queue#2": (None, False)}  # queues keep nothing across a restart


def test_a_uid_names_one_input_or_state_once_before_the_start(ssc):
    lines = ssc.textFileStream("/in").uid("lines")
    with pytest.raises(ValueError, match=r"uid 'lines' already names the stream made by textFileStream at "
                                         r"test_identity\.py:\d+"):
        ssc.textFileStream("/other").uid("lines")
    assert lines.uid("lines") is lines  # naming a stream again is no clash
    mapped = lines.map(lambda w: (w, 1)).mapWithState(StateSpec.function(lambda k, v, s: v))
    assert mapped.uid("running") is mapped  # names the state behind it
    both = lines.union(ssc.textFileStream("/more"))
    with pytest.raises(ValueError, match=r"uid 'both' names an input or a stateful operator, and the stream made "
                                         r"by union at test_identity\.py:\d+ reads from 2 of them"):
        both.uid("both")
    for bad in ("", "  ", " lines", "a#b", "a+b", "f(x)", "x" * 201, 7, None):
        with pytest.raises(ValueError, match="a stream's uid"):
            lines.uid(bad)
    mapped.pprint()
    assert {i.name for i in identities(ssc.driver.graph).values()} == {"uid:lines", "uid:running"}
    ssc.start()
    with pytest.raises(StreamingContextStateError, match="naming a stream after its context started"):
        lines.uid("later")


def test_a_receiver_that_says_nothing_usable_is_known_by_its_class(ssc, caplog):
    for said in ("mqtt://broker/topic", RuntimeError("no broker yet"), "two\nlines", 42):
        ssc.receiverStream(Says(said)).pprint()
    with caplog.at_level(logging.WARNING, logger="sparkwal.engine.identity"):
        names = sorted(found(ssc))
    assert names == ["receiver:Says", "receiver:Says#2", "receiver:Says#3", "receiver:mqtt://broker/topic"]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "Says.sourceIdentity() failed (no broker yet)", "Says.sourceIdentity() returned 'two\\nlines', not a one-line "
        "name of at most 200 characters without '#'", "Says.sourceIdentity() returned 42, not a one-line name of "
        "at most 200 characters without '#'"]
