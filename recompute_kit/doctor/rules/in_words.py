"""Memory facts said only in words or on a command line, with no OOM message to read them
from: an allocation larger than any GPU (RK501), the several models of an RLHF run that share
each GPU (RK640)."""

from __future__ import annotations

import re

from ..types import Context, Match
from .allocator import shrink_patch
from .model_states import COMMON_GPU_BYTES, ZERO_BYTES, _gpu_count, _model_params, stated_gpu_bytes
from .registry import all_frames, fact, gib, oom_errors, rule, zero_stage

# More than any single GPU holds (the largest ship 288 GB): no batch size makes it fit
ANY_GPU_BYTES = 300 * 10**9
_ATTENTION_RE = re.compile(r"mask|attention|attn|score|softmax|sdpa", re.I)


@rule(
    "RK501",
    "An allocation larger than any GPU, stated in words",
    "allocation_exceeds_device",
    symptom="The paste says a step will try to allocate (or allocates) more than any single "
    "GPU has (over 300 GB: '... will try to allocate 720gb'), with no OOM message to read",
    cause="One tensor grows with a square or product of the input sizes (a materialised "
    "[batch, heads, seq, seq] attention mask or score matrix, full fp32 logits, an expanded "
    "broadcast) and outgrows every device; more GPUs of the same kind do not help",
    confirm="Compute the tensor's size from its shape at the sizes in use; it scales with the "
    "sequence length squared for masks and scores",
    fix="Never materialise the tensor: flash / memory-efficient attention with is_causal or "
    "a block mask instead of a dense 4-d mask, chunked or fused loss instead of full logits, "
    "or a smaller input (sequence length, batch, resolution); then context parallelism to "
    "split the sequence",
    supersedes=("RK170", "RK005"),
)
def _allocation_in_words(ctx: Context) -> Match | None:
    size = fact(ctx, "alloc_prose_bytes")
    if not isinstance(size, int) or size < ANY_GPU_BYTES:
        return None
    if any(o.requested_bytes and o.requested_bytes >= size for o in ctx.evidence.oom):
        return None  # the OOM message states it: RK004 reads the message
    line = str(fact(ctx, "alloc_prose_line") or "")
    if _ATTENTION_RE.search(line):
        patch = {"attn_implementation": "flash_attention_2"}
        what = (
            "the line names a mask / attention tensor: a dense [batch, heads, seq, seq] "
            "tensor; use flash attention with is_causal (no mask tensor) or a block mask"
        )
    else:
        patch, what = shrink_patch(ctx)
    return Match(
        0.75,
        f"The paste states an allocation of {gib(size)} ('{line[:160]}'): more than any "
        f"single GPU has, so no batch size or sharding of model states makes it fit; {what}.",
        config_patch=patch,
    )


# The models each algorithm holds: (role, trained). PPO trains an actor and a critic (value
# model) next to a frozen reference and reward model; GRPO / RLOO / REINFORCE drop the critic;
# DPO / KTO train a policy next to a frozen reference.
_ALGO_ROLES = {
    "ppo": (("actor", True), ("critic", True), ("ref", False), ("reward", False)),
    "grpo": (("actor", True), ("ref", False)),
    "rloo": (("actor", True), ("ref", False)),
    "remax": (("actor", True), ("ref", False)),
    "reinforce": (("actor", True), ("ref", False)),
    "dpo": (("actor", True), ("ref", False)),
    "kto": (("actor", True), ("ref", False)),
}
_ROLE_SIZE_KEYS = {
    "critic": ("critic_pretrain", "critic_model_name_or_path", "value_model_path"),
    "reward": ("reward_pretrain", "reward_model_name_or_path", "reward_model_path"),
    "ref": ("ref_pretrain", "ref_model_name_or_path", "ref_model"),
}


def _rlhf(ctx: Context) -> dict | None:
    """The RLHF run the config / command line or the prose describes (settings_prose.py)."""
    for source in ("config", "log"):
        said = fact(ctx, "settings_prose", source)
        if isinstance(said, dict) and isinstance(said.get("rlhf"), dict):
            return said["rlhf"]
    return None


# "codellama_13b_sft", "Qwen2.5-7B-Instruct", "llama-2-7b-rm": billions of parameters in a
# model path's last folder (an underscore may precede the size)
_SIZE_RE = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")


def _size_of(name: object) -> float | None:
    if isinstance(name, str) and (m := _SIZE_RE.search(name.rstrip("/").rsplit("/", 1)[-1])):
        return float(m.group(2)) * 1e9 * (int(m.group(1)) if m.group(1) else 1)
    return None


def _actor(ctx: Context) -> tuple[float, str] | None:
    """The trained (actor / policy) model's size: its path on the command line, else a size
    the prose names."""
    for key in ("pretrain", "actor_pretrain", "model_name_or_path", "actor_model_name_or_path"):
        if (size := _size_of(ctx.cfg.get(key))) is not None:
            return size, str(ctx.cfg[key])
    if (found := _model_params(ctx)) is not None:
        return found
    for source in ("log", "config"):
        said = fact(ctx, "settings_prose", source)
        model = said.get("model") if isinstance(said, dict) else None
        if isinstance(model, dict):
            return float(model["params"]), str(model["name"])
    return None


def _role_params(ctx: Context, role: str, actor: float) -> float:
    for key in _ROLE_SIZE_KEYS.get(role, ()):
        if (size := _size_of(ctx.cfg.get(key))) is not None:
            return size
    return actor  # not named: the actor's size (critic and reward start from the same base)


