"""Lines under `estimate`'s and `plan`'s tables that name what their totals hold beside the
weights, gradients, optimizer and layer activations: the logits and loss of the last stage,
and the overheads (memory/overheads.py) the plain total leaves out."""

from __future__ import annotations

from ..memory.estimate import Estimate
from ..plan.margins import planned_bytes
from ..units import byte_unit, in_unit


def _gib(value: float) -> str:
    """Bytes in the unit that suits them (GiB, MiB, ...), two decimals."""
    unit, scale = byte_unit([value])
    return f"{in_unit(value, scale, 2)} {unit}"


def loss_at_peak_bytes(e: Estimate) -> int:
    """What the logits and loss hold at their own peak (saved + what they add while running)."""
    return e.loss_saved_bytes + e.loss_transient_bytes


def loss_line(e: Estimate, specs_setting_peak: list[str] | None = None) -> str | None:
    """The logits / loss term of a last-stage estimate, or None on another stage.
    `specs_setting_peak`: the rows (recompute settings) whose peak is the loss's moment."""
    if not e.logits_shape:
        return None
    rows, columns = e.logits_shape
    shape = (
        f"logits {rows} x {columns} per rank never held whole (a fused linear cross-entropy "
        "computes them in chunks)"
        if e.fused_linear_loss
        else f"logits {rows} x {columns} per rank"
    )
    line = (
        f"logits / loss (stage {e.stage}, the last): {shape}; the loss "
        f"keeps {_gib(e.loss_saved_bytes)} for backward (in activations) and "
        + (
            f"adds {_gib(e.loss_transient_bytes)} while it runs: "
            f"{_gib(loss_at_peak_bytes(e))} at its peak"
            if e.loss_transient_bytes
            else "adds nothing while it runs"
        )
    )
    if specs_setting_peak is None:
        specs_setting_peak = [e.recompute] if e.loss_sets_peak else []
    if specs_setting_peak:
        line += f"; it sets the peak of {', '.join(specs_setting_peak)}"
    return line


def step_line(results: list[Estimate]) -> str | None:
    """The optimizer step's transient (DeepSpeed's fp32 gradient copy, a foreach AdamW's
    temporary) where it sets the peak of a row, or None."""
    rows = [e.recompute for e in results if e.step_sets_peak]
    if not rows:
        return None
    e = results[0]
    return (
        f"optimizer step: {_gib(e.optimizer_step_bytes)} beside the model states after backward "
        f"freed the activations (DeepSpeed's fp32 copy of the gradient partition, and a foreach "
        f"AdamW's temporary where optim is adamw_torch); above the activations' peak, it sets "
        f"the total of {', '.join(rows)}"
    )


def overhead_terms(e: Estimate) -> dict[str, int]:
    """The overheads outside `total_bytes`, named, the nonzero ones."""
    terms = {
        f"MoE routing imbalance x{e.moe_imbalance_factor:g}": e.moe_imbalance_bytes,
        "dispatcher buffers": e.dispatcher_buffers_bytes,
        "gathered / autocast weight copies": e.gathered_params_bytes,
        "ZeRO gradient buckets / prefetch": e.zero_buffers_bytes,
        "CUDA context": e.cuda_context_bytes,
        "NCCL buffers": e.nccl_buffers_bytes,
    }
    return {name: value for name, value in terms.items() if value}


def overheads_line(e: Estimate) -> str:
    """`total` + each overhead = total with overheads, for one estimate."""
    terms = ", ".join(f"{name} {_gib(value)}" for name, value in overhead_terms(e).items())
    held = planned_bytes(e)
    return (
        f"beside the total ({e.recompute}): {terms or 'none'}; total with overheads "
        f"{_gib(e.total_with_overheads_bytes)} (all of it against the GPU's memory). `plan` "
        f"compares {_gib(held)} (the total"
        + (" and the terms the run holds beside it" if held != e.total_bytes else "")
        + ") with the GPU's memory less its safety margin (--safety-margin, 10%), which takes "
        "the CUDA context, NCCL's buffers and the allocator's fragmentation: the same question, "
        "two accountings"
        + "".join(f"\nnot in these figures: {a}" for a in unsized_overheads(e))
    )


def unsized_overheads(e: Estimate) -> list[str]:
    """What the run holds that no figure counts (the JSON's overhead_assumptions that say so):
    said in the text too, where a reader of the table would miss it."""
    return [a for a in e.overhead_assumptions if "not counted" in a or "not modelled" in a]
