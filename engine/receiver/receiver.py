"""The Receiver API users subclass (Spark's names, Python calling style)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from ..errors import EngineError


class ReceiverStoppedError(EngineError, RuntimeError):
    """The receiver (or its block generator) has stopped: what it was handed is not stored."""


class ReceiverNotStartedError(EngineError, RuntimeError):
    """A receiver method that needs its supervisor was called outside a running receiver."""


class Receiver:
    """Receives data on an executor. Subclass it: ``onStart()`` starts threads that receive data
    and call ``store``/``storeBlock`` (it must not block), ``onStop()`` stops them.

    ``store(record)`` buffers one record into the current block (blocks are cut every
    ``spark.streaming.blockInterval``); it blocks when the bounded buffer is full, so a source
    feels back-pressure. ``storeBlock(records, metadata)`` stores one block and returns only once
    it is durable in the receiver WAL (when on) and the driver has recorded it: acknowledge the
    source after it returns and the receiver is *reliable* (nothing acknowledged is lost).

    The object is pickled into the receiver's Spark task, so keep connections and threads out of
    ``__init__`` (open them in ``onStart``).
    """

    def __init__(self, storageLevel: Any = None):
        self.storageLevel = storageLevel
        self._stream_id: int | None = None
        self._supervisor = None  # a ReceiverSupervisor, on the executor

    def bind(self, stream_id: int, supervisor=None) -> None:
        """Called by the engine: the stream this receiver feeds and, on its executor, the
        supervisor that stores what it receives."""
        self._stream_id = stream_id
        if supervisor is not None:
            self._supervisor = supervisor

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_supervisor"] = None
        return state

    # ---------------------------------------------------------------- to override

    def onStart(self) -> None:
        raise NotImplementedError("a Receiver must implement onStart()")

    def onStop(self) -> None:
        raise NotImplementedError("a Receiver must implement onStop()")

    def sourceIdentity(self) -> str:
        """What this receiver reads, the same in every version of the program (one line, no '#'): an
        upgrade gives the checkpoint's blocks not yet processed to the receiver of the same identity
        (:mod:`sparkwal.engine.identity`). By default its class; override it to name the source
        (``SocketReceiver`` gives its address), never with a secret; or name the stream with
        ``DStream.uid``."""
        return type(self).__qualname__

    def preferredLocation(self) -> str | None:
        """A host to run on, or None (anywhere)."""
        return None

    # ---------------------------------------------------------------- to call

    @property
    def streamId(self) -> int:
        if self._stream_id is None:
            raise ReceiverNotStartedError("the receiver has no stream id until ssc.receiverStream() takes it")
        return self._stream_id

    def _sup(self):
        if self._supervisor is None:
            raise ReceiverNotStartedError(
                f"{type(self).__name__} is not running: store/restart/stop work only on an executor, "
                "between onStart() and onStop()")
        return self._supervisor

    def store(self, record: Any) -> None:
        self._sup().push_single(record)

    def storeMany(self, records: Iterable[Any]) -> None:
        """Like ``store`` for each record (rate-limited per record, cut into blocks with the
        rest), with one call: the fast path for a receiver that reads records in chunks."""
        self._sup().push_many(records if isinstance(records, list) else list(records))

    def storeBlock(self, records: Iterable[Any], metadata: Any = None) -> None:
        self._sup().push_block(list(records), metadata)

    def restart(self, message: str, error: BaseException | None = None,
                millisecondsDelay: int | None = None) -> None:
        self._sup().restart_receiver(message, error, millisecondsDelay)

    def stop(self, message: str, error: BaseException | None = None) -> None:
        self._sup().stop(message, error)

    def reportError(self, message: str, error: BaseException | None) -> None:
        self._sup().report_error(message, error)

    def isStarted(self) -> bool:
        return self._supervisor is not None and self._supervisor.receiver_started

    def isStopped(self) -> bool:
        return self._supervisor is None or self._supervisor.stopped
