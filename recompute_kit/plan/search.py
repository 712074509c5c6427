"""The candidates `plan` estimates: every setting Megatron-Core can express for this model.

* no recompute, and the empty selective list (the control);
* every combination of the recompute modules that act on the model (`applicable_modules`):
  with 7 modules that is 127 sets, about 1 ms each to estimate;
* full recompute, uniform and block, for every N up to the layers of the largest (virtual)
  pipeline chunk (Megatron counts N per chunk; a larger N repeats the largest);
* layer-level CPU offloading (no PP), and fine-grained activation offloading of the heavy
  modules with the light ones recomputed (Megatron's documented pairing).

A Hugging Face Trainer run (the reader's loss_implementation "hf") gets gradient checkpointing
on (every layer: full:uniform:1) or off. A torchtitan run gets torchtitan's own modes: none, the
per-op selective policy ("op", one candidate: memory/torchtitan.py counts it), full and every
k-th block (full uniform/block here; rendered as torchtitan's nearest option).

Settings Megatron-Core refuses for this run (its TransformerConfig checks, `config.validate()`:
e.g. full recompute beside a scoped CUDA graph) and settings broken on the run's Megatron-Core
version (`config/versions.py`; unknown means the strictest) are left out and listed, with the
reason, in what `candidates` returns: a refusal is listed as Megatron's, not as a version's.
"""

from __future__ import annotations

import dataclasses
import itertools

from ..config import (
    Config,
    ConfigError,
    RecomputeConfig,
    applicable_modules,
    format_spec,
    parse_spec,
)
from ..config.versions import chunk_layer_counts, known_broken
from ..sources.torchtitan_defaults import op_sac_modules

# The start of an `excluded` reason that is the run's framework's (`unexpressible`'s words follow).
UNWRITABLE = "unwritable: "
# The start of an `excluded` reason that is Megatron-Core's refusal (its message follows).
REFUSED = "Megatron-Core refuses it: "


def as_candidate(config: Config, rc: RecomputeConfig) -> Config:
    """The run with `rc` as its recompute and offloading settings (a candidate brings its own
    offloading); the setup keeps distribute_saved_activations."""
    keep = config.recompute.distribute_saved_activations
    return Config(
        config.model,
        config.parallel,
        dataclasses.replace(rc, distribute_saved_activations=keep),
        list(config.assumptions),
        config.megatron_core_version,
    )


# A module whose recompute another module's contains (Megatron-Core checkpoints the whole MoE
# layer for 'moe', its expert activation with it): the pair is the larger one, estimated twice.
_CONTAINED_IN = {"moe_act": "moe"}


def module_sets(config: Config) -> list[list[str]]:
    """Every non-empty combination of the modules that act on this model, smallest first,
    less those that name a module beside the one containing it."""
    modules = applicable_modules(config)
    return [
        list(c)
        for r in range(1, len(modules) + 1)
        for c in itertools.combinations(modules, r)
        if not any(_CONTAINED_IN.get(m) in c for m in c)
    ]


