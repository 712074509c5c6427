"""Memory snapshots (`torch.cuda.memory._snapshot()` / `_dump_snapshot()`), loaded with a
restricted unpickler.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import IO, Any

from .schema import MAX_SNAPSHOT_BYTES, EvidenceError

# --------------------------------------------------------------------------------------------
# Memory snapshots (torch.cuda.memory._snapshot() / _dump_snapshot())
# --------------------------------------------------------------------------------------------


class _SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global: a snapshot holds only dicts, lists, strings,
    numbers, booleans and None, so any class or function reference means the file is not a
    snapshot (or is hostile). Nothing is imported or called."""

    def __init__(self, file: IO[bytes], label: str) -> None:
        super().__init__(file)
        self._label = label

    def find_class(self, module: str, name: str) -> Any:
        module = {"posix": "os", "nt": "os", "__builtin__": "builtins"}.get(module, module)
        raise EvidenceError(
            f"refusing to load snapshot {self._label}: it references {module}.{name}; "
            "a memory snapshot holds only plain containers"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise EvidenceError(
            f"refusing to load snapshot {self._label}: it uses persistent ids; "
            "a memory snapshot holds only plain containers"
        )


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def summarize_snapshot(data: Any) -> dict[str, Any]:
    """Summary of a snapshot dict (`{"segments": [...], "device_traces": [...]}`) or of the
    legacy segment list: reserved, allocated (active blocks), largest free block, and
    `fragmentation` = free bytes inside segments that also hold active blocks / reserved."""
    if isinstance(data, list):
        data = {"segments": data}
    if not isinstance(data, dict) or not isinstance(data.get("segments", []), list):
        raise EvidenceError("not a memory snapshot: expected a dict with a 'segments' list")
    segments = [s for s in data.get("segments", []) if isinstance(s, dict)]
    reserved = allocated = requested = inactive_split = largest_free = 0
    free_blocks = active_blocks = 0
    by_type: dict[str, int] = {}
    for seg in segments:
        size = _number(seg.get("total_size"))
        reserved += size
        kind = str(seg.get("segment_type", "unknown"))
        by_type[kind] = by_type.get(kind, 0) + size
        blocks = [b for b in seg.get("blocks", []) or [] if isinstance(b, dict)]
        seg_active = seg_free = 0
        for block in blocks:
            bsize = _number(block.get("size"))
            state = str(block.get("state", ""))
            if state.startswith("active"):
                seg_active += bsize
                active_blocks += 1
                requested += _number(block.get("requested_size"))
            elif state == "inactive":
                seg_free += bsize
                free_blocks += 1
                largest_free = max(largest_free, bsize)
        if not blocks:  # segments summarised without blocks
            seg_active = _number(seg.get("active_size") or seg.get("allocated_size"))
        allocated += seg_active
        if seg_active:
            inactive_split += seg_free
    traces = data.get("device_traces", [])
    trace_entries = [e for t in traces if isinstance(t, list) for e in t if isinstance(e, dict)]
    return {
        "segments": len(segments),
        "total_reserved_bytes": reserved,
        "total_allocated_bytes": allocated,
        "total_requested_bytes": requested,
        "total_free_bytes": reserved - allocated,
        "largest_free_block_bytes": largest_free,
        "inactive_split_bytes": inactive_split,
        "fragmentation": inactive_split / reserved if reserved else 0.0,
        "active_blocks": active_blocks,
        "free_blocks": free_blocks,
        "reserved_bytes_by_segment_type": by_type,
        "trace_entries": len(trace_entries),
        "oom_trace_entries": sum(1 for e in trace_entries if e.get("action") == "oom"),
    }


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a `torch.cuda.memory._dump_snapshot()` pickle (or the snapshot saved as JSON) and
    return `summarize_snapshot` of it.

    The pickle is read with an unpickler that refuses every global, so nothing in the file is
    imported or executed. Raises EvidenceError (one line) for unreadable, corrupt, truncated or
    unsafe files."""
    path = Path(path)
    label = f"'{path}'"
    try:
        size = path.stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise EvidenceError(f"snapshot {label} is too large ({size} bytes)")
        blob = path.read_bytes()
    except OSError as exc:
        raise EvidenceError(f"cannot read snapshot {label}: {exc.strerror or exc}") from None
    return _load_snapshot_bytes(blob, label)


def _load_snapshot_bytes(blob: bytes, label: str) -> dict[str, Any]:
    head = blob.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            data = json.loads(blob.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise EvidenceError(f"snapshot {label} is not valid JSON: {reason}") from None
    else:
        try:
            data = _SnapshotUnpickler(io.BytesIO(blob), label).load()
        except EvidenceError:
            raise
        except (pickle.UnpicklingError, EOFError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise EvidenceError(f"snapshot {label} is corrupt or truncated: {reason}") from None
        except Exception as exc:  # any other failure of a damaged pickle
            raise EvidenceError(
                f"snapshot {label} is corrupt: {type(exc).__name__}: {str(exc)[:200]}"
            ) from None
    try:
        return summarize_snapshot(data)
    except EvidenceError as exc:
        raise EvidenceError(f"snapshot {label}: {exc}") from None
