"""Hugging Face `config.json` (a model's architecture) and Hugging Face model ids.

A `config.json` says the model's shape, nothing about training: `max_position_embeddings` is
the model's capacity (not the training sequence length) and `torch_dtype` / `dtype` the storage
precision (not the training precision); both go to `reading.unused`. What no key states but
the architecture fixes (RMSNorm, a gated MLP, no biases, qk-norm, tied embeddings by the
class's default) is set with `Origin("model", ..., note="<family> architecture: ...")`.

Semantics (transformers' config classes and modelling code; see
/work/shared/reference/config-formats.md section 6):
- qwen2_moe / qwen3_moe: layer i is MoE iff i not in mlp_only_layers and
  (i + 1) % decoder_sparse_step == 0 (`Qwen2MoeDecoderLayer`): emitted as a 0/1 list.
- deepseek_v2 / v3: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0;
  shared experts = n_shared_experts * moe_intermediate_size; q_lora_rank null = plain q_proj;
  HF's `head_dim` (= qk_rope_head_dim) is ignored for MLA.
- Mixtral / GPT-OSS: every layer MoE, intermediate_size is the per-expert size.

Reading never runs code: JSON only, never `trust_remote_code`; model ids fetch `config.json`
alone through `huggingface_hub` (cached; offline from the cache).
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable
from typing import Any

from ..config import ConfigError
from .hf_attribute_maps import key_value_heads, standard_keys
from .reading import FROM_FILE, FROM_MODEL, Origin, Reading

FRAMEWORKS: tuple[str, ...] = ("hf-config",)
FORMAT = "Hugging Face config.json"

# Family facts: (normalization, gated MLP activation or None, tie default of the class,
# qk_layernorm, biases on q/k/v only, all linear biases).
_GLU_SILU = "silu"
# DeepSeek-V3's architecture with DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5)
_DEEPSEEK_SPARSE = dict(tie=False, glu=True, moe="deepseek", mla=True, qk_norm=True, dsa=True)
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"tie": False, "glu": True},
    "mistral": {"tie": False, "glu": True},
    "mixtral": {"tie": False, "glu": True, "moe": "mixtral"},
    "qwen2": {"tie": False, "glu": True, "qkv_bias": True},
    "qwen2_moe": {"tie": False, "glu": True, "qkv_bias": True, "moe": "qwen"},
    "qwen3": {"tie": False, "glu": True, "qk_norm": True},
    "qwen3_moe": {"tie": False, "glu": True, "qk_norm": True, "moe": "qwen"},
    "gemma": {"tie": True, "glu": True},
    "gemma2": {"tie": True, "glu": True},
    "gemma3_text": {"tie": True, "glu": True, "qk_norm": True},
    # MLA's latent norms (q_a_layernorm, kv_a_layernorm) are Megatron's qk_layernorm
    "deepseek_v2": {"tie": False, "glu": True, "moe": "deepseek", "mla": True, "qk_norm": True},
    "deepseek_v3": {"tie": False, "glu": True, "moe": "deepseek", "mla": True, "qk_norm": True},
    "deepseek_v32": _DEEPSEEK_SPARSE,
    "glm_moe_dsa": _DEEPSEEK_SPARSE,
    "gpt_oss": {"tie": False, "glu": True, "moe": "mixtral", "bias": True},
    "granite": {"tie": True, "glu": True},
    "olmo2": {"tie": False, "glu": True, "qk_norm": True},
    "phi3": {"tie": False, "glu": True},
    # Nemotron: LayerNorm1P (zero-centred gamma), squared-ReLU MLP without a gate.
    "nemotron": {
        "tie": False,
        "glu": False,
        "norm": "LayerNorm",
        "norm_note": "LayerNorm1P (zero-centred gamma)",
    },
    # GPT-2 (modeling_gpt2.py): learned absolute positions (wpe), LayerNorm, a gelu MLP of
    # n_inner (null: 4 * n_embd) without a gate, biases on every Conv1D, dropout resid_pdrop
    # on the residual and attn_pdrop on the attention probabilities, lm_head tied to wte.
    "gpt2": {
        "tie": True,
        "glu": False,
        "norm": "LayerNorm",
        "norm_note": "LayerNorm (ln_1, ln_2, ln_f)",
        "pos": "learned_absolute",
        "bias": True,
        "bias_note": "biases on every linear (Conv1D c_attn, c_proj, c_fc)",
        "ffn_4h": True,
        "dropout": ("resid_pdrop", "attn_pdrop"),
    },
}
# Models whose layers are not a transformer's (state-space or linear-attention mixers beside or
# instead of attention): read, never sized (resolve refuses an estimate)
_NOT_MODELLED = {
    "mamba": "Mamba",
    "mamba2": "Mamba-2",
    "falcon_mamba": "Mamba (Falcon Mamba)",
    "jamba": "Mamba + attention (Jamba)",
    "nemotron_h": "Mamba-2 + attention (Nemotron-H)",
    "bamba": "Mamba-2 + attention (Bamba)",
    "zamba": "Mamba + shared attention (Zamba)",
    "zamba2": "Mamba-2 + shared attention (Zamba2)",
    "falcon_h1": "Mamba-2 + attention (Falcon-H1)",
    "granitemoehybrid": "Mamba-2 + attention (Granite 4.0 hybrid)",
    "qwen3_next": "Gated DeltaNet linear attention + attention (Qwen3-Next)",
}
# `architectures[0]` -> family, for configs whose model_type is their own (remote code).
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
}
# transformers class defaults for keys a hub config.json may leave out.
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208,
        "head_dim": 256,
        "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",  # Gemma3TextConfig's default
    },
    "qwen3": {"head_dim": 128},
    "qwen3_moe": {"head_dim": 128, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen2_moe": {"decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v3": {"moe_layer_freq": 1, "first_k_dense_replace": 3},
    "deepseek_v2": {"moe_layer_freq": 1, "first_k_dense_replace": 0},
    "gpt2": {
        "vocab_size": 50257,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
    },
}
_CLASS_NAMES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "mixtral": "MixtralConfig",
    "qwen2": "Qwen2Config",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3": "Qwen3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "deepseek_v2": "DeepseekV2Config",
    "deepseek_v3": "DeepseekV3Config",
    "gpt_oss": "GptOssConfig",
    "granite": "GraniteConfig",
    "olmo2": "Olmo2Config",
    "phi3": "Phi3Config",
    "nemotron": "NemotronConfig",
    "gpt2": "GPT2Config",
}

# gpt-oss's attention adds a learnable sink to the softmax (Megatron's softmax_type
# "learnable"); Transformer Engine's backend filter (transformer_engine/pytorch/attention/
# dot_product_attention/utils.py @ d0067d0da6: "Filter: Softmax type")
_GPT_OSS_SINKS = (
    "gpt-oss's attention has learnable sinks: FlashAttention does not run them; Transformer "
    "Engine runs them with its cuDNN FusedAttention and falls back to unfused attention (the "
    "[s, s] scores kept per layer) with packed sequences (thd) on cuDNN < 9.18, in "
    "deterministic mode, or with context parallelism other than a2a; the estimate counts a "
    "fused kernel: estimate with --attention unfused for that fallback"
)

# Keys read into fields (the rest of the file goes to `unused`).
_READ_KEYS = frozenset(
    {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "hidden_act",
        "hidden_activation",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "attention_dropout",
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "n_shared_experts",
        "decoder_sparse_step",
        "mlp_only_layers",
        "first_k_dense_replace",
        "moe_layer_freq",
        "scoring_func",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "num_nextn_predict_layers",
        "model_type",
        "text_config",
        "activation_function",
        "resid_pdrop",
        "attn_pdrop",
        "multi_query",
        "new_decoder_architecture",
        "num_kv_heads",
        "n_head_kv",
    }
)

# How each Megatron-Core field is set in a config.json (for the assumptions).
_KEY_FOR = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "ffn_hidden_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "swiglu": "hidden_act",
    "share_embeddings_and_output_weights": "tie_word_embeddings",
    "add_bias_linear": "attention_bias / mlp_bias",
    "num_moe_experts": "num_local_experts / num_experts / n_routed_experts",
    "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "moe_layer_freq": "decoder_sparse_step / mlp_only_layers / first_k_dense_replace",
    "moe_shared_expert_intermediate_size": "shared_expert_intermediate_size / n_shared_experts",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim",
    "qk_pos_emb_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "mtp_num_layers": "num_nextn_predict_layers",
    "seq_length": "the training config's sequence length (not max_position_embeddings)",
    "micro_batch_size": "the training config's micro batch size",
    "bf16": "the training config's precision (not torch_dtype)",
    "fp16": "the training config's precision (not torch_dtype)",
}

OriginFor = Callable[[str], Origin]


# ---------------------------------------------------------------------------------------------
# sniff / read


def _load(text: str, path: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config.json must be a JSON object")
    return data


def _looks_like_hf(data: dict[str, Any]) -> bool:
    if "model_type" in data:
        return True
    if "architectures" in data or "num_hidden_layers" in data:
        return True
    sub = data.get("text_config")
    return isinstance(sub, dict) and "num_hidden_layers" in sub


def sniff(text: str, path: str) -> int:
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        return 0
    try:
        data = json.loads(text)
    except ValueError:
        return 0
    if not isinstance(data, dict) or not _looks_like_hf(data):
        return 0
    name = os.path.basename(path).lower()
    return 95 if name.endswith("config.json") else 80


def _key_lines(text: str) -> Callable[[str], int]:
    """`line_of("text_config.hidden_size")`: the 1-based line of that key in the JSON text
    (the first occurrence after its parent's key; 1 if not found)."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_at(pos: int) -> int:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def line_of(dotted: str) -> int:
        pos = 0
        for part in dotted.split("."):
            match = re.compile(r'"' + re.escape(part) + r'"\s*:').search(text, pos)
            if match is None:
                return 1
            pos = match.start()
        return line_at(pos)

    return line_of


def read(text: str, path: str) -> Reading:
    data = _load(text, path)
    if not _looks_like_hf(data):
        raise ConfigError(
            f"{path}: no model_type, architectures or num_hidden_layers: not a config.json"
        )
    line_of = _key_lines(text)

    def origin_for(key: str) -> Origin:
        return Origin(FROM_FILE, f"{path}:{line_of(key)}", key)

    return _map(data, origin_for, path)


def fields_from_hf(config: dict, where: str) -> Reading:
    """The Megatron-Core fields of a config.json's dict; every value with
    Origin("model", where, hf_key)."""
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: a config.json must be a JSON object")

    def origin_for(key: str) -> Origin:
        return Origin(FROM_MODEL, where, key)

    return _map(config, origin_for, where)


# ---------------------------------------------------------------------------------------------
# the mapping


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def _map(data: dict[str, Any], origin_for: OriginFor, where: str) -> Reading:
    reading = Reading(framework="hf-config", format=FORMAT)
    cfg, prefix = data, ""
    model_type = str(data.get("model_type") or "")
    sub = data.get("text_config")
    if isinstance(sub, dict) and "num_hidden_layers" not in data:
        cfg, prefix = sub, "text_config."
        model_type = str(sub.get("model_type") or model_type)
        for key, value in data.items():
            if key not in ("text_config", "model_type", "tie_word_embeddings"):
                reading.unused[key] = value
    if model_type == "gemma3":  # multimodal wrapper with the text model under text_config
        model_type = "gemma3_text"
    if model_type not in _FAMILIES:
        # remote-code models (`auto_map`) name their own model_type but reuse a known
        # architecture class (Kimi-K2: kimi_k2 with DeepseekV3ForCausalLM): read by the class
        arch = (data.get("architectures") or [""])[0]
        known = _ARCHITECTURES.get(str(arch))
        if known is not None:
            reading.warnings.append(
                f"{where}: model_type {model_type or '(none)'!r} is no transformers family; "
                f"its architecture {arch} is read as {known}"
            )
            model_type = known
    # GPT-2-style names (n_layer, n_embd, n_head, ...) under the standard ones, as transformers'
    # attribute_map reads them; `written` says which key of the file each came from
    as_written = cfg
    cfg, written = standard_keys(cfg, model_type)
    family = _FAMILIES.get(model_type)
    fam_name = model_type or "unknown"
    cls = _CLASS_NAMES.get(model_type, "PretrainedConfig")
    defaults = _CLASS_DEFAULTS.get(model_type, {})

    def has(key: str) -> bool:
        return key in cfg or key in defaults

    def get(key: str, default: Any = None) -> Any:
        return cfg[key] if key in cfg else defaults.get(key, default)

    def org(key: str) -> Origin:
        if key in cfg:
            return origin_for(prefix + written.get(key, key))
        if key in defaults:
            return Origin("default", f"transformers {cls} default", key)
        return origin_for(prefix + key)

    def fact(field: str, value: Any, note: str) -> None:
        reading.set(
            field, value, Origin(FROM_MODEL, where, "", note=f"{fam_name} architecture: {note}")
        )

    def put(field: str, key: str, value: Any, note: str = "") -> None:
        base = org(key)
        reading.set(field, value, Origin(base.kind, base.where, base.key, note=note))

    # Keys not read go to unused, as written.
    read_aliases = {alias for key, alias in written.items() if key in _READ_KEYS}
    for key, value in as_written.items():
        if key not in _READ_KEYS and key not in read_aliases:
            reading.unused[prefix + key] = value
    # (Qwen2 / Qwen1.5 write a window with use_sliding_window false: no local layers then)
    if cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False:
        # local (sliding-window) attention layers: a fused kernel keeps O(s) for them as for
        # global layers (counted so); an eager / unfused one builds the whole s x s scores
        # and masks them (transformers' eager_attention_forward), as it does for global ones
        reading.warnings.append(
            f"{where}: sliding_window={cfg['sliding_window']}: the local attention layers are "
            "counted as global ones (a fused kernel keeps O(s) for both; eager attention "
            "masks full s x s scores in both); sdpa's materialized [b, 1, s, s] window mask "
            "is not counted"
        )
    if "max_position_embeddings" in cfg:
        pos_key = written.get("max_position_embeddings", "max_position_embeddings")
        reading.warnings.append(
            f"{where}: {pos_key}={cfg['max_position_embeddings']} is the model's "
            "capacity, not the training sequence length (not used as seq_length)"
        )
    if model_type in _NOT_MODELLED:
        reading.not_modelled.append(
            f"{where}: model_type {model_type!r}, {_NOT_MODELLED[model_type]} layers"
        )
    elif family is None:
        reading.warnings.append(
            f"{where}: model_type {model_type or '(none)'!r} is not a family recompute-kit knows: "
            "normalization, MLP gating, biases and qk-norm are not set from it"
        )

    # Shape
    for field, key in (
        ("num_layers", "num_hidden_layers"),
        ("hidden_size", "hidden_size"),
        ("num_attention_heads", "num_attention_heads"),
        ("vocab_size", "vocab_size"),
    ):
        if has(key):
            put(field, key, _int(get(key), prefix + key, where))
    heads = reading.get("num_attention_heads")
    hidden = reading.get("hidden_size")
    if has("num_key_value_heads") and get("num_key_value_heads") is not None:
        put(
            "num_query_groups",
            "num_key_value_heads",
            _int(get("num_key_value_heads"), "num_key_value_heads", where),
        )
    elif heads is not None and (kv := key_value_heads(cfg, model_type)) is not None:
        groups, kv_key, why = kv
        put("num_query_groups", kv_key, _int(groups, kv_key, where), note=why)
    elif heads is not None:
        reading.set(
            "num_query_groups",
            heads,
            Origin(
                "default",
                f"transformers {cls} default",
                "num_key_value_heads",
                note="num_key_value_heads absent: = num_attention_heads (MHA)",
            ),
        )

    mla = bool(family and family.get("mla")) or (
        "kv_lora_rank" in cfg and "qk_rope_head_dim" in cfg
    )
    if mla:
        fact("multi_latent_attention", True, "multi-latent attention (kv_lora_rank)")
        q_rank = get("q_lora_rank")
        put(
            "q_lora_rank",
            "q_lora_rank",
            None if not q_rank else _int(q_rank, "q_lora_rank", where),
            note="null: plain q_proj, no query compression" if not q_rank else "",
        )
        for field, key in (
            ("kv_lora_rank", "kv_lora_rank"),
            ("qk_head_dim", "qk_nope_head_dim"),
            ("qk_pos_emb_head_dim", "qk_rope_head_dim"),
            ("v_head_dim", "v_head_dim"),
        ):
            if has(key):
                put(field, key, _int(get(key), key, where))
        if "head_dim" in cfg:
            reading.unused[prefix + "head_dim"] = cfg["head_dim"]
        if hidden and heads:
            reading.derive(
                "kv_channels",
                hidden // heads,
                "hidden_size // num_attention_heads (Megatron's rule; MLA uses qk/v head dims)",
            )
    else:
        fact("multi_latent_attention", False, "standard attention")
        if has("head_dim") and get("head_dim") is not None:
            put("kv_channels", "head_dim", _int(get("head_dim"), "head_dim", where))
        elif hidden and heads:
            reading.derive(
                "kv_channels",
                hidden // heads,
                "head_dim absent: hidden_size // num_attention_heads (the HF class's rule)",
            )

    # MLP
    if "intermediate_size" in cfg:
        put(
            "ffn_hidden_size",
            "intermediate_size",
            _int(cfg["intermediate_size"], "intermediate_size", where),
        )
    act_keys = ("hidden_activation", "hidden_act", "activation_function")
    act_key = next((k for k in act_keys if k in cfg), None)
    act_key = act_key or next((k for k in act_keys if k in defaults), "hidden_act")
    act = get(act_key) if act_key in cfg or act_key in defaults else None
    if act is None and "activation_function" in defaults:
        act_key, act = "activation_function", defaults["activation_function"]
    if family is not None:
        if family.get("glu"):
            if act is None or str(act) in ("silu", "swish"):
                if act is None:
                    fact("swiglu", True, "gated MLP with silu (SwiGLU)")
                else:
                    put(
                        "swiglu",
                        act_key,
                        True,
                        note=f"{fam_name} architecture: {act} in a gated MLP = SwiGLU",
                    )
            elif "gelu" in str(act):
                put(
                    "swiglu",
                    act_key,
                    True,
                    note=f"{fam_name} architecture: {act} in a gated MLP (GeGLU), "
                    "counted as SwiGLU (same memory)",
                )
            else:
                put(
                    "swiglu",
                    act_key,
                    True,
                    note=f"{fam_name} architecture: gated MLP with {act}, "
                    "counted as SwiGLU (same memory)",
                )
            if model_type == "gpt_oss":
                reading.warnings.append(_GPT_OSS_SINKS)
                reading.origins["swiglu"] = Origin(
                    reading.origins["swiglu"].kind,
                    reading.origins["swiglu"].where,
                    reading.origins["swiglu"].key,
                    note="gpt_oss architecture: gated MLP, clamped SwiGLU "
                    "(alpha 1.702, swiglu_limit)",
                )
        else:
            fact("swiglu", False, f"ungated MLP ({act or 'relu2'})")
        fact("normalization", family.get("norm", "RMSNorm"), family.get("norm_note", "RMSNorm"))
        position = family.get("pos", "rope")
        fact(
            "position_embedding_type",
            position,
            "learned absolute position embeddings (wpe)"
            if position == "learned_absolute"
            else "rotary position embeddings",
        )
        if family.get("ffn_4h") and hidden and "intermediate_size" not in cfg:
            reading.set(
                "ffn_hidden_size",
                4 * hidden,
                Origin(
                    FROM_MODEL, where, "n_inner", note=f"{fam_name} architecture: null = 4 * n_embd"
                ),
            )
        norms = "RMSNorm on q and k (q_norm/k_norm)"
        if family.get("mla"):
            norms = "MLA's latent norms (q_a_layernorm, kv_a_layernorm), Megatron's qk_layernorm"
        fact(
            "qk_layernorm",
            bool(family.get("qk_norm")),
            norms if family.get("qk_norm") else "no q/k norm",
        )
        if family.get("dsa") or "index_topk" in cfg:  # DeepSeek-V3.2, GLM-5
            said = (
                f" (index_topk {cfg['index_topk']}, index_n_heads {cfg.get('index_n_heads')})"
                if "index_topk" in cfg
                else f" (model_type {model_type!r})"
            )
            reading.warnings.append(
                f"{where}: DeepSeek sparse attention{said} is not modelled: attention is "
                "counted (memory and FLOPs) as MLA's dense attention, and the indexer's "
                "weights and activations are left out"
            )
        if family.get("dropout"):
            residual, attention = family["dropout"]
            put("hidden_dropout", residual, float(get(residual)))
            put("attention_dropout", attention, float(get(attention)))
        else:
            reading.set(
                "hidden_dropout",
                0.0,
                Origin(FROM_MODEL, where, "", note=f"{fam_name} architecture: no residual dropout"),
            )
            # (the config's own attention_dropout, read below, wins: older configs, Llama-2's,
            # have none, and transformers' class then has 0.0, never Megatron's 0.1)
            reading.set(
                "attention_dropout",
                0.0,
                Origin(
                    "default",
                    f"transformers {cls} default",
                    "attention_dropout",
                    note=f"{fam_name} architecture: attention_dropout defaults to 0.0",
                ),
            )
        _biases(reading, cfg, family, fam_name, where, origin_for, prefix)
        tie_key = "tie_word_embeddings"
        if tie_key in data and prefix:
            reading.set(
                "share_embeddings_and_output_weights", bool(data[tie_key]), origin_for(tie_key)
            )
        elif tie_key in cfg:
            put("share_embeddings_and_output_weights", tie_key, bool(cfg[tie_key]))
        else:
            reading.set(
                "share_embeddings_and_output_weights",
                family["tie"],
                Origin(
                    "default",
                    f"transformers {cls} default",
                    tie_key,
                    note=f"{fam_name} architecture: tie_word_embeddings "
                    f"defaults to {family['tie']}",
                ),
            )
    elif "tie_word_embeddings" in cfg:
        put(
            "share_embeddings_and_output_weights",
            "tie_word_embeddings",
            bool(cfg["tie_word_embeddings"]),
        )
    if "attention_dropout" in cfg and isinstance(cfg["attention_dropout"], (int, float)):
        put("attention_dropout", "attention_dropout", float(cfg["attention_dropout"]))

    _moe(reading, cfg, family, fam_name, model_type, where, get, has, put, fact)
    return reading


def _biases(
    reading: Reading,
    cfg: dict,
    family: dict,
    fam_name: str,
    where: str,
    origin_for: OriginFor,
    prefix: str,
) -> None:
    attn = cfg.get("attention_bias")
    mlp = cfg.get("mlp_bias")
    if family.get("bias"):  # gpt-oss: attention_bias True, experts and router with biases
        key = "attention_bias" if "attention_bias" in cfg else ""
        reading.set(
            "add_bias_linear",
            bool(attn) if attn is not None else True,
            Origin(
                origin_for(prefix + key).kind if key else FROM_MODEL,
                origin_for(prefix + key).where if key else where,
                key,
                note=f"{fam_name} architecture: "
                + family.get("bias_note", "biases on attention and expert linears"),
            ),
        )
        return
    if family.get("qkv_bias"):
        reading.set(
            "add_bias_linear",
            False,
            Origin(
                FROM_MODEL,
                where,
                "",
                note=f"{fam_name} architecture: no bias on o_proj and the MLP; q/k/v carry biases "
                "(Megatron add_qkv_bias, not modelled: a few hidden-size vectors)",
            ),
        )
        return
    if attn is None and mlp is None:
        reading.set(
            "add_bias_linear",
            False,
            Origin(
                FROM_MODEL, where, "", note=f"{fam_name} architecture: no bias on any linear layer"
            ),
        )
        return
    value = bool(mlp) if mlp is not None else bool(attn)
    key = "mlp_bias" if mlp is not None else "attention_bias"
    base = origin_for(prefix + key)
    reading.set("add_bias_linear", value, Origin(base.kind, base.where, base.key))
    if attn is not None and mlp is not None and bool(attn) != bool(mlp):
        reading.warnings.append(
            f"{where}: attention_bias={attn} but mlp_bias={mlp}: Megatron's add_bias_linear "
            f"covers both; read as {value} (the MLP's)"
        )


def _moe(
    reading: Reading,
    cfg: dict,
    family: dict | None,
    fam_name: str,
    model_type: str,
    where: str,
    get: Callable,
    has: Callable,
    put: Callable,
    fact: Callable,
) -> None:
    expert_key = next(
        (k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)), None
    )
    if expert_key is None:
        if family is not None:
            fact("num_moe_experts", None, "dense MLP, no experts")
        return
    num_layers = reading.get("num_layers")
    put("num_moe_experts", expert_key, _int(cfg[expert_key], expert_key, where))
    topk_key = next((k for k in ("num_experts_per_tok", "experts_per_token") if k in cfg), None)
    if topk_key:
        put("moe_router_topk", topk_key, _int(cfg[topk_key], topk_key, where))
    kind = (family or {}).get("moe")
    if kind is None:
        kind = (
            "deepseek"
            if expert_key == "n_routed_experts"
            else ("qwen" if "decoder_sparse_step" in cfg else "mixtral")
        )
    if kind == "mixtral":
        if "intermediate_size" in cfg:
            put(
                "moe_ffn_hidden_size",
                "intermediate_size",
                _int(cfg["intermediate_size"], "intermediate_size", where),
                note="per-expert FFN size",
            )
        fact("moe_layer_freq", 1, "every layer is MoE")
        fact("moe_shared_expert_intermediate_size", None, "no shared expert")
        return
    if "moe_intermediate_size" in cfg:
        put(
            "moe_ffn_hidden_size",
            "moe_intermediate_size",
            _int(cfg["moe_intermediate_size"], "moe_intermediate_size", where),
        )
    if num_layers is None:
        return
    if kind == "qwen":
        step = _int(get("decoder_sparse_step", 1), "decoder_sparse_step", where) or 1
        only = set(get("mlp_only_layers", []) or [])
        flags = [int(i not in only and (i + 1) % step == 0) for i in range(num_layers)]
        key = (
            "decoder_sparse_step"
            if "decoder_sparse_step" in cfg or "mlp_only_layers" not in cfg
            else "mlp_only_layers"
        )
        put(
            "moe_layer_freq",
            key,
            1 if all(flags) else flags,
            note="layer i MoE iff i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0",
        )
        if cfg.get("shared_expert_intermediate_size"):
            put(
                "moe_shared_expert_intermediate_size",
                "shared_expert_intermediate_size",
                _int(
                    cfg["shared_expert_intermediate_size"], "shared_expert_intermediate_size", where
                ),
            )
        else:
            fact("moe_shared_expert_intermediate_size", None, "no shared expert")
        return
    # deepseek
    k = _int(get("first_k_dense_replace", 0) or 0, "first_k_dense_replace", where)
    freq = _int(get("moe_layer_freq", 1) or 1, "moe_layer_freq", where)
    flags = [int(i >= k and i % freq == 0) for i in range(num_layers)]
    put(
        "moe_layer_freq",
        "first_k_dense_replace",
        1 if all(flags) else flags,
        note=f"first {k} layers dense, then MoE every {freq} layer(s)",
    )
    shared = get("n_shared_experts")
    moe_ffn = reading.get("moe_ffn_hidden_size")
    if shared and moe_ffn:
        put(
            "moe_shared_expert_intermediate_size",
            "n_shared_experts",
            _int(shared, "n_shared_experts", where) * moe_ffn,
            note="n_shared_experts * moe_intermediate_size",
        )
    else:
        fact("moe_shared_expert_intermediate_size", None, "no shared expert")
    if cfg.get("scoring_func") in ("sigmoid", "softmax"):
        put("moe_router_score_function", "scoring_func", cfg["scoring_func"])
    if "num_nextn_predict_layers" in cfg:
        layers = _int(cfg["num_nextn_predict_layers"], "num_nextn_predict_layers", where)
        put(
            "mtp_num_layers",
            "num_nextn_predict_layers",
            layers or None,  # Megatron-Core: None = no MTP block
            note="multi-token-prediction layers (Megatron-Bridge maps them to mtp_num_layers)",
        )


