"""Settings the framework accepts and then does not act on: recompute_modules without selective
(RK025), a DeepSpeed setup the Hugging Face Trainer never received (RK815)."""

from __future__ import annotations

from ..types import Context, Match
from .registry import fact, patch_for, rule


@rule(
    "RK025",
    "recompute_modules are ignored: recompute_granularity is not selective",
    "recompute_no_effect",
    symptom="The inputs set recompute_modules while recompute_granularity is unset (None) or "
    "full; memory is the same as without them",
    cause="Megatron-Core reads recompute_modules only when recompute_granularity is "
    "'selective': unset, it recomputes nothing; 'full', it recomputes whole layers (and a "
    "recipe's own recompute_granularity / recompute_num_layers stay as they were)",
    confirm="The arguments / config the framework prints at start-up: recompute_granularity "
    "there; `recompute-kit validate` warns about it",
    fix="Set recompute_granularity to selective beside recompute_modules (and recompute_method "
    "/ recompute_num_layers to null, which selective refuses)",
    supersedes=("RK023",),
)
def _modules_ignored(ctx: Context) -> Match | None:
    modules = ctx.cfg.get("recompute_modules")
    granularity = ctx.cfg.get("recompute_granularity")
    if not modules or granularity == "selective":
        return None
    if "recompute_granularity" not in ctx.cfg and not (ctx.evidence.read or {}).get("config"):
        return None  # no reading of the whole config: granularity unknown, not unset
    spec = "selective:" + ",".join(modules if isinstance(modules, list) else [str(modules)])
    said = "unset" if granularity is None else f"'{granularity}'"
    stated = " The report says they change nothing." if fact(ctx, "symptom_lines") else ""
    return Match(
        0.85,
        f"recompute_modules {modules} are set while recompute_granularity is {said}: "
        f"Megatron-Core reads them only under 'selective', so they do nothing.{stated}",
        config_patch=patch_for(spec),
    )


@rule(
    "RK815",
    "DeepSpeed set up but the Trainer runs without it: no ZeRO sharding",
    "model_state_memory",
    symptom="The inputs set up DeepSpeed (an Accelerate YAML with distributed_type DEEPSPEED, "
    "a deepspeed_config, a DeepSpeed JSON) but the Trainer's printed arguments say "
    "deepspeed=None; the OOM comes while the model is loaded or at the first step",
    cause="The Hugging Face Trainer uses DeepSpeed only when its own `deepspeed` argument names "
    "a config (or `accelerate launch` hands it the Accelerate YAML's); started with the "
    "`deepspeed` launcher or python and no --deepspeed, it trains plain DDP: every rank "
    "holds the whole model states, none of ZeRO's sharding happens",
    confirm="The TrainingArguments printout at start-up: deepspeed=None; no DeepSpeed "
    "'ZeRO Stage' lines in the log",
    fix="Pass the DeepSpeed JSON to the training script (--deepspeed ds_config.json, or "
    "`deepspeed: ds_config.json` in a LLaMA-Factory YAML), or start it with `accelerate launch "
    "--config_file <the Accelerate YAML>`",
)
def _deepspeed_not_received(ctx: Context) -> Match | None:
    line = fact(ctx, "trainer_deepspeed_none")
    if not line:
        return None
    cfg = ctx.cfg
    intended = [
        k
        for k in cfg
        if k.startswith(("deepspeed_config", "zero_optimization"))
        or (k == "distributed_type" and str(cfg[k]).upper() == "DEEPSPEED")
    ]
    if not intended:
        return None
    path = cfg.get("deepspeed_config.deepspeed_config_file")
    said = ", ".join(f"{k}: {cfg[k]}" for k in intended[:3])
    return Match(
        0.9,
        f"The inputs set up DeepSpeed ({said}) but the Trainer printed '{line.strip()}': it "
        "ran without DeepSpeed, so no ZeRO stage shards the model states and every rank holds "
        "all of them.",
        config_patch={"deepspeed": path or "<the DeepSpeed JSON>"},
    )
