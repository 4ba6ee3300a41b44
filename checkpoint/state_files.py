"""State snapshot files: the on-disk format of a stateful stream's state at one batch time.

A snapshot is a flat set of files named ``<base>.*`` (``<base>`` = ``<checkpoint>/state/<stream
number>-<batch ms>-e<epoch>``, the epoch being the writing driver's leadership epoch; without one,
``<stream number>-<batch ms>``; the stream number is its index in the graph, or after an upgrade
moved it the one its checkpoint's ``state_slots`` gives, which no other stream's snapshots use).
The epoch in the name fences the parts, which Spark's tasks write: a driver that lost the
leadership, and its tasks still running, write only under their own epoch's name, which no later
driver's checkpoint references:

* ``<base>.part-<i>`` (i = 00000, 00001, ...): partition i's rows, written by the task that holds
  the partition, each file put atomically.

  Version 2 (this engine writes it): one Arrow IPC stream, ZSTD-compressed, columns ``key``,
  ``value``, ``updated_ms`` (int64, the batch time of the key's last update; mapWithState's idle
  timeouts need it) and, in a delta, ``removed`` (bool; a removed key's value is null). ``key`` and
  ``value`` are typed (``string``, ``int64``, ``double``, ``bool``, ``binary``, and structs/lists of
  those) when every value of the column is of one such type and reads back as the same Python
  value; otherwise the column is ``binary`` holding one pickle per value, and the schema's metadata
  ``sparkwal.pickled`` names it. Plain state is data, never code.

  Version 1 (earlier releases; still read): consecutive pickles of record lists.
* ``<base>.manifest``: JSON written by the driver after every part is durable. A snapshot without
  one is incomplete (its writer died) and is never read; a part whose size or CRC32C differs from
  its manifest entry is an error naming the file. Version 2's fields::

      {"version": 2, "format": "arrow-ipc", "kind": "full" | "delta", "time_ms": t,
       "base_ms": <the previous snapshot of the chain, for a delta>, "num_partitions": n,
       "partitioned": <part i holds exactly the keys that portable_hash puts in partition i>,
       "hash_seed": <the executors' PYTHONHASHSEED then>, "parts": [[rows, bytes, crc32c], ...],
       "leader_epoch": <the writing driver's leadership epoch; absent before sparkwal had one>,
       "state_version": <the program's version of the values (sparkwal.engine.state.versions); absent: 1>}

A delta holds the keys updated or removed since the snapshot ``base_ms``; the state at ``t`` is
the newest full snapshot at or before ``t`` with every delta after it applied in order (a *chain*).

Clean-up: writing a batch's snapshot first deletes what its own and OLDER epochs (and unsuffixed
names, epoch 0) left of that stream and batch time, never a newer epoch's
(:func:`delete_snapshot` ``every_epoch=True, up_to_epoch=<the writer's>``): a driver that lost its
leadership, still writing (a zombie), cannot delete the snapshot the next leader wrote of the same
batch, which that leader's checkpoints reference.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Iterable, Iterator

import crc32c
import pyarrow as pa

from sparkwal.wal.location import StorageLocation
from sparkwal.wal.storage import resolve

from .errors import SnapshotError  # noqa: F401  (raised here; re-exported where it was)

VERSION = 2
COMPRESSION = "zstd"
BATCH_ROWS = 65_536
PICKLED = b"sparkwal.pickled"
_SCALARS = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(), bytes: pa.binary()}
_PLAIN = (pa.types.is_string, pa.types.is_int64, pa.types.is_float64, pa.types.is_boolean,
          pa.types.is_binary, pa.types.is_null)


def part_name(base: str, i: int) -> str:
    return f"{base}.part-{i:05d}"


# ------------------------------------------------------------------------------ columns


def _plain_type(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return all(_plain_type(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t):
        return _plain_type(t.value_type)
    return any(check(t) for check in _PLAIN)


def _same(a, b) -> bool:
    """Equal and of the same types all the way down (1 and 1.0 differ, as do a tuple and a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)  # NaN reads back as NaN


def arrow_column(values: list) -> tuple[pa.Array, bool]:
    """``values`` as a typed Arrow array when that reads back exactly, else pickled (True)."""
    types = set(map(type, values))
    types.discard(type(None))
    if len(types) <= 1:
        t = next(iter(types), str)
        try:
            if t in _SCALARS:
                return pa.array(values, type=_SCALARS[t]), False
            if t in (dict, list):
                arr = pa.array(values)
                if _plain_type(arr.type) and _same(arr.to_pylist(), values):
                    return arr, False
        except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError):
            pass
    return pa.array([pickle.dumps(v, pickle.HIGHEST_PROTOCOL) for v in values], pa.binary()), True


def rows_table(keys: list, values: list, updated_ms: list[int], removed: list[bool] | None = None) -> pa.Table:
    """One part's rows as a table (see the module's docstring for the columns)."""
    key_col, key_pickled = arrow_column(keys)
    value_col, value_pickled = arrow_column(values)
    columns = {"key": key_col, "value": value_col, "updated_ms": pa.array(updated_ms, pa.int64())}
    if removed is not None:
        columns["removed"] = pa.array(removed, pa.bool_())
    pickled = ",".join(n for n, p in (("key", key_pickled), ("value", value_pickled)) if p)
    table = pa.table(columns)
    return table.replace_schema_metadata({PICKLED: pickled.encode()})


def pickled_columns(table: pa.Table) -> set[str]:
    meta = table.schema.metadata or {}
    return {c for c in meta.get(PICKLED, b"").decode().split(",") if c}


