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
3. The driver commits them in one snapshot (a fast append) whose summary holds ``sparkwal.stream``,
   ``sparkwal.batch-ms`` and ``sparkwal.offsets`` (the end offset of every partition the sink's
   batches planned, records or not: JSON ``[[topic, partition, offset], ...]``), from which
   :meth:`IcebergSink.offsets` resumes a direct stream without a checkpoint. ``mode="upsert"``:
   pyiceberg's upsert by ``keys`` of the staged rows goes in the same commit, before the batch's own
   (then empty) tagged one, its snapshots tagged ``sparkwal.upsert.stream`` and
   ``sparkwal.upsert.batch-ms`` only (they hold the batch's files; a table rolled back into the
   middle of it never says the batch is in), its data files (written here, by the driver) each
   recorded before it is written, as the tasks' are. The same commit sets the table properties
   ``sparkwal.stream.<name>.batch-ms``, ``.offsets``, ``.snapshot-id`` and ``.sequence-number``
   (the batch's own snapshot's): where the sink's snapshots left the ancestry because they expired,
   the sink goes on from them; where the table was rolled back past them (they are off the ancestry,
   or it passes below that sequence number without meeting that snapshot), it refuses rather than
   write a batch twice or skip one. A conflict (another writer committed first) reads the table
   again and decides again, with growing waits; pyiceberg's own retry is held off (it would re-apply
   the append on the newer table), and its deletes of the commit's manifests are never done after a
   conflict (a catalog's transport may retry a commit that landed, then answer a conflict; the
   table, read again, shows whether it did). If the schema or partition spec changed since the
   tasks wrote, they write the batch again for the new one.
