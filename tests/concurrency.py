"""Test helper: run a function in several threads at once and surface any worker's exception."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


def run_concurrently(target: Callable, args_per_thread: Iterable[tuple]) -> None:
    """Start one thread per args tuple, wait for all, re-raise the first exception raised."""
    errors: list[BaseException] = []

    def run(*args):
        try:
            target(*args)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=args) for args in args_per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