# ---------------------------------------------------------------------------------------------
# defaults and key names


def apply_defaults(reading: Reading) -> None:
    """A config.json decides only the model: the HF classes' rules for what it leaves out.
    Training values (seq_length, micro batch, precision, parallelism) stay unset: the
    resolver says they are assumed (`key_for`)."""
    heads = reading.get("num_attention_heads")
    hidden = reading.get("hidden_size")
    if heads and "num_query_groups" not in reading:
        reading.default(
            "num_query_groups", heads, "transformers' default (num_key_value_heads absent: MHA)"
        )
    if heads and hidden and "kv_channels" not in reading:
        reading.derive(
            "kv_channels",
            hidden // heads,
            "hidden_size // num_attention_heads (the HF class's rule)",
        )


def key_for(field: str) -> str:
    return _KEY_FOR.get(field, f"{field} (not in a config.json: set by the training config)")


# ---------------------------------------------------------------------------------------------
# model ids


def _nearest(model_id: str) -> str:
    """`, or --model X` for the registered model whose id is closest (another release of the
    same family and size), said as a suggestion to check, never used silently."""
    import difflib

    from .registry import list_models

    ids = [i for i, _ in list_models()]
    # another release of a registered model: Qwen/Qwen3-4B-Instruct-2507 -> Qwen/Qwen3-4B
    releases = [i for i in ids if model_id.lower().startswith(i.lower() + "-")]
    # never another size: Llama-3.3-70B is nearer Meta-Llama-3.1-70B than Llama-3.2-1B
    size = set(_SIZE_RE.findall(model_id.lower()))
    same = [i for i in ids if not size or size & set(_SIZE_RE.findall(i.lower()))]
    close = releases or difflib.get_close_matches(model_id, same, n=1, cutoff=0.6 if size else 0.8)
    best = max(close, key=len) if close else None
    return f", or --model {best} if it has the same architecture" if best else ""


