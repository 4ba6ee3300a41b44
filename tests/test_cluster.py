"""The main job on a real Spark standalone cluster (a master and two workers from pyspark's
``spark-class``, on 127.0.0.1) with its checkpoint on S3 (moto's server): an executor JVM killed
mid-stream is replaced, a driver killed and restarted resumes from the S3 checkpoint, and every
line is counted exactly once. Credentials come from the environment (driver and workers), never
from the command line or the task closures."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from sparkwal.engine.apps.direct_wordcount import PARTITIONS, append_lines, expected_direct_counts, read_results
from sparkwal.engine.apps.drill_runs import AppRun

from sparkwal.engine.apps.standalone import StandaloneCluster

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def cluster(tmp_path):
    c = StandaloneCluster(str(tmp_path / "cluster"), workers=2, env=CREDENTIALS)
    yield c
    c.stop()


def wait(cond, timeout_s: float, what: str, app: AppRun | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert app is None or app.proc.poll() is None, f"the app exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.driver
def test_direct_job_on_a_standalone_cluster_with_an_s3_checkpoint(tmp_path, cluster, s3_url, monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    bucket, options = s3_url
    endpoint = options["client_kwargs"]["endpoint_url"]
    workdir = tmp_path / "app"
    logdir = workdir / "log"
    logdir.mkdir(parents=True)
    args = ("--source", "filelog", "--master", cluster.url, "--checkpoint", f"{bucket}/ckpt",
            # the restarted driver waits out the killed one's lease on S3: a short one for the test
            "--conf", "spark.streaming.driver.leaseTimeout=5s",
            "--storage-option", "use_listings_cache=false", "--storage-option",
            "client_kwargs=" + json.dumps({"endpoint_url": endpoint, "region_name": "us-east-1"}))
    appended = {p: 0 for p in PARTITIONS}
    stop = threading.Event()

    def appender():
        i = 0
        while not stop.wait(0.2):
            p = PARTITIONS[i % 2]
            append_lines(str(logdir), p, appended[p], 3)
            appended[p] += 3
            i += 1

    feeder = threading.Thread(target=appender, daemon=True)
    feeder.start()
    try:
        app = AppRun(str(workdir), 1.0, extra_args=args)
        wait(lambda: len(app.batches()) >= 2, 180, "the first batches", app)
        executors = cluster.executor_pids()
        assert len(executors) == 2, executors
        os.kill(executors[0], signal.SIGKILL)  # an executor JVM dies mid-stream
        done = len(app.batches())
        wait(lambda: len(app.batches()) >= done + 3, 120, "batches after the executor kill", app)
        wait(lambda: len(cluster.executor_pids()) == 2 and executors[0] not in cluster.executor_pids(),
             60, "a replacement executor")
        app.kill()  # the driver (its process group) dies
        stop.set()
        feeder.join()
        app2 = AppRun(str(workdir), 1.0, extra_args=args)
        assert wait(lambda: app2.recovery is not None, 180, "the restart", app2) is None
        assert app2.recovery == "checkpoint"
        wait(lambda: read_results(str(workdir))["lines"] == appended, 120, "every line counted", app2)
        app2.terminate()
    finally:
        stop.set()
        for r in ("app", "app2"):
            run = locals().get(r)
            if run is not None and run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
    results = read_results(str(workdir))
    assert results["lines"] == appended
    assert results["words"] == expected_direct_counts(appended)
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/ckpt")}
    assert {"offsets", "commits"} <= names and any(n.startswith("checkpoint-") for n in names)


def test_executors_lacking_a_module_get_a_clear_error_before_any_batch(spark_context):
    from sparkwal.engine.cluster import ExecutorEnvironmentError, check_executors

    check_executors(spark_context)  # this machine's workers have everything
    with pytest.raises(ExecutorEnvironmentError) as err:
        check_executors(spark_context, modules=("engine", "sparkwal_no_such_module"))
    msg = str(err.value)
    assert "sparkwal_no_such_module (ModuleNotFoundError" in msg and " on " in msg
    assert "spark.sparkwal.shipCode=true" in msg and "engine (" not in msg


def test_shipped_code_holds_the_package_with_its_four_rooms(spark_context, monkeypatch):
    import zipfile

    from sparkwal.engine.cluster import ship_code

    added = []
    monkeypatch.setattr(spark_context, "addPyFile", added.append)
    path = ship_code(spark_context)
    names = set(zipfile.ZipFile(path).namelist())
    assert added == [path]
    assert {"sparkwal/__init__.py", "sparkwal/engine/context.py", "sparkwal/engine/sources/direct.py",
            "sparkwal/wal/storage.py", "sparkwal/checkpoint/offsets.py", "sparkwal/tracker/rate.py"} <= names
    assert not any("__pycache__" in n or not n.startswith("sparkwal/") for n in names)  # one package
    os.unlink(path)
