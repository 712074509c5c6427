"""Every finding's patch, checked once after the rules ran (the engine calls `check_patches`).

Rules write `config_patch` freely: Megatron-Core field names (recompute_granularity,
use_distributed_optimizer, ...), a few framework keys (gradient_checkpointing, use_liger_kernel,
zero_optimization) and actions that are no config key at all (env, command, code). Before a
patch is shown it must not hurt:

1. It is written in the keys of the framework the inputs show (`evidence.read["framework"]`,
   the shared reader's): each Megatron-Core field becomes the key that sets it there
   (`PATCH_KEYS` below where the framework's `key_for` gives prose, else `key_for`), the result
   in `patch_keys`, the framework in `patch_framework`. A key that belongs to another framework
   (Liger's `use_liger_kernel` for a Megatron-Bridge run, `gradient_checkpointing` for NeMo-RL)
   is translated where the framework has the same setting and dropped, with the reason,
   where it has none. With no config read, the framework a traceback runs through (its frames:
   torchtitan/, megatron/bridge/, transformers/trainer.py, ...) is used. Where the framework is
   unknown the patch stays in Megatron-Core names,
   labelled so (`patch_check["keys"] == "megatron-core"`), and says the framework is unknown.
2. It never re-sets what the inputs already have: entries whose value the read config
   (file, named model or the framework's default) already holds are dropped, with where that
   value comes from; a finding whose whole patch is already set says so instead of patching.
3. It never lowers recompute or raises the estimated peak unless that is the finding's point
   (`recompute_overhead`: trading memory for speed): with an estimate context the patch is
   applied to the Config and estimated; a patch that raises the peak, or turns recompute off
   / to a weaker granularity / drops recomputed modules, is dropped and says by how much it
   would have raised memory; a speed finding keeps it and says by how much memory rises.

`config_patch` keeps the rules' names (a JSON contract: consumers read Megatron-Core names),
less what was dropped; `patch_check` lists what was dropped and why, and the estimate.
"""

from __future__ import annotations

import re
from typing import Any

from ..config import CONFIG_KEYS
from ..sources.hf_trainer import LF_DEEPSPEED_FILE
from .fix_words import fix_in_framework_keys
from .patch_keys import (
    _GRANULARITY_RANK,
    _IMPLIED,
    _MCORE_EXTRA,
    _NEMO_RL_MEGATRON,
    _OWNER_NAMES,
    _WHOLE_LAYER,
    FRAMEWORKS,
    LLAMA_FACTORY_KEYS,
    LOWERING_IS_THE_POINT,
    OWNED_KEYS,
    PATCH_KEYS,
)
from .rules.logits import trl_sft
from .rules.registry import HALF, MEGATRON_RUNS, estimate_with
from .types import GIB, MEMORY_CATEGORIES, Context, Finding


def check_patches(ctx: Context, findings: list[Finding]) -> None:
    """Check every finding's patch in place (see the module doc)."""
    framework = _framework(ctx)
    current, where = _current(ctx)
    for f in findings:
        try:
            _check(ctx, f, framework, current, where)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # odd pasted values
            f.patch_check = {"keys": None, "dropped": [], "notes": [f"not checked: {exc}"]}
        # the words name the same keys as the patch (doctor/fix_words.py), in the fix and in
        # the evidence's proposals ("Cheapest change first: ...")
        f.fix, swapped = fix_in_framework_keys(framework, f.fix, ctx)
        f.evidence, _ = fix_in_framework_keys(framework, f.evidence, ctx)
        if swapped:
            f.patch_check["fix_keys"] = swapped


def _framework(ctx: Context) -> str | None:
    read = ctx.evidence.read or {}
    name = read.get("framework")
    if name in FRAMEWORKS:
        return name
    return framework_of_frames(ctx) or _framework_of_keys(ctx)


def _framework_of_keys(ctx: Context) -> str | None:
    """A framework whose own keys the paste sets (NeMo-RL's policy.megatron_cfg / dtensor_cfg
    overrides), where no config file was read."""
    keys = " ".join(ctx.evidence.config)
    return "nemo-rl" if re.search(r"\bpolicy\.(?:megatron|dtensor)_cfg\.", keys) else None


