"""Long-lived storage credentials given in ``storage_options`` stay in the driver: no task's
closure carries them, and no checkpoint file holds them (the executors, and a driver recovering a
stream from its checkpoint, take credentials from their environment: conftest sets moto's)."""

from __future__ import annotations

import json
import pathlib
import time
import uuid

import pytest
from pyspark import serializers
from test_engine_recovery import Completed
from test_receivers import BlockStorer, wait_until

from sparkwal import StreamingContext
from sparkwal.engine.sources import FileLogSource
from sparkwal.wal import ManualClock

CANARY = f"canary{uuid.uuid4().hex[:10]}"


def everything_pickled(monkeypatch) -> list[bytes]:
    """Every closure and every record the driver pickles for Spark from now on."""
    pickled: list[bytes] = []
    for cls in {serializers.CloudPickleSerializer, serializers.CPickleSerializer}:
        def dumps(self, obj, _dumps=cls.dumps):
            data = _dumps(self, obj)
            pickled.append(bytes(data))
            return data
        monkeypatch.setattr(cls, "dumps", dumps)
    return pickled


@pytest.mark.s3
@pytest.mark.slow
def test_credentials_in_storage_options_reach_no_task_and_no_checkpoint(spark_context, s3_endpoint, tmp_path,
                                                                          monkeypatch):
    import boto3
    import s3fs

    bucket = f"s3://sparkwal-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket[5:])
    options = {"key": f"{CANARY}-key", "secret": f"{CANARY}-secret", "use_listings_cache": False,
               "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    fs = s3fs.S3FileSystem(**options)
    fs.pipe(f"{bucket}/log/p0", b"l0\nl1\n")
    pickled = everything_pickled(monkeypatch)
    acks = tmp_path / "acks"
    out = tmp_path / "totals"  # a recovered program's closures write into copies of what they held: files
    out.mkdir()

    def totals(t: int) -> dict:
        return json.loads((out / str(t)).read_text())

    def create(clock, done):
        def make():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.checkpoint(f"{bucket}/ckpt", storage_options=options)
            words = ssc.receiverStream(BlockStorer(str(acks))).union(
                ssc.textFileStream(f"{bucket}/in", storage_options=options)).union(
                ssc.directStream(FileLogSource(f"{bucket}/log", options)))
            counts = words.map(lambda w: (w, 1)).updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(1.0)
            where = str(out)
            counts.foreachRDD(lambda t, rdd: pathlib.Path(where, str(int(t.timestamp() * 1000))).write_text(
                json.dumps(dict(rdd.collect()))))
            ssc.addStreamingListener(done)
            return ssc
        return make

    start = int(time.time() * 1000) // 500 * 500
    clock, done = ManualClock(start), Completed()
    ssc = StreamingContext.getOrCreate(f"{bucket}/ckpt", create(clock, done), storage_options=options)
    ssc.start()
    try:
        wait_until(lambda: acks.exists() and len(acks.read_text().split()) == 5, what="5 blocks in the receiver WAL")
        fs.pipe(f"{bucket}/in/a.txt", b"x\ny\nz\n")
        fs.pipe(f"{bucket}/log/p0", b"l0\nl1\nl2\n")
        # the store stamps the file on the wall clock, which ran on while the receiver started: the
        # manual clock's batches go on past that stamp (at least 6: snapshots written, and a full one
        # read back, by tasks at 1 s)
        stamped = int(fs.info(f"{bucket}/in/a.txt")["LastModified"].timestamp() * 1000)
        last = start + 1000 * max(3, -(-(stamped - start) // 1000) + 1)
        for t in range(start + 500, last + 1, 500):
            clock.advance(500)
            done.wait_for(t)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    expected = dict.fromkeys([f"b{i}-{j}" for i in range(5) for j in range(10)] + ["x", "y", "z", "l0", "l1", "l2"], 1)
    assert totals(last) == expected

    # recovered from the checkpoint, whose streams hold no credentials: the driver's environment's
    clock2, done2 = ManualClock(last), Completed()
    ssc2 = StreamingContext.getOrCreate(f"{bucket}/ckpt", create(clock2, done2), storage_options=options,
                                        clock=clock2)
    ssc2.addStreamingListener(done2)
    ssc2.start()
    try:
        fs.pipe(f"{bucket}/log/p0", b"l0\nl1\nl2\nl3\n")
        clock2.advance(500)
        done2.wait_for(last + 500)
    finally:
        ssc2.stop(stopSparkContext=False)
    assert totals(last + 500) == expected | {"l3": 1}

    leaked = sum(CANARY.encode() in p for p in pickled)
    assert pickled and leaked == 0, f"{leaked} of {len(pickled)} pickled closures or records hold the credentials"
    holding = [f for f in fs.find(bucket) if CANARY.encode() in fs.cat_file(f)]
    assert not holding, f"checkpoint files holding the credentials: {holding}"
