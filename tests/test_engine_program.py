"""pyspark's getOrCreate contract: the setup function runs only when there is no checkpoint, and the
context, functions included, comes back from it; ``upgrade=True`` is the code-free path for a new
version of the program."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import zipfile

import pytest

from sparkwal.checkpoint import Checkpoint, CheckpointWriter, read_checkpoint
from sparkwal.engine import CheckpointMismatchError, StreamingContext, StreamingListener
from sparkwal.engine.driver.program import CheckpointSerializationError

HERE = os.path.dirname(os.path.abspath(__file__))


def save_totals(directory: str, t, rdd) -> None:
    """An output function that closes over nothing but a path (as a recoverable one must)."""
    totals = dict(rdd.collect())
    tmp = os.path.join(directory, ".totals.tmp")
    with open(tmp, "w") as f:
        json.dump(totals, f)
    os.replace(tmp, os.path.join(directory, "totals.json"))


def running_totals(sc, indir, outdir, calls: list, tag: str = "v1", extra_map: bool = False):
    def setup():
        calls.append(tag)
        ssc = StreamingContext(sc, 0.2)
        words = ssc.textFileStream(str(indir)).flatMap(str.split)
        if extra_map:
            words = words.map(str.lower)
        totals = words.map(lambda w: (w, 1)).updateStateByKey(
            lambda new, old: sum(new) + (old or 0)).checkpoint(0.4)
        if tag == "v1":
            totals.foreachRDD(lambda t, rdd: save_totals(str(outdir), t, rdd))
        else:  # new code, same graph: the totals are written with the tag in every key
            totals.foreachRDD(lambda t, rdd: save_totals(
                str(outdir), t, rdd.map(lambda kv: (f"{kv[0]}@{tag}", kv[1]))))
        return ssc
    return setup


class Batches(StreamingListener):
    def __init__(self):
        self.cond = threading.Condition()
        self.done = 0

    def onBatchCompleted(self, batchCompleted):
        with self.cond:
            self.done += 1
            self.cond.notify_all()

    def wait_until(self, predicate, timeout: float = 60) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), "condition not reached"


def read_totals(outdir) -> dict:
    try:
        with open(outdir / "totals.json") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def feed_and_wait(ssc, indir, outdir, name: str, text: str, expected: dict) -> None:
    """Move a file in; wait until a batch's totals are ``expected``."""
    batches = Batches()
    ssc.addStreamingListener(batches)
    tmp = indir / f".{name}"
    tmp.write_text(text)
    os.replace(tmp, indir / name)
    batches.wait_until(lambda: read_totals(outdir) == expected)


@pytest.fixture
def dirs(tmp_path):
    indir, outdir = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    outdir.mkdir()
    return indir, outdir, str(tmp_path / "ckpt")


def test_setup_runs_only_without_a_checkpoint_and_recovery_uses_the_active_context(spark_context, dirs):
    indir, outdir, ckpt = dirs
    calls: list = []
    ssc = StreamingContext.getOrCreate(ckpt, running_totals(spark_context, indir, outdir, calls))
    assert calls == ["v1"] and ssc.recovery == "new"
    ssc.start()
    feed_and_wait(ssc, indir, outdir, "a.txt", "x y x", {"x": 2, "y": 1})
    ssc.stop(stopSparkContext=False, stopGraceFully=True)

    again = StreamingContext.getOrCreate(ckpt, running_totals(spark_context, indir, outdir, calls))
    assert calls == ["v1"], "setupFunc ran although the directory holds a checkpoint"
    assert again.recovery == "checkpoint" and again.sparkContext is spark_context
    assert StreamingContext.getActiveOrCreate(ckpt, lambda: calls.append("x")) is not again
    assert calls == ["v1"]
    again.start()
    assert StreamingContext.getActiveOrCreate(ckpt, lambda: calls.append("x")) is again
    feed_and_wait(again, indir, outdir, "b.txt", "y z", {"x": 2, "y": 2, "z": 1})  # state carried over
    again.stop(stopSparkContext=False)
    assert calls == ["v1"]


