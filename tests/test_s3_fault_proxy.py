"""The S3 fault proxy (engine/apps/fault_proxy.py) in front of moto: it forwards, injects each fault
as promised (an ambiguous reset leaves the write done), repeats its faults for a seed, logs every
request. The storage-fault tests build on it."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError
from sparkwal.engine.apps.fault_proxy import FaultProxy

pytestmark = pytest.mark.s3

RESETS = (ConnectionClosedError, EndpointConnectionError, ConnectionError)


def client(endpoint: str):
    """A client that tries once: the proxy's faults reach the test instead of botocore's retries."""
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1", config=Config(retries={"total_max_attempts": 1}))


@pytest.fixture
def bucket(s3_endpoint):
    name = f"proxy-{uuid.uuid4().hex[:10]}"
    client(s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def proxy(s3_endpoint):
    p = FaultProxy(s3_endpoint, seed=7, delay_s=0.3)
    yield p
    p.stop()


def test_it_forwards_untouched_and_logs_every_request(proxy, bucket):
    s3 = client(proxy.url)
    s3.put_object(Bucket=bucket, Key="a", Body=b"hello")
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"hello"
    assert s3.head_object(Bucket=bucket, Key="a")["ContentLength"] == 5
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["a"]
    s3.delete_object(Bucket=bucket, Key="a")
    assert [(r.method, r.fault, r.status) for r in proxy.log] == [
        ("PUT", None, 200), ("GET", None, 200), ("HEAD", None, 200), ("GET", None, 200), ("DELETE", None, 204)]
    assert proxy.counts() == {"PUT": 1, "GET": 1, "HEAD": 1, "LIST": 1, "DELETE": 1}


def test_each_fault_does_what_it_says(proxy, bucket, s3_endpoint):
    s3, direct = client(proxy.url), client(s3_endpoint)
    proxy.plan("PUT", "/slow", "503")
    with pytest.raises(ClientError, match="SlowDown"):
        s3.put_object(Bucket=bucket, Key="slow", Body=b"x")
    proxy.plan("GET", "/", "500")
    with pytest.raises(ClientError, match="InternalError"):
        s3.list_objects_v2(Bucket=bucket)

    proxy.plan("PUT", "/before", "reset_before")
    with pytest.raises(RESETS):
        s3.put_object(Bucket=bucket, Key="before", Body=b"x")
    proxy.plan("PUT", "/after", "reset_after")
    with pytest.raises(RESETS):
        s3.put_object(Bucket=bucket, Key="after", Body=b"written")
    keys = {o["Key"] for o in direct.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert keys == {"after"}  # reset after forwarding: the write happened, the client cannot tell
    assert direct.get_object(Bucket=bucket, Key="after")["Body"].read() == b"written"

    proxy.plan("HEAD", "/after", "delay")
    began = time.monotonic()
    assert s3.head_object(Bucket=bucket, Key="after")["ContentLength"] == 7
    assert time.monotonic() - began >= 0.3
    assert [(r.fault, r.status) for r in proxy.log] == [
        ("503", 503), ("500", 500), ("reset_before", None), ("reset_after", None), ("delay", 200)]


def test_a_seed_gives_the_same_faults_for_the_same_requests(s3_endpoint, bucket):
    runs = []
    for _ in range(2):
        p = FaultProxy(s3_endpoint, seed=11, rates={"503": 0.3, "500": 0.1})
        s3 = client(p.url)
        for i in range(30):
            try:
                s3.head_bucket(Bucket=bucket)
            except ClientError:
                pass
        p.stop()
        runs.append([r.fault for r in p.log])
    assert runs[0] == runs[1] and len(runs[0]) == 30
    assert {"503", "500", None} == set(runs[0])  # all three happened at these rates


def test_an_unknown_fault_is_refused(s3_endpoint):
    with pytest.raises(ValueError, match="unknown faults"):
        FaultProxy(s3_endpoint, rates={"404": 0.5})
