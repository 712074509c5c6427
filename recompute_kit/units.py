"""Byte units for human tables and integer byte fields for JSON documents.

One helper for every table (CLI, ablation summary, notebooks): the unit is the largest of
GiB/MiB/KiB in which the biggest value reads at least 0.1, so a tiny model shows KiB or MiB
instead of 0.00 GiB. JSON keeps exact byte counts as integers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
# Keys whose values (or whose nested values) are byte counts, besides keys ending in "bytes".
BYTE_MAPS = {"modules", "measured_modules", "estimated_modules"}


def byte_unit(values: Iterable[float | int | None]) -> tuple[str, int]:
    """(name, bytes per unit) showing the magnitude of the largest value."""
    top = max((abs(v) for v in values if v is not None), default=0)
    for name, scale in UNITS:
        if top >= scale / 10:
            return name, scale
    return "KiB", 2**10


def in_unit(value: float | int | None, scale: int, digits: int = 3) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return round(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def integer_bytes(document: Any) -> Any:
    """A copy of a JSON document whose byte fields (keys ending in 'bytes', and the per-module
    byte maps) hold integers: estimates compute fractional bytes (e.g. in-flight averages)."""
    if isinstance(document, dict):
        return {
            k: _integral(v)
            if isinstance(k, str) and (k.endswith("bytes") or k in BYTE_MAPS)
            else integer_bytes(v)
            for k, v in document.items()
        }
    if isinstance(document, list):
        return [integer_bytes(v) for v in document]
    return document
