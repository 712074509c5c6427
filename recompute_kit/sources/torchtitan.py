"""torchtitan TOML job configs (v0.1 - v0.2.x; main moved to Python config registries in 2026).

Read with `tomllib` only. Keys and defaults: `torchtitan/config/job_config.py` at v0.2.2
(`torchtitan/config_manager.py` at v0.1.0); see config-formats.md section 7.

* `[model] name` + `flavor` pick `<name>_args[flavor]` in `torchtitan/models/<name>/__init__.py`.
  A flavor with the same shape as a public Hugging Face model becomes `reading.model_name`
  (`HF_TWINS`); a debug flavor without one gives its shape from torchtitan's own table
  (`OWN_SHAPES`); any other flavor is an error that names what to add here.
* `[parallelism]`: replicate x shard x cp x tp x pp = WORLD_SIZE (the launcher's, not in the
  file); shard -1 = the rest. FSDP2 (`fully_shard`) shards params, grads and optimizer states
  over dp_shard x cp: zero_stage 3. TP always applies SequenceParallel to the norms.
* `[activation_checkpoint]`: mode none / selective / full / memory_budget; selective_ac_option
  a digit k (every k-th block fully checkpointed) or "op" (per-op selective AC).
"""

from __future__ import annotations

import re
from typing import Any

import tomllib

from ..config import ConfigError
from .reading import FROM_ASSUMED, FROM_MODEL, MOE_KEYS, Origin, Reading
from .torchtitan_defaults import (
    JOB_CONFIG,
    PURE_BF16,
    TT_BLOB,
    UNSET_DEFAULT,
    apply_defaults,
    flavor_source,
    layer_ac,
    op_sac_modules,
)

__all__ = ["UNSET_DEFAULT", "apply_defaults", "key_for", "read", "sniff"]

FRAMEWORKS: tuple[str, ...] = ("torchtitan",)


# (name, flavor) -> (Hugging Face id of the same model, n_layers, MoE, attn_type), each read from
# `<name>_args` in torchtitan/models/<name>/__init__.py at v0.2.2 (flavor_source(name)).
# Same shape as the HF config: dim, n_layers, heads, KV heads, FFN, vocab, experts.
HF_TWINS: dict[tuple[str, str], tuple[str, int, bool, str]] = {
    ("llama3", "8B"): ("meta-llama/Llama-3.1-8B", 32, False, "sdpa"),
    ("llama3", "8B_flex"): ("meta-llama/Llama-3.1-8B", 32, False, "flex"),
    ("llama3", "8B_varlen"): ("meta-llama/Llama-3.1-8B", 32, False, "varlen"),
    ("llama3", "70B"): ("meta-llama/Llama-3.1-70B", 80, False, "sdpa"),
    ("llama3", "405B"): ("meta-llama/Llama-3.1-405B", 126, False, "sdpa"),
    ("qwen3", "0.6B"): ("Qwen/Qwen3-0.6B", 28, False, "sdpa"),
    ("qwen3", "1.7B"): ("Qwen/Qwen3-1.7B", 28, False, "sdpa"),
    ("qwen3", "4B"): ("Qwen/Qwen3-4B", 36, False, "sdpa"),
    ("qwen3", "8B"): ("Qwen/Qwen3-8B", 36, False, "sdpa"),
    ("qwen3", "14B"): ("Qwen/Qwen3-14B", 40, False, "sdpa"),
    ("qwen3", "32B"): ("Qwen/Qwen3-32B", 64, False, "sdpa"),
    ("qwen3", "30B-A3B"): ("Qwen/Qwen3-30B-A3B", 48, True, "sdpa"),
    ("qwen3", "235B-A22B"): ("Qwen/Qwen3-235B-A22B", 94, True, "sdpa"),
    # torchtitan's "16B" is DeepSeek-V2-Lite's shape (MLA, kv_lora_rank 512, q_lora_rank 0 =
    # none, 64 routed + 2 shared experts of 1408, top-6, 1 dense layer, vocab 102400), not
    # deepseek-moe-16b (plain MHA) whose tokenizer its TOML points at.
    ("deepseek_v3", "16B"): ("deepseek-ai/DeepSeek-V2-Lite", 27, True, "flex"),
    ("deepseek_v3", "236B"): ("deepseek-ai/DeepSeek-V2", 60, True, "flex"),
    ("deepseek_v3", "671B"): ("deepseek-ai/DeepSeek-V3", 61, True, "flex"),
    # GptOssModelArgs "20b" / "120b": dim 2880, 24 / 36 layers, 64 heads of 64, 8 KV heads,
    # 32 / 128 experts of 2880, top-4, vocab 201088, a 128-token window on even layers
    ("gpt_oss", "20b"): ("openai/gpt-oss-20b", 24, True, "varlen"),
    ("gpt_oss", "120b"): ("openai/gpt-oss-120b", 36, True, "varlen"),
}