def _torchtitan_settings(config: Config, fmt: str) -> list[RecomputeConfig]:
    """torchtitan's modes: none, the per-op selective policy ("op"; memory/torchtitan.py counts
    dense blocks as it, MoE blocks as norms and MoE-activation recompute, as the reader reads
    it: sources/torchtitan.py), full, and, in a TOML, every k-th block: floor(layers / k)
    blocks of each stage, which Megatron's block N counts the same (sources/torchtitan.py
    layer_ac). A config registry (torchtitan main, "torchtitan-registry") has no every-k-th
    policy: SelectiveAC, FullAC or None only."""
    stage_layers = config.model.num_layers // config.parallel.pipeline_model_parallel_size
    counts = sorted({stage_layers // k for k in range(2, stage_layers + 1)} - {0})
    if fmt == "torchtitan-registry":
        counts = []
    modules = op_sac_modules(bool(config.model.num_moe_experts))
    return [
        RecomputeConfig(),
        RecomputeConfig("selective", recompute_modules=modules),
        RecomputeConfig("full", recompute_method="uniform", recompute_num_layers=1),
        *(
            RecomputeConfig("full", recompute_method="block", recompute_num_layers=n)
            for n in counts
        ),
    ]


def unexpressible(rc: RecomputeConfig, fmt: str) -> str | None:
    """Why `fmt`'s keys cannot set the recompute settings `rc` (None where they can)."""
    uniform_one = (rc.recompute_method, rc.recompute_num_layers) == ("uniform", 1)
    if fmt == "nemo-rl" and rc.recompute_granularity == "full" and not uniform_one:
        return (
            "NeMo-RL runs full recompute as uniform, one layer "
            "(nemo_rl/models/megatron/setup.py sets recompute_method='uniform' and "
            "recompute_num_layers=1 under policy.megatron_cfg.activation_checkpointing): "
            "its keys cannot set another method or layer count"
        )
    if fmt == "torchtitan-registry" and rc.recompute_granularity == "full" and not uniform_one:
        return (
            "torchtitan's config registry has FullAC (every transformer block; "
            "torchtitan/distributed/activation_checkpoint.py: no layer count): its keys cannot "
            "set a method or a number of layers"
        )
    if fmt == "nemo-rl-dtensor" and rc.recompute_granularity == "selective":
        return (
            "NeMo-RL's DTensor policy checkpoints whole layers "
            "(policy.dtensor_cfg.activation_checkpointing): no selective recompute"
        )
    return None


def candidates(
    config: Config,
    version: tuple[int, int] | None = None,
    excluded: list[tuple[str, str]] | None = None,
    fmt: str = "megatron-bridge",
) -> list[tuple[RecomputeConfig, str]]:
    """(recompute settings, offload description) for every candidate worth estimating. The
    settings left out because they are broken on Megatron-Core `version` (None: unknown, the
    strictest) are appended to `excluded` as (spec, why). `fmt`: the framework the plan is
    written for (export.FORMATS); NeMo-RL expresses full recompute only as uniform, one layer
    (activation_checkpointing), and no offloading: only what its keys can say is a candidate."""
    m, p = config.model, config.parallel
    try:
        most = max(chunk_layer_counts(config), default=1)
    except ConfigError:
        most = m.num_layers // p.pipeline_model_parallel_size
    if m.loss_implementation == "hf" or fmt == "nemo-rl-dtensor":  # whole layers on or off
        return [
            (RecomputeConfig(), ""),
            (RecomputeConfig("full", recompute_method="uniform", recompute_num_layers=1), ""),
        ]
    titan = m.loss_implementation == "torchtitan"
    if titan:
        rcs = _torchtitan_settings(config, fmt)
    else:
        rcs = [RecomputeConfig(), parse_spec("selective:")]
        rcs += [RecomputeConfig("selective", recompute_modules=s) for s in module_sets(config)]
        rcs += [
            RecomputeConfig("full", recompute_method=method, recompute_num_layers=n)
            for method in ("uniform", "block")
            for n in range(1, most + 1)
        ]
    if fmt == "megatron-deepspeed":  # selective is core attention only, no offloading flags
        # and, its pipeline being DeepSpeed's (GPTModelPipe), full recompute uniform only there
        piped = p.pipeline_model_parallel_size > 1
        rcs = [
            rc
            for rc in rcs
            if (rc.recompute_granularity != "selective" or rc.modules == ["core_attn"])
            and not (piped and rc.recompute_method == "block")
        ]
    nemo_rl = fmt == "nemo-rl"
    if nemo_rl:
        kept = [rc for rc in rcs if unexpressible(rc, fmt) is None]
        if excluded is not None:
            excluded += [
                (format_spec(rc), UNWRITABLE + str(unexpressible(rc, fmt)))
                for rc in rcs
                if rc not in kept
            ]
        rcs = kept
    settings = [(rc, "") for rc in rcs]
    if not titan and not nemo_rl and fmt != "megatron-deepspeed":  # no activation offloading
        layers = m.num_layers // p.pipeline_model_parallel_size
        if p.pipeline_model_parallel_size == 1 and layers > 1:  # Megatron: no layer offload with PP
            for n in sorted({1, layers // 2, layers - 1} - {0}):
                rc = dataclasses.replace(
                    RecomputeConfig(), cpu_offloading=True, cpu_offloading_num_layers=n
                )
                settings.append((rc, f"cpu_offloading_num_layers={n}"))
        # Megatron's documented pairing: recompute the light modules, offload the heavy ones.
        modules = ["core_attn", "attn_proj"] + (["expert_fc1"] if m.num_moe_experts else [])
        light = ["layernorm"] + (["moe_act"] if m.num_moe_experts and m.moe_grouped_gemm else [])
        rc = dataclasses.replace(
            parse_spec("selective:" + ",".join(light)),
            fine_grained_activation_offloading=True,
            offload_modules=modules,
        )
        settings.append((rc, "offload_modules=" + ",".join(modules)))
    out: list[tuple[RecomputeConfig, str]] = []
    for rc, offload in settings:
        spec = format_spec(rc) + (f" + {offload}" if offload else "")
        try:  # Megatron's own refusal first: it holds on every version
            as_candidate(config, rc).validate()
        except ConfigError as exc:
            if excluded is not None:
                excluded.append((spec, REFUSED + str(exc)))
            continue
        broken = known_broken(as_candidate(config, rc), version)
        if broken:
            if excluded is not None:
                excluded.append((spec, broken[0]))
        else:
            out.append((rc, offload))
    return out


def compact_specs(specs: list[str]) -> str:
    """Specs for a sentence: runs of full recompute N as ranges (full:uniform:1-47), the
    selective sets that share modules as "the N selective sets with moe"."""
    full: dict[str, list[int]] = {}
    selective: list[list[str]] = []
    rest = []
    for spec in specs:
        rc = parse_spec(spec.partition(" + ")[0])
        if " + " in spec:
            rest.append(spec)
        elif rc.recompute_granularity == "full" and rc.recompute_num_layers:
            full.setdefault(rc.recompute_method or "", []).append(rc.recompute_num_layers)
        elif rc.recompute_granularity == "selective" and rc.recompute_modules:
            selective.append(list(rc.recompute_modules))
        else:
            rest.append(spec)
    out = []
    shared = set.intersection(*map(set, selective)) if len(selective) > 2 else set()
    if shared:
        out.append(f"the {len(selective)} selective sets with {','.join(sorted(shared))}")
    else:
        out += ["selective:" + ",".join(s) for s in selective]
    for method, counts in full.items():
        counts = sorted(set(counts))
        runs: list[list[int]] = []
        for n in counts:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        out += [f"full:{method}:{r[0]}" + (f"-{r[-1]}" if len(r) > 1 else "") for r in runs]
    return ", ".join(rest + out)
