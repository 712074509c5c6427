"""Choose recompute settings under a per-GPU memory budget.

Every valid candidate (`search.py`: no recompute, every combination of the model's recompute
modules, full uniform/block for every N, activation offloading where Megatron allows it; never
a setting broken on the run's Megatron-Core version) is estimated; the ones whose per-rank total
(weights + gradients + optimizer + peak activations) fits the budget after a safety margin are
ranked: those that clear the estimate's error band (`margins.py`) first, then by the compute
that recomputation adds, offloading last (its cost is PCIe traffic the FLOP model cannot
price). Near-ties are reported with the reason to pick one; every pipeline stage's total is
shown and the binding stage named (`stages.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import Config, ConfigError, RecomputeConfig, format_spec
from ..config.versions import describe_version, held_beyond_estimate, parse_version
from ..export import render, settings_line
from ..export_layout import Spelling, world_size
from ..memory.estimate import Estimate, estimate
from .margins import (
    SAFETY_MARGIN,
    TIE_FLOPS,
    Band,
    error_band,
    fits_host,
    planned_bytes,
    tie_reason,
)
from .search import REFUSED, UNWRITABLE, as_candidate, candidates, compact_specs
from .stages import Stage, binding_reason, stage_table

__all__ = ["Candidate", "Plan", "candidates", "explain", "plan"]

GIB = 2**30


@dataclass
class Candidate:
    estimate: Estimate
    recompute: RecomputeConfig
    fits: bool
    offload: str  # "" or a short description of the offloading it adds
    band: Band | None = None  # the estimate's error band on this path
    usable_bytes: int = 0
    # the step's recompute cost: with pipeline parallelism the slowest stage sets the step, so
    # the extra executed FLOPs of the slowest stage over the slowest without recompute
    # (`step_recompute_fraction`); the estimate's own fraction is its binding stage's
    step_cost: float = 0.0
    settings: str = ""  # the setting in the plan's format, on one line (export.settings_line)

    @property
    def name(self) -> str:
        """The setting as said: its recompute spec and the offloading it fits with."""
        return self.estimate.recompute + (f" + {self.offload}" if self.offload else "")

    def config(self, run: Config) -> Config:
        """`run` with this candidate's recompute and offloading settings."""
        return as_candidate(run, self.recompute)

    @property
    def headroom_bytes(self) -> int:
        """Usable memory (budget less the safety margin) minus what the run holds
        (margins.planned_bytes: the estimate's total and its named terms)."""
        return self.usable_bytes - planned_bytes(self.estimate)

    @property
    def clears_band(self) -> bool:
        return self.band is not None and self.headroom_bytes >= self.band.total_bytes

    def to_json(self) -> dict:
        return {
            **self.estimate.to_json(),
            "fits": self.fits,
            "offload": self.offload or None,
            # what is compared with the budget: total_bytes and the terms beside it (MoE
            # imbalance, dispatcher buffers, gathered parameters: margins.planned_bytes)
            "planned_bytes": planned_bytes(self.estimate),
            "step_recompute_flops_fraction": self.step_cost,
            "headroom_bytes": self.headroom_bytes,
            "error_band_bytes": self.band.total_bytes if self.band else None,
            "clears_error_band": self.clears_band,
            "settings": self.settings or None,
        }


class NothingFits(ConfigError):
    """`plan` found no setting that fits; `smallest` is the candidate that needs the least
    memory (one Megatron-Core accepts: `plan --levers` shows a layout at it)."""

    def __init__(self, message: str, smallest: Candidate, full_refused: str | None):
        super().__init__(message)
        self.smallest = smallest
        self.full_refused = full_refused  # why no full recompute setting was a candidate


@dataclass
class Plan:
    budget_bytes: int
    usable_bytes: int
    candidates: list[Candidate]
    best: Candidate
    explanation: str
    rendered: str
    stages: list[Stage] = dataclasses.field(default_factory=list)  # the best's, every stage
    binding: str = ""  # which stage binds and why
    ties: list[dict] = dataclasses.field(default_factory=list)
    excluded: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (spec, why)
    megatron_core_version: str = ""  # as used: "0.16" or "unknown (the strictest ...)"
    # layout and shape settings (Megatron names) changed from the inputs; in `rendered` too
    changes: dict = dataclasses.field(default_factory=dict)

    @property
    def headroom_bytes(self) -> int:
        return self.best.headroom_bytes

    @property
    def error_band(self) -> Band:
        assert self.best.band is not None
        return self.best.band


