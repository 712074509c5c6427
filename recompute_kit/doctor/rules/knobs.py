"""The memory knobs of a pasted training command or config, under the framework's own names.

Hugging Face Trainer / TRL, LlamaFactory, DeepSpeed, Megatron-LM / NeMo, Lightning and plain
argparse scripts spell the same few settings differently: the per-device (micro) batch, the
accumulation that keeps the global batch, the sequence / cutoff length, activation (gradient)
checkpointing, ZeRO stage / distributed optimizer / offload, the dtype, LoRA vs full
fine-tuning. `read_knobs` finds them in the flat config (keys as written, nested ones dotted)
and says which of them is set, to what, and what an absent one means in that framework.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...sources.torchtitan_defaults import REGISTRY_FORMAT
from ..types import Context
from .registry import fact, is_megatron, zero_stage

# Per-device (micro) batch, most specific first; the global ones are never halved.
BATCH_KEYS = (
    "per_device_train_batch_size",
    "train_micro_batch_size_per_gpu",
    "micro_batch_size",
    "train_micro_batch_size",  # NeMo-RL's policy.train_micro_batch_size
    "per_gpu_train_batch_size",
    "ppo_micro_batch_size_per_gpu",
    "train_batch_size_per_device",
    "micro_train_batch_size",
    "batch_size_per_gpu",
    "train_batch_size",
    "batch_size",
    "bs",
)
# Keys that are a batch but not the per-device training one.
_NOT_BATCH = re.compile(r"eval|valid|val_|test|infer|predict|global|rollout|generation|gen_")
ACCUM_KEYS = (
    "gradient_accumulation_steps",
    "accumulate_grad_batches",
    "accum_iter",
    "accumulation_steps",
    "grad_accum_steps",
    "gradient_accumulation",
    "accum_steps",
)
# Sequence / cutoff length as the frameworks name it (rollout caps and packing sizes included).
# ("input_size" / "target_size" / "total_size" are feature dims or image sizes elsewhere: a
# `_size` counts only after a word that means tokens.)
_SEQ_RE = re.compile(
    r"^(?:\w+_)?(?:max_)?(?:seq|sequence|cutoff|context|source|target|prompt|completion|"
    r"response|input|total|packing)_?(?:len|length)$"
    r"|^(?:\w+_)?(?:max_)?(?:seq|sequence|context|packing)_?size$"
    r"|^(?:model_)?max_(?:len|length|words|tokens|seq_len|seqlen)$"
    r"|^(?:block_size|max_tokens_per_gpu|seq_length|max_position_embeddings_train)$"
)
_NOT_SEQ = re.compile(r"eval|new_tokens|vocab|position_embeddings$|batch|num_|hidden|_ratio")
# Activation (gradient) checkpointing switches, with what True means.
CKPT_KEYS = (
    "gradient_checkpointing",
    "activation_checkpointing",
    "use_gradient_checkpointing",
    "enable_gradient_checkpointing",
    "grad_checkpointing",
    "gradient_checkpoint",
    "checkpoint_activations",
    "activation_checkpoint",
    "use_checkpoint",
    "with_cp",
    "checkpointing",
    "recompute_activations",
    "use_activation_checkpointing",
    "fsdp_activation_checkpointing",
)
_DISABLE_CKPT = ("disable_gradient_checkpointing",)  # LlamaFactory: on unless this is true
# A checkpointing switch named anywhere in the paste (a table header, prose, a flag).
_CKPT_NAME_RE = re.compile(
    r"\b(gradient_checkpointing|activation_checkpointing|use_gradient_checkpointing|"
    r"grad_checkpointing|checkpoint_activations|use_checkpoint|with_cp)\b"
)
DTYPE_KEYS = ("bf16", "fp16", "precision", "torch_dtype", "mixed_precision", "dtype", "half")
LORA_HINTS = (
    "lora_r",
    "lora_rank",
    "lora_alpha",
    "lora_target",
    "lora_dim",  # DeepSpeed-Chat
    "only_optimize_lora",
    "use_peft",
    "peft_type",
)
# The attention implementation under the frameworks' names (flash_attn: fa2 / --flash_attn,
# attn_implementation, use_flash_attn(ention), attention_backend, sdpa / xformers switches).
_ATTN_KEY_RE = re.compile(
    r"^(?:use_)?flash_attn(?:ention)?(?:_2)?$|^attn_implementation$|^attention_backend$"
    r"|^(?:use_)?(?:sdpa|xformers|memory_efficient_attention)$|^attention_impl(?:ementation)?$"
)
_ON = {"true", "on", "yes", "enabled", "1", "full", "selective", "unsloth"}
_OFF = {"false", "off", "no", "disabled", "0", "none", "null"}


@dataclass
class Knobs:
    """What the paste sets (key as written, value) and what its absence means."""

    framework: str  # "megatron", "llamafactory", "hf", "lightning", "script"
    batch: tuple[str, int] | None = None
    accum: tuple[str, int] | None = None
    seq: list[tuple[str, int]] = field(default_factory=list)
    ckpt_key: str | None = None  # the switch as the paste names it (set or only mentioned)
    ckpt: bool | None = None  # None: not in the paste
    ckpt_default_on: bool = False  # the framework turns it on when absent (LlamaFactory)
    zero: int | None = None
    offload: bool = False
    fsdp: bool = False
    dist_opt: bool = False
    dtype: str | None = None
    dtype_assumed: str | None = None  # what the reader assumed where nothing read sets it
    lora: bool | None = None  # None: the paste does not say
    attn: str | None = None  # the attention implementation as set ("key=value"), if set
    mentioned: list[str] = field(default_factory=list)  # "key = value" as found, in order
    # the per-device batch and the sequence length in the reporter's words ("batch=1,
    # seq_len=1024"): said, never a key to patch
    said_batch: int | None = None
    said_seq: int | None = None
    trainer: str | None = None  # a trainer the paste names whose switches differ (openrlhf)

    @property
    def any(self) -> bool:
        """Something that moves memory is set: batch, sequence, checkpointing, sharding."""
        return bool(
            self.batch
            or self.seq
            or self.ckpt is not None
            or self.ckpt_key is not None
            or self.zero is not None
            or self.offload
            or self.fsdp
            or self.dist_opt
            or self.lora is not None
        )

    @property
    def ckpt_on(self) -> bool:
        return self.ckpt is True or (self.ckpt is None and self.ckpt_default_on)


def _as_bool(value: Any) -> bool | None:
    """True / False from a bool, 0/1 or a word ("false  # default", "selective")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip():
        word = re.split(r"[\s(#,;]+", value.strip().lower(), maxsplit=1)[0]
        if word in _ON:
            return True
        if word in _OFF:
            return False
    if isinstance(value, list):
        return bool(value)
    return None