_LLAMA3_DEBUG = {
    # TransformerModelArgs(dim=256, n_layers=6, n_heads=16, vocab_size=2048): n_kv_heads None
    # = heads; FFN 4*256 -> int(2/3*) = 682 -> multiple_of 256 -> 768; no biases; untied.
    "num_layers": 6,
    "hidden_size": 256,
    "num_attention_heads": 16,
    "num_query_groups": 16,
    "kv_channels": 16,
    "ffn_hidden_size": 768,
    "vocab_size": 2048,
    "normalization": "RMSNorm",
    "swiglu": True,
    "add_bias_linear": False,
    "share_embeddings_and_output_weights": False,
    "position_embedding_type": "rope",
    "qk_layernorm": False,
    "num_moe_experts": None,
    "multi_latent_attention": False,
}
_QWEN3_DEBUG = {
    **_LLAMA3_DEBUG,
    # Qwen3ModelArgs(dim=256, n_layers=8, n_heads=16, n_kv_heads=8, head_dim=128,
    # hidden_dim=3072, vocab_size=2048, qk_norm=True, enable_weight_tying=True)
    "num_layers": 8,
    "num_query_groups": 8,
    "kv_channels": 128,
    "ffn_hidden_size": 3072,
    "share_embeddings_and_output_weights": True,
    "qk_layernorm": True,
}
_DSV3_DEBUG = {
    **_LLAMA3_DEBUG,
    # DeepSeekV3ModelArgs(dim=256, inter_dim=1024, moe_inter_dim=256, n_layers=6,
    # n_dense_layers=1, n_heads=16, 8 experts, 2 shared, top-3, q_lora_rank=0 (none),
    # kv_lora_rank=512, qk_nope 128, qk_rope 64, v 128)
    "ffn_hidden_size": 1024,
    "num_moe_experts": 8,
    "moe_router_topk": 3,
    "moe_ffn_hidden_size": 256,
    "moe_shared_expert_intermediate_size": 512,
    "moe_layer_freq": [0, 1, 1, 1, 1, 1],
    "moe_grouped_gemm": True,
    "multi_latent_attention": True,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
    "mtp_num_layers": 0,
}
# Llama 4 (torchtitan/models/llama4/__init__.py and model/args.py): dim 5120, 48 layers,
# 40 heads, 8 KV heads; dense FFN 4*5120 -> 2/3 -> x1.2 -> multiple of 2048 = 16384; each expert
# and the one shared expert: the same / (top_k 1 + 1 shared) -> 8192; top-1; MoE on every
# `interleave_moe_layer_step`-th layer (16E: 1; 128E: the default 2, layers 1, 3, 5, ...).
# Routing: sigmoid scores (MoEArgs score_func "sigmoid", top-1). The vocabulary comes from the
# tokenizer at run time (hf_assets_path): Llama 4's, 202048 (meta-llama/Llama-4-Scout-17B-16E
# and -Maverick-17B-128E config.json, text_config.vocab_size).
_LLAMA4 = {
    "num_layers": 48,
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_query_groups": 8,
    "kv_channels": 128,
    "ffn_hidden_size": 16384,
    "normalization": "RMSNorm",
    "swiglu": True,
    "add_bias_linear": False,
    "share_embeddings_and_output_weights": False,
    "position_embedding_type": "rope",
    "qk_layernorm": False,
    "multi_latent_attention": False,
    "moe_router_topk": 1,
    "moe_router_score_function": "sigmoid",
    "vocab_size": 202048,
    "moe_ffn_hidden_size": 8192,
    "moe_shared_expert_intermediate_size": 8192,
    "moe_grouped_gemm": True,
}
_LLAMA4_16E = {**_LLAMA4, "num_moe_experts": 16, "moe_layer_freq": 1}
_LLAMA4_128E = {**_LLAMA4, "num_moe_experts": 128, "moe_layer_freq": [0, 1] * 24}
# (name, flavor) -> (Megatron fields of a flavor whose HF twin is not in the registry, attn_type)
# Moonlight 16B-A3B, torchtitan's kimi_k2_7 "moonlight-16B-A3B" (_moonlight_16b_a3b_config):
# the DeepSeek-V3 text tower, dim 2048, 27 layers (1 dense), 16 heads; MLA without q-LoRA
# (kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128); dense FFN 11264; 64 experts of 1408,
# 2 shared, top-6, sigmoid routing; vocab 163840
_KIMI_SRC = (
    "https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/"
    "torchtitan/models/kimi_k2_7/__init__.py"
)
_MOONLIGHT = {
    **_DSV3_DEBUG,
    "num_layers": 27,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_query_groups": 16,
    "kv_channels": 128,
    "ffn_hidden_size": 11264,
    "vocab_size": 163840,
    "num_moe_experts": 64,
    "moe_router_topk": 6,
    "moe_ffn_hidden_size": 1408,
    "moe_shared_expert_intermediate_size": 2 * 1408,
    "moe_layer_freq": [0] + [1] * 26,
}
OWN_SHAPES: dict[tuple[str, str], tuple[dict[str, Any], str]] = {
    ("kimi_k2_7", "moonlight-16B-A3B"): (_MOONLIGHT, "flex"),
    ("llama3", "debugmodel"): (_LLAMA3_DEBUG, "sdpa"),
    ("llama3", "debugmodel_flex_attn"): (_LLAMA3_DEBUG, "flex"),
    ("llama3", "debugmodel_varlen_attn"): (_LLAMA3_DEBUG, "varlen"),
    ("qwen3", "debugmodel"): (_QWEN3_DEBUG, "sdpa"),
    ("deepseek_v3", "debugmodel"): (_DSV3_DEBUG, "sdpa"),
    ("deepseek_v3", "debugmodel_flex_attn"): (_DSV3_DEBUG, "flex"),
    # TOML-era torchtitan (<= 0.2.2, model/args.py attn_type "sdpa"): only the _irope flavors
    # set attn_type "flex" (block-causal, NoPE every 4th layer)
    ("llama4", "17bx16e"): (_LLAMA4_16E, "sdpa"),
    ("llama4", "17bx128e"): (_LLAMA4_128E, "sdpa"),
    ("llama4", "17bx16e_irope"): (_LLAMA4_16E, "flex"),
    ("llama4", "17bx128e_irope"): (_LLAMA4_128E, "flex"),
}
# Flavors read from OWN_SHAPES that still have a Hugging Face twin to name.
_OWN_SHAPE_TWINS = {
    ("llama4", "17bx16e"): "meta-llama/Llama-4-Scout-17B-16E",
    ("llama4", "17bx128e"): "meta-llama/Llama-4-Maverick-17B-128E",
    ("llama4", "17bx16e_irope"): "meta-llama/Llama-4-Scout-17B-16E",
    ("llama4", "17bx128e_irope"): "meta-llama/Llama-4-Maverick-17B-128E",
}

