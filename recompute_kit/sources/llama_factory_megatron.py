"""LLaMA-Factory YAMLs for its Megatron backends: a training YAML that also sets Megatron-Core
keys (`tensor_model_parallel_size`, `recompute_granularity`, ...) at its top level.

LLaMA-Factory (hiyouga/LLaMA-Factory @ ff6d4d12, hparams/parser.py) parses those keys only on
a Megatron backend, chosen at launch: `USE_MCA=1` trains with mcore_adapter (alibaba/ROLL
mcore_adapter: `Seq2SeqTrainingArguments` = its `MegatronArguments` + the Trainer's), and
`USE_MEGATRON_BRIDGE=1` with Megatron-Bridge (hparams/megatron_bridge_args.py). Both build a
Megatron-Core GPTModel from the Hugging Face checkpoint `model_name_or_path` names. The YAML's
Trainer keys keep their meaning: `per_device_train_batch_size` is the micro-batch, `cutoff_len`
the sequence length, `gradient_accumulation_steps` the micro-batches per step.

The backend is read from the keys (Megatron-Bridge's own: `mixed_precision`,
`use_packed_sequences`, `export_hf_on_finish`, ...) and said as an assumption, with the
environment variable that picks it; the environment itself is never read.
"""

from __future__ import annotations

import re

from . import hf_trainer, megatron_core
from .hf_trainer import LF_ARGS, TRAINING_ARGS
from .reading import FROM_DERIVED, Origin, Reading

MCA, MBRIDGE = "llama-factory-mca", "llama-factory-mbridge"
FRAMEWORKS = (MCA, MBRIDGE)
FORMAT = "LLaMA-Factory YAML (Megatron backend)"

# Megatron keys that only a Megatron backend accepts at a LLaMA-Factory YAML's top level
_MEGATRON_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "context_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "use_distributed_optimizer",
    "moe_token_dispatcher_type",
)
# MegatronBridgeArguments' keys that mcore_adapter has not
_BRIDGE_KEYS = (
    "mixed_precision",
    "use_packed_sequences",
    "megatron_pretrained_checkpoint",
    "export_hf_on_finish",
    "extra_config",
)
_MCA_ARGS = "mcore_adapter's default (alibaba/ROLL mcore_adapter/training_args.py)"
_MCA_CONFIG = "mcore_adapter's McaModelConfig.__post_init__ (models/model_config.py)"
_LF_BRIDGE_ARGS = (
    "LLaMA-Factory's MegatronBridgeArguments default (hparams/megatron_bridge_args.py)"
)


def _top_level(text: str, key: str) -> bool:
    return re.search(rf"^{re.escape(key)}\s*:", text, re.M) is not None


def sniff(text: str, path: str) -> int:
    if hf_trainer.sniff(text, path) < 90 or path.lower().endswith(".json"):
        return 0  # not a LLaMA-Factory YAML
    return 95 if any(_top_level(text, k) for k in _MEGATRON_KEYS) else 0


def read(text: str, path: str) -> Reading:
    reading = hf_trainer.read(text, path)  # the Trainer's keys: batch, length, dtype, model
    megatron = megatron_core.read(text, path)  # the Megatron-Core keys, as written
    bridge = any(_top_level(text, k) for k in _BRIDGE_KEYS)
    reading.framework = MBRIDGE if bridge else MCA
    backend = "Megatron-Bridge: USE_MEGATRON_BRIDGE=1" if bridge else "mcore_adapter: USE_MCA=1"
    reading.format = f"{FORMAT}, {backend}"
    written = set()
    for key, value in megatron.values.items():
        origin = megatron.origins[key]
        if key == "recompute_modules" and isinstance(value, str):
            value = [m.strip() for m in value.split(",") if m.strip()]  # mcore_adapter's form
        reading.set(key, value, origin, overwrite=False)
        written.add(origin.key)
    reading.unused = {k: v for k, v in reading.unused.items() if k not in written}
    reading.warnings.append(
        f"{path}: Megatron keys at the top level: read as LLaMA-Factory's Megatron backend "
        f"({backend} at launch; without it LLaMA-Factory refuses these keys)"
    )
    return reading


def apply_defaults(reading: Reading) -> None:
    d = reading.default
    if reading.framework == MBRIDGE:
        d("use_distributed_optimizer", True, _LF_BRIDGE_ARGS)
        precision = reading.unused.get("mixed_precision", "bf16_mixed")
        d("bf16", "bf16" in str(precision), _LF_BRIDGE_ARGS, f"mixed_precision {precision}")
    else:
        d("use_distributed_optimizer", False, _MCA_ARGS)
        d("moe_token_dispatcher_type", "allgather", _MCA_ARGS)
        for fusion in ("bias_activation_fusion", "apply_rope_fusion"):
            d(fusion, False, _MCA_ARGS)
        if reading.get("bf16"):
            d(
                "grad_reduce_in_fp32",
                True,
                "mcore_adapter: bf16 sets accumulate_allreduce_grads_in_fp32",
            )
        full = reading.get("recompute_granularity") == "full"
        unset = reading.get("recompute_method") is None
        unset = unset and reading.get("recompute_num_layers") is None
        if full and unset:
            note = f"{_MCA_CONFIG}: full recompute without a method recomputes every layer"
            reading.set("recompute_method", "uniform", Origin(FROM_DERIVED, note))
            reading.set("recompute_num_layers", 1, Origin(FROM_DERIVED, note))
        tp, ep = (
            reading.get("tensor_model_parallel_size") or 1,
            reading.get("expert_model_parallel_size") or 1,
        )
        if tp > 1 and ep > 1 and not reading.get("sequence_parallel"):
            note = f"{_MCA_CONFIG}: TP with EP turns sequence parallelism on"
            reading.set("sequence_parallel", True, Origin(FROM_DERIVED, note))
    d(
        "micro_batch_size",
        8,
        f"transformers' default ({TRAINING_ARGS})",
        "per_device_train_batch_size",
    )
    d("seq_length", 2048, f"LLaMA-Factory's default ({LF_ARGS} data_args.py)", "cutoff_len")
    d("bf16", False, f"transformers' default ({TRAINING_ARGS})")
    megatron_core.apply_defaults(reading)


def key_for(field: str) -> str:
    return {"micro_batch_size": "per_device_train_batch_size", "seq_length": "cutoff_len"}.get(
        field, field
    )
