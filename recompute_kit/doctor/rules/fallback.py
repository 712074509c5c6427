"""Default readings: what to change when no specific rule fired but the paste shows an OOM (in
any wording) or a training command / config with memory knobs.

A user who pastes `python train.py --per_device_train_batch_size 4 ...` or a LlamaFactory YAML
and asks why it runs out of memory gets a numbered answer naming the knobs the paste sets (and
what an absent one means in that framework), the cheapest change first in the framework's own
key. Two readings, one of which fires: activations (batch, sequence and checkpointing knobs
still have room) or model states (a full fine-tune whose batch is 1 with checkpointing on, or
whose counted states take half the GPU). The engine asks these rules only when nothing else
fired, so they never outrank a specific finding.
"""

from __future__ import annotations

import re
from typing import Any

from ...config import CONFIG_KEYS
from ...plan.tensor_parallel import next_tensor_parallel
from ...sources import megatron_lm
from ...sources.hf_trainer import LF_DEEPSPEED_FILE
from ..types import Context, Match
from .defaults import exception_without_oom
from .knobs import Knobs, _as_bool, read_knobs
from .model_states import (
    COMMON_GPU_BYTES,
    StateCount,
    _gpu_count,
    model_state_count,
    size_words,
    stated_gpu_bytes,
)
from .registry import (
    candidate_patch,
    estimate_with,
    fact,
    gib,
    more_recompute_patch,
    next_step,
    oom_errors,
    patch_for,
    rule,
    whole_layers_only,
)

# Beyond this many tokens per sample, activations can dominate even at batch 1 with
# checkpointing on (the layer inputs kept alone grow with it).
LONG_SEQUENCE = 4096
# At or below this many tokens per sample a shorter sequence is no lever: what fills the GPU
# is the model's states (a Megatron-LM#606 paste was told 64 -> 32)
SHORT_SEQUENCE = 512
_MP_KEYS = ("model_parallel_size", "tensor_model_parallel_size", "tensor_parallel_size", "tp")


def _oom_said(ctx: Context) -> str | None:
    """The OOM as the paste words it, or None; "" for a parsed message (quoted elsewhere)."""
    if ctx.oom or oom_errors(ctx):
        return ""
    lines = fact(ctx, "oom_mentions") or []
    return lines[0] if lines else None


def _reading(ctx: Context) -> tuple[str, Knobs, StateCount | None, str | None] | None:
    """("activations" | "states", knobs, state count, OOM line) or None when no default
    reading applies."""
    oom = ctx.oom
    if oom and oom.free_bytes and oom.requested_bytes and oom.free_bytes >= oom.requested_bytes:
        return None  # the device had room: not a matter of what training keeps
    said = _oom_said(ctx)
    if said is None and exception_without_oom(ctx):
        return None  # an exception that says nothing of memory: RK420's reading, not this
    knobs = read_knobs(ctx)
    if said is None and not knobs.any:
        return None
    count = model_state_count(ctx)
    full = knobs.lora is not True and not (count is not None and count.lora)
    gpu = stated_gpu_bytes(ctx)
    longest = knobs.seq[0][1] if knobs.seq else (knobs.said_seq or 0)
    batch_one = knobs.batch[1] == 1 if knobs.batch is not None else knobs.said_batch == 1
    # one sample per device: with checkpointing on, or at a few hundred tokens (a layer keeps
    # tens of MB there, the states 16 bytes per parameter), the activations have no room left
    exhausted = batch_one and (
        (knobs.ckpt_on and longest <= LONG_SEQUENCE) or 0 < longest <= SHORT_SEQUENCE
    )
    # Half of the GPU in states: of the stated GPU, or (none stated) of even an 80 GB one.
    counted_heavy = count is not None and count.per_gpu >= 0.5 * (gpu or COMMON_GPU_BYTES)
    # Counted over known GPUs, a small share of a known GPU: states cannot set the peak,
    # whatever the activation knobs say.
    counted_light = count is not None and count.gpus and gpu and count.per_gpu < 0.25 * gpu
    heavy = counted_heavy or (exhausted and not counted_light)
    kind = "states" if full and heavy else "activations"
    return kind, knobs, count, said