# A traceback's frames name the framework that ran where no config was given: its package's
# path (most specific first; megatron/core alone runs under several frameworks: not decided).
_FRAMEWORK_FRAMES = (
    ("/torchtitan/", "torchtitan"),
    ("/megatron/bridge/", "megatron-bridge"),
    ("/nemo_rl/", "nemo-rl"),
    ("/nemo_automodel/", "automodel"),
    ("/nemo/collections/llm/", "nemo2"),
    ("/nemo/collections/nlp/", "nemo1"),
    ("/megatron/training/", "megatron-lm"),
    ("pretrain_gpt.py", "megatron-lm"),
    ("/transformers/trainer.py", "hf-trainer"),
    ("/trl/trainer/", "hf-trainer"),
    ("/llamafactory/", "hf-trainer"),
)


def framework_of_frames(ctx: Context) -> str | None:
    """The framework whose package the traceback runs through, or None."""
    frames = " ".join(" ".join(e.frames) for e in ctx.evidence.errors).replace("\\", "/")
    return next((name for part, name in _FRAMEWORK_FRAMES if part in frames), None)


def _current(ctx: Context) -> tuple[dict[str, Any], dict[str, str]]:
    """The value each field has in the inputs, and where it comes from."""
    read = ctx.evidence.read
    if read and isinstance(read.get("config"), dict):
        values = dict(read["config"])
        where = {}
        for key, src in (read.get("sources") or {}).items():
            if isinstance(src, dict):
                kind = src.get("from", "")
                # no input says it: never "already set"; nor a global batch derived from the
                # micro-batch (torchtitan's -1), which a micro-batch patch must write to keep
                if kind == "assumed" or (kind == "derived" and key == "global_batch_size"):
                    values.pop(key, None)
                    continue
                place = src.get("where") or src.get("key") or ""
                where[key] = f"{kind} {place}".strip() if kind != "file" else place or "the file"
        return values, where
    flat = dict(ctx.evidence.config)
    return flat, {k: "the paste" for k in flat}


def is_mcore(key: str) -> bool:
    return key in CONFIG_KEYS or key in _MCORE_EXTRA


