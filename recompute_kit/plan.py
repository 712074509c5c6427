"""Choose recompute settings under a per-GPU memory budget.

Every valid candidate (no recompute, selective module sets, full uniform/block for every N, and
activation offloading where Megatron allows it) is estimated; the ones whose per-rank total
(weights + gradients + optimizer + peak activations) fits the budget after a safety margin are
ranked by the compute that recomputation adds, offloading last (its cost is PCIe traffic the
FLOP model cannot price).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import Config, ConfigError, RecomputeConfig, all_specs, parse_spec
from .export import render
from .memory.estimate import Estimate, estimate

GIB = 2**30


@dataclass
class Candidate:
    estimate: Estimate
    recompute: RecomputeConfig
    fits: bool
    offload: str  # "" or a short description of the offloading it adds

    def to_json(self) -> dict:
        return {**self.estimate.to_json(), "fits": self.fits, "offload": self.offload or None}


@dataclass
class Plan:
    budget_bytes: int
    usable_bytes: int
    candidates: list[Candidate]
    best: Candidate
    explanation: str
    rendered: str


def candidates(config: Config) -> list[tuple[RecomputeConfig, str]]:
    """(recompute settings, offload description) for every candidate worth estimating."""
    m, p = config.model, config.parallel
    layers = m.num_layers // p.pipeline_model_parallel_size
    # full recompute counts layers per pipeline stage: N beyond that repeats N = layers
    out = [
        (rc, "")
        for rc in map(parse_spec, all_specs(config))
        if (rc.recompute_num_layers or 0) <= layers
    ]
    if p.pipeline_model_parallel_size == 1 and layers > 1:  # Megatron: no layer offload with PP
        for n in sorted({1, layers // 2, layers - 1} - {0}):
            rc = dataclasses.replace(
                RecomputeConfig(), cpu_offloading=True, cpu_offloading_num_layers=n
            )
            out.append((rc, f"cpu_offloading_num_layers={n}"))
    # Megatron's documented pairing: recompute the light modules, offload the heavy ones.
    modules = ["core_attn", "attn_proj"] + (["expert_fc1"] if m.num_moe_experts else [])
    light = ["layernorm"] + (["moe_act"] if m.num_moe_experts and m.moe_grouped_gemm else [])
    rc = dataclasses.replace(
        parse_spec("selective:" + ",".join(light)),
        fine_grained_activation_offloading=True,
        offload_modules=modules,
    )
    out.append((rc, "offload_modules=" + ",".join(modules)))
    return out


def plan(
    config: Config,
    gpu_memory_gb: float,
    safety_margin: float = 0.1,
    fmt: str = "megatron-bridge",
    stage: int | None = None,
) -> Plan:
    """Estimate every candidate, mark what fits, pick the cheapest. Raises ConfigError (one
    line) when the budget is impossible or nothing fits, saying by how much."""
    if gpu_memory_gb <= 0:
        raise ConfigError(f"--gpu-memory-gb must be positive, got {gpu_memory_gb:g}")
    if not 0 <= safety_margin < 1:
        raise ConfigError(f"--safety-margin must be in [0, 1), got {safety_margin:g}")
    budget = int(gpu_memory_gb * GIB)
    usable = int(budget * (1 - safety_margin))
    found = []
    for rc, offload in candidates(config):
        # Candidates bring their own offloading; the setup keeps distribute_saved_activations.
        keep = config.recompute.distribute_saved_activations
        candidate = Config(
            config.model,
            config.parallel,
            dataclasses.replace(rc, distribute_saved_activations=keep),
        )
        try:
            candidate.validate()
        except ConfigError:
            continue  # e.g. modules the model does not have
        est = estimate(candidate, stage=stage)
        found.append(Candidate(est, candidate.recompute, est.total_bytes <= usable, offload))
    fitting = sorted(
        (c for c in found if c.fits),
        # ties (elementwise recompute costs no matmul FLOPs): fewer recomputed modules first
        key=lambda c: (
            bool(c.offload),
            c.estimate.recompute_flops_fraction,
            _units(c.recompute),
            c.estimate.total_bytes,
        ),
    )
    if not fitting:
        smallest = min(found, key=lambda c: c.estimate.total_bytes)
        need = smallest.estimate.total_bytes
        raise ConfigError(
            f"nothing fits in {gpu_memory_gb:g} GiB ({usable / GIB:.1f} GiB usable after a "
            f"{safety_margin:.0%} margin): the smallest candidate, {_name(smallest)}, needs "
            f"{need / GIB:.1f} GiB per rank, {(need - usable) / GIB:.1f} GiB too much; add "
            "parallelism (--tp/--pp/--cp/--ep), the distributed optimizer, or shorten the sequence"
        )
    best = fitting[0]
    layers = config.model.num_layers // config.parallel.pipeline_model_parallel_size
    return Plan(
        budget_bytes=budget,
        usable_bytes=usable,
        candidates=fitting + [c for c in found if not c.fits],
        best=best,
        explanation=explain(best, found, usable),
        rendered=render(best.recompute, fmt, num_layers=layers),
    )


def _units(rc: RecomputeConfig) -> int:
    if rc.recompute_granularity == "selective":
        return len(rc.modules)
    return 0 if rc.recompute_granularity is None else 100


def _name(c: Candidate) -> str:
    return c.estimate.recompute + (f" + {c.offload}" if c.offload else "")


def explain(best: Candidate, found: list[Candidate], usable: int) -> str:
    """One paragraph: why this candidate, with the numbers."""
    e = best.estimate
    none = next((c for c in found if c.estimate.recompute == "none" and not c.offload), None)
    parts = [
        f"{_name(best)} fits: {e.total_bytes / GIB:.1f} GiB per rank of {usable / GIB:.1f} GiB "
        f"usable (weights {e.weights_bytes / GIB:.1f}, gradients {e.grads_bytes / GIB:.1f}, "
        f"optimizer {e.optimizer_bytes / GIB:.1f}, activations at peak "
        f"{e.peak_activation_bytes / GIB:.1f} GiB)."
    ]
    if none is not None and none is not best:
        state = "fits too" if none.fits else "does not fit"
        parts.append(
            f"Without recompute the peak would be {none.estimate.total_bytes / GIB:.1f} GiB, "
            f"which {state}."
        )
    parts.append(
        f"Recomputation adds {e.recompute_flops_fraction:.1%} to the step's FLOPs"
        + (
            "; it is the cheapest setting that fits."
            if not best.offload
            else "; offloading is chosen only because no recompute-only setting fits."
        )
    )
    cheaper = [
        c
        for c in found
        if not c.fits
        and c.estimate.recompute_flops_fraction < e.recompute_flops_fraction
        and not c.offload
    ]
    if cheaper:
        miss = min(cheaper, key=lambda c: c.estimate.total_bytes - usable)
        parts.append(
            f"The closest cheaper setting, {_name(miss)}, misses by "
            f"{(miss.estimate.total_bytes - usable) / GIB:.1f} GiB."
        )
    return " ".join(parts)
