"""The files a batch's tasks write for :class:`~sparkwal.engine.sinks.IcebergSink`.

Per task attempt of partition ``<task>`` (5 digits) in batch ``<t>`` (ms), named by ``<stem>`` =
``<t>-<batch attempt>-<task>-<task attempt>`` (as the Delta sink's: a retried or speculative copy
of a task, or the same task under another driver, never shares a name with another run), under
the table's location:

* ``_sparkwal/<sink name>/<stem>.json``: ``{"files": [URL, ...], "ends": [[topic, partition,
  offset], ...]}``, the data files the attempt is about to write, put before any of them, so that
  nothing it writes goes unrecorded (Iceberg readers only ever see the files a snapshot lists; this
  directory is not one of them), and the end of each range with records its batch read: a clean-up
  takes an attempt's files only once the table's output has passed them (``delta_files.settled``);
* append: the data files themselves, named and placed by pyiceberg (its location provider and
  writer: ``<location>/data/[<partition path>/]00000-<n>-<uuid>.parquet``, the table's schema with
  its field ids, the statistics of each file's manifest entry); upsert: one staging file
  ``_sparkwal/<sink name>/staging/<stem>.parquet``, the rows whole.

An upsert's data files are written by the driver, inside the commit (pyiceberg's upsert: the rows
it inserts, and the files its copy-on-write rewrites): each is recorded the same way just before
pyiceberg writes it, as ``_sparkwal/<sink name>/<t>-<batch attempt>-driver-<random>.json`` naming
that one file (:func:`commit_file_io`), so that a commit the catalog refused, or a driver killed
before its commit, leaves no file that nothing names.

Each file is created whole and durable through the storage seam (:mod:`sparkwal.wal`: retries,
``fsync``, the executors' own credentials), only if absent, before the task returns its
pyiceberg ``DataFile`` (append) or the staging file's URL (upsert) to the driver.
"""

from __future__ import annotations

import io
import json
import logging
import uuid

from .delta_files import RECORDS_DIR, rows_table, task_attempt_id

log = logging.getLogger(__name__)


