"""Evidence parsed from real training artefacts.

Every parser is tolerant of noise: rank prefixes (`[rank3]:`, ` 0: `), timestamps, ANSI colour
codes, hard-wrapped pastes and truncated lines. Nothing here raises on bad input: what cannot
be read is skipped (and noted), so the doctor always runs. The only errors raised are
`EvidenceError`s for files that cannot be opened and for memory snapshots that are corrupt or
unsafe to load, each with a one-line message.

Public API:

* `clean_line`, `parse_size` - the building blocks;
* `parse_oom` - PyTorch's CUDA/HIP out-of-memory messages, every generation (see `OOM_GENERATIONS`);
* `parse_log`, `parse_log_file` - a whole training log (streamed from disk, bounded memory);
* `parse_config`, `parse_config_with_notes` - YAML/JSON, Megatron-LM command lines, Hydra
  overrides, Python assignments and Megatron argument dumps, to flat Megatron-Core keys;
* `parse_experiments` - ablation results as JSONL, CSV or Markdown tables;
* `parse_memory_stats`, `load_snapshot`, `summarize_snapshot` - allocator statistics;
* `collect` - all of the above from paths (or stdin), merged into one `Evidence`.
"""

from __future__ import annotations

import ast
import codecs
import csv
import gzip
import io
import json
import pickle
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any

from recompute_kit.config import CONFIG_KEYS, ConfigError, format_spec, parse_spec


class EvidenceError(ValueError):
    """An input that cannot be read (missing file, unsafe or corrupt snapshot). One line."""


# --------------------------------------------------------------------------------------------
# The evidence schema (contract: fields may be added, never renamed or removed)
# --------------------------------------------------------------------------------------------


@dataclass
class OOMEvent:
    """A CUDA out-of-memory message (any PyTorch generation). Absent values are None."""

    requested_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None  # allocated by PyTorch (incl. private pools)
    reserved_unallocated_bytes: int | None = None  # reserved by PyTorch but unallocated
    process_bytes: int | None = None  # this process, including non-PyTorch memory
    other_processes_bytes: int | None = None  # sum over the other processes listed
    reserved_bytes: int | None = None  # old messages: reserved (or cached) in total
    allowed_bytes: int | None = None  # set_per_process_memory_fraction
    private_pool_bytes: int | None = None  # CUDA graphs' private pools
    device: int | None = None
    rank: int | None = None
    generation: str = ""  # which message format: gen1_cached ... gen6_pytorch_alloc_conf
    line: str = ""  # the message as found (first 300 characters)
    backend: str = "cuda"  # cuda | hip (ROCm) | xpu
    truncated: bool = False  # the message was cut before all its fields
    line_number: int | None = None  # 1-based line of the log where the message starts


@dataclass
class Iteration:
    """One training-progress line (Megatron-LM, Megatron-Bridge or NeMo)."""

    iteration: int | None = None
    elapsed_ms: float | None = None
    tflops_per_gpu: float | None = None
    loss: float | None = None
    source: str = ""  # megatron | megatron-bridge | nemo
    total_iterations: int | None = None
    learning_rate: float | None = None
    global_batch_size: int | None = None
    grad_norm: float | None = None
    max_memory_allocated_bytes: int | None = None  # NeMo 2 progress lines print these
    max_memory_reserved_bytes: int | None = None


@dataclass
class MemoryReport:
    """A memory report line (Megatron's report_memory and friends); bytes."""

    rank: int | None = None
    allocated_bytes: int | None = None
    max_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    max_reserved_bytes: int | None = None
    label: str = ""  # e.g. "(after 10 iterations)"
    iteration: int | None = None
    source: str = ""  # megatron | megatron-bridge | nemo
    active_bytes: int | None = None  # Megatron-Bridge's memory keys
    max_active_bytes: int | None = None
    inactive_bytes: int | None = None  # inactive_split_bytes: fragmentation
    max_inactive_bytes: int | None = None
    alloc_retries: int | None = None
    device_used_bytes: int | None = None  # "total device memory used" (Megatron main)


@dataclass
class ErrorEvent:
    """An exception or warning from a traceback or log."""

    type: str = ""  # e.g. ValueError, torch.OutOfMemoryError, UserWarning
    message: str = ""
    frames: list[str] = field(default_factory=list)  # "file:line in function", innermost last
    kind: str = "exception"  # exception | warning
    details: str = ""  # further lines of a multi-line message
    chained: str = ""  # "cause" / "context": raised from / while handling the previous one
    rank: int | None = None  # the first rank that printed it
    count: int = 1  # identical events (same type, message and frames) are counted, not repeated


@dataclass
class Evidence:
    """Everything the doctor could read. Lists may be empty; absent values are None."""

    oom: list[OOMEvent] = field(default_factory=list)
    iterations: list[Iteration] = field(default_factory=list)
    memory: list[MemoryReport] = field(default_factory=list)
    errors: list[ErrorEvent] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # flat Megatron keys -> values
    experiments: list[dict[str, Any]] = field(default_factory=list)
    memory_stats: dict[str, Any] | None = None  # torch.cuda.memory_stats() keys
    snapshot: dict[str, Any] | None = None  # summary of a memory snapshot
    env: dict[str, str] = field(default_factory=dict)  # e.g. PYTORCH_CUDA_ALLOC_CONF seen
    sources: list[str] = field(default_factory=list)  # what was read
    notes: list[str] = field(default_factory=list)  # what could not be read, and why
    # Megatron's "Theoretical memory footprints" line: weight_and_optimizer/activation/total
    theoretical_memory: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def merge(self, other: Evidence) -> Evidence:
        """Combine evidence from several inputs (later config keys win)."""
        return Evidence(
            oom=self.oom + other.oom,
            iterations=self.iterations + other.iterations,
            memory=self.memory + other.memory,
            errors=self.errors + other.errors,
            config={**self.config, **other.config},
            experiments=self.experiments + other.experiments,
            memory_stats=other.memory_stats or self.memory_stats,
            snapshot=other.snapshot or self.snapshot,
            env={**self.env, **other.env},
            sources=self.sources + other.sources,
            notes=self.notes + other.notes,
            theoretical_memory={**self.theoretical_memory, **other.theoretical_memory},
        )


# Limits that keep memory bounded on huge or hostile inputs.
MAX_LINE_CHARS = 1 << 16  # longer lines are cut (a progress bar without newlines, binary junk)
MAX_OOM_EVENTS = 10_000
MAX_ERROR_EVENTS = 2_000  # distinct ones; repeats are counted
MAX_ITERATIONS = 2_000_000
MAX_MEMORY_REPORTS = 200_000
MAX_NOTES = 50
MAX_TEXT_BYTES = 256 << 20  # configs, experiment tables, memory stats read whole
MAX_SNAPSHOT_BYTES = 8 << 30

# --------------------------------------------------------------------------------------------
# Line cleaning
# --------------------------------------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_PREFIX_RE = re.compile(
    r"\s*(?:"
    r"\[rank(?P<rank>\d+)\]:"  # torch.distributed: [rank3]:
    r"|\[(?P<role>[A-Za-z_]+)(?P<local>\d+)\]:"  # torchrun --tee: [default0]:
    r"|(?P<task>\d{1,5}):(?=\s|$)"  # srun --label: " 0: "
    r"|\d{1,3}(?:\.\d{1,3}){3}:(?=\s|$)"  # pdsh / DeepSpeed launcher: "192.168.0.32: "
    r"|\[?(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?"
    r"|\[NeMo (?P<level>[A-Z]) [^\]]*\]"  # [NeMo I 2025-01-01 12:00:00 file:12]
    r")[ \t]?"
)
_PREFIX_FIRST = frozenset(" \t[0123456789")


def _strip_prefixes(line: str) -> tuple[str, int | None, bool, str]:
    """Remove ANSI codes and leading rank/timestamp prefixes.

    Returns (text, rank, stamped, level): the rank from `[rankN]:` (or a launcher's
    `[defaultN]:` / srun's `N:` when there is no `[rankN]:`), whether a timestamp was removed
    (a new log record starts there), and NeMo's log level letter ("W" for warnings)."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    if not line or line[0] not in _PREFIX_FIRST:
        return line, None, False, ""
    rank: int | None = None
    other_rank: int | None = None
    stamped = False
    level = ""
    for _ in range(8):
        m = _PREFIX_RE.match(line)
        if m is None:
            break
        if m.group("rank") is not None:
            rank = int(m.group("rank"))
        elif m.group("local") is not None:
            other_rank = int(m.group("local"))
        elif m.group("task") is not None:
            if other_rank is None:
                other_rank = int(m.group("task"))
        elif m.group("ts") is not None:
            stamped = True
        elif m.group("level") is not None:
            level = m.group("level")
            stamped = True
        line = line[m.end() :]
        if not line:
            break
    return line, rank if rank is not None else other_rank, stamped, level


def clean_line(line: str) -> str:
    """A log line without ANSI escape codes, rank prefixes (`[rank3]:`, `[default0]:`, srun's
    ` 0: `), leading timestamps (`[2025-01-01 12:00:00,123]`, `2025-01-01 12:00:00.123`) and
    NeMo's `[NeMo I ...]` prefix. Indentation after a prefix is kept."""
    return _strip_prefixes(line)[0]


# --------------------------------------------------------------------------------------------
# Sizes and numbers
# --------------------------------------------------------------------------------------------

_UNIT_BYTES: dict[str, int] = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "pib": 1 << 50,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
}
_SIZE_RE = re.compile(
    r"\s*([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]+)?(?![A-Za-z])"
)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b", re.I)