def column_values(table: pa.Table, name: str) -> list:
    values = table.column(name).to_pylist()
    if name in pickled_columns(table):
        return [None if v is None else pickle.loads(v) for v in values]
    return values


def encode_part(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    return sink.getvalue().to_pybytes()


def decode_part(data: bytes, name: str) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except pa.ArrowException as e:
        raise SnapshotError(f"state snapshot part {name} is not an Arrow IPC stream: {e}") from None


# ------------------------------------------------------------------------------ files


def read_manifest(url: str | StorageLocation, storage_options: dict | None = None) -> dict:
    storage, path = resolve(url, storage_options)
    try:
        manifest = json.loads(storage.read_file(f"{path}.manifest"))
    except FileNotFoundError:
        raise SnapshotError(f"state snapshot {url} is missing or incomplete "
                            f"(no {path}.manifest)") from None
    except ValueError as e:
        raise SnapshotError(f"state snapshot manifest {path}.manifest is damaged: {e}") from None
    if manifest.get("version") not in (1, VERSION):
        raise SnapshotError(f"state snapshot {path}.manifest has version {manifest.get('version')}; "
                            f"this engine reads versions 1 and {VERSION}")
    return manifest


def write_manifest(url: str | StorageLocation, manifest: dict, storage_options: dict | None = None) -> None:
    storage, path = resolve(url, storage_options)
    storage.put(f"{path}.manifest", json.dumps(manifest).encode())


def put_part(url: str | StorageLocation, i: int, data: bytes, storage_options: dict | None = None) -> list:
    """Write part ``i``; return ``[bytes, crc32c]`` (its manifest entry without the row count)."""
    storage, path = resolve(url, storage_options)
    storage.put(part_name(path, i), data)
    return [len(data), crc32c.crc32c(data)]


def read_part(url: str | StorageLocation, i: int, entry: list, storage_options: dict | None = None) -> bytes:
    """Part ``i``'s bytes, checked against its manifest ``entry`` ``[rows, bytes, crc32c]``."""
    storage, path = resolve(url, storage_options)
    name = part_name(path, i)
    try:
        data = storage.read_file(name)
    except FileNotFoundError:
        raise SnapshotError(f"state snapshot part {name} is missing") from None
    _, size, crc = entry
    if len(data) != size or crc32c.crc32c(data) != crc:
        raise SnapshotError(f"state snapshot part {name} is damaged: {len(data)} bytes, CRC32C "
                            f"{crc32c.crc32c(data):#x}; its manifest says {size} bytes, {crc:#x}")
    return data


def part_rows(url: str | StorageLocation, i: int, manifest: dict, storage_options: dict | None = None
              ) -> Iterator[tuple]:
    """Part ``i``'s rows ``(key, value, updated_ms, removed)``, checked; version 1's records
    ``(key, value)`` come with ``updated_ms`` 0 and ``removed`` False."""
    entry = manifest["parts"][i]
    data = read_part(url, i, entry, storage_options)
    name = part_name(resolve(url, storage_options)[1], i)
    if manifest["version"] == 1:
        buf, seen = io.BytesIO(data), 0
        while buf.tell() < len(data):
            chunk = pickle.load(buf)
            seen += len(chunk)
            for k, v in chunk:
                yield k, v, 0, False
    else:
        table = decode_part(data, name)
        seen = table.num_rows
        removed = table.column("removed").to_pylist() if "removed" in table.column_names else [False] * seen
        yield from zip(column_values(table, "key"), column_values(table, "value"),
                       table.column("updated_ms").to_pylist(), removed)
    if seen != entry[0]:
        raise SnapshotError(f"state snapshot part {name} holds {seen} rows, its manifest says {entry[0]}")


def merge_chain(parts: Iterable[Iterable[tuple]]) -> dict:
    """Apply a chain's rows in order: ``{key: (value, updated_ms)}``, ordered by last update."""
    state: dict = {}
    for rows in parts:
        for k, v, updated, removed in rows:
            state.pop(k, None)
            if not removed:
                state[k] = (v, updated)
    return state


_EPOCH_SUFFIX = re.compile(r"-e\d+$")


def snapshot_files(url: str | StorageLocation, storage_options: dict | None = None, every_epoch: bool = False,
                   up_to_epoch: int | None = None) -> list[str]:
    """The files of snapshot ``url``; ``every_epoch``: of every epoch's snapshot of its stream
    and batch time, or with ``up_to_epoch``, of every epoch up to that one (a name without an
    epoch is epoch 0)."""
    storage, path = resolve(url, storage_options)
    directory, _, base = path.rpartition("/")
    try:
        infos = storage.list_files(directory)
    except FileNotFoundError:
        return []
    if not every_epoch:
        return [i.path for i in infos if i.name.startswith(f"{base}.")]
    named = re.compile(re.escape(_EPOCH_SUFFIX.sub("", base)) + r"(?:-e(\d+))?\.")
    return [i.path for i in infos if (m := named.match(i.name))
            and (up_to_epoch is None or int(m.group(1) or 0) <= up_to_epoch)]


def delete_snapshot(url: str | StorageLocation, storage_options: dict | None = None, every_epoch: bool = False,
                    up_to_epoch: int | None = None) -> None:
    """Delete the manifest first (the snapshot stops being complete), then the parts;
    ``every_epoch``: every epoch's snapshot of its stream and batch time (up to ``up_to_epoch``
    when given: a writer never deletes a newer epoch's)."""
    storage, _ = resolve(url, storage_options)
    files = snapshot_files(url, storage_options, every_epoch, up_to_epoch)
    for f in sorted(files, key=lambda f: not f.endswith(".manifest")):
        storage.delete(f)