def test_upgrade_runs_the_new_code_on_the_checkpointed_state(spark_context, dirs):
    indir, outdir, ckpt = dirs
    calls: list = []
    ssc = StreamingContext.getOrCreate(ckpt, running_totals(spark_context, indir, outdir, calls))
    ssc.start()
    feed_and_wait(ssc, indir, outdir, "a.txt", "x y x", {"x": 2, "y": 1})
    ssc.stop(stopSparkContext=False, stopGraceFully=True)

    v2 = running_totals(spark_context, indir, outdir, calls, tag="v2")
    upgraded = StreamingContext.getOrCreate(ckpt, v2, upgrade=True)
    assert calls == ["v1", "v2"] and upgraded.recovery == "upgrade"
    upgraded.start()
    feed_and_wait(upgraded, indir, outdir, "b.txt", "y", {"x@v2": 2, "y@v2": 2})
    upgraded.stop(stopSparkContext=False, stopGraceFully=True)

    changed = running_totals(spark_context, indir, outdir, calls, tag="v3", extra_map=True)
    # a changed graph is taken by an upgrade (tests/test_upgrade.py); this one is not started
    assert StreamingContext.getOrCreate(ckpt, changed, upgrade=True).recovery == "upgrade"
    # the upgraded run wrote its own program: recovering without upgrade runs v2's code
    recovered = StreamingContext.getOrCreate(ckpt, changed)
    assert recovered.recovery == "checkpoint" and calls == ["v1", "v2", "v3"]
    recovered.start()
    feed_and_wait(recovered, indir, outdir, "c.txt", "z", {"x@v2": 2, "y@v2": 2, "z@v2": 1})
    recovered.stop(stopSparkContext=False)


def test_a_checkpoint_without_code_recovers_only_with_upgrade(spark_context, dirs):
    """A checkpoint written before checkpoints held the program (today's format before this
    change): without upgrade=True the error says what to do; with it, the data applies."""
    indir, outdir, ckpt = dirs
    calls: list = []
    ssc = StreamingContext.getOrCreate(ckpt, running_totals(spark_context, indir, outdir, calls))
    ssc.start()
    feed_and_wait(ssc, indir, outdir, "a.txt", "x", {"x": 1})
    ssc.stop(stopSparkContext=False, stopGraceFully=True)
    newest = read_checkpoint(ckpt)
    old_format = {k: v for k, v in newest.data.items() if k not in ("code", "conf")}
    writer = CheckpointWriter(ckpt)
    writer.write(Checkpoint(newest.checkpoint_time_ms + 1000, newest.pending_times_ms, old_format))
    writer.stop()

    with pytest.raises(CheckpointMismatchError, match="holds no program code.*upgrade=True"):
        StreamingContext.getOrCreate(ckpt, running_totals(spark_context, indir, outdir, calls))
    assert calls == ["v1"]
    upgraded = StreamingContext.getOrCreate(ckpt, running_totals(spark_context, indir, outdir, calls),
                                            upgrade=True)
    assert upgraded.recovery == "upgrade"
    upgraded.start()
    feed_and_wait(upgraded, indir, outdir, "b.txt", "x", {"x": 2})
    upgraded.stop(stopSparkContext=False)


def test_a_function_that_cannot_be_serialised_fails_at_start_naming_the_operation(spark_context, dirs):
    indir, _outdir, ckpt = dirs
    sc = spark_context

    def uses_the_spark_context():
        ssc = StreamingContext(sc, 0.5)
        ssc.textFileStream(str(indir)).foreachRDD(lambda t, rdd: sc.parallelize([1]).count())
        return ssc

    ssc = StreamingContext.getOrCreate(ckpt, uses_the_spark_context)
    with pytest.raises(CheckpointSerializationError) as err:
        ssc.start()
    message = str(err.value)
    assert "It appears that you are attempting to reference SparkContext" in message  # pyspark's
    assert "foreachRDD at test_engine_program.py" in message
    assert read_checkpoint(ckpt) is None  # nothing was checkpointed

    lock = threading.Lock()

    def holds_a_lock():
        ssc = StreamingContext(sc, 0.5)
        ssc.checkpoint(ckpt)
        ssc.textFileStream(str(indir)).map(lambda line: (lock, line)).pprint()
        return ssc

    with pytest.raises(CheckpointSerializationError, match=r"DStream 1 .*made by map at test_engine_program"):
        holds_a_lock().start()
    ssc2 = StreamingContext(sc, 0.5)  # without a checkpoint nothing is pickled: pyspark's rule too
    ssc2.textFileStream(str(indir)).map(lambda line: (lock, line)).pprint()
    ssc2.start()
    ssc2.stop(stopSparkContext=False)


def start_app(workdir, *extra):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "recoverable_app.py"), str(workdir), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)