def parse_size(text: str, unit: str | None = None) -> int | None:
    """Bytes from a size: "12.50 MiB", "10.92 GiB", "512 bytes", "1.5 KiB", "3 GB" (SI: 1e9).

    A bare number takes `unit` ("58.8" with unit "GB" is 58.8e9); without one it is None, as is
    anything that is not a size. Binary units (KiB, MiB, GiB) are powers of 1024, SI units
    (KB, MB, GB) powers of 1000. The result is rounded to the nearest byte."""
    if not isinstance(text, str):
        return None
    m = _SIZE_RE.match(text)
    if m is None:
        return None
    name = (m.group(2) or unit or "").strip().lower()
    if name not in _UNIT_BYTES:
        return None
    try:
        value = Decimal(m.group(1).replace(",", "")) * _UNIT_BYTES[name]
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite() or value < 0:
        return None
    return int(value.to_integral_value())


def _size(number: str, unit: str) -> int | None:
    return parse_size(f"{number} {unit}")


def _float(text: str | None) -> float | None:
    """The first number in `text` (`~704` -> 704.0, `1.818812E+00` -> 1.818812)."""
    if not text:
        return None
    try:
        return float(text)  # the common case: " 5361.6 " (float() ignores the spaces)
    except ValueError:
        pass
    m = _NUMBER_RE.search(text)
    if m is None:
        return None
    try:
        return float(m.group(0))
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    value = _float(text)
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return int(value)


def _compact(text: str) -> str:
    """`text` without any whitespace (hard-wrapped pastes lose or add spaces at the wraps)."""
    return "".join(text.split())


# --------------------------------------------------------------------------------------------
# Out-of-memory messages
# --------------------------------------------------------------------------------------------

# Which message format produced an OOMEvent; sources in shared/reference/real-formats.md.
OOM_GENERATIONS = {
    "gen1_cached": "'(GPU 0; T total capacity; A already allocated; F free; C cached)' (<=1.4)",
    "gen2_reserved": "'... R reserved in total by PyTorch)' (1.5-1.9)",
    "gen3_max_split": "gen2 plus 'try setting max_split_size_mb' (1.10-2.0)",
    "gen4_capacty": "'GPU 0 has a total capacty of' (typo), per-process list (2.1)",
    "gen5_expandable": "'... PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True' (2.2+)",
    "gen6_pytorch_alloc_conf": "'... PYTORCH_ALLOC_CONF=expandable_segments:True' (2.9+)",
    "gen7_docs_url": "the docs.pytorch.org URL of newer main",
    "modern_truncated": "the 2.1+ layout, cut before the advice that dates it",
    "legacy_truncated": "the <=2.0 layout, cut before the fields that date it",
    "cuda_error": "'CUDA error: out of memory' (a CUDA call, not the caching allocator)",
    "nccl_cuda_failure": "NCCL's \"Cuda failure 2 'out of memory'\" (NCCL's own buffers)",
    "triton_cuda": "'Triton Error [CUDA]: out of memory' (a Triton kernel launch)",
    "unknown": "an out-of-memory message without the allocator's fields",
}

_SIZE_PAT = r"(\d+(?:\.\d+)?) ?(bytes|[KMGTP]iB|[KMGTP]B)"


def _flex(pattern: str, flags: int = re.I) -> re.Pattern[str]:
    """Compile an OOM field pattern in which every space may be missing (hard-wrap joins);
    case-insensitive unless told (pastes write "tried to allocate 32768.00 Gib")."""
    return re.compile(pattern.replace("SIZE", _SIZE_PAT).replace(" ", r"\s?"), flags)


_OOM_START_RE = re.compile(
    r"(?:CUDA|HIP|XPU)\s?out\s?of\s?memory|CUDA error: out of memory|OutOfMemoryError"
    r"|Cuda failure \d+ 'out of memory'|Triton Error \[CUDA\]: out of memory"
)
_OOM_VALID_RE = re.compile(
    r"(?:cuda|hip|xpu)outofmemory|cudaerror:outofmemory|outofmemoryerror:"
    r"|cudafailure\d+'outofmemory'|tritonerror\[cuda\]:outofmemory"
)
_OOM_FIELDS: dict[str, re.Pattern[str]] = {
    "requested_bytes": _flex(r"Tried to allocate SIZE"),
    "old_device": _flex(r"\(GPU (\d+) ;"),
    "old_total": _flex(r"SIZE total capacity"),
    "old_allocated": _flex(r"SIZE already allocated"),
    "old_free": _flex(r"SIZE free ?[;)]"),
    "old_reserved": _flex(r"SIZE reserved in total by PyTorch"),
    "old_cached": _flex(r"SIZE cached"),
    "new_device": _flex(r"GPU (\d+) has a total capac(?:i)?ty"),
    "new_total": _flex(r"total capac(?:i)?ty of SIZE"),
    "new_free": _flex(r"of which SIZE is free"),
    "process_bytes": _flex(r"this process has SIZE memory in use"),
    "allowed_bytes": _flex(r"SIZE allowed ?;"),
    "new_allocated": _flex(r"Of the allocated memory SIZE is allocated by PyTorch"),
    "private_pool_bytes": _flex(r"with SIZE allocated in private pools"),
    "reserved_unallocated_bytes": _flex(r"and SIZE is reserved by PyTorch but unallocated"),
}
# Case matters here: "Process 123 has" is another process, "this process has" is this one.
_OOM_OTHER_PROCESS_RE = _flex(r"Process (\d+) has SIZE memory in use", flags=0)
# The advice that ends each message generation, without whitespace: continuation lines of a
# hard-wrapped message are pieces of one of these (ROCm builds say PYTORCH_HIP_ALLOC_CONF).
_OOM_TAILS = tuple(
    _compact(tail).replace("PYTORCH_CUDA_ALLOC_CONF", env)
    for env in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
    for tail in (
        "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
        "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        "If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
        "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
        "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
        "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
    )
)


def _oom_data_complete(compact: str) -> bool:
    """Whether a (compacted) OOM message has all its fields: old layout up to its ')', new
    layout up to 'but unallocated'."""
    if "butunallocated" in compact:
        return True
    gpu = compact.find("(GPU")
    return gpu >= 0 and compact.find(")", gpu) >= 0


def _oom_fully_complete(compact: str) -> bool:
    """Whether a (compacted) OOM message includes the final words of its advice."""
    if compact.endswith(")") and "cuda.html#" in compact:
        return True
    return compact.endswith("ALLOC_CONF") and "max_split_size_mb" in compact


def _oom_generation(compact: str) -> str:
    if "(GPU" in compact and "cached" in compact and "reservedintotal" not in compact:
        return "gen1_cached"
    if "reservedintotalbyPyTorch" in compact:
        return "gen3_max_split" if "max_split_size_mb" in compact else "gen2_reserved"
    if "totalcapactyof" in compact:
        return "gen4_capacty"
    if "docs.pytorch.org" in compact or "optimizing-memory-usage" in compact:
        return "gen7_docs_url"
    if "PYTORCH_ALLOC_CONF=" in compact:
        return "gen6_pytorch_alloc_conf"
    if "ALLOC_CONF=expandable" in compact:
        return "gen5_expandable"
    if "totalcapacityof" in compact:
        return "gen4_capacty" if "max_split_size_mb" in compact else "modern_truncated"
    if "(GPU" in compact or "totalcapacity" in compact:
        return "legacy_truncated"
    lower = compact.lower()
    if "cudaerror:outofmemory" in lower:
        return "cuda_error"
    if "cudafailure" in lower and "'outofmemory'" in lower:
        return "nccl_cuda_failure"
    if "tritonerror[cuda]:outofmemory" in lower:
        return "triton_cuda"
    return "unknown"


def _oom_event(text: str, rank: int | None, line_number: int | None = None) -> OOMEvent | None:
    """Parse one OOM message (possibly joined from several lines); None if it is not one."""
    compact = _compact(text)
    if not _OOM_VALID_RE.search(compact.lower()):
        return None
    flat = " ".join(text.split())
    start = _OOM_START_RE.search(flat)
    # Keep the exception type in `line` (torch.OutOfMemoryError: CUDA out of memory. ...).
    exc = _EXC_SEARCH_RE.search(flat)
    if exc is not None and (start is None or exc.start() <= start.start()):
        begin = exc.start(1)
    else:
        begin = start.start() if start is not None else 0
    event = OOMEvent(rank=rank, line=flat[begin : begin + 300], line_number=line_number)
    values: dict[str, Any] = {}
    for name, pattern in _OOM_FIELDS.items():
        m = pattern.search(flat)
        if m is None:
            continue
        values[name] = int(m.group(1)) if name.endswith("device") else _size(*m.groups())
    event.requested_bytes = values.get("requested_bytes")
    event.device = values.get("old_device", values.get("new_device"))
    event.total_bytes = values.get("old_total", values.get("new_total"))
    event.free_bytes = values.get("old_free", values.get("new_free"))
    event.allocated_bytes = values.get("old_allocated", values.get("new_allocated"))
    event.reserved_bytes = values.get("old_reserved", values.get("old_cached"))
    event.process_bytes = values.get("process_bytes")
    event.allowed_bytes = values.get("allowed_bytes")
    event.private_pool_bytes = values.get("private_pool_bytes")
    event.reserved_unallocated_bytes = values.get("reserved_unallocated_bytes")
    others = [_size(n, u) for _, n, u in _OOM_OTHER_PROCESS_RE.findall(flat)]
    if others:
        event.other_processes_bytes = sum(x for x in others if x is not None)
    event.generation = _oom_generation(compact)
    lower = flat.lower()
    event.backend = "hip" if "hip out of" in lower else "xpu" if "xpu out of" in lower else "cuda"
    outside_allocator = ("cuda_error", "nccl_cuda_failure", "triton_cuda")
    event.truncated = event.generation not in outside_allocator and not _oom_data_complete(compact)
    return event


