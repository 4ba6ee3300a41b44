"""Deprecated alias: the thread service lives in the base room, :mod:`sparkwal.base.service`."""

from sparkwal.base.service import Service, spawn

__all__ = ["Service", "spawn"]
