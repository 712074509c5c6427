"""The names GPT-2-style families write a config.json's shape under, as transformers maps them.

transformers reads `config.num_hidden_layers` of every model; a class whose config.json writes
`n_layer` declares `attribute_map = {"num_hidden_layers": "n_layer", ...}` and the attribute is
read through it. Each table below is that class's `attribute_map` (quoted from transformers'
`src/transformers/models/<family>/configuration_<family>.py`), plus the keys its `__init__`
takes under another name, said beside it. `standard_keys` gives a config dict its keys under
the standard names the reader maps (`num_hidden_layers`, `hidden_size`, ...), and which key of
the file each came from.
"""

from __future__ import annotations

from typing import Any

# GPT2Config.attribute_map = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
#     "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
# and n_inner: "Dimensionality of the inner feed-forward layers. `None` will set it to 4 times
# n_embd" (GPT2MLP's intermediate size, read as intermediate_size when it is a number).
_GPT2 = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
    "intermediate_size": "n_inner",
}
# BloomConfig.attribute_map = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
# and its __post_init__: `n_embed = kwargs.pop("n_embed", None); self.hidden_size =
# self.hidden_size if n_embed is None else n_embed` (bigscience's config.json writes n_embed).
# FalconConfig.attribute_map is the same two, with the same "Backward compatibility with n_embed
# kwarg" in its __init__.
_BLOOM = {
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "hidden_size": "n_embed",
}
ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {
    "gpt2": _GPT2,
    # GPTJConfig.attribute_map: GPT-2's four, the same names; n_inner as GPT-2's
    "gptj": _GPT2,
    # GPTBigCodeConfig.attribute_map: GPT-2's four, the same names; n_inner as GPT-2's
    "gpt_bigcode": _GPT2,
    "bloom": _BLOOM,
    "falcon": _BLOOM,
}


def standard_keys(cfg: dict[str, Any], model_type: str) -> tuple[dict[str, Any], dict[str, str]]:
    """`cfg` with each key its family writes under another name (`n_layer`) also under the
    standard name (`num_hidden_layers`) where that is absent or null, and {standard: written}
    for those. Other families' configs are returned as they are."""
    aliases = ATTRIBUTE_MAPS.get(model_type)
    if not aliases:
        return cfg, {}
    out = dict(cfg)
    written: dict[str, str] = {}
    for standard, alias in aliases.items():
        if out.get(standard) is None and out.get(alias) is not None:
            out[standard] = out[alias]
            written[standard] = alias
    return out, written


def key_value_heads(cfg: dict[str, Any], model_type: str) -> tuple[int, str, str] | None:
    """(key/value heads, the key that decides it, why) for the multi-query families that do
    not write num_key_value_heads; None for the others.

    - gpt_bigcode: GPTBigCodeAttention `self.kv_heads = 1 if self.multi_query else
      self.num_heads` (multi_query defaults to True);
    - falcon: FalconAttention keeps `num_kv_heads` heads with `new_decoder_architecture` or
      without `multi_query`, else 1 (multi_query defaults to True); `num_kv_heads` was
      `n_head_kv` in older configs."""
    heads = cfg.get("num_attention_heads")
    if model_type == "gpt_bigcode":
        mq = cfg.get("multi_query", True)
        return (1, "multi_query", "multi-query attention") if mq else (heads, "multi_query", "")
    if model_type == "falcon":
        if cfg.get("new_decoder_architecture") or not cfg.get("multi_query", True):
            for key in ("num_kv_heads", "n_head_kv"):
                if cfg.get(key) is not None:
                    return cfg[key], key, "grouped key/value heads"
            return heads, "num_attention_heads", "num_kv_heads absent: one per head"
        return 1, "multi_query", "multi-query attention (new_decoder_architecture off)"
    return None
