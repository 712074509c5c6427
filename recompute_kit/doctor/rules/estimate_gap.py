"""The OOM's own figures against the estimate of the config given (RK018, RK019).

The allocator's message says what the failing rank held (allocated by PyTorch) and asked for
(the request); the estimate says what that rank's settings need. Where the run needed clearly
more than the estimate, advice drawn from the estimate alone ("the current setting fits") is
wrong, and the gap itself is the finding: a dropless MoE whose expert ranks receive more than
their balanced share of tokens (RK018, sized and planned for), or memory the config does not
explain (RK019: the config is not what ran, or something outside the training step holds it).
"""

from __future__ import annotations

import dataclasses
import math

from ...memory.estimate import estimate
from ..types import GIB, Context, Match
from .registry import candidate_patch, candidate_spec, gib, moments_before_first_step, rule

GAP_FLOOR = 2 * GIB  # below this (or 10% of the estimate) the gap is within the estimate's error
GAP_SHARE = 0.10
IMBALANCE_STEP = 0.25  # the imbalance planned for: the one that closes the gap, rounded up


def _before_first_step(ctx: Context) -> str:
    """A caveat where the log shows no iteration: Adam's two moments are made at the first
    optimizer step, so an OOM before it held less than the estimate counts and the gap is
    larger by up to that much."""
    moments = moments_before_first_step(ctx)
    if not moments:
        return ""
    return (
        f" The log shows no finished iteration: if the OOM came before the first optimizer "
        f"step, Adam's moments ({gib(moments)}) did not exist yet and the gap is larger by up "
        "to that much."
    )


def observed_gap(ctx: Context) -> tuple[int, int, int] | None:
    """(needed, estimated, gap) in bytes for the rank the OOM names: what PyTorch had
    allocated plus the request, against the estimate's PyTorch-side total (activations,
    model states, MoE and gathered-parameter buffers; the CUDA context and NCCL live outside
    PyTorch's counters). None without both figures or when the gap is within the error."""
    found = _needed_and_estimated(ctx)
    if found is None:
        return None
    needed, estimated = found
    gap = needed - estimated
    if gap < max(GAP_FLOOR, GAP_SHARE * estimated):
        return None
    return needed, estimated, gap


# Below this share of the estimate, what the rank reached does not confirm the estimate: the
# step failed early (states or activations not yet at their peak) or the inputs overstate the
# run (the tokens per micro-batch under a cap such as max_length, a layout read as assumed).
OVERSTATE_SHARE = 0.6


# At the loss (the OOM's request one fp32 copy of the logits) every layer's forward has run:
# what PyTorch had allocated is then the states and the layers' activations, which the
# estimate must not exceed by more than its error
AT_LOSS_SHARE = 0.9


def estimate_overstates(ctx: Context) -> tuple[int, int, bool] | None:
    """(needed, estimated, at_loss) where the rank the OOM names reached far less than the
    estimate of its settings: allocated plus the request under OVERSTATE_SHARE of the
    PyTorch-side total (as observed_gap counts it); or, where the request is the loss's fp32
    logits copy (every layer's forward done), allocated under AT_LOSS_SHARE of the estimate
    without the loss. None without the figures or where they agree."""
    found = _needed_and_estimated(ctx)
    if found and found[0] < OVERSTATE_SHARE * found[1]:
        return (*found, False)
    at_loss = _at_the_loss(ctx)
    if at_loss and at_loss[0] < AT_LOSS_SHARE * at_loss[1]:
        return (*at_loss, True)
    return None


def _at_the_loss(ctx: Context) -> tuple[int, int] | None:
    """(allocated, the estimate's PyTorch side before the loss) where the OOM's request is one
    fp32 copy of the last stage's logits; None otherwise."""
    oom, e, cfg = ctx.oom, ctx.estimate, ctx.config
    if oom is None or e is None or cfg is None or not oom.requested_bytes:
        return None
    if oom.allocated_bytes is None or not e.loss_saved_bytes:
        return None
    m, p = cfg.model, cfg.parallel
    tokens = m.seq_length * m.micro_batch_size // p.context_parallel_size
    logits = 4 * tokens * m.vocab_size / p.tensor_model_parallel_size
    if abs(oom.requested_bytes - logits) >= 0.05 * logits:
        return None
    total = e.total_with_overheads_bytes or e.total_bytes
    before = total - e.cuda_context_bytes - e.nccl_buffers_bytes
    before -= e.loss_saved_bytes + e.loss_transient_bytes
    return oom.allocated_bytes, before