def ckpt_step(ctx: Context, k: Knobs) -> tuple[dict[str, Any], str] | None:
    """Turning activation checkpointing on (or up), in the framework's key; None when on."""
    if k.framework == "megatron" and whole_layers_only(ctx):
        # a Megatron-family run that checkpoints whole layers (NeMo-RL's DTensor backend): no
        # module to pick
        if k.ckpt_on or ctx.granularity == "full":
            return None
        return patch_for("full:uniform:1"), "--recompute-granularity full (every layer, whole)"
    if k.framework == "megatron":
        most = ctx.config is not None and ctx.config.recompute.spec == "full:uniform:1"
        if k.ckpt_on and ctx.granularity == "full" and (
            most or ctx.cfg.get("recompute_method") is None
        ):
            return None  # every layer recomputed already: no more recompute to give
        if ctx.granularity is None:
            return _first_recompute(ctx)
        return more_recompute_patch(ctx)
    if k.ckpt_on:
        return None
    if k.ckpt_key == "disable_gradient_checkpointing":
        return {"disable_gradient_checkpointing": False}, "disable_gradient_checkpointing: false"
    if k.ckpt_key:
        return {k.ckpt_key: True}, f"{k.ckpt_key}: true (activation checkpointing)"
    if k.framework in ("hf", "llamafactory"):
        return (
            {
                "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": False},
            },
            "gradient_checkpointing: true (use_reentrant: false)",
        )
    return (
        {"gradient_checkpointing": True},
        "activation (gradient) checkpointing: the script's checkpoint flag, or "
        "torch.utils.checkpoint around each block (use_reentrant=False)",
    )


def said_as(k: Knobs, key: str) -> str:
    """A setting as the fix words name it: a Megatron-family run's field as Megatron-LM's flag,
    which doctor/fix_words.py writes in the run's own keys (NeMo-RL's, Bridge's, ...)."""
    if k.framework == "megatron" and key in CONFIG_KEYS:
        flag = megatron_lm.key_for(key)
        if flag.startswith("--") and " " not in flag:
            return flag
    return key


def _recompute_flags(spec: str) -> str:
    patch = patch_for(spec)
    return " ".join(
        f"{megatron_lm.key_for(key).split()[0]} "
        + (" ".join(value) if isinstance(value, list) else str(value))
        for key, value in patch.items()
        if value is not None
    )


def _first_recompute(ctx: Context) -> tuple[dict[str, Any], str]:
    """Recompute for a Megatron run with none: the plan's cheapest setting that fits the GPU
    where the GPU is known; else the architecture's next step (registry.next_step) where the
    estimator shows it lowers the peak, else full recompute of every layer. Megatron's
    bare `selective` recomputes only core_attn, which frees next to nothing beside flash
    attention and can raise the peak (its recompute buffer)."""
    best = ctx.best  # the plan's cheapest setting that fits the GPU, where one is known
    if best is not None and best.recompute.recompute_granularity is not None and ctx.estimate:
        spec = best.estimate.recompute
        offload = f" with {best.offload}" if best.offload else ""
        return candidate_patch(best), (
            f"{_recompute_flags(spec)}{offload} (the cheapest setting that fits by `plan`: "
            f"+{100 * best.step_cost:.1f}% recompute FLOPs; the estimated peak "
            f"{gib(ctx.estimate.total_bytes)} -> {gib(best.estimate.total_bytes)} per GPU)"
        )
    spec, why = next_step(ctx)
    if ctx.config is None or ctx.estimate is None:
        return patch_for(spec), f"{_recompute_flags(spec)} ({why})"
    before = ctx.estimate.total_bytes
    for candidate, reason in ((spec, why), ("full:uniform:1", "full recompute of every layer")):
        after, _ = estimate_with(ctx, patch_for(candidate))
        if after is None:
            return patch_for(candidate), f"{_recompute_flags(candidate)} ({reason})"
        if after < before:
            return patch_for(candidate), (
                f"{_recompute_flags(candidate)} ({reason}; the estimated peak {gib(before)} -> "
                f"{gib(after)} per GPU)"
            )
    return patch_for("full:uniform:1"), (
        f"{_recompute_flags('full:uniform:1')} (even full recompute does not lower the "
        f"estimated peak of {gib(before)}: activations are not what sets it)"
    )


