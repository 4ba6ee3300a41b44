"""State of stateful streams across restarts: snapshots referenced by checkpoints."""

from .snapshots import StateSnapshots

__all__ = ["StateSnapshots"]
