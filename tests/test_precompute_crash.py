"""kill -9 of a driver whose receivers precompute (``spark.sparkwal.receiver.precompute``): the
results are only a shortcut, the blocks in the receiver WAL the truth, so a restarted driver's
batches read the blocks of the dead one's and nothing acknowledged is lost or counted twice (beyond
the lines the source had to send again). The same app's ``foreachBlock`` outputs every block at
least once, with the same rows each time it outputs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from sparkwal.engine.apps.wordcount_data import receiver_line
from sparkwal.engine.receiver.acked_lines import AckedLineSource

APP = os.path.join(os.path.dirname(__file__), "precompute_crash_app.py")


class App:
    def __init__(self, workdir, port, secret):
        self.log = workdir / f"app-{len(list(workdir.glob('app-*.log')))}.log"
        self.proc = subprocess.Popen([sys.executable, APP, str(workdir), str(port)], stdout=subprocess.PIPE,
                                     stderr=self.log.open("w"), text=True, start_new_session=True,
                                     env=dict(os.environ, SPARKWAL_SOURCE_SECRET=secret))
        self.batches: list[dict] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self.changed:
                    self.batches.append(json.loads(line))
                    self.changed.notify_all()

    def wait_for(self, predicate, timeout=120.0):
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.batches), timeout), \
                (self.batches[-3:], self.log.read_text()[-3000:])

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.mark.driver
def test_a_killed_driver_loses_and_doubles_nothing_its_receivers_precomputed(tmp_path):
    secret = os.urandom(16).hex()
    source = AckedLineSource(secret, chunk_lines=20)
    stop = threading.Event()
    offered = [0]

    def feed():  # until stopped, so that every driver has lines to precompute
        while not stop.wait(0.01):
            source.offer([receiver_line(offered[0])])
            offered[0] += 1

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    apps = []
    try:
        for _ in range(2):  # two kills, each after a few precomputed batches
            app = App(tmp_path, source.address[1], secret)
            apps.append(app)
            app.wait_for(lambda bs: sum(b["precomputed"] for b in bs) >= 3)
            app.kill()
        app = App(tmp_path, source.address[1], secret)
        apps.append(app)
        app.wait_for(lambda bs: any(b["precomputed"] for b in bs))  # the restarted driver precomputes too
        stop.set()
        feeder.join()
        lines = offered[0]
        assert source.wait_acked(lines, 180), source.statistics()
        counted: dict[str, int] = {}

        def all_counted(_):
            counted.clear()
            for name in os.listdir(tmp_path / "out"):
                if name.endswith(".json"):
                    for key, n in json.loads((tmp_path / "out" / name).read_text()).items():
                        counted[key] = counted.get(key, 0) + n
            return len(counted) >= lines
        app.wait_for(all_counted)
    finally:
        stop.set()
        for a in apps:
            if a.proc.poll() is None:
                a.kill()
        source.close()
    assert set(counted) == {f"r{i}" for i in range(lines)}  # none lost
    doubled = sum(n - 1 for n in counted.values())
    assert doubled <= source.statistics().lines_resent, (doubled, source.statistics())
    # foreachBlock: every block out at least once, with the same rows each time; by block id, once
    by_block: dict[str, list] = {}
    for line in (tmp_path / "out" / "blocks.log").read_text().splitlines():
        try:
            call = json.loads(line)
        except ValueError:
            continue  # (a killed driver's torn last line)
        by_block.setdefault(call["block"], []).append(call["rows"])
    assert all(rows == calls[0] for calls in by_block.values() for rows in calls), "a block's rows changed"
    per_block: dict[str, int] = {}
    for calls in by_block.values():
        for key, n in calls[0]:
            per_block[key] = per_block.get(key, 0) + n
    assert per_block == counted  # the same records as the batches' output, none lost