def parse_oom(text: str) -> list[OOMEvent]:
    """Every out-of-memory message in `text`, hard-wrapped or not, with rank prefixes or not.

    Recognises all PyTorch generations (see `OOM_GENERATIONS`), ROCm's "HIP out of memory" and
    the `torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError` / `RuntimeError` prefixes.
    Truncated messages give events with the fields that were there (`truncated=True`)."""
    parser = _LogParser()
    for line in _split_lines(text):
        parser.feed(line)
    return parser.finish().oom


# --------------------------------------------------------------------------------------------
# Exceptions and warnings
# --------------------------------------------------------------------------------------------

_DOTTED = r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"
_EXC_SEARCH_RE = re.compile(
    rf"(?:^|(?<=[\s:(]))({_DOTTED}(?:Error|Exception|Interrupt|Failure|Exit)):\s?(.*)$"
)
_EXC_LINE_RE = re.compile(rf"^({_DOTTED})(?::\s?(.*))?$")
# Warnings libraries print without a "XWarning:" prefix (logger.warning_once in transformers,
# print() in PEFT recipes), recognised by their wording.
_BARE_WARNINGS = (
    "is incompatible with gradient checkpointing",
    "None of the inputs have requires_grad",
    "pass in use_reentrant",
    "use_reentrant parameter should be passed explicitly",
    "does not support gradient checkpointing",
)
_WARN_RE = re.compile(rf"^(?:(\S.*?):(\d+): )?({_DOTTED}Warning): (.*)$")
_MEGATRON_WARN_RE = re.compile(r"^WARNING:(?:[\w.]+:)?\s?(.*)$")
_FRAME_RE = re.compile(r'^\s*File "(.+?)", line (\d+)(?:, in (.*))?$')
_CHAIN_CAUSE = "The above exception was the direct cause of the following exception"
_CHAIN_CONTEXT = "During handling of the above exception, another exception occurred"
_MAX_FRAMES = 200
_MAX_DETAIL_LINES = 30


class _Traceback:
    """One rank's traceback or exception message being read."""

    __slots__ = ("chained", "details", "event", "frames", "state")

    def __init__(self, chained: str = "") -> None:
        self.frames: list[str] = []
        self.state = "frames"  # frames -> message (after the exception line)
        self.event: ErrorEvent | None = None
        self.details: list[str] = []
        self.chained = chained


# --------------------------------------------------------------------------------------------
# Training-progress and memory lines
# --------------------------------------------------------------------------------------------

_MEGATRON_ITER_RE = re.compile(r"(?:^|\s)iteration\s*(\d+)\s*/\s*(\d+)\s*\|")
# The fields read from a Megatron iteration line, in the order Megatron prints them.
_MEGATRON_LABELS = (
    "elapsed time per iteration (ms):",
    "throughput per GPU (TFLOP/s/GPU):",
    "| learning rate:",
    "global batch size:",
    "| lm loss:",
    "| grad norm:",
)
_MEGATRON_FAST_RE = re.compile(
    r"iteration\s+(\d+)\s*/\s*(\d+) \|"
    + "".join(
        rf"(?:.*?{re.escape(label.lstrip('| '))}([^|]*)(?:\||$))?" for label in _MEGATRON_LABELS
    )
)
_NEMO_ITER_RE = re.compile(r"epoch\s*(\d+),\s*iteration\s*(\d+)\s*/\s*(\d+)")
_NAN_ITERS_RE = re.compile(r"numberofnaniterations:\d")
_STEP_TIME_RE = re.compile(
    r"Step\s?Time\s?:\s?([\d.]+)\s?s\s?GPU\s?utilization:\s?([\d.]+)\s?(?:MODEL_)?TFLOP/s/GPU"
)
_MB_PROGRESS_RE = re.compile(r"Iteration:\s*(\d+)\s+Job throughput:\s*([\d.]+)\s*MODEL_TFLOP")
_TQDM_RE = re.compile(r"\|\s*(\d+)/(\d+)\s*\[[^\]]*?,\s*([\d.]+)\s*(s/it|it/s)(?:,\s*([^\]]*))?\]")
_MEM_REPORT_RE = re.compile(r"\[Rank\s*(\d+)\]\s*(.*?)\s*memory\s*\((MB|GB)\)")
_MEM_COMPLETE_RE = re.compile(r"maxreserved:[\d.]+$|allocated-count:\d+")
_AFTER_ITERS_RE = re.compile(r"after\s*(\d+)\s*iterations")
_WORLD_RE = re.compile(r"(?<![\w-])([\w-]+) size: (\d+)")
_THEORY_RE = re.compile(
    r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB"
    r"(?:, activation=([\d.]+) MB)?(?:, total=([\d.]+) MB)?"
)
_ENV_RE = re.compile(
    r"(PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF)['\"]?\]?\s*(?:=|:\s)\s*['\"]?([A-Za-z_][\w:.,\[\]|=-]*)"
)
# (No lazy group before a trailing \s*$ in these patterns: that backtracks quadratically.)
_ARG_RE = re.compile(r"^(\s*)([A-Za-z_][\w.-]*) (\.+)(?: (.*))?$")
_ARG_LONG_RE = re.compile(r"^\s+([A-Za-z_][\w.-]*)\s\s+(\S.*)$")
_ARGS_HEADER_RE = re.compile(r"^-{3,} (.+?) -{3,}\s*$")
_RECORD_RE = re.compile(
    r"^(?:Traceback \(most recent|\s*File \"|During handling of the above|The above exception"
    r"|iteration\s+\d+\s*/|Training epoch|\[Rank\s*\d+\]|Step Time|-{3,} |WARNING:)"
)

# Lines with these are read by a parser of their own (never a continuation of another record).
_OTHER_RECORD_KEYS = (
    "ALLOC_CONF",
    "Theoretical memory",
    "using world size",
    "Job throughput",
    "s/it,",
    "it/s,",
)
_WORLD_KEYS = {
    "world": "world_size",
    "data-parallel": "data_parallel_size",
    "context-parallel": "context_parallel_size",
    "tensor-model-parallel": "tensor_model_parallel_size",
    "pipeline-model-parallel": "pipeline_model_parallel_size",
    "expert-model-parallel": "expert_model_parallel_size",
}


def _field(text: str, label: str) -> str | None:
    """The value after `label` up to the next `|` (None if the label is absent)."""
    at = text.find(label)
    if at < 0:
        return None
    start = at + len(label)
    end = text.find("|", start)
    return text[start:end] if end >= 0 else text[start:]


def _pipe_fields(text: str) -> dict[str, str]:
    """`a: 1 | b c: 2` -> {"a": "1", "bc": "2"}: keys without whitespace, lower-case."""
    out: dict[str, str] = {}
    for part in text.split("|")[1:]:
        key, sep, value = part.partition(":")
        if sep:
            out["".join(key.split()).lower()] = value.strip()
    return out


def _starts_record(text: str, stamped: bool) -> bool:
    """Whether a line begins a new log record (so it cannot continue a wrapped one)."""
    if stamped or _RECORD_RE.match(text):
        return True
    if ("out of memory" in text or "OutOfMemory" in text) and _OOM_START_RE.search(text):
        return True
    if ("Error" in text or "Exception" in text) and _EXC_SEARCH_RE.search(text):
        return True
    if " .." in text and (m := _ARG_RE.match(text)) is not None and len(m.group(3)) >= 3:
        return True  # a line of an argument dump
    if any(key in text for key in _OTHER_RECORD_KEYS):
        return True
    return "Warning: " in text and _WARN_RE.match(text) is not None


class _Pending:
    """A record that may continue on the next lines (hard-wrapped pastes)."""

    __slots__ = ("error", "kind", "line_number", "lines", "parts", "phase", "rank")

    def __init__(self, kind: str, text: str, rank: int | None, line_number: int) -> None:
        self.kind = kind  # oom | iteration | memory
        self.parts = [text]
        self.rank = rank
        self.phase = "data"  # oom only: data -> tail (the advice after the fields)
        self.error: ErrorEvent | None = None  # the exception event that printed the OOM
        self.line_number = line_number
        self.lines = 1

    def add(self, text: str) -> None:
        # Joined with nothing: a wrap at a space keeps the space on one side, a wrap inside a
        # word (or a stripped space) must not add one. The field patterns accept a missing
        # space between words.
        self.parts.append(text)
        self.lines += 1

    @property
    def text(self) -> str:
        return self.parts[0] if len(self.parts) == 1 else _join_wrapped(self.parts)


def _join_wrapped(parts: list[str]) -> str:
    """Rejoin the lines of a hard-wrapped paste. Where neither side has a space, one is put
    back after punctuation and between a word and a number (`MiB.` + `GPU`, `memory` +
    `14.12`); elsewhere the wrap is taken to be inside a word or number and nothing is added."""
    out = parts[0]
    for part in parts[1:]:
        if out and part and not out[-1].isspace() and not part[0].isspace():
            last, first = out[-1], part[0]
            if (
                last in ",;:!?)"
                or (last == "." and not first.isdigit())
                or (last.isalpha() and first.isdigit())
            ):
                out += " "
        out += part
    return out