def write_partition(index, rows, location, metadata, name, batch_time_ms, staging, attempt, ends=()):
    """Task side: this partition's rows as data files of the table whose metadata (pyiceberg's
    ``TableMetadata``) is ``metadata``, at ``location`` (the table's, without credentials), their
    names recorded first; yields a pyiceberg ``DataFile`` per file, or ``{"staged": url}``."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    table = rows_table(list(rows), schema_to_pyarrow(metadata.schema(), include_field_ids=False))
    if table.num_rows == 0:
        return
    storage, root = location.resolve()
    stem = f"{batch_time_ms}-{attempt}-{index:05d}-{task_attempt_id()}"
    records_dir = storage.join(root, f"{RECORDS_DIR}/{name}")
    storage.makedirs(records_dir)
    if staging:
        url = f"{location.url}/{RECORDS_DIR}/{name}/staging/{stem}.parquet"
        _put(storage, records_dir, stem, [url], ends)
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        path = storage.join(root, f"{RECORDS_DIR}/{name}/staging/{stem}.parquet")
        storage.makedirs(path.rsplit("/", 1)[0])
        _create(storage, path, buffer.getvalue())
        yield {"staged": url}
        return
    tasks, planned = _write_tasks(metadata, table)
    _put(storage, records_dir, stem, planned, ends)
    from pyiceberg.io.pyarrow import write_file

    yield from write_file(seam_file_io(location, planned), metadata, iter(tasks))


def _write_tasks(metadata, table):
    """pyiceberg's write tasks for ``table`` (its rows split by the table's partition spec, then
    into files of the table's target size) and the URL each will be written to: what pyiceberg's
    own append does (``_dataframe_to_data_files``), the names known before the first byte."""
    import pyiceberg.io.pyarrow as pyiceberg_arrow
    from pyiceberg.io.pyarrow import bin_pack_arrow_table, pyarrow_to_schema
    from pyiceberg.table import TableProperties, WriteTask
    from pyiceberg.table.locations import load_location_provider
    from pyiceberg.utils.properties import property_as_int

    target = property_as_int(metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
                             TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT)
    schema = pyarrow_to_schema(table.schema, name_mapping=metadata.schema().name_mapping,
                               format_version=metadata.format_version)
    write_uuid = uuid.uuid4()
    if metadata.spec().is_unpartitioned():
        parts = [(None, table)]
    else:
        parts = [(p.partition_key, p.arrow_table_partition)
                 for p in pyiceberg_arrow._determine_partitions(metadata.spec(), metadata.schema(), table)]
    tasks = [WriteTask(write_uuid=write_uuid, task_id=n, record_batches=batches, schema=schema, partition_key=key)
             for n, (key, batches) in enumerate((key, b) for key, part in parts
                                                for b in bin_pack_arrow_table(part, target))]
    provider = load_location_provider(metadata.location, metadata.properties)
    planned = [provider.new_data_location(t.generate_data_file_filename("parquet"), t.partition_key) for t in tasks]
    return tasks, planned


def staged_rows(location, schema, staged: list[str], keys: list[str]):
    """The staged rows of an upsert (the files ``staged`` under ``location``), in the table's Arrow
    schema (of pyiceberg's ``schema``), a key repeated within the batch once, its last row winning
    (the stream's order: partition, then row), as pyiceberg's upsert refuses repeated keys (on the
    driver: it matches them against the table in memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    storage, _ = location.resolve()
    parts = [pq.read_table(pa.BufferReader(storage.read_file(relative_to(location, url)))) for url in staged]
    rows = pa.concat_tables([p.cast(arrow_schema) for p in parts]) if parts else arrow_schema.empty_table()
    if rows.num_rows == 0:
        return rows
    numbered = rows.append_column("__row", pa.array(range(rows.num_rows), pa.int64()))
    last = numbered.group_by(keys).aggregate([("__row", "max")]).column("__row_max")
    return rows.take(last)


def commit_file_io(io, location=None, name: str = "", batch_time_ms: int = 0, attempt: str = "", ends=()):
    """The driver's ``FileIO`` for the sink's commit: ``io`` (the table's) with its deletes held in
    ``deferred``: done by ``delete_deferred()`` after a commit that succeeded, never after a conflict
    (``drop_deferred()``). pyiceberg deletes a commit's manifests whenever the catalog answers
    ``CommitFailedException``, which a catalog whose transport retried a commit that landed answers
    too: the table would list deleted files. With ``location`` (an upsert's), each data file
    (``.parquet``: pyiceberg's manifests and metadata are not) is recorded before it is written, as
    attempt ``attempt`` of batch ``batch_time_ms`` (the module's docstring)."""
    from pyiceberg.io import FileIO

    if location is not None:
        storage, root = location.resolve()
        records_dir = storage.join(root, f"{RECORDS_DIR}/{name}")

    class CommitFileIO(FileIO):
        def __init__(self):
            super().__init__(io.properties)
            self.deferred: list[str] = []

        def new_output(self, url: str):
            if location is not None and url.endswith(".parquet"):
                relative_to(location, url)  # (a data file elsewhere is refused before it is written)
                storage.makedirs(records_dir)
                _put(storage, records_dir, f"{batch_time_ms}-{attempt}-driver-{uuid.uuid4().hex[:12]}", [url], ends)
            return io.new_output(url)

        def new_input(self, url: str):
            return io.new_input(url)

        def delete(self, url) -> None:
            self.deferred.append(url if isinstance(url, str) else url.location)

        def drop_deferred(self) -> None:
            """The deletes held back, never done (a conflict: the commit may have landed, and a
            later commit list its manifests even once its own snapshot expired): files no snapshot
            lists, or one does; Iceberg's orphan-file removal tells them apart."""
            if self.deferred:
                log.info("%d manifest files of an Iceberg commit answered by a conflict are left to orphan-file "
                         "removal", len(self.deferred))
            self.deferred = []

        def delete_deferred(self) -> None:
            """The deletes held back, done, after a commit that succeeded (pyiceberg deletes only
            what it left out: earlier tries' manifests, old metadata files)."""
            deferred, self.deferred = self.deferred, []
            for url in deferred:
                try:
                    io.delete(url)
                except Exception:  # noqa: BLE001  (a manifest left: invisible; orphan-file removal takes it)
                    log.warning("an uncommitted Iceberg manifest was not deleted: %s", url, exc_info=True)

    return CommitFileIO()


def _put(storage, records_dir: str, stem: str, files: list[str], ends) -> None:
    record = {"files": files, "ends": [list(e) for e in ends]}
    _create(storage, storage.join(records_dir, f"{stem}.json"), json.dumps(record).encode())


def staged(location, name: str, url: str) -> bool:
    """Whether ``url`` is an upsert's staged rows (never a file of the table)."""
    return url.startswith(f"{location.url.rstrip('/')}/{RECORDS_DIR}/{name}/staging/")


class HeldFiles:
    """The data files the table holds, read as little as a clean-up needs: the files added by the
    sink's snapshots of one batch time (``written``: batch time -> the sink's snapshots; their
    manifests), and, for a file not among them, every file any snapshot in the table's metadata
    lists (:meth:`everywhere`: its branches', tags' and expired ancestors' files are held too; read
    once)."""

    def __init__(self, table, written: dict[int, list]):
        self.table, self.written = table, written
        self.by_batch: dict[int, set[str]] = {}
        self._everywhere: set[str] | None = None

    def of_batch(self, batch_time_ms: int) -> set[str]:
        table = self.table
        if batch_time_ms not in self.by_batch:
            self.by_batch[batch_time_ms] = {
                e.data_file.file_path for s in self.written.get(batch_time_ms, ()) for m in s.manifests(table.io)
                if m.added_snapshot_id == s.snapshot_id for e in m.fetch_manifest_entry(table.io)}
        return self.by_batch[batch_time_ms]

    def everywhere(self) -> set[str]:
        if self._everywhere is None:
            table = self.table
            manifests = {m.manifest_path: m for s in table.metadata.snapshots for m in s.manifests(table.io)}
            self._everywhere = {e.data_file.file_path for m in manifests.values()
                                for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}
        return self._everywhere


def _create(storage, path: str, data: bytes) -> None:
    if not storage.put_if_absent(path, data):
        raise FileExistsError(f"{path} exists already: an Iceberg sink's file is never replaced")


def relative_to(location, url: str) -> str:
    """``url`` (a file under the table) as a path inside ``location``'s storage; an error if it
    is elsewhere (a table whose data path is not under its location)."""
    base = location.url.rstrip("/") + "/"
    if not url.startswith(base):
        raise ValueError(f"{url} is not under the table's location {location.url}: IcebergSink writes data "
                         "files under the table's location only (no write.data.path elsewhere)")
    storage, root = location.resolve()
    return storage.join(root, url[len(base):])


def seam_file_io(location, planned: list[str]):
    """pyiceberg's ``FileIO`` for the tasks' data files, on sparkwal's storage seam: each file
    created whole, durable and only if absent; only the files the task recorded (a name pyiceberg
    chose differently would be a file no record names: refused). (Its classes are made at the first
    call: pyiceberg is an extra, imported only where an Iceberg sink runs.)"""
    global _SEAM_CLASSES
    if _SEAM_CLASSES is None:
        _SEAM_CLASSES = _seam_classes()
    return _SEAM_CLASSES(location, planned)


_SEAM_CLASSES = None


def _seam_classes():
    from pyiceberg.io import FileIO, OutputFile

    class SeamFileIO(FileIO):
        def __init__(self, location, planned: list[str]):
            super().__init__({})
            self.location, self.planned = location, set(planned)

        def new_output(self, location: str):
            if location not in self.planned:
                raise RuntimeError(f"pyiceberg names a data file the task did not record: {location}")
            return SeamOutputFile(location, relative_to(self.location, location), self.location.resolve()[0])

        def new_input(self, location: str):
            raise NotImplementedError("the tasks only write")

        def delete(self, location) -> None:
            raise NotImplementedError("the tasks only write")

    class SeamOutputFile(OutputFile):
        def __init__(self, url: str, path: str, storage):
            super().__init__(url)
            self._path, self._storage, self._size = path, storage, 0

        def __len__(self) -> int:
            return self._size

        def exists(self) -> bool:
            return self._storage.exists(self._path)

        def to_input_file(self):
            raise NotImplementedError("the tasks only write")

        def create(self, overwrite: bool = False):
            return _SeamStream(self._storage, self._path, self._written)

        def _written(self, size: int) -> None:
            self._size = size

    return SeamFileIO


class _SeamStream(io.BytesIO):
    """The file's bytes in memory until it is closed: then created in one call (``written(size)``
    told once it is)."""

    def __init__(self, storage, path: str, written):
        super().__init__()
        self._storage, self._path, self._tell_written, self._done = storage, path, written, False

    def close(self) -> None:
        if not self._done and not self.closed:
            self._done = True
            data = self.getvalue()
            self._storage.makedirs(self._path.rsplit("/", 1)[0])
            _create(self._storage, self._path, data)
            self._tell_written(len(data))
        super().close()