# Megatron field -> how a torchtitan user sets it.
_KEY_FOR = {
    "seq_length": "[training] seq_len",
    "micro_batch_size": "[training] local_batch_size",
    "global_batch_size": "[training] global_batch_size",
    "bf16": "[training] mixed_precision_param",
    "fp16": "[training] dtype",
    "fp8": "[model] converters",
    "tensor_model_parallel_size": "[parallelism] tensor_parallel_degree",
    "pipeline_model_parallel_size": "[parallelism] pipeline_parallel_degree",
    "context_parallel_size": "[parallelism] context_parallel_degree",
    "expert_model_parallel_size": "[parallelism] expert_parallel_degree",
    "expert_tensor_parallel_size": "[parallelism] expert_tensor_parallel_degree",
    # its default -1 takes the ranks the launcher's world leaves: the world decides it
    "data_parallel_size": "the launcher's world size (NGPU / torchrun --nproc_per_node x "
    "--nnodes) that data_parallel_shard_degree -1 fills, or --dp with the data-parallel size "
    "itself (GPUs / (TP x PP x CP), not the GPU count)",
    # FSDP2 shards when dp_shard x cp > 1: with dp_shard -1, the world decides it too
    "zero_stage": "[parallelism] data_parallel_shard_degree (at -1: the launcher's world size, "
    "or --dp)",
    "world_size": "the launcher's WORLD_SIZE (torchrun --nnodes x --nproc_per_node)",
    "recompute_granularity": "[activation_checkpoint] mode",
    "recompute_method": "[activation_checkpoint] selective_ac_option",
    "recompute_num_layers": "[activation_checkpoint] selective_ac_option",
    "recompute_modules": "[activation_checkpoint] selective_ac_option",
    "optimizer_offload": "[training] enable_cpu_offload",
    "param_offload": "[training] enable_cpu_offload",
    "attention_backend": "[model] flavor",
}
MODEL_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "vocab_size",
)
_MULTI_STAGE_SCHEDULES = ("interleaved", "zbv", "dualpipe", "loopedbfs")


