"""Where a received block's records live, and how a task gets them back.

A block's bytes are its records pickled as one list (protocol 5); this module is their one
description. They are written by the receiver's own task and read by the same application's
tasks, never taken from a network peer.

* Receiver WAL on (``spark.streaming.receiver.writeAheadLog.enable``, the default with a
  checkpoint): each block is one record of ``<checkpoint>/receivedData/<streamId>-e<epoch>/``
  (``<streamId>/`` for a driver without a leadership epoch), a :class:`sparkwal.wal.FileBasedWriteAheadLog`
  (durable, CRC-checked), written before the block is reported; the report carries the record's
  handle, its segment named relative to the checkpoint directory (``receivedData/0-e1/log-...``:
  :mod:`sparkwal.checkpoint.layout`), so any executor, or the next driver, reads the block back by handle
  from wherever the checkpoint is now. The epoch in the directory's name fences receivers: a
  receiver of a driver that lost
  the leadership (paused, then resumed) writes only into its own epoch's directory, which no
  later driver's tracker references, and never holds up the new receiver with its WAL lock;
  the new receiver cleans the earlier epochs' old segments with its own.
* WAL off: the block is a file ``<executor local dir>/sparkwal-blocks/<app>/<streamId>/<blockId>``
  (``MAGIC tag[32] bytes``, the tag ``HMAC-SHA256(app secret, "sparkwal-block" 0 blockId 0 bytes)``;
  the OS page cache holds it, spilling to disk, like Spark's MEMORY_AND_DISK_SER), on the executor
  that received it and, off ``local[...]``, copied to as many other executors as the receiver's
  storage level's replication asks (``storageLevel.replication``, default 2 as Spark's
  ``MEMORY_AND_DISK_SER_2``). Each executor's :mod:`block server <.block_server>` serves its copies
  to tasks elsewhere and takes the replicas; a task reads its block from its own executor's
  directory when a copy is there, else fetches it from a holder (preferring none: batch tasks
  prefer the holders' executors). The tag is checked before anything is unpickled, so a byte
  changed on disk or on the wire is an error, never code run. A block is lost only with every
  executor holding a copy, as in Spark: enable the WAL for a receiver whose data must survive.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import random
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from sparkwal.checkpoint.layout import CheckpointLayout
from sparkwal.tracker import ReceivedBlockInfo
from sparkwal.tracker.events import EventFormatError, block_from_raw
from sparkwal.wal import (SYSTEM_CLOCK, Clock, FileBasedWriteAheadLog, LogLockedError, RecordHandle,
                          StorageLocation, resolve)

from .wire import MAX_BLOCK_BYTES, TAG_LEN  # noqa: F401  (re-exported: the block file's bounds)
from .wire import ProtocolError
from ..errors import EngineError

log = logging.getLogger(__name__)

LOCAL_MAGIC = b"SWB2"
BLOCK_ID = re.compile(r"input-\d{1,9}-\d{1,15}-[0-9a-f]{1,16}")


class BlockReadError(EngineError, RuntimeError):
    """A batch's block could not be read back (names the block, stream and where it was)."""


def serialize_block(records: list) -> bytes:
    return pickle.dumps(records, protocol=5)


def deserialize_block(data: bytes) -> list:
    return pickle.loads(data)


@dataclass(frozen=True)
class BlockCopy:
    """Where one copy of a WAL-off block is: an executor and its block server (port 0: none, as
    in ``local[...]`` mode, where the one executor reads its own directory)."""

    executor_id: str
    host: str
    port: int


MAX_COPIES = 16


def block_from_wire(raw: list) -> ReceivedBlockInfo:
    """A reported block, checked field by field (a malformed one drops the connection)."""
    if len(raw) != 5:
        raise ProtocolError(f"a block has 5 fields, got {len(raw)}")
    sid, n, bid, handle, _meta = raw
    if not isinstance(sid, int) or isinstance(sid, bool) or not (n is None or isinstance(n, int)):
        raise ProtocolError(f"bad block stream id or record count: {sid!r}, {n!r}")
    if not isinstance(bid, str) or not 0 < len(bid) <= 200:
        raise ProtocolError(f"bad block id {bid!r}")
    if handle is not None and not (isinstance(handle, list) and len(handle) == 3
                                   and isinstance(handle[0], str) and is_wal_block_name(handle[0])
                                   and all(isinstance(x, int) and x >= 0 for x in handle[1:])):
        raise ProtocolError(f"bad WAL handle {handle!r} in block {bid}")
    try:
        block_time_ms(bid)
        info = block_from_raw(raw)
        info.__post_init__()
    except (ValueError, IndexError, EventFormatError) as e:
        raise ProtocolError(f"bad block {bid!r}: {e}") from None
    return info


