"""The driver room: the machinery behind :class:`sparkwal.engine.StreamingContext`.

:class:`Driver` owns the driver's state; each module here does one job on it:

====================  ==========================================================================
module                job
====================  ==========================================================================
``driver``            the state and the start/stop lifecycle
``events``            the event bus that listeners (and the next metrics and UI) subscribe to
``scheduler``         the jobs' execution and each batch's commit; owns the generator
``generator``         the batch timer and job generation, then each batch's checkpoints
``timer``             the batch timer
``batches``           the batch log's side of each batch (plan, log, commit)
``checkpointing``     what a DStream checkpoint holds, and what follows once one is durable
``recovery``          Spark's restart rule: which batches re-run after a restart
``upgrade``           a changed program taking a checkpoint's inputs and state by identity
``upgrade_preview``   ``sparkwal upgrade plan``: that plan, said before the deploy
``program``           the graph pickled into the checkpoint's code part, and read back
``leadership``        leading the checkpoint directory (epochs, leases, fencing)
``standby``           a hot standby that takes the stream over
``receiver_lifecycle``  the block tracker and the receivers' start and stop
``backlog``           saying when batches fall behind
====================  ==========================================================================
"""

from .driver import Driver
from .events import EventBus
from .states import ACTIVE, INITIALIZED, STOPPED, StreamingContextStateError

__all__ = ["ACTIVE", "INITIALIZED", "STOPPED", "Driver", "EventBus", "StreamingContextStateError"]
