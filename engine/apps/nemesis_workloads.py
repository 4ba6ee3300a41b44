"""What the nemesis drill feeds the main job and how it checks the outputs, per source mode: the
same sources and checks as the kill drills (:mod:`sparkwal.engine.apps.drill_runs` for files,
:mod:`sparkwal.engine.apps.receiver_drill`, :mod:`sparkwal.engine.apps.direct_drill`).

Each workload gives the job's extra arguments and environment, keeps its input coming until
:meth:`stop_input`, says when everything offered is counted, and checks the outputs of all runs:
``records_lost`` (0 everywhere) and ``records_doubled`` (0 where exactly-once is promised: files
and direct; for the receiver, at most the lines the source had to send again)."""

from __future__ import annotations

import os
import threading
from typing import Any

from . import direct_drill, receiver_drill
from .drill_runs import AppRun, check_outputs, read_outputs, start_file_input
from ..receiver.acked_lines import AckedLineSource


class FileWorkload:
    """One input file per batch interval; exactly once, running totals exact."""

    name = "file stream"
    exactly_once = True

    def __init__(self, workdir: str, files: int, batch: float, seed: int):
        self.workdir = workdir
        self.args: tuple[str, ...] = ()
        self.env: dict[str, str] = {}
        _dir, self._stop, self._stop_input, self._writer, self._written = start_file_input(workdir, files, batch)

    def stop_input(self) -> None:
        self._stop_input.set()
        self._writer.join()

    def all_counted(self) -> bool:
        return len({f for o in read_outputs(self.workdir) for f in o["files"]}) >= self._written[0]

    def verify(self, runs: list[AppRun]) -> dict:
        result = check_outputs(self.workdir, self._written[0], runs)
        result["records_doubled"] = result["duplicate_files"]
        return result

    def close(self) -> None:
        self._stop.set()


class ReceiverWorkload:
    """A reliable receiver reading acknowledged lines (3 a batch interval) from a source in the
    drill's process, which outlives every run; at least once, duplicates only of re-sent lines."""

    name = "receiver"
    exactly_once = False

    def __init__(self, workdir: str, files: int, batch: float, seed: int):
        self.workdir = workdir
        os.makedirs(os.path.join(workdir, "output"), exist_ok=True)
        secret = os.urandom(16).hex()
        self.source = AckedLineSource(secret, chunk_lines=50)
        self._stop = threading.Event()
        self._feeder, self._offered = receiver_drill.start_feeder(self.source, 3 * files, 3 / batch, self._stop)
        self.args = ("--source", "receiver", "--source-port", str(self.source.address[1]),
                     "--source-secret-env", receiver_drill.SECRET_ENV)
        self.env = {receiver_drill.SECRET_ENV: secret}

    def stop_input(self) -> None:
        self._stop.set()
        self._feeder.join()

    def all_counted(self) -> bool:
        offered = self._offered[0]
        return (self.source.statistics().lines_acked >= offered
                and receiver_drill.all_counted(self.workdir, offered))

    def verify(self, runs: list[AppRun]) -> dict:
        result = receiver_drill.verify(self.workdir, self._offered[0], self.source, runs)
        result["records_doubled"] = result["duplicates"]
        return result

    def close(self) -> None:
        self._stop.set()
        self.source.close()


class DirectWorkload:
    """Lines appended to a FileLogSource's partitions, counted into SQLite through the batch log;
    exactly once."""

    name = "direct"
    exactly_once = True

    def __init__(self, workdir: str, files: int, batch: float, seed: int):
        self.workdir = workdir
        self.args = ("--source", "filelog")
        self.env: dict[str, str] = {}
        self._appended, self._stop, self._appender = direct_drill.start_appender(workdir, seed, batch, 12 * files)

    def stop_input(self) -> None:
        self._stop.set()
        self._appender.join()

    def all_counted(self) -> bool:
        return direct_drill.all_counted(self.workdir, self._appended)

    def verify(self, runs: list[AppRun]) -> dict:
        result = direct_drill.verify(self.workdir, self._appended, runs)
        result["records_doubled"] = result["duplicates"]
        return result

    def close(self) -> None:
        self._stop.set()


WORKLOADS: dict[str, Any] = {"files": FileWorkload, "receiver": ReceiverWorkload, "direct": DirectWorkload}