def copies_from_wire(raw: list, executor_id: str, host: str) -> tuple[BlockCopy, ...]:
    """The copies an AddBlock names (``[[executor_id, host, port], ...]``), checked; none named
    (local mode): the reporting executor's, without a server."""
    if not raw:
        return (BlockCopy(executor_id, host, 0),)
    if len(raw) > MAX_COPIES:
        raise ValueError(f"{len(raw)} copies named, at most {MAX_COPIES}")
    copies = []
    for c in raw:
        if not (isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], str)
                and 0 < len(c[0]) <= 200 and 0 < len(c[1]) <= 255 and isinstance(c[2], int)
                and not isinstance(c[2], bool) and 0 <= c[2] < 65536):
            raise ValueError(f"bad block copy {c!r}")
        copies.append(BlockCopy(*c))
    return tuple(copies)


def block_tag(secret: bytes, block_id: str, data: bytes) -> bytes:
    return hmac.new(secret, b"sparkwal-block\0" + block_id.encode() + b"\0" + data, hashlib.sha256).digest()


def write_block_file(path: str, tag: bytes, data: bytes) -> None:
    """Atomically (a reader sees the whole file or none)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(LOCAL_MAGIC + tag)
        f.write(data)
    os.replace(tmp, path)


def read_block_file(path: str) -> tuple[bytes, bytes]:
    """``(tag, data)`` of a block file; FileNotFoundError if absent, BlockReadError if damaged."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < len(LOCAL_MAGIC) + TAG_LEN or raw[:len(LOCAL_MAGIC)] != LOCAL_MAGIC:
        raise BlockReadError(f"block file {path} is damaged (bad magic or truncated)")
    return raw[4:4 + TAG_LEN], raw[4 + TAG_LEN:]


def block_time_ms(block_id: str) -> int:
    """The time in a block id ``input-<streamId>-<ms>-<suffix>``."""
    return int(block_id.split("-")[2])


def oldest_kept_block_ms(block_tracker, thresh_ms: int) -> int:
    """The time before which received blocks may be deleted: ``thresh_ms``, lowered to the oldest
    block that a batch the tracker keeps after cleaning up to ``thresh_ms`` (one at or after it)
    or an unallocated entry still names. A batch-time threshold alone deleted the blocks of the
    oldest pending batch (they were cut before its time) while it waited behind a backlog."""
    kept = [b for t in block_tracker.allocated_batch_times() if t >= thresh_ms
            for blocks in block_tracker.get_blocks_of_batch(t).values() for b in blocks]
    kept += [b for sid in block_tracker.stream_ids for b in block_tracker.get_unallocated_blocks(sid)]
    return min([thresh_ms, *(block_time_ms(b.block_id) for b in kept)])


def receiver_wal_dir(checkpoint_dir: str, stream_id: int, epoch: int | None = None) -> str:
    base = CheckpointLayout(checkpoint_dir).received_data_stream(stream_id)
    return base if epoch is None else f"{base}-e{epoch}"


def earlier_wal_dirs(checkpoint_dir: str | StorageLocation, stream_id: int, epoch: int | None,
                     storage_options: dict | None = None) -> list[str]:
    """The receiver WAL directories of ``stream_id`` written under epochs before ``epoch``."""
    if epoch is None:
        return []
    layout = CheckpointLayout(StorageLocation.of(checkpoint_dir, storage_options))
    storage, root = resolve(layout.at(layout.received_data))
    try:
        names = storage.list_dirs(root)
    except FileNotFoundError:
        return []
    pattern = re.compile(rf"{stream_id}(?:-e(\d+))?")
    found = []
    for name in names:
        m = pattern.fullmatch(name)
        earlier = None if m is None or m.group(1) is None else int(m.group(1))
        if m and (earlier is None or earlier < epoch):
            found.append(receiver_wal_dir(layout.root, stream_id, earlier))
    return found


def local_block_dir(app_id: str, stream_id: int) -> str:
    """This executor's directory for WAL-off blocks (Spark gives each executor its own local
    dirs in ``SPARK_LOCAL_DIRS``; a local-mode driver's workers use ``spark.local.dir``)."""
    base = os.environ.get("SPARK_LOCAL_DIRS", tempfile.gettempdir()).split(",")[0]
    return os.path.join(base, "sparkwal-blocks", app_id, str(stream_id))