def _is_off(value: Any) -> bool:
    """A value that leaves its switch off: false, 0, 0.0, none, empty."""
    if value in (None, "", []) or (isinstance(value, int | float) and value == 0):
        return True
    return _as_bool(value) is False


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 and float(value).is_integer() else None


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1].lower()


_LIGHTNING_TRAINER_KEYS = frozenset(
    {
        "accumulate_grad_batches",
        "accelerator",
        "devices",
        "gradient_clip_val",
        "check_val_every_n_epoch",
        "log_every_n_steps",
        "num_sanity_val_steps",
        "limit_train_batches",
    }
)


def _framework(ctx: Context) -> str:
    cfg = ctx.cfg
    # micro_batch_size alone is not Megatron's (lit-llama and plain scripts use the name);
    # global_batch_size is: Megatron-LM, NeMo and Megatron-Bridge configs and argument dumps.
    if is_megatron(ctx) or "global_batch_size" in cfg:
        return "megatron"
    if any(".megatron_cfg." in k for k in cfg):  # NeMo-RL's Megatron policy (its overrides)
        return "megatron"
    if any(k in cfg for k in ("finetuning_type", "cutoff_len")):
        return "llamafactory"
    if "per_device_train_batch_size" in cfg or "gradient_accumulation_steps" in cfg:
        return "hf"
    # Lightning's Trainer arguments (a LightningCLI `trainer:` section or flat), not any
    # `trainer.*` key: verl and other RL trainers have a `trainer:` section of their own.
    if any(_leaf(k) in _LIGHTNING_TRAINER_KEYS for k in cfg):
        return "lightning"
    return "script"


