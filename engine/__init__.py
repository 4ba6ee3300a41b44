"""sparkwal's thin DStream engine on PySpark RDDs, with pyspark.streaming's API names.

Porting an app: ``from pyspark.streaming import StreamingContext`` becomes
``from engine import StreamingContext``.
"""

from tracker import BatchInfo

from .context import CheckpointMismatchError, StreamingContext, StreamingContextStateError
from .dstream import DStream
from .listener import (OutputOperationInfo, ReceiverInfo, StreamingListenerReceiverError,
                       StreamingListenerReceiverStarted, StreamingListenerReceiverStopped, StreamingListener, StreamingListenerBatchCompleted,
                       StreamingListenerBatchStarted, StreamingListenerBatchSubmitted,
                       StreamingListenerDriverTakeover,
                       StreamingListenerOutputOperationCompleted, StreamingListenerStandbyReady,
                       StreamingListenerOutputOperationStarted, StreamingListenerStreamingStarted)
from .leadership import DriverAlreadyActiveError
from .receiver import BlockReadError, Receiver, SocketReceiver
from .snapshot import SnapshotError
from .state.map_with_state import State, StateSpec
from checkpoint.state_chains import read_state

__all__ = [
    "BatchInfo", "BlockReadError", "DriverAlreadyActiveError", "StreamingListenerDriverTakeover", "StreamingListenerStandbyReady", "State", "StateSpec", "read_state", "CheckpointMismatchError", "Receiver", "ReceiverInfo",
    "SocketReceiver", "StreamingListenerReceiverError", "StreamingListenerReceiverStarted",
    "StreamingListenerReceiverStopped", "DStream", "SnapshotError", "StreamingContext",
    "StreamingContextStateError", "StreamingListener",
    "OutputOperationInfo", "StreamingListenerBatchCompleted", "StreamingListenerBatchStarted",
    "StreamingListenerBatchSubmitted", "StreamingListenerOutputOperationCompleted",
    "StreamingListenerOutputOperationStarted", "StreamingListenerStreamingStarted",
]