def _same(key: str, a: Any, b: Any) -> bool:
    if key == "recompute_modules" and isinstance(a, list) and isinstance(b, list):
        return sorted(map(str, a)) == sorted(map(str, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a in (0, 1) and b in (0, 1) and bool(a) == bool(b))
    return a == b


def _deepspeed_fields(zero: Any) -> dict[str, Any]:
    """The reader's fields a DeepSpeed zero_optimization patch sets (stage, and whether the
    optimizer states / parameters go to the CPU); {} where it sets something else too."""
    if not isinstance(zero, dict) or not zero:
        return {}
    fields: dict[str, Any] = {}
    for key, value in zero.items():
        if key == "stage":
            fields["zero_stage"] = value
        elif key in ("offload_optimizer", "offload_param") and isinstance(value, dict):
            if set(value) != {"device"}:
                return {}
            fields[key.replace("offload_", "") + "_offload"] = value["device"] in ("cpu", "nvme")
        else:
            return {}
    return fields


def _foreign_to_mcore(key: str, value: Any) -> dict[str, Any] | None:
    """A framework key as the Megatron-Core fields that mean the same, where there are any."""
    if key == "gradient_checkpointing" and isinstance(value, bool):
        if value:
            return {
                "recompute_granularity": "full",
                "recompute_method": "uniform",
                "recompute_num_layers": 1,
            }
        return {"recompute_granularity": None}
    if key in ("use_liger_kernel", "enable_liger_kernel") and value is True:
        return {"cross_entropy_loss_fusion": True}
    if key == "disable_gradient_checkpointing" and isinstance(value, bool):
        return _foreign_to_mcore("gradient_checkpointing", not value)
    if key.startswith("activations_checkpoint_"):  # NeMo 1.x: the same fields, renamed
        return {"recompute_" + key.removeprefix("activations_checkpoint_"): value}
    if key == "per_device_train_batch_size" and isinstance(value, int):
        return {"micro_batch_size": value}
    return None


def _check(
    ctx: Context, f: Finding, framework: str | None, current: dict[str, Any], where: dict
) -> None:
    patch = dict(f.config_patch or {})
    check: dict[str, Any] = {"keys": None, "dropped": [], "notes": []}
    f.patch_framework, f.patch_keys, f.patch_check = framework, None, check
    if not patch:
        return
    dropped: list[dict[str, Any]] = check["dropped"]

    def drop(key: str, value: Any, reason: str) -> None:
        patch.pop(key, None)
        dropped.append({"key": key, "value": value, "reason": reason})

    # 0. "half of the current one" is a change, not a value: the value where the inputs give
    # the current one (a batch's: the micro-batch), else said in words and left out
    for key, value in list(patch.items()):
        if value != HALF:
            continue
        field = "micro_batch_size" if key in ("batch_size", "micro_batch_size") else key
        now = current.get(field)
        if isinstance(now, int) and not isinstance(now, bool) and now > 1:
            patch.pop(key)
            patch[field] = now // 2
            check["notes"].append(f"{key}: half of {where.get(field, 'the inputs')}'s {now}")
        elif now == 1:
            drop(key, value, "already 1: a shorter sequence or input instead")
        else:
            drop(key, value, "halve it: the inputs do not give its current value")
    # 1. keys of another framework: translated where it has the same setting, else dropped
    if framework is not None:
        for key in list(patch):
            owners = OWNED_KEYS.get(key)
            if not owners or framework in owners:
                continue
            value = patch[key]
            same = _foreign_to_mcore(key, value)
            owner = _OWNER_NAMES.get(owners[0], owners[0])
            if same is None:
                drop(key, value, f"a {owner} key: {framework} does not read it")
                continue
            patch.pop(key)
            for k, v in same.items():
                patch.setdefault(k, v)
            check["notes"].append(
                f"{key}: {value!r} is a {owner} key; written as {framework}'s own setting"
            )
    # what the framework makes of it: NeMo-RL, the Trainer and torchtitan recompute whole
    # layers, each one (full = uniform, 1 layer), and have no per-module selective recompute
    if patch.get("recompute_granularity") == "selective" and (
        framework == "hf-trainer" or (framework == "nemo-rl" and _dtensor(ctx))
    ):  # no selective recompute there: checkpointing is per layer, all of it
        patch["recompute_granularity"] = "full"
        patch.pop("recompute_modules", None)
        check["notes"].append(f"{framework}: no selective recompute; its checkpointing is full")
    whole = framework in _WHOLE_LAYER and patch.get("recompute_granularity") == "full"
    if whole:  # implied by full there: estimated as such, never a key of its own
        for key, value in _IMPLIED.items():
            if key in patch and not _same(key, patch.pop(key), value):
                check["notes"].append(f"{framework}: full recompute is every layer ({key})")
    # no recompute (or full) has no modules, and no recompute no method / layer count either:
    # unsetting what the new granularity ignores is no change worth a key
    if "recompute_granularity" in patch and patch["recompute_granularity"] != "selective":
        for key in ("recompute_modules",) + (
            ("recompute_method", "recompute_num_layers")
            if patch["recompute_granularity"] is None
            else ()
        ):
            if key in patch and patch[key] is None:
                granularity = patch["recompute_granularity"]
                drop(key, None, f"already implied by recompute_granularity {granularity!r}")
    # selective or no recompute takes no method / layer count: a patch that leaves the
    # current ones set is one Megatron-Core rejects, so it unsets them too
    if "recompute_granularity" in patch and patch["recompute_granularity"] != "full":
        for key in ("recompute_method", "recompute_num_layers"):
            if current.get(key) is not None:
                patch.setdefault(key, None)
    # Megatron's native fused loss keeps the same fp32 tensors as the unfused one
    # (memory/estimate.py loss_bytes): the fusion that frees memory is TE's
    if (
        framework in MEGATRON_RUNS
        and patch.get("cross_entropy_loss_fusion") is True
        and current.get("cross_entropy_loss_fusion") is not True  # (a run that fuses: as is)
        and "cross_entropy_fusion_impl" not in patch
    ):
        patch["cross_entropy_fusion_impl"] = "te"
    # 2. never already set
    mcore = [k for k in patch if is_mcore(k)]
    for key in mcore:
        if f.category == "recompute_no_effect":
            break  # its point: what the inputs say is not what runs; saying it again is the fix
        if key in current and _same(key, patch[key], current[key]):
            drop(key, patch[key], f"already {current[key]!r} ({where.get(key, 'the inputs')})")
    deepspeed = _deepspeed_fields(patch.get("zero_optimization"))
    if (
        deepspeed
        and f.category != "recompute_no_effect"
        and all(
            key in current and _same(key, value, current[key]) for key, value in deepspeed.items()
        )
    ):
        said = ", ".join(f"{k} {current[k]!r}" for k in deepspeed)
        drop("zero_optimization", patch["zero_optimization"], f"already so in the inputs ({said})")
    if (mcore or deepspeed) and not patch:  # every entry is already what the inputs have
        check["already_set"] = True
    # 3. never lowers recompute or raises the estimated peak unless that is the point
    _memory(ctx, f, {**patch, **_IMPLIED} if whole else patch, current, check, drop)
    # keys of the framework the inputs show
    if framework is None:
        if any(is_mcore(k) for k in patch):
            check["keys"] = "megatron-core"
            check["notes"].append(
                "framework unknown (no config file the reader recognised): the patch is in "
                "Megatron-Core names; translate each to your framework's key"
            )
    else:
        kept = set(patch)
        f.patch_keys = _translate(framework, patch, ctx, drop)
        if set(patch) != kept and any(k.startswith("recompute_") for k in patch):
            # what the framework has no key for went: the rest, alone, is checked again (a
            # selective setting without the modules it came with can raise the peak)
            _memory(ctx, f, patch, current, check, drop)
            f.patch_keys = _translate(framework, patch, ctx, drop)
        if framework == "hf-trainer" and llama_factory(ctx):
            f.patch_keys = in_llama_factory_keys(f.patch_keys, check)
            f.patch_keys = _llama_factory_deepspeed_file(f.patch_keys, ctx, check)
        _same_in_the_frameworks_keys(framework, f, patch, current, ctx, check, drop)
        check["keys"] = framework if f.patch_keys else None
    f.config_patch = patch
    _say(f, check)


def _same_in_the_frameworks_keys(framework, f, patch, current, ctx, check, drop) -> None:
    """Entries whose framework key the inputs already set to that value: Megatron settings
    that differ can be one setting there (torchtitan's one selective policy, SelectiveAC,
    stands for every selective module set), so the written patch would change nothing."""
    if not f.patch_keys or f.category == "recompute_no_effect":
        return
    now = _translate(
        framework, {k: current.get(k) for k in patch if k in current}, ctx, lambda *_: None
    )
    for key, value in list(f.patch_keys.items()):
        if key in now and now[key] == value:
            f.patch_keys.pop(key)
            for mkey in [
                k
                for k in patch
                if _translate(framework, {k: patch[k]}, ctx, lambda *_: None).get(key) == value
            ]:
                drop(mkey, patch[mkey], f"already {key} = {value!r} in {framework}'s keys")
    if not f.patch_keys and not patch:
        check["already_set"] = True


def _rank(granularity: Any) -> int:
    return _GRANULARITY_RANK.get(granularity, 0) if isinstance(granularity, str | None) else 0


def _weaker(new: dict[str, Any], current: dict[str, Any], estimated: bool) -> str | None:
    """How `new` recomputes less than `current` (None: it does not). A weaker granularity always
    counts; a module set that loses modules counts only without an estimate (with one, the
    estimate says whether the swap frees or costs memory: `moe` covers `mlp` on MoE layers)."""
    if "recompute_granularity" not in new and "recompute_modules" not in new:
        return None
    old_g = current.get("recompute_granularity")
    new_g = new.get("recompute_granularity", old_g)
    if _rank(new_g) < _rank(old_g):
        return f"recompute_granularity {old_g!r} -> {new_g!r}"
    if not estimated and old_g == new_g == "selective" and "recompute_modules" in new:
        old_m = set(map(str, current.get("recompute_modules") or ["core_attn"]))
        new_m = set(map(str, new.get("recompute_modules") or ["core_attn"]))
        if old_m - new_m:
            swap = (
                f" for {sorted(new_m - old_m)}; with no estimate of the run, whether the swap "
                "frees memory is not known"
                if new_m - old_m
                else ""
            )
            return f"recompute_modules drops {sorted(old_m - new_m)}{swap}"
    return None


def _memory(ctx: Context, f: Finding, patch: dict, current: dict, check: dict, drop) -> None:
    changes = {k: v for k, v in patch.items() if is_mcore(k)}
    if not changes:
        return
    before = after = error = None
    if ctx.config is not None and ctx.estimate is not None:
        before = ctx.estimate.total_bytes
        after, error = estimate_with(ctx, changes)
        if after is not None:
            check["peak_before_bytes"], check["peak_after_bytes"] = before, after
    weaker = _weaker(changes, current, after is not None)
    rises = after is not None and after > before + max(2**20, before // 200)
    by = (
        f"the estimated peak from {before / GIB:.2f} to {after / GIB:.2f} GiB per GPU "
        f"(+{(after - before) / GIB:.2f} GiB)"
        if rises
        else ""
    )
    if error:
        what = f"is rejected by Megatron-Core's validation ({error})"
    elif f.category in LOWERING_IS_THE_POINT or _spends_headroom(ctx, f, after):
        if rises or weaker:
            check["notes"].append(
                f"{LOWERING_IS_THE_POINT.get(f.category, _HEADROOM)}: "
                f"{f'raises {by}' if rises else weaker}"
                + (f" ({weaker})" if rises and weaker else "")
            )
        return
    elif rises:
        what = f"would raise {by}" + (f": {weaker}" if weaker else "")
    elif weaker:
        what = f"lowers recompute ({weaker})"
    elif (
        f.category in _FREES_MEMORY
        and ctx.evidence.read is not None
        and (ctx.evidence.read.get("framework") or "") in MEGATRON_RUNS
        and after is not None
        and after >= before - 2**20
    ):
        # a memory finding's patch that frees nothing the estimate counts (a skill trial got
        # --cross-entropy-loss-fusion for an OOM in the loss: the same tensors, by the estimate)
        what = f"leaves the estimated peak at {after / GIB:.2f} GiB per GPU: it frees nothing"
    else:
        return
    for key in list(changes):
        drop(key, changes[key], f"dropped: the change {what}")
    check["harmful"] = what


_HEADROOM = "spends the GPU's unused memory on speed"
# the categories whose patches are there to lower the peak
_FREES_MEMORY = {*MEMORY_CATEGORIES, "allocation_exceeds_device"}


def _spends_headroom(ctx: Context, f: Finding, after: int | None) -> bool:
    """An informational finding on a run that did not fail, whose patch still fits the GPU by
    the estimate: recomputing less there is the point (the memory is there, unused)."""
    return (
        f.category == "informational"
        and not ctx.evidence.oom
        and after is not None
        and bool(ctx.gpu_bytes)
        and after <= 0.9 * ctx.gpu_bytes
    )


def _translate(framework: str, patch: dict[str, Any], ctx: Context, drop) -> dict[str, Any]:
    """The patch in `framework`'s own keys (actions kept as they are)."""
    out: dict[str, Any] = {}
    for key, value in list(patch.items()):
        if framework == "nemo-rl" and key == "env" and isinstance(value, dict):
            # NeMo-RL's Ray workers take their environment from the policy's env_vars
            # (docs/design-docs/env-vars.md): only the policy workers get it, never the
            # colocated vLLM workers, whose memory pool refuses expandable_segments
            section = "policy.dtensor_cfg" if _dtensor(ctx) else _NEMO_RL_MEGATRON
            for name, v in value.items():
                if name == "CUDA_VISIBLE_DEVICES":  # Ray gives each worker its GPUs
                    drop(key, value, "NeMo-RL's Ray placement sets each worker's GPUs")
                    continue
                out[f"{section}.env_vars.{name}"] = v
            continue
        if framework == "nemo-rl" and key in _NEMO_RL_LOGPROBS:
            out[_NEMO_RL_LOGPROBS[key]] = value  # NeMo-RL's own key, at its path
            continue
        if framework == "nemo-rl" and key == "cross_entropy_loss_fusion" and value:
            chunked = _nemo_rl_chunked_logprobs(ctx)
            if chunked:
                out.update(chunked)
                continue
        if not is_mcore(key):
            out[key] = value  # an action, or a key of this framework's own
            continue
        if framework == "megatron-core":
            out[key] = value
            continue
        target = framework_key(framework, key, ctx)
        if value is None and target and target.startswith("--") and not _written(key, ctx):
            continue  # a command-line flag the files do not pass: nothing to drop
        if target is None or not _is_key(target):
            how = f" (set through {target})" if target else ""
            drop(key, value, f"{framework} has no key that sets {key}{how}")
            continue
        out.update(_value_for(framework, key, target, value, ctx, patch))
    if framework == "nemo-rl":
        out.update(_nemo_rl_layout_companions(patch, ctx))
    return out


_LAYOUT_KEYS = (
    "tensor_model_parallel_size",
    "sequence_parallel",
    "context_parallel_size",
    "pipeline_model_parallel_size",
    "data_parallel_size",
)


def _nemo_rl_layout_companions(patch: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """What a layout change needs beside it in NeMo-RL (export_layout.nemo_rl_companions:
    sequence packing for CP, the padding multiple), less what the files already set."""
    from ..export_layout import layout_key, nemo_rl_companions

    layout = {k: v for k, v in patch.items() if k in _LAYOUT_KEYS and v is not None}
    if not layout or ctx.config is None:
        return {}
    try:
        planned = ctx.config.replace(**layout)
    except (TypeError, ValueError):
        return {}
    nemo_rl_companions(planned, layout)
    unused = (ctx.evidence.read or {}).get("unused") or {}
    out = {}
    for key in ("sequence_packing", "sequence_length_multiple"):
        target = layout_key("nemo-rl", key)
        if key in layout and target and unused.get(target) != layout[key]:
            out[target] = layout[key]
    return out


def _written(key: str, ctx: Context) -> bool:
    """Whether the inputs themselves set `key` (not a default or an assumption)."""
    sources = (ctx.evidence.read or {}).get("sources") or {}
    return (sources.get(key) or {}).get("from") == "file"


def framework_key(framework: str, key: str, ctx: Context) -> str | None:
    """The key (or, where `key_for` gives prose, the words) that sets the Megatron-Core field
    `key` in `framework`; None where the framework has none."""
    from ..sources.formats import framework_module

    table = PATCH_KEYS.get(framework, {})
    if framework == "torchtitan" and _registry(ctx):
        table = {**table, **PATCH_KEYS["torchtitan-registry"]}
    if framework == "nemo-rl" and _dtensor(ctx):  # DTensor: whole-layer checkpointing only
        table = {**table, "recompute_modules": None}
    if framework == "nemo-rl" and key == "cross_entropy_loss_fusion":
        return _nemo_rl_fused_logprobs(ctx)
    if key in table:
        return table[key]
    if framework == "nemo2":
        return f"model.config.{key}"  # the model's TransformerConfig field, as named
    module = framework_module(framework, str((ctx.evidence.read or {}).get("format") or ""))
    target = module.key_for(key) if module is not None else key
    return None if target == key else target  # the reader knows no key of its own for it


def _registry(ctx: Context) -> bool:
    """The torchtitan run is configured by a config registry (main since 2026-02), not a TOML."""
    from ..sources.torchtitan_defaults import REGISTRY_FORMAT

    return REGISTRY_FORMAT in str((ctx.evidence.read or {}).get("format") or "")


def llama_factory(ctx: Context) -> bool:
    """The Trainer run is LLaMA-Factory's (the shared reader read a LLaMA-Factory YAML)."""
    from ..sources.hf_trainer import FORMAT_LF

    return FORMAT_LF in str((ctx.evidence.read or {}).get("format") or "")


def in_llama_factory_keys(keys: dict[str, Any], check: dict[str, Any] | None = None) -> dict:
    """A Trainer patch with the keys LLaMA-Factory switches by its own name written so."""
    out: dict[str, Any] = {}
    for key, value in keys.items():
        if key not in LLAMA_FACTORY_KEYS:
            out[key] = value
            continue
        own, spell = LLAMA_FACTORY_KEYS[key]
        said = spell(value)
        if said is None:  # no LLaMA-Factory key says this value: left out, said so
            if check is not None:
                check["dropped"].append(
                    {"key": key, "value": value, "reason": "LLaMA-Factory has no key for it"}
                )
            continue
        out[own] = said
        if check is not None:
            check["notes"].append(f"{key}: {value!r} is LLaMA-Factory's {own}: {said!r}")
    return out


# (stage, what it offloads) -> the file's suffix: ds_z2_offload offloads the optimizer,
# ds_z3_offload the optimizer and the parameters
_LF_DS_FILES = {
    (0, ()): "",
    (2, ()): "",
    (3, ()): "",
    (2, ("offload_optimizer",)): "_offload",
    (3, ("offload_optimizer", "offload_param")): "_offload",
}
_LF_DS_KEYS = {"stage", "offload_optimizer", "offload_param"}


def _llama_factory_deepspeed_file(
    keys: dict[str, Any], ctx: Context, check: dict[str, Any]
) -> dict[str, Any]:
    """A ZeRO stage / offload patch for a LLaMA-Factory run that names one of LLaMA-Factory's
    DeepSpeed files: the file of that stage in its `deepspeed` key, as its examples switch
    (a stage set inside ds_z2_config.json would leave out what ds_z3_config.json adds)."""
    zero = keys.get("zero_optimization")
    if not isinstance(zero, dict) or "stage" not in zero or set(zero) - _LF_DS_KEYS:
        return keys  # (a key its files do not set would be lost in the swap)
    read = ctx.evidence.read or {}
    named = (read.get("unused") or {}).get("deepspeed")
    if named is None:
        source = (read.get("sources") or {}).get("zero_stage") or {}
        if source.get("key") == "zero_optimization.stage":
            named = str(source.get("where", "")).rsplit(":", 1)[0]
    m = LF_DEEPSPEED_FILE.match(str(named or ""))
    if m is None:
        return keys
    offload = tuple(
        k
        for k in ("offload_optimizer", "offload_param")
        if isinstance(zero.get(k), dict) and zero[k].get("device") == "cpu"
    )
    suffix = _LF_DS_FILES.get((zero["stage"], offload))
    if suffix is None:
        return keys  # no LLaMA-Factory file says exactly this: DeepSpeed's own keys
    name = f"{m.group('dir')}ds_z{zero['stage']}{suffix}_config.json"
    check["notes"].append(
        f"zero_optimization {zero} is LLaMA-Factory's {name} (the run names {named})"
    )
    out = {k: v for k, v in keys.items() if k != "zero_optimization"}
    out["deepspeed"] = name
    return out


def _nemo_rl_fused_logprobs(ctx: Context) -> str:
    """NeMo-RL's fused loss: policy.megatron_cfg.use_fused_linear_logprobs (Megatron backend;
    NVIDIA-NeMo/RL @ 7ea279ab nemo_rl/algorithms/grpo.py:657-677 refuses it with sequence
    packing, nemo_rl/models/megatron/setup.py:883 with context parallelism and :1396 with
    overlap_param_gather); said in words (no patch) where the run has one of those."""
    key = f"{_NEMO_RL_MEGATRON}.use_fused_linear_logprobs"
    unused = (ctx.evidence.read or {}).get("unused") or {}
    blocked = [
        why
        for why, on in (
            ("runs on the Megatron backend (not DTensor)", _dtensor(ctx)),
            (
                "turns sequence packing off (GRPO refuses both)",
                unused.get("policy.sequence_packing.enabled"),
            ),
            ("drops context parallelism", (ctx.cfg.get("context_parallel_size") or 1) > 1),
        )
        if on
    ]
    return key if not blocked else f"{key} once the run {' and '.join(blocked)}"


# NeMo-RL's chunked log-probs (Megatron backend): nemo_rl/models/megatron/setup.py asserts
# defer_fp32_logits where logprob_chunk_size is set (NVIDIA-NeMo/RL @ 7ea279ab, :1241-1246)
_NEMO_RL_LOGPROBS = {
    "logprob_chunk_size": "policy.logprob_chunk_size",
    "defer_fp32_logits": f"{_NEMO_RL_MEGATRON}.defer_fp32_logits",
}


def _nemo_rl_chunked_logprobs(ctx: Context) -> dict[str, Any] | None:
    """Where the fused linear log-probs are refused (sequence packing, context parallelism) on
    the Megatron backend: the log-probs in chunks of the sequence, cast to fp32 per chunk,
    which neither refuses (nemo_rl/algorithms/loss/utils.py: "avoids materializing full-size
    float32 logits")."""
    if _dtensor(ctx) or _nemo_rl_fused_logprobs(ctx).endswith("use_fused_linear_logprobs"):
        return None
    return {
        _NEMO_RL_LOGPROBS["logprob_chunk_size"]: 1024,
        _NEMO_RL_LOGPROBS["defer_fp32_logits"]: True,
    }


def _dtensor(ctx: Context) -> bool:
    """A NeMo-RL run on its DTensor (FSDP2) backend rather than Megatron."""
    return bool((ctx.evidence.read or {}).get("config", {}).get("use_torch_fsdp2"))


def _is_key(name: str) -> bool:
    return " " not in name.strip() and "+" not in name and "/" not in name


def _value_for(
    framework: str, key: str, target: str, value: Any, ctx: Context, patch: dict
) -> dict[str, Any]:
    """{framework key: value}: the value in the framework's own spelling."""
    if framework == "torchtitan" and _registry(ctx) and ctx.config is not None:
        # torchtitan main counts a forward in tokens: sequences x the sequence length
        m = ctx.config.model
        seq = patch.get("seq_length", m.seq_length)
        micro = patch.get("micro_batch_size", m.micro_batch_size)
        tokens = "training.num_tokens_per_microbatch_per_dp_rank"
        if key == "micro_batch_size":
            return {tokens: value * seq}
        if key == "seq_length":
            return {"training.max_context_length": value, tokens: micro * value}
        if key == "global_batch_size":
            return {"training.num_tokens_per_train_step": value * seq}
    if target == "use_liger_kernel" and value is True and trl_sft(ctx):
        return {"loss_type": "chunked_nll"}  # TRL's own chunked loss (its default from 1.7.0)
    if framework == "nemo1":
        if key == "use_distributed_optimizer":
            return {target: "distributed_fused_adam" if value else "fused_adam"}
        if key in ("bf16", "fp16") and value:
            return {target: f"{key}-mixed"}
    if framework in ("megatron-bridge", "nemo2") and key in ("bf16", "fp16") and value:
        return {target: f"{key}_mixed"}
    if framework == "nemo-rl" and key == "recompute_granularity":
        dtensor = _dtensor(ctx)
        section = "policy.dtensor_cfg" if dtensor else _NEMO_RL_MEGATRON
        if value is None:
            return {f"{section}.activation_checkpointing": False}
        if dtensor or value == "full":
            # full (uniform, one layer) is what activation_checkpointing alone turns on in
            # every NeMo-RL; recompute_granularity exists from v0.7.0 (NVIDIA-NeMo/RL #2280)
            return {f"{section}.activation_checkpointing": True}
        return {f"{section}.activation_checkpointing": True, target: value}
    if framework == "torchtitan" and key == "recompute_granularity" and _registry(ctx):
        policy = {None: "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}
        return {target: policy.get(value, value)}
    if framework == "torchtitan" and key == "recompute_granularity":
        return {target: {None: "none", "selective": "selective", "full": "full"}.get(value, value)}
    if framework == "hf-trainer" and key == "recompute_granularity":
        return {target: value is not None}
    if framework == "automodel" and key == "recompute_granularity":
        # true: every decoder layer checkpointed; "selective": PyTorch's per-op policy
        return {target: "selective" if value == "selective" else value is not None}
    if framework == "megatron-lm" and key == "recompute_granularity" and value is None:
        # off: the flag the script turns it on with (`--recompute-activations`, selective)
        source = ((ctx.evidence.read or {}).get("sources") or {}).get(key) or {}
        written = str(source.get("key") or "")
        if source.get("from") == "file" and written.startswith("--"):
            return {written: None}
    if framework == "megatron-lm" and key == "recompute_modules" and isinstance(value, list):
        return {target: " ".join(map(str, value))}
    if framework in ("nemo-rl",) and key in ("bf16", "fp16") and value:
        return {target: "bfloat16" if key == "bf16" else "float16"}
    return {target: value}


def _say(f: Finding, check: dict[str, Any]) -> None:
    """The finding's fix says what the checks changed, so a reader of the text sees it too."""
    dropped = check["dropped"]
    if not dropped and not check["notes"]:
        return
    words = []
    if check.get("already_set") and not f.config_patch:
        got = "; ".join(f"{d['key']} {d['reason']}" for d in dropped)
        words.append(f"Already set in the inputs ({got}): no patch, nothing to change")
    elif check.get("harmful"):
        change = ", ".join(
            f"{d['key']} {d['value']!r}" for d in dropped if d["reason"].startswith("dropped")
        )
        words.append(f"No patch: the change ({change}) {check['harmful']}")
    elif left := [d for d in dropped if not d["reason"].startswith("already")]:
        words.append("Patch left out: " + "; ".join(f"{d['key']} ({d['reason']})" for d in left))
    trades = (*LOWERING_IS_THE_POINT.values(), _HEADROOM)
    words += [f"The patch {n}" for n in check["notes"] if n.split(":")[0] in trades]
    if words:
        f.fix = f"{f.fix.rstrip('. ')}. {'. '.join(words)}."
