"""Recompute settings that do not do what they seem to."""

from __future__ import annotations

from ..types import Context, Match
from .registry import gib, next_step, patch_for, rule

# --------------------------------------------------------------------------------------------
# Settings that do not do what they seem to
# --------------------------------------------------------------------------------------------


@rule(
    "RK020",
    "core_attn recompute with flash/fused attention buys little",
    "recompute_no_effect",
    symptom="selective core_attn (Megatron's default, --recompute-activations) barely "
    "changes peak memory",
    cause="Flash/fused attention never materialises the s x s scores the paper's saving "
    "comes from; it already recomputes them in its backward",
    confirm="recompute-kit estimate --attention flash --recompute none selective: the two "
    "peaks are within a few percent",
    fix="Recompute something that holds memory (mlp, moe_act, mla_up_proj, layernorm) or "
    "use full recompute",
    refs=(
        "https://github.com/NVIDIA/Megatron-LM/issues/1225",
        "https://github.com/NVIDIA/Megatron-LM/issues/464",
    ),
)
def _core_attn_flash(ctx: Context) -> Match | None:
    warned = ctx.says("you have no need to set 'core_attn' to recompute")
    if not (("core_attn" in ctx.modules and ctx.flash) or warned):
        return None
    if ctx.modules and set(ctx.modules) != {"core_attn"} and not warned:
        return None
    spec, why = next_step(ctx)
    return Match(
        0.7 if (ctx.oom or ctx.says("out of memory")) else 0.45,
        "core_attn is recomputed while attention is flash/fused"
        + (" (Megatron warned about it)" if warned else "")
        + f". Next: '{spec}' - {why}.",
        config_patch=patch_for(spec),
    )


@rule(
    "RK021",
    "'mlp' recompute does nothing on MoE layers",
    "recompute_no_effect",
    symptom="recompute_modules contains mlp on an MoE model; memory barely moves",
    cause="Megatron skips 'mlp' on MoE layers; 'moe', 'moe_act' and 'shared_experts' are "
    "the MoE units",
    confirm="recompute-kit verify --model tiny-moe --recompute selective:mlp notes the no-op",
    fix="Use moe_act (+layernorm), then moe",
    patch=patch_for("selective:layernorm,moe_act"),
)
def _mlp_on_moe(ctx: Context) -> Match | None:
    if not (ctx.is_moe and "mlp" in ctx.modules):
        return None
    freq = ctx.cfg.get("moe_layer_freq", 1)
    if isinstance(freq, list) and 0 in freq:
        return Match(
            0.5,
            "mlp is recomputed on a model whose MoE layers ignore it (it only "
            "acts on the dense layers).",
        )
    return Match(0.75, "mlp is in recompute_modules but every layer is MoE: Megatron skips it.")


@rule(
    "RK022",
    "layernorm recompute is too small to fix the OOM",
    "recompute_no_effect",
    symptom="Still OOM after adding layernorm to recompute_modules",
    cause="The norms' outputs are a few bytes per token of hidden size; the peak is elsewhere",
    confirm="Compare peak memory before/after (recompute-kit measure or the experiments "
    "table): the difference is small",
    fix="Add the module that holds the memory: mlp (dense), moe_act/moe (MoE), mla_up_proj "
    "(MLA), or full recompute",
    refs=("NVIDIA skill perf-activation-recompute",),
)
def _layernorm_small(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    with_ln = [
        r for r in rows if r.get("oom") and "layernorm" in (r.get("recompute_modules") or [])
    ]
    if with_ln:
        r = with_ln[0]
        spec, why = next_step(ctx)
        return Match(
            0.8,
            f"Experiment '{r.get('name')}' recomputes "
            f"{r.get('recompute_modules')} and still runs out of memory. "
            f"Next: '{spec}' - {why}.",
            config_patch=patch_for(spec),
        )
    if ctx.modules == ["layernorm"] and (ctx.oom or ctx.says("out of memory")):
        spec, why = next_step(ctx)
        return Match(
            0.6,
            f"Only layernorm is recomputed and the run still OOMs. Next: '{spec}' - {why}.",
            config_patch=patch_for(spec),
        )
    return None


@rule(
    "RK023",
    "Recompute settings never reached the model",
    "recompute_no_effect",
    symptom="Peak memory is the same with and without recompute; or full recompute 'never engages'",
    cause="The settings were set on a config object the model never saw (provider copied "
    "before the change), or the module ran in eval mode (Megatron gates full and "
    "core_attn recompute on self.training)",
    confirm="Print the model's config (Megatron's arguments dump) on rank 0 and check "
    "recompute_granularity there; check model.training is True in the step",
    fix="Set the recompute fields before the model is built (before provider.finalize()); "
    "keep the module in train mode",
    refs=("radixark/miles PR #1482", "NVIDIA-NeMo/Megatron-Bridge PR #5320"),
    patch={"code": "set recompute_* on the config before the model is built; model.train()"},
)
def _never_reached(ctx: Context) -> Match | None:
    rows = [r for r in ctx.evidence.experiments if r.get("peak_memory_bytes")]
    base = [r for r in rows if (r.get("recompute") or "none") in ("none", "selective:")]
    changed = [r for r in rows if r not in base and r.get("recompute") not in (None, "none")]
    for b in base:
        for r in changed:
            if r["peak_memory_bytes"] == b["peak_memory_bytes"] and r.get(
                "recompute", ""
            ).startswith("full"):
                return Match(
                    0.8,
                    f"'{r.get('name')}' ({r['recompute']}) peaks at exactly the "
                    f"same {gib(r['peak_memory_bytes'])} as '{b.get('name')}'.",
                )
    args_gran = ctx.cfg.get("recompute_granularity")
    if ctx.says("recompute never engaged") or (
        args_gran is None and ctx.cfg.get("recompute_num_layers") and ctx.oom
    ):
        return Match(
            0.6,
            "recompute_num_layers is set but recompute_granularity is empty in "
            "the config the model received.",
        )
    return None


DEEPSPEED_AC_KEYS = (
    "partition_activations",
    "cpu_checkpointing",
    "contiguous_memory_optimization",
    "number_checkpoints",
)


@rule(
    "RK092",
    "DeepSpeed's activation_checkpointing block alone checkpoints nothing",
    "recompute_no_effect",
    symptom="A DeepSpeed config with an activation_checkpointing section, and memory as if "
    "nothing were checkpointed",
    cause="That section only configures deepspeed.checkpointing.checkpoint; the model code "
    "must call it (or Hugging Face's gradient_checkpointing_enable) for anything to be "
    "recomputed",
    confirm="grep the model for deepspeed.checkpointing.checkpoint / "
    "gradient_checkpointing_enable: absent",
    fix="Enable checkpointing in the model: Hugging Face gradient_checkpointing=True (or "
    "model.gradient_checkpointing_enable()), or wrap the blocks with "
    "deepspeed.checkpointing.checkpoint",
    patch={"gradient_checkpointing": True},
    refs=("https://www.deepspeed.ai/docs/config-json/#activation-checkpointing",),
)
def _deepspeed_section_only(ctx: Context) -> Match | None:
    section = [
        k
        for k in ctx.cfg
        if k.startswith("activation_checkpointing.") and k.split(".")[-1] in DEEPSPEED_AC_KEYS
    ]
    if not section:
        return None
    if any("gradient_checkpointing" in k and v for k, v in ctx.cfg.items()):
        return None
    return Match(
        0.7,
        f"The config has DeepSpeed's activation_checkpointing section ({', '.join(section[:3])}"
        ") but nothing turns checkpointing on in the model (no gradient_checkpointing).",
    )