def _needed_and_estimated(ctx: Context) -> tuple[int, int] | None:
    """What PyTorch had allocated plus the request, and the estimate's PyTorch-side total
    (the CUDA context and NCCL live outside PyTorch's counters); None without both."""
    oom, e = ctx.oom, ctx.estimate
    if oom is None or e is None or oom.allocated_bytes is None or not oom.requested_bytes:
        return None
    total = e.total_with_overheads_bytes or e.total_bytes
    estimated = total - e.cuda_context_bytes - e.nccl_buffers_bytes
    return oom.allocated_bytes + oom.requested_bytes, estimated


def overstated_words(ctx: Context, found: tuple[int, int, bool]) -> str:
    """The mismatch in words, with the readings the OOM alone cannot tell apart."""
    needed, estimated, at_loss = found
    if at_loss:
        fp8 = (
            " (fp8 activations are counted at 16 bits)"
            if ctx.config is not None and ctx.config.model.fp8
            else ""
        )
        return (
            f"the OOM is at the loss (its request is one fp32 copy of the logits), after every "
            f"layer's forward, with {gib(needed)} allocated where the estimate puts "
            f"{gib(estimated)} before the loss: the estimate overstates this run{fp8}; plan "
            "from what the rank holds, not from the estimate"
        )
    return (
        f"the estimate of the run's settings ({gib(estimated)} on PyTorch's side) is far above "
        f"what the rank reached ({gib(needed)} with the request): either the step failed early "
        "(before the optimizer states or the activations' peak existed) or the inputs overstate "
        "the run (the tokens per micro-batch: batches pad to their longest sample, not to a "
        "cap such as max_length); the OOM alone does not tell which"
    )


def _which_stage(ctx: Context) -> str:
    """The pipeline stage the estimate is for, with its global ranks, and why that one."""
    if ctx.config is None or ctx.config.parallel.pipeline_model_parallel_size == 1:
        return ""
    from ...plan.stages import stage_ranks

    stage = ctx.estimate.stage
    first, last = stage_ranks(ctx.config, stage)
    why = (
        "the OOM's rank"
        if ctx.oom_stage is not None
        else "the stage that holds the most, as the OOM does not name its global rank"
    )
    return f" (pipeline stage {stage}, global ranks {first}-{last}: {why})"


def _dropless_moe(ctx: Context) -> bool:
    """A MoE run whose routing has no bound (no capacity factor, routing not forced)."""
    m = ctx.config.model if ctx.config else None
    return bool(
        m
        and m.num_moe_experts
        and m.moe_expert_capacity_factor is None
        and not m.moe_router_force_load_balancing
    )


@rule(
    "RK018",
    "Dropless MoE: expert ranks receive more than their balanced share of tokens",
    "activation_memory",
    symptom="An OOM on an MoE run without a capacity factor whose allocated memory is well "
    "above the estimate of its config (which assumes balanced routing)",
    cause="Dropless routing lets one expert rank receive many times its share of tokens, "
    "early in training above all; its expert activations (and their copies for the "
    "backward) grow with the tokens it receives",
    confirm="Log the tokens each expert rank receives (Megatron: --moe-per-layer-logging, "
    "the router's tokens_per_expert) and max_memory_allocated per rank; the rank with the "
    "most tokens is the one that fails",
    fix="Recompute the expert activations (moe_act, then moe) planned for the imbalance seen "
    "(recompute-kit plan --moe-imbalance F), or bound it with moe_expert_capacity_factor "
    "(drops tokens: changes training)",
    supersedes=("RK005", "RK087", "RK019"),
)
def _moe_imbalance(ctx: Context) -> Match | None:
    found = observed_gap(ctx)
    if found is None or not _dropless_moe(ctx) or ctx.estimate.moe_imbalance_bytes:
        return None
    needed, estimated, gap = found
    # the expert activations one more balanced share adds (the estimate at imbalance 2)
    per_share = estimate(ctx.config, stage=ctx.oom_stage, moe_imbalance=2.0).moe_imbalance_bytes
    if per_share <= 0:
        return None
    factor = 1.0 + gap / per_share
    ep = ctx.config.parallel.expert_model_parallel_size
    if factor > max(2.0, ep):  # more than every token on one rank: not routing alone
        return None
    planned = math.ceil(factor / IMBALANCE_STEP) * IMBALANCE_STEP
    said = (
        f"The rank had {gib(needed - ctx.oom.requested_bytes)} allocated and asked for "
        f"{gib(ctx.oom.requested_bytes)} more ({gib(needed)}); the estimate of its settings "
        f"with balanced routing is {gib(estimated)}{_which_stage(ctx)}. The run is a dropless "
        f"MoE (no moe_expert_capacity_factor): an expert rank receiving {factor:.2f}x its share of "
        f"tokens explains the {gib(gap)} gap.{_before_first_step(ctx)}"
    )
    if _before_first_step(ctx):
        # without the moments the same OOM means more imbalance, and the moments come at the
        # first step: the fix is planned for that case (it covers the other)
        moments = moments_before_first_step(ctx)
        upper = 1.0 + (gap + moments) / per_share
        if upper <= max(2.0, ep):
            planned = math.ceil(upper / IMBALANCE_STEP) * IMBALANCE_STEP
            said += (
                f" Without them the rank received {upper:.2f}x its share; the plan is for that "
                "case, which covers the other."
            )
    patch, words = _plan_for(ctx, planned)
    return Match(0.6, f"{said} {words}", config_patch=patch)


