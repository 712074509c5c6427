"""Megatron-Bridge's shared recipe helpers (`recipes/common.py`) and the helpers whose effect on
the model config a recipe relies on, for when the recipe file is read alone.

Recipes written `cfg = _pretrain_common(); cfg.model.tensor_model_parallel_size = 2; ...` start
from what the helper builds. When `megatron/bridge/recipes/common.py` is beside the file (a
checkout), recipes.py reads it; when it is not (a single copied file), the values below stand in
for it, each with the line of the pinned commit that sets it, and a warning says so.
"""

from __future__ import annotations

import re
from typing import Any

from .reading import FROM_DEFAULT, FROM_DERIVED, FROM_MODEL, Origin, Reading

COMMON_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
COMMON_URL = (
    f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMON_COMMIT}/"
    "src/megatron/bridge/recipes/common.py"
)
COMMON_MODULE = "megatron.bridge.recipes.common"

# helper -> [(section, key, value, line in common.py @ COMMON_COMMIT)]: the fields recompute-kit
# reads. The optimizer comes from distributed_fused_adam_with_cosine_annealing (use_distributed_
# optimizer=True, recipes/utils/optimizer_utils.py); mixed_precision="bf16_mixed" reduces
# gradients in fp32 (training/mixed_precision.py), as ddp.grad_reduce_in_fp32=True also says.
HELPERS: dict[str, list[tuple[str, str, Any, int]]] = {
    "_pretrain_common": [
        ("optimizer", "use_distributed_optimizer", True, 53),
        ("train", "global_batch_size", 32, 66),
        ("train", "micro_batch_size", 2, 67),
        ("ddp", "grad_reduce_in_fp32", True, 82),
        ("ddp", "data_parallel_sharding_strategy", "optim_grads_params", 86),
        ("ddp", "use_distributed_optimizer", True, 87),
        ("dataset", "seq_length", 4096, 95),
        ("mixed_precision", "", "bf16_mixed", 130),
    ],
    "_sft_common": [
        ("optimizer", "use_distributed_optimizer", True, 169),
        ("train", "global_batch_size", 128, 183),
        ("train", "micro_batch_size", 1, 184),
        ("ddp", "grad_reduce_in_fp32", True, 196),
        ("dataset", "seq_length", 2048, 200),  # default_squad_config(seq_length=2048), line 161
        ("mixed_precision", "", "bf16_mixed", 230),
    ],
    "_peft_common": [
        ("optimizer", "use_distributed_optimizer", True, 268),
        ("train", "global_batch_size", 128, 282),
        ("train", "micro_batch_size", 1, 283),
        ("ddp", "grad_reduce_in_fp32", True, 295),
        ("dataset", "seq_length", 2048, 299),  # default_squad_config(seq_length=2048), line 260
        ("mixed_precision", "", "bf16_mixed", 329),
    ],
}

# apply_flex_dispatcher_backend(model_cfg, backend) (training/flex_dispatcher_backend.py @
# COMMON_COMMIT): for an MoE model and backend "deepep" / "hybridep" it sets
# moe_token_dispatcher_type = "flex" (and moe_shared_expert_overlap = False); on a GPU the
# backend does not support (DeepEP: other than Ampere, Hopper, B200/B300; HybridEP: other than
# compute capability 8-10) it falls back to "alltoall".
FLEX_CALL = "apply_flex_dispatcher_backend"
FLEX_BACKENDS = ("deepep", "hybridep")
FLEX_URL = (
    f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMON_COMMIT}/"
    "src/megatron/bridge/training/flex_dispatcher_backend.py"
)
FLEX_NOTE = (
    "apply_flex_dispatcher_backend({backend}): flex on Ampere/Hopper/B200/B300 GPUs "
    "(alltoall where the backend is unsupported)"
)

