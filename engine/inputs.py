"""Input streams: a queue of RDDs (tests, demos) and new files in a directory."""

from __future__ import annotations

import os
import threading
from collections import deque

from pyspark import RDD

from .dstream import DStream


class InputDStream(DStream):
    """A stream with no parent; its slide is the batch duration."""

    receiver_based = False  # True: its data arrives as blocks tracked by the ReceivedBlockTracker

    def __init__(self, ssc):
        super().__init__(ssc, [], ssc._batch_ms)
        ssc._graph.add_input(self)

    def checkpoint_data(self) -> dict:
        """What recovery needs to regenerate this stream's RDDs (msgpack-serialisable)."""
        return {}

    def restore(self, data: dict) -> None:
        pass


class QueueInputDStream(InputDStream):
    """pyspark's ``queueStream``: one queued RDD per batch (or all of them), else ``default``."""

    def __init__(self, ssc, rdds: list[RDD], one_at_a_time: bool, default: RDD | None):
        super().__init__(ssc)
        self._queue = deque(rdds)
        self._queue_lock = threading.Lock()
        self._one = one_at_a_time
        self._default = default

    def compute(self, time_ms: int) -> RDD | None:
        with self._queue_lock:
            if self._one and self._queue:
                batch = [self._queue.popleft()]
            else:
                batch, self._queue = list(self._queue), deque()
        if batch:
            return batch[0] if self._one else self._sc.union(batch)
        return self._default if self._default is not None else self._sc.emptyRDD()


class FileInputDStream(InputDStream):
    """New files in a directory, as lines of text or fixed-length binary records (Spark's
    FileInputDStream): a batch at time t takes the files whose modification time is in
    (max(start, t - remember), t] and that no earlier batch took (``start`` is 0 with
    ``new_files_only=False``: files already there when a fresh context starts are taken too,
    within the remember window of 60 s). Files are expected to appear atomically (written elsewhere, then moved in); names starting with
    "." or "_" are ignored. The files of each batch are recovery data, so a re-run batch after a
    restart reads exactly the same files."""

    MIN_REMEMBER_MS = 60_000

    def __init__(self, ssc, directory: str, new_files_only: bool = True, record_length: int | None = None):
        super().__init__(ssc)
        self.directory = directory
        self.new_files_only = new_files_only
        self.record_length = record_length  # None: lines of text; else fixed-length binary records
        self.batch_files: dict[int, list[str]] = {}
        self._recent: set[str] = set()
        self._start_threshold_ms: int | None = None
        self._files_lock = threading.Lock()

    @property
    def remember_files_ms(self) -> int:
        return -(-self.MIN_REMEMBER_MS // self.slide_ms) * self.slide_ms

    def _initialize(self, zero_time_ms: int) -> None:
        super()._initialize(zero_time_ms)
        if self._start_threshold_ms is None:  # a fresh start (not restored from a checkpoint)
            self._start_threshold_ms = self._ssc._clock.now_ms() if self.new_files_only else 0
        self.remember_ms = max(self.remember_ms, self.remember_files_ms)

    def _find_new_files(self, time_ms: int) -> list[str]:
        threshold = max(self._start_threshold_ms, time_ms - self.remember_files_ms)
        found = []
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        for e in entries:
            if e.name.startswith((".", "_")) or not e.is_file():
                continue
            mtime = int(e.stat().st_mtime * 1000)
            if threshold < mtime <= time_ms and e.path not in self._recent:
                found.append(e.path)
        return sorted(found)

    def compute(self, time_ms: int) -> RDD | None:
        with self._files_lock:
            files = self.batch_files.get(time_ms)
            if files is None:
                files = self._find_new_files(time_ms)
                self.batch_files[time_ms] = files
                self._recent.update(files)
        # like Spark, a file stream reports 0 records (counting lines would need another job)
        self._ssc._report_input(time_ms, self, 0, {"files": files})
        if not files:
            return self._sc.emptyRDD()
        if self.record_length is not None:
            return self._sc.binaryRecords(",".join(files), self.record_length)
        return self._sc.textFile(",".join(files))

    def clear_metadata(self, time_ms: int) -> None:
        super().clear_metadata(time_ms)
        with self._files_lock:
            for t in [t for t in self.batch_files if t <= time_ms - self.remember_files_ms]:
                self._recent.difference_update(self.batch_files.pop(t))

    def checkpoint_data(self) -> dict:
        with self._files_lock:
            return {"batch_files": {str(t): list(f) for t, f in self.batch_files.items()},
                    "start_threshold_ms": self._start_threshold_ms}

    def restore(self, data: dict) -> None:
        with self._files_lock:
            self.batch_files = {int(t): list(f) for t, f in data.get("batch_files", {}).items()}
            self._recent = {f for files in self.batch_files.values() for f in files}
            self._start_threshold_ms = data.get("start_threshold_ms")