4. Then the files recorded for batches up to ``t`` that the table does not hold (attempts that
   never committed: a killed task, a killed driver, a losing speculative copy; staged rows) are
   deleted, and their records, once the table's output has passed the ranges their batch read
   (an attempt not passed may be another driver's in flight). Only pyiceberg's own manifests and
   metadata file of a commit the catalog never took are left (never visible); Iceberg's orphan-file
   removal takes them.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from functools import partial

from sparkwal.wal import StorageUnavailableError
from sparkwal.wal.location import StorageLocation, without_credentials

from ..driver_rows import on_executors
from ..sources.protocol import OffsetRange, SinkOffsets, TopicPartition
from ..errors import EngineError
from .delta_files import RECORDS_DIR, delete_settled, records_up_to
from .iceberg_catalog import (catalog_of, failure_kind, fsspec_options, left_behind, metadata_for_tasks,
                              without_own_retries, without_secrets)
from .iceberg_files import HeldFiles, commit_file_io, relative_to, staged, staged_rows, write_partition
from .transactional import SinkOffsetsError, advance_ends, batch_in_output, save_batches

log = logging.getLogger(__name__)

MODES = ("append", "upsert")
STREAM, BATCH_MS, OFFSETS = "sparkwal.stream", "sparkwal.batch-ms", "sparkwal.offsets"
#: an upsert's snapshots' tags: they hold the batch's files, and never say it is in
UPSERT_STREAM, UPSERT_BATCH_MS = "sparkwal.upsert.stream", "sparkwal.upsert.batch-ms"
#: commits tried against other writers' (each after reading the table again, waits growing to 2 s)
COMMIT_ATTEMPTS = 8
#: times the tasks write a batch again when the table's schema or partition spec changed meanwhile
REWRITES = 2


class IcebergCommitConflictError(EngineError, RuntimeError):
    """Other writers' commits won every one of a batch's commit attempts (the batch runs again)."""


class _TableChanged(EngineError):
    """The table's schema or partition spec changed while the tasks wrote for the old one."""


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
        self._catalog_name, self._catalog_properties, self._catalog = catalog_of(catalog)
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
        state["_catalog_properties"] = without_secrets(self._catalog_properties)
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
            if failure_kind(e) != "unavailable":
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

    def _written_snapshots(self, table) -> dict[int, list]:
        """The sink's snapshots in the table's metadata (an upsert's too), by batch time: off the
        ancestry too (a batch committed again after a rollback: the first commit's snapshot is still
        read by a time travel, a tag or a branch)."""
        written: dict[int, list] = {}
        for snapshot in table.metadata.snapshots:
            summary = snapshot.summary or {}
            for stream, batch in ((STREAM, BATCH_MS), (UPSERT_STREAM, UPSERT_BATCH_MS)):
                if summary.get(stream) == self.name:
                    written.setdefault(int(summary[batch]), []).append(snapshot)
        return written

    def _newest(self, table) -> tuple[int, dict[TopicPartition, int]] | None:
        """``(batch time, end offsets)`` of the sink's newest batch in the table; None if it never
        committed. From its newest snapshot in the ancestry; where none is left there, from the table
        properties its every commit sets, if that snapshot expired; an error if the table was rolled
        back past it (:func:`~.iceberg_catalog.left_behind`)."""
        for snapshot in self.sink_snapshots(table):
            return int(snapshot.summary[BATCH_MS]), _ends(snapshot.summary.get(OFFSETS))
        batch = self._property_batch(table)
        if batch is None:
            return None
        ends = table.properties.get(f"{STREAM}.{self.name}.offsets")
        if ends is None or left_behind(table, f"{STREAM}.{self.name}", lambda s: s.summary is not None and (
                s.summary.get(STREAM), s.summary.get(BATCH_MS)) == (self.name, str(batch))):
            raise self._history_lost(table)
        return batch, _ends(ends)

    def _property_batch(self, table) -> int | None:
        value = table.properties.get(f"{STREAM}.{self.name}.batch-ms")
        return None if value is None else int(value)

    def _history_lost(self, table, batch_time_ms: int | None = None) -> SinkOffsetsError:
        batch = "" if batch_time_ms is None else f": whether batch {batch_time_ms} is in cannot be decided"
        return SinkOffsetsError(
            f"{self.identifier}: the snapshot of batch {self._property_batch(table)} (the newest of sink "
            f"{self.name!r}) is not in the table's current snapshot ancestry (the table rolled back past "
            f"it){batch}; start the stream with explicit fromOffsets, under a new sink name")

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
        for rewrite in range(REWRITES + 1):
            table = self.create_table()
            if self._already_in(table, batch_time_ms, ranges):
                self.clean_up(batch_time_ms)
                return False
            attempt = uuid.uuid4().hex[:12]
            location = StorageLocation.of(table.metadata.location.rstrip("/"), self._storage_options)
            ends = [(r.topic, r.partition, r.untilOffset) for r in ranges if r.untilOffset > r.fromOffset]
            task = partial(write_partition, location=location, metadata=metadata_for_tasks(table.metadata),
                           name=self.name, batch_time_ms=batch_time_ms, staging=self.mode == "upsert",
                           attempt=attempt, ends=ends)
            written = on_executors(rdd).mapPartitionsWithIndex(task).collect()  # DataFile entries only, never the rows
            if not written and not ends:
                return False  # nothing to make visible: no snapshot per empty batch
            try:
                committed = self.commit_batch(batch_time_ms, ranges, written, _layout(table), attempt)
            except _TableChanged as e:
                log.warning("%s: batch %d is written again: %s (rewrite %d of %d)", self.name, batch_time_ms, e,
                            rewrite + 1, REWRITES)
                continue
            # (only what this attempt's tasks committed is known held without a read; an upsert's files
            # were written in the commit, by the driver: the table is read)
            self.clean_up(batch_time_ms, {f.file_path for f in written} if committed and self.mode == "append"
                          else None, attempt)
            return committed
        raise SinkOffsetsError(f"{self.name}: the Iceberg table {self.identifier}'s schema or partition spec kept "
                               f"changing while batch {batch_time_ms} was written ({REWRITES + 1} times)")

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

    def commit_batch(self, batch_time_ms: int, ranges: list[OffsetRange], written: list,
                     layout: tuple[int, int] | None = None, attempt: str | None = None) -> bool:
        """One Iceberg commit: the data files tasks wrote (or the staged rows, upserted), the batch's
        identity and offsets; False if the batch turned out to be in already. ``layout``: the
        table's (schema id, partition spec id) the files were written for; ``attempt``: the batch
        attempt's id, naming the records of the files an upsert writes (a fresh one if not given)."""
        attempt = attempt or uuid.uuid4().hex[:12]
        for tries in range(COMMIT_ATTEMPTS):
            table = self.create_table()
            if self._already_in(table, batch_time_ms, ranges):
                return False
            if layout is not None and _layout(table) != layout:
                raise _TableChanged(f"the table's (schema, partition spec) went from {layout} to {_layout(table)}")
            newest = self._newest(table)
            ends = advance_ends(self.name, {} if newest is None else newest[1], batch_time_ms, ranges,
                                "the Iceberg table's")
            offsets = json.dumps([[tp.topic, tp.partition, o] for tp, o in ends.items()])
            summary = {STREAM: self.name, BATCH_MS: str(batch_time_ms), OFFSETS: offsets}
            own = file_io = None
            try:
                with self._catalog_call(f"commit of batch {batch_time_ms}"):
                    table = without_own_retries(table)
                    location = StorageLocation.of(table.metadata.location.rstrip("/"), self._storage_options)
                    rows = staged_rows(location, table.schema(), [w["staged"] for w in written if isinstance(w, dict)],
                                       self.keys) if self.mode == "upsert" else None
                    upserting = rows is not None and rows.num_rows > 0
                    table.io = file_io = commit_file_io(table.io, *(
                        (location, self.name, batch_time_ms, attempt, [
                            (r.topic, r.partition, r.untilOffset) for r in ranges if r.untilOffset > r.fromOffset])
                        if upserting else ()))
                    transaction = table.transaction()
                    if upserting:  # its snapshots hold files, only the last says "in"
                        transaction.upsert(rows, join_cols=self.keys, snapshot_properties={
                            UPSERT_STREAM: self.name, UPSERT_BATCH_MS: str(batch_time_ms)})
                    # the batch's own snapshot, last (empty after an upsert): the summary the sink decides by
                    with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
                        for data_file in written:
                            if not isinstance(data_file, dict):
                                append.append_data_file(data_file)
                    own, base = transaction.table_metadata.current_snapshot(), table.current_snapshot()
                    transaction.set_properties({f"{STREAM}.{self.name}.batch-ms": str(batch_time_ms),
                                                f"{STREAM}.{self.name}.offsets": offsets,
                                                f"{STREAM}.{self.name}.snapshot-id": str(own.snapshot_id),
                                                f"{STREAM}.{self.name}.sequence-number": str(own.sequence_number or 0),
                                                f"{STREAM}.{self.name}.base-sequence":
                                                    str(base.sequence_number or 0) if base is not None else "0"})
                    transaction.commit_transaction()
                file_io.delete_deferred()
            except Exception as e:  # narrowed: only another writer's winning commit is tried again
                if failure_kind(e) != "conflict":
                    raise
                if file_io is not None:  # (never done: a later writer may list them though ours expired)
                    file_io.drop_deferred()
                if own is not None and self._landed(own.snapshot_id):  # a transport's retry of a landed commit
                    log.warning("%s: batch %d's Iceberg commit landed, answered as a conflict (%s)", self.name,
                                batch_time_ms, e)
                    return True
                log.warning("%s: batch %d's Iceberg commit conflicted (%s); reading the table again "
                            "(attempt %d of %d)", self.name, batch_time_ms, e, tries + 1, COMMIT_ATTEMPTS)
                time.sleep(min(2.0, 0.05 * 2 ** tries) * random.uniform(1.0, 1.5))
                continue
            return True
        raise IcebergCommitConflictError(
            f"{self.name}: other writers' commits to {self.identifier} won all {COMMIT_ATTEMPTS} commit attempts "
            f"of batch {batch_time_ms}; the batch fails and runs again")

    def _landed(self, snapshot_id: int) -> bool:
        table = self.table()
        return table is not None and table.metadata.snapshot_by_id(snapshot_id) is not None

    def clean_up(self, up_to_ms: int, committed: set[str] | None = None, attempt: str | None = None) -> int:
        """Delete what attempts of batches up to ``up_to_ms`` wrote that the table does not hold,
        and their records; the files deleted. ``committed``: the data files attempt ``attempt`` has
        just committed for batch ``up_to_ms`` (its own records then need no read of the table).

        Only attempts the table has settled (:func:`~sparkwal.engine.sinks.delta_files.settled`:
        its output passed their ranges' ends): an attempt of a later batch may be in flight in another
        driver, between its files and its commit, whatever its batch's time."""
        location = self.location
        storage, root = location.resolve()
        records_dir = storage.join(root, f"{RECORDS_DIR}/{self.name}")
        records = records_up_to(storage, records_dir, up_to_ms)
        if not records:
            return 0
        table = self.table()
        try:
            newest = None if table is None else self._newest(table)
        except SinkOffsetsError:
            return 0  # the sink's history is lost: nothing is known held, nothing is deleted
        if newest is None:
            return 0
        held = HeldFiles(table, self._written_snapshots(table))

        def unheld(record_name: str, batch: int, url: str) -> bool:
            if staged(location, self.name, url):
                return True
            if record_name.split("-")[1] == attempt and committed is not None:
                return url not in committed
            return url not in held.of_batch(batch) and url not in held.everywhere()

        deleted = delete_settled(storage, records, newest, unheld, lambda url: relative_to(location, url))
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


def _ends(offsets: str | None) -> dict[TopicPartition, int]:
    return {TopicPartition(t, p): int(o) for t, p, o in json.loads(offsets or "[]")}


def _layout(table) -> tuple[int, int]:
    """The table's (schema id, default partition spec id): what its data files are written for."""
    return table.metadata.current_schema_id, table.metadata.default_spec_id