def key_for(field: str) -> str:
    if field in _KEY_FOR:
        return _KEY_FOR[field]
    if field in MODEL_KEYS or field in MOE_KEYS:
        return "[model] name / flavor"
    return field


def sniff(text: str, path: str) -> int:
    lower = path.lower()
    tells = sum(f"[{s}]" in text for s in ("model", "training", "parallelism", "job"))
    tells += "[activation_checkpoint]" in text
    if lower.endswith("pyproject.toml"):
        return 0
    if lower.endswith(".toml"):
        return 95 if tells >= 2 else 40
    return 55 if tells >= 3 and "flavor" in text else 0


# -- locating keys ---------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEYLINE = re.compile(r"""^\s*([A-Za-z0-9_\-."']+)\s*=""")


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """(section, key) -> 1-based line, for `key = ...` lines under `[section]`."""
    lines: dict[tuple[str, str], int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            section = header.group(1).replace('"', "").replace("'", "").replace(" ", "")
            continue
        key = _KEYLINE.match(line)
        if key:
            parts = key.group(1).replace('"', "").replace("'", "").split(".")
            full = ".".join(p for p in (section, *parts[:-1]) if p)
            lines.setdefault((full, parts[-1]), number)
    return lines


class _Toml:
    """A job config's sections (`data`), the line of each (section, key) and what was read."""

    def __init__(self, data: dict[str, Any], lines: dict[tuple[str, str], int], path: str):
        self.data = data
        self.path = path
        self.lines = lines
        self.used: set[tuple[str, str]] = set()

    @classmethod
    def parse(cls, text: str, path: str) -> _Toml:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        return cls(data, _key_lines(text), path)

    def section(self, name: str) -> dict[str, Any]:
        node: Any = self.data
        for part in name.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if not isinstance(node, dict):
            raise ConfigError(f"{self.path}: [{name}] is not a table")
        return node

    def has(self, section: str, key: str) -> bool:
        return key in self.section(section)

    def get(self, section: str, key: str, default: Any = None) -> Any:
        self.used.add((section, key))
        return self.section(section).get(key, default)

    def origin(self, section: str, key: str, note: str = "") -> Origin:
        line = self.lines.get((section, key))
        where = f"{self.path}:{line}" if line else self.path
        return Origin("file", where, f"[{section}] {key}", note)

    def int(self, section: str, key: str, minimum: int = 1) -> int | None:
        if not self.has(section, key):
            return None
        value = self.get(section, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"{self.path}: [{section}] {key} = {value!r} is not an integer >= {minimum}"
            )
        return value


def _flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


# -- reading ---------------------------------------------------------------------------------


def read(text: str, path: str) -> Reading:
    reading = Reading(framework="torchtitan", format="torchtitan TOML job config")
    read_sections(_Toml.parse(text, path), reading)
    return reading


def read_sections(toml: _Toml, reading: Reading) -> None:
    """What the job config's sections say (a TOML's, or a config registry's mapped onto them:
    sources/torchtitan_registry.py)."""
    moe, n_layers = _read_model(toml, reading)
    pp = _read_parallelism(toml, reading)
    _read_training(toml, reading, pp)
    _read_precision(toml, reading)
    _read_activation_checkpoint(toml, reading, moe, n_layers, pp)
    _read_compile(toml, reading)
    for name, value in _flatten(toml.data).items():
        section, _, key = name.rpartition(".")
        if (section, key) not in toml.used:
            reading.unused[name] = value


def _read_model(toml: _Toml, reading: Reading) -> tuple[bool, int | None]:
    """Sets model_name (HF twin) or the flavor's own shape; returns (MoE, n_layers)."""
    name = toml.get("model", "name")
    flavor = toml.get("model", "flavor")
    for key in ("hf_assets_path", "tokenizer_path"):
        toml.get("model", key)  # the tokenizer / weights folder: not the shape
    if name is None or flavor is None:
        reading.warnings.append(
            f"{toml.path}: no [model] {'name' if name is None else 'flavor'}: torchtitan's "
            f"default is {name or 'llama3'} {flavor or 'debugmodel'} ({JOB_CONFIG})"
        )
    name = str(name or "llama3")
    flavor = str(flavor or "debugmodel")
    src = _KIMI_SRC if name == "kimi_k2_7" else flavor_source(name)
    origin_at = toml.origin("model", "flavor") if toml.has("model", "flavor") else None
    if (name, flavor) in HF_TWINS:
        hf_id, n_layers, moe, attn = HF_TWINS[(name, flavor)]
        reading.model_name = hf_id
        reading.model_name_origin = Origin(
            "file",
            origin_at.where if origin_at else toml.path,
            "[model] name, flavor",
            f"torchtitan {name} {flavor!r} has the shape of {hf_id} ({src})",
        )
    elif (name, flavor) in OWN_SHAPES:
        shape, attn = OWN_SHAPES[(name, flavor)]
        for key, value in shape.items():
            reading.set(
                key, value, Origin(FROM_MODEL, f"torchtitan {name}_args[{flavor!r}] ({src})", key)
            )
        n_layers, moe = shape["num_layers"], bool(shape.get("num_moe_experts"))
        if (name, flavor) in _OWN_SHAPE_TWINS:
            reading.model_name = _OWN_SHAPE_TWINS[(name, flavor)]
            reading.model_name_origin = Origin(
                "file", toml.path, "[model] name, flavor", f"torchtitan {name} {flavor!r}"
            )
    else:
        raise ConfigError(
            f"{toml.path}: torchtitan model {name!r} flavor {flavor!r} is not known to "
            "recompute-kit: add it to HF_TWINS (its Hugging Face twin) or OWN_SHAPES in "
            "recompute_kit/sources/torchtitan.py, or pass the model's Hugging Face id"
        )
    model_origin = Origin(FROM_MODEL, f"torchtitan {name}_args[{flavor!r}] ({src})", "attn_type")
    reading.set(
        "attention_backend",
        "flash",
        Origin(
            model_origin.kind,
            model_origin.where,
            "attn_type",
            f"attn_type {attn!r}: a fused attention kernel, no s x s scores kept",
        ),
    )
    if moe:
        reading.set(
            "moe_grouped_gemm",
            True,
            Origin(
                FROM_MODEL,
                f"torchtitan MoEArgs ({TT_BLOB}/torchtitan/models/moe/moe.py)",
                "use_grouped_mm",
            ),
            overwrite=False,
        )
    if name == "deepseek_v3":
        reading.set(
            "mtp_num_layers",
            0,
            Origin(
                FROM_MODEL, f"torchtitan deepseek_v3 ({src})", "", "torchtitan builds no MTP module"
            ),
            overwrite=False,
        )
    return moe, n_layers


# the [parallelism] keys read (torchtitan/config/job_config.py)
PARALLELISM_KEYS = (
    "tensor_parallel_degree",
    "pipeline_parallel_degree",
    "context_parallel_degree",
    "expert_parallel_degree",
    "expert_tensor_parallel_degree",
    "data_parallel_shard_degree",
    "data_parallel_replicate_degree",
    "pipeline_parallel_schedule",
    "pipeline_parallel_microbatch_size",
)


def _parallelism_sections(toml: _Toml, reading: Reading) -> dict[str, str]:
    """Per parallel-degree key, the section that holds it: [parallelism]; in a TOML of
    torchtitan before that section existed (2024), [training] (the data-parallel and tensor
    degrees) or [experimental] (pipeline and context), said so."""
    where = {}
    for key in PARALLELISM_KEYS:
        old = next((sec for sec in ("training", "experimental") if toml.has(sec, key)), None)
        where[key] = "parallelism" if toml.has("parallelism", key) or old is None else old
    old = sorted({f"[{sec}] {k}" for k, sec in where.items() if sec != "parallelism"})
    if old:
        reading.warnings.append(
            f"{toml.path}: {', '.join(old)}: the parallel degrees as torchtitan kept them "
            "before its [parallelism] section (2024), read from there; today's torchtitan "
            "reads them only under [parallelism]"
        )
    return where


def _read_parallelism(toml: _Toml, reading: Reading) -> int:
    at = _parallelism_sections(toml, reading)
    sizes = {
        "tensor_parallel_degree": "tensor_model_parallel_size",
        "pipeline_parallel_degree": "pipeline_model_parallel_size",
        "context_parallel_degree": "context_parallel_size",
        "expert_parallel_degree": "expert_model_parallel_size",
        "expert_tensor_parallel_degree": "expert_tensor_parallel_size",
    }
    got: dict[str, int] = {}
    for key, field in sizes.items():
        value = toml.int(at[key], key)
        if value is not None:
            reading.set(field, value, toml.origin(at[key], key))
            got[key] = value
    tp = got.get("tensor_parallel_degree", 1)
    pp = got.get("pipeline_parallel_degree", 1)
    cp = got.get("context_parallel_degree", 1)
    replicate = (
        toml.int(at["data_parallel_replicate_degree"], "data_parallel_replicate_degree") or 1
    )
    shard_at = at["data_parallel_shard_degree"]
    shard = toml.int(shard_at, "data_parallel_shard_degree", minimum=-1)
    if shard == 0:
        raise ConfigError(
            f"{toml.path}: [{at['data_parallel_shard_degree']}] data_parallel_shard_degree = 0 "
            "(use -1 or >= 1)"
        )
    if shard is not None and shard > 0:
        reading.set(
            "data_parallel_size",
            replicate * shard,
            toml.origin(
                shard_at, "data_parallel_shard_degree", f"replicate {replicate} x shard {shard}"
            ),
        )
        # every degree given: the world they multiply to is the one torchtitan requires
        reading.set(
            "world_size",
            replicate * shard * cp * tp * pp,
            toml.origin(
                shard_at,
                "data_parallel_shard_degree",
                f"replicate {replicate} x shard {shard} x cp {cp} x tp {tp} x pp {pp}",
            ),
        )
    if (shard is not None and shard > 1) or cp > 1:
        reading.set(
            "zero_stage",
            3,
            toml.origin(
                shard_at if shard and shard > 1 else at["context_parallel_degree"],
                "data_parallel_shard_degree" if shard and shard > 1 else "context_parallel_degree",
                "FSDP2 fully_shard over dp_shard x cp: params, grads and optimizer states sharded",
            ),
        )
        reading.set("use_torch_fsdp2", True, toml.origin(shard_at, "data_parallel_shard_degree"))
        if replicate > 1:
            reading.warnings.append(
                f"{toml.path}: HSDP (replicate {replicate} x shard {shard}): states are sharded "
                "over the shard degree only, not the whole data-parallel group"
            )
    elif shard == 1 and cp == 1:
        reading.set(
            "zero_stage",
            0,
            toml.origin(
                shard_at, "data_parallel_shard_degree", "shard 1: no FSDP (DDP replicas or none)"
            ),
        )
        if tp > 1 or pp > 1:
            reading.warnings.append(
                f"{toml.path}: TP/PP without FSDP or CP: torchtitan disables mixed precision "
                "(maybe_enable_amp), training runs in [training] dtype"
            )
    schedule = toml.get(at["pipeline_parallel_schedule"], "pipeline_parallel_schedule")
    if pp > 1 and schedule and any(s in str(schedule).lower() for s in _MULTI_STAGE_SCHEDULES):
        reading.warnings.append(
            f"{toml.path}: pipeline schedule {schedule!r} puts several stages on each rank; "
            "the virtual-pipeline size is not derived from the TOML"
        )
    return pp


def _read_training(toml: _Toml, reading: Reading, pp: int) -> None:
    sec = "training"
    batch_key = "local_batch_size" if toml.has(sec, "local_batch_size") else "batch_size"
    batch = toml.int(sec, batch_key)
    if pp > 1:
        mbs = toml.int("parallelism", "pipeline_parallel_microbatch_size")
        if mbs is not None:
            reading.set(
                "micro_batch_size",
                mbs,
                toml.origin(
                    "parallelism",
                    "pipeline_parallel_microbatch_size",
                    f"PP {pp}: the local batch is split into microbatches",
                ),
            )
    elif batch is not None:
        reading.set("micro_batch_size", batch, toml.origin(sec, batch_key, "per-rank batch"))
    seq = toml.int(sec, "seq_len")
    if seq is not None:
        reading.set("seq_length", seq, toml.origin(sec, "seq_len"))
    if batch is not None:
        reading.set("local_batch_size", batch, toml.origin(sec, batch_key, "per-rank batch"))
    gbs = toml.int(sec, "global_batch_size", minimum=-1)
    if gbs is not None and gbs > 0:
        reading.set("global_batch_size", gbs, toml.origin(sec, "global_batch_size"))
    if toml.get(sec, "enable_cpu_offload") is True:
        for key in ("param_offload", "optimizer_offload"):
            reading.set(
                key,
                True,
                toml.origin(
                    sec, "enable_cpu_offload", "FSDP CPUOffloadPolicy: params, grads, optimizer"
                ),
            )


def _read_precision(toml: _Toml, reading: Reading) -> None:
    sec = "training"
    dtype = toml.get(sec, "dtype")
    param = toml.get(sec, "mixed_precision_param")
    for key, value in (("dtype", dtype), ("mixed_precision_param", param)):
        if value is not None and value not in ("bfloat16", "float32"):
            raise ConfigError(f"{toml.path}: [training] {key} = {value!r} (bfloat16 or float32)")
    if dtype == "bfloat16":
        reading.set(
            "bf16",
            True,
            toml.origin(
                sec,
                "dtype",
                PURE_BF16,
            ),
        )
        reading.warnings.append(
            f"{toml.path}: [training] dtype = bfloat16 trains without fp32 master weights; "
            "Megatron bf16 keeps them, so model states are over-counted"
        )
    elif param is not None:
        reading.set(
            "bf16",
            param == "bfloat16",
            toml.origin(
                sec,
                "mixed_precision_param",
                "FSDP MixedPrecisionPolicy (autocast without FSDP): fp32 params, bf16 compute",
            ),
        )
    elif dtype == "float32":
        reading.set(
            "bf16",
            True,
            toml.origin(
                sec, "dtype", "fp32 params; mixed_precision_param defaults to bfloat16 compute"
            ),
        )
    if dtype is not None:
        reading.set("fp16", False, toml.origin(sec, "dtype", "torchtitan has no fp16 training"))

    converters = toml.get("model", "converters") or []
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    if any(c in ("float8", "quantize.linear.float8") for c in converters):
        fp8_sec = "float8" if "float8" in toml.data else "quantize.linear.float8"
        recipe = toml.get(fp8_sec, "recipe_name")
        rowwise = isinstance(recipe, str) and recipe.startswith("rowwise")
        reading.set(
            "fp8",
            "e4m3" if rowwise else "hybrid",
            toml.origin(
                "model",
                "converters",
                f"torchao Float8Linear, recipe {recipe or 'tensorwise'}: "
                + ("e4m3 everywhere" if rowwise else "e4m3 forward, e5m2 gradients"),
            ),
        )
        # torchao scales each cast from the tensor at hand (current scaling), never from an
        # amax history: not Megatron's "delayed" default, whose refusals (no moe_act /
        # layernorm recompute) do not apply; Megatron's name for current scaling is tensorwise
        reading.set(
            "fp8_recipe",
            "tensorwise",
            toml.origin(
                fp8_sec if recipe else "model",
                "recipe_name" if recipe else "converters",
                f"torchao {recipe or 'tensorwise'}: dynamic (current) scaling, no delayed amax",
            ),
        )
    elif any(c in ("mx", "quantize.linear.mx") for c in converters):
        reading.set("fp8", "e4m3", toml.origin("model", "converters", "torchao MXLinear mxfp8"))
        reading.set("fp8_recipe", "mxfp8", toml.origin("model", "converters"))
    elif "quantize.grouped_mm.float8" in converters:
        reading.warnings.append(
            f"{toml.path}: float8 grouped GEMMs of the experts only: not counted as fp8"
        )


def _read_activation_checkpoint(
    toml: _Toml, reading: Reading, moe: bool, n_layers: int | None, pp: int
) -> None:
    sec = "activation_checkpoint"
    has_option = toml.has(sec, "selective_ac_option")
    if not toml.has(sec, "mode") and not has_option:
        return  # apply_defaults: mode selective, selective_ac_option "2"
    # selective_ac_option is read whatever the mode: under selective it decides what is
    # recomputed (every k-th block, or per op); under none / full torchtitan ignores it
    # (apply_ac reads it only when mode == "selective"), which the mode's origin says.
    option = str(toml.get(sec, "selective_ac_option", "2")).strip()
    mode = toml.get(sec, "mode", "selective")  # job_config.py's default mode
    ignored = f"selective_ac_option {option!r} is ignored under mode {mode!r}" if has_option else ""
    if mode == "none":
        note = "; ".join(x for x in ("no activation checkpointing", ignored) if x)
        reading.set("recompute_granularity", None, toml.origin(sec, "mode", note))
    elif mode == "full":
        note = "; ".join(x for x in ("every block fully checkpointed", ignored) if x)
        reading.set("recompute_granularity", "full", toml.origin(sec, "mode", note))
        reading.set("recompute_method", "uniform", toml.origin(sec, "mode"))
        reading.set("recompute_num_layers", 1, toml.origin(sec, "mode"))
    elif mode == "selective":
        where = "selective_ac_option" if has_option else "mode"
        if option == "op":
            modules = op_sac_modules(moe)
            reading.set(
                "recompute_granularity",
                "selective",
                toml.origin(sec, where, f"selective_ac_option {option!r}: per-op selective AC"),
            )
            reading.set(
                "recompute_modules",
                modules,
                toml.origin(
                    sec,
                    where,
                    "ops outside the save list: norms; on MoE blocks the experts' grouped GEMMs",
                ),
            )
            reading.warnings.append(
                f"{toml.path}: torchtitan per-op selective AC saves matmul, attention and "
                "reduce-scatter outputs but recomputes every second matmul and all elementwise "
                "ops: the estimate counts dense blocks as torchtitan keeps them "
                "(memory/torchtitan.py)"
                + (
                    "; MoE blocks as Megatron's norms and whole-MoE-layer recompute (the "
                    "experts' grouped GEMMs are outside the save list), without the dispatched "
                    "tokens an all-to-all output may keep: approximate"
                    if moe
                    else ""
                )
            )
        elif option.isdigit():
            method, layers, note = layer_ac(int(option), n_layers, pp)
            said = f"selective_ac_option {option!r}: {note}"
            reading.set("recompute_granularity", "full", toml.origin(sec, where, said))
            reading.set("recompute_method", method, toml.origin(sec, where, said))
            if layers is not None:
                reading.set(
                    "recompute_num_layers",
                    layers,
                    toml.origin(sec, where, f"{n_layers} layers / PP {pp} / {option}"),
                )
            if method == "block":
                reading.warnings.append(f"{toml.path}: selective_ac_option {option}: {note}")
        else:
            raise ConfigError(
                f"{toml.path}: [activation_checkpoint] selective_ac_option = {option!r} "
                "(a digit string or 'op')"
            )
    elif mode == "memory_budget":
        reading.unused["activation_checkpoint.mode"] = mode  # apply_defaults: no default AC
        reading.warnings.append(
            f"{toml.path}: activation_checkpoint mode memory_budget lets torch.compile's "
            "min-cut choose what to save (budget "
            f"{toml.get(sec, 'memory_budget', 0.5)}): no Megatron recompute setting expresses it"
        )
    else:
        raise ConfigError(
            f"{toml.path}: [activation_checkpoint] mode = {mode!r} "
            "(none, selective, full, memory_budget)"
        )


def _read_compile(toml: _Toml, reading: Reading) -> None:
    enabled = (
        toml.section("compile").get("enable") is True
        or toml.section("training").get("compile") is True
    )
    components = toml.section("compile").get("components", ["model", "loss"])
    if enabled and "model" in (components or []):
        reading.warnings.append(
            f"{toml.path}: torch.compile of the model fuses elementwise ops, so it keeps fewer "
            "activations than the eager layers recompute-kit counts"
        )


def derive_after_layout(reading: Reading) -> None:
    """torchtitan's global batch where the TOML leaves it -1 (its default): local_batch_size x
    the data-parallel degree (one accumulation step; torchtitan/config/job_config.py)."""
    local, dp = reading.get("local_batch_size"), reading.get("data_parallel_size")
    origin = reading.origins.get("data_parallel_size")
    if "global_batch_size" in reading or not local or not dp or origin is None:
        return
    if origin.kind == FROM_ASSUMED:  # never a global batch from an assumed world
        return
    reading.derive(
        "global_batch_size",
        local * dp,
        f"global_batch_size -1: local_batch_size {local} x data-parallel degree {dp}",
    )


def context_parallel_refused(
    framework: str | None, attention_note: str, attention_where: str = ""
) -> str | None:
    """Why the run cannot use context parallelism, or None: torchtitan refuses it with
    FlexAttention (models/*/infra/parallelize.py: "Context Parallel only supports SDPA").
    `attention_note`: the note of the reading's attention_backend origin ("attn_type 'flex'")."""
    if framework == "torchtitan" and "'flex'" in attention_note:
        return "torchtitan refuses it with FlexAttention (attn_type flex)"
    if framework == "torchtitan" and "kimi_k2_7" in attention_where:
        # torchtitan/models/kimi_k2_7/parallelize.py raises NotImplementedError with CP
        return "torchtitan's kimi_k2_7 models refuse it (parallelize.py: not yet supported)"
    return None
