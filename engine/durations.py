"""Spark's time strings in the conf (``30s``, ``500ms``, ``2min``, ``1h``), as Spark reads them."""

from __future__ import annotations

import re


def parse_duration_ms(value: str, key: str, default_unit: str = "s") -> int:
    """Spark's time strings (``30s``, ``500ms``, ``2min``, ``1h``; a bare number is in
    ``default_unit``: seconds, or milliseconds where Spark reads the key with ``getTimeAsMs``)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", str(value))
    if not m:
        raise ValueError(f"{key} must be a duration such as 30s or 500ms, got {value!r}")
    scale = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}[m.group(2) or default_unit]
    ms = int(float(m.group(1)) * scale)
    if ms <= 0:
        raise ValueError(f"{key} must be positive, got {value!r}")
    return ms