def _from_the_reader(ctx: Context, k: Knobs) -> None:
    """What the shared reader resolved (a recipe's base function, the framework's defaults)
    where the pasted keys say none: a Megatron-family run's sequence length and micro-batch;
    any run's dtype and FSDP sharding (a torchtitan TOML's bf16 mixed precision, FSDP2 over the
    data-parallel ranks). Values the reader only assumed are left out."""
    read = ctx.evidence.read or {}
    values, sources = read.get("config") or {}, read.get("sources") or {}

    def known(key: str) -> bool:
        return key in values and (sources.get(key) or {}).get("from") != "assumed"

    def filed(key: str) -> str | None:
        """The key the file writes it with, where a file does (not a default or a guess)."""
        source = sources.get(key) or {}
        return source.get("key") if source.get("from") == "file" else None

    # What the reader resolved from the files (a child YAML over its parent, a recipe over its
    # base) wins over the raw keys of every file given (a parent's 512 beside the child's
    # 16384, a disabled backend's section). A Megatron-family run's knobs go by Megatron-Core's
    # field names: the fix words write them in the run's own keys (doctor/fix_words.py).
    megatron = k.framework == "megatron"
    if REGISTRY_FORMAT in str(read.get("format") or ""):
        # torchtitan main: one forward holds num_tokens_per_microbatch_per_dp_rank tokens;
        # max_context_length only bounds a document, and a shorter one saves no memory
        mbs, seq = _int(values.get("micro_batch_size")), _int(values.get("seq_length"))
        if mbs and seq and filed("micro_batch_size"):
            k.batch = ("training.num_tokens_per_microbatch_per_dp_rank", mbs * seq)
            k.seq = []
        return
    if (key := filed("seq_length")) and (n := _int(values.get("seq_length"))):
        k.seq = [("seq_length" if megatron else key, n)]
    if (key := filed("micro_batch_size")) and (n := _int(values.get("micro_batch_size"))):
        k.batch = ("micro_batch_size" if megatron else key, n)
    if read.get("framework") and values:  # (not a disabled backend's section of the file)
        k.offload = bool(values.get("param_offload") or values.get("optimizer_offload"))
        k.dist_opt = values.get("use_distributed_optimizer") is True and k.framework == "megatron"
    if k.framework == "megatron":  # (what the reader only assumed is no setting of the paste)
        if not k.seq and known("seq_length") and isinstance(n := _int(values["seq_length"]), int):
            k.seq.append(("seq_length", n))
        if (
            k.batch is None
            and known("micro_batch_size")
            and isinstance(n := _int(values["micro_batch_size"]), int)
        ):
            k.batch = ("micro_batch_size", n)
    if not k.dtype and known("bf16") and values["bf16"] is True:
        k.dtype = "bf16"
    elif not k.dtype and "bf16" in values:  # the framework's default, as the reader took it
        k.dtype_assumed = "bf16" if values["bf16"] else "fp16" if values.get("fp16") else "fp32"
    if not k.fsdp and known("use_torch_fsdp2") and values["use_torch_fsdp2"] is True:
        k.fsdp = True
        if k.zero is None and known("zero_stage"):
            k.zero = values["zero_stage"]


def _global_batch(key: str) -> bool:
    """A data section's train_batch_size: the samples (prompts) of a step over every GPU, as
    verl's data.train_batch_size is; halving it leaves each GPU's micro-batch as it was."""
    return key.lower().startswith("data.") and _leaf(key) == "train_batch_size"


