"""Are the received blocks a checkpoint still needs still there? The block tracker's WAL names
every block a kept batch (or the next batch) reads; each one stored in a receiver's WAL must read
back. A receiver WAL's tail that no record a kept batch needs lies in is harmless (a write cut
short by a crash); one that such a record lies in is lost data, whatever the tail looks like."""

from __future__ import annotations

from dataclasses import dataclass

from sparkwal.base.times import batch_name


@dataclass(frozen=True)
class LostBlock:
    block_id: str
    stream_id: int
    batch_ms: int | None  #: None: not allocated to a batch yet
    where: str  #: the record's segment and offset
    why: str

    def describe(self) -> str:
        batch = batch_name(self.batch_ms)
        return f"block {self.block_id} of stream {self.stream_id}, which {batch} reads, is lost: {self.why}"


def lost_blocks(checkpoint_url: str, options: dict | None, only_log: str | None = None) -> list[LostBlock]:
    """The blocks the checkpoint's tracker names whose receiver-WAL records do not read back
    (within the receiver WAL ``only_log`` if given). Reads only, takes no lock."""
    from sparkwal.checkpoint.layout import RECEIVED_BLOCK_METADATA, CheckpointLayout
    from sparkwal.tracker.inspect import named_blocks
    from sparkwal.wal import FileBasedWriteAheadLog, RecordHandle, WalError
    from sparkwal.wal.storage import resolve

    where = CheckpointLayout(checkpoint_url)
    storage, root = resolve(checkpoint_url, options)
    if RECEIVED_BLOCK_METADATA not in storage.list_dirs(root):
        return []
    readers: dict[str, FileBasedWriteAheadLog] = {}
    lost = []
    try:
        for named in named_blocks(where.block_metadata, options):
            handle = named.block.wal_handle
            if handle is None:
                continue
            own = where.own_name(handle.path)
            if own is None:
                continue
            log_dir = own.rpartition("/")[0]
            if only_log is not None and where.relative(only_log) != log_dir:
                continue
            path = storage.join(root, own)
            if log_dir not in readers:
                readers[log_dir] = FileBasedWriteAheadLog(where.locate(log_dir), storage_options=options)
            try:
                readers[log_dir].read(RecordHandle(path, handle.offset, handle.length))
            except (WalError, OSError) as e:
                lost.append(LostBlock(named.block.block_id, named.block.stream_id, named.batch_ms,
                                      f"{storage.url(path)} offset {handle.offset}", str(e)))
    finally:
        for reader in readers.values():
            reader.close()
    return lost


def checkpoint_of_receiver_log(log_url: str) -> str | None:
    """The checkpoint directory holding ``log_url`` when it is a receiver's WAL there
    (``<checkpoint>/receivedData/<stream>[-e<epoch>]``), else None."""
    from sparkwal.checkpoint.layout import RECEIVED_DATA

    parent, _, _name = log_url.rstrip("/").rpartition("/")
    top, _, middle = parent.rpartition("/")
    return top if middle == RECEIVED_DATA and top else None
