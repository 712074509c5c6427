"""Hugging Face Trainer / TRL / LLaMA-Factory YAMLs and DeepSpeed JSONs (config-formats.md s. 8).

Read with `yaml.safe_load` and `json` only; nothing is imported or run, `trust_remote_code`
is never followed. A YAML's `deepspeed: path.json` is read too when that JSON is found next to
the YAML (the path as written, relative to the YAML's folder or one of its parents, or the
file name in the YAML's own folder); otherwise a warning says the ZeRO settings are unknown.

Semantics: HF models run torch modules (`transformer_impl` local); gradient checkpointing
(`model.gradient_checkpointing_enable`) wraps every decoder layer in `torch.utils.checkpoint`:
Megatron's full recompute, method uniform, 1 layer per group. DeepSpeed ZeRO stage s shards
optimizer states (1), + gradients (2), + parameters (3) over the data-parallel ranks; a value
of "auto" is filled by the Trainer from its own flags (transformers `integrations/deepspeed.py`),
so this file does not set it. Data parallelism = the world size of the launcher (torchrun /
accelerate), which these files do not say.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError
from .deepspeed_json import fill_auto_buckets, read_deepspeed
from .reading import (
    FROM_ARGUMENT,
    FROM_ASSUMED,
    FROM_DEFAULT,
    FROM_DERIVED,
    FROM_FILE,
    Origin,
    Reading,
)
from .trainer_files import _bool, _int, _Src

FRAMEWORKS: tuple[str, ...] = ("hf-trainer",)

FORMAT_LF = "LLaMA-Factory YAML"
FORMAT_TRL = "TRL / alignment-handbook YAML"
FORMAT_HF = "Hugging Face TrainingArguments YAML"
FORMAT_DS = "DeepSpeed JSON"

_LF_KEYS = (
    "cutoff_len",
    "finetuning_type",
    "stage",
    "template",
    "lora_target",
    "flash_attn",
    "disable_gradient_checkpointing",
)
_TRL_KEYS = (
    "max_seq_length",
    "max_length",
    "packing",
    "dataset_mixture",
    "assistant_only_loss",
    "completion_only_loss",
    "dataset_text_field",
    "max_prompt_length",
    "beta",
    "attn_implementation",
)
_HF_KEYS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "model_name_or_path",
    "deepspeed",
    "output_dir",
    "learning_rate",
)
_DS_KEYS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")

_KEY_FOR = {
    "seq_length": "cutoff_len (LLaMA-Factory) / max_length (TRL) / model_max_length (LLaVA, "
    "FastChat, Alpaca) / block_size (Hugging Face's run_clm.py)",
    "micro_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "bf16": "bf16",
    "fp16": "fp16",
    "zero_stage": "deepspeed (zero_optimization.stage)",
    "optimizer_offload": "deepspeed zero_optimization.offload_optimizer.device",
    "param_offload": "deepspeed zero_optimization.offload_param.device",
    "recompute_granularity": (
        "gradient_checkpointing (LLaMA-Factory: disable_gradient_checkpointing)"
    ),
    "attention_backend": "attn_implementation (LLaMA-Factory: flash_attn)",
    "data_parallel_size": "the launcher's world size (torchrun --nproc_per_node, accelerate)",
    "world_size": "the launcher's world size (torchrun --nproc_per_node, accelerate)",
    "global_batch_size": "per_device_train_batch_size x gradient_accumulation_steps x world size",
}

_TF = "https://github.com/huggingface/transformers/blob/v4.57.1"
TRAINING_ARGS = f"transformers TrainingArguments ({_TF}/src/transformers/training_args.py)"
LF_ARGS = "LLaMA-Factory hparams (hiyouga/LLaMA-Factory @ ff6d4d12 src/llamafactory/hparams/)"
TRL_ARGS = "TRL base_config.py / sft_config.py (trl 1.16.0)"
TRL_SFT = "SFT script"  # the format's mark where the command runs TRL's SFT (hf_launch.py)
TRL_DPO = "DPO script"  # ... TRL's DPO (trl/scripts/dpo.py, `trl dpo`)
DPO = "the batch keys count pairs: a chosen and a rejected sequence each"
_TRL_DPO_TRAINER = (
    "https://github.com/huggingface/trl/blob/f2cd57710ae345ea6428ae95363267fcf38a3dc8/"
    "trl/trainer/dpo_trainer.py"
)


def key_for(field: str) -> str:
    return _KEY_FOR.get(field, field)


def _has_key(text: str, key: str) -> bool:
    return re.search(rf"^{re.escape(key)}\s*:", text, re.M) is not None


def sniff(text: str, path: str) -> int:
    lower = path.lower()
    if lower.endswith(".json"):
        return 90 if any(f'"{k}"' in text for k in _DS_KEYS) else 0
    if not lower.endswith((".yaml", ".yml")) and "per_device_train_batch_size" not in text:
        return 0
    if sum(_has_key(text, k) for k in _LF_KEYS) >= 2:
        return 90
    hits = sum(_has_key(text, k) for k in _HF_KEYS)
    if hits >= 2:
        return 80 + min(hits, 5)
    return 0


# -- locating keys ---------------------------------------------------------------------------


def _set_recompute(reading: Reading, on: bool, origin: Origin) -> None:
    if on:
        note = "every decoder layer in torch.utils.checkpoint: full recompute of each layer"
        for key, value in (
            ("recompute_granularity", "full"),
            ("recompute_method", "uniform"),
            ("recompute_num_layers", 1),
        ):
            reading.set(key, value, Origin(origin.kind, origin.where, origin.key, note))
    else:
        reading.set("recompute_granularity", None, origin)


# -- reading ---------------------------------------------------------------------------------


def read(text: str, path: str) -> Reading:
    if path.lower().endswith(".json") or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a DeepSpeed config must be a JSON object")
        reading = Reading(framework="hf-trainer", format=FORMAT_DS)
        read_deepspeed(data, _Src(text, path, "json"), reading)
        return reading
    data = yaml_mapping(text, path, "a trainer YAML")
    if _llama_factory_v1(data):
        raise ConfigError(
            f"{path}: a LLaMA-Factory v1 YAML (model: {data['model']}, "
            f"{', '.join(k for k in _V1_KEYS if k in data)}): recompute-kit reads LLaMA-Factory's "
            "Trainer YAMLs (model_name_or_path, per_device_train_batch_size), not v1's, whose "
            "own trainer and defaults (its FSDP2 / DeepSpeed plugins, activation checkpointing "
            "on) it does not model"
        )
    reading = Reading(framework="hf-trainer", format=_kind(data))
    _read_yaml(data, _Src(text, path, "yaml"), reading)
    return reading


def read_with_overrides(text: str, path: str, words: list) -> Reading:
    """`cfg.yaml key=value ...` as `llamafactory-cli train` takes it: LLaMA-Factory's read_args
    merges OmegaConf.from_cli(argv[2:]) over the YAML (hiyouga/LLaMA-Factory
    src/llamafactory/hparams/parser.py), adding keys as freely as changing them. `words`: the
    overrides as written (str, recompute-kit's command line) or nemo_rl_overrides.Override (a
    launch script's)."""
    from .nemo_rl_overrides import Override, is_override, put_path, value_of
    from .yaml_paths import lookup

    data = None if path.lower().endswith(".json") else yaml_mapping(text, path, "a trainer YAML")
    if data is None or _kind(data) != FORMAT_LF or _llama_factory_v1(data):
        first = getattr(words[0], "written", words[0])
        raise ConfigError(
            f"{first}: a key=value override after a Trainer file applies to a LLaMA-Factory "
            f"YAML (llamafactory-cli train cfg.yaml key=value); {path} is not one"
        )
    by_key: dict[str, Override] = {}
    for word in words:
        o = word if isinstance(word, Override) else Override(word, applies_to=path)
        if not is_override(o.written) or o.op or "=" not in o.written:
            raise ConfigError(
                f"{o.where}: {o.written!r} is not a key=value override LLaMA-Factory takes"
            )
        p = o.path
        for k in range(1, len(p)):  # a dotted key sets inside a mapping (OmegaConf's dotlist)
            found, node = lookup(data, p[:k])
            if found and not isinstance(node, dict):
                raise ConfigError(f"{o.where}: {o.written}: {p[k - 1]} is not a mapping in {path}")
        put_path(data, p, value_of(o.written.split("=", 1)[1]), merge=True)
        by_key[p[0]] = o
    reading = Reading(framework="hf-trainer", format=_kind(data))
    _read_yaml(data, _Src(text, path, "yaml", by_key), reading)
    return reading


# LLaMA-Factory v1's own keys (src/llamafactory/v1/config/training_args.py, model_args.py):
# `model:` names the model, `dist_config` the FSDP2 / DeepSpeed plugin, `micro_batch_size` the
# per-device batch; their semantics (its own trainer and defaults) are not the Trainer's
_V1_KEYS = ("dist_config", "model_class", "kernel_config", "micro_batch_size", "train_dataset")


def _llama_factory_v1(data: dict[str, Any]) -> bool:
    return (
        isinstance(data.get("model"), str)
        and "model_name_or_path" not in data
        and any(k in data for k in _V1_KEYS)
    )


def yaml_mapping(text: str, path: str, what: str) -> dict[str, Any]:
    """The YAML file's mapping (yaml.safe_load); ConfigError with one line otherwise."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "parse error"
        raise ConfigError(f"{path}: not valid YAML ({first})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a mapping of keys to values")
    return data


def _kind(data: dict[str, Any]) -> str:
    if any(k in data for k in _LF_KEYS):
        return FORMAT_LF
    if any(k in data for k in _TRL_KEYS):
        return FORMAT_TRL
    return FORMAT_HF


class _ArgSrc(_Src):
    """Trainer arguments on a command line: each key's origin is its flag's line."""

    def __init__(self, path: str, lines: dict[str, int]) -> None:
        super().__init__("", path, "args")
        self.lines = lines

    def origin(self, *keys: str, note: str = "") -> Origin:
        line = self.lines.get(keys[0])
        where = f"{self.path}:{line}" if line else self.path
        return Origin("file", where, "--" + keys[0], note)


def read_arguments(data: dict[str, Any], path: str, lines: dict[str, int]) -> Reading:
    """The trainer's arguments as a launch command gives them (`--per_device_train_batch_size
    2 --bf16`, sources/hf_launch.py): read as the same keys in a YAML would be."""
    reading = Reading(framework="hf-trainer", format=_kind(data))
    _read_yaml(data, _ArgSrc(path, lines), reading)
    return reading


def _attention(value: Any) -> tuple[str | None, str]:
    name = str(getattr(value, "value", value)).lower()
    if name in ("eager", "disabled"):
        return "unfused", "eager attention: the s x s scores are kept"
    if name == "auto":
        return "flash", "auto: transformers' default attn_implementation sdpa"
    if name in ("sdpa", "fa2", "fa3", "flash_attention_2", "flash_attention_3", "flex_attention"):
        return "flash", f"{name}: a fused attention kernel"
    return None, ""


def _read_yaml(data: dict[str, Any], src: _Src, reading: Reading) -> None:
    lf = reading.format == FORMAT_LF
    handled: set[str] = set()

    def take(key: str) -> Any:
        handled.add(key)
        return data.get(key)

    model = take("model_name_or_path")
    if model is not None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{src.path}: model_name_or_path = {model!r} is not a model id")
        reading.model_name = model
        reading.model_name_origin = src.origin("model_name_or_path")
    for key, field in (
        ("per_device_train_batch_size", "micro_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if key in data:
            reading.set(field, _int(src, key, take(key)), src.origin(key))
    for key in ("bf16", "fp16"):
        if data.get(key) is not None:
            reading.set(key, _bool(src, key, take(key)), src.origin(key))
    if data.get("pure_bf16") is True and not reading.get("fp16"):  # LLaMA-Factory
        take("pure_bf16")
        origin = src.origin(
            "pure_bf16", note="bf16 weights without fp32 master copies (LLaMA-Factory)"
        )
        reading.set("bf16", True, origin)
        reading.set("param_precision", "pure", origin)
    for key, note in (
        ("cutoff_len", "LLaMA-Factory truncates each sample to cutoff_len"),
        ("max_seq_length", "TRL's deprecated name of max_length: the longest sample kept"),
        ("max_length", "TRL: the longest sample kept (with packing, every packed row)"),
        (
            "block_size",
            "Hugging Face's run_clm.py / run_language_modeling.py: the text is cut into blocks "
            "of block_size tokens, every row full",
        ),
        (
            "model_max_length",
            "the tokenizer's truncation length (LLaVA, FastChat, Stanford Alpaca's "
            "TrainingArguments): the longest sample kept; batches are padded to their longest, "
            "so an upper bound",
        ),
    ):
        if data.get(key) is not None and "seq_length" not in reading:
            reading.set("seq_length", _int(src, key, take(key)), src.origin(key, note=note))
    packing = data.get("packing", data.get("neat_packing"))  # TRL / LLaMA-Factory
    unset = ""
    if packing is None and lf and "cutoff_len" in data:
        # LLaMA-Factory packs when packing is unset only for pre-training (hparams/parser.py:
        # `data_args.packing if data_args.packing is not None else finetuning_args.stage == "pt"`)
        packing = data.get("stage") == "pt"
        unset = (
            f" (packing unset: LLaMA-Factory packs for stage pt only; stage {data.get('stage')!r})"
        )
    if packing is not None and "seq_length" in reading:
        take("packing" if "packing" in data else "neat_packing")
        origin = reading.origins["seq_length"]
        note = (
            "packed: every row holds seq_length tokens, so the estimate is the run's"
            if packing
            else "not packed: rows are padded to the longest sample in the batch, so the "
            "estimate is the worst case"
        )
        reading.set(
            "seq_length",
            reading.get("seq_length"),
            Origin(origin.kind, origin.where, origin.key, f"{origin.note}; {note}".strip("; ")),
        )
        if not packing:
            reading.warnings.append(
                f"{src.path}: packing false{unset}: batches are padded to their longest sample, "
                "so the sequence length is an upper bound (the estimate is a batch whose longest "
                "sample is that long)"
            )
    # Gradient checkpointing: LLaMA-Factory turns it on itself unless disabled.
    if lf and "disable_gradient_checkpointing" in data:
        off = _bool(src, "disable_gradient_checkpointing", take("disable_gradient_checkpointing"))
        _set_recompute(reading, not off, src.origin("disable_gradient_checkpointing"))
    for key in ("gradient_checkpointing", "activation_checkpointing"):
        if key in data and "recompute_granularity" not in reading:
            on = _bool(src, key, take(key))
            if lf:
                reading.unused[key] = on
                reading.warnings.append(
                    f"{src.path}: {key} is not how LLaMA-Factory switches checkpointing "
                    "(disable_gradient_checkpointing is)"
                )
            else:
                _set_recompute(reading, on, src.origin(key))
    for key in ("flash_attn", "attn_implementation"):
        if data.get(key) is not None:
            backend, note = _attention(take(key))
            if backend is None:
                reading.warnings.append(f"{src.path}: {key} = {data[key]!r}: attention not known")
            else:
                reading.set("attention_backend", backend, src.origin(key, note=note))
    if data.get("fp8") is True:
        take("fp8")
        reading.set(
            "fp8",
            "hybrid",
            src.origin("fp8", note="Accelerate fp8 (torchao tensorwise / TE default recipe)"),
        )
    _read_fsdp(data, src, reading, take)
    if data.get("deepspeed") is not None:
        _read_deepspeed_ref(take("deepspeed"), src, reading)
    _warn_model_states(data, src, reading, lf)
    said = reading.origins.get("adam_step_temporary")
    if said is not None and said.key == "optim":
        handled.add("optim")
    if "param_precision" in reading:  # its dtype key was read (_warn_model_states)
        handled.add(reading.origins["param_precision"].key)
    strategy_key = "eval_strategy" if "eval_strategy" in data else "evaluation_strategy"
    strategy = data.get(strategy_key)
    if strategy not in (None, "no", "NO", False):
        # the Trainer evaluates with its own batch (TrainingArguments default 8 a device): a
        # no-grad forward whose logits may exceed the training step's
        size = data.get("per_device_eval_batch_size", 8)
        reading.warnings.append(
            f"{src.path}: evaluation ({strategy_key} {strategy}) runs at "
            f"per_device_eval_batch_size {size}"
            + ("" if "per_device_eval_batch_size" in data else " (transformers' default)")
            + ": its no-grad forward and logits are not in the estimate; keep it at or below "
            "the training micro-batch"
        )
    if lf:
        _warn_pairwise(data, src, reading)
    if lf and data.get("moe_aux_loss_coef"):
        # LLaMA-Factory turns on output_router_logits for it (model_utils/moe.py): transformers'
        # load-balancing loss concatenates every layer's router logits and one-hot expert masks
        reading.warnings.append(
            f"{src.path}: moe_aux_loss_coef {data['moe_aux_loss_coef']}: the router logits of "
            "every layer and the load-balancing loss's tensors (layers x tokens x experts, "
            "int64 masks among them) at the end of the forward are not counted"
        )
    if "fused_linear_cross_entropy" in reading:
        take("enable_liger_kernel" if lf else "use_liger_kernel")
    for key, value in data.items():
        if key not in handled:
            reading.unused[key] = value


def _read_fsdp(data: dict[str, Any], src: _Src, reading: Reading, take: Any) -> None:
    fsdp = data.get("fsdp")
    if not fsdp:
        return
    take("fsdp")
    options = fsdp.split() if isinstance(fsdp, str) else [str(o) for o in fsdp]
    if "full_shard" in options or "hybrid_shard" in options:
        reading.set("zero_stage", 3, src.origin("fsdp", note="FSDP full_shard: ZeRO-3"))
    elif "shard_grad_op" in options or "hybrid_shard_zero2" in options:
        reading.set("zero_stage", 2, src.origin("fsdp", note="FSDP shard_grad_op: ZeRO-2"))
    if "offload" in options:
        for key in ("param_offload", "optimizer_offload"):
            reading.set(key, True, src.origin("fsdp", note="FSDP CPU offload"))


def _warn_pairwise(data: dict[str, Any], src: _Src, reading: Reading) -> None:
    """LLaMA-Factory's dpo and rm stages batch each pair's chosen and rejected sequences
    together (data/collator.py PairwiseDataCollatorWithPadding: "2 * n examples"): the forward
    holds twice per_device_train_batch_size sequences, which the estimate does not count."""
    stage = data.get("stage")
    if stage in ("dpo", "rm"):
        reading.warnings.append(
            f"{src.path}: stage {stage}: each pair's chosen and rejected sequences go through "
            "the model in one batch (LLaMA-Factory's PairwiseDataCollatorWithPadding), 2 x "
            "per_device_train_batch_size sequences; the estimate counts "
            "per_device_train_batch_size: pass --micro-batch-size twice it for the activations"
        )


def _warn_model_states(data: dict[str, Any], src: _Src, reading: Reading, lf: bool) -> None:
    finetuning = data.get("finetuning_type")
    if finetuning in ("lora", "oft"):
        reading.set(
            "frozen_base",
            True,
            src.origin(
                "finetuning_type",
                note="adapters on frozen base weights: no gradients or optimizer states for "
                "the base; the adapters' own (rank x targets) not counted",
            ),
        )
    elif finetuning is not None and finetuning != "full":
        reading.warnings.append(
            f"{src.path}: finetuning_type {finetuning}: only some layers are trained; "
            "recompute-kit counts a full fine-tune"
        )
    if data.get("use_peft") is True and finetuning is None:
        # TRL's ModelConfig: LoRA adapters (lora_r, lora_target_modules) on the frozen model
        reading.set(
            "frozen_base",
            True,
            src.origin(
                "use_peft",
                note="TRL: LoRA adapters on frozen base weights; the adapters' own states "
                "(rank x targets) not counted",
            ),
        )
    bits = data.get("quantization_bit")
    if bits is None and data.get("load_in_4bit") is True:  # TRL's ModelConfig
        bits = 4
    elif bits is None and data.get("load_in_8bit") is True:
        bits = 8
    if bits in (4, 8):
        key = "quantization_bit" if "quantization_bit" in data else f"load_in_{bits}bit"
        reading.set(
            "base_weight_bits",
            bits,
            src.origin(key, note="the frozen base's transformer layers loaded quantized (QLoRA)"),
        )
    elif bits is not None:
        reading.warnings.append(
            f"{src.path}: quantization_bit {bits}: a base quantized to {bits} bits (HQQ / EETQ "
            "/ other methods) is counted in 16 bits"
        )
    key = "torch_dtype" if "torch_dtype" in data else "dtype"
    dtype = data.get(key)
    if not lf and dtype in ("bfloat16", "float16"):
        # A model loaded in 16-bit trains in 16-bit: no fp32 master weights, AdamW states in
        # the parameters' dtype. DeepSpeed (named here or read beside) keeps its own fp32
        # master copy: apply_defaults undoes this then.
        reading.set(
            "param_precision",
            "pure",
            src.origin(
                key,
                note=f"the model is loaded in {dtype}: 16-bit weights, gradients "
                "and optimizer states",
            ),
        )
    optim = str(data.get("optim", ""))
    if optim and "adam_step_temporary" not in reading:  # (a DeepSpeed optimizer block wins)
        foreach = optim == "adamw_torch"
        note = (
            "torch's foreach AdamW: a temporary of one moment's size in the step"
            if foreach
            else "no foreach AdamW temporary in the step"
        )
        reading.set("adam_step_temporary", foreach, src.origin("optim", note=note))
    if "8bit" in optim or "4bit" in optim:
        reading.warnings.append(f"{src.path}: optim {optim}: low-bit optimizer states")
    _read_liger(data, src, reading, lf)


def _fsdp(reading: Reading) -> bool:
    """Sharded by torch FSDP (the Trainer's fsdp key or an Accelerate FSDP config)."""
    stage = reading.origins.get("zero_stage")
    return bool(reading.get("use_torch_fsdp2")) or (
        stage is not None and stage.note.startswith("FSDP")
    )


def _read_liger(data: dict[str, Any], src: _Src, reading: Reading, lf: bool) -> None:
    """Liger kernels: the Trainer's use_liger_kernel and LLaMA-Factory's enable_liger_kernel
    patch the model's loss into Liger's fused linear cross-entropy (no full logits); LLaMA-
    Factory keeps the plain loss for stages that need the logits (all but pt and sft:
    src/llamafactory/model/loader.py, require_logits). Their fused norms and SwiGLU are not
    modelled (the layers' activations are counted as without them)."""
    key = "enable_liger_kernel" if lf else "use_liger_kernel"
    if not data.get(key):
        return
    stage = str(data.get("stage", "sft")) if lf else "sft"
    if stage in ("pt", "sft"):
        reading.set(
            "fused_linear_cross_entropy",
            True,
            src.origin(
                key,
                note="Liger's fused linear cross-entropy (where Liger supports the model type)",
            ),
        )
    else:
        reading.warnings.append(
            f"{src.path}: {key} with stage {stage}: LLaMA-Factory keeps the full logits for it "
            "(require_logits), only Liger's norms and SwiGLU apply"
        )
    reading.warnings.append(
        f"{src.path}: {key}: Liger's fused norms and SwiGLU keep fewer activations than "
        "counted (only its fused loss is modelled)"
    )


def find_beside(ref: str, path: str) -> Path | None:
    """The file `ref` names, beside `path` or in a folder above it (a script run from its
    repository's root names files from there), else by its name beside `path`."""
    if not path:
        return None
    here = Path(path).parent
    ref_path = Path(ref)
    if ref_path.is_absolute():
        return ref_path if ref_path.is_file() else None
    for folder in (here, *list(here.parents)[:4]):
        if (folder / ref_path).is_file():
            return folder / ref_path
    beside = here / ref_path.name
    return beside if beside.is_file() else None


def _read_deepspeed_ref(ref: Any, src: _Src, reading: Reading) -> None:
    if isinstance(ref, dict):  # an inline DeepSpeed config
        read_deepspeed(ref, src, reading, prefix=("deepspeed",))
        return
    if not isinstance(ref, str):
        raise ConfigError(f"{src.path}: deepspeed = {ref!r} is not a path to a JSON file")
    found = find_beside(ref, src.path)
    if found is None:
        reading.unused["deepspeed"] = ref
        named = _ZERO_FILE_NAME.search(Path(ref).name)
        if named is None:
            reading.warnings.append(
                f"{src.path}: deepspeed {ref} not found beside this file: the ZeRO stage and "
                "offloading are unknown; give the JSON too"
            )
            return
        # LLaMA-Factory's ds_z3_config.json, ds_z2_offload_config.json, DeepSpeed-Chat's and
        # TRL's zero3.json: the name says the stage (and offload), said as an assumption
        stage, offload = int(named.group(1)), "offload" in Path(ref).name.lower()
        note = f"from the name of {ref}, not found beside this file: give the JSON to read it"
        for field, value in (("zero_stage", stage), ("optimizer_offload", offload)):
            reading.set(field, value, Origin(FROM_ASSUMED, src.path, _KEY_FOR[field], note))
        return
    text = found.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{found}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{found}: a DeepSpeed config must be a JSON object")
    read_deepspeed(data, _Src(text, str(found), "json"), reading, unused_prefix="deepspeed")
    reading.read_within.append(str(found))


# LLaMA-Factory's own DeepSpeed files (examples/deepspeed/ at ff6d4d12): ds_z0, ds_z2,
# ds_z2_offload, ds_z3, ds_z3_offload; `dir` is where the run keeps them
LF_DEEPSPEED_FILE = re.compile(r"^(?P<dir>.*?)ds_z[0-3](?:_offload)?_config\.json$")
# a DeepSpeed JSON's name that says its ZeRO stage: ds_z3_config.json, zero2.json,
# zero_stage3_offload.json, ds_config_zero3.json
_ZERO_FILE_NAME = re.compile(r"(?:^|[_\-.])(?:ds_)?z(?:ero)?(?:_?stage)?_?([0-3])(?=[_\-.])", re.I)


def _derive_global_batch(reading: Reading) -> None:
    """The Trainer's global batch: per_device_train_batch_size x gradient_accumulation_steps x
    the world size (DeepSpeed's train_batch_size "auto" is filled so), once the data-parallel
    size is given (a file's world size or --dp): never from an assumed one."""
    dp = reading.origins.get("data_parallel_size")
    mbs, gas = reading.get("micro_batch_size"), reading.get("gradient_accumulation_steps")
    if dp is None or dp.kind not in (FROM_FILE, FROM_ARGUMENT, FROM_DERIVED) or not mbs:
        return
    dp_size = reading.get("data_parallel_size")
    reading.derive(
        "global_batch_size",
        mbs * gas * dp_size,
        f"per_device_train_batch_size {mbs} x gradient_accumulation_steps {gas} x "
        f"data-parallel size {dp_size}",
    )
    if reading.origins["micro_batch_size"].kind == FROM_ARGUMENT:
        # the Trainer's accumulation stays as the files say: the global batch moves with it
        reading.warnings.append(
            f"--micro-batch-size {mbs} replaces per_device_train_batch_size, and "
            f"gradient_accumulation_steps stays {gas}: the global batch read is "
            f"{mbs * gas * dp_size} (`plan --levers --global-batch-size N` prices another)"
        )


# -- defaults --------------------------------------------------------------------------------


def _trl_sft_loss(reading: Reading) -> None:
    """SFTConfig's loss_type: unset, it is "chunked_nll" (TRL >= 1.7.0, sft_config.py: the
    lm_head on non-ignored tokens and the cross-entropy in chunks, no full logits; "nll" with
    use_liger_kernel), counted as a fused linear cross-entropy; "nll" / "dft" keep the logits."""
    given = reading.unused.get("loss_type")
    if "fused_linear_cross_entropy" in reading or given not in (None, "chunked_nll"):
        return
    note = (
        "lm_head and cross-entropy in chunks, no full logits (counted as a fused linear "
        "cross-entropy); trl < 1.7 or --loss_type nll keeps the full fp32 logits"
    )
    chunked = "TRL's chunked_nll (trl/trainer/sft_trainer.py _chunked_cross_entropy_loss)"
    reading.default("fused_linear_cross_entropy_impl", "trl_chunked_nll", chunked)
    if given == "chunked_nll":
        reading.default(
            "fused_linear_cross_entropy", True, "the command's --loss_type chunked_nll", note
        )
        return
    # unset: the default of the trl the run has, which no input says: assumed, and said
    where = f"TRL's default ({TRL_ARGS}: SFTConfig loss_type chunked_nll since trl 1.7.0)"
    key = "--loss_type (or the trl version: before 1.7 the full logits)"
    reading.set("fused_linear_cross_entropy", True, Origin(FROM_ASSUMED, where, key, note))


def _trl_dpo(reading: Reading) -> None:
    """TRL's DPOTrainer: the collator puts each pair's chosen and rejected sequences in one
    batch (dpo_trainer.py: prompt_chosen_ids + prompt_rejected_ids, split after the forward),
    so a micro-batch of b pairs is 2b sequences; the reference model is a second full model on
    the GPU unless PEFT (the adapters disabled) or precompute_ref_log_probs spares it."""
    b, origin = reading.get("micro_batch_size"), reading.origins.get("micro_batch_size")
    if b and origin is not None and origin.kind != FROM_ARGUMENT:
        note = f"{b} pairs: chosen and rejected in one batch ({_TRL_DPO_TRAINER})"
        reading.set("micro_batch_size", 2 * b, Origin(origin.kind, origin.where, origin.key, note))
    reading.set("preference_pairs", True, Origin(FROM_DERIVED, "TRL's DPO script", note=DPO))
    spared = reading.get("frozen_base") or reading.unused.get("precompute_ref_log_probs")
    if spared in (True, "true", "True"):
        return
    reading.set(
        "reference_model",
        True,
        Origin(
            FROM_DEFAULT,
            _TRL_DPO_TRAINER,
            "use_peft / precompute_ref_log_probs (neither set)",
            "DPOTrainer's reference model: a second copy of the weights on the GPU",
        ),
    )
    reading.warnings.append(
        "TRL DPO: the reference model's 16-bit weights are counted with the policy's, and "
        "the loss is sized as the Trainer's fp32 cross-entropy on the doubled batch's logits "
        "(DPO's bf16 log-probabilities with the reference logits beside them are not modelled "
        "apart), the reference forward's time not at all; --precompute_ref_log_probs or PEFT "
        "(use_peft) takes the reference out of the step"
    )


def apply_defaults(reading: Reading) -> None:
    # several inputs merged read as "DeepSpeed JSON + LLaMA-Factory YAML": the trainer's decides
    kind = next((f for f in (FORMAT_LF, FORMAT_TRL) if f in reading.format), reading.format)
    d = reading.default
    if kind == FORMAT_LF:
        d("seq_length", 2048, f"LLaMA-Factory's default ({LF_ARGS} data_args.py)", "cutoff_len")
    elif kind == FORMAT_TRL:
        d("seq_length", 1024, f"TRL's default ({TRL_ARGS})", "SFTConfig max_length")
    d(
        "micro_batch_size",
        8,
        f"transformers' default ({TRAINING_ARGS})",
        "per_device_train_batch_size",
    )
    if kind == FORMAT_TRL and TRL_SFT in reading.format:
        _trl_sft_loss(reading)
    if kind == FORMAT_TRL and TRL_DPO in reading.format:
        _trl_dpo(reading)
    dtype_said = reading.origins.get("param_precision")
    dtype_key = dtype_said.key.lstrip("-") if dtype_said is not None else ""
    if kind == FORMAT_TRL and dtype_key == "torch_dtype":
        # ModelConfig renamed it dtype in trl 0.23 and dropped torch_dtype in 0.27
        # (trl/trainer/model_config.py)
        reading.warnings.append(
            f"{dtype_said.where}: torch_dtype is ModelConfig's dtype from trl 0.23 (torch_dtype "
            "gone from 0.27): on a newer trl the flag is refused and a YAML key is not read "
            "(dtype auto: the checkpoint's); read here as the model's dtype"
        )
    if kind == FORMAT_TRL:
        fp16 = reading.get("fp16") is True
        d("bf16", not fp16, f"TRL's default ({TRL_ARGS})", "bf16 None: True unless fp16")
    d("bf16", False, f"transformers' default ({TRAINING_ARGS})")
    d("fp16", False, f"transformers' default ({TRAINING_ARGS})")
    d("fp8", None, f"transformers' default ({TRAINING_ARGS})")
    stage = reading.origins.get("zero_stage")
    deepspeed = (
        "deepspeed" in reading.unused
        or FORMAT_DS in reading.format
        or (
            stage is not None
            and ("zero_optimization" in stage.key or stage.key.startswith("deepspeed_config"))
        )
    )
    said = reading.origins.get("param_precision")
    if deepspeed and said is not None and said.key.lstrip("-") in ("torch_dtype", "dtype"):
        reading.set(
            "param_precision",
            "fp32_master",
            Origin(FROM_DERIVED, "DeepSpeed keeps an fp32 master copy of a 16-bit model"),
        )
    loaded_16bit = said is not None and said.key.lstrip("-") in ("torch_dtype", "dtype")
    if _fsdp(reading) and loaded_16bit and (reading.get("bf16") or reading.get("fp16")):
        reading.set(
            "param_precision",
            "amp",
            Origin(
                FROM_DERIVED,
                "Accelerate (>= 0.30) upcasts a 16-bit model's trainable FSDP parameters to fp32 "
                "when mixed precision is on (accelerator.py prepare_model; FSDP2: "
                "fsdp_utils.fsdp2_prepare_model): fp32 weights, gradients and Adam states",
            ),
        )
    if deepspeed:
        d(
            "param_precision",
            "fp32_master",
            "DeepSpeed's mixed precision",
            "16-bit weights and gradients, fp32 master copy in the optimizer",
        )
    elif reading.get("bf16") or reading.get("fp16"):
        # without DeepSpeed the Trainer's bf16 / fp16 is torch.autocast over fp32 weights
        # (and FSDP's mixed precision keeps fp32 flat parameters)
        d(
            "param_precision",
            "amp",
            f"transformers' default ({TRAINING_ARGS})",
            "bf16/fp16 without DeepSpeed: torch autocast, fp32 weights, gradients and Adam states",
        )
    d(
        "attention_backend",
        "flash",
        "transformers' default attn_implementation (sdpa where the model supports it)",
        "sdpa: a fused attention kernel",
    )
    d("transformer_impl", "local", "Hugging Face models", "torch modules, no Transformer Engine")
    d(
        "loss_implementation",
        "hf",
        "Hugging Face models",
        "ForCausalLMLoss: torch cross_entropy on logits upcast to fp32",
    )
    where = f"{'LLaMA-Factory' if kind == FORMAT_LF else 'transformers'} (no model parallelism)"
    for key in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    ):
        d(key, 1, where)
    d("virtual_pipeline_model_parallel_size", None, where)
    d("sequence_parallel", False, where)
    world = reading.get("world_size")
    if world:
        reading.derive(
            "data_parallel_size", world, "the world size: every rank is a data-parallel replica"
        )
    d("gradient_accumulation_steps", 1, f"transformers' default ({TRAINING_ARGS})")
    _derive_global_batch(reading)
    d("use_distributed_optimizer", False, where, "ZeRO / FSDP sharding is zero_stage")
    if "zero_stage" not in reading and "deepspeed" not in reading.unused:
        d(
            "zero_stage",
            0,
            f"transformers' default ({TRAINING_ARGS})",
            "no deepspeed / fsdp key: DDP, unless the launcher's accelerate config adds "
            "ZeRO or FSDP",
        )
    if deepspeed:
        fill_auto_buckets(reading)
        ds_config = "DeepSpeed's default (deepspeed/runtime/zero/config.py)"
        d("zero_reduce_bucket_size", 500_000_000, ds_config, "reduce_bucket_size 5e8")
        if (reading.get("zero_stage") or 0) >= 3:
            d("zero_prefetch_bucket_size", 50_000_000, ds_config, "stage3_prefetch_bucket_size 5e7")
        stage3 = (reading.get("zero_stage") or 0) >= 3
        d("zero_overlap_comm", stage3, ds_config, "overlap_comm: on at stage 3 only")
    d(
        "adam_step_temporary",
        False,
        f"transformers' default ({TRAINING_ARGS})",
        "optim unset: adamw_torch_fused with torch >= 2.8 (no temporary in the step); with "
        "older torch or transformers adamw_torch, whose foreach step adds a temporary of one "
        "Adam moment's size (set optim to say which)",
    )
    d("optimizer_offload", False, "DeepSpeed's default (offload_optimizer.device none)")
    d("param_offload", False, "DeepSpeed's default (offload_param.device none)")
    d("cpu_offloading", False, where)
    d("fine_grained_activation_offloading", False, where)
    if "recompute_granularity" not in reading:
        if kind == FORMAT_LF:
            on, where_gc = (
                True,
                f"LLaMA-Factory's default ({LF_ARGS} model_args.py: "
                "disable_gradient_checkpointing False)",
            )
        elif kind == FORMAT_TRL:
            on, where_gc = True, f"TRL's default ({TRL_ARGS}: gradient_checkpointing True)"
        else:
            on, where_gc = (
                False,
                f"transformers' default ({TRAINING_ARGS}: gradient_checkpointing False)",
            )
        if on:
            note = "every decoder layer in torch.utils.checkpoint"
            d("recompute_granularity", "full", where_gc, note)
            d("recompute_method", "uniform", where_gc, note)
            d("recompute_num_layers", 1, where_gc, note)
        else:
            d("recompute_granularity", None, where_gc)
    if reading.get("recompute_granularity") is None:
        d("recompute_method", None, "no gradient checkpointing")
        d("recompute_num_layers", None, "no gradient checkpointing")
    if kind == FORMAT_LF and "frozen_base" not in reading.values:
        finetuning = reading.unused.get("finetuning_type", "lora")
        if finetuning == "lora":  # absent: LLaMA-Factory's default is lora
            d("frozen_base", True, "finetuning_type: lora (LLaMA-Factory's default)")
    if reading.get("num_moe_experts"):
        d(
            "moe_grouped_gemm",
            False,
            "transformers' MoE blocks",
            "transformers 4.x loops over the experts (5.x's default experts implementation "
            "is grouped_mm, which saves a little less)",
        )
        if kind == FORMAT_LF and (reading.get("zero_stage") or 0) >= 3:
            d(
                "zero3_moe_leaf",
                True,
                f"LLaMA-Factory ({LF_ARGS.split(' (')[1][:-1]} model/model_utils/moe.py "
                "add_z3_leaf_module)",
                "ZeRO-3 gathers each MoE block whole",
            )
