"""Config files: YAML or JSON, flat or nested under `model:` (Megatron-Bridge style), with
Megatron-Core's, Megatron-Bridge's and Megatron-LM's names and Megatron's defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .model import _SECTION_OF_KEY, Config, ConfigError, _did_you_mean

# Names Megatron-Core's TransformerConfig, Megatron-Bridge and Megatron-LM's flags use for a
# kit key, with the conversion of the value.
ALIASES: dict[str, tuple[str, Any]] = {
    "gated_linear_unit": ("swiglu", bool),
    "padded_vocab_size": ("vocab_size", int),
    "decoder_first_pipeline_num_layers": ("num_layers_in_first_pipeline_stage", int),
    "decoder_last_pipeline_num_layers": ("num_layers_in_last_pipeline_stage", int),
    "disable_bias_linear": ("add_bias_linear", lambda v: not v),
    "untie_embeddings_and_output_weights": ("share_embeddings_and_output_weights", lambda v: not v),
    "no_bias_swiglu_fusion": ("bias_activation_fusion", lambda v: not v),
    "no_bias_gelu_fusion": ("bias_activation_fusion", lambda v: not v),
    "no_masked_softmax_fusion": ("masked_softmax_fusion", lambda v: not v),
    "no_rope_fusion": ("apply_rope_fusion", lambda v: not v),
    "tensor_parallel_size": ("tensor_model_parallel_size", int),
    "pipeline_parallel_size": ("pipeline_model_parallel_size", int),
    "expert_parallel_size": ("expert_model_parallel_size", int),
}
# Keys read but not kept: what they tell is folded into other keys.
_INFORMATIVE = {"activation_func", "world_size", "nproc_per_node", "nnodes", "num_gpus"}
_NORMALIZATIONS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}

# Megatron-Core's TransformerConfig defaults where the kit's differ (its small runnable models),
# used for a config read from a file; each memory-relevant key a file leaves out is listed.
MEGATRON_DEFAULTS = {
    "attention_backend": "auto",
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "normalization": "LayerNorm",
    "micro_batch_size": 1,
}
# Keys without which a per-rank estimate is a guess: named in the assumptions when missing.
_MEMORY_KEYS = {
    "vocab_size": 32000,
    "seq_length": 4096,
    "micro_batch_size": 1,
    "bf16": False,
    "attention_backend": "auto",
    "normalization": "LayerNorm",
    "swiglu": False,
    "add_bias_linear": True,
}


def config_from_dict(data: dict[str, Any], base: Config | None = None) -> tuple[Config, list[str]]:
    """Build a Config from a flat or section-nested mapping (Megatron-Bridge's `model:`,
    `train:`, `ddp:`, ...; Megatron-Core and Megatron-LM names). Returns (config, warnings):
    warnings name every key that was not used. Without `base`, missing keys take Megatron's
    defaults and every memory-relevant one is listed in `config.assumptions`."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"a config must be a mapping of keys to values, got {type(data).__name__}"
        )
    warnings: list[str] = []
    flat = dict(data)
    if isinstance(flat.get("model"), dict):
        # Megatron-Bridge keeps a few of our keys in other sections (train.micro_batch_size,
        # ddp.use_distributed_optimizer, dataset.seq_length): take those, report the rest.
        sections, flat = flat, dict(flat.pop("model"))
        for name, section in sections.items():
            if not isinstance(section, dict):
                warnings.append(f"ignored top-level key {name!r}")
                continue
            for key, value in section.items():
                if (key in _SECTION_OF_KEY or key in ALIASES) and key not in flat:
                    flat[key] = value
    assumptions: list[str] = []
    known: dict[str, Any] = {}
    for key, value in flat.items():
        if key in _SECTION_OF_KEY:
            known[key] = value
        elif key in ALIASES:
            target, convert = ALIASES[key]
            if value is not None:
                known.setdefault(target, convert(value))
        elif key not in _INFORMATIVE:
            warnings.append(f"unknown config key {key!r}{_did_you_mean(key)} (ignored)")
    if isinstance(known.get("normalization"), str):
        known["normalization"] = _NORMALIZATIONS.get(
            known["normalization"].lower(), known["normalization"]
        )
    if isinstance(known.get("attention_backend"), str):  # "AttnBackend.flash" -> "flash"
        known["attention_backend"] = known["attention_backend"].rsplit(".", 1)[-1]
    act = str(flat.get("activation_func") or "")
    if known.get("swiglu") and act and "silu" not in act:
        assumptions.append(f"gated_linear_unit with {act}: counted as SwiGLU (same memory)")
    _derive_data_parallel(flat, known, assumptions)
    if base is None:
        for key, default in _MEMORY_KEYS.items():
            if key not in known:
                known[key] = MEGATRON_DEFAULTS.get(key, default)
                assumptions.append(f"{key} not given: assumed {known[key]!r}")
        for key, default in MEGATRON_DEFAULTS.items():
            known.setdefault(key, default)
    cfg = (base or Config()).replace(**known)
    cfg.assumptions = [*(base.assumptions if base else []), *assumptions]
    return cfg, warnings


def _derive_data_parallel(flat: dict[str, Any], known: dict[str, Any], notes: list[str]) -> None:
    """DP from a launcher's world size (torchrun --nnodes x --nproc-per-node) when not given."""
    if "data_parallel_size" in known:
        return
    world = flat.get("world_size")
    if world is None and flat.get("nproc_per_node") is not None:
        world = int(flat["nproc_per_node"]) * int(flat.get("nnodes") or 1)
    if world is None:
        return
    model_parallel = (
        int(known.get("tensor_model_parallel_size") or 1)
        * int(known.get("pipeline_model_parallel_size") or 1)
        * int(known.get("context_parallel_size") or 1)
    )
    if int(world) % model_parallel:
        raise ConfigError(f"world size {world} is not divisible by TP x PP x CP = {model_parallel}")
    known["data_parallel_size"] = int(world) // model_parallel
    notes.append(
        f"data_parallel_size derived: world size {world} / (TP x PP x CP = {model_parallel})"
    )


def load_config(path: str | Path, base: Config | None = None) -> tuple[Config, list[str]]:
    """Read a YAML or JSON config file. Raises ConfigError with one line on any problem."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"config file {str(path)!r} is not valid YAML/JSON: {first}") from None
    if data is None:
        raise ConfigError(f"config file {str(path)!r} is empty")
    return config_from_dict(data, base)
