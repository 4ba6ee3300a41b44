"""Input streams: a queue of RDDs (tests, demos) and new files in a directory."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque

from pyspark import RDD
from pyspark.accumulators import AccumulatorParam

from sparkwal.base.times import batch_name
from sparkwal.wal import StorageLocation
from sparkwal.wal.storage import resolve

from . import config
from .dstream import DStream
from .errors import MissingInputError
from .stream_machinery import empty_rdd

log = logging.getLogger(__name__)


class InputDStream(DStream):
    """A stream with no parent; its slide is the batch duration."""

    receiver_based = False  # True: its data arrives as blocks tracked by the ReceivedBlockTracker
    input_id: int  # its place among the graph's inputs (DStreamGraph.add_input)

    def records_read(self, time_ms: int) -> int | None:
        """The records batch ``time_ms`` read from this input, known once its jobs are done, for
        an input that cannot count them when the batch is generated (None: it reported them)."""
        return None

    def __init__(self, ssc):
        super().__init__(ssc, [], ssc.driver.batch_ms)
        self.input_id = self._driver.graph.add_input(self)

    def renumber(self, input_id: int) -> None:
        """Take the id an upgrade gives (:meth:`DStreamGraph.renumber_inputs`)."""
        self.input_id = input_id

    def checkpoint_data(self) -> dict:
        """What recovery needs to regenerate this stream's RDDs (msgpack-serialisable)."""
        return {}

    def restore(self, data: dict) -> None:
        pass

    def check_inputs_present(self, times_ms: list[int], checkpoint_dir: str | None) -> None:
        """Raise :class:`MissingInputError` if a restart's batches ``times_ms`` would read again input
        of this stream that is no longer there (the directory in ``checkpoint_dir`` restarts)."""

    # coalesce_downtime (a restart's): receivers' blocks and direct ranges need nothing for it (a
    # batch takes what is unallocated, or unplanned, when it is generated); a file stream reaches
    # back (FileInputDStream._find_new_files)


class QueueInputDStream(InputDStream):
    """pyspark's ``queueStream``: one queued RDD per batch (or all of them), else ``default``."""

    #: The queued RDDs live in the driver that queued them: a recovered queue stream starts
    #: empty (Spark refuses to checkpoint queue streams at all).
    transient_fields = (*InputDStream.transient_fields, "_queue", "_default", "_queue_lock")

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._queue: deque = deque()
        self._queue_lock = threading.Lock()

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
        return self._default if self._default is not None else empty_rdd(self._sc)


def _is_local(directory: str) -> bool:
    return "://" not in directory or directory.startswith("file://")


def _list_files(directory: StorageLocation, on_empty=None) -> list[tuple[str, int]]:
    """(path or URL, modification time in whole ms) of the candidate files in ``directory`` (a
    path or any fsspec URL): regular files whose names do not start with "." or "_" (files being
    written). A missing directory has none (``on_empty()`` is called when there are none). Local
    files are named by path, others by URL."""
    storage, path = directory.resolve()
    try:
        infos = storage.list_files(path)
    except FileNotFoundError:
        infos = []
    if not infos and on_empty is not None:
        on_empty()
    local = _is_local(directory.url)
    return [(os.path.join(directory.url, i.name) if local else storage.url(i.path), i.mtime_ms or 0)
            for i in infos if not i.name.startswith((".", "_"))]


#: Hadoop's local block size: a larger file is split into several tasks by Hadoop's reader
PYTHON_READ_MAX_BYTES = 32 << 20
#: suffixes Hadoop's text reader decompresses (its codecs): such files are left to it
_CODEC_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


def _os_path(path: str) -> str:
    return resolve(path)[1]


def _read_in_python(path: str) -> bool:
    """Whether a local text file is read by a Python task of its own (:func:`_read_local_lines`)
    instead of Hadoop's reader: when it is neither compressed nor over a block. A Hadoop read
    costs a broadcast of its configuration per batch (20-100 ms to generate the batch here, a
    tenth of a second more when a takeover or a restart regenerates several) and passes every
    line from the JVM to Python; Python reads the same lines in the task that uses them."""
    try:
        return not path.endswith(_CODEC_SUFFIXES) and os.path.getsize(_os_path(path)) <= PYTHON_READ_MAX_BYTES
    except OSError:  # gone: Hadoop's reader names it in the batch's error
        return False