def batch_step(k: Knobs) -> tuple[dict[str, Any], str] | None:
    if k.batch is None or k.batch[1] <= 1:
        return None
    key, n = k.batch
    half = n // 2
    patch: dict[str, Any] = {key: half}
    if k.accum is not None:
        akey, a = k.accum
        patch[akey] = a * 2 if n % 2 == 0 else a
        keep = f" and {akey} {a} -> {patch[akey]}" + (
            " (the global batch is kept)" if n % 2 == 0 else ""
        )
    elif k.framework == "megatron":
        keep = " (the global batch stays: the run takes twice the micro-batches)"
    elif k.framework in ("hf", "llamafactory"):
        patch["gradient_accumulation_steps"] = 2
        keep = " and gradient_accumulation_steps 2 (the global batch is kept)"
    elif k.framework == "lightning":
        patch["accumulate_grad_batches"] = 2
        keep = " and accumulate_grad_batches 2 (the global batch is kept)"
    else:
        keep = " (the global batch halves unless the script accumulates gradients)"
    return patch, f"{said_as(k, key)} {n} -> {half}{keep}"


_FLASH_WORDS = ("flash", "fa2", "fa3", "sdpa", "auto", "true", "1", "fused", "xformers")


def _attn_step(k: Knobs) -> tuple[dict[str, Any], str] | None:
    """Flash attention in the framework's key when the paste sets eager attention, or sets
    none in a trainer whose default is eager (OpenRLHF's --flash_attn, plain scripts):
    eager attention keeps [batch, heads, seq, seq] scores per layer."""
    if k.attn is not None and any(w in k.attn.lower().split("=", 1)[-1] for w in _FLASH_WORDS):
        return None
    if k.attn is None and k.framework in ("megatron", "llamafactory", "hf"):
        return None  # absent means fused there: Megatron's auto backend, LlamaFactory's auto,
        # transformers' sdpa default
    why = " (no [batch, heads, seq, seq] attention scores kept)"
    if k.framework == "megatron":
        return {"attention_backend": "flash"}, "attention_backend flash" + why
    if k.framework == "llamafactory":
        return {"flash_attn": "fa2"}, "flash_attn: fa2" + why
    if k.framework == "hf":
        return {"attn_implementation": "flash_attention_2"}, (
            "attn_implementation: flash_attention_2 (or sdpa)" + why
        )
    if k.trainer == "openrlhf":
        return {"flash_attn": True}, "--flash_attn (OpenRLHF's switch; its default is off)" + why
    # no framework the paste shows: the words, and no key of one framework as a patch
    return {}, (
        "flash attention: attn_implementation=flash_attention_2 / sdpa when loading the "
        "model (LLaMA-Factory: flash_attn: fa2), or the trainer's own switch where it has one"
        + why
    )


# The sequence cap under each framework's own name, for a paste that does not set one.
SEQ_KEY = {
    "llamafactory": "cutoff_len",
    "hf": "max_seq_length / max_length",
    "megatron": "seq_length",
    "lightning": "the datamodule's max length",
    "script": "the script's max length / truncation",
}


# The per-device batch under each framework's own name, for a paste that does not set one.
BATCH_KEY = {
    "llamafactory": "per_device_train_batch_size",
    "hf": "per_device_train_batch_size",
    "megatron": "micro_batch_size",
    "lightning": "the datamodule's batch_size",
    "script": "the script's batch_size / per_device_train_batch_size",
}



