"""Evidence parsed from real training artefacts.

Every parser is tolerant of noise: rank prefixes (`[rank3]:`, ` 0: `), timestamps, ANSI colour
codes, hard-wrapped pastes and truncated lines. Nothing here raises on bad input: what cannot
be read is skipped (and noted), so the doctor always runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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


@dataclass
class Iteration:
    """One training-progress line (Megatron-LM, Megatron-Bridge or NeMo)."""

    iteration: int | None = None
    elapsed_ms: float | None = None
    tflops_per_gpu: float | None = None
    loss: float | None = None
    source: str = ""  # megatron | megatron-bridge | nemo


@dataclass
class MemoryReport:
    """A memory report line (Megatron's report_memory and friends); bytes."""

    rank: int | None = None
    allocated_bytes: int | None = None
    max_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    max_reserved_bytes: int | None = None


@dataclass
class ErrorEvent:
    """An exception or warning from a traceback or log."""

    type: str = ""  # e.g. ValueError, torch.OutOfMemoryError, UserWarning
    message: str = ""
    frames: list[str] = field(default_factory=list)  # "file:line in function", innermost last
    kind: str = "exception"  # exception | warning


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
        )
