"""What nvidia-smi and PyTorch each say a process uses, as a paste states them.

Threads about "ghost" memory put the two side by side: nvidia-smi's per-process or total
"memory used" (`this process use 499MB`, `shows from 200+mb to 700+mb`, `12433MiB / 81920MiB`)
and what PyTorch printed (`torch.cuda.memory_allocated()` -> 0, `memory_reserved: 10.2 GB`) or
the cap the user set on it (`set_per_process_memory_fraction` for a 100MB limit). `scan_usage`
reads both sides into facts for the rules (non_pytorch_memory); plain text matching only.
"""

from __future__ import annotations

import re
from typing import Any

from .text import parse_size

# "430MB", "700+mb", "12433MiB", "1.2 GB", "499 M" (a size after "/" is a total, not usage)
_SIZE_RE = re.compile(r"(?<![/\w.])(\d+(?:\.\d+)?)\s*\+?\s*([KMGT]i?B|[KMGT])\b", re.I)
_SMI_RE = re.compile(r"nvidia[- ]smi|memory[- ]usage|memory\.used|used_memory", re.I)
# "CPU memory usage: 60 GB", "RAM usage", "host memory": the machine's memory, not a GPU's
_HOST_RE = re.compile(r"\b(?:cpu|ram|host|system|rss|virtual|swap)\b", re.I)
_GPU_RE = re.compile(r"nvidia|\bgpu|cuda|vram", re.I)
# nvidia-smi's device row: "|  12433MiB / 81920MiB |" (used / total)
_SMI_ROW_RE = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")
_TORCH_RE = re.compile(
    r"memory_allocated|memory_reserved|max_memory_\w+|torch\.cuda|allocated by pytorch|"
    r"reserved by pytorch|memory_summary",
    re.I,
)
_RESERVED_RE = re.compile(r"reserved", re.I)
# "says it's using 0 memory", "memory_allocated() ... it shows `0`", "returns 0"
_ZERO_RE = re.compile(
    r"(?:using|uses|shows?|returns?|reports?|says|gives|prints?)\W{0,3}`?0`?(?:\s*(?:bytes|memory|B)\b|\s*$|[.,;])",
    re.I,
)
_CAP_RE = re.compile(r"set_per_process_memory_fraction", re.I)
_LIMIT_RE = re.compile(r"\blimit", re.I)


def _sizes(line: str) -> list[int]:
    out = []
    for number, unit in _SIZE_RE.findall(line):
        size = parse_size(number, unit if unit[-1] in "bB" else unit + "B")
        if size is not None:
            out.append(size)
    return out


def scan_usage(lines: list[str]) -> dict[str, Any]:
    """Facts, each present only when found: `smi_bytes` (the largest usage an nvidia-smi line
    states) with `smi_line`; `torch_bytes` (the largest size PyTorch printed, 0 included) with
    `torch_line` and `torch_reserved` (it was the reserved figure); `memory_cap_bytes` (the
    limit set with set_per_process_memory_fraction) with `cap_line`."""
    facts: dict[str, Any] = {}
    capped = any(_CAP_RE.search(line) for line in lines)
    for line in lines:
        smi = _SMI_RE.search(line)
        if smi and _HOST_RE.search(line) and not _GPU_RE.search(line):
            smi = None
        if (row := _SMI_ROW_RE.search(line)) is not None:
            used = int(row.group(1)) * 2**20
            if used > facts.get("smi_bytes", -1):
                facts["smi_bytes"], facts["smi_line"] = used, " ".join(row.group(0).split())
            continue
        torch = _TORCH_RE.search(line)
        sizes = _sizes(line)
        if smi and sizes and not torch and max(sizes) > facts.get("smi_bytes", -1):
            facts["smi_bytes"], facts["smi_line"] = max(sizes), line.strip()
        if torch and not smi:
            found = sizes or ([0] if _ZERO_RE.search(line) else [])
            if found and max(found) >= facts.get("torch_bytes", -1):
                facts["torch_bytes"], facts["torch_line"] = max(found), line.strip()
                facts["torch_reserved"] = bool(_RESERVED_RE.search(line))
        elif torch and smi and _ZERO_RE.search(line) and "torch_bytes" not in facts:
            facts["torch_bytes"], facts["torch_line"] = 0, line.strip()  # "while torch says 0"
            facts["torch_reserved"] = False
        if (
            capped
            and _LIMIT_RE.search(line)
            and sizes
            and not smi
            and "memory_cap_bytes" not in facts
        ):
            facts["memory_cap_bytes"], facts["cap_line"] = min(sizes), line.strip()
    return facts