class _LogParser:
    """A line-by-line state machine over a training log; `feed` each line, then `finish`."""

    def __init__(self) -> None:
        self.ev = Evidence()
        self._pending: _Pending | None = None
        self._tracebacks: dict[int | None, _Traceback] = {}
        self._chain: dict[int | None, str] = {}
        self._errors: dict[tuple[Any, ...], ErrorEvent] = {}
        self._step: Iteration | None = None  # Megatron-Bridge "Step Time" awaiting its line
        self._in_args = False
        self._line_number = 0
        self._nemo_memory: tuple[Any, ...] | None = None
        self._dropped: dict[str, int] = {}

    # -- entry points ------------------------------------------------------------------------

    def feed(self, raw: str) -> None:
        self._line_number += 1
        if len(raw) > MAX_LINE_CHARS:
            raw = raw[:MAX_LINE_CHARS]
        if (
            "nan iterations:" in raw
            and self._pending is None
            and not self._tracebacks
            and "\x1b" not in raw
            and "elapsed time per iteration" in raw
        ):
            self._iteration(raw)  # fast path: a complete Megatron iteration line
            return
        text, rank, stamped, level = _strip_prefixes(raw)
        pending = self._pending
        if pending is not None:
            if self._continues(pending, text, rank, stamped):
                return
            self._flush_pending()
        self._dispatch(text, rank, stamped, level)

    def finish(self) -> Evidence:
        if self._pending is not None:
            self._flush_pending()
        for rank in list(self._tracebacks):
            self._end_traceback(rank)
        if self._step is not None:
            self._add_iteration(self._step)
            self._step = None
        self.ev.errors = list(self._errors.values())
        if self.ev.config:
            self.ev.config = _finalize_config(self.ev.config)
        for what, n in self._dropped.items():
            self._note(f"{n} further {what} were not kept (limit reached)")
        return self.ev

    # -- helpers -----------------------------------------------------------------------------

    def _note(self, message: str) -> None:
        if len(self.ev.notes) < MAX_NOTES:
            self.ev.notes.append(message)

    def _drop(self, what: str) -> None:
        self._dropped[what] = self._dropped.get(what, 0) + 1

    def _add_error(self, event: ErrorEvent) -> None:
        key = (event.kind, event.type, event.message[:300], tuple(event.frames), event.chained)
        seen = self._errors.get(key)
        if seen is not None:
            seen.count += 1
        elif len(self._errors) < MAX_ERROR_EVENTS:
            self._errors[key] = event
        else:
            self._drop("distinct errors/warnings")

    def _add_iteration(self, it: Iteration) -> None:
        if len(self.ev.iterations) < MAX_ITERATIONS:
            self.ev.iterations.append(it)
        else:
            self._drop("iteration lines")

    def _add_memory(self, report: MemoryReport) -> None:
        if len(self.ev.memory) < MAX_MEMORY_REPORTS:
            self.ev.memory.append(report)
        else:
            self._drop("memory reports")

    # -- wrapped records ---------------------------------------------------------------------

    def _continues(self, p: _Pending, text: str, rank: int | None, stamped: bool) -> bool:
        """Append `text` to the pending record if it continues it; flush when complete."""
        if rank is not None and rank != p.rank:
            return False
        if not text.strip() or p.lines >= 40 or len(p.parts[-1]) > MAX_LINE_CHARS // 2:
            return False
        if p.kind == "oom" and p.phase == "tail":
            piece = _compact(text)
            if not any(piece in tail for tail in _OOM_TAILS):
                return False
        elif _starts_record(text, stamped):
            return False
        elif (
            p.kind == "memory"
            and _MEM_COMPLETE_RE.search(_compact(p.text))
            and not re.fullmatch(r"\s*[\d.]+\s*(?:\|.*)?", text)
        ):
            return False  # complete already; only a number cut at the wrap may follow
        p.add(text)
        self._check_pending(p)
        return True

    def _check_pending(self, p: _Pending) -> None:
        """Flush the pending record when it is complete; move an OOM to its tail phase."""
        compact = _compact(p.text)
        if p.kind == "oom":
            if _oom_fully_complete(compact):
                self._flush_pending()
            elif p.phase == "data" and _oom_data_complete(compact):
                p.phase = "tail"
        elif p.kind == "iteration":
            if _NAN_ITERS_RE.search(compact):
                self._flush_pending()
        elif p.kind == "memory" and "allocated-count:" in compact:
            self._flush_pending()

    def _flush_pending(self) -> None:
        p = self._pending
        if p is None:
            return
        self._pending = None
        text = p.text
        if p.kind == "oom":
            event = _oom_event(text, p.rank, p.line_number)
            if event is not None:
                if len(self.ev.oom) < MAX_OOM_EVENTS:
                    self.ev.oom.append(event)
                else:
                    self._drop("OOM messages")
                if event.truncated:
                    self._note(f"line {p.line_number}: the out-of-memory message is truncated")
            if p.error is not None:
                head = p.error.type + ":"
                at = text.find(head)
                p.error.message = (text[at + len(head) :] if at >= 0 else text).strip()[:2000]
                self._add_error(p.error)
        elif p.kind == "iteration":
            self._iteration(text, wrapped=p.lines > 1)
        elif p.kind == "memory":
            self._memory_report(text, p.rank)

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch(self, text: str, rank: int | None, stamped: bool, level: str) -> None:
        if not text or text.isspace():
            tb = self._tracebacks.get(rank)
            if tb is not None and tb.state == "message":
                self._end_traceback(rank)
            return
        tb = self._tracebacks.get(rank)
        if tb is not None and self._traceback_line(tb, text, rank, stamped):
            return
        if "elapsed time per iteration" in text and "nan iterations:" in text:
            self._iteration(text)  # the most common line of a Megatron log, complete
            return
        if "ALLOC_CONF" in text:
            self._env(text)
        if "Traceback (most recent call last)" in text:
            self._tracebacks[rank] = _Traceback(self._chain.pop(rank, ""))
            return
        if 'File "' in text and _FRAME_RE.match(text):
            # a pasted traceback without its header line
            tb = self._tracebacks[rank] = _Traceback(self._chain.pop(rank, ""))
            self._traceback_line(tb, text, rank, stamped)
            return
        if "above exception" in text:
            if _CHAIN_CAUSE in text:
                self._chain[rank] = "cause"
            elif _CHAIN_CONTEXT in text:
                self._chain[rank] = "context"
            return
        is_oom = ("out of memory" in text or "OutOfMemory" in text) and bool(
            _OOM_START_RE.search(text)
        )
        if not is_oom and self._warning(text, rank, level):
            return  # a warning, even one that names an exception type
        error = None
        if "Error" in text or "Exception" in text or "Interrupt" in text:
            m = _EXC_SEARCH_RE.search(text)
            if m is not None:
                error = ErrorEvent(type=m.group(1), message=(m.group(2) or "").strip(), rank=rank)
                if not is_oom:
                    tb = _Traceback(self._chain.pop(rank, ""))
                    tb.state, tb.event = "message", error
                    self._tracebacks[rank] = tb
                    return
        if is_oom:
            self._start_oom(text, rank, error)
            return
        if "iteration" in text:
            if "epoch" in text and _NEMO_ITER_RE.search(text):
                self._iteration(text)
                return
            if "|" in text and _MEGATRON_ITER_RE.search(text):
                self._start_record("iteration", text, rank)
                return
        if "memory (" in text and "[Rank" in text:
            self._start_record("memory", text, rank)
            return
        if "Step Time" in text:
            self._step_time(text)
            return
        if "Job throughput" in text:
            m = _MB_PROGRESS_RE.search(text)
            if m:
                self._add_iteration(
                    Iteration(int(m.group(1)), None, float(m.group(2)), source="megatron-bridge")
                )
            return
        if (" ." in text or self._in_args) and self._arg_line(text):
            return
        if "---" in text and (header := _ARGS_HEADER_RE.match(text.strip())) is not None:
            title = header.group(1)  # "arguments" ... "end of arguments"
            self._in_args = "argument" in title and not title.startswith("end of")
            return
        if "/it" in text or "it/s" in text:
            self._tqdm(text)
            return
        if "using world size" in text:
            for name, value in _WORLD_RE.findall(text):
                key = _WORLD_KEYS.get(name)
                if key:
                    self.ev.config.setdefault(key, int(value))
            return
        if "Theoretical memory" in text:
            m = _THEORY_RE.search(text)
            if m:
                for key, value in zip(
                    ("weight_and_optimizer", "activation", "total"), m.groups(), strict=True
                ):
                    if value is not None:
                        self.ev.theoretical_memory[f"{key}_bytes"] = int(float(value) * (1 << 20))

    # -- tracebacks --------------------------------------------------------------------------

    def _traceback_line(self, tb: _Traceback, text: str, rank: int | None, stamped: bool) -> bool:
        """Feed a line to a rank's open traceback; False when the line is not part of it."""
        if tb.state == "frames":
            m = _FRAME_RE.match(text)
            if m is not None:
                file, line, func = m.groups()
                func = (func or "").strip()
                frame = f"{file}:{line}" + (f" in {func}" if func else "")
                tb.frames.append(frame)
                if len(tb.frames) > _MAX_FRAMES:
                    del tb.frames[0]
                return True
            if text[:1].isspace() or text.lstrip().startswith("[Previous line repeated"):
                return True  # the source line under a frame, carets, repeats
            m = _EXC_LINE_RE.match(text.strip())
            if m is None or stamped:
                # not an exception line: the traceback was cut; keep what it had
                tb.event = ErrorEvent(type="", message="(traceback without exception line)")
                self._end_traceback(rank)
                return False
            event = ErrorEvent(
                type=m.group(1),
                message=(m.group(2) or "").strip(),
                frames=tb.frames,
                rank=rank,
                chained=tb.chained,
            )
            if ("out of memory" in text or "OutOfMemory" in text) and _OOM_START_RE.search(text):
                del self._tracebacks[rank]
                self._start_oom(text, rank, event)
                return True
            tb.state, tb.event = "message", event
            return True
        # message state: further lines of a multi-line exception message
        if _starts_record(text, stamped) or len(tb.details) >= _MAX_DETAIL_LINES:
            self._end_traceback(rank)
            return False
        tb.details.append(text.rstrip())
        return True

    def _end_traceback(self, rank: int | None) -> None:
        tb = self._tracebacks.pop(rank, None)
        if tb is None or tb.event is None:
            return
        event = tb.event
        event.chained = event.chained or tb.chained
        if not event.frames and tb.frames:
            event.frames = tb.frames
        if tb.details:
            event.details = "\n".join(tb.details)[:2000]
        if event.type or event.frames:
            self._add_error(event)

    def _warning(self, text: str, rank: int | None, level: str) -> bool:
        """Record a Python warning, Megatron's `WARNING:` line or a NeMo `[NeMo W ...]` line;
        False when `text` is none of these."""
        bare = any(phrase in text for phrase in _BARE_WARNINGS)
        if "Warning" not in text and "WARNING" not in text and level != "W" and not bare:
            return False
        stripped = text.strip()
        m = _WARN_RE.match(stripped)
        if m is not None:
            file, line, kind, message = m.groups()
            frames = [f"{file}:{line}"] if file else []
            event = ErrorEvent(kind, message.strip(), frames, kind="warning", rank=rank)
        else:
            m = _MEGATRON_WARN_RE.match(stripped)
            if m is not None:
                event = ErrorEvent("WARNING", m.group(1).strip(), kind="warning", rank=rank)
            elif level == "W":
                event = ErrorEvent("WARNING", stripped, kind="warning", rank=rank)
            elif bare:
                event = ErrorEvent("Warning", stripped, kind="warning", rank=rank)
            else:
                return False
        self._add_error(event)
        return True

    # -- records -----------------------------------------------------------------------------

    def _start_oom(self, text: str, rank: int | None, error: ErrorEvent | None) -> None:
        p = _Pending("oom", text, rank, self._line_number)
        p.error = error
        self._pending = p
        self._check_pending(p)

    def _start_record(self, kind: str, text: str, rank: int | None) -> None:
        if kind == "iteration" and "number of nan iterations:" in text:
            self._iteration(text)  # complete on one line: no need to wait for more
            return
        p = _Pending(kind, text, rank, self._line_number)
        self._pending = p
        compact = _compact(text)
        done = (
            _NAN_ITERS_RE.search(compact) if kind == "iteration" else "allocated-count:" in compact
        )
        if done:
            self._flush_pending()

    def _iteration(self, text: str, wrapped: bool = False) -> None:
        """A Megatron-LM/Bridge iteration line or a NeMo 2 progress line. Single lines are read
        with plain substring searches (the fast path); wrapped ones without whitespace."""
        src = _compact(text) if wrapped else text

        def get(label: str) -> str | None:
            return _field(src, _compact(label) if wrapped else label)

        nemo = _NEMO_ITER_RE.search(text.split("|", 1)[0]) if "epoch" in text else None
        if nemo is not None:
            it = Iteration(int(nemo.group(2)), source="nemo", total_iterations=int(nemo.group(3)))
            seconds = _float(get("| train_step_timing in s:"))
            it.elapsed_ms = seconds * 1000.0 if seconds is not None else None
            it.tflops_per_gpu = _float(get("| TFLOPS_per_GPU:"))
            it.loss = _float(get("| reduced_train_loss:") or get("| train_loss:"))
            it.learning_rate = _float(get("| lr:"))
            it.global_batch_size = _int(get("| global_batch_size:"))
            it.max_memory_allocated_bytes = _int(get("| max_memory_allocated:"))
            it.max_memory_reserved_bytes = _int(get("| max_memory_reserved:"))
            self._nemo_memory_report(it)
            self._add_iteration(it)
            return
        m = None if wrapped else _MEGATRON_FAST_RE.search(text)
        if m is not None:  # the fast path: one regex for the usual field order
            values = list(m.groups())
            if None in values:
                for i, label in enumerate(_MEGATRON_LABELS, start=2):
                    if values[i] is None and label in text:  # fields in another order
                        values[i] = get(label)
        else:
            m = _MEGATRON_ITER_RE.search(text)
            if m is None:
                return
            values = [m.group(1), m.group(2), *(get(label) for label in _MEGATRON_LABELS)]
        it = Iteration(int(values[0]), source="megatron", total_iterations=int(values[1]))
        it.elapsed_ms = _float(values[2])
        it.tflops_per_gpu = _float(values[3])
        it.learning_rate = _float(values[4])
        it.global_batch_size = _int(values[5])
        it.loss = _float(values[6] if values[6] is not None else get("| loss:"))
        it.grad_norm = _float(values[7])
        step = self._step
        if step is not None:
            self._step = None
            # Megatron-Bridge prints "Step Time" just before the iteration line it belongs to.
            close = (
                it.elapsed_ms is not None
                and step.elapsed_ms is not None
                and abs(step.elapsed_ms - it.elapsed_ms) <= 0.01 * it.elapsed_ms + 10.0
            )
            if close and it.tflops_per_gpu is None:
                it.tflops_per_gpu = step.tflops_per_gpu
                it.source = "megatron-bridge"
            else:
                self._add_iteration(step)
        self._add_iteration(it)

    def _nemo_memory_report(self, it: Iteration) -> None:
        """NeMo 2 prints peak memory on every progress line: report it when it changes."""
        key = (it.max_memory_allocated_bytes, it.max_memory_reserved_bytes)
        if key == (None, None) or key == self._nemo_memory:
            return
        self._nemo_memory = key
        self._add_memory(
            MemoryReport(
                max_allocated_bytes=it.max_memory_allocated_bytes,
                max_reserved_bytes=it.max_memory_reserved_bytes,
                label=f"(iteration {it.iteration})",
                iteration=it.iteration,
                source="nemo",
            )
        )

    def _step_time(self, text: str) -> None:
        m = _STEP_TIME_RE.search(text)
        if m is None:
            return
        if self._step is not None:
            self._add_iteration(self._step)
        self._step = Iteration(
            elapsed_ms=float(m.group(1)) * 1000.0,
            tflops_per_gpu=float(m.group(2)),
            source="megatron-bridge",
        )

    def _tqdm(self, text: str) -> None:
        """NeMo 1 / Lightning progress bars: `795/77225 [9:07:58<..., 41.36s/it, loss=3.1]`."""
        m = _TQDM_RE.search(text)
        if m is None:
            return
        n, total, rate, unit, rest = m.groups()
        value = float(rate)
        elapsed = value * 1000.0 if unit == "s/it" else (1000.0 / value if value else None)
        it = Iteration(int(n), elapsed, source="nemo", total_iterations=int(total))
        metrics = dict(
            part.strip().split("=", 1) for part in (rest or "").split(",") if "=" in part
        )
        it.loss = _float(metrics.get("reduced_train_loss") or metrics.get("loss"))
        self._add_iteration(it)

    def _memory_report(self, text: str, rank: int | None) -> None:
        m = _MEM_REPORT_RE.search(text)
        if m is None:
            return
        unit = 1 << 20 if m.group(3) == "MB" else 10**9  # Megatron divides by 1024*1024
        label = m.group(2).strip()
        after = _AFTER_ITERS_RE.search(label)
        report = MemoryReport(
            rank=int(m.group(1)),
            label=label,
            iteration=int(after.group(1)) if after else None,
            source="megatron" if unit == 1 << 20 else "megatron-bridge",
        )
        targets = {
            "allocated": "allocated_bytes",
            "maxallocated": "max_allocated_bytes",
            "reserved": "reserved_bytes",
            "maxreserved": "max_reserved_bytes",
            "active": "active_bytes",
            "maxactive": "max_active_bytes",
            "inactive": "inactive_bytes",
            "maxinactive": "max_inactive_bytes",
            "totaldevicememoryused": "device_used_bytes",
        }
        for key, value in _pipe_fields(text[m.end() :]).items():
            scale = unit
            if key.startswith("mem-"):  # Megatron-Bridge: mem-max-allocated-gigabytes
                key = key[4:]
                if key.endswith("-bytes"):
                    scale = 1
                key = key.removesuffix("-gigabytes").removesuffix("-bytes")
            key = key.replace("-", "")
            number = _float(value)
            if number is None:
                continue
            if key in targets:
                setattr(report, targets[key], round(number * scale))
            elif key in ("allocretires", "allocretries"):
                report.alloc_retries = int(number)
        self._add_memory(report)

    def _arg_line(self, text: str) -> bool:
        """A line of Megatron's argument dump: `  hidden_size ........ 5120`."""
        m = _ARG_RE.match(text)
        if m is not None:
            indent, key, dots, value = m.groups()
            if not (indent or len(dots) >= 3):
                return False
            value = (value or "").rstrip()
        elif self._in_args:
            m2 = _ARG_LONG_RE.match(text)
            if m2 is None:
                return False
            key, value = m2.group(1), m2.group(2).rstrip()
        else:
            return False
        _assign(self.ev.config, key, _convert_value(value or ""))
        return True

    def _env(self, text: str) -> None:
        for m in _ENV_RE.finditer(text):
            if "try setting" in text[max(0, m.start() - 14) : m.start()]:
                continue  # the OOM message's advice, not a setting
            self.ev.env[m.group(1)] = m.group(2).rstrip(".,;")


