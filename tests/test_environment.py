"""The conf a cluster's SparkContext is made with (``sparkwal.engine.prepare_conf``): the driver's
virtualenv packed once and shipped with ``spark.archives``, executors whose own Python is bare
running a stateful receiver app with it, their Python workers forked from sparkwal's daemon
(installed PySpark, not Spark's zip) and reached over Unix sockets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from app_runs import run_app
from pyspark import SparkConf

from sparkwal.engine import prepare_conf
from sparkwal.engine.environment import ALIAS, packed_environment

CLUSTER = "spark://127.0.0.1:7077"


def conf(master: str = CLUSTER, **settings) -> SparkConf:
    c = SparkConf(loadDefaults=False).setMaster(master)
    for k, v in settings.items():
        c.set(k, v)
    return c


def test_local_mode_is_left_alone():
    ready = prepare_conf(conf("local[2]", **{"spark.sparkwal.shipEnvironment": "true"}))
    assert not ready.contains("spark.archives") and not ready.contains("spark.python.daemon.module")


def test_executors_with_sparkwal_installed_get_the_daemon_and_unix_sockets():
    ready = prepare_conf(conf(**{"spark.sparkwal.shipCode": "false"}))
    assert ready.get("spark.python.daemon.module") == "sparkwal.engine.worker_daemon"
    assert ready.get("spark.python.unix.domain.socket.enabled") == "true"
    plain = prepare_conf(conf())  # sparkwal shipped as a zip: the daemon could not import it
    assert not plain.contains("spark.python.daemon.module")
    assert plain.get("spark.python.unix.domain.socket.enabled") == "true"
    mine = prepare_conf(conf(**{"spark.sparkwal.shipCode": "false", "spark.python.daemon.module": "my.daemon",
                                "spark.python.unix.domain.socket.enabled": "false"}))
    assert mine.get("spark.python.daemon.module") == "my.daemon"
    assert mine.get("spark.python.unix.domain.socket.enabled") == "false"
    off = prepare_conf(conf(**{"spark.sparkwal.shipCode": "false", "spark.sparkwal.preimportWorkers": "false"}))
    assert not off.contains("spark.python.daemon.module")


@pytest.mark.parametrize("key", ["spark.sparkwal.shipEnvironment", "spark.sparkwal.preimportWorkers"])
def test_a_bad_switch_is_named(key):
    with pytest.raises(ValueError, match=f"{key} must be true or false, got 'yes please'"):
        prepare_conf(conf(**{key: "yes please"}))


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("env-cache"))


@pytest.mark.slow
def test_the_environment_is_packed_once_and_found_again(env_cache, installed, monkeypatch):
    """The driver's virtualenv here is the wheel's (conftest's ``installed``: the wheel and PySpark,
    as a user's would be), not the test environment, whose packing alone took half a minute."""
    monkeypatch.setattr(sys, "prefix", str(installed.parent))
    settings = {"spark.sparkwal.shipEnvironment": "true", "spark.sparkwal.shipEnvironment.cacheDir": env_cache,
                "spark.archives": "file:///data/models.zip#models"}
    first = prepare_conf(conf(**settings))
    (archive,) = [a for a in os.listdir(env_cache) if a.endswith(".tar.gz")]
    inode = os.stat(os.path.join(env_cache, archive)).st_ino
    assert first.get("spark.archives") == f"file:///data/models.zip#models,file://{env_cache}/{archive}#{ALIAS}"
    assert first.get("spark.pyspark.python") == f"./{ALIAS}/bin/python"
    assert first.get("spark.pyspark.driver.python") == sys.executable
    assert first.get("spark.python.daemon.module") == "sparkwal.engine.worker_daemon"
    again = prepare_conf(first)  # a restart from the checkpoint's conf: found, not packed again
    assert again.get("spark.archives") == first.get("spark.archives")
    assert os.stat(os.path.join(env_cache, archive)).st_ino == inode
    assert packed_environment(env_cache) == os.path.join(env_cache, archive)


@pytest.mark.driver
def test_bare_python_executors_run_a_stateful_receiver_app_with_the_shipped_environment(
        tmp_path, env_cache, installed, monkeypatch):
    """Executors whose interpreter has no pyarrow, msgpack or sparkwal (the base Python under the
    driver's virtualenv): everything tasks need comes in the archive. The driver runs in a
    virtualenv of the wheel and PySpark alone (conftest's ``installed``), as a user's would: packing
    and unpacking the test environment (deltalake, moto, mypy, ...) would take most of the test."""
    bare = os.path.join(sys.base_prefix, "bin", "python3")
    assert subprocess.run([bare, "-c", "import pyarrow"], capture_output=True).returncode != 0
    monkeypatch.setattr(sys, "executable", str(installed / "python"))  # run_app runs sys.executable
    report = run_app("shipped_env_app.py", ["local-cluster[2,1,1024]", str(tmp_path), env_cache, "2000"],
                     cwd=tmp_path, env={"PYSPARK_PYTHON": bare}, timeout_s=300)
    import pyspark  # the executors' work directories (each holds an unpacked environment)

    shutil.rmtree(os.path.join(os.path.dirname(pyspark.__file__), "work", report["app_id"]), ignore_errors=True)
    assert sum(report["totals"].values()) == 2000 and len(report["totals"]) == 7, report["stderr"]
    assert report["totals"]["w0"] == 286
    for executable, pyspark_file, unix_sockets, preimported in report["workers"]:
        assert f"/{ALIAS}/bin/python" in executable  # the shipped environment's interpreter
        assert f"/{ALIAS}/lib/" in pyspark_file and ".zip" not in pyspark_file  # installed PySpark
        assert unix_sockets == "True" or unix_sockets == "true"
        assert preimported  # by engine.worker_daemon, before any task


def test_a_checkpoint_keeps_no_per_pod_or_per_run_setting():
    """A standby in another pod recovers from the checkpoint: the first pod's name, ports and
    secrets must not override its own (Spark's Checkpoint.scala reloads the same keys)."""
    from sparkwal.engine.driver.program import checkpoint_conf

    class Context:
        def getConf(self):
            return conf(**{"spark.kubernetes.driver.pod.name": "app-0", "spark.driver.host": "10.0.0.7",
                           "spark.kubernetes.executor.podNamePrefix": "app-0", "spark.driver.port": "7078",
                           "spark.hadoop.fs.s3a.secret.key": "s3cr3t", "spark.app.name": "app"})

    assert dict(checkpoint_conf(Context())) == {"spark.master": CLUSTER, "spark.app.name": "app"}


def test_a_directory_that_is_no_virtualenv_is_named(tmp_path):
    from sparkwal.engine import EnvironmentShippingError

    with pytest.raises(EnvironmentShippingError,
                       match=f"cannot pack the environment {tmp_path}: .*not a valid virtual"):
        packed_environment(str(tmp_path / "cache"), prefix=str(tmp_path))