def read_knobs(ctx: Context) -> Knobs:
    """The memory knobs of ctx.cfg (and the checkpointing lines of the pasted text)."""
    cfg = ctx.cfg
    k = Knobs(_framework(ctx))
    by_leaf: dict[str, tuple[str, Any]] = {}
    for key, value in cfg.items():
        by_leaf.setdefault(_leaf(key), (key, value))
    for name in BATCH_KEYS:
        hit = by_leaf.get(name)
        if hit and (n := _int(hit[1])) and not _NOT_BATCH.search(hit[0].lower()):
            if name == "train_batch_size" and "deepspeed" in " ".join(cfg).lower():
                continue  # DeepSpeed's train_batch_size is the global batch
            if _global_batch(hit[0]):
                continue
            k.batch = (hit[0], n)
            break
    if k.batch is None:
        for key, value in cfg.items():
            leaf = _leaf(key)
            n = _int(value)
            if (
                leaf.endswith("batch_size")
                and not _NOT_BATCH.search(key.lower())
                and not _global_batch(key)
                and n
            ):
                k.batch = (key, n)
                break
    for name in ACCUM_KEYS:
        hit = by_leaf.get(name)
        if hit and (n := _int(hit[1])):
            k.accum = (hit[0], n)
            break
    for key, value in cfg.items():
        leaf = _leaf(key)
        if _SEQ_RE.match(leaf) and not _NOT_SEQ.search(leaf) and (n := _int(value)):
            k.seq.append((key, n))
    k.seq.sort(key=lambda kv: -kv[1])
    _read_checkpointing(ctx, k, by_leaf)
    k.zero = zero_stage(ctx)
    flat = " ".join(f"{key}={value}" for key, value in cfg.items()).lower()
    # optimizer / parameter offload (ZeRO-Offload, FSDP cpu_offload, --adam_offload), not
    # Megatron's activation cpu_offloading; a switch set off (optimizer_offload: false, an
    # offload fraction 0.0) is no offload.
    # (OpenRLHF's ref_reward_offload moves the frozen reference / reward models, not the
    # trained model's optimizer states)
    own = " ".join(
        f"{key}={value}".lower()
        for key, value in cfg.items()
        if not re.match(r"(?:ref|reward|critic)_", _leaf(key)) and not _is_off(value)
    )
    k.offload = bool(re.search(r"offload(?!ing)", own)) and "device=none" not in flat
    k.fsdp = any(
        _leaf(key).startswith("fsdp") and cfg[key] not in (None, False, "", []) for key in cfg
    )
    k.dist_opt = cfg.get("use_distributed_optimizer") is True
    _from_the_reader(ctx, k)
    for name in DTYPE_KEYS:
        hit = by_leaf.get(name)
        if hit and hit[1] not in (None, False, ""):
            # a flag read off a line of prose takes the words after it as values ("`--fp16`
            # with pytorch-1.5 works ..."): the flag named is all it says
            plain = hit[1] is True or isinstance(hit[1], (list, tuple))
            k.dtype = name if plain else f"{hit[0]}={hit[1]}"
            break
    for key, value in cfg.items():
        if _ATTN_KEY_RE.search(_leaf(key)) and value not in (None, ""):
            k.attn = f"{key}={value}"
            break
    said = fact(ctx, "settings_prose", "log")
    said = said if isinstance(said, dict) else {}
    if k.attn is None and said.get("attention") == "flash":
        k.attn = "flash attention (the paste's words)"
    if k.ckpt is None and k.ckpt_key is None and said.get("gradient_checkpointing") is True:
        k.ckpt = True  # "I enable gradient_checkpointing": on, in the reporter's words
    if k.batch is None and isinstance(said.get("micro_batch"), int):
        k.said_batch = said["micro_batch"]
    if not k.seq and isinstance(said.get("seq_len"), int):
        k.said_seq = said["seq_len"]
    k.trainer = said.get("trainer")
    ft = str(cfg.get("finetuning_type", "")).lower()
    if ft:
        k.lora = ft in ("lora", "qlora", "oft", "freeze") if ft != "full" else False
    elif any(h in by_leaf for h in LORA_HINTS) or _as_bool(cfg.get("use_lora")):
        k.lora = True
    elif _adapters_said(ctx):
        k.lora = True  # adapters named in the paste's code or words (get_peft_model, --use_lora)
    elif said.get("full_finetune"):
        k.lora = False  # "full fine-tuning" in the reporter's words
    frozen = ((ctx.evidence.read or {}).get("sources") or {}).get("frozen_base") or {}
    if frozen.get("from") == "file":  # the reader's word on adapters, as the files set them
        k.lora = (ctx.evidence.read or {}).get("config", {}).get("frozen_base") is True
    return k