# a model size in an id: 70b, 1.5b, 8x7b, a3b (active parameters), 350m
_SIZE_RE = re.compile(r"(?<![a-z0-9.])(?:\d+x)?\d+(?:\.\d+)?[bm](?![a-z0-9])")


def read_model_id(model_id: str) -> Reading:
    """A Hugging Face model id: the registry first, else `config.json` (only that file) from the
    Hub through huggingface_hub's cache (offline from the cache when the network fails)."""
    from .registry import model_reading

    known = model_reading(model_id)
    if known is not None:
        return known
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ConfigError(
            f"{model_id}: not in recompute-kit's model registry; `pip install recompute-kit[hub]` "
            "to fetch its config.json, or pass the config.json path"
        ) from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    path = None
    errors: list[str] = []
    # The cache first: it answers offline at once (the Hub client retries a dead network for
    # tens of seconds), and a config.json fetched once is read the same way ever after.
    for local_only in (True,) if offline else (True, False):
        if not local_only and not _hub_resolves():
            errors.append("no network: the Hub's host does not resolve")
            break  # (the Hub client would retry a dead network for about 25 s, logging each)
        try:
            path = hf_hub_download(
                repo_id=model_id, filename="config.json", local_files_only=local_only
            )
            break
        except Exception as exc:  # network, gated repo, not cached: try the cache, then say so
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if path is None:
        raise ConfigError(
            f"{model_id}: not in the registry, and its config.json could not be had from the "
            f"Hugging Face Hub or its cache ({errors[-1].split(':')[0]}); pass the config.json "
            f"path{_nearest(model_id)}"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{model_id}: cannot read the cached config.json ({exc})") from None
    data = _load(text, f"{model_id} config.json")
    reading = fields_from_hf(data, f"{model_id} config.json (Hugging Face Hub)")
    reading.model_name = model_id
    reading.model_name_origin = Origin("argument", "model id", model_id)
    return reading


def _hub_resolves() -> bool:
    """Whether the Hub's host name resolves (HF_ENDPOINT, else huggingface.co): a machine
    without a network (a cluster's compute node) is told at once, not after the retries."""
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    host = urlparse(endpoint).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True