def plan(
    config: Config,
    gpu_memory_gb: float,
    safety_margin: float = SAFETY_MARGIN,
    fmt: str = "megatron-bridge",
    stage: int | None = None,
    megatron_core_version: str | None = None,
    changes: dict | None = None,
    spelling: Spelling | None = None,
) -> Plan:
    """Estimate every candidate, mark what fits, pick the cheapest that clears the estimate's
    error band. `megatron_core_version` (else the config's; None: unknown, the strictest)
    decides which settings are known to be broken. `changes`: the layout and shape settings
    `config` changes from the inputs (export_layout.changed_settings: the command line's --cp,
    --seq-length, ...), rendered with the recompute settings; `spelling`: a Trainer run's own
    keys and flag syntax. Raises ConfigError (one line) when the budget is impossible or nothing
    fits, saying by how much."""
    if gpu_memory_gb <= 0:
        raise ConfigError(f"--gpu-memory-gb must be positive, got {gpu_memory_gb:g}")
    if not 0 <= safety_margin < 1:
        raise ConfigError(f"--safety-margin must be in [0, 1), got {safety_margin:g}")
    version = parse_version(megatron_core_version or config.megatron_core_version)
    budget = int(gpu_memory_gb * GIB)
    usable = int(budget * (1 - safety_margin))
    found = []
    excluded: list[tuple[str, str]] = []
    for rc, offload in candidates(config, version, excluded, fmt):
        # Candidates bring their own offloading; the setup keeps distribute_saved_activations.
        candidate = as_candidate(config, rc)
        candidate.validate()  # candidates() keeps only what Megatron accepts (normalises it)
        est = estimate(candidate, stage=stage)
        found.append(
            Candidate(
                est,
                candidate.recompute,
                planned_bytes(est) <= usable and fits_host(est),
                offload,
                error_band(candidate, est),
                usable,
                est.recompute_flops_fraction if stage is not None else step_cost(candidate),
            )
        )
    found = _without_idle_modules(found, keep=config.recompute)
    stage_layers = config.model.num_layers // config.parallel.pipeline_model_parallel_size
    for c in found:
        c.settings = settings_line(c.recompute, fmt, num_layers=stage_layers, spelling=spelling)
    fitting = sorted(
        (c for c in found if c.fits),
        # a cheaper setting only when it clears the band too; among equal costs (elementwise
        # recompute costs no matmul FLOPs) fewer recomputed modules first
        key=lambda c: (
            bool(c.offload),
            not c.clears_band,
            c.step_cost,
            _units(c.recompute),
            c.estimate.total_bytes,
        ),
    )
    if fitting and not any(c.clears_band for c in fitting):
        # nothing clears the band: the most headroom is the least risk
        fitting.sort(key=lambda c: (bool(c.offload), -c.headroom_bytes))
        _fewest_layers_under_the_moe_leak(config, fitting, version)
    if not found:
        refused = "; ".join(sorted({why for _, why in excluded}))
        raise ConfigError(f"no recompute setting can run this layout: {refused}")
    if not fitting:
        smallest = min(found, key=lambda c: planned_bytes(c.estimate))
        full_refused = _full_refused(found, excluded)
        need = planned_bytes(smallest.estimate)
        beside = need - smallest.estimate.total_bytes
        held = (
            f" (its total {smallest.estimate.total_bytes / GIB:.1f} GiB and "
            f"{beside / GIB:.1f} GiB the run holds beside it: {smallest.estimate.beside_words()})"
            if beside
            else ""
        )
        raise NothingFits(
            f"nothing fits in {gpu_memory_gb:g} GiB ({usable / GIB:.1f} GiB usable after a "
            f"{safety_margin:.0%} margin): the smallest candidate, {smallest.name}, needs "
            f"{need / GIB:.1f} GiB per rank{held}, {(need - usable) / GIB:.1f} GiB too much; "
            + _what_else(config, states_alone_too_big=smallest.estimate.model_state_bytes > usable)
            + (f". Full recompute is not a candidate here: {full_refused}" if full_refused else ""),
            smallest,
            full_refused,
        )
    best = fitting[0]
    changes = changes or {}
    layout = dict(changes)
    if fmt == "torchtitan-registry":  # its batches are in tokens: sequences x this length
        from ..export_layout import SEQUENCE_TOKENS

        layout[SEQUENCE_TOKENS] = config.model.seq_length
    layers = config.model.num_layers // config.parallel.pipeline_model_parallel_size
    chosen = Config(config.model, config.parallel, best.recompute)
    stages = stage_table(chosen, usable)
    ties = _ties(best, fitting)
    return Plan(
        budget_bytes=budget,
        usable_bytes=usable,
        candidates=fitting + [c for c in found if not c.fits],
        best=best,
        explanation=explain(best, found, usable, ties, excluded, version, budget, config)
        + _imbalance_margin(chosen, best, usable, stage),
        rendered=render(
            best.recompute,
            fmt,
            num_layers=layers,
            layout=layout,
            world_size=world_size(config),
            spelling=spelling,
        ),
        changes=changes,
        stages=stages,
        binding=binding_reason(stages),
        ties=ties,
        excluded=excluded,
        megatron_core_version=describe_version(version),
    )


