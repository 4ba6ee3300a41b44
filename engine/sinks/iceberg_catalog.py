"""What :class:`~sparkwal.engine.sinks.IcebergSink` keeps of its pyiceberg catalog, and what a
catalog's failure means.

* The catalog is kept as its name and properties (loaded again after unpickling), its secrets
  never pickled into a checkpoint or a task: properties named like one (``s3.secret-access-key``,
  ``adls.account-key``, a REST catalog's ``header.*`` and ``token``...), and a SQL catalog URI's
  password (in the URL or its query). The executors take credentials from their environment.
* A failure is ``"unavailable"`` (the catalog's database or the table's store not answering: the
  storage seam's error, the batch runs again), ``"conflict"`` (another writer's commit or
  transaction won: the sink reads the table and decides again) or ``None`` (a mistake or the table's
  own error: raised as it is, one line).
* Whether the table was rolled back past the sink's newest commit, from the table properties the
  commit set, once that commit's snapshot is gone (:func:`left_behind`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: pyiceberg's catalog and FileIO properties that hold secrets
SECRET_PROPERTY = re.compile(r"(?i)access-key|secret|token|password|credential|account-key|connection-string|"
                             r"sas|^header\.")


def catalog_of(catalog) -> tuple[str, dict, object]:
    """``(name, properties, loaded catalog or None)`` of what ``IcebergSink`` was given."""
    if isinstance(catalog, str):
        return catalog, {}, None
    if isinstance(catalog, Mapping):
        properties = {str(k): str(v) for k, v in catalog.items()}
        return properties.pop("name", "default"), properties, None
    if hasattr(catalog, "load_table") and hasattr(catalog, "properties"):
        return catalog.name, dict(catalog.properties), catalog
    raise TypeError(f"catalog must be a pyiceberg Catalog, its properties (a dict) or its name, got {catalog!r}")


def without_secrets(properties: Mapping) -> dict:
    """``properties`` without secrets: those named like one, and a SQL catalog URI's password."""
    kept = {k: v for k, v in properties.items() if not SECRET_PROPERTY.search(str(k))}
    uri = kept.get("uri")
    if isinstance(uri, str) and "://" in uri and not uri.startswith(("http://", "https://")):
        try:
            from sqlalchemy.engine import URL, make_url
            from sqlalchemy.exc import ArgumentError
        except ImportError:  # no SQL catalog here, so no SQLAlchemy URL
            return kept

        try:
            url = make_url(uri)
        except ArgumentError:  # not a SQLAlchemy URL: left as it is
            return kept
        query = {k: v for k, v in url.query.items() if not SECRET_PROPERTY.search(k)}
        url = URL.create(url.drivername, url.username, None, url.host, url.port, url.database, query)
        kept["uri"] = url.render_as_string(hide_password=False)
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


def metadata_for_tasks(metadata):
    """The table's metadata as the tasks get it: its properties without secrets."""
    properties = dict(metadata.properties)
    kept = without_secrets(properties)
    return metadata if kept == properties else metadata.model_copy(update={"properties": kept})


def without_own_retries(table):
    """``table`` (freshly loaded, the sink's own object) whose commits pyiceberg does not retry by
    itself: its retry re-applies the append on the newer table, which would put a batch in twice
    when the other commit was the same batch's (a zombie driver's). The sink decides again instead
    (``commit.retry.num-retries`` is read from the transaction's table; a catalog applies a commit's
    updates to its own current metadata, or sends only them, so the pin is never committed)."""
    from pyiceberg.table import TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    return table


def failure_kind(e: BaseException) -> str | None:
    """``"unavailable"``, ``"conflict"`` or None (see the module's docstring)."""
    if isinstance(e, ImportError):
        return None
    from pyiceberg import exceptions

    if isinstance(e, exceptions.CommitFailedException):
        return "conflict"
    if isinstance(e, (exceptions.ServiceUnavailableError, exceptions.CommitStateUnknownException)):
        return "unavailable"
    if isinstance(e, OSError):  # a file missing or refused is the table's state, not the store down
        return None if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError,
                                      NotADirectoryError)) else "unavailable"
    try:
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # pragma: no cover - a catalog other than SQL
        return None
    if not isinstance(e, DBAPIError):
        return None
    state = str(getattr(e.orig, "sqlstate", "") or "")
    if state in ("40001", "40P01"):  # serialization failure, deadlock: another transaction won
        return "conflict"
    if state.startswith(("08", "57P")) or e.connection_invalidated:  # no connection; the server shutting down
        return "unavailable"
    message = str(e.orig).lower()
    if "database is locked" in message or "disk i/o error" in message:  # SQLite, busy or failing
        return "unavailable"
    return None


def left_behind(table, prefix: str, is_newest) -> bool:
    """Whether the table was rolled back past the sink's newest commit, where no snapshot of the
    sink is in its current ancestry: that commit's snapshot is still in the metadata (by its id,
    ``<prefix>.snapshot-id``; by ``is_newest(snapshot)`` from a commit made before that property),
    or the ancestry passes below its sequence number (``.sequence-number``) without meeting it, or
    its id as an expired snapshot's parent (sequence numbers grow from parent to child; 0 in format
    1: nothing to tell by). ``.base-sequence`` is the sequence number each commit was made on: where
    it is not below a ``.sequence-number`` above 0 (a version before those wrote last), an ancestor no
    newer than it says rolled back."""
    from pyiceberg.table.snapshots import ancestors_of

    own, base = table.properties.get(f"{prefix}.snapshot-id"), int(table.properties.get(f"{prefix}.base-sequence", 0))
    own_sequence = int(table.properties.get(f"{prefix}.sequence-number", 0))
    if 0 < own_sequence <= base:  # (format 1: both 0; the id is this version's)
        own = None
    if own is not None and table.metadata.snapshot_by_id(int(own)) is not None:
        return True
    if own is None and any(is_newest(s) for s in table.metadata.snapshots):
        return True
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        sequence = snapshot.sequence_number or 0
        if own is None and 0 < sequence <= base:
            return True
        if own is not None and own in (str(snapshot.snapshot_id), str(snapshot.parent_snapshot_id)):
            return False
        if own is not None and 0 < sequence < own_sequence:
            return True
    return False