def seq_step(ctx: Context, k: Knobs) -> tuple[dict[str, Any], str] | None:
    if not k.seq:
        return None
    key, n = k.seq[0]
    if n <= SHORT_SEQUENCE:
        return None
    if _rollout_cap(ctx, k, key):
        return (
            {key: n // 2},
            f"{said_as(k, key)} {n} -> {n // 2} (activations grow with the tokens per sample; in "
            "an RL run this cap also bounds the responses the policy generates: halving it "
            "shortens the rollouts, which changes what is trained, not only its memory)",
        )
    return (
        {key: n // 2},
        f"{said_as(k, key)} {n} -> {n // 2} (activations grow with the tokens per sample; "
        "truncate or drop the longest samples, as one over-long sample can OOM a run that ran "
        "for hours)",
    )


# RL caps that bound generation too (verl's / OpenRLHF's response lengths)
_ROLLOUT_CAP = re.compile(r"response|rollout|generate_max")


def _rollout_cap(ctx: Context, k: Knobs, key: str) -> bool:
    """The sequence cap also bounds what an RL run generates: where NeMo-RL generates (a
    policy.generation section), policy.max_total_sequence_length is vLLM's max_model_len and
    the rollout's max_new_tokens too (examples/configs/grpo_math_1B.yaml); or the key names a
    response / rollout length."""
    generates = any(
        ctx.cfg.get(f) is not None
        for f in ("inference_colocated", "inference_gpu_memory_utilization")
    )
    nemo_rl = (ctx.evidence.read or {}).get("framework") == "nemo-rl" and key == "seq_length"
    return (nemo_rl and generates) or bool(_ROLLOUT_CAP.search(said_as(k, key)))


def _states_step(ctx: Context, k: Knobs) -> tuple[dict[str, Any], str]:
    """The next sharding / offload step for weights, gradients and optimizer states."""
    ds = str(ctx.cfg.get("deepspeed") or "")
    stock = LF_DEEPSPEED_FILE.match(ds)
    if k.fsdp and k.zero == 3 and not ds:
        # FSDP already shards every state: its CPU offload, in the run's key (patches.py)
        if k.offload:
            return {}, "more GPUs (FSDP already shards and offloads the model states)"
        return (
            {"optimizer_offload": True, "param_offload": True},
            "FSDP CPU offload of parameters, gradients and optimizer states (torchtitan: "
            "--training.enable_cpu_offload, in a TOML [training] enable_cpu_offload = true; "
            "the Trainer: fsdp: full_shard offload), "
            "or more GPUs",
        )
    if k.zero == 3 and not k.offload:
        if stock:
            path = stock.group("dir") + "ds_z3_offload_config.json"
            return {"deepspeed": path}, f"deepspeed: {path} (ZeRO-3 with optimizer offload)"
        return (
            {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
            "ZeRO-3 with offload_optimizer (device: cpu), then offload_param",
        )
    if k.zero == 3:
        return (
            {"zero_optimization": {"offload_param": {"device": "cpu"}}},
            "offload_param (device: cpu) on top of the optimizer offload, or more GPUs",
        )
    # Megatron has no ZeRO stages (zero_stage 0 is its reading of "no ZeRO"): its next step
    # is the distributed optimizer or more model parallelism, below
    if ds or (k.zero is not None and k.framework != "megatron"):
        if stock:
            path = ds[: stock.start()] + "ds_z3_config.json"
            return {"deepspeed": path}, f"deepspeed: {path} (ZeRO-3 shards all model states)"
        return {"zero_optimization": {"stage": 3}}, "ZeRO-3 (zero_optimization.stage 3)"
    if k.framework == "megatron" and not k.dist_opt:
        return (
            {"use_distributed_optimizer": True},
            "--use-distributed-optimizer (shards the optimizer states over data parallel)",
        )
    for key in _MP_KEYS:
        value = ctx.cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            # a TP Megatron accepts for the model, within the run's GPUs and one node
            # (plan/tensor_parallel.py); none: the step says why and the next lever is named
            gpus = _gpu_count(ctx)
            step = next_tensor_parallel(
                ctx.config,
                current=value,
                heads=_int(ctx.cfg.get("num_attention_heads")),
                query_groups=_int(ctx.cfg.get("num_query_groups")),
                gpus=gpus,
                more_gpus=True,
            )
            if step.value is not None:
                patch: dict[str, Any] = {key: step.value}
                words = f"{said_as(k, key)} {value} -> {step.value}"
                nproc = _int(ctx.cfg.get("nproc_per_node"))
                if step.gpus_needed and nproc == gpus:  # one node: the launcher's count grows
                    patch["nproc_per_node"] = step.gpus_needed
                    words += f" and nproc_per_node {nproc} -> {step.gpus_needed}"
                elif step.gpus_needed:
                    words += f" on {step.gpus_needed} GPUs instead of {gpus}"
                return patch, f"{words} (more GPUs share the model states: {step.why})"
            patch, said = _shard_step(k, _gpu_count(ctx))
            return patch, f"{said} ({key} {value} stays: {step.why})"
    return _shard_step(k, _gpu_count(ctx))


def _shard_step(k: Knobs, gpus: int | None = None) -> tuple[dict[str, Any], str]:
    if gpus == 1 and not k.fsdp:
        # one GPU has no ranks to shard over: only the host takes states off it
        return (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
            "offload the optimizer states to the CPU (DeepSpeed ZeRO-Offload: "
            "zero_optimization.offload_optimizer, or FSDP's CPU offload): one GPU has no ranks "
            "to shard them over",
        )
    if k.fsdp:
        return (
            {"fsdp": "full_shard auto_wrap offload"},
            "FSDP with CPU offload (fsdp: full_shard auto_wrap offload)",
        )
    return (
        {"zero_optimization": {"stage": 3}},
        "shard the model states: DeepSpeed ZeRO-3 (zero_optimization.stage 3) or FSDP",
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _lora_step(k: Knobs) -> str | None:
    if k.lora is True:
        return None
    if k.framework == "llamafactory":
        return "finetuning_type: lora (parameter-efficient: no Adam states for frozen weights)"
    return "LoRA / parameter-efficient fine-tuning (no optimizer states for frozen weights)"


def _knob_list(ctx: Context, k: Knobs, count: StateCount | None) -> str:
    """The knobs the paste sets, with values, and what the absent ones mean."""
    parts = []
    if count is not None:
        parts.append(f"model {count.name} ({size_words(count.params, count.name, ctx)})")
    if k.batch:
        parts.append(f"{k.batch[0]} = {k.batch[1]}")
    elif k.said_batch is not None:
        parts.append(f"per-device batch {k.said_batch} (the paste's words)")
    else:
        parts.append("per-device batch: not in the paste")
    if k.accum:
        parts.append(f"{k.accum[0]} = {k.accum[1]}")
    parts += [f"{key} = {n}" for key, n in k.seq[:3]]
    if not k.seq and k.said_seq is not None:
        parts.append(f"sequence length {k.said_seq} (the paste's words)")
    elif not k.seq:
        parts.append("sequence length: not in the paste")
    if k.ckpt is not None:
        state = "on" if k.ckpt else "off"
        name = k.ckpt_key or "activation checkpointing"
        inverted = bool(k.ckpt_key) and k.ckpt_key.rsplit(".", 1)[-1].startswith("disable")
        raw = _as_bool(ctx.cfg.get(k.ckpt_key)) if k.ckpt_key else None
        if raw is not None and (raw != k.ckpt) == inverted:  # (not a parent's value overridden)
            name = f"{k.ckpt_key} = {ctx.cfg[k.ckpt_key]}"
        parts.append(f"{name} ({state})")
    elif k.ckpt_key:
        parts.append(f"{k.ckpt_key}: named in the paste, not set (off unless set elsewhere)")
    elif k.ckpt_default_on:
        parts.append("gradient checkpointing: not in the paste (LlamaFactory's default: on)")
    elif k.framework == "megatron":
        parts.append("recompute_granularity: not in the paste (Megatron's default: off)")
    else:
        parts.append("gradient checkpointing: not in the paste (off unless set elsewhere)")
    if k.zero is not None:
        parts.append(f"ZeRO stage {k.zero}" + (" with offload" if k.offload else ""))
    elif k.offload:
        parts.append("offload on")
    if k.fsdp:
        parts.append("FSDP")
    if k.dist_opt:
        parts.append("distributed optimizer")
    if k.dtype:
        parts.append(f"dtype {k.dtype}")
    elif k.dtype_assumed:
        parts.append(f"dtype: nothing read sets it ({k.dtype_assumed} assumed)")
    else:
        parts.append("dtype: not in the paste (fp32 unless set)")
    if k.lora is True:
        parts.append("LoRA (adapters on frozen weights)")
    elif k.lora is False:
        parts.append("full fine-tuning")
    else:
        parts.append("no adapter (LoRA) keys: full training assumed")
    return "; ".join(parts)


def numbered_steps(steps: list[str]) -> str:
    return " ".join(f"{i}. {s}." for i, s in enumerate(steps, 1))


def _head(said: str | None) -> str:
    if said:
        return f'Default reading (no specific pattern matched) of the OOM ("{said}")'
    if said == "":
        return "Default reading (no specific pattern matched) of the OOM"
    return "Default reading (no specific pattern matched, no OOM message pasted)"


@rule(
    "RK170",
    "Default reading: activations (batch, sequence, checkpointing) set the peak",
    "activation_memory",
    symptom="An OOM (any wording) and/or a pasted training command or config with memory "
    "knobs (per-device batch, sequence/cutoff length, checkpointing), and no specific pattern",
    cause="Activations grow with per-device batch x tokens per sample and, without "
    "checkpointing, with every layer: the knobs that still have room are the likely cause",
    confirm="Apply step 1 for one run and compare torch.cuda.max_memory_allocated(): a fall "
    "of a third or more means activations dominate",
    fix="Cheapest first: halve the per-device batch and double gradient accumulation (same "
    "global batch); turn on activation checkpointing; shorten the sequence cap; then shard "
    "model states",
    patch={"gradient_checkpointing": True},
    fallback=True,
)
def _default_activations(ctx: Context) -> Match | None:
    reading = _reading(ctx)
    if reading is None or reading[0] != "activations":
        return None
    _, k, count, said = reading
    steps: list[tuple[dict[str, Any], str]] = []
    for step in (batch_step(k), ckpt_step(ctx, k), _attn_step(k), seq_step(ctx, k)):
        if step is not None:
            steps.append(step)
    if k.batch is None and k.said_batch != 1:  # no batch in the paste (a batch of one, in
        # its words, cannot be halved): name the framework's key, with no number
        steps.insert(
            0,
            (
                {},
                f"halve the per-device batch ({BATCH_KEY[k.framework]}; not set in the "
                "paste) and double gradient accumulation (the global batch is kept)",
            ),
        )
    if not k.seq:  # no cap in the paste: name the framework's, with no number to patch
        given = f"{k.said_seq} in the paste's words" if k.said_seq else "not set in the paste"
        steps.append(
            (
                {},
                f"cap the tokens per sample ({SEQ_KEY[k.framework]}; {given}): "
                "one over-long sample sets the peak",
            )
        )
    if not k.dtype:
        steps.append(({"bf16": True}, "bf16: true (fp16 before Ampere): half-size activations"))
    steps.append(_states_step(ctx, k))
    patch, first = next((p, w) for p, w in steps if p)
    words = [w for _, w in steps]
    evidence = f"{_head(said)}: the paste sets {_knob_list(ctx, k, count)}."
    if count is not None and count.gpus:
        evidence += f" Model states: about {gib(count.per_gpu)} per GPU by the count."
    evidence += f" Cheapest change first: {words[0]}."
    if first != words[0]:  # step 1 has no number in the paste to set
        evidence += f" The config_patch carries the first step with a value: {first}."
    return Match(
        0.35,
        evidence,
        config_patch=patch,
        fix="Activation memory, cheapest change first: " + numbered_steps(words),
    )


@rule(
    "RK171",
    "Default reading: model states of a full fine-tune set the peak",
    "model_state_memory",
    symptom="An OOM and/or a pasted training config of a full fine-tune whose activation knobs "
    "are already at their floor (per-device batch 1, checkpointing on, short sequences) or "
    "whose counted model states take half the GPU, and no specific pattern",
    cause="Weights, gradients and Adam states (16 bytes per parameter in mixed precision) do "
    "not shrink with batch, sequence or recompute",
    confirm="params x 16 bytes / the GPUs that shard them, against the GPU; or the memory "
    "after model setup, before the first step",
    fix="Shard or offload model states (ZeRO-3, optimizer offload, distributed optimizer, more "
    "GPUs), or train fewer parameters (LoRA); recompute cannot free them",
    patch={"zero_optimization": {"stage": 3}},
    fallback=True,
)
def _default_states(ctx: Context) -> Match | None:
    reading = _reading(ctx)
    if reading is None or reading[0] != "states":
        return None
    _, k, count, said = reading
    first = _states_step(ctx, k)
    words = [first[1]]
    if (lora := _lora_step(k)) is not None:
        words.append(lora)
    words.append("an 8-bit / paged AdamW (optim: paged_adamw_8bit) halves the Adam states")
    longest = k.seq[0][1] if k.seq else k.said_seq
    why = (
        "batch 1 with checkpointing on leaves activations little room to shrink"
        if k.ckpt_on
        else f"batch 1 at {longest} tokens leaves activations little room to shrink"
    )
    if count is not None and ctx.gpu_bytes and count.per_gpu >= 0.5 * ctx.gpu_bytes:
        why = f"the states take {gib(count.per_gpu)} of the {gib(ctx.gpu_bytes)} GPU"
    evidence = f"{_head(said)}: the paste sets {_knob_list(ctx, k, count)}; {why}."
    if count is not None:
        total = count.params * (count.frozen if count.lora else 16)
        evidence += f" Model states in all: about {gib(total)} (16 bytes per parameter)"
        evidence += (
            f", {gib(count.per_gpu)} per GPU over {count.gpus} GPU(s)."
            if count.gpus
            else "; the paste does not count the GPUs that shard them."
        )
    return Match(
        0.4 if count is not None else 0.35,
        evidence + f" Cheapest change first: {first[1]}.",
        config_patch=first[0],
        fix="Model-state memory (optimizer states, gradients, weights), cheapest change first: "
        + numbered_steps(words)
        + " Activation recompute cannot free model states",
    )