def events_until(proc, predicate) -> list[dict]:
    seen = []
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        seen.append(event)
        if predicate(event, seen):
            return seen
    raise AssertionError(f"the app ended first; events: {seen}")


def move_in(directory, name: str, text: str) -> None:
    tmp = directory / f".{name}"
    tmp.write_text(text)
    os.replace(tmp, directory / name)


@pytest.mark.driver
def test_spark_example_pattern_survives_a_sigkill_of_the_driver(tmp_path):
    """recoverable_network_wordcount's shape: the setup function deletes the output file. After
    a SIGKILL of the driver's process group the restart recovers from the checkpoint without
    calling it: the output accumulated before the kill is intact and the counts continue."""
    (tmp_path / "in").mkdir()
    first = start_app(tmp_path)
    events = events_until(first, lambda e, _: e["event"] == "batch")
    assert [e["event"] for e in events[:2]] == ["setup", "context"] and events[1]["recovery"] == "new"
    move_in(tmp_path / "in", "1.txt", "spark wal spark")
    events_until(first, lambda e, _: e["event"] == "batch" and (tmp_path / "totals.json").exists())
    events_until(first, lambda e, seen: e["event"] == "batch" and len(seen) > 3)  # a checkpoint or two
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = (tmp_path / "out.txt").read_text()
    assert json.loads(before.splitlines()[0])["counts"] == [["spark", 2], ["wal", 1]]

    second = start_app(tmp_path)
    try:
        events = events_until(second, lambda e, _: e["event"] == "context")
        assert [e["event"] for e in events] == ["context"], "setupFunc ran on recovery"
        assert events[0]["recovery"] == "checkpoint"
        move_in(tmp_path / "in", "2.txt", "wal")
        events_until(second, lambda e, _: e["event"] == "batch" and json.loads(
            (tmp_path / "totals.json").read_text())["totals"] == {"spark": 2, "wal": 2})
    finally:
        second.stdin.close()
        second.wait(60)
    after = (tmp_path / "out.txt").read_text()
    assert after.startswith(before)  # the output file was not deleted
    assert [json.loads(line)["counts"] for line in after.splitlines()] == [
        [["spark", 2], ["wal", 1]], [["wal", 1]]]


@pytest.mark.slow
def test_every_kind_of_stream_round_trips_through_the_checkpoint(spark_context, dirs):
    """Windows (plain and incremental), state, transform/transformWith, union, joins, queue and
    file streams and every output kind come back from the code part as the same graph."""
    indir, outdir, ckpt = dirs
    sc = spark_context

    def setup():
        ssc = StreamingContext(sc, 2.0)  # long enough for all the jobs of a batch: none queue up
        queued = ssc.queueStream([[("a", 1)]], default=[("q", 1)])
        words = ssc.textFileStream(str(indir)).flatMap(str.split).map(lambda w: (w, 1))
        both = words.union(queued)
        both.window(4.0, 2.0).count().pprint()
        both.reduceByKeyAndWindow(lambda a, b: a + b, lambda a, b: a - b, 12.0, 2.0).pprint()
        both.countByValueAndWindow(4.0, 2.0).pprint()
        both.transform(lambda rdd: rdd.distinct()).join(queued).pprint()
        both.transformWith(lambda t, a, b: a.union(b), words).saveAsTextFiles(str(outdir / "out"))
        both.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).checkpoint(2.0).foreachRDD(
            lambda rdd: None)
        return ssc

    first = StreamingContext.getOrCreate(ckpt, setup)
    described = first.driver.graph.describe()
    first.start()
    batches = Batches()
    first.addStreamingListener(batches)
    batches.wait_until(lambda: batches.done >= 1)
    first.stop(stopSparkContext=False)

    again = StreamingContext.getOrCreate(ckpt, lambda: pytest.fail("setupFunc ran"))
    assert again.recovery == "checkpoint" and again.driver.graph.describe() == described
    assert [s.creation_site.split(" at ")[0] for s in again.driver.graph.streams[:3]] == [
        "queueStream", "textFileStream", "flatMap"]
    again.start()
    batches = Batches()
    again.addStreamingListener(batches)
    move_in(indir, "w.txt", "x y")
    batches.wait_until(lambda: batches.done >= 2)
    again.stop(stopSparkContext=False)
    assert again.driver.error is None


