"""State snapshots: the RDD of a stateful stream at one batch time, as files the engine owns.

On-disk format (a flat set of files next to each other, ``<name>`` chosen by the caller):

* ``<name>.part-<i>`` (i = 00000, 00001, ...): partition i's records as consecutive pickles of
  record lists (at most 4096 records each), written by the task that computed the partition,
  each file put atomically;
* ``<name>.manifest``: JSON ``{"version": 1, "parts": [[records, bytes, crc32c], ...]}``, written
  by the driver after every part is durable. A snapshot without a manifest is incomplete (its
  writer died) and is never read; a part whose size or CRC32C does not match its manifest entry
  is an error naming the file.

The records are the state's data (pickled Python values, as PySpark itself ships them); no code
is stored. Reading is one task per part that loads the file directly, without the JVM's object
file (SequenceFile + Java serialisation) path that ``saveAsPickleFile`` takes, which made reading
a snapshot the largest part of a restart.
"""

from __future__ import annotations

import io
import json
import pickle

import crc32c
from pyspark import RDD, SparkContext

from wal.storage import resolve

VERSION = 1
RECORDS_PER_PICKLE = 4096


class SnapshotError(RuntimeError):
    """A snapshot is missing, incomplete or damaged (the message names the file)."""


def _part(name: str, i: int) -> str:
    return f"{name}.part-{i:05d}"


def write_snapshot(rdd: RDD, url: str, storage_options: dict | None = None) -> int:
    """Write ``rdd`` as snapshot ``url`` (replacing any incomplete one); return its record count.
    ``storage_options`` go to the tasks too."""
    storage, path = resolve(url, storage_options)
    storage.makedirs(path.rpartition("/")[0])
    delete_snapshot(url, storage_options)

    def write_part(index, records):
        st, p = resolve(url, storage_options)
        buf, chunk, n = io.BytesIO(), [], 0
        for r in records:
            chunk.append(r)
            if len(chunk) == RECORDS_PER_PICKLE:
                pickle.dump(chunk, buf, pickle.HIGHEST_PROTOCOL)
                n, chunk = n + len(chunk), []
        if chunk:
            pickle.dump(chunk, buf, pickle.HIGHEST_PROTOCOL)
            n += len(chunk)
        data = buf.getvalue()
        st.put(_part(p, index), data)
        yield index, n, len(data), crc32c.crc32c(data)

    parts = sorted(rdd.mapPartitionsWithIndex(write_part).collect())
    manifest = {"version": VERSION, "parts": [[n, size, crc] for _, n, size, crc in parts]}
    storage.put(f"{path}.manifest", json.dumps(manifest).encode())
    return sum(n for _, n, _, _ in parts)


def _manifest(url: str, storage_options: dict | None) -> dict:
    storage, path = resolve(url, storage_options)
    try:
        manifest = json.loads(storage.read_file(f"{path}.manifest"))
    except FileNotFoundError:
        raise SnapshotError(f"state snapshot {url} is missing or incomplete "
                            f"(no {path}.manifest)") from None
    except ValueError as e:
        raise SnapshotError(f"state snapshot manifest {path}.manifest is damaged: {e}") from None
    if manifest.get("version") != VERSION:
        raise SnapshotError(f"state snapshot {path}.manifest has version {manifest.get('version')}, "
                            f"this engine reads version {VERSION}")
    return manifest


def snapshot_exists(url: str, storage_options: dict | None = None) -> bool:
    """True if the snapshot is complete (its manifest was written)."""
    storage, path = resolve(url, storage_options)
    return storage.exists(f"{path}.manifest")


def read_snapshot(sc: SparkContext, url: str, storage_options: dict | None = None) -> RDD:
    """The snapshot's records as an RDD with one partition per written partition. The manifest is
    read now (a missing snapshot fails here); the parts are read and checked by the tasks."""
    manifest = _manifest(url, storage_options)
    parts = [(i, n, size, crc) for i, (n, size, crc) in enumerate(manifest["parts"])]

    def read_part(part):
        i, n, size, crc = part
        st, p = resolve(url, storage_options)
        name = _part(p, i)
        try:
            data = st.read_file(name)
        except FileNotFoundError:
            raise SnapshotError(f"state snapshot part {name} is missing") from None
        if len(data) != size or crc32c.crc32c(data) != crc:
            raise SnapshotError(f"state snapshot part {name} is damaged: {len(data)} bytes, CRC32C "
                                f"{crc32c.crc32c(data):#x}; its manifest says {size} bytes, {crc:#x}")
        buf, seen = io.BytesIO(data), 0
        while buf.tell() < len(data):
            chunk = pickle.load(buf)
            seen += len(chunk)
            yield from chunk
        if seen != n:
            raise SnapshotError(f"state snapshot part {name} holds {seen} records, its manifest says {n}")

    if not parts:
        return sc.emptyRDD()
    return sc.parallelize(parts, len(parts)).flatMap(read_part)


def _files(url: str, storage_options: dict | None) -> list[str]:
    storage, path = resolve(url, storage_options)
    directory, _, base = path.rpartition("/")
    try:
        infos = storage.list_files(directory)
    except FileNotFoundError:
        return []
    return [i.path for i in infos if i.name.startswith(f"{base}.")]


def delete_snapshot(url: str, storage_options: dict | None = None) -> None:
    """Delete the manifest first (the snapshot stops being complete), then the parts."""
    storage, _ = resolve(url, storage_options)
    files = _files(url, storage_options)
    for f in sorted(files, key=lambda f: not f.endswith(".manifest")):
        storage.delete(f)
