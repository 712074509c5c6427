"""config.json files that write their shape under GPT-2-style names (transformers'
attribute_map: n_layer, n_embd, n_head, n_positions, n_inner; Bloom/Falcon's n_embed)."""

from __future__ import annotations

import json

from recompute_kit.sources.formats import read_file_text
from recompute_kit.sources.resolve import resolve

# openai-community/gpt2-large's config.json
# (https://huggingface.co/openai-community/gpt2-large/blob/main/config.json), its keys as the
# hub file writes them
GPT2_LARGE = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 1280,
    "n_head": 20,
    "n_layer": 36,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}


def _read(config: dict, name: str = "config.json"):
    return read_file_text(json.dumps(config, indent=2), name)


def test_gpt2_names_give_the_shape_and_gpt2_is_a_known_family():
    r = _read(GPT2_LARGE)
    assert (r.get("num_layers"), r.get("hidden_size"), r.get("num_attention_heads")) == (
        36,
        1280,
        20,
    )
    assert r.origins["num_layers"].key == "n_layer"
    assert r.origins["hidden_size"].key == "n_embd"
    assert r.get("ffn_hidden_size") == 4 * 1280  # n_inner absent: 4 * n_embd
    assert r.get("position_embedding_type") == "learned_absolute"
    assert (r.get("normalization"), r.get("swiglu")) == ("LayerNorm", False)
    assert r.get("add_bias_linear") is True
    assert r.get("share_embeddings_and_output_weights") is True
    assert (r.get("hidden_dropout"), r.get("attention_dropout")) == (0.1, 0.1)
    assert "n_layer" not in r.unused and r.unused["n_positions"] == 1024
    assert not any("not a family" in w for w in r.warnings)


def test_read_and_estimate_agree_on_gpt2_positions(tmp_path):
    # the trial's GPT-2 2.5B config (issue #60's model): `read` said learned_absolute (the
    # Megatron default of a shapeless reading) while `estimate` assumed rope for a gpt2 family
    # it did not know; GPT-2 has learned absolute positions (wpe)
    trial = {
        "model_type": "gpt2",
        "n_layer": 54,
        "n_embd": 1920,
        "n_head": 20,
        "n_positions": 1024,
        "n_ctx": 1024,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
    }
    standard = {
        "model_type": "gpt2",
        "num_hidden_layers": 54,
        "hidden_size": 1920,
        "num_attention_heads": 20,
        "intermediate_size": 7680,
        "max_position_embeddings": 1024,
        "vocab_size": 50257,
    }
    for config in (trial, standard):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        shown = resolve([str(path)], require_shape=False).reading
        estimated = resolve([str(path)])
        assert shown.get("position_embedding_type") == "learned_absolute"
        assert estimated.config.model.position_embedding_type == "learned_absolute"
        assert estimated.config.model.ffn_hidden_size == 7680
        assert estimated.config.model.num_layers == 54


def test_bloom_and_falcon_names_and_multi_query_heads():
    # BloomConfig / FalconConfig: n_layer, n_head (attribute_map) and n_embed (kept by
    # __init__ for backward compatibility)
    bloom = _read({"model_type": "bloom", "n_layer": 70, "n_head": 112, "n_embed": 14336})
    assert (bloom.get("num_layers"), bloom.get("num_attention_heads")) == (70, 112)
    assert bloom.get("hidden_size") == 14336 and bloom.origins["hidden_size"].key == "n_embed"
    assert bloom.get("num_query_groups") == 112
    # Falcon-7B: multi-query attention (one key/value head) without the new decoder
    falcon = {"model_type": "falcon", "n_layer": 32, "n_head": 71, "hidden_size": 4544}
    r = _read(dict(falcon, multi_query=True))
    assert (r.get("num_layers"), r.get("num_query_groups")) == (32, 1)
    assert r.origins["num_query_groups"].key == "multi_query"
    # the new decoder (Falcon-40B): n_head_kv key/value heads
    r = _read(dict(falcon, new_decoder_architecture=True, n_head_kv=8))
    assert r.get("num_query_groups") == 8
    # GPTBigCode (StarCoder): GPT-2's names, multi-query by default
    r = _read({"model_type": "gpt_bigcode", "n_layer": 40, "n_embd": 6144, "n_head": 48})
    assert (r.get("num_layers"), r.get("hidden_size"), r.get("num_query_groups")) == (40, 6144, 1)


def test_standard_names_win_over_the_aliases():
    r = _read({"model_type": "falcon", "num_hidden_layers": 60, "n_layer": 32, "n_head": 8})
    assert r.get("num_layers") == 60 and r.origins["num_layers"].key == "num_hidden_layers"