def test_earlier_runs_code_parts_are_deleted_once_no_checkpoint_names_them(spark_context, tmp_path):
    from sparkwal.wal import ManualClock

    ckpt = str(tmp_path / "ckpt")

    def run(tag: str, start_ms: int, batches: int, **kw):
        clock, done = ManualClock(start_ms), Batches()

        def setup():
            ssc = StreamingContext(spark_context, 0.5, clock=clock)
            ssc.queueStream([], default=[1]).map(lambda x: (tag, x)).foreachRDD(lambda rdd: None)
            return ssc

        ssc = StreamingContext.getOrCreate(ckpt, setup, **kw)
        ssc.addStreamingListener(done)
        ssc.start()
        for i in range(1, batches + 1):
            clock.advance(500)
            done.wait_until(lambda i=i: done.done >= i)
        ssc.stop(stopSparkContext=False, stopGraceFully=True)

    def code_parts():
        return sorted(n for n in os.listdir(ckpt) if n.startswith("code-"))

    run("v1", 0, 1)
    first = code_parts()
    run("v2", 600, 2, upgrade=True)  # a new program: its code part beside the old one, still needed
    assert len(code_parts()) == 2 and first[0] in code_parts()
    run("v2", 1700, 12, upgrade=True)  # every checkpoint the old code part could serve is gone
    assert len(code_parts()) == 1 and first[0] not in code_parts()
    assert read_checkpoint(ckpt).data["code"] == code_parts()[0]


_LOCAL_WORKERS_APP = """
import json, os, stat, sys
from pyspark import SparkConf, SparkContext
from sparkwal.checkpoint import read_checkpoint
from sparkwal.engine import StreamingContext
sc = SparkContext(conf=SparkConf().setMaster("local[2]").set("spark.ui.enabled", "false"))
sc.setLogLevel("ERROR")
def setup():
    ssc = StreamingContext(sc, 0.2)
    ssc.textFileStream(sys.argv[2]).foreachRDD(lambda rdd: rdd.count())
    return ssc
ssc = StreamingContext.getOrCreate(sys.argv[1], setup)
early = sc._jsc.sc().conf().get("spark.python.daemon.module", None)  # set before start()
ssc.start()
ssc.awaitTerminationOrTimeout(1.0)
conf = sc._jsc.sc().conf()
where = conf.get("spark.python.unix.domain.socket.dir")
doubled = sc.parallelize(range(4), 2).map(lambda x: x * 2).collect()
def worker_facts(_):
    import gc, pyspark, sys as s
    return pyspark.__file__, "sparkwal.engine.state.state_map" in s.modules, gc.get_freeze_count()
facts = sc.parallelize(range(2), 2).map(worker_facts).collect()
mode = os.stat(where)
sockets = [n for n in os.listdir(where) if n.endswith(".sock")]
ssc.stop(stopSparkContext=False)
print(json.dumps({"enabled": conf.get("spark.python.unix.domain.socket.enabled"), "dir": where,
                  "mode": stat.S_IMODE(mode.st_mode), "uid": mode.st_uid, "sockets": len(sockets),
                  "doubled": doubled, "early_daemon": early, "facts": facts,
                  "checkpointed": sorted(k for k, _ in read_checkpoint(sys.argv[1]).data["conf"])}))
sc.stop()
"""


@pytest.mark.driver
def test_local_python_workers_are_reached_over_unix_sockets_and_start_with_compiled_pyspark(tmp_path):
    """getOrCreate in local mode, before start(): the executor's Python workers come from
    sparkwal's daemon, which imports the installed (compiled) PySpark rather than Spark's zip and
    the engine's task modules before it forks them, with those objects frozen out of the garbage
    collection each reused worker runs after each task (PySpark's daemon: ``gc.collect()``; it took
    over 40% of an idle job's worker CPU); the executor reaches them over Unix sockets in
    a directory only this user can enter, removed at exit; the checkpoint's conf leaves both socket
    settings out (the directory is this process's)."""
    (tmp_path / "in").mkdir()
    out = subprocess.run([sys.executable, "-c", _LOCAL_WORKERS_APP, str(tmp_path / "ckpt"), str(tmp_path / "in")],
                         capture_output=True, text=True, timeout=180, cwd=os.path.dirname(HERE),
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)), start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["enabled"] == "true"
    assert seen["mode"] == 0o700 and seen["uid"] == os.getuid()
    assert seen["sockets"] >= 1  # the worker daemon's socket: the workers are reached through it
    assert seen["doubled"] == [0, 2, 4, 6]
    assert seen["early_daemon"] == "sparkwal.engine.worker_daemon"
    for pyspark_file, engine_imported, frozen in seen["facts"]:
        assert ".zip" not in pyspark_file and os.path.isfile(pyspark_file)
        assert engine_imported  # by the daemon: the task itself imports nothing of the engine
        assert frozen > 10_000  # by the daemon: the collection a worker runs after each task skips them
    assert not any(k.startswith("spark.python.unix.domain.socket") for k in seen["checkpointed"])
    assert "spark.master" in seen["checkpointed"]
    assert not os.path.exists(seen["dir"])  # removed when the driver exited


