"""Storage faults at the object store's boundary (tests/s3_fault_proxy.py in front of moto): what
the storage seam absorbs, and how an ambiguous write is resolved."""

from __future__ import annotations

import pytest
from s3_fault_proxy import FaultProxy

from wal import FileBasedWriteAheadLog

pytestmark = pytest.mark.s3


def options(endpoint: str) -> dict:
    return {"key": "testing", "secret": "testing", "use_listings_cache": False,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


@pytest.mark.parametrize("fault", ["503", "500", "reset_before", "reset_after"])
def test_transient_faults_on_every_segment_put_lose_and_double_nothing(s3_url, s3_endpoint, fault):
    """Every WAL write on an object store is one conditional create; each fault hits one of them.
    A reset after the store took the PUT makes the client's retry answer "already exists": read
    back, it is the log's own segment, so the record is not written a second time."""
    url, _ = s3_url
    proxy = FaultProxy(s3_endpoint, seed=5)
    try:
        wal = FileBasedWriteAheadLog(f"{url}/wal", close_file_after_write=True, storage_options=options(proxy.url))
        for i in range(12):
            if i % 3 == 1:
                proxy.plan("PUT", "/wal/log-", fault)
            wal.write(b"record %d" % i, 1000 + i)
        wal.close()
        injected = [r for r in proxy.log if r.fault == fault]
        assert len(injected) == 4, proxy.log
    finally:
        proxy.stop()
    reader = FileBasedWriteAheadLog(f"{url}/wal", close_file_after_write=True, storage_options=options(s3_endpoint))
    assert list(reader.read_all()) == [b"record %d" % i for i in range(12)]  # each once, in order