# A modest skew of routed tokens: what a fresh or drifting router easily reaches
SKEWED_ROUTING = 1.25


def _imbalance_margin(chosen: Config, best: Candidate, usable: int, stage: int | None) -> str:
    """For a dropless MoE run planned at balanced routing (nothing measured): whether the pick
    still fits at a modest skew, said where it does not (the pick can flip on it)."""
    m = chosen.model
    if not m.num_moe_experts or m.moe_expert_capacity_factor is not None:
        return ""
    if m.moe_router_force_load_balancing:
        return ""  # balanced by design (Megatron's benchmark mode)
    if m.moe_routing_imbalance not in (None, 1.0):
        return ""  # the imbalance is given: the plan is at it
    skewed = estimate(chosen, stage=stage, moe_imbalance=SKEWED_ROUTING)
    if planned_bytes(skewed) <= usable:
        return ""
    return (
        f" At balanced routing only: with the busiest expert rank at {SKEWED_ROUTING:g}x its "
        f"share of tokens it needs {planned_bytes(skewed) / GIB:.1f} GiB and does not fit; "
        "measure the tokens per expert (or plan with --moe-imbalance) before trusting the pick."
    )


def _ties(best: Candidate, fitting: list[Candidate], most: int = 3) -> list[dict]:
    """Candidates that clear the band at a recompute cost within TIE_FLOPS of the best's,
    with the reason to pick one of the two. Offloading is never a tie (its cost is not FLOPs)."""
    if best.offload or not best.clears_band or best.band is None:
        return []
    near = [
        c
        for c in fitting
        if c is not best
        and not c.offload
        and c.clears_band
        and abs(c.step_cost - best.step_cost) < TIE_FLOPS
        # no choice: as costly and holding more than the band above the best (full:block:N
        # runs an MTP layer without recompute where uniform recomputes it)
        and not (
            c.step_cost >= best.step_cost
            and c.estimate.total_bytes - best.estimate.total_bytes > best.band.total_bytes
        )
    ]
    # the most different in memory first: those are the choices worth a word
    near.sort(key=lambda c: c.estimate.total_bytes)
    return [
        {
            "recompute": c.estimate.recompute,
            "recompute_flops_fraction": c.estimate.recompute_flops_fraction,
            "step_recompute_flops_fraction": c.step_cost,
            "total_bytes": c.estimate.total_bytes,
            "headroom_bytes": c.headroom_bytes,
            "reason": tie_reason(
                best.estimate.recompute,
                best.estimate,
                c.estimate.recompute,
                c.estimate,
                best.band.total_bytes,
                c.step_cost - best.step_cost,
            ),
        }
        for c in near[:most]
    ]


