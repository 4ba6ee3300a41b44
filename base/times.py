"""Batch times as a person reads them.

A batch is named by its time in milliseconds since the epoch (its files, its log entries, the REST
API); a line a person reads shows it as the local wall-clock time Spark's UI shows.
"""

from __future__ import annotations

import time


def clock_time(ms: int) -> str:
    """``ms`` as local time, ``2026-12-04 06:25:54`` (``.250`` added when not on a second)."""
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
    return text + (f".{ms % 1000:03d}" if ms % 1000 else "")


def batch_name(ms: int | None) -> str:
    """``batch 2026-12-04 06:25:54``: a batch as a person reads it (None: the next batch)."""
    return "the next batch" if ms is None else f"batch {clock_time(ms)}"
