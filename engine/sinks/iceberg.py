"""Exactly-once output into an Apache Iceberg table, through pyiceberg (the ``pyiceberg`` extra).

Each batch (time ``t``, the offset ranges ``R`` its direct stream read) goes in as ONE Iceberg
commit that carries the batch's identity, written by the executors and committed by the driver
(Flink's Iceberg sink is the model: its snapshots carry the job and its newest checkpoint, and a
restored job commits only what the table's snapshot ancestry lacks):

1. The driver walks the table's current snapshot ancestry for the sink's newest snapshot (summary
   ``sparkwal.stream`` = the sink's name) and decides by the end offsets it carries, never by the
   batch time, with the rule of every sparkwal sink (``transactional.batch_in_output``): every
   range of ``R`` ending where the table's output of its partition ends: the batch is in already
   (a re-run after a crash between the commit and the stream's checkpoint), nothing is written;
   each starting there: written; anything else: :class:`SinkOffsetsError` naming the partition
   and both offsets. A batch that read nothing is in iff the sink's newest batch is ``t`` or later.
2. Each task writes its partition's rows as Parquet data files under the table's location with
   pyiceberg's writer (the table's schema, field ids and statistics), their names recorded first
   (:mod:`sparkwal.engine.sinks.iceberg_files`); only the ``DataFile`` entries come back to the
   driver: a batch's output never passes through it.
3. The driver commits them in one snapshot (a fast append; ``mode="upsert"``: pyiceberg's upsert
   by ``keys`` of the staged rows, its overwrite and append in the same commit) whose summary holds
   ``sparkwal.stream``, ``sparkwal.batch-ms`` and ``sparkwal.offsets`` (the end offset of every
   partition the sink's batches planned, records or not: JSON ``[[topic, partition, offset], ...]``),
   from which :meth:`IcebergSink.offsets` resumes a direct stream without a checkpoint. The same
   commit sets the table property ``sparkwal.stream.<name>.batch-ms``: a sink whose snapshots are
   no longer in the ancestry (expired, or the table rolled back) is told from one that never
   committed, and refuses rather than write a batch twice. A conflict (the catalog's
   ``CommitFailedException``: another writer committed first) reloads the table and decides again.
4. Then the files recorded for batches up to ``t`` that the table does not hold (attempts that
   never committed: a killed task, a killed driver, a losing speculative copy; staged rows) are
   deleted, and their records. Files of a commit the catalog never took (pyiceberg's manifests and
   metadata file of a failed commit) are never visible; Iceberg's orphan-file removal takes them.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from functools import partial

from sparkwal.wal import StorageUnavailableError
from sparkwal.wal.location import StorageLocation, without_credentials

from ..sources.protocol import OffsetRange, SinkOffsets, TopicPartition
from .delta_files import RECORDS_DIR
from .iceberg_files import relative_to, write_partition
from .transactional import SinkOffsetsError, advance_ends, batch_in_output, save_batches

log = logging.getLogger(__name__)

MODES = ("append", "upsert")
STREAM, BATCH_MS, OFFSETS = "sparkwal.stream", "sparkwal.batch-ms", "sparkwal.offsets"
_COMMIT_ATTEMPTS = 5
#: pyiceberg's catalog and FileIO properties that hold secrets (``s3.access-key-id``,
#: ``s3.secret-access-key``, ``s3.session-token``, ``token``, ``credential``...)
_SECRET_PROPERTY = re.compile(r"(?i)access-key|secret|token|password|credential")


def _pyiceberg():
    try:
        import pyiceberg.catalog
    except ImportError as e:  # pragma: no cover - the test extra has it
        raise ImportError("IcebergSink needs the pyiceberg package: pip install 'sparkwal[iceberg]'") from e
    return pyiceberg.catalog


class IcebergSink:
    """Exactly-once output of a direct stream's batches into the Iceberg table ``table``
    (``"namespace.name"``) of ``catalog``: a pyiceberg ``Catalog``, or its properties (a dict,
    as ``pyiceberg.catalog.load_catalog`` takes them: ``{"type": "sql", "uri": ..., "warehouse":
    ...}``), or the name of one in pyiceberg's configuration.

    ``name``: the stream's identity in the table's snapshots; ``schema``: a pyarrow schema,
    needed when the table does not exist yet (it is then created, its namespace too, partitioned by
    ``partition_by``'s columns); ``mode``: ``"append"`` or ``"upsert"`` (by ``keys``);
    ``storage_options``: fsspec's for the tasks' writes (derived from the catalog's ``s3.*``
    properties when not given; the tasks get them without credentials: executors take those from
    their environment). Rows are dicts or tuples in the schema's column order."""

    def __init__(self, catalog, table: str, name: str = "sparkwal", *, schema=None, mode: str = "append",
                 keys: Sequence[str] | None = None, partition_by: Sequence[str] | None = None,
                 storage_options: Mapping | None = None):
        if not isinstance(table, str) or "." not in table.strip("."):
            raise ValueError(f"table must be a 'namespace.name' string, got {table!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "upsert" and not keys:
            raise ValueError("mode='upsert' needs keys: the columns a row is matched by")
        self._catalog_name, self._catalog_properties, self._catalog = _catalog_of(catalog)
        self.identifier, self.name, self.mode = table, name, mode
        self.keys = list(keys or [])
        self.partition_by = list(partition_by or [])
        self._schema = schema
        self._storage_options = dict(storage_options) if storage_options is not None else \
            fsspec_options(self._catalog_properties)

    def __getstate__(self) -> dict:
        """Pickled into checkpoints with the output: no loaded catalog, no credentials."""
        state = self.__dict__.copy()
        state["_catalog"] = None
        state["_catalog_properties"] = _without_secrets(self._catalog_properties)
        state["_storage_options"] = without_credentials(self._storage_options)
        return state

    # ------------------------------------------------------------------ the table

    def catalog(self):
        """The pyiceberg catalog (loaded once per process)."""
        if self._catalog is None:
            with self._catalog_call("load catalog"):
                self._catalog = _pyiceberg().load_catalog(self._catalog_name, **self._catalog_properties)
        return self._catalog

    @contextmanager
    def _catalog_call(self, operation: str):
        """The catalog's and the table files' I/O errors (a database or store down) as the storage
        seam's: unavailable, naming the table and the operation. The table's own errors (a
        conflict, a schema mismatch) pass as they are."""
        start = time.monotonic()
        try:
            yield
        except Exception as e:  # narrowed below: anything else is re-raised as it is
            if not _unavailable(e):
                raise
            raise StorageUnavailableError(f"Iceberg {operation}", self.identifier, 1, time.monotonic() - start,
                                          e) from e

    def table(self):
        """The table (a pyiceberg ``Table``) as the catalog has it now; None if it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        with self._catalog_call("read table"):
            try:
                return self.catalog().load_table(self.identifier)
            except NoSuchTableError:
                return None

    def create_table(self):
        """The table, created (its namespace too) with the schema given if it does not exist."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        table = self.table()
        if table is not None:
            return table
        if self._schema is None:
            raise ValueError(f"{self.identifier} is not an Iceberg table yet: give IcebergSink a schema to create it")
        with self._catalog_call("create table"):
            catalog = self.catalog()
            catalog.create_namespace_if_not_exists(self.identifier.rsplit(".", 1)[0])
            try:
                with catalog.create_table_transaction(self.identifier, self._schema) as create:
                    if self.partition_by:
                        with create.update_spec() as spec:
                            for column in self.partition_by:
                                spec.add_identity(column)
            except TableAlreadyExistsError:
                pass  # another writer created it first
        return self.table()

    @property
    def location(self) -> StorageLocation:
        """The table's location for the tasks (pickled without credentials)."""
        table = self.create_table()
        return StorageLocation.of(table.metadata.location.rstrip("/"), self._storage_options)

    def sink_snapshots(self, table):
        """The sink's snapshots in the table's current ancestry, newest first."""
        from pyiceberg.table.snapshots import ancestors_of

        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            summary = snapshot.summary
            if summary is not None and summary.get(STREAM) == self.name:
                yield snapshot

    def _newest(self, table) -> tuple[int, dict[TopicPartition, int]] | None:
        """``(batch time, end offsets)`` of the sink's newest snapshot; None if it never committed;
        an error if it did (the table's property says so) but no snapshot of it is in the ancestry."""
        for snapshot in self.sink_snapshots(table):
            ends = json.loads(snapshot.summary.get(OFFSETS) or "[]")
            return int(snapshot.summary[BATCH_MS]), {TopicPartition(t, p): int(o) for t, p, o in ends}
        if self._property_batch(table) is not None:
            raise self._history_lost(table)
        return None

    def _property_batch(self, table) -> int | None:
        value = table.properties.get(f"{STREAM}.{self.name}.batch-ms")
        return None if value is None else int(value)

    def _history_lost(self, table, batch_time_ms: int | None = None) -> SinkOffsetsError:
        batch = "" if batch_time_ms is None else f": whether batch {batch_time_ms} is in cannot be decided"
        return SinkOffsetsError(
            f"{self.identifier}: the snapshot of batch {self._property_batch(table)} (the newest of sink "
            f"{self.name!r}) is not in the table's current snapshot ancestry (expired, or the table rolled "
            f"back){batch}; start the stream with explicit fromOffsets, under a new sink name")

    def committed_batch(self) -> int | None:
        """The time of the sink's newest batch in the table, or None."""
        table = self.table()
        newest = None if table is None else self._newest(table)
        return None if newest is None else newest[0]

    def batches_committed(self) -> int:
        """How many batches of the sink the table's current ancestry holds."""
        table = self.table()
        return 0 if table is None else len({s.summary[BATCH_MS] for s in self.sink_snapshots(table)})

    def offsets(self) -> SinkOffsets:
        """The end offset of every partition the table's output reached (every partition the
        sink's batches planned): ``directStream(fromOffsets=...)``; empty if the sink never
        committed."""
        table = self.table()
        newest = None if table is None else self._newest(table)
        return SinkOffsets() if newest is None else SinkOffsets(newest[1])

    # ------------------------------------------------------------------ one batch

    def saveStream(self, dstream, offsetsFrom) -> None:
        """Each batch of ``dstream`` (rows) into the table, exactly once, with the offsets of
        ``offsetsFrom`` (the direct stream ``dstream`` derives from)."""
        save_batches(dstream, offsetsFrom, self.write_batch)

    def write_batch(self, batch_time_ms: int, ranges: list[OffsetRange], rdd) -> bool:
        """Write ``rdd``'s rows and commit them with the batch's identity; False (nothing
        written) if the table holds the batch already, or if the batch read and wrote nothing."""
        table = self.create_table()
        if self._already_in(table, batch_time_ms, ranges):
            self.clean_up(batch_time_ms)
            return False
        location = StorageLocation.of(table.metadata.location.rstrip("/"), self._storage_options)
        task = partial(write_partition, location=location, metadata=table.metadata, name=self.name,
                       batch_time_ms=batch_time_ms, staging=self.mode == "upsert", attempt=uuid.uuid4().hex[:12])
        written = rdd.mapPartitionsWithIndex(task).collect()  # DataFile entries only, never the rows
        if not written and not any(r.untilOffset > r.fromOffset for r in ranges):
            return False  # nothing to make visible: no snapshot per empty batch
        committed = self.commit_batch(batch_time_ms, ranges, written)
        # (only what this sink committed is known held without a read: if the batch turned out to be
        # in already, another attempt's commit holds its files, read from the table)
        self.clean_up(batch_time_ms, {f.file_path for f in written if not isinstance(f, dict)} if committed else None)
        return committed

    def _already_in(self, table, batch_time_ms: int, ranges: list[OffsetRange]) -> bool:
        """Whether the table holds the batch, by the sink's offsets (module docstring, step 1)."""
        read = [r for r in ranges if r.untilOffset > r.fromOffset]
        try:
            newest = self._newest(table)
        except SinkOffsetsError:  # only the property's batch can be told in
            if self._property_batch(table) == batch_time_ms:
                return True
            raise self._history_lost(table, batch_time_ms) from None
        if newest is None:
            return False
        stored_batch, ends = newest
        if not read:  # no offsets to decide by (a window's output of a batch that read nothing)
            if stored_batch >= batch_time_ms:
                log.info("%s: batch %d read nothing and the Iceberg table %s holds batch %d; not written again",
                         self.name, batch_time_ms, self.identifier, stored_batch)
            return stored_batch >= batch_time_ms
        return batch_in_output(self.name, batch_time_ms, read, ends, stored_batch, "the Iceberg table's",
                               f"the Iceberg table {self.identifier}")

    def commit_batch(self, batch_time_ms: int, ranges: list[OffsetRange], written: list) -> bool:
        """One Iceberg commit: the data files tasks wrote (or the staged rows, upserted), the batch's
        identity and offsets; False if the batch turned out to be in already."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(_COMMIT_ATTEMPTS):
            table = self.create_table()
            if self._already_in(table, batch_time_ms, ranges):
                return False
            newest = self._newest(table)
            ends = advance_ends(self.name, {} if newest is None else newest[1], batch_time_ms, ranges,
                                "the Iceberg table's")
            summary = {STREAM: self.name, BATCH_MS: str(batch_time_ms),
                       OFFSETS: json.dumps([[tp.topic, tp.partition, o] for tp, o in ends.items()])}
            try:
                with self._catalog_call(f"commit of batch {batch_time_ms}"):
                    transaction = _without_own_retries(table).transaction()
                    staged = [w["staged"] for w in written if isinstance(w, dict)]
                    rows = self._staged_rows(table, staged) if self.mode == "upsert" else None
                    if rows is not None and rows.num_rows:
                        transaction.upsert(rows, join_cols=self.keys, snapshot_properties=summary)
                    else:
                        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
                            for data_file in written:
                                if not isinstance(data_file, dict):
                                    append.append_data_file(data_file)
                    transaction.set_properties({f"{STREAM}.{self.name}.batch-ms": str(batch_time_ms)})
                    transaction.commit_transaction()
            except CommitFailedException as e:
                log.warning("%s: batch %d's Iceberg commit conflicted (%s); reading the table again "
                            "(attempt %d of %d)", self.name, batch_time_ms, e, attempt + 1, _COMMIT_ATTEMPTS)
                continue
            return True
        raise SinkOffsetsError(f"{self.name}: batch {batch_time_ms}'s Iceberg commit to {self.identifier} "
                               f"conflicted {_COMMIT_ATTEMPTS} times")

    def _staged_rows(self, table, staged: list[str]):
        """The staged rows of an upsert, in the table's Arrow schema (on the driver: pyiceberg's
        upsert matches them against the table in memory)."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
        storage, _ = self.location.resolve()
        parts = [pq.read_table(pa.BufferReader(storage.read_file(relative_to(self.location, url))))
                 for url in staged]
        return pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()

    def clean_up(self, up_to_ms: int, committed: set[str] | None = None) -> int:
        """Delete what attempts of batches up to ``up_to_ms`` wrote that the table does not hold,
        and their records; the files deleted. ``committed``: the data files this sink has just
        committed for batch ``up_to_ms`` (then its attempts need no read of the table).

        Never past the sink's newest batch in the table, whoever committed it: an attempt of a
        later batch may be in flight in another driver (a zombie finding its old batch in must not
        delete the leader's next batch's files between its check and its commit)."""
        location = self.location
        storage, root = location.resolve()
        records_dir = storage.join(root, f"{RECORDS_DIR}/{self.name}")
        records = [r for r in storage.list_files(records_dir)
                   if r.name.endswith(".json") and int(r.name.split("-", 1)[0]) <= up_to_ms]
        if not records:
            return 0
        table, held, deleted = self.table(), _HeldFiles(self), 0
        try:
            newest = None if table is None else self._newest(table)
        except SinkOffsetsError:
            return 0  # the sink's history is lost: nothing is known held, nothing is deleted
        up_to_ms = min(up_to_ms, -1 if newest is None else newest[0])
        records = [r for r in records if int(r.name.split("-", 1)[0]) <= up_to_ms]
        for record in records:
            batch = int(record.name.split("-", 1)[0])
            for url in json.loads(storage.read_file(record.path))["files"]:
                staged = f"/{RECORDS_DIR}/" in url
                if staged or url not in (committed if batch == up_to_ms and committed is not None
                                         else held.of_batch(table, batch)):
                    storage.delete(relative_to(location, url))
                    deleted += 1
            storage.delete(record.path)
        if deleted:
            log.info("%s: deleted %d files written by attempts of batches up to %d that the table does "
                     "not hold (uncommitted, or staged)", self.name, deleted, up_to_ms)
        return deleted

    def read(self, columns: Sequence[str] | None = None):
        """The table's rows as a pyarrow Table (pyiceberg's scan)."""
        table = self.table()
        if table is None:
            import pyarrow as pa

            if self._schema is None:
                raise ValueError(f"{self.identifier} is not an Iceberg table yet")
            return pa.schema([self._schema.field(c) for c in columns]).empty_table() if columns \
                else self._schema.empty_table()
        with self._catalog_call("scan"):
            return table.scan(selected_fields=tuple(columns) if columns else ("*",)).to_arrow()


class _HeldFiles:
    """The data files the table holds, read as little as a clean-up needs: the files added by the
    sink's snapshots of one batch (one manifest list walk), or, where the ancestry has no snapshot
    of the batch, every file of the current snapshot (read once)."""

    def __init__(self, sink: IcebergSink):
        self.sink = sink
        self.by_batch: dict[int, set[str]] = {}
        self.current: set[str] | None = None

    def of_batch(self, table, batch_time_ms: int) -> set[str]:
        if table is None or table.current_snapshot() is None:
            return set()
        if batch_time_ms not in self.by_batch:
            snapshots = [s for s in self.sink.sink_snapshots(table) if s.summary[BATCH_MS] == str(batch_time_ms)]
            if snapshots:
                self.by_batch[batch_time_ms] = {
                    e.data_file.file_path for s in snapshots for m in s.manifests(table.io)
                    if m.added_snapshot_id == s.snapshot_id for e in m.fetch_manifest_entry(table.io)}
            else:
                if self.current is None:
                    self.current = {e.data_file.file_path for m in table.current_snapshot().manifests(table.io)
                                    for e in m.fetch_manifest_entry(table.io, discard_deleted=True)}
                self.by_batch[batch_time_ms] = self.current
        return self.by_batch[batch_time_ms]


def _without_own_retries(table):
    """``table`` (freshly loaded, this sink's own object) whose commits pyiceberg does not retry by
    itself: its retry re-applies the append on the newer table, which would put a batch in twice
    when the other commit was the same batch's (a zombie driver's). The sink decides again instead
    (``commit.retry.num-retries`` is read from the transaction's table; the catalog applies the
    commit's updates to its own current metadata, so the pin is never committed)."""
    from pyiceberg.table import TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table


def _catalog_of(catalog) -> tuple[str, dict, object]:
    """``(name, properties, loaded catalog or None)`` of what ``IcebergSink`` was given."""
    if isinstance(catalog, str):
        return catalog, {}, None
    if isinstance(catalog, Mapping):
        properties = {str(k): str(v) for k, v in catalog.items()}
        return properties.pop("name", "default"), properties, None
    if hasattr(catalog, "load_table") and hasattr(catalog, "properties"):
        return catalog.name, dict(catalog.properties), catalog
    raise TypeError(f"catalog must be a pyiceberg Catalog, its properties (a dict) or its name, got {catalog!r}")


def _without_secrets(properties: dict) -> dict:
    """Catalog properties without secrets: those named like one, and a SQL catalog URI's password."""
    kept = {k: v for k, v in properties.items() if not _SECRET_PROPERTY.search(k)}
    if "uri" in kept and "@" in kept["uri"] and "://" in kept["uri"]:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            kept["uri"] = make_url(kept["uri"]).set(password=None).render_as_string(hide_password=False)
        except ArgumentError:  # not a SQLAlchemy URL (a REST catalog's): left as it is, it has no password field
            pass
    return kept


def fsspec_options(properties: Mapping) -> dict | None:
    """fsspec's storage options from pyiceberg's ``s3.*`` FileIO properties (endpoint, region,
    keys), for the tasks' writes to the same store; None without any."""
    pairs = {"key": properties.get("s3.access-key-id"), "secret": properties.get("s3.secret-access-key"),
             "token": properties.get("s3.session-token")}
    options: dict = {k: v for k, v in pairs.items() if v}
    client = {k: v for k, v in (("endpoint_url", properties.get("s3.endpoint")),
                                ("region_name", properties.get("s3.region"))) if v}
    if client:
        options["client_kwargs"] = client
    return options or None


def _unavailable(e: BaseException) -> bool:
    """Whether ``e`` is the catalog's database or the table's store not answering."""
    if isinstance(e, OSError):  # a file missing or refused is the table's state, not the store down
        return not isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError))
    try:
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # pragma: no cover - a catalog other than SQL
        return False
    return isinstance(e, DBAPIError) and bool(getattr(e, "connection_invalidated", False) or
                                              e.__class__.__name__ == "OperationalError")
