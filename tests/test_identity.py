"""What a stream is across versions of a program (``DStream.uid`` and the identities an upgrade
matches a checkpoint's inputs and states by: sparkwal.engine.identity). Graphs only: no batch runs."""

from __future__ import annotations

import pytest

from sparkwal.engine import Receiver, StateSpec, StreamingContext
from sparkwal.engine.identity import identities
from sparkwal.engine.sources.filelog import FileLogSource
from sparkwal.wal import ManualClock


class Ticks(Receiver):
    def onStart(self) -> None:
        pass

    def onStop(self) -> None:
        pass


@pytest.fixture
def ssc(spark_context):
    context = StreamingContext(spark_context, 1, clock=ManualClock(0))
    yield context
    context.stop(stopSparkContext=False)


def _add(values, state):
    return sum(values) + (state or 0)


def named(ssc) -> list[str]:
    return sorted(identities(ssc.driver.graph).by_index.values())


def test_inputs_are_known_by_their_sources_and_stateless_steps_by_nothing(ssc, tmp_path):
    ssc.textFileStream("/data/in").map(str.upper).pprint()
    ssc.binaryRecordsStream("/data/bin", 8).count().pprint()
    ssc.directStream(FileLogSource(str(tmp_path / "log"))).pprint()
    ssc.socketTextStream("127.0.0.1", 9999).pprint()
    ssc.receiverStream(Ticks()).pprint()
    ssc.queueStream([]).pprint()
    assert named(ssc) == ["direct:FileLogSource(%s)" % (tmp_path / "log"), "files:/data/bin#records=8",
                          "files:/data/in", "queue", "receiver:SocketReceiver(127.0.0.1:9999)", "receiver:Ticks"]
    assert identities(ssc.driver.graph).ambiguous == ()


def test_a_state_keeps_its_identity_when_steps_are_added_before_it(spark_context):
    """Version 2 filters before the state and adds a second output: the state's index moves, its
    identity does not."""
    def state_of(version: int) -> tuple[int, str]:
        ssc = StreamingContext(spark_context, 1, clock=ManualClock(0))
        try:
            words = ssc.textFileStream("/data/in").flatMap(str.split)
            if version == 2:
                words = words.filter(lambda w: w != "the")
                words.count().pprint()
            words.map(lambda w: (w, 1)).updateStateByKey(_add).pprint()
            found = identities(ssc.driver.graph).by_index
            return next((i, key) for i, key in found.items() if key.startswith("updateStateByKey"))
        finally:
            ssc.stop(stopSparkContext=False)

    (index1, key1), (index2, key2) = state_of(1), state_of(2)
    assert key1 == key2 == "updateStateByKey(files:/data/in)" and index1 != index2


def test_a_state_reads_through_stateless_steps_to_every_input_and_state_it_is_made_from(ssc):
    a = ssc.textFileStream("/a").map(lambda w: (w, 1))
    b = ssc.textFileStream("/b").map(lambda w: (w, 1))
    totals = a.union(b).updateStateByKey(_add)
    totals.map(lambda kv: kv).mapWithState(StateSpec.function(lambda k, v, s: v)).pprint()
    assert named(ssc) == ["files:/a", "files:/b", "mapWithState(updateStateByKey(files:/a+files:/b))",
                          "updateStateByKey(files:/a+files:/b)"]


def test_uids_name_inputs_and_states_and_only_the_programs_order_tells_unnamed_twins_apart(ssc):
    pairs = ssc.textFileStream("/in").map(lambda w: (w, 1))
    pairs.updateStateByKey(_add).pprint()
    pairs.updateStateByKey(_add).pprint()  # a twin: the same kind on the same input
    ssc.receiverStream(Ticks()).pprint()
    ssc.receiverStream(Ticks()).uid("ticks-eu").pprint()
    mapped = pairs.mapWithState(StateSpec.function(lambda k, v, s: v))
    assert mapped.uid("running") is mapped  # returns the stream, names the state behind it
    mapped.pprint()
    found = identities(ssc.driver.graph)
    assert sorted(found.by_index.values()) == [
        "files:/in", "receiver:Ticks", "uid:running", "uid:ticks-eu",
        "updateStateByKey(files:/in)", "updateStateByKey(files:/in)#2"]
    assert sorted(found.ambiguous) == ["updateStateByKey(files:/in)", "updateStateByKey(files:/in)#2"]


def test_a_uid_is_unique_in_its_context_and_a_plain_name(ssc):
    lines = ssc.textFileStream("/in").uid("lines")
    with pytest.raises(ValueError, match=r"uid 'lines' already names the stream made by textFileStream at "
                                         r"test_identity\.py:\d+"):
        ssc.textFileStream("/other").uid("lines")
    assert lines.uid("lines") is lines  # naming a stream again is no clash
    for bad in ("", "  ", " lines", "a#b", "x" * 201, 7, None):
        with pytest.raises(ValueError, match="a stream's uid"):
            lines.uid(bad)