def _closest_words(best: Candidate, found: list[Candidate]) -> str:
    """Why `best` was picked where nothing clears the band: the most headroom, or one layer
    at a time where the MoE recompute leak makes more layers hold more than estimated."""
    roomier = [
        c for c in found if c.fits and not c.offload and c.headroom_bytes > best.headroom_bytes
    ]
    if not roomier or best.offload:
        return "; it is the setting that comes closest to clearing the band."
    most = max(roomier, key=lambda c: c.headroom_bytes)
    more = (most.headroom_bytes - best.headroom_bytes) / GIB
    return (
        f"; {format_spec(most.recompute)} leaves {more:.2f} GiB more headroom by the estimate, "
        "within the band, but recomputes several layers at once, which the MoE recompute leak "
        "below makes hold more than estimated."
    )


def _fewest_layers_under_the_moe_leak(config: Config, fitting: list, version) -> None:
    """Where the most headroom is a full uniform recompute of several layers on a Megatron-Core
    whose MoE full recompute holds memory beyond the estimate, growing with
    recompute_num_layers (config/versions.py), put first the one-layer setting whose headroom
    is within the band of it: the estimates cannot tell the two apart, the leak can."""
    top = fitting[0]
    if top.offload or (top.recompute.recompute_num_layers or 0) <= 1 or top.band is None:
        return
    if not held_beyond_estimate(as_candidate(config, top.recompute), version):
        return
    for c in fitting[1:]:
        one = c.recompute.recompute_granularity == "full" and c.recompute.recompute_num_layers == 1
        if one and not c.offload and top.headroom_bytes - c.headroom_bytes <= top.band.total_bytes:
            fitting.remove(c)
            fitting.insert(0, c)
            return


def step_cost(config: Config) -> float:
    """Recompute's extra executed FLOPs of the step: the slowest pipeline stage with
    recompute over the slowest without (the step waits for the slowest stage)."""
    from ..memory.flops import recompute_flops, step_flops

    stages = range(config.parallel.pipeline_model_parallel_size)
    base = [step_flops(config, s, executed=True) for s in stages]
    extra = [recompute_flops(config, s, executed=True) for s in stages]
    slowest = max(base)
    return max(b + x for b, x in zip(base, extra, strict=True)) / slowest - 1 if slowest else 0.0


def _modules(rc: RecomputeConfig) -> frozenset[str] | None:
    """The modules a setting recomputes: none for no recompute, None for full recompute."""
    if rc.recompute_granularity == "full":
        return None
    return frozenset(rc.modules) if rc.recompute_granularity == "selective" else frozenset()


# Less than this apart, two settings hold the same (a checkpoint's few KiB of RNG state)
_IDLE_BYTES = 1 << 20


def _without_idle_modules(
    found: list[Candidate], keep: RecomputeConfig | None = None
) -> list[Candidate]:
    """The candidates less those that recompute more modules than another (or the same ones,
    said later: `selective:` after none) and hold (within a MiB) and cost what it does: the
    extra modules act on no layer that matters here (`mlp` on a stage of MoE layers). The
    run's own setting (`keep`) stays: what it holds is the question asked of it."""
    kept: list[Candidate] = []
    for c in found:
        if keep is not None and same_setting(c.recompute, keep):
            kept.append(c)
            continue
        mods = _modules(c.recompute)
        same = next(
            (
                d
                for d in kept
                if not c.offload
                and not d.offload
                and mods is not None
                and (theirs := _modules(d.recompute)) is not None
                and theirs <= mods
                and abs(planned_bytes(d.estimate) - planned_bytes(c.estimate)) < _IDLE_BYTES
                and d.step_cost <= c.step_cost
            ),
            None,
        )
        if same is None:
            kept.append(c)
    return kept


