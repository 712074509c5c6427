"""The evidence schema: what every parser produces (contract: fields may be added, never renamed
or removed), and the limits that keep memory bounded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from operator import attrgetter
from typing import Any


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
    # the sum over the "Process <pid> has X memory in use" entries; with no "this process
    # has" line (a container's PID namespace) this process is one of them (listed_self True)
    other_processes_bytes: int | None = None
    other_process_sizes: list[int] = field(default_factory=list)  # each entry's, as listed
    listed_self: bool | None = None
    reserved_bytes: int | None = None  # old messages: reserved (or cached) in total
    allowed_bytes: int | None = None  # set_per_process_memory_fraction
    private_pool_bytes: int | None = None  # CUDA graphs' private pools
    device: int | None = None
    rank: int | None = None
    generation: str = ""  # which message format: gen1_cached ... gen6_pytorch_alloc_conf
    line: str = ""  # the message as found (first 300 characters)
    # what its line says before the message (at most 200 characters): who raised it, e.g.
    # "Error in VllmInternalWorkerExtension.update_weights_via_ipc_zmq:"
    prefix: str = ""
    backend: str = "cuda"  # cuda | hip (ROCm) | xpu | npu (torch_npu)
    truncated: bool = False  # the message was cut before all its fields
    line_number: int | None = None  # 1-based line of the log where the message starts
    # total - free - reserved by PyTorch: other processes, CUDA context, NCCL, libraries
    held_elsewhere_bytes: int | None = None
    # the most one allocation may take on this platform (IPEX's 4 GB), when the message says
    allocation_limit_bytes: int | None = None
    context: list[str] = field(default_factory=list)  # unread lines just before it (see ErrorEvent)


@dataclass(slots=True)  # a 100 MB log holds hundreds of thousands
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


@dataclass(slots=True)
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
    # Lines no parser read just before an exception without frames: a call chain pasted in
    # another format ("a -> b -> c", "File ... line N" cut from its head), kept as evidence.
    context: list[str] = field(default_factory=list)


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
    # nvidia-smi's process table: {"gpu": 0, "pid": 123, "name": "...", "used_bytes": ...}
    gpu_processes: list[dict[str, Any]] = field(default_factory=list)
    # What pasted code, prose and tables state about checkpointing (evidence/code.py), by
    # source: {"log": {...}, "config": {...}}; "args_dump": Megatron's printed arguments.
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the shared reader (recompute_kit.sources) read from the config files, as
    # `recompute-kit read --json` prints it: config, sources, warnings, inputs. None: no file.
    read: dict[str, Any] | None = None
    # The timestamps of the first and last iteration lines ("2024-04-06 02:55:45"), when the
    # log stamps them: {"first": ..., "last": ...}; the judge compares runs' dates with them.
    iteration_stamps: dict[str, str] = field(default_factory=dict)

    def to_json(self, rows: bool = True) -> dict[str, Any]:
        """The evidence as a JSON document. `rows=False` leaves `iterations` and `memory` as
        their dataclass instances (scalar fields only) for a streaming writer to turn into
        objects one at a time (the CLI's `emit_json`): a 100 MB log's rows are then never all
        held as dicts."""
        out = asdict(replace(self, iterations=[], memory=[]))
        out["iterations"] = self.iterations if not rows else [row_json(r) for r in self.iterations]
        out["memory"] = self.memory if not rows else [row_json(r) for r in self.memory]
        return out

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
            gpu_processes=self.gpu_processes + other.gpu_processes,
            facts=_merge_facts(self.facts, other.facts),
            read=other.read or self.read,
            iteration_stamps=_span(self.iteration_stamps, other.iteration_stamps),
        )


_ROW_FIELDS: dict[type, tuple[tuple[str, ...], Any]] = {}


def row_json(row: Iteration | MemoryReport) -> dict[str, Any]:
    """A row of scalar fields (an iteration line, a memory report) as a dict, faster than
    `asdict` (no deep copy: the values are numbers and strings)."""
    kind = type(row)
    known = _ROW_FIELDS.get(kind)
    if known is None:
        names = tuple(f.name for f in fields(kind))
        known = _ROW_FIELDS[kind] = (names, attrgetter(*names))
    names, get = known
    return dict(zip(names, get(row), strict=True))


def _span(a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    """The first stamp of `a` (else `b`) and the last of `b` (else `a`): inputs in order."""
    out = {k: v for k, v in (("first", a.get("first") or b.get("first")),) if v}
    last = b.get("last") or a.get("last")
    return {**out, "last": last} if last else out


def _merge_facts(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict:
    out = {k: dict(v) for k, v in a.items()}
    for source, facts in b.items():
        mine = out.setdefault(source, {})
        for key, value in facts.items():
            if isinstance(value, list) and isinstance(mine.get(key), list):
                mine[key] = mine[key] + value
            elif isinstance(value, dict) and isinstance(mine.get(key), dict):
                mine[key] = {**mine[key], **value}
            else:
                mine[key] = value
    return out


# Limits that keep memory bounded on huge or hostile inputs.
MAX_LINE_CHARS = 1 << 16  # longer lines are cut (a progress bar without newlines, binary junk)
MAX_OOM_EVENTS = 10_000
MAX_ERROR_EVENTS = 2_000  # distinct ones; repeats are counted
MAX_ITERATIONS = 2_000_000
MAX_MEMORY_REPORTS = 200_000
MAX_NOTES = 50
MAX_TEXT_BYTES = 256 << 20  # configs, experiment tables, memory stats read whole
MAX_SNAPSHOT_BYTES = 8 << 30