# What the provider AutoBridge builds for a Hugging Face model sets beyond its config.json shape
# (models/<family>/<name>_bridge.py provider_bridge(), @ COMMON_COMMIT): HF model_type ->
# (file under src/megatron/bridge/models/, the method, [(field, value, line)]). A recipe's
# `AutoBridge.from_hf_pretrained(id).to_megatron_provider()` starts from these, not from
# Megatron-Core's TransformerConfig defaults.
MODELS_URL = f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMON_COMMIT}/src/megatron/bridge/models/"
PROVIDER_SETTINGS: dict[str, tuple[str, str, list[tuple[str, Any, int]]]] = {
    "llama": (
        "llama/llama_bridge.py",
        "LlamaBridge.hf_config_to_model_config_kwargs()",
        [  # (the architecture, RMSNorm and the gated MLP, is the registry's: its config.json)
            ("hidden_dropout", 0.0, 55),
            ("bias_activation_fusion", True, 56),
            ("masked_softmax_fusion", True, 57),
            ("apply_rope_fusion", True, 60),
        ],
    ),
    "gpt_oss": (
        "gpt_oss/gpt_oss_bridge.py",
        "GPTOSSBridge.provider_bridge()",
        [
            ("position_embedding_type", "yarn", 65),
            ("moe_grouped_gemm", True, 68),
            ("moe_token_dispatcher_type", "alltoall", 69),
            ("moe_router_load_balancing_type", "none", 71),
            ("bias_activation_fusion", True, 73),
            ("hidden_dropout", 0.0, 76),
        ],
    ),
    "deepseek_v3": (  # DeepSeek-V3 and Moonlight (its config.json's model_type)
        "deepseek/deepseek_v3_bridge.py",
        "DeepSeekV3Bridge.provider_bridge()",
        [
            ("moe_grouped_gemm", True, 65),
            ("moe_router_pre_softmax", True, 66),
            ("moe_token_dispatcher_type", "alltoall", 67),
            ("moe_router_load_balancing_type", "seq_aux_loss", 68),
            ("moe_shared_expert_overlap", True, 72),
            ("moe_router_score_function", "sigmoid", 73),
            ("apply_rope_fusion", False, 78),
            ("bias_activation_fusion", True, 80),
            ("cross_entropy_fusion_impl", "te", 82),
            ("cross_entropy_loss_fusion", True, 83),
            ("masked_softmax_fusion", True, 84),
            ("hidden_dropout", 0.0, 87),
            ("attention_softmax_in_fp32", False, 88),
        ],
    ),
    "qwen2": (
        "qwen/qwen2_bridge.py",
        "Qwen2Bridge.provider_bridge()",
        [("hidden_dropout", 0.0, 54)],
    ),
    "qwen3": (
        "qwen/qwen3_bridge.py",
        "Qwen3Bridge.provider_bridge()",
        [("hidden_dropout", 0.0, 51)],
    ),
    "qwen3_moe": (
        "qwen/qwen3_moe_bridge.py",
        "Qwen3MoEBridge.provider_bridge()",
        [
            ("moe_grouped_gemm", True, 63),
            ("moe_router_load_balancing_type", "aux_loss", 64),
            ("moe_aux_loss_coeff", 1e-3, 65),
            ("moe_token_dispatcher_type", "alltoall", 67),
        ],
    ),
    "qwen3_next": (
        "qwen/qwen3_next_bridge.py",
        "Qwen3NextBridge.provider_bridge()",
        [
            ("moe_grouped_gemm", True, 69),
            ("moe_aux_loss_coeff", 1e-3, 71),
            ("moe_token_dispatcher_type", "alltoall", 73),
        ],
    ),
}
# Every model bridge maps these config.json keys onto the provider (MegatronModelBridge
# .CONFIG_MAPPING, conversion/model_bridge.py lines 469-484 @ COMMON_COMMIT; those a memory
# figure needs).
CONFIG_MAPPING_FILE = "conversion/model_bridge.py"
CONFIG_MAPPING = [
    ("attention_dropout", "attention_dropout", 469),
    ("hidden_dropout", "hidden_dropout", 470),
    ("aux_loss_alpha", "moe_aux_loss_coeff", 483),
    ("router_aux_loss_coef", "moe_aux_loss_coeff", 484),
]