def _read_local_lines(path: str):
    """A local text file's lines as Spark's ``textFile`` gives them (Hadoop's LineRecordReader):
    a line ends at \\n, \\r or \\r\\n, a last line without an end is kept, a UTF-8 byte order mark
    at the start is skipped and bytes that are not UTF-8 are replaced by U+FFFD."""
    with open(_os_path(path), encoding="utf-8-sig", errors="replace", newline=None) as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def _read_remote(directory: StorageLocation, record_length: int | None):
    """The task function reading remote files through fsspec (Spark's JVM knows only its own
    Hadoop filesystems): lines of text, or fixed-length binary records. The directory's options
    travel with it, its credentials never (:class:`~sparkwal.wal.StorageLocation`)."""

    def read(url: str):
        storage, path = StorageLocation(url, directory.options, policy=directory.policy).resolve()
        data = storage.read_file(path)
        if record_length is not None:
            return [data[i:i + record_length] for i in range(0, len(data) - record_length + 1, record_length)]
        lines = data.decode("utf-8").split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline ending the last line (Hadoop's reader keeps an unterminated one)
        return [line[:-1] if line.endswith("\r") else line for line in lines]

    return read


class _LineCounts(AccumulatorParam):
    """``{(batch ms, partition): records}``, merged by the larger count: a partition computed
    again (a retried task, a second output operation) counts once."""

    def zero(self, value):
        return {}

    def addInPlace(self, value1, value2):
        for key, n in value2.items():
            if n > value1.get(key, -1):
                value1[key] = n
        return value1


def _counting(counts, time_ms: int):
    """The task function passing a partition's records on and counting them, once it was read
    to its end (an output that takes only the first records, as ``pprint`` does, counts none of
    a partition it did not finish)."""

    def count(index, records):
        n = 0
        for n, record in enumerate(records, 1):
            yield record
        counts.add({(time_ms, index): n})

    return count


class FileInputDStream(InputDStream):
    """New files in a directory, as lines of text or fixed-length binary records (Spark's
    FileInputDStream). Files are expected to appear atomically (written elsewhere, then moved
    in); names starting with "." or "_" are ignored. A batch at time t takes the files whose
    modification time is in (threshold, t] and that no earlier batch took, where threshold is
    max(start, t - remember) and remember is 60 s rounded up to whole batches.

    ``start`` is taken when the stream is created, as Spark does, not when the context starts,
    so a file that appears at any moment after the stream exists is read. A filesystem stamps
    files from a coarse clock that can lag this process's clock (a jiffy on Linux, a second on
    object stores, two on FAT), so ``start`` is the creation time less ``MTIME_SLACK_MS``, and
    the files already there at creation with a modification time inside that slack are
    remembered by (path, mtime) and skipped: old files are ignored exactly, new ones never
    lost. With ``new_files_only=False`` start is 0: files already there when a fresh context
    starts are taken too, within the remember window. A file is never taken twice: each batch's
    files are remembered until they fall out of the remember window, and the files of each
    batch are recovery data, so a re-run batch after a restart reads exactly the same files.

    Unlike Spark's (whose page shows 0 records for a file stream), a batch's records are the
    lines its jobs read, counted by the tasks as they read them (:meth:`records_read`): no other
    job, no read of its own."""

    MIN_REMEMBER_MS = 60_000
    location: StorageLocation | None = None  # the directory, its options (streams pickled before it)
    MTIME_SLACK_MS = 2_000
    transient_fields = (*InputDStream.transient_fields, "_files_lock", "_counts", "_missing_said_ms")
    MISSING_WARN_MS = 60_000  # a missing directory is said again at most this often

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._files_lock = threading.Lock()
        self._counts = None
        self.__dict__.setdefault("_restored_times", set())
        older_options = self.__dict__.pop("storage_options", None)
        if self.location is None:  # pickled by an older sparkwal: the directory and its options
            self.location = StorageLocation(self.directory, older_options)

    @property
    def storage_options(self) -> dict | None:
        return self.location.options

    def __init__(self, ssc, directory: str, new_files_only: bool = True, record_length: int | None = None,
                 storage_options: dict | None = None):
        super().__init__(ssc)
        self.directory = directory
        self.location = StorageLocation.of(directory, storage_options)  # pickled without credentials
        self.new_files_only = new_files_only
        self.record_length = record_length  # None: lines of text; else fixed-length binary records
        self.batch_files: dict[int, list[str]] = {}
        self._restored_times: set[int] = set()  # batch times whose files a restored checkpoint named
        self._recent: set[str] = set()
        self._files_lock = threading.Lock()
        self._counts = None  # the accumulator of the lines each batch's tasks read
        self._start_threshold_ms = 0
        self._present_at_start: set[tuple[str, int]] = set()  # old files inside the slack
        # a file is taken only within this window of its batch time: spark.streaming.fileStream.
        # minRememberDuration, else spark.streaming.minRememberDuration, else 60 s (Spark's
        # FileInputDStream.scala); a job that may be down longer and must count the files that arrived
        # meanwhile raises it
        self.min_remember_ms = self._driver.settings[config.FILE_MIN_REMEMBER]
        if new_files_only:
            self._start_threshold_ms = self._driver.clock.now_ms() - self.MTIME_SLACK_MS
            self._present_at_start = {(path, mtime) for path, mtime in _list_files(self.location)
                                      if mtime > self._start_threshold_ms}

    @property
    def remember_files_ms(self) -> int:
        least = getattr(self, "min_remember_ms", self.MIN_REMEMBER_MS)  # streams pickled before it
        return -(-least // self.slide_ms) * self.slide_ms

    def initialize(self, zero_time_ms: int) -> None:
        super().initialize(zero_time_ms)
        self.remember_ms = max(self.remember_ms, self.remember_files_ms)

    def _find_new_files(self, time_ms: int) -> list[str]:
        """After a coalesced downtime, the first new batch takes the files modified since the last
        batch before it (the missed batches'), even those older than the remember window, which it
        would otherwise not look back to."""
        threshold = max(self._start_threshold_ms, time_ms - self.remember_files_ms)
        last = self.downtimes.get(time_ms)
        if last is not None:
            threshold = max(self._start_threshold_ms, min(threshold, last))
        return sorted(path for path, mtime in _list_files(self.location, self._listed_nothing)
                      if threshold < mtime <= time_ms and path not in self._recent
                      and (path, mtime) not in self._present_at_start)

    def _listed_nothing(self) -> None:
        """pyspark.streaming is silent about a local directory that does not exist (a typo reads as "no
        new files"): one warning naming it, again at most once a minute while it is missing. (An object
        store's prefix with nothing under it is not missing: nothing is said.)"""
        url, said = self.location.url, getattr(self, "_missing_said_ms", None)
        now = self._driver.clock.now_ms()
        if ("://" in url and not url.startswith("file://")) or (said is not None and now - said < self.MISSING_WARN_MS):
            return
        path = os.path.abspath(url.removeprefix("file://"))
        if not os.path.isdir(path):
            self._missing_said_ms = now
            log.warning("file stream %d: the directory %s does not exist: its batches are empty until it appears",
                        self.input_id, path)

    def compute(self, time_ms: int) -> RDD | None:
        with self._files_lock:
            files = self.batch_files.get(time_ms)
            if files is None:
                files = self._find_new_files(time_ms)
                self.batch_files[time_ms] = files
                self._recent.update(files)
        if files and time_ms in self._restored_times:  # read by the run that wrote the checkpoint: still there?
            self._refuse_missing(self._missing(files), None, time_ms)
            self._restored_times.discard(time_ms)
        # the records are counted as the tasks read them (records_read): 0 until then
        self._driver.scheduler.report_input(time_ms, self, 0, {"files": files})
        if not files:
            return empty_rdd(self._sc)
        if self._counts is None:
            self._counts = self._sc.accumulator({}, _LineCounts())
        return self._read(files).mapPartitionsWithIndex(_counting(self._counts, time_ms),
                                                        preservesPartitioning=True)

    def check_inputs_present(self, times_ms: list[int], checkpoint_dir: str | None) -> None:
        """The files batches ``times_ms`` took (re-run, they read the same) must still be there: a checkpoint
        copy does not carry them, and a relative directory is read from where the program runs. A batch
        computed again for a state's lineage checks its own in :meth:`compute`."""
        self._refuse_missing(self._missing([f for t in times_ms for f in self.batch_files.get(t, [])]),
                             checkpoint_dir)

    def _missing(self, files: list[str]) -> list[str]:
        """The recorded ``files`` that are not there, looked for as :meth:`_read` reads them (a path
        from where the program runs, or a URL with the stream's storage options)."""
        gone = []
        for f in files:
            if "://" in f and not f.startswith("file://"):
                storage, path = StorageLocation(f, self.location.options).resolve()
                there = storage.exists(path)
            else:
                there = os.path.exists(os.path.abspath(f.removeprefix("file://")))
            if not there:
                gone.append(f)
        return gone

    def _refuse_missing(self, missing: list[str], checkpoint_dir: str | None, time_ms: int | None = None) -> None:
        if not missing:
            return
        first = missing[0]
        where = first.rpartition("/")[0] if "://" in first else os.path.dirname(os.path.abspath(first))
        shown = ", ".join(os.path.basename(f) for f in missing[:3]) + (", ..." if len(missing) > 3 else "")
        read_from = getattr(self, "_read_from", None)
        raise MissingInputError(
            f"the restart{f' from {checkpoint_dir}' if checkpoint_dir else ''} re-reads {len(missing)} file(s) of "
            f"stream {self.input_id}{f' in {batch_name(time_ms)}' if time_ms is not None else ''} that are not in "
            f"{where}: {shown}"
            + (f" (the checkpoint's program read them from {read_from})" if read_from and read_from != where else "")
            + "; a checkpoint copy does not carry a file stream's input files: copy them along into that directory")

    def records_read(self, time_ms: int) -> int | None:
        if self._counts is None:
            return 0
        counts = self._counts.value  # the accumulator's own dict, added to in place as tasks report
        n = 0
        # this batch's counts, and strays of older ones (a partition computed again for a later
        # batch, from the state's lineage)
        for key in [k for k in list(counts) if k[0] <= time_ms]:
            value = counts.pop(key, 0)
            if key[0] == time_ms:
                n += value
        return n

    def _read(self, files: list[str]) -> RDD:
        if not _is_local(self.directory):
            return self._sc.parallelize(files, len(files)).flatMap(
                _read_remote(self.location, self.record_length))
        # a relative directory is the driver's: the Python workers run in another working directory
        files = [f if "://" in f else os.path.abspath(f) for f in files]
        if self.record_length is not None:  # Hadoop's new API: a split per block of each file
            return self._sc.binaryRecords(",".join(files), self.record_length)
        small: list[str] = []
        large: list[str] = []
        for f in files:
            (small if _read_in_python(f) else large).append(f)
        rdds = [self._sc.parallelize(small, len(small)).flatMap(_read_local_lines)] if small else []
        if large:  # a split per block, as Spark's FileInputDStream reads (textFile's default,
            rdds.append(self._sc.textFile(",".join(large), minPartitions=1))  # 2, halves a file)
        return rdds[0] if len(rdds) == 1 else self._sc.union(rdds)

    def clear_metadata(self, time_ms: int) -> None:
        super().clear_metadata(time_ms)
        with self._files_lock:
            forget = time_ms - self.remember_files_ms
            for t in [t for t in self.batch_files if t <= forget]:
                self._recent.difference_update(self.batch_files.pop(t))
            self._present_at_start = {(p, m) for p, m in self._present_at_start if m > forget}

    def checkpoint_data(self) -> dict:
        with self._files_lock:
            url = self.location.url
            return {"batch_files": {str(t): list(f) for t, f in self.batch_files.items()},
                    "read_from": url if "://" in url else os.path.abspath(url),
                    "start_threshold_ms": self._start_threshold_ms,
                    "present_at_start": sorted([p, m] for p, m in self._present_at_start)}

    def restore(self, data: dict) -> None:
        with self._files_lock:
            self.batch_files = {int(t): list(f) for t, f in data.get("batch_files", {}).items()}
            self._restored_times = set(self.batch_files)
            self._read_from = data.get("read_from")  # (absent from checkpoints written before it)
            self._recent = {f for files in self.batch_files.values() for f in files}
            self._start_threshold_ms = data.get("start_threshold_ms") or 0
            self._present_at_start = {(p, m) for p, m in data.get("present_at_start", [])}