def remove_local_blocks(app_id: str, base: str) -> None:
    shutil.rmtree(os.path.join(base, "sparkwal-blocks", app_id), ignore_errors=True)


class WalBlockHandler:
    """Stores blocks durably in the stream's receiver WAL; returns their handles."""

    def __init__(self, checkpoint_dir: str | StorageLocation, stream_id: int, *,
                 storage_options: dict | None = None, clock: Clock | None = None,
                 rolling_interval_s: float = 60, stopped: threading.Event | None = None,
                 epoch: int | None = None):
        self._layout = CheckpointLayout(StorageLocation.of(checkpoint_dir, storage_options))
        self.wal_dir = receiver_wal_dir(self._layout.root, stream_id, epoch)
        self._earlier = [self._layout.at(d) for d in earlier_wal_dirs(self._layout.location, stream_id, epoch)]
        self._stopped = stopped or threading.Event()
        self._clock = clock or SYSTEM_CLOCK
        self._wal = FileBasedWriteAheadLog(self._layout.at(self.wal_dir), rolling_interval_s=rolling_interval_s,
                                           clock=self._clock)

    def store(self, block_id: str, data: bytes) -> RecordHandle:
        """Durable when it returns. A previous receiver of this stream that still holds the WAL's
        writer lock (a lease not yet expired after its executor died) is waited for, logged."""
        delay = 0.2
        while True:
            try:
                path, offset, length = self._wal.write(data, self._clock.now_ms())
                return RecordHandle(self._layout.name_of_stored(path), offset, length)
            except LogLockedError as e:
                if self._stopped.is_set():
                    raise
                log.warning("receiver WAL %s is still held (%s): waiting for the previous receiver's "
                            "lock to be released or its lease to expire", self.wal_dir, e.holder)
                self._stopped.wait(delay)
                delay = min(delay * 2, 5.0)

    def cleanup_old_blocks(self, thresh_ms: int) -> None:
        self._wal.clean(thresh_ms, wait_for_completion=False)
        for wal_dir in self._earlier:  # earlier epochs' logs, read-only: no lock taken
            reader = FileBasedWriteAheadLog(wal_dir)
            try:
                reader.clean(thresh_ms, wait_for_completion=True)
            except Exception as e:  # noqa: BLE001
                log.warning("could not clean the earlier receiver WAL %s: %s", wal_dir, e)
            finally:
                reader.close()

    def close(self) -> None:
        self._wal.close()


class LocalBlockHandler:
    """Stores blocks as files in this executor's local directory (WAL off) and copies each to
    ``replication - 1`` of ``peers``' block servers (other executors'), tried in turn from a
    random start; ``store`` returns where the copies are. ``server``: this executor's own block
    server, or None (``local[...]`` mode)."""

    def __init__(self, app_id: str, stream_id: int, secret: bytes = b"", *,
                 server: BlockCopy | None = None, peers: tuple = (), replication: int = 1):
        self.directory = local_block_dir(app_id, stream_id)
        os.makedirs(self.directory, exist_ok=True)
        self.stream_id, self._secret, self.server = stream_id, secret, server
        own = server.executor_id if server is not None else None
        self._peers = [p for p in peers if p.executor_id != own]
        if self._peers:
            k = random.randrange(len(self._peers))
            self._peers = self._peers[k:] + self._peers[:k]
        self._replication = max(1, replication)
        self._short_warned = False

    def store(self, block_id: str, data: bytes) -> list[BlockCopy]:
        from .block_client import BlockServerError, put_block

        tag = block_tag(self._secret, block_id, data)
        write_block_file(os.path.join(self.directory, block_id), tag, data)
        copies = [self.server] if self.server is not None else []
        wanted = self._replication - 1
        for i, peer in enumerate(list(self._peers)):
            if wanted == 0:
                break
            try:
                put_block((peer.host, peer.port), self._secret, self.stream_id, block_id, tag, data)
            except (OSError, BlockServerError) as e:
                log.warning("stream %d: could not copy block %s to executor %s (%s:%d): %s",
                            self.stream_id, block_id, peer.executor_id, peer.host, peer.port, e)
                self._peers.remove(peer)  # tried again after the others
                self._peers.append(peer)
                continue
            copies.append(peer)
            wanted -= 1
        if wanted > 0 and self.server is not None and not self._short_warned:
            self._short_warned = True
            log.warning("stream %d: blocks have %d of the %d copies the storage level asks for (no "
                        "other executor's block server took one): such a block is lost with its "
                        "executor", self.stream_id, len(copies), self._replication)
        return copies

    def cleanup_old_blocks(self, thresh_ms: int) -> None:
        from .block_client import BlockServerError, clean_blocks

        clean_block_dir(self.directory, thresh_ms)
        for peer in self._peers:
            try:
                clean_blocks((peer.host, peer.port), self._secret, self.stream_id, thresh_ms)
            except (OSError, BlockServerError) as e:
                log.warning("stream %d: could not clean old block copies on executor %s: %s",
                            self.stream_id, peer.executor_id, e)

    def close(self) -> None:
        pass


