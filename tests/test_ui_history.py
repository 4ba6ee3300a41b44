"""The UI across a driver's death, in a real browser, and against pyspark.streaming's own UI.

* The main job runs with its UI, is killed with SIGKILL and restarted (getOrCreate): the live
  page, seen in headless Chromium, and ``.../streaming/recoveries`` show both runs.
* ``sparkwal ui`` then serves the dead app's runs and batches from the checkpoint's event log;
  ``sparkwal status --json`` prints the same summary.
* A pyspark.streaming app and the same app on sparkwal run side by side: every field Spark's
  REST API serves, sparkwal's serves too, with the same types.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from browser import browser_dom

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")


class Proc:
    """A subprocess in its own process group, its JSON-line events read as they come."""

    def __init__(self, args: list[str]):
        self.events: list[dict] = []
        self.changed = threading.Condition()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV,
                                     cwd=ROOT, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.changed:
                self.events.append(event)
                self.changed.notify_all()

    def wait_for(self, kind: str, count: int = 1, timeout: float = 120) -> dict:
        def seen():
            return [e for e in self.events if e.get("event") == kind]
        with self.changed:
            assert self.changed.wait_for(lambda: len(seen()) >= count or self.proc.poll() is not None, timeout), \
                self.events[-10:]
            assert len(seen()) >= count, (kind, self.events[-10:])
            return seen()[count - 1]

    def wait_until(self, matches, timeout: float = 120) -> dict:
        """The first event ``matches`` accepts, waited for."""
        with self.changed:
            self.changed.wait_for(lambda: any(matches(e) for e in self.events) or self.proc.poll() is not None,
                                  timeout)
            found = [e for e in self.events if matches(e)]
            assert found, self.events[-10:]
            return found[0]

    def kill(self, sig=signal.SIGKILL) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        return self.proc.wait(60)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def wordcount(workdir: Path, *extra: str) -> Proc:
    return Proc([sys.executable, "-m", "sparkwal.engine.wordcount", "--dir", str(workdir), "--json", "--batch", "0.5",
                 "--conf", "spark.sparkwal.ui.port=0", *extra])


@pytest.mark.driver
def test_a_killed_driver_and_its_restart_are_on_record_live_and_after_death(tmp_path):
    work = tmp_path / "wc"
    first = wordcount(work, "--files", "40", "--seconds", "0")
    ui = first.wait_for("ui")
    first.wait_for("batch_completed", 3)
    dom = browser_dom(f"{ui['url']}/streaming/", tmp_path)
    assert "Streaming Statistics" in dom and dom.count("<svg") == 8 and "Completed Batches" in dom
    assert first.kill() == -signal.SIGKILL

    second = wordcount(work, "--files", "40", "--seconds", "3")
    ui2 = second.wait_for("ui")
    second.wait_for("batch_completed", 2)
    app_id = get_json(f"{ui2['url']}/api/v1/applications")[0]["id"]
    runs = get_json(f"{ui2['url']}/api/v1/applications/{app_id}/streaming/recoveries")
    assert [r["kind"] for r in runs] == ["new", "restart"]
    assert runs[1]["downtimeMs"] >= 0 and runs[1]["checkpointTime"] is not None
    dom = browser_dom(f"{ui2['url']}/streaming/", tmp_path)
    assert "Recoveries" in dom and ">restart<" in dom and ">new<" in dom
    assert "killed</span> (no end recorded; last heard of 20" in dom and ">running<" in dom
    assert dom.index("Recoveries") < dom.index("Active Batches")  # near the top: after an incident
    first_id = get_json(f"{ui2['url']}/api/v1/applications")[-1]["id"]
    assert f"href=\"/history/{first_id}/streaming/\"" in dom  # the earlier run's own page
    # a file stream's records are counted (Spark's page shows 0), as the console counts them: once
    # a batch read a file (the restart's first batches may not), the API has it (its recorder hears
    # a batch before the console's listener, which the listener bus calls on its own thread)
    second.wait_until(lambda e: e.get("event") == "batch_completed" and e.get("records", 0) > 0)
    api = get_json(f"{ui2['url']}/api/v1/applications/{app_id}/streaming/batches")
    assert {b["batchId"]: b["inputSize"] for b in api if b["inputSize"]}
    assert second.proc.wait(120) == 0

    status = subprocess.run([sys.executable, "-m", "sparkwal", "status", str(work / "checkpoint"), "--json"],
                            capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert [r["kind"] for r in summary["runs"]] == ["new", "restart"] and summary["runs"][1].get("endTime")
    assert [r["ended"] for r in summary["runs"]] == ["killed", "stopped"]
    assert summary["newest"]["statistics"]["numTotalCompletedBatches"] >= 2
    text = subprocess.run([sys.executable, "-m", "sparkwal", "status", str(work / "checkpoint")],
                          capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60).stdout
    assert "KILLED: no end recorded, last heard of" in text.splitlines()[1]

    history = Proc([sys.executable, "-m", "sparkwal", "ui", str(work / "checkpoint"), "--port", "0", "--json"])
    try:
        url = history.wait_for("ui", timeout=30)["url"]
        apps = get_json(f"{url}/api/v1/applications")
        killed, stopped = sorted((a["attempts"][0] for a in apps), key=lambda a: a["startTimeEpoch"])
        assert not killed["completed"] and killed["ended"] == "killed" and stopped["completed"]
        assert killed["endTimeEpoch"] > killed["startTimeEpoch"] and killed["duration"] > 0
        assert not killed["endTime"].startswith("1969")  # it ends at its last recorded event
        for app in apps:  # the dead first run's batches too
            batches = get_json(f"{url}/api/v1/applications/{app['id']}/streaming/batches")
            assert batches and {b["status"] for b in batches} == {"COMPLETED"}
        killed = min(apps, key=lambda a: a["attempts"][0]["startTimeEpoch"])["id"]
        dom = browser_dom(f"{url}/history/{killed}/streaming/", tmp_path)
        assert "Completed Batches" in dom and "Recoveries" in dom
    finally:
        assert history.kill(signal.SIGTERM) == 0


PYSPARK_STREAMING_APP = """
import json, sys, time, urllib.request
from pyspark import SparkConf, SparkContext
from pyspark.streaming import StreamingContext
sc = SparkContext(conf=SparkConf().setMaster("local[2]").setAppName("reference")
                  .set("spark.ui.port", "0").set("spark.driver.host", "127.0.0.1"))