def same_setting(a: RecomputeConfig, b: RecomputeConfig) -> bool:
    """The same recompute setting, its modules' order aside (offloading not compared)."""
    return (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == (
        b.recompute_granularity,
        b.recompute_method,
        b.recompute_num_layers,
    ) and _modules(a) == _modules(b)


def _units(rc: RecomputeConfig) -> int:
    if rc.recompute_granularity == "selective":
        return len(rc.modules)
    return 0 if rc.recompute_granularity is None else 100


# Beyond recompute, in the framework's own terms (the levers `plan --levers` prices); each
# only where the run has it left (a sharded run is not told to shard, a batch of one not to
# shrink).
def _full_refused(found: list[Candidate], excluded: list[tuple[str, str]]) -> str | None:
    """Why full recompute is not a candidate (the first full setting's reason) when no full
    setting is one: what stands in the way of the setting that saves the most."""
    if any(c.recompute.recompute_granularity == "full" for c in found):
        return None
    why = next((why for spec, why in excluded if spec.startswith("full")), None)
    return why.rstrip(".") if why else None


def _what_else(config: Config, states_alone_too_big: bool = False) -> str:
    """`states_alone_too_big`: weights, gradients and optimizer states alone exceed the usable
    memory, so a smaller batch or sequence cannot help: not offered."""
    p, m = config.parallel, config.model
    batch_left = m.micro_batch_size > 1 and not states_alone_too_big
    # what plan/levers.py has rows for (a trial followed the promise to the rest and found none)
    priced = "the parallel layouts, the distributed optimizer and the micro-batch"
    if m.loss_implementation == "hf":
        priced = "the sharding, the offloads and the micro-batch"
        parts = []
        if p.zero_stage < 3:
            parts.append("shard the model states (DeepSpeed ZeRO-3 / FSDP)")
        if p.use_torch_fsdp2 and not p.param_offload:  # FSDP2 offloads all states at once
            parts.append(
                "offload the model states to the CPU (FSDP's CPU offload: Accelerate "
                "fsdp_config.fsdp_offload_params, the Trainer's fsdp 'offload', Automodel "
                "distributed.offload_policy)"
            )
        elif not p.use_torch_fsdp2 and not p.optimizer_offload and not p.frozen_base:
            parts.append(
                "offload the optimizer states to the CPU (DeepSpeed offload_optimizer; FSDP "
                "offloads parameters, gradients and optimizer states together: Accelerate "
                "fsdp_config.fsdp_offload_params, the Trainer's fsdp 'offload')"
            )
        elif not p.use_torch_fsdp2 and p.zero_stage >= 3 and not p.param_offload:
            parts.append("offload the parameters to the CPU (DeepSpeed offload_param)")
        if not m.fused_linear_cross_entropy:  # the fp32 logits of the whole vocabulary
            parts.append(
                "a fused loss (Liger: use_liger_kernel, LLaMA-Factory enable_liger_kernel)"
            )
        if batch_left:
            parts.append("lower per_device_train_batch_size (raising gradient_accumulation_steps)")
        if not states_alone_too_big:
            parts.append("shorten the sequence length")
    elif m.loss_implementation == "torchtitan":
        priced = "the parallel degrees and the batch"
        parts = ["raise the FSDP / TP (up to the KV heads) / PP / CP degrees over more GPUs"]
        if m.num_moe_experts and p.expert_model_parallel_size == 1:
            # EP 1: every rank gathers each MoE block's experts whole
            parts.insert(0, "expert parallelism (parallelism.expert_parallel_degree)")
        if batch_left:
            parts.append(
                "lower the per-rank batch (TOML: [training] local_batch_size, batch_size in "
                "older torchtitan; config registry: training.num_tokens_per_microbatch_per_dp_rank)"
            )
        if not states_alone_too_big:
            parts.append("shorten seq_len")
    else:
        parts = ["add parallelism (--tp/--pp/--cp/--ep)"]
        if not p.use_distributed_optimizer:
            parts.append("the distributed optimizer")
        else:
            priced = "the parallel layouts and the micro-batch"
        if not p.use_precision_aware_optimizer:
            parts.append("16-bit optimizer moments (use_precision_aware_optimizer)")
        if not p.optimizer_offload:
            parts.append("optimizer CPU offload (optimizer_cpu_offload)")
        if batch_left:
            parts.append("a smaller micro-batch")
        if not states_alone_too_big:
            parts.append("shorten the sequence")
    listed = ", ".join(parts[:-1]) + (" or " if len(parts) > 1 else "") + parts[-1]
    return f"{listed} (`plan --levers` prices {priced})"


def explain(
    best: Candidate,
    found: list[Candidate],
    usable: int,
    ties: list[dict] | None = None,
    excluded: list[tuple[str, str]] | None = None,
    version: tuple[int, int] | None = None,
    budget: int | None = None,
    config: Config | None = None,
) -> str:
    """One paragraph: why this candidate, with the numbers (`config`: the run, for what the
    FLOPs do not count)."""
    e = best.estimate
    none = next((c for c in found if c.estimate.recompute == "none" and not c.offload), None)
    planned = planned_bytes(e)
    loss = e.loss_saved_bytes + e.loss_transient_bytes  # the loss's own peak
    held = (
        f"{planned / GIB:.1f} GiB per rank (its total, {e.total_bytes / GIB:.1f} GiB, and the "
        f"terms beside it below: what is compared with the budget)"
        if planned != e.total_bytes
        else f"{e.total_bytes / GIB:.1f} GiB per rank"
    )
    parts = [
        f"{best.name} fits: {held} of {usable / GIB:.1f} GiB "
        + (
            f"usable ({budget / GIB:.1f} GiB less the safety margin that keeps the allocator's "
            f"fragmentation and NCCL's buffers, {(budget - usable) / GIB:.1f} GiB; "
            if budget
            else "usable ("
        )
        + f"weights {e.weights_bytes / GIB:.1f}, gradients {e.grads_bytes / GIB:.1f}, "
        f"optimizer {e.optimizer_bytes / GIB:.1f}, activations at peak "
        f"{e.peak_activation_bytes / GIB:.1f} GiB"
        + (
            f", of which the logits and loss {loss / GIB:.1f} GiB"
            f" (logits {' x '.join(map(str, e.logits_shape))} per rank)"
            if e.logits_shape and e.loss_sets_peak
            else ""
        )
        + (
            f"; the optimizer step's {e.optimizer_step_bytes / GIB:.1f} GiB, after backward "
            "freed the activations, sets the peak instead"
            if e.step_sets_peak
            else ""
        )
        + ")."
    ]
    beside = {
        "MoE routing imbalance / capacity": e.moe_imbalance_bytes,
        "dispatcher buffers": e.dispatcher_buffers_bytes,
        "gathered or autocast weight copies": e.gathered_params_bytes,
        "ZeRO gradient buckets / prefetch": e.zero_buffers_bytes,
    }
    if any(beside.values()):
        parts.append(
            "Beside them, counted against the usable memory: "
            + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in beside.items() if v)
            + "."
        )
    if best.band is not None:
        b = best.band
        parts.append(
            f"Headroom {best.headroom_bytes / GIB:.2f} GiB against an error band of "
            f"{b.total_bytes / GIB:.2f} GiB ({b.activation_fraction:.0%} of the activations "
            f"on the {b.path} path, {b.activation_bytes / GIB:.2f}, plus the CUDA context and "
            f"workspaces, {(b.cuda_context_bytes + b.workspace_bytes) / GIB:.2f})"
            + (
                "."
                if best.clears_band
                else ": it fits only within the band, no setting clears it; measure before "
                "relying on it."
            )
        )
    if none is not None and none is not best:
        state = "fits too" if none.fits else "does not fit"
        parts.append(
            f"Without recompute the peak would be {planned_bytes(none.estimate) / GIB:.1f} GiB, "
            f"which {state}."
        )
    parts.append(
        f"Recomputation adds {best.step_cost:.1%} to the step's FLOPs"
        + (
            f" (the slowest pipeline stage's; {e.recompute_flops_fraction:.1%} on the binding "
            f"stage {e.stage})"
            if len(e.stage_total_bytes) > 1
            and abs(best.step_cost - e.recompute_flops_fraction) >= 5e-4
            else ""
        )
        + (
            "; offloading is chosen only because no recompute-only setting fits."
            if best.offload
            else "; it is the cheapest setting that clears the band."
            if best.band is None or best.clears_band
            else _closest_words(best, found)
        )
    )
    ep = config.parallel.expert_model_parallel_size if config is not None else 1
    replays = best.recompute.recompute_granularity == "full" or "moe" in (
        best.recompute.modules or []
    )
    if ep > 1 and config.model.num_moe_experts and replays:
        # Megatron checkpoints the whole MoE layer (moe) or block (full), its token dispatcher
        # with it: backward runs the dispatch and combine all-to-alls again
        parts.append(
            f"Recomputing the MoE layers replays their token all-to-alls over EP {ep} in "
            "backward, which the FLOPs do not count: `plan --levers` prices it in the step "
            "time (exposed EP communication)."
        )
    if config is not None:
        for line in held_beyond_estimate(as_candidate(config, best.recompute), version):
            parts.append(line[0].upper() + line[1:] + ".")
    elementwise = set(best.recompute.modules or []) & {"layernorm", "moe_act"}
    if best.recompute.recompute_granularity == "selective" and elementwise:
        # the FLOPs count matmuls: recomputed norms and activations cost memory traffic, not
        # matmul FLOPs, and are not zero on the clock
        parts.append(
            f"The FLOPs count matmuls: recomputing {', '.join(sorted(elementwise))} adds "
            "memory-bound elementwise work they do not price (not zero on the clock); measure "
            "the step (`ablate`) where a few percent matter."
        )
    cheaper = [
        c
        for c in found
        if not c.offload and c.step_cost < best.step_cost and not (c.fits and c.clears_band)
    ]
    if cheaper:
        miss = min(cheaper, key=lambda c: c.estimate.total_bytes)
        # by what it misses: its planned bytes (the estimate and the overheads that count
        # against the usable memory) over the usable memory, i.e. minus its headroom
        over = -miss.headroom_bytes
        short = over + (miss.band.total_bytes if miss.band else 0)
        parts.append(
            f"The closest cheaper setting, {miss.name}, "
            + (
                f"fits only within its error band (headroom {miss.headroom_bytes / GIB:.2f} GiB)."
                if miss.fits
                else f"misses by {over / GIB:.2f} GiB ({short / GIB:.1f} GiB with its band)."
            )
        )
    for tie in ties or []:
        parts.append(f"Near-tie: {tie['recompute']} ({tie['reason']}).")
    parts += not_proposed(excluded or [], version)
    return " ".join(parts)