def _plan_for(ctx: Context, imbalance: float) -> tuple[dict | None, str]:
    """The planner's cheapest setting at that imbalance (the rule's patch), in words."""
    if not ctx.gpu_bytes:
        return None, f"Plan for it: recompute-kit plan --moe-imbalance {imbalance:g}."
    model = dataclasses.replace(ctx.config.model, moe_routing_imbalance=imbalance)
    model_cfg = dataclasses.replace(ctx.config, model=model)
    best, said = _cheapest(model_cfg, ctx.gpu_bytes / GIB, ctx.plan_format)
    how = f"Planned at imbalance {imbalance:g}"
    if best is None:
        return None, f"{how}: {said}."
    return candidate_patch(best), (
        f"{how} (recompute-kit plan --moe-imbalance {imbalance:g}): {said}"
    )


def _cheapest(config, budget_gb: float, fmt: str):
    """The planner's cheapest candidate in `budget_gb`: (it, it in words), or (None, the
    planner's one-line refusal)."""
    from ...config import ConfigError
    from ...plan import plan
    from ...plan.margins import planned_bytes

    try:
        best = plan(config, budget_gb, fmt=fmt).best
    except ConfigError as exc:
        return None, str(exc)
    return best, (
        f"'{best.name}' fits at {gib(planned_bytes(best.estimate))} per rank, "
        f"{best.estimate.recompute_flops_fraction:.1%} extra FLOPs."
    )


@rule(
    "RK019",
    "The rank allocated much more than its config's estimate",
    "genuine_pressure",
    symptom="An OOM whose allocated memory is well above the estimate of the config given",
    cause="The config given is not what ran (a flag overridden on the command line, a "
    "different sequence length or micro-batch, packing), or something outside the training "
    "step holds memory (evaluation or generation buffers, tensors kept across steps, a leak)",
    confirm="Compare the arguments the framework prints at start-up with the config; take "
    "torch.cuda.memory_summary() or a memory snapshot at the failure to see what holds it",
    fix="Make the estimate describe the run (pass the printed arguments as the config), then "
    "act on what the snapshot shows; advice drawn from this config's estimate alone is not "
    "enough here",
    supersedes=("RK005",),
)
def _unexplained_gap(ctx: Context) -> Match | None:
    found = observed_gap(ctx)
    if found is None:
        return None
    needed, estimated, gap = found
    patch, words = _plan_without(ctx, gap)
    return Match(
        0.45,
        f"The rank needed {gib(needed)} (allocated plus the request) where the estimate of "
        f"the config given is {gib(estimated)}: {gib(gap)} the config does not explain."
        f"{_before_first_step(ctx)} {words}",
        config_patch=patch,
    )


def _plan_without(ctx: Context, gap: int) -> tuple[dict, str]:
    """The planner's cheapest setting with the unexplained bytes set aside (the GPU taken as
    that much smaller): the patch that fits the run as it behaved, not as the config says."""
    if not ctx.gpu_bytes or ctx.gpu_bytes <= gap:
        return {}, "Find what holds it before planning (the snapshot or memory summary)."
    budget = (ctx.gpu_bytes - gap) / GIB
    best, said = _cheapest(ctx.config, budget, ctx.plan_format)
    if best is None:
        return {}, f"With it set aside ({budget:.1f} GiB left) the planner says: {said}."
    if candidate_spec(best) == ctx.config.recompute.spec and not best.offload:
        return {}, f"With it set aside ({budget:.1f} GiB left) the current setting still fits."
    return candidate_patch(best), f"Planned with it set aside ({budget:.1f} GiB left): {said}"