# The model_type of a Hugging Face id the registry does not hold, for the families above
_FAMILY_OF_ID = (
    (r"(?i)^meta-llama/(?:Meta-)?Llama-[23]", "llama"),
    (r"(?i)^Qwen/Qwen2(?:\.5)?-\d+(?:\.\d+)?B", "qwen2"),
    (r"(?i)^Qwen/Qwen3-\d+(?:\.\d+)?B(?:-|$)", "qwen3"),
    (r"(?i)^moonshotai/Moonlight-|^deepseek-ai/DeepSeek-V3", "deepseek_v3"),
)


# transformers' config classes of those families default attention_dropout to 0.0
_CLASS_ATTENTION_DROPOUT = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "deepseek_v3": "DeepseekV3Config",
}


def apply_provider_settings(reading: Reading) -> None:
    """What the provider AutoBridge builds for the named Hugging Face model sets (its model
    bridge's provider_bridge(), and the config.json keys every bridge maps): the run's value
    where no input sets one, labelled with the Bridge line that sets it."""
    from . import registry

    if reading.model_name is None:
        return
    config = registry.model_config(reading.model_name) or {}
    model_type, note = config.get("model_type"), ""
    if model_type is None:  # not registered (a preset's model): the family its id names
        model_type = next(
            (t for pattern, t in _FAMILY_OF_ID if re.search(pattern, reading.model_name)), None
        )
        note = f"{model_type} by the model id {reading.model_name}" if model_type else ""
    found = PROVIDER_SETTINGS.get(str(model_type))
    if found is not None:
        file, method, settings = found
        for key, value, line in settings:
            where = f"{MODELS_URL}{file}#L{line}"
            origin = Origin(FROM_DEFAULT, where, f"{method} provider.{key}", note)
            # the bridge sets it after mapping config.json (gpt-oss: yarn over the rope its
            # config.json reads as): it wins over the model's value, never over the inputs'
            had = reading.origins.get(key)
            reading.set(key, value, origin, overwrite=had is not None and had.kind == FROM_MODEL)
    if not config and model_type in _CLASS_ATTENTION_DROPOUT:
        # no config.json: the transformers class's default, which CONFIG_MAPPING copies
        config = {"attention_dropout": 0.0}
        note = f"{note}; transformers {_CLASS_ATTENTION_DROPOUT[model_type]}.attention_dropout"
    for hf_key, key, line in CONFIG_MAPPING:
        if isinstance(config.get(hf_key), (int, float)) and not isinstance(config[hf_key], bool):
            where = f"{MODELS_URL}{CONFIG_MAPPING_FILE}#L{line}"
            said = note or f"{reading.model_name} config.json {hf_key}"
            origin = Origin(FROM_DEFAULT, where, f"MegatronModelBridge.CONFIG_MAPPING {key}", said)
            reading.set(key, float(config[hf_key]), origin, overwrite=False)


# Megatron-Bridge's TransformerConfig (models/transformer_config.py lines 80-88, called when the
# model config is finalized and again at initialize): an expert TP left unset is 1 under expert
# parallelism, where Megatron-Core would take the tensor-parallel size
EXPERT_TP_DEFAULT = f"{MODELS_URL}transformer_config.py#L80"


def apply_expert_tensor_parallel_default(reading: Reading) -> None:
    """expert_tensor_parallel_size 1 where the inputs leave it unset (or None) and expert
    parallelism is on, as Megatron-Bridge finalizes its model config."""
    ep = reading.get("expert_model_parallel_size")
    if reading.get("expert_tensor_parallel_size") is None and isinstance(ep, int) and ep > 1:
        origin = Origin(
            FROM_DERIVED,
            EXPERT_TP_DEFAULT,
            "_set_moe_expert_tensor_parallel_default",
            "Megatron-Bridge: unset expert TP is 1 under expert parallelism (Megatron-Core "
            "would take the tensor-parallel size)",
        )
        reading.set("expert_tensor_parallel_size", 1, origin)