def _zip_with(path, name, text):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name, text)


def test_the_worker_daemon_drops_sparks_zips_only_for_the_same_installed_versions(tmp_path):
    from sparkwal.engine.worker_daemon import prefer_installed_pyspark

    site = tmp_path / "site-packages"
    for pkg, version in (("pyspark", "4.3.0"), ("py4j", "0.10.9.9")):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "version.py").write_text(f"__version__ = '{version}'\n")
    lib = tmp_path / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    _zip_with(lib / "pyspark.zip", "pyspark/version.py", "__version__ = '4.3.0'\n")
    _zip_with(lib / "py4j-0.10.9.9-src.zip", "py4j/version.py", "__version__ = '0.10.9.9'\n")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    user = str(tmp_path / "user")
    path = [*zips, user, str(site)]
    assert prefer_installed_pyspark(path) == zips
    assert path == [user, str(site)]
    # another version installed, or none: Spark's zip stays where Spark put it
    (site / "pyspark" / "version.py").write_text("__version__ = '4.2.0'\n")
    path = [*zips, str(site)]
    assert prefer_installed_pyspark(path) == zips[1:]
    assert path == [zips[0], str(site)]
    path = [*zips, user]
    assert prefer_installed_pyspark(path) == [] and path == [*zips, user]
    # a zip that is not Spark's, or is damaged, is never touched
    (lib / "other.zip").write_bytes(b"not a zip")
    (lib / "pyspark.zip").write_bytes(b"damaged")
    path = [str(lib / "other.zip"), str(lib / "pyspark.zip"), str(site)]
    assert prefer_installed_pyspark(path) == [] and len(path) == 3


_IMPORT_EACH_FIRST = """
import importlib, json, pkgutil, sys
import sparkwal, sparkwal.base, sparkwal.wal, sparkwal.checkpoint, sparkwal.tracker, sparkwal.engine
rooms = (sparkwal.base, sparkwal.wal, sparkwal.checkpoint, sparkwal.tracker, sparkwal.engine)
names = sorted(m.name for p in rooms for m in pkgutil.walk_packages(p.__path__, p.__name__ + "."))
names += ["sparkwal." + m for m in ("cli", "common", "wal_verbs", "checkpoint_verbs", "received", "errors", "service")]
failed = []
for name in names:
    for k in [k for k in sys.modules if k == "sparkwal" or k.startswith("sparkwal.")]:
        del sys.modules[k]
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append([name, repr(e)])
from sparkwal.engine.driver.program_layouts import decode
# a version-1 program naming a stateful stream as the oldest checkpoints' programs do
old_name = decode(b"(dp0\\nVversion\\np1\\nI1\\nsVgraph\\np2\\ncengine.dstream\\nStateDStream\\np3\\ns.", "x")["graph"]
tops = [m for m in sys.modules if m.split(".")[0] in ("base", "wal", "checkpoint", "tracker", "engine")]
print(json.dumps({"modules": len(names), "failed": failed, "tops": tops,
                  "old_name": old_name.__module__ + "." + old_name.__name__}))
"""


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    """A Python worker imports whichever module its task's function lives in first (on a cluster,
    from the shipped zip): no module may depend on another having been imported before it (an
    import cycle once made ``sparkwal.engine.state.update_state`` fail on local-cluster executors). The
    stateful streams' old names in ``sparkwal.engine.dstream`` still resolve."""
    out = subprocess.run([sys.executable, "-c", _IMPORT_EACH_FIRST], capture_output=True, text=True,
                         timeout=180, cwd=os.path.dirname(HERE))
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["modules"] > 40 and seen["failed"] == [] and seen["tops"] == []  # only sparkwal.*
    assert seen["old_name"] == "sparkwal.engine.state.update_state.StateDStream"
