"""recompute-kit's own config files: YAML or JSON with Megatron-Core's field names, flat or
under `model:` (with `train:` / `ddp:` / `dataset:` sections as Megatron-Bridge writes them).

The framework is Megatron-Core itself: a key the file leaves out takes `TransformerConfig`'s
default (not Megatron-LM's command-line defaults, which turn the fusions on)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from ..config import CONFIG_KEYS, ConfigError
from ..config.files import ALIASES
from .reading import FROM_FILE, KNOWN_KEYS, Origin, Reading

FRAMEWORKS = ("megatron-core",)
_WHERE = "Megatron-Core's TransformerConfig default"
_NORMALIZATIONS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
# Read but folded into other values (launcher sizes give the world size).
_WORLD_KEYS = ("world_size", "nproc_per_node", "nnodes", "num_gpus")


def _load(text: str, path: str) -> Any:
    try:
        if Path(path).suffix.lower() == ".json" or text.lstrip()[:1] == "{":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path} is not valid YAML/JSON: {first}") from None


def _sections(data: dict[str, Any]) -> dict[str, Any]:
    """The flat mapping: `model:` first, then same-named keys of other sections."""
    if not isinstance(data.get("model"), dict):
        return data
    flat = dict(data["model"])
    for name, section in data.items():
        if name == "model":
            continue
        if isinstance(section, dict):
            for key, value in section.items():
                flat.setdefault(key, value)
        else:
            flat.setdefault(name, section)
    return flat


def sniff(text: str, path: str) -> int:
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml", ".json", ""):
        return 0
    try:
        data = _load(text, path)
    except ConfigError:
        return 0
    if not isinstance(data, dict):
        return 0
    flat = _sections(data)
    known = sum(1 for k in flat if k in CONFIG_KEYS or k in ALIASES)
    # Weak on purpose: a framework's own reader claims its files more surely.
    return 20 if known >= max(1, len(flat) // 2) else 5 if known else 0


def _line_of(text: str, key: str) -> int | None:
    pattern = re.compile(rf"""^\s*["']?{re.escape(key)}["']?\s*:""")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return number
    return None


def _converted(key: str, value: Any) -> tuple[str, Any]:
    if key in ALIASES:
        target, convert = ALIASES[key]
        return target, convert(value)
    if key == "normalization" and isinstance(value, str):
        return key, _NORMALIZATIONS.get(value.lower(), value)
    if key == "attention_backend" and isinstance(value, str):
        return key, value.rsplit(".", 1)[-1]  # "AttnBackend.flash" -> "flash"
    if key == "fp8" and value is False:
        return key, None
    return key, value


def read(text: str, path: str) -> Reading:
    data = _load(text, path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys to values")
    reading = Reading(framework="megatron-core", format="Megatron-Core config (YAML/JSON)")
    flat = _sections(data)
    for key, value in flat.items():
        if key in _WORLD_KEYS or isinstance(value, dict):
            continue
        if key not in KNOWN_KEYS and key not in ALIASES:
            reading.unused[key] = value
            continue
        if value is None and key in ALIASES:
            continue
        target, converted = _converted(key, value)
        line = _line_of(text, key)
        where = f"{path}:{line}" if line else path
        reading.set(target, converted, Origin(FROM_FILE, where, key), overwrite=False)
    world = flat.get("world_size")
    if world is None and flat.get("nproc_per_node") is not None:
        world = int(flat["nproc_per_node"]) * int(flat.get("nnodes") or 1)
    if world is not None:
        key = "world_size" if "world_size" in flat else "nproc_per_node"
        reading.set("world_size", int(world), Origin(FROM_FILE, path, key))
    if reading.unused:
        names = ", ".join(sorted(reading.unused))
        reading.warnings.append(f"{path}: keys recompute-kit does not use: {names}")
    return reading


# Megatron-Core's defaults for the memory-relevant fields (TransformerConfig, GPTModel,
# ModelParallelConfig, DistributedDataParallelConfig).
DEFAULTS: dict[str, Any] = {
    "normalization": "LayerNorm",
    "swiglu": False,
    "add_bias_linear": True,
    "share_embeddings_and_output_weights": False,  # GPTModel's argument default
    "position_embedding_type": "learned_absolute",
    "qk_layernorm": False,
    "attention_backend": "auto",
    "bf16": False,
    "fp16": False,
    "fp8": None,
    "num_moe_experts": None,
    "multi_latent_attention": False,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "sequence_parallel": False,
    "use_distributed_optimizer": False,
    "zero_stage": 0,
    "recompute_granularity": None,
    "cpu_offloading": False,
    "fine_grained_activation_offloading": False,
    "moe_router_topk": 2,
    "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": None,
    "moe_grouped_gemm": False,
    "recompute_modules": ["core_attn"],
}


def apply_defaults(reading: Reading) -> None:
    for key, value in DEFAULTS.items():
        reading.default(key, value, _WHERE)
    h, heads = reading.get("hidden_size"), reading.get("num_attention_heads")
    if h and heads:
        reading.derive("num_query_groups", heads, "TransformerConfig: None = one group per head")
        reading.derive("kv_channels", h // heads, "TransformerConfig: hidden_size / heads")
        reading.derive("ffn_hidden_size", 4 * h, "TransformerConfig: 4 x hidden_size")
    if reading.get("num_moe_experts") and reading.get("ffn_hidden_size"):
        reading.derive(
            "moe_ffn_hidden_size", reading.get("ffn_hidden_size"), "TransformerConfig: ffn size"
        )
    if reading.get("recompute_granularity"):
        reading.default("recompute_method", None, _WHERE)
        reading.default("recompute_num_layers", None, _WHERE)


def key_for(field: str) -> str:
    return field
