"""Output operations that must run in batch order, whatever ``spark.streaming.concurrentJobs`` is.

With ``spark.streaming.concurrentJobs`` above 1 (Spark's pipelining: a batch's jobs run while
earlier batches' still do), a later batch's output can reach an exactly-once sink before an
earlier one's. Such a sink stores each batch's offset ranges with its output and accepts a
batch only where the previous one ended (``DbApiSink.batch_applied``), so the later batch would fail, and
a crash between the two would leave the sink's offsets out of step with the commit log. Spark
leaves this to the user; here an output operation marked *in order* (``ForEachDStream(...,
in_order=True)``, which the transactional sinks' ``saveStream`` uses) starts its work only once
the same operation of every earlier batch still pending has completed. Other operations, and other
batches' other operations, still overlap.

No deadlock: the scheduler's pool takes jobs in the order they were submitted (batch order), so
the same operation of an earlier batch was taken before and waits on nothing later.

An in-order operation that failed stops the same operation of every later batch (which would
otherwise run at once: a failed operation is a completed one): a sink judges a range whose
partition's stored end is at or beyond its end as in, because outputs go in batch order, so a
later batch's output over a failed earlier one would make the restart skip the earlier's records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from sparkwal.base.times import batch_name

from ..errors import EngineError


class _PendingBatch(Protocol):
    def op_done(self, output_op_id: int) -> bool: ...


class BatchOrderStopped(EngineError, RuntimeError):
    """A stop gave up on the queued batches while this one waited for an earlier one's turn: it
    is left, uncommitted, for the restart."""


#: the key of :func:`note_failure` for a batch that failed before any of its operations ran
ANY_OPERATION = -1


def note_failure(cond: threading.Condition, failed: dict[int, int], output_op_id: int, time_ms: int) -> None:
    """Record that in-order operation ``output_op_id`` failed in batch ``time_ms`` (see :func:`wait_turn`)."""
    with cond:
        failed.setdefault(output_op_id, time_ms)


def wait_turn(cond: threading.Condition, pending: Mapping[int, _PendingBatch], time_ms: int,
              output_op_id: int, abandoned: Callable[[], bool], failed: Mapping[int, int] | None = None) -> None:
    """Block (on ``cond``, the scheduler's lock, notified whenever an operation completes or a
    stop abandons the queue) until operation ``output_op_id`` of every batch before ``time_ms``
    pending now has completed; raises :class:`BatchOrderStopped` if a stop abandoned one of them,
    or if the operation failed in an earlier batch (``failed``: operation, or :data:`ANY_OPERATION`
    for a batch logged whose jobs were never made, -> that batch's time)."""
    with cond:
        earlier = [b for t, b in pending.items() if t < time_ms]
        cond.wait_for(lambda: abandoned() or all(b.op_done(output_op_id) for b in earlier))
        if not all(b.op_done(output_op_id) for b in earlier):
            raise BatchOrderStopped(f"{batch_name(time_ms)}: stopped while its output operation {output_op_id} "
                                    "waited for an earlier batch's (in batch order)")
        failed_at = min((t for t in ((failed or {}).get(k) for k in (output_op_id, ANY_OPERATION)) if t is not None),
                        default=None)
        if failed_at is not None and failed_at < time_ms:
            raise BatchOrderStopped(f"{batch_name(time_ms)}: its output operation {output_op_id} failed in "
                                    f"{batch_name(failed_at)}; later batches' are left for the restart "
                                    "(in batch order)")