def _split_lines(text: str) -> Iterator[str]:
    if not isinstance(text, str):
        return iter(())
    return iter(text.splitlines())


def parse_log(text: str) -> Evidence:
    """Parse a whole training log given as a string (see `parse_log_file` for files)."""
    parser = _LogParser()
    for line in _split_lines(text):
        parser.feed(line)
    return parser.finish()


def _iter_file_lines(raw: IO[bytes], chunk_size: int = 1 << 20) -> Iterator[str]:
    """Decoded lines of a binary stream, read in chunks; \\r and \\r\\n end lines too. A line
    longer than MAX_LINE_CHARS is cut and the rest of it skipped, so memory stays bounded."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tail = ""
    held_cr = False
    skipping = False
    while True:
        block = raw.read(chunk_size)
        text = decoder.decode(block, final=not block)
        if held_cr:
            text = "\r" + text
            held_cr = False
        if block and text.endswith("\r"):
            text, held_cr = text[:-1], True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if skipping:
            cut = text.find("\n")
            if cut < 0:
                text = ""
            else:
                text, skipping = text[cut + 1 :], False
        lines = (tail + text).split("\n")
        tail = lines.pop()
        for line in lines:
            yield line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS]
        if len(tail) > MAX_LINE_CHARS:
            yield tail[:MAX_LINE_CHARS]
            tail, skipping = "", True
        if not block:
            break
    if tail:
        yield tail


def parse_log_file(path: str | Path) -> Evidence:
    """Parse a training log file, streamed in 1 MiB chunks (gzip if it ends in .gz).

    Raises EvidenceError (one line) if the file cannot be opened."""
    path = Path(path)
    parser = _LogParser()
    try:
        raw: IO[bytes] = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise EvidenceError(f"cannot read log '{path}': {exc.strerror or exc}") from None
    try:
        with raw:
            for line in _iter_file_lines(raw):
                parser.feed(line)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        parser.ev.notes.append(f"log '{path}' could not be read to the end: {exc}")
    evidence = parser.finish()
    evidence.sources.append(f"log:{path}")
    return evidence


# --------------------------------------------------------------------------------------------
# Values and keys
# --------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"[-+]?\d{1,30}")
_FLOAT_RE = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)")
_NONE_WORDS = frozenset({"None", "null", "Null", "NULL", "~"})
_CONFIG_KEY_SET = frozenset(CONFIG_KEYS)
# Names used by Megatron-LM's argument parser, NeMo 1 and YAML files for Megatron-Core keys.
_KEY_ALIASES = {
    "num_experts": "num_moe_experts",
    "fp8_format": "fp8",
    "activations_checkpoint_granularity": "recompute_granularity",
    "activations_checkpoint_method": "recompute_method",
    "activations_checkpoint_num_layers": "recompute_num_layers",
    "encoder_seq_length": "seq_length",
}
_LIST_KEYS = frozenset({"recompute_modules", "offload_modules", "cuda_graph_scope"})
_SECTION_WORDS = frozenset({"cfg", "config", "model", "recipe"})


def _convert_scalar(text: str) -> Any:
    """ "8" -> 8, "1e-05" -> 1e-05, "True" -> True, "None" -> None; other text unchanged."""
    s = text.strip()
    if s in _NONE_WORDS:
        return None
    if s in ("True", "true"):
        return True
    if s in ("False", "false"):
        return False
    if _INT_RE.fullmatch(s):
        return int(s)
    if len(s) < 64 and _FLOAT_RE.fullmatch(s):
        try:
            return float(s)
        except ValueError:
            return s
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _convert_value(text: str) -> Any:
    """A typed value from text: scalars as in `_convert_scalar`, plus lists written as Python
    literals (`['core_attn', 'mlp']`) or Hydra lists (`[mlp,core_attn]`)."""
    s = text.strip()
    if len(s) >= 2 and s[0] in "[(" and s[-1] in "])" and len(s) < 100_000:
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            inner = s[1:-1].strip()
            return [_convert_scalar(x) for x in inner.split(",") if x.strip()] if inner else []
        return _plain(value)
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and len(s) < 100_000:
        try:
            return _plain(ast.literal_eval(s))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return s
    return _convert_scalar(s)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (config values are JSON-shaped)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, (bytes, complex)):
        return repr(value)
    return value


def _canonical_key(name: str) -> str:
    key = name.strip().lstrip("+~").replace("-", "_")
    return _KEY_ALIASES.get(key, key)


def _assign(out: dict[str, Any], path: str, value: Any) -> None:
    """Store `value` under the flat Megatron name of `path` (`model.recompute_modules`), or
    under the dotted path (without a leading `cfg.`/`model.`) when the key is not known."""
    parts = [p for p in path.strip().lstrip("+~").split(".") if p]
    if not parts:
        return
    leaf = _canonical_key(parts[-1])
    if leaf in _CONFIG_KEY_SET or (len(parts) == 1 and leaf):
        key = leaf
    else:
        while len(parts) > 1 and parts[0] in _SECTION_WORDS:
            parts = parts[1:]
        key = ".".join([*parts[:-1], leaf])
    out[key] = value


def _finalize_config(flat: dict[str, Any]) -> dict[str, Any]:
    """Megatron's derived settings and value normalisation on a flat config."""
    for key in _LIST_KEYS:
        value = flat.get(key)
        if isinstance(value, str):
            flat[key] = [v for v in re.split(r"[\s,]+", value.strip("[]() ")) if v]
    backend = flat.get("attention_backend")
    if isinstance(backend, str) and backend.startswith("AttnBackend."):
        flat["attention_backend"] = backend.split(".", 1)[1]
    if flat.get("recompute_activations") is True and flat.get("recompute_granularity") is None:
        flat["recompute_granularity"] = "selective"  # Megatron-LM's --recompute-activations
    layers = flat.get("cpu_offloading_num_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
        flat.setdefault("cpu_offloading", True)  # arguments.py: > 0 turns offloading on
    precision = next((flat[k] for k in ("precision", "trainer.precision") if k in flat), None)
    if isinstance(precision, (str, int)) and "bf16" not in flat and "fp16" not in flat:
        p = str(precision).lower()
        if "bf16" in p:
            flat["bf16"] = True
        elif p in ("16", "16-mixed", "fp16", "fp16-mixed", "half"):
            flat["fp16"] = True
    return flat


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

_CLI_FLAG_RE = re.compile(r"(?:^|\s)--[A-Za-z]")
_HYDRA_RE = re.compile(r"^(\+{0,2}|~)?([A-Za-z_][\w-]*(?:\.[\w-]+)*)=(.*)$", re.S)
_SHELL_VAR_RE = re.compile(r"^\$\{?([A-Za-z_]\w*)\}?$")
_PY_ASSIGN_RE = re.compile(rf"^\s*({_DOTTED})\s*=(.*)$")
_SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1", "(", ")", "\\"})
_MAX_NODES = 20_000


def _flatten(data: Any, prefix: str, out: list[tuple[str, Any]], depth: int = 0) -> None:
    """(dotted path, leaf value) pairs of a nested mapping, bounded in depth and size."""
    if not isinstance(data, dict) or depth > 20:
        return
    for key, value in data.items():
        if len(out) >= _MAX_NODES:
            return
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            _flatten(value, path, out, depth + 1)
        else:
            out.append((path, value))


def _from_mapping(data: dict[str, Any]) -> dict[str, Any]:
    """Flat keys from a YAML/JSON mapping, flat or nested (`model:` and other sections). A key
    found in several sections is taken from `model` first, then from the shallowest one."""
    pairs: list[tuple[str, Any]] = []
    _flatten(data, "", pairs)
    flat: dict[str, Any] = {}
    rank: dict[str, tuple[int, int]] = {}
    for path, value in pairs:
        if isinstance(value, str):
            value = _convert_scalar(value)
        value = _plain(value)
        parts = path.split(".")
        probe: dict[str, Any] = {}
        _assign(probe, path, value)
        for key, v in probe.items():
            priority = (int(parts[0] == "model"), -len(parts))
            if key not in rank or priority > rank[key]:
                flat[key], rank[key] = v, priority
    return flat


def _shell_tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: fall back to plain words
        return text.replace('"', " ").replace("'", " ").split()


def _is_value_token(token: str) -> bool:
    if not token or token in _SHELL_OPERATORS or token in ("...", "…"):
        return False
    if token.startswith("-"):
        return bool(_FLOAT_RE.fullmatch(token))
    return not (token.endswith((".py", ".sh")) or ("=" in token and _HYDRA_RE.match(token)))


def _parse_command_line(text: str, hydra_only: bool = False) -> dict[str, Any]:
    """Flags (`--recompute-modules core_attn mlp`, `--bf16`, `--x=1`) and Hydra overrides
    (`model.recompute_granularity=selective`) of one or more commands (shell scripts with
    backslash continuations, bash arrays and simple `NAME=value` variables included)."""
    text = re.sub(r"\\\r?\n", " ", text)
    tokens = _shell_tokens(text)
    shell_vars: dict[str, str] = {}
    out: dict[str, Any] = {}

    def resolve(token: str) -> str:
        m = _SHELL_VAR_RE.match(token)
        return shell_vars.get(m.group(1), token) if m else token

    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--") and len(token) > 2 and token[2].isalpha():
            name, eq, inline = token[2:].partition("=")
            values: list[str] = []
            i += 1
            if eq:
                values.append(inline)
            else:
                while i < len(tokens) and _is_value_token(tokens[i]):
                    values.append(resolve(tokens[i]))
                    i += 1
                while i < len(tokens) and tokens[i] in ("...", "…"):
                    i += 1
            _assign_flag(out, name, values)
            continue
        m = _HYDRA_RE.match(token)
        if m is not None:
            key, value = m.group(2), m.group(3)
            known = _canonical_key(key.rsplit(".", 1)[-1]) in _CONFIG_KEY_SET
            if "." in key or known or (hydra_only and not key.isupper()):
                _assign(out, key, _convert_value(resolve(value)))
            else:
                shell_vars[key] = value.strip("()")
        i += 1
    return out


def _assign_flag(out: dict[str, Any], name: str, values: list[str]) -> None:
    key = name.replace("-", "_")
    if key.startswith("no_") and _canonical_key(key[3:]) in _CONFIG_KEY_SET and not values:
        out[_canonical_key(key[3:])] = False
        return
    key = _canonical_key(key)
    if not values:
        value: Any = True
    elif key in _LIST_KEYS:
        value = [_convert_scalar(v) for part in values for v in part.split(",") if v.strip()]
    elif len(values) == 1:
        value = _convert_value(values[0])
    else:
        value = [_convert_scalar(v) for v in values]
    out[key] = value


def _strip_py_comment(line: str) -> str:
    """A Python line without its `# comment` (a `#` inside quotes is kept)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


_NOT_LITERAL = object()


def _py_literal(text: str) -> Any:
    s = text.strip().rstrip(",").strip()
    if not s or len(s) > 100_000:
        return _NOT_LITERAL
    try:
        return _plain(ast.literal_eval(s))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _parse_python_assignments(text: str) -> dict[str, Any]:
    """`cfg.model.recompute_modules = ["core_attn"]` lines and `recompute_num_layers=4,`
    keyword arguments (Megatron-Bridge recipes); values must be Python literals."""
    out: dict[str, Any] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _PY_ASSIGN_RE.match(_strip_py_comment(lines[i]))
        i += 1
        if m is None:
            continue
        key, rhs = m.group(1), m.group(2).strip()
        if rhs[:1] in "[({" and rhs.count(rhs[0]) > rhs.count(
            {"[": "]", "(": ")", "{": "}"}[rhs[0]]
        ):
            # a literal over several lines: read on until its brackets balance
            parts = [rhs]
            while i < len(lines) and len(parts) < 200:
                parts.append(_strip_py_comment(lines[i]))
                i += 1
                joined = " ".join(parts)
                if _py_literal(joined) is not _NOT_LITERAL:
                    break
            rhs = " ".join(parts)
        value = _py_literal(rhs)
        if value is not _NOT_LITERAL:
            _assign(out, key, value)
    return out


def _has_arg_dump(text: str) -> bool:
    count = 0
    for line in text.splitlines()[:5000]:
        m = _ARG_RE.match(clean_line(line))
        if m is not None and (m.group(1) or len(m.group(3)) >= 3):
            count += 1
            if count >= 2:
                return True
    return "------------------------ arguments" in text and count >= 1


def parse_config_with_notes(text: str, name: str = "") -> tuple[dict[str, Any], list[str]]:
    """`parse_config`, plus notes saying how the text was read and what was not understood."""
    notes: list[str] = []
    try:
        flat = _parse_config(text, name, notes)
        return _finalize_config(flat), notes
    except Exception as exc:  # never raise on garbage: the doctor must run
        notes.append(f"could not read config {name or '<text>'}: {type(exc).__name__}: {exc}")
        return {}, notes


def parse_config(text: str, name: str = "") -> dict[str, Any]:
    """Flat Megatron-Core keys (see `recompute_kit.config.CONFIG_KEYS`) from a config in any of:

    * YAML or JSON, flat or nested (`model:` sections as in Megatron-Bridge and NeMo; NeMo's
      `activations_checkpoint_*` keys become `recompute_*`);
    * a Megatron-LM command line or launch script (`--recompute-granularity full ...`;
      `--recompute-activations` means selective, `--num-experts` is `num_moe_experts`,
      `--fp8-format` is `fp8`);
    * Hydra-style overrides (`model.recompute_modules=[mlp,core_attn] trainer.devices=8`);
    * Python assignments of a Megatron-Bridge recipe (`cfg.model.recompute_num_layers = 4`);
    * Megatron's argument dump (`  recompute_granularity ........ full`).

    Unknown keys are kept (as dotted paths when nested) with typed values. Never raises:
    unreadable text gives {} (see `parse_config_with_notes` for why)."""
    return parse_config_with_notes(text, name)[0]


def _parse_config(text: str, name: str, notes: list[str]) -> dict[str, Any]:
    if not isinstance(text, str) or not text.strip():
        notes.append("the config is empty")
        return {}
    suffix = Path(name).suffix.lower() if name else ""
    stripped = text.lstrip()
    if stripped[:1] in "{[" or suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            notes.append("read as JSON")
            return _from_mapping(data)
    if _has_arg_dump(text):
        notes.append("read as a Megatron argument dump")
        return parse_log(text).config
    is_cli = bool(_CLI_FLAG_RE.search(text))
    if suffix in (".yaml", ".yml") or not is_cli:
        data = _safe_yaml(text)
        if isinstance(data, dict) and data:
            notes.append("read as YAML")
            return _from_mapping(data)
    if is_cli:
        notes.append("read as a command line")
        return _parse_command_line(text)
    flat = _parse_command_line(text, hydra_only=True)
    flat.update(_parse_python_assignments(text))
    if flat:
        notes.append("read as Hydra overrides / Python assignments")
    else:
        notes.append("no configuration keys found")
    return flat


def _safe_yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None


# --------------------------------------------------------------------------------------------
# Experiments (ablation results)
# --------------------------------------------------------------------------------------------

EXPERIMENT_KEYS = (
    "name",
    "recompute_modules",
    "recompute",
    "tflops_per_gpu",
    "vs_golden",
    "peak_memory_bytes",
    "oom",
    "oom_rank",
    "result",
)
_OOM_MARK_RE = re.compile(r"\bOOM\b(?:[^)\]|]*?\brank\s*(\d+))?", re.I)
_MEM_UNIT_RE = re.compile(r"(?<![a-z])(gib|gb|mib|mb|kib|kb|bytes|b)(?![a-z])")


def _experiment_column(header: str) -> tuple[str, str | None]:
    """The normalised key for a column header, and the unit of a memory column."""
    h = " ".join(header.replace("_", " ").strip().lower().split())
    if h in ("experiment", "exp", "name", "run", "config", "configuration", "setting", "id"):
        return "name", None
    if h in ("recompute modules", "modules"):
        return "recompute_modules", None
    if h in ("recompute", "spec", "recompute spec"):
        return "recompute", None
    if h in ("granularity", "recompute granularity"):
        return "recompute_granularity", None
    if h in ("method", "recompute method"):
        return "recompute_method", None
    if h in ("num layers", "recompute num layers"):
        return "recompute_num_layers", None
    if "tflop" in h or h in ("throughput", "tflops per gpu"):
        return "tflops_per_gpu", None
    if "golden" in h or h.startswith("vs ") or h in ("vs baseline", "delta"):
        return "vs_golden", None
    memory_words = re.search(r"\b(?:mem|memory|allocated|reserved)\b", h)
    if "peak" in h or (memory_words and _MEM_UNIT_RE.search(h)):
        unit = _MEM_UNIT_RE.search(h)
        return "peak_memory_bytes", unit.group(1) if unit else None
    if h in ("result", "status", "outcome", "verdict"):
        return "result", None
    if h == "oom":
        return "oom", None
    if h == "oom rank":
        return "oom_rank", None
    return header.strip(), None


def _modules_value(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v).strip().strip("'\"") for v in value if str(v).strip()]
    s = str(value).strip()
    if s.lower() in ("", "-", "none", "null", "n/a", "—"):
        return None
    return [v.strip("'\" ") for v in re.split(r"[\s,]+", s.strip("[]() ")) if v.strip("'\" ")]


def _fraction(value: Any) -> float | None:
    """`-16.4%` -> -0.164; a number without % is taken as a fraction already."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    s = str(value)
    m = _NUMBER_RE.search(s)
    if m is None:
        return None
    try:
        number = Decimal(m.group(0))
    except InvalidOperation:
        return None
    return float(number / 100) if "%" in s else float(number)


def _normalise_experiment(row: dict[str, Any], units: dict[str, str | None]) -> dict[str, Any]:
    """Normalise one result row in place (keys from `_experiment_column`)."""
    out = {key: None for key in EXPERIMENT_KEYS}
    out["oom"] = False
    out.update(row)
    oom = False
    oom_rank = None
    for key in ("peak_memory_bytes", "result", "status"):
        value = row.get(key)
        if isinstance(value, str):
            m = _OOM_MARK_RE.search(value)
            if m is not None:
                oom = True
                if m.group(1) is not None:
                    oom_rank = int(m.group(1))
    peak = row.get("peak_memory_bytes")
    if isinstance(peak, str):
        own_unit = parse_size(peak)
        out["peak_memory_bytes"] = (
            own_unit if own_unit is not None else parse_size(peak, units.get("peak_memory_bytes"))
        )
    elif isinstance(peak, (int, float)) and not isinstance(peak, bool):
        scale = parse_size("1", units.get("peak_memory_bytes")) or 1
        out["peak_memory_bytes"] = round(peak * scale)
    tflops = row.get("tflops_per_gpu")
    out["tflops_per_gpu"] = _float(tflops) if isinstance(tflops, str) else tflops
    out["vs_golden"] = _fraction(row.get("vs_golden"))
    status = row.get("status")
    result = row.get("result", status)
    if isinstance(result, str):
        text = result.strip()
        out["result"] = "OOM" if text.lower() == "oom" else "OK" if text.lower() == "ok" else text
    explicit = row.get("oom")
    if isinstance(explicit, bool):
        oom = oom or explicit
    elif isinstance(explicit, str):
        oom = oom or explicit.strip().lower() in ("true", "yes", "1", "oom")
    out["oom"] = oom
    if row.get("oom_rank") is not None:
        out["oom_rank"] = _int(str(row["oom_rank"]))
    elif oom_rank is not None:
        out["oom_rank"] = oom_rank
    if "recompute_modules" in row:
        out["recompute_modules"] = _modules_value(row["recompute_modules"])
    out["recompute"] = _experiment_spec(out)
    if out["recompute_modules"] is None and isinstance(out["recompute"], str):
        try:
            rc = parse_spec(out["recompute"])
        except ConfigError:
            rc = None
        if rc is not None and rc.recompute_granularity == "selective":
            out["recompute_modules"] = list(rc.modules)
    if out["name"] is None and out["recompute"]:
        out["name"] = out["recompute"]
    return out


def _experiment_spec(row: dict[str, Any]) -> str | None:
    """The recompute spec string of a row: given, or derived from granularity/modules."""
    given = row.get("recompute")
    if isinstance(given, str) and given.strip():
        try:
            return format_spec(parse_spec(given.strip()))  # "selective:core_attn" -> "selective"
        except ConfigError:
            return given.strip()
    granularity = str(row.get("recompute_granularity") or "").strip().lower()
    if granularity == "full":
        method, layers = row.get("recompute_method"), _int(str(row.get("recompute_num_layers")))
        if method and layers:
            return f"full:{str(method).strip()}:{layers}"
        return None
    if granularity in ("none", "null"):
        return "none"
    modules = row.get("recompute_modules")
    if modules is None:
        return "selective" if granularity == "selective" else None
    spec = "selective:" + ",".join(modules)
    try:
        return format_spec(parse_spec(spec))
    except ConfigError:
        return spec


def _experiments_from_rows(header: list[str], rows: Iterable[list[str]]) -> list[dict[str, Any]]:
    columns = [_experiment_column(h) for h in header]
    keys = {key for key, _ in columns}
    metrics = {"tflops_per_gpu", "peak_memory_bytes", "vs_golden", "result", "oom"}
    if not keys & metrics or len(keys & {*metrics, "name", "recompute", "recompute_modules"}) < 2:
        return []  # not a results table (e.g. a module or symptom table)
    units = {key: unit for key, unit in columns if unit}
    out = []
    for cells in rows:
        row: dict[str, Any] = {}
        for (key, _), cell in zip(columns, cells, strict=False):
            value = cell.strip()
            if key and value:
                row[key] = value
        if any(k in row for k in keys & metrics):
            out.append(_normalise_experiment(row, units))
    return out


def _markdown_tables(text: str) -> list[dict[str, Any]]:
    lines = text.splitlines()
    out: list[dict[str, Any]] = []
    sep = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?\s*$")
    i = 0
    while i < len(lines) - 1:
        if "|" in lines[i] and sep.match(lines[i + 1]):
            header = _table_cells(lines[i])
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(_table_cells(lines[j]))
                j += 1
            out.extend(_experiments_from_rows(header, rows))
            i = j
        else:
            i += 1
    return out


def _table_cells(line: str) -> list[str]:
    cells = line.rstrip().split("|")
    if cells and not cells[-1].strip():
        cells = cells[:-1]
    return cells


def _experiments_from_json(rows: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for raw in rows:
        if not isinstance(raw, dict):
            continue
        row: dict[str, Any] = {}
        units: dict[str, str | None] = {}
        for key, value in raw.items():
            norm, unit = _experiment_column(str(key))
            if (norm in EXPERIMENT_KEYS and norm not in row) or norm.startswith("recompute_"):
                row[norm] = value
                if unit:
                    units[norm] = unit
            row.setdefault(str(key), value)  # keep every key of the runner's rows
        if "status" in raw:
            row["status"] = raw["status"]
        out.append(_normalise_experiment(row, units))
    return out


def parse_experiments(text: str, name: str = "") -> list[dict[str, Any]]:
    """Ablation results as rows with normalised keys (`EXPERIMENT_KEYS`): name,
    recompute_modules, recompute (spec string), tflops_per_gpu, vs_golden (fraction),
    peak_memory_bytes, oom, oom_rank, result; other columns are kept under their own names.

    Reads JSONL (one object per line: recompute-kit's ablation output; every key is kept),
    a JSON list, CSV/TSV with a header, or Markdown tables (only tables with result columns).
    `~704` is 704.0, `58.8 (OOM rank0)` in a `(GB)` column is 58.8e9 bytes and an OOM on rank 0.
    Never raises; unreadable text gives []."""
    try:
        return _parse_experiments(text, name)
    except Exception:  # never raise on garbage
        return []


def _parse_experiments(text: str, name: str) -> list[dict[str, Any]]:
    if not isinstance(text, str) or not text.strip():
        return []
    stripped = text.strip()
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict):
            data = next((data[k] for k in ("rows", "experiments", "results") if k in data), [data])
        if isinstance(data, list):
            return _experiments_from_json(data)
    objects = []
    for line in stripped.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                objects.append(json.loads(line))
            except ValueError:
                continue
    if objects:
        return _experiments_from_json(objects)
    rows = _markdown_tables(text)
    if rows or "|" in stripped.splitlines()[0] or name.endswith(".md"):
        return rows
    first = stripped.splitlines()[0]
    delimiter = "\t" if "\t" in first else ";" if ";" in first and "," not in first else ","
    if delimiter not in first:
        return []
    table = list(csv.reader(io.StringIO(stripped), delimiter=delimiter))
    return _experiments_from_rows(table[0], table[1:]) if table else []


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


# --------------------------------------------------------------------------------------------
# Collecting everything
# --------------------------------------------------------------------------------------------


def _read_text(path: str, what: str, stdin_text: str | None) -> str:
    if path == "-":
        if stdin_text is None:
            raise EvidenceError(f"cannot read {what} from stdin: nothing was given")
        return stdin_text
    try:
        with open(path, "rb") as fh:
            blob = fh.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise EvidenceError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    if len(blob) > MAX_TEXT_BYTES:
        raise EvidenceError(f"cannot read {what} '{path}': larger than {MAX_TEXT_BYTES} bytes")
    return blob.decode("utf-8", errors="replace")


def _scan_env(text: str) -> dict[str, str]:
    parser = _LogParser()
    for line in text.splitlines():
        if "ALLOC_CONF" in line:
            parser._env(line)
    return parser.ev.env


def collect(
    logs: Iterable[str] = (),
    config: str | None = None,
    experiments: str | None = None,
    memory_stats: str | None = None,
    snapshot: str | None = None,
    stdin_text: str | None = None,
) -> Evidence:
    """All the evidence from the given paths ("-" reads `stdin_text`), merged in this order:
    logs, config (YAML/JSON or a plain-text command line), experiments, memory stats, snapshot.

    Raises EvidenceError with one line (`cannot read log 'x': No such file or directory`) when
    a file cannot be read, and for unsafe or corrupt snapshots. Unparsable content is noted."""
    evidence = Evidence()
    for log in logs:
        if log == "-":
            part = parse_log(_read_text(log, "log", stdin_text))
            part.sources.append("log:<stdin>")
        else:
            part = parse_log_file(log)
        evidence = evidence.merge(part)
    if config is not None:
        text = _read_text(config, "config", stdin_text)
        flat, notes = parse_config_with_notes(text, "" if config == "-" else config)
        label = "<stdin>" if config == "-" else config
        part = Evidence(config=flat, env=_scan_env(text), sources=[f"config:{label}"])
        part.notes = [f"config {label}: {n}" for n in notes if not n.startswith("read as")]
        evidence = evidence.merge(part)
    if experiments is not None:
        text = _read_text(experiments, "experiments", stdin_text)
        label = "<stdin>" if experiments == "-" else experiments
        rows = parse_experiments(text, "" if experiments == "-" else experiments)
        part = Evidence(experiments=rows, sources=[f"experiments:{label}"])
        if not rows:
            part.notes.append(f"experiments {label}: no result rows found")
        evidence = evidence.merge(part)
    if memory_stats is not None:
        text = _read_text(memory_stats, "memory stats", stdin_text)
        label = "<stdin>" if memory_stats == "-" else memory_stats
        stats = parse_memory_stats(text)
        part = Evidence(memory_stats=stats, sources=[f"memory_stats:{label}"])
        if stats is None:
            part.notes.append(f"memory stats {label}: not a torch.cuda.memory_stats() dump")
        evidence = evidence.merge(part)
    if snapshot is not None:
        if snapshot == "-":
            text = _read_text(snapshot, "snapshot", stdin_text)
            summary = _load_snapshot_bytes(text.encode("utf-8"), "<stdin>")
        else:
            summary = load_snapshot(snapshot)
        label = "<stdin>" if snapshot == "-" else snapshot
        evidence = evidence.merge(Evidence(snapshot=summary, sources=[f"snapshot:{label}"]))
    return evidence