ssc = StreamingContext(sc, 0.5)
def output(rdd):
    rdd.count()  # (a foreachRDD function returning a value fails in pyspark.streaming)
ssc.queueStream([sc.parallelize(range(10)) for _ in range(40)]).foreachRDD(output)
ssc.start()
base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/streaming"
get = lambda p: json.loads(urllib.request.urlopen(base + p, timeout=10).read())
deadline = time.monotonic() + 60
while True:  # until a batch has completed (the API answers once the stream has started)
    try:
        batches = get("/batches")
    except OSError:
        batches = []
    if any(b["status"] == "COMPLETED" for b in batches) or time.monotonic() > deadline:
        break
    time.sleep(0.1)
done = [b for b in batches if b["status"] == "COMPLETED"][-1]["batchId"]
print(json.dumps({"statistics": get("/statistics"), "batches": batches, "batch": get(f"/batches/{done}"),
                  "operations": get(f"/batches/{done}/operations"),
                  "apps": json.loads(urllib.request.urlopen(sc.uiWebUrl + "/api/v1/applications").read())}))
ssc.stop(True, False)
"""


def _shape(value):
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


@pytest.mark.driver
def test_the_rest_api_serves_what_pyspark_streaming_serves(tmp_path):
    ours_app = PYSPARK_STREAMING_APP.replace(
        "from pyspark.streaming import StreamingContext", "from engine import StreamingContext").replace(
        'sc.uiWebUrl}/api', 'ssc.uiWebUrl}/api').replace('urlopen(sc.uiWebUrl', 'urlopen(ssc.uiWebUrl')
    runs = {}
    for name, app in (("pyspark", PYSPARK_STREAMING_APP), ("sparkwal", ours_app)):  # side by side
        with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
            runs[name] = subprocess.Popen([sys.executable, "-c", app], stdout=out, stderr=err, env=ENV, cwd=ROOT,
                                          start_new_session=True)
    try:
        for name, run in runs.items():
            assert run.wait(180) == 0, (tmp_path / f"{name}.err").read_text()[-3000:]
    finally:
        for run in runs.values():
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    spark, sparkwal = (json.loads((tmp_path / f"{name}.out").read_text().strip().splitlines()[-1])
                       for name in runs)
    for key in ("statistics", "batch"):
        missing = {k: v for k, v in _shape(spark[key]).items() if _shape(sparkwal[key]).get(k) != v}
        assert not missing, (key, missing, _shape(sparkwal[key]))
    ref_op, our_op = _shape(spark["operations"][0]), _shape(sparkwal["operations"][0])
    assert {k: v for k, v in ref_op.items() if our_op.get(k) != v} == {}
    ref_app, our_app = _shape(spark["apps"][0]), _shape(sparkwal["apps"][0])
    assert set(ref_app) <= set(our_app) and set(ref_app["attempts"][0]) <= set(our_app["attempts"][0])
    assert sparkwal["statistics"]["batchDuration"] == spark["statistics"]["batchDuration"] == 500


@pytest.mark.parametrize("argv, status, says", [
    (["status", "/nonexistent/checkpoint"], 1, "no checkpoint directory at /nonexistent/checkpoint"),
    (["ui", "/tmp", "--port", "70000"], 2, "--port must be 0-65535"),
    (["status"], 2, "CHECKPOINT"),
])
def test_history_commands_name_each_mistake_in_one_line(argv, status, says):
    out = subprocess.run([sys.executable, "-m", "sparkwal", *argv], capture_output=True, text=True, cwd=ROOT,
                         env=ENV, timeout=60)
    assert out.returncode == status and says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_checkpoint_without_an_event_log_is_said_so(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sparkwal", "status", str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT, env=ENV, timeout=60)
    assert out.returncode == 1 and "holds no event log" in out.stderr and len(out.stderr.splitlines()) == 1
