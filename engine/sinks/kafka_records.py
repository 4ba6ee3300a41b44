"""The task side of :class:`~sparkwal.engine.sinks.KafkaSink`: a partition's elements encoded as
``(key, value)`` bytes in the executor, returned whole when they fit the task's share of the
driver's budget, else left for the driver to fetch alone (one partition at a time)."""

from __future__ import annotations

from collections.abc import Iterator

#: a task's result: ``(partition index, kind, payload)``; kind "records" (payload: the list),
#: "big" (over the budget: fetched by a job of its own) or "error" (payload: the message)
RECORDS, BIG, ERROR = "records", "big", "error"
_PER_RECORD_OVERHEAD = 64  # bytes of a pickled (bytes, bytes) pair beyond its contents, about


def encode(element) -> tuple:
    """``(key, value)`` bytes of a stream's element: a value, or a ``(key, value)`` pair; str is UTF-8."""
    key, value = element if isinstance(element, tuple) and len(element) == 2 else (None, element)
    return _bytes(key), _bytes(value)


def _bytes(x):
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    raise TypeError(f"a Kafka record is a value or a (key, value) pair of bytes, str or None; got {type(x).__name__}")


def encode_partition(index: int, elements: Iterator, budget_bytes: int | None) -> list[tuple]:
    """The partition's records if their size stays within ``budget_bytes`` (None: no bound)."""
    records, size = [], 0
    try:
        for element in elements:
            key, value = encode(element)
            records.append((key, value))
            if budget_bytes is not None:
                size += len(key or b"") + len(value or b"") + _PER_RECORD_OVERHEAD
                if size > budget_bytes:
                    return [(index, BIG, None)]
    except TypeError as e:
        return [(index, ERROR, str(e))]
    return [(index, RECORDS, records)]


def parse_size(text: str) -> int:
    """Spark's size strings (``1g``, ``512m``, ``1048576``) in bytes; 0 means no bound."""
    text = str(text).strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)
