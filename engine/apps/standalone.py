"""A Spark standalone cluster on 127.0.0.1: a master and workers started with pyspark's own
``spark-class`` scripts (no Spark download: the pyspark wheel carries them), each in its own
process group, stopped with their executors. Used by the tests and ``python -m sparkwal.engine.drill
--standalone N``; docs/cluster.md gives the same commands by hand.

The master's REST submission server is off; web UIs bind ephemeral ports on 127.0.0.1. The
workers pass their environment to the executors they launch: credentials a cluster's machines
hold (e.g. ``AWS_ACCESS_KEY_ID``) reach the executors that way, never through task closures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pyspark

from sparkwal.base.errors import SparkwalError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneClusterError(SparkwalError, RuntimeError):
    """The standalone cluster's master or a worker did not come up (names which, and its logs)."""


class StandaloneCluster:
    def __init__(self, workdir: str, workers: int = 2, env: dict | None = None, timeout_s: float = 60,
                 cores: int = 1, memory: str = "1g", hosts_apart: bool = False):
        """``hosts_apart``: worker ``i`` (and its executors) on 127.0.0.``i + 2`` instead of 127.0.0.1,
        so that the workers are hosts of their own to Spark's scheduler, which never runs a
        speculative copy of a task on a host that runs an attempt of it (``TaskSetManager``)."""
        spark_home = os.path.dirname(pyspark.__file__)
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.port = free_port()
        self.env = dict(os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1",
                        PYSPARK_PYTHON=sys.executable,
                        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false", **(env or {}))
        self.procs: list[subprocess.Popen] = []
        spark_class = os.path.join(spark_home, "bin", "spark-class")
        self._start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                               "127.0.0.1", "--port", str(self.port), "--webui-port", "0"])
        self._wait(lambda: self._log_has("master", "I have been elected leader"), timeout_s, "master")
        for i in range(workers):
            work = os.path.join(workdir, f"worker-{i}")
            os.makedirs(work, exist_ok=True)
            host = f"127.0.0.{i + 2}" if hosts_apart else "127.0.0.1"
            self._start(f"worker-{i}", [spark_class, "org.apache.spark.deploy.worker.Worker", self.url,
                                        "--host", host, "--cores", str(cores), "--memory", memory,
                                        "--webui-port", "0", "--work-dir", work], SPARK_LOCAL_IP=host)
        self._wait(lambda: self._log_count("master", "Registering worker") >= workers, timeout_s,
                   f"{workers} workers")

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _log(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.log")

    def _start(self, name: str, cmd: list[str], **env: str) -> None:
        with open(self._log(name), "w") as log:
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **env},
                                               start_new_session=True))

    def _log_has(self, name: str, text: str) -> bool:
        return self._log_count(name, text) > 0

    def _log_count(self, name: str, text: str) -> int:
        with open(self._log(name), errors="replace") as f:
            return f.read().count(text)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise StandaloneClusterError(f"standalone cluster: {what} not up (logs in {self.workdir})")
            time.sleep(0.1)

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers launched (CoarseGrainedExecutorBackend), running now."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmd and self._ours(int(entry)):
                pids.append(int(entry))
        return sorted(pids)

    def _ours(self, pid: int) -> bool:
        try:
            return os.getsid(pid) in {p.pid for p in self.procs}
        except OSError:
            return False

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
