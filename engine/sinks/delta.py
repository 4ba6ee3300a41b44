"""Exactly-once output into a Delta Lake table, through delta-rs (the ``deltalake`` package).

Each batch (time ``t``, the offset ranges ``R`` its direct stream read) goes in as ONE Delta
transaction that carries the batch's identity, written by the executors and committed by the driver:

1. The driver reads the sink's offsets in the table (the ``commitInfo`` of its newest commit,
   found from its application transaction ``txn``, appId = the sink's name) and decides by them,
   never by the batch time (an old driver on another batch grid, a clock behind the table's):
   if every range of ``R`` that read records ends where the table's output of its partition
   ends, the batch is in the table already (a re-run after a crash between the Delta commit and
   the stream's checkpoint): nothing is written. If each starts there (or its partition has no
   output yet), the batch is written. Anything else (partly in, or an output ending elsewhere)
   is a :class:`SinkOffsetsError` naming the partition and both offsets; an output ending beyond
   every range means a later batch is in, and outputs go in batch order: in. Where offsets cannot
   tell, the ``txn``: a batch that read no records (a window's output) is in iff the ``txn``
   version is ``t`` or later; over a history without the sink's newest commit (gone with log
   retention) a batch is in iff the ``txn`` version is ``t`` (it is that commit), and a batch
   with records is refused otherwise.
2. Each task writes its partition's rows as Parquet files with pyarrow under the table, their
   names recorded first (files and records: :mod:`sparkwal.engine.sinks.delta_files`). Only the
   files' add actions (path, size, statistics) come back to the driver: a batch's output never
   passes through it, whatever ``spark.driver.maxResultSize`` is.
3. The driver commits the add actions with ``txn(appId=name, version=t)`` (the record Spark's own
   Delta sink writes: Spark and Databricks readers see the stream's progress) and, in the
   commit's ``commitInfo``, ``sparkwal.sink``, ``sparkwal.batchTimeMs`` and ``sparkwal.offsets``
   (the end offset of every partition the sink's batches planned, records or not: JSON
   ``[[topic, partition, offset], ...]``), from which :meth:`DeltaSink.offsets` resumes a direct
   stream without a checkpoint. A commit conflict re-reads the table and decides again.
   delta-rs itself would commit the same ``txn`` version twice (its issues 2580, 3821): step 1
   keeps a batch from going in twice.
4. Then the files recorded for batches up to ``t`` that the table does not hold (an attempt that
   never committed: a killed task, a killed driver) are deleted, and their records.

``mode="merge"`` (keyed results, upsert by ``keys``): the tasks write the rows to staging files
instead, and the driver's transaction is delta-rs's MERGE of those files into the table
(streamed from them, not collected), with the same ``txn``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from urllib.parse import unquote

from sparkwal.wal import StorageUnavailableError, retry
from sparkwal.wal.location import StorageLocation, without_credentials

from ..driver_rows import on_executors
from ..sources.protocol import OffsetRange, SinkOffsets, TopicPartition
from .delta_files import RECORDS_DIR, add_action, delete_settled, records_up_to, write_partition
from .transactional import SinkOffsetsError, advance_ends, batch_in_output, save_batches

log = logging.getLogger(__name__)

MODES = ("append", "merge")
_COMMIT_ATTEMPTS = 5


def _deltalake():
    try:
        import deltalake
    except ImportError as e:  # pragma: no cover - the test extra has it
        raise ImportError("DeltaSink needs the deltalake package: pip install 'sparkwal[delta]'") from e
    return deltalake


class DeltaSink:
    """Exactly-once output of a direct stream's batches into the Delta table at ``table_uri``.

    ``name``: the stream's identity in the table (its ``txnAppId``); ``schema``: a pyarrow
    schema, needed when the table does not exist yet (it is then created); ``partition_by``: its
    partition columns; ``mode``: ``"append"`` or ``"merge"`` (upsert by ``keys``);
    ``storage_options``: fsspec's, as everywhere in sparkwal (the tasks get them without
    credentials: executors take those from their environment); delta-rs's own are derived from
    them for S3 (:func:`delta_rs_options`), and ``delta_storage_options`` adds to or overrides
    them. Rows are dicts or tuples in the schema's column order."""

    def __init__(self, table_uri: str, name: str = "sparkwal", *, schema=None, mode: str = "append",
                 keys: Sequence[str] | None = None, partition_by: Sequence[str] | None = None,
                 storage_options: Mapping | None = None, delta_storage_options: Mapping[str, str] | None = None):
        if not isinstance(table_uri, str) or not table_uri:
            raise ValueError(f"table_uri must be a non-empty string, got {table_uri!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "merge" and not keys:
            raise ValueError("mode='merge' needs keys: the columns a row is matched by")
        self._uri = table_uri.rstrip("/")  # as given: a relative path stays relative (see table_uri)
        self.name, self.mode = name, mode
        self.keys = list(keys or [])
        self.partition_by = list(partition_by or [])
        self._storage_options = dict(storage_options) if storage_options else None
        self._delta_options = {**delta_rs_options(self.table_uri, storage_options), **(delta_storage_options or {})}
        if "://" in self.table_uri and not self.table_uri.startswith("file://"):
            # delta-rs retries an object store's calls for 3 minutes: the storage seam's deadline instead
            self._delta_options.setdefault("retry_timeout", f"{retry.default_policy().deadline_s:g}s")
        self._schema = schema
        #: (table version, txn version, the sink's offsets): as read at that version (or as this
        #: sink committed after it: the commits after that version are read again)
        self._known: tuple[int, int, dict[TopicPartition, int]] | None = None

    def __getstate__(self) -> dict:
        """Pickled into checkpoints with the output: no cached reads, no credentials."""
        state = self.__dict__.copy()
        state["_known"] = None
        state["_delta_options"] = without_credentials(self._delta_options) or {}
        state["_storage_options"] = without_credentials(self._storage_options)
        return state

    @property
    def table_uri(self) -> str:
        """The table's URL; a local path absolute from the driver's working directory now (the
        executors' differ), so that a program recovered in a copy of its work directory writes
        to the copy's table, never to the original's."""
        return self._uri if "://" in self._uri else os.path.abspath(self._uri)

    @property
    def location(self) -> StorageLocation:
        """The table's location for the tasks (pickled without credentials)."""
        return StorageLocation.of(self.table_uri, self._storage_options)

    @property
    def storage_options(self) -> dict:
        """delta-rs's storage options (the driver's: credentials included)."""
        return self._delta_options or None

    # ------------------------------------------------------------------ the table

    def table(self):
        """The table (a ``deltalake.DeltaTable``) at its newest version; None if it does not exist."""
        deltalake = _deltalake()
        with self._storage_call("read table"):
            if not deltalake.DeltaTable.is_deltatable(self.table_uri, self.storage_options):
                return None
            return deltalake.DeltaTable(self.table_uri, storage_options=self.storage_options)

    @contextmanager
    def _storage_call(self, operation: str):
        """delta-rs's I/O errors (after its retries) as the storage seam's: the store is unavailable."""
        from deltalake.exceptions import DeltaError

        start = time.monotonic()
        try:
            yield
        except (OSError, DeltaError) as e:
            if isinstance(e, DeltaError) and "interacting with object store" not in str(e):
                raise  # the table's own errors (a conflict, a schema mismatch) are not the store's
            raise StorageUnavailableError(f"Delta {operation}", self.table_uri, 1, time.monotonic() - start, e) from e

    def schema(self):
        """The rows' pyarrow schema: the table's, else the one given (the table is created with it)."""
        import pyarrow as pa

        table = self.table()
        if table is not None:
            return pa.schema(table.schema().to_arrow())
        if self._schema is None:
            raise ValueError(f"{self.table_uri} is not a Delta table yet: give DeltaSink a schema to create it")
        return self._schema

    def _create_table(self):
        deltalake = _deltalake()
        table = self.table()
        if table is None:
            deltalake.DeltaTable.create(self.table_uri, self.schema(), partition_by=self.partition_by or None,
                                        mode="ignore", storage_options=self.storage_options)
            table = self.table()
        return table

    def committed_batch(self) -> int | None:
        """The time of the sink's newest batch in the table (its ``txn`` version), or None."""
        table = self.table()
        return None if table is None else table.transaction_version(self.name)

    def batches_committed(self) -> int:
        """How many batches the sink committed to the table (in its history)."""
        table = self.table()
        if table is None:
            return 0
        with self._storage_call("history"):
            return sum(1 for c in table.history() if c.get("sparkwal.sink") == self.name)

    def offsets(self) -> SinkOffsets:
        """The end offset of every partition the table's output reached (every partition the
        sink's batches planned): ``directStream(fromOffsets=...)``; empty if the sink never
        committed."""
        table = self.table()
        if table is None:
            return SinkOffsets()
        ends = self._read_ends(table)
        if ends is None:
            raise self._history_lost(table)
        return SinkOffsets(ends)

    def _history_lost(self, table, batch_time_ms: int | None = None) -> SinkOffsetsError:
        """Where the table's output ended is unknown: no batch can be decided or committed."""
        batch = "" if batch_time_ms is None else f": whether batch {batch_time_ms} is in cannot be decided"
        return SinkOffsetsError(
            f"{self.table_uri}: the commit of batch {self._txn(table)} (the txn of "
            f"{self.name!r}) is not in the table's history with its offsets (written by another writer, "
            f"or removed by log retention){batch}; start the stream with explicit fromOffsets, under a "
            "new sink name")

    def _read_ends(self, table) -> dict[TopicPartition, int] | None:
        """The offsets in the commitInfo of the sink's newest commit, which must be the batch of
        its ``txn``; {} if it never committed; None if that commit is not in the history with
        them. Only the commits since the last read are read (the history is read whole once)."""
        version, known = table.version(), self._known
        if known is not None and known[0] == version:
            return known[2]
        txn = self._txn(table)
        if txn is None:
            return {}
        since = version - known[0] if known is not None and known[1] == txn and known[0] < version else None
        with self._storage_call("history"):
            commits = table.history(since)
        ends = known[2] if since is not None else None
        for commit in commits:
            if commit.get("sparkwal.sink") == self.name:
                ends = None
                if str(commit.get("sparkwal.batchTimeMs")) == str(txn) and "sparkwal.offsets" in commit:
                    ends = {TopicPartition(t, p): int(o) for t, p, o in json.loads(commit["sparkwal.offsets"])}
                break
        if ends is not None:
            self._known = (version, txn, ends)
        return ends

    def _txn(self, table) -> int | None:
        with self._storage_call("read table"):  # delta-rs reads the log for it
            return table.transaction_version(self.name)

    # ------------------------------------------------------------------ one batch

    def saveStream(self, dstream, offsetsFrom) -> None:
        """Each batch of ``dstream`` (rows) into the table, exactly once, with the offsets of
        ``offsetsFrom`` (the direct stream ``dstream`` derives from)."""
        save_batches(dstream, offsetsFrom, self.write_batch)

    def write_batch(self, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
        """Write ``rdd``'s rows and commit them with the batch's identity; False (nothing
        written) if the table holds the batch already, or if the batch read and wrote nothing."""
        table = self._create_table()
        if self._already_in(table, batch_time_ms, ranges):
            self.clean_up(batch_time_ms, table)
            return False
        schema = self.schema()
        task = partial(write_partition, location=self.location, name=self.name, batch_time_ms=batch_time_ms,
                       schema=schema, partition_by=self.partition_by,
                       staging=self.mode == "merge", attempt=uuid.uuid4().hex[:12],
                       ends=[(r.topic, r.partition, r.untilOffset) for r in ranges if r.untilOffset > r.fromOffset])
        written = on_executors(rdd).mapPartitionsWithIndex(task).collect()  # add actions only, never the rows
        if not written and not any(r.untilOffset > r.fromOffset for r in ranges):
            return False  # nothing to make visible: no commit (a table version per empty batch)
        committed = self.commit_batch(batch_time_ms, ranges, written, schema)
        self.clean_up(batch_time_ms)
        return committed

    def _already_in(self, table, batch_time_ms: int, ranges: list[OffsetRange]) -> bool:
        """Whether the table holds the batch, by the sink's offsets (module docstring, step 1):
        True, False, or an error if the offsets do not fit the batch."""
        read = [r for r in ranges if r.untilOffset > r.fromOffset]
        if not read:  # no offsets to decide by (a window's output of a batch that read nothing): the txn
            txn = self._txn(table)
            if txn is not None and txn >= batch_time_ms:
                log.info("%s: batch %d read nothing and the Delta table %s holds batch %d; not written again",
                         self.name, batch_time_ms, self.table_uri, txn)
            return txn is not None and txn >= batch_time_ms
        ends = self._read_ends(table)
        if ends is None:  # nothing to decide by but the txn: the batch is the newest commit, or not in
            txn = self._txn(table)
            if txn != batch_time_ms:
                raise self._history_lost(table, batch_time_ms)
            if txn == batch_time_ms:
                log.info("%s: batch %d is in the Delta table %s already (the txn version); not written "
                         "again", self.name, batch_time_ms, self.table_uri)
            return txn == batch_time_ms
        stored_batch = self._txn(table)  # (the ends are those of the commit of the txn's batch)
        return batch_in_output(self.name, batch_time_ms, read, ends, stored_batch, "the Delta table's",
                               f"the Delta table {self.table_uri}")

    def commit_batch(self, batch_time_ms: int, ranges: list[OffsetRange], written: list[dict], schema) -> bool:
        """One Delta transaction: the files tasks wrote, the ``txn`` and the offsets; False if the
        batch turned out to be there already."""
        deltalake = _deltalake()
        from deltalake.exceptions import CommitFailedError

        for attempt in range(_COMMIT_ATTEMPTS):
            table = self._create_table()
            if self._already_in(table, batch_time_ms, ranges):
                return False
            ends, version = self._check(table, batch_time_ms, ranges), table.version()
            properties = deltalake.CommitProperties(
                custom_metadata={"sparkwal.sink": self.name, "sparkwal.batchTimeMs": str(batch_time_ms),
                                 "sparkwal.offsets": json.dumps([[tp.topic, tp.partition, o]
                                                                 for tp, o in ends.items()])},
                app_transactions=[deltalake.Transaction(app_id=self.name, version=batch_time_ms)])
            try:
                with self._storage_call(f"commit of batch {batch_time_ms}"):
                    if self.mode == "merge":
                        self._merge(table, written, schema, properties)
                    else:
                        adds = [add_action(w) for w in written if not w.get("staged")]
                        table.create_write_transaction(adds, "append", schema, commit_properties=properties,
                                                       partition_by=self.partition_by or None)
            except CommitFailedError as e:
                log.warning("%s: batch %d's Delta commit conflicted (%s); reading the table again "
                            "(attempt %d of %d)", self.name, batch_time_ms, e, attempt + 1, _COMMIT_ATTEMPTS)
                continue
            self._known = (version, batch_time_ms, ends)  # the commits after ``version``: read next time
            return True
        raise SinkOffsetsError(f"{self.name}: batch {batch_time_ms}'s Delta commit to {self.table_uri} "
                               f"conflicted {_COMMIT_ATTEMPTS} times")

    def _check(self, table, batch_time_ms: int, ranges: list[OffsetRange]) -> dict[TopicPartition, int]:
        """The sink's offsets after this batch (every range's end: an empty range's too, where the
        sink has none yet); an error if the batch does not start where the table's output ended."""
        ends = self._read_ends(table)
        if ends is None:
            raise self._history_lost(table, batch_time_ms)
        return advance_ends(self.name, ends, batch_time_ms, ranges, "the Delta table's")

    def _merge(self, table, written: list[dict], schema, properties) -> None:
        import pyarrow.dataset as ds

        fs, root = _arrow_filesystem(self.location)
        files = [f"{root}/{w['path']}" for w in written]
        source = ds.dataset(files, schema=schema, format="parquet", filesystem=fs)
        predicate = " AND ".join(f"t.{_quoted(k)} = s.{_quoted(k)}" for k in self.keys)
        (table.merge(source.scanner().to_reader(), predicate, source_alias="s", target_alias="t",
                     commit_properties=properties)
         .when_matched_update_all().when_not_matched_insert_all().execute())

    def clean_up(self, up_to_ms: int, table=None) -> int:
        """Delete what attempts of batches up to ``up_to_ms`` wrote that the table does not hold
        (never-committed attempts; merged staging files), and their records; the files deleted.
        Only attempts the table has settled (:func:`~sparkwal.engine.sinks.delta_files.settled`: its
        output passed their ranges' ends): a later batch's attempt may be in flight in another
        driver, between its files and its commit, whatever its batch's time."""
        storage, root = self.location.resolve()
        records_dir = storage.join(root, f"{RECORDS_DIR}/{self.name}")
        records = records_up_to(storage, records_dir, up_to_ms)
        if not records:
            return 0
        table = table or self.table()
        txn = None if table is None else self._txn(table)
        ends = None if txn is None else self._read_ends(table)
        if ends is None:  # never committed, or its offsets lost: nothing is settled
            return 0
        held = _files_held(table)
        deleted = delete_settled(storage, records, (txn, ends), lambda _name, _batch, path: path not in held,
                                 lambda path: storage.join(root, path))
        if deleted:
            log.info("%s: deleted %d files written by attempts of batches up to %d that the table does "
                     "not hold (uncommitted, or merged from staging)", self.name, deleted, up_to_ms)
        return deleted

    def read(self, columns: Sequence[str] | None = None):
        """The table's rows as a pyarrow Table (through delta-rs's query engine)."""
        import pyarrow as pa

        deltalake = _deltalake()
        table = self.table()
        if table is None:
            return self.schema().empty_table()
        cols = ", ".join(_quoted(c) for c in columns) if columns else "*"
        result = deltalake.QueryBuilder().register("t", table).execute(f"SELECT {cols} FROM t")
        return pa.table(result.read_all())


def _files_held(table) -> set[str]:
    """The table's files, as paths relative to it (as the tasks record them)."""
    import pyarrow as pa

    return {unquote(p) for p in pa.table(table.get_add_actions()).column("path").to_pylist()}


def _arrow_filesystem(location):
    """``(pyarrow filesystem, root path in it)`` of ``location`` (the driver's, for MERGE's source)."""
    import pyarrow.fs as pafs

    storage, root = location.resolve()
    if storage.is_local:
        return pafs.LocalFileSystem(), root
    return pafs.PyFileSystem(pafs.FSSpecHandler(storage.fs)), root


def delta_rs_options(table_uri: str, storage_options: Mapping | None) -> dict[str, str]:
    """delta-rs's storage options for an S3 table, from s3fs's (``key``, ``secret``, ``token``,
    ``client_kwargs.endpoint_url`` and ``region_name``); an http endpoint is allowed as such.
    Other schemes: none (give ``delta_storage_options``)."""
    options = dict(storage_options or {})
    if not table_uri.startswith(("s3://", "s3a://")):
        return {}
    client = dict(options.get("client_kwargs") or {})
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    pairs = {"AWS_ACCESS_KEY_ID": options.get("key"), "AWS_SECRET_ACCESS_KEY": options.get("secret"),
             "AWS_SESSION_TOKEN": options.get("token"), "AWS_ENDPOINT_URL": endpoint,
             "AWS_REGION": client.get("region_name") or options.get("region_name"),
             "AWS_ALLOW_HTTP": "true" if endpoint and str(endpoint).startswith("http://") else None}
    return {k: str(v) for k, v in pairs.items() if v}


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'