# Frameworks that place an RL run's models themselves (NeMo-RL colocates policy and
# generation by its own cluster config; Megatron and torchtitan train one model): the
# OpenRLHF-style count and advice of RK640 do not describe them.
_OWN_RL_PLACEMENT = (
    "nemo-rl",
    "megatron-lm",
    "megatron-bridge",
    "megatron-core",
    "nemo1",
    "torchtitan",
)


# the same frameworks seen in a traceback's frames (paths, lower case)
_OWN_RL_FRAMES = re.compile(r"nemo_rl[/.]|megatron[/.]core|megatron[/.]training|torchtitan[/.]")


@rule(
    "RK640",
    "Several models of an RLHF run share each GPU: actor, critic, reference, reward",
    "model_state_memory",
    symptom="PPO / GRPO / DPO training (train_ppo, PPOTrainer, actor / critic learning rates, "
    "ref_model) launched so that every GPU holds every model (torchrun / deepspeed launcher, "
    "colocate flags), running out of memory or with model states above the GPU",
    cause="PPO keeps four models: the actor and the critic with weights, gradients and Adam "
    "states (16 bytes per parameter, ZeRO-2 shards only the optimizer part) and a frozen "
    "reference and reward model (2 bytes per parameter each); on one set of GPUs their sum, "
    "not activations, fills memory",
    confirm="Sum per GPU: trained models x bytes-per-param of the ZeRO stage + frozen models x 2 "
    "bytes (divided by the GPUs under ZeRO-3), against the GPU's total",
    fix="Place the models on GPUs of their own (OpenRLHF: the Ray launcher train_ppo_ray.py "
    "with --actor_num_gpus_per_node / --critic_num_gpus_per_node / --ref_num_gpus_per_node / "
    "--reward_num_gpus_per_node, no --colocate_*), ZeRO-3 with optimizer offload "
    "(--zero_stage 3 --adam_offload) and --ref_reward_offload, or LoRA so the reference is the "
    "adapter-free base; activation recompute cannot free model states",
    patch={"zero_stage": 3, "adam_offload": True, "ref_reward_offload": True},
    supersedes=("RK005", "RK087", "RK102", "RK170", "RK101", "RK500"),
)
def _rlhf_models_per_gpu(ctx: Context) -> Match | None:
    run = _rlhf(ctx)
    found = _actor(ctx)
    if run is None or found is None:
        return None
    if (ctx.evidence.read or {}).get("framework") in _OWN_RL_PLACEMENT:
        return None
    if _OWN_RL_FRAMES.search(all_frames(ctx)):
        return None  # the traceback runs in such a framework: no config needed to say so
    actor, name = found
    algo = run["algo"]
    roles = _ALGO_ROLES.get(algo) or tuple(
        (r, r in ("actor", "critic"))
        for r in run["roles"]
        if r in ("actor", "critic", "ref", "reward")
    )
    if len(roles) < 2:
        return None
    own_gpus = any(f"{r}_num_gpus_per_node" in ctx.cfg for r in ("critic", "ref", "reward"))
    if (run["ray"] or own_gpus) and not any("all" in c for c in run["colocate"]):
        return None  # the Ray launcher places each model on GPUs of its own
    counted, stage = _gpu_count(ctx), zero_stage(ctx)
    oom = bool(ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions"))
    if not oom and (counted is None or stage is None):
        return None  # no OOM said: only a count from stated GPUs and ZeRO stage is conclusive
    gpus = counted or 1
    spread = counted or float("inf")  # unknown count: shards spread thin (a lower bound)
    stage = stage or 0
    offload = bool(ctx.cfg.get("adam_offload") or ctx.cfg.get("offload_optimizer"))
    lora = str(ctx.cfg.get("finetuning_type", "")).lower() in ("lora", "qlora") or any(
        ctx.cfg.get(k) for k in ("lora_rank", "lora_r", "use_peft", "use_lora")
    )
    parts, total = [], 0.0
    for role, trained in roles:
        params = _role_params(ctx, role, actor)
        if trained and not lora:
            per = (
                ZERO_BYTES[stage](spread) if not offload else 2 / (spread if stage == 3 else 1) + 2
            )
        else:
            per = 2 / (spread if stage == 3 else 1)
        total += params * per
        parts.append(f"{role} {gib(params * per)}")
    gpu = stated_gpu_bytes(ctx)
    limit = gpu or COMMON_GPU_BYTES
    if total < (0.7 if oom else 1.0) * limit:
        return None  # the models fit: their sum is not what runs out
    # ZeRO-3 with optimizer offload, every model sharded over the same GPUs
    after = sum(
        _role_params(ctx, r, actor) * ((4 if t and not lora else 2) / gpus) for r, t in roles
    )
    against = (
        f"the {gib(gpu)} GPU" if gpu else f"the {gib(limit)} of an A100/H100 (no GPU size named)"
    )
    launcher = (
        "OpenRLHF's Ray launcher (train_ppo_ray.py) places actor, critic, reference and reward "
        "on GPUs of their own (--actor_num_gpus_per_node / --critic_num_gpus_per_node / "
        "--ref_num_gpus_per_node / --reward_num_gpus_per_node)"
    )
    return Match(
        0.9 if total >= limit else 0.8,
        f"{algo.upper()} holds {len(roles)} models of ~{actor / 1e9:.0f}B ({name}) on every one of "
        f"{counted or 'the'} GPU(s) with ZeRO stage {stage}: about {gib(total)} of model states "
        "per GPU "
        f"({', '.join(parts)}) against {against}. Next: {launcher}; or ZeRO-3 with optimizer "
        f"offload over the same {gpus} GPU(s): about {gib(after)} per GPU.",
        config_patch={
            "zero_stage": 3,
            "adam_offload": True,
            "ref_reward_offload": True,
            "command": "train_ppo_ray.py (one GPU group per model; no --colocate_* flags)",
        },
    )
