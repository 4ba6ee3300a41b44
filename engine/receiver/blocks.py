"""Where a received block's records live, and how a task gets them back.

A block's bytes are its records pickled as one list (protocol 5); this module is their one
description. They are written by the receiver's own task and read by the same application's
tasks, never taken from a network peer.

* Receiver WAL on (``spark.streaming.receiver.writeAheadLog.enable``, the default with a
  checkpoint): each block is one record of ``<checkpoint>/receivedData/<streamId>-e<epoch>/``
  (``<streamId>/`` for a driver without a leadership epoch), a :class:`wal.FileBasedWriteAheadLog`
  (durable, CRC-checked), written before the block is reported; the report carries the record's
  handle (its segment's full path), so any executor, or the next driver, reads the block back by
  handle. The epoch in the directory's name fences receivers: a receiver of a driver that lost
  the leadership (paused, then resumed) writes only into its own epoch's directory, which no
  later driver's tracker references, and never holds up the new receiver with its WAL lock;
  the new receiver cleans the earlier epochs' old segments with its own.
* WAL off: the block is a file ``<executor local dir>/sparkwal-blocks/<app>/<streamId>/<blockId>``
  (``MAGIC crc32c:u32 bytes``; the OS page cache holds it, spilling to disk, like Spark's
  MEMORY_AND_DISK_SER), and batch tasks prefer the executor that wrote it. It is lost with that
  executor, exactly as in Spark: enable the WAL for a receiver whose data must survive.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import struct
import tempfile
import threading

import crc32c

from checkpoint.layout import CheckpointLayout
from wal import Clock, FileBasedWriteAheadLog, LogLockedError, RecordHandle, resolve

log = logging.getLogger(__name__)

LOCAL_MAGIC = b"SWBK"
_CRC = struct.Struct(">I")


class BlockReadError(RuntimeError):
    """A batch's block could not be read back (names the block, stream and where it was)."""


def serialize_block(records: list) -> bytes:
    return pickle.dumps(records, protocol=5)


def deserialize_block(data: bytes) -> list:
    return pickle.loads(data)


def block_time_ms(block_id: str) -> int:
    """The time in a block id ``input-<streamId>-<ms>-<suffix>``."""
    return int(block_id.split("-")[2])


def receiver_wal_dir(checkpoint_dir: str, stream_id: int, epoch: int | None = None) -> str:
    base = CheckpointLayout(checkpoint_dir).received_data_stream(stream_id)
    return base if epoch is None else f"{base}-e{epoch}"


def earlier_wal_dirs(checkpoint_dir: str, stream_id: int, epoch: int | None,
                     storage_options: dict | None = None) -> list[str]:
    """The receiver WAL directories of ``stream_id`` written under epochs before ``epoch``."""
    if epoch is None:
        return []
    storage, root = resolve(CheckpointLayout(checkpoint_dir).received_data, storage_options)
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
            found.append(receiver_wal_dir(checkpoint_dir, stream_id, earlier))
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

    def __init__(self, checkpoint_dir: str, stream_id: int, *, storage_options: dict | None = None,
                 clock: Clock | None = None, rolling_interval_s: float = 60,
                 stopped: threading.Event | None = None, epoch: int | None = None):
        self.wal_dir = receiver_wal_dir(checkpoint_dir, stream_id, epoch)
        self._earlier = earlier_wal_dirs(checkpoint_dir, stream_id, epoch, storage_options)
        self._storage_options = storage_options
        self._stopped = stopped or threading.Event()
        self._wal = FileBasedWriteAheadLog(self.wal_dir, rolling_interval_s=rolling_interval_s,
                                           storage_options=storage_options, clock=clock)
        self._clock = self._wal._clock

    def store(self, block_id: str, data: bytes) -> RecordHandle:
        """Durable when it returns. A previous receiver of this stream that still holds the WAL's
        writer lock (a lease not yet expired after its executor died) is waited for, logged."""
        delay = 0.2
        while True:
            try:
                return self._wal.write(data, self._clock.now_ms())
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
            reader = FileBasedWriteAheadLog(wal_dir, storage_options=self._storage_options)
            try:
                reader.clean(thresh_ms, wait_for_completion=True)
            except Exception as e:  # noqa: BLE001
                log.warning("could not clean the earlier receiver WAL %s: %s", wal_dir, e)
            finally:
                reader.close()

    def close(self) -> None:
        self._wal.close()


class LocalBlockHandler:
    """Stores blocks as files in this executor's local directory (WAL off)."""

    def __init__(self, app_id: str, stream_id: int):
        self.directory = local_block_dir(app_id, stream_id)
        os.makedirs(self.directory, exist_ok=True)

    def store(self, block_id: str, data: bytes) -> None:
        path = os.path.join(self.directory, block_id)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(LOCAL_MAGIC + _CRC.pack(crc32c.crc32c(data)) + data)
        os.replace(tmp, path)
        return None

    def cleanup_old_blocks(self, thresh_ms: int) -> None:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            try:
                if block_time_ms(name) < thresh_ms:
                    os.unlink(os.path.join(self.directory, name))
            except (ValueError, IndexError, FileNotFoundError):
                continue

    def close(self) -> None:
        pass


_readers: dict[tuple, FileBasedWriteAheadLog] = {}
_readers_lock = threading.Lock()


def read_wal_block(wal_dir: str, storage_options: dict | None, stream_id: int, block_id: str,
                   handle: list) -> list:
    """A block's records from the receiver WAL, by handle (inside a task; read-only, no lock)."""
    key = (wal_dir, repr(sorted((storage_options or {}).items())))
    with _readers_lock:
        reader = _readers.get(key)
        if reader is None:
            reader = _readers[key] = FileBasedWriteAheadLog(wal_dir, storage_options=storage_options)
    try:
        data = reader.read(RecordHandle.from_list(handle))
    except Exception as e:  # noqa: BLE001
        raise BlockReadError(f"could not read block {block_id} of stream {stream_id} from the "
                             f"write-ahead log record {tuple(handle)}: {e}") from e
    return deserialize_block(data)


def read_local_block(app_id: str, stream_id: int, block_id: str) -> list:
    """A WAL-off block's records from this executor's local directory."""
    path = os.path.join(local_block_dir(app_id, stream_id), block_id)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise BlockReadError(
            f"block {block_id} of stream {stream_id} is not on this executor ({path}): it was lost "
            "with the executor that received it, or cleaned; enable "
            "spark.streaming.receiver.writeAheadLog.enable (with a checkpoint) so that received "
            "data survives executor loss") from None
    if raw[:4] != LOCAL_MAGIC or _CRC.unpack_from(raw, 4)[0] != crc32c.crc32c(raw[8:]):
        raise BlockReadError(f"block file {path} is damaged (bad magic or CRC32C)")
    return deserialize_block(raw[8:])
