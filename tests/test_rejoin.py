"""A fenced leader of ``getOrCreate(..., standby=True)`` rejoins (engine/rejoin.py): its wait goes on
with a new driver made as getOrCreate made the first, the program's listeners and the state carried;
a leader that gave its leadership up because its stream stalled does not, and ends with the fence.
The same under SIGSTOP on S3, with a second driver taking over: tests/test_standby.py."""

from __future__ import annotations

import pytest
from test_engine_recovery import Completed, ms, put_file

from sparkwal.engine import StreamingContext
from sparkwal.engine.driver import leadership
from sparkwal.wal import FencedError, ManualClock


def test_a_fenced_leader_started_as_a_standby_candidate_rejoins_and_a_stalled_one_ends(spark_context, tmp_path):
    clock, done, totals = ManualClock(0), Completed(), {}
    indir, ckpt = tmp_path / "in", str(tmp_path / "ckpt")
    indir.mkdir()

    def setup():
        ssc = StreamingContext(spark_context, 0.5, clock=clock)
        ssc.checkpoint(ckpt)
        counts = ssc.textFileStream(str(indir)).map(lambda w: (w, 1)).updateStateByKey(lambda vs, s: sum(vs) + (s or 0))
        counts.checkpoint(0.5)
        counts.foreachRDD(lambda t, rdd: totals.__setitem__(ms(t), sorted(rdd.collect())))
        return ssc

    ssc = StreamingContext.getOrCreate(ckpt, setup, upgrade=True, standby=True, clock=clock)  # (setup runs again)
    ssc.addStreamingListener(done)
    ssc.start()
    put_file(indir, "500.txt", "a", 400)
    clock.advance(500)
    done.wait_for(500)
    first = ssc.driver
    first.on_fenced(FencedError(f"{ckpt}: leadership epoch 1 is over"))  # as a lapsed lease does
    assert ssc.awaitTerminationOrTimeout(0.2) is False  # rejoined: not stopped
    assert ssc.driver is not first and first.stopping and ssc.driver.leader_epoch == 2
    assert not ssc.isStandby()  # no other driver leads the directory: the new driver leads it
    put_file(indir, "1000.txt", "a\nb", 900)
    clock.advance(500)
    done.wait_for(1000)  # the program's listener, carried to the new driver
    assert totals[1000] == [("a", 2), ("b", 1)]  # the state, from the checkpoint

    second = ssc.driver
    second.on_fenced(leadership.LeaderStalledError(f"{ckpt}: no batch completed for 3 intervals"))
    with pytest.raises(leadership.LeaderStalledError, match="no batch completed"):
        ssc.awaitTerminationOrTimeout(5)
    assert ssc.driver is second
    ssc.stop(stopSparkContext=False)
