"""Receivers: data received on executors, stored as blocks (in the receiver WAL or on the
receiving executor), recorded by the driver, and read back by each batch.

Executor side: :class:`Receiver` (subclassed by users), the supervisor and block generator.
Driver side: the authenticated endpoint, the ReceiverTracker, ReceiverInputDStream.
"""

from .blocks import BlockReadError
from .receiver import Receiver, ReceiverNotStartedError
from .socket_receiver import SocketReceiver

__all__ = ["BlockReadError", "Receiver", "ReceiverNotStartedError", "SocketReceiver"]