def not_proposed(excluded: list[tuple[str, str]], version: tuple[int, int] | None) -> list[str]:
    """The settings left out, one sentence per reason: Megatron-Core's refusals (its message)
    apart from the settings broken on the version."""
    refused: dict[str, list[str]] = {}
    broken: dict[str, list[str]] = {}  # by reason (config/versions.py known_broken)
    unwritable: dict[str, list[str]] = {}  # by the framework's reason (search.unexpressible)
    for spec, why in excluded:
        if why.startswith(UNWRITABLE):
            unwritable.setdefault(why[len(UNWRITABLE) :], []).append(spec)
        elif why.startswith(REFUSED):
            refused.setdefault(why[len(REFUSED) :], []).append(spec)
        elif why.startswith("full:uniform:"):
            broken.setdefault(_UNIFORM_CLAMP, []).append(spec)
        elif why.startswith("recompute_modules"):
            broken.setdefault(_NO_MODULES_FIELD, []).append(spec)
        else:
            broken.setdefault(why, []).append(spec)
    out = [
        f"Not proposed, Megatron-Core refuses them: {compact_specs(specs)} ({message})."
        for message, specs in refused.items()
    ]
    out += [
        f"Not proposed, the run's keys cannot write them: {compact_specs(specs)} ({why})."
        for why, specs in unwritable.items()
    ]
    out += [
        f"Not proposed on Megatron-Core {describe_version(version)}: {compact_specs(specs)} "
        f"({why})."
        for why, specs in broken.items()
    ]
    return out


_UNIFORM_CLAMP = (
    "the last uniform group would run past the last layer before 0.17; "
    "--megatron-core-version 0.17 or later allows them"
)
_NO_MODULES_FIELD = (
    "recompute_modules came with 0.12: before it selective recompute is core attention alone; "
    "--megatron-core-version 0.12 or later allows them"
)
