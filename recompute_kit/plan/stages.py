"""Every pipeline stage's total for one setting, and which stage binds and why."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config
from ..memory.estimate import Estimate, estimate
from ..memory.layout import in_flight_words
from .margins import planned_bytes

GIB = 2**30


@dataclass
class Stage:
    stage: int
    layers: list[int]
    moe_layers: int
    micro_batches_in_flight: float
    chunk_micro_batches: list[int]  # per virtual-pipeline chunk (Estimate's)
    embedding: bool
    output_and_loss: bool
    peak_activation_bytes: int
    model_state_bytes: int  # weights + gradients + optimizer states
    total_bytes: int
    held_bytes: int  # the total and what the rank holds beside it (margins.planned_bytes)
    headroom_bytes: int  # usable memory minus held (negative: over)
    ranks: tuple[int, int]  # the first and last global rank (Megatron's default rank order)

    def to_json(self) -> dict:
        return {
            "stage": self.stage,
            "layers": [self.layers[0], self.layers[-1]] if self.layers else [],
            "num_layers": len(self.layers),
            "moe_layers": self.moe_layers,
            "micro_batches_in_flight": self.micro_batches_in_flight,
            "chunk_micro_batches": self.chunk_micro_batches,
            "embedding": self.embedding,
            "output_and_loss": self.output_and_loss,
            "peak_activation_bytes": self.peak_activation_bytes,
            "model_state_bytes": self.model_state_bytes,
            "total_bytes": self.total_bytes,
            "held_bytes": self.held_bytes,
            "headroom_bytes": self.headroom_bytes,
            "global_ranks": list(self.ranks),
        }


def stage_ranks(config: Config, stage: int) -> tuple[int, int]:
    """The global ranks of a pipeline stage in Megatron-Core's default rank order
    (initialize_model_parallel's order "tp-cp-ep-dp-pp": the pipeline varies slowest), so
    stage s holds the s-th contiguous block of world / PP ranks."""
    p = config.parallel
    per_stage = p.tensor_model_parallel_size * p.context_parallel_size * p.data_parallel_size
    return stage * per_stage, (stage + 1) * per_stage - 1


def stage_table(config: Config, usable: int) -> list[Stage]:
    """One row per pipeline stage for `config`'s recompute setting."""
    pp = config.parallel.pipeline_model_parallel_size
    rows = []
    for s in range(pp):
        e: Estimate = estimate(config, stage=s)
        rows.append(
            Stage(
                stage=s,
                layers=list(e.layers),
                moe_layers=sum(config.model.is_moe_layer(n) for n in e.layers),
                micro_batches_in_flight=e.micro_batches_in_flight,
                chunk_micro_batches=list(e.chunk_micro_batches),
                embedding=s == 0,
                output_and_loss=s == pp - 1,
                peak_activation_bytes=e.peak_activation_bytes,
                model_state_bytes=e.model_state_bytes,
                total_bytes=e.total_bytes,
                held_bytes=planned_bytes(e),
                headroom_bytes=usable - planned_bytes(e),
                ranks=stage_ranks(config, s),
            )
        )
    return rows


def binding_reason(rows: list[Stage]) -> str:
    """Which stage binds (the least headroom: its total and what it holds beside it) and why,
    against the other stages."""
    b = min(rows, key=lambda r: r.headroom_bytes)  # what it holds, imbalance included
    if len(rows) == 1:
        return (
            f"stage 0 (the only one: every rank) holds {len(b.layers)} layers, the embedding, "
            "the output layer and the loss"
        )
    others = [r for r in rows if r is not b]
    runner = min(others, key=lambda r: r.headroom_bytes)
    why = []
    most_layers = max(len(r.layers) for r in rows)
    layer_part = f"{len(b.layers)} layers"
    if len(b.layers) == most_layers and any(len(r.layers) < most_layers for r in others):
        layer_part += " (the most of any stage)"
    why.append(
        f"{layer_part} x {in_flight_words(b.micro_batches_in_flight, b.chunk_micro_batches)} "
        f"({b.peak_activation_bytes / GIB:.1f} GiB of activations at peak"
        + (
            ", the most micro-batches of any stage"
            if b.micro_batches_in_flight > max(r.micro_batches_in_flight for r in others)
            else ""
        )
        + ")"
    )
    if b.embedding:
        why.append("the embedding")
    if b.output_and_loss:
        why.append("the output layer and the loss (the logits)")
    states = f"model states {b.model_state_bytes / GIB:.1f} GiB"
    if b.moe_layers:
        states += f" (expert weights of {b.moe_layers} MoE layer{'s' if b.moe_layers > 1 else ''})"
    why.append(states)
    gap = (runner.headroom_bytes - b.headroom_bytes) / GIB
    first, last = b.ranks
    return (
        f"stage {b.stage} (global ranks {first}-{last} in Megatron's default rank order "
        f"tp-cp-ep-dp-pp) binds with {b.headroom_bytes / GIB:.2f} GiB of headroom (total "
        f"{b.total_bytes / GIB:.2f} GiB and what it holds beside it): "
        + ", ".join(why)
        + f"; next is stage {runner.stage} with {runner.headroom_bytes / GIB:.2f} GiB of "
        f"headroom ({gap:.2f} GiB more; total {runner.total_bytes / GIB:.2f} GiB)"
    )
