"""`torch.cuda.memory_stats()` dumps."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ...sources.fragments import _flatten
from .schema import MAX_TEXT_BYTES

# --------------------------------------------------------------------------------------------
# torch.cuda.memory_stats() dumps
# --------------------------------------------------------------------------------------------


def parse_memory_stats(text: str) -> dict[str, Any] | None:
    """A `torch.cuda.memory_stats()` dump (JSON, or the printed dict / OrderedDict; nested
    `memory_stats_as_nested_dict()` output is flattened to dotted keys) with derived values:
    `fragmentation` = inactive_split_bytes.all.current / reserved_bytes.all.current and
    `reserved_unallocated_bytes` = reserved - allocated. None when it is not such a dump."""
    try:
        return _parse_memory_stats(text)
    except Exception:  # never raise on garbage
        return None


def _parse_memory_stats(text: str) -> dict[str, Any] | None:
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT_BYTES:
        return None
    data: Any = None
    stripped = text.strip()
    try:
        data = json.loads(stripped)
    except ValueError:
        start, end = stripped.find("{"), stripped.rfind("}")
        ordered = re.search(r"OrderedDict\((\[.*\])\)", stripped, re.S)
        candidates = [ordered.group(1)] if ordered else []
        if 0 <= start < end:
            candidates.append(stripped[start : end + 1])
        for candidate in candidates:
            for loader in (json.loads, ast.literal_eval):
                try:
                    data = loader(candidate)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
                break
            if data is not None:
                break
    if isinstance(data, list):
        try:
            data = dict(data)
        except (TypeError, ValueError):
            return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("memory_stats"), dict):
        data = data["memory_stats"]
    pairs: list[tuple[str, Any]] = []
    _flatten(data, "", pairs)
    stats = {k: v for k, v in pairs if isinstance(v, (int, float)) or v is None}
    known = ("allocated_bytes.", "reserved_bytes.", "active_bytes.", "inactive_split", "num_")
    if not any(k.startswith(known) for k in stats):
        return None
    reserved = stats.get("reserved_bytes.all.current")
    inactive = stats.get("inactive_split_bytes.all.current")
    allocated = stats.get("allocated_bytes.all.current")
    if isinstance(reserved, (int, float)) and isinstance(inactive, (int, float)):
        stats["fragmentation"] = inactive / reserved if reserved > 0 else 0.0
    if isinstance(reserved, (int, float)) and isinstance(allocated, (int, float)):
        stats["reserved_unallocated_bytes"] = reserved - allocated
    return stats