def clean_block_dir(directory: str, thresh_ms: int) -> None:
    """Delete the blocks of ``directory`` older than ``thresh_ms``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        try:
            if block_time_ms(name) < thresh_ms:
                os.unlink(os.path.join(directory, name))
        except (ValueError, IndexError, FileNotFoundError):
            continue


_readers: dict[StorageLocation, FileBasedWriteAheadLog] = {}
_readers_lock = threading.Lock()


def is_wal_block_name(name: str) -> bool:
    """Whether a reported handle names a segment of this checkpoint's receiver WALs, relatively
    (``receivedData/<stream>[-e<epoch>]/<segment>``): nothing a receiver reports is read elsewhere."""
    return _WAL_BLOCK_NAME.fullmatch(name) is not None


_WAL_BLOCK_NAME = re.compile(r"receivedData/\d{1,9}(?:-e\d{1,18})?/[A-Za-z0-9_.-]{1,200}")


def read_wal_block(wal_dir: str | StorageLocation, storage_options: dict | None, stream_id: int,
                   block_id: str, handle: list) -> list:
    """A block's records from the receiver WAL, by handle (its segment located by the driver:
    inside a task; read-only, no lock)."""
    location = StorageLocation.of(wal_dir, storage_options)  # equal locations share one reader
    with _readers_lock:
        reader = _readers.get(location)
        if reader is None:
            reader = _readers[location] = FileBasedWriteAheadLog(location)
    try:
        data = reader.read(RecordHandle.from_list(handle))
    except Exception as e:  # noqa: BLE001
        raise BlockReadError(f"could not read block {block_id} of stream {stream_id} from the "
                             f"write-ahead log record {tuple(handle)}: {e}") from e
    return deserialize_block(data)


def read_block(app_id: str, secret: bytes, stream_id: int, block_id: str,
               copies: Sequence[tuple[str, str, int]] = ()) -> list:
    """A WAL-off block's records: from this executor's directory when a copy is there, else
    fetched from the block servers of ``copies`` (``(executor_id, host, port)``) in turn. Raises
    BlockReadError naming the block and every copy tried when none can be read."""
    from .block_client import BlockServerError, fetch_block

    path = os.path.join(local_block_dir(app_id, stream_id), block_id)
    tried = []
    try:
        tag, data = read_block_file(path)
        return _checked(secret, block_id, tag, data, f"block file {path}")
    except FileNotFoundError:
        tried.append(f"not in this executor's {path}")
    except BlockReadError as e:
        tried.append(str(e))
    for executor_id, host, port in copies:
        if not port:
            continue
        where = f"executor {executor_id} ({host}:{port})"
        try:
            found = fetch_block((host, port), secret, stream_id, block_id)
            if isinstance(found, str):
                tried.append(f"{where} no longer has it ({found})")
                continue
            return _checked(secret, block_id, found[0], found[1], f"the copy from {where}")
        except (OSError, BlockServerError, BlockReadError) as e:
            tried.append(f"{where}: {e}")
    raise BlockReadError(
        f"block {block_id} of stream {stream_id} could not be read ({'; '.join(tried)}): it was lost "
        "with the executors that held it, or cleaned; enable "
        "spark.streaming.receiver.writeAheadLog.enable (with a checkpoint) so that received "
        "data survives executor loss")


def _checked(secret: bytes, block_id: str, tag: bytes, data: bytes, where: str) -> list:
    if not hmac.compare_digest(tag, block_tag(secret, block_id, data)):
        raise BlockReadError(f"{where} is damaged or not this application's: its HMAC does not "
                             f"match block {block_id}")
    return deserialize_block(data)


def read_local_block(app_id: str, stream_id: int, block_id: str, secret: bytes = b"") -> list:
    """A WAL-off block's records from this executor's local directory."""
    return read_block(app_id, secret, stream_id, block_id)