def _adapters_said(ctx: Context) -> bool:
    """Adapters named in the paste's code or words; in a config file the shared reader read,
    its reading decides instead (a recipe file's other functions, its fine-tuning recipes'
    default_peft_config, are not this run's)."""
    read = ctx.evidence.read or {}
    sources = ("log",) if read.get("framework") and read.get("config") else ("log", "config")
    for source in sources:
        said = fact(ctx, "settings_prose", source)
        if isinstance(said, dict) and said.get("adapters"):
            return True
    return False


def _read_checkpointing(ctx: Context, k: Knobs, by_leaf: dict[str, tuple[str, Any]]) -> None:
    cfg = ctx.cfg
    read = ctx.evidence.read or {}
    source = (read.get("sources") or {}).get("recompute_granularity") or {}
    if source.get("from") == "file" and source.get("key"):  # the reader's, as the file says
        k.ckpt_key = source["key"]
        k.ckpt = (read.get("config") or {}).get("recompute_granularity") is not None
        return
    for name in _DISABLE_CKPT:
        if name in by_leaf:
            k.ckpt_key, k.ckpt = by_leaf[name][0], not _as_bool(by_leaf[name][1])
            return
    granularity = cfg.get("recompute_granularity")
    if granularity is not None or "recompute_granularity" in cfg:
        # the shared reader writes the file's switch in Megatron-Core's name: the advice names
        # the switch the file has (gradient_checkpointing: false), not recompute_granularity
        source = ((ctx.evidence.read or {}).get("sources") or {}).get("recompute_granularity")
        own = source.get("key") if isinstance(source, dict) else None
        leaf = own.rsplit(".", 1)[-1] if isinstance(own, str) else None
        key = own if leaf in (*CKPT_KEYS, *_DISABLE_CKPT) else "recompute_granularity"
        k.ckpt_key, k.ckpt = key, granularity is not None
        return
    for name in CKPT_KEYS:
        if name in by_leaf:
            key, value = by_leaf[name]
            state = _as_bool(value)
            if state is not None:
                k.ckpt_key, k.ckpt = key, state
                return

    # Only in the pasted text: a switch set in code or prose, or named (a table header, which
    # compares on with off and so names the switch without saying which the run used).
    def said(key: str, source: str | None = None) -> list[str]:
        return [line for line in fact(ctx, key, source) or [] if "|" not in line]

    if said("checkpointing_off", "config") or (
        said("checkpointing_off") and not said("checkpointing_on")
    ):
        k.ckpt = False
    elif said("checkpointing_on") and not said("checkpointing_off"):
        k.ckpt = True
    lines = (fact(ctx, "mentions") or []) + (fact(ctx, "checkpointing_on") or [])
    for line in lines + (fact(ctx, "checkpointing_off") or []):
        if (m := _CKPT_NAME_RE.search(line)) is not None:
            k.ckpt_key = m.group(1)
            break
    if k.framework == "llamafactory":
        k.ckpt_default_on = True  # LlamaFactory enables it unless disable_gradient_checkpointing
