"""The Hugging Face config.json reader, the model registry and model ids (no network)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources import hf_config, registry
from recompute_kit.sources.formats import best_format

CORPUS = Path(__file__).parent / "corpus" / "hf_config"
sys.path.insert(0, str(Path(__file__).parent))

EXPECTS = sorted(CORPUS.glob("*.expect.yaml"))


def _artefact(expect: Path) -> Path:
    return expect.with_name(expect.name.replace(".expect.yaml", ".json"))


def test_format_dispatch_picks_hf_config():
    path = CORPUS / "meta-llama--Meta-Llama-3.1-8B.config.json"
    assert best_format(path.read_text(), str(path)) is hf_config


def test_max_position_embeddings_and_dtype_are_not_training_values():
    # https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/aic-core/src/aiconfigurator_core/model_configs/meta-llama--Meta-Llama-3.1-8B_config.json
    path = CORPUS / "meta-llama--Meta-Llama-3.1-8B.config.json"
    reading = hf_config.read(path.read_text(), str(path))
    assert "seq_length" not in reading and "bf16" not in reading
    assert reading.unused["max_position_embeddings"] == 131072
    assert reading.unused["torch_dtype"] == "bfloat16"
    assert any("max_position_embeddings" in w for w in reading.warnings)
    assert "not max_position_embeddings" in hf_config.key_for("seq_length")


def test_family_facts_are_said():
    path = CORPUS / "Qwen--Qwen2.5-7B.config.json"
    reading = hf_config.read(path.read_text(), str(path))
    for key in ("normalization", "position_embedding_type", "qk_layernorm", "add_bias_linear"):
        origin = reading.origins[key]
        assert origin.kind == "model" and origin.note.startswith("qwen2 architecture:"), key
    assert "q/k/v" in reading.origins["add_bias_linear"].note
    assert reading.origins["swiglu"].key == "hidden_act"


def test_qwen_moe_decoder_sparse_step_phase():
    # Qwen2MoeDecoderLayer: MoE iff i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0
    # (transformers models/qwen2_moe/modeling_qwen2_moe.py); Megatron's int freq: other phase.
    cfg = json.loads((CORPUS / "Qwen--Qwen3-30B-A3B.config.json").read_text())
    cfg.update(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    reading = hf_config.fields_from_hf(cfg, "test")
    assert reading.values["moe_layer_freq"] == [0, 1, 0, 0, 0, 1]
    cfg.update(decoder_sparse_step=1, mlp_only_layers=[0])
    assert hf_config.fields_from_hf(cfg, "test").values["moe_layer_freq"] == [0, 1, 1, 1, 1, 1]


def test_deepseek_mla_and_dense_prefix():
    # https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/aic-core/src/aiconfigurator_core/model_configs/deepseek-ai--DeepSeek-V3_config.json
    cfg = json.loads((CORPUS / "deepseek-ai--DeepSeek-V3.config.json").read_text())
    cfg.update(q_lora_rank=None, head_dim=64)  # V2-Lite style: null q_lora_rank; HF head_dim
    reading = hf_config.fields_from_hf(cfg, "test")
    assert reading.values["q_lora_rank"] is None
    assert reading.values["qk_head_dim"] == 128 and reading.values["qk_pos_emb_head_dim"] == 64
    assert reading.values["kv_channels"] != 64  # HF's head_dim (= qk_rope_head_dim) ignored
    assert reading.unused["head_dim"] == 64
    freq = reading.values["moe_layer_freq"]
    assert freq[:3] == [0, 0, 0] and all(freq[3:]) and len(freq) == 61


def test_gemma3_text_config_and_class_defaults():
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "head_dim": 128,
        },
        "vision_config": {"hidden_size": 1152},
    }
    reading = hf_config.fields_from_hf(cfg, "test")
    assert reading.values["num_layers"] == 62 and reading.values["kv_channels"] == 128
    assert reading.origins["num_layers"].key == "text_config.num_hidden_layers"
    assert reading.values["vocab_size"] == 262_208  # Gemma3TextConfig default
    assert reading.origins["vocab_size"].kind == "default"
    assert reading.values["qk_layernorm"] is True
    assert reading.values["share_embeddings_and_output_weights"] is True
    assert "GeGLU" not in reading.origins["swiglu"].note or reading.values["swiglu"]
    assert "vision_config" in reading.unused


def test_text_config_lines_point_into_the_nested_object():
    text = (
        '{\n  "model_type": "gemma3",\n  "text_config": {\n    "hidden_size": 64,\n'
        '    "num_hidden_layers": 2,\n    "num_attention_heads": 4\n  },\n  "hidden_size": 9\n}\n'
    )
    reading = hf_config.read(text, "c.json")
    assert reading.origins["hidden_size"].where == "c.json:4"


def test_bad_input_is_one_line_config_error():
    with pytest.raises(ConfigError, match="not valid JSON"):
        hf_config.read("{ nope", "x/config.json")
    with pytest.raises(ConfigError, match="integer"):
        hf_config.read('{"model_type": "llama", "num_hidden_layers": "32"}', "c.json")
    assert hf_config.sniff('{"zero_optimization": {"stage": 3}}', "ds.json") == 0


def test_registry_lookup_by_id_alias_and_short_name():
    by_id = registry.model_reading("Qwen/Qwen3-30B-A3B")
    assert by_id is not None and by_id.values["num_moe_experts"] == 128
    assert registry.model_reading("qwen/qwen3-30b-a3b").values == by_id.values
    assert registry.model_reading("Qwen3-30B-A3B").values == by_id.values
    assert registry.model_reading("qwen3-30b-a3b").model_name == "Qwen/Qwen3-30B-A3B"
    assert registry.model_reading("deepseek-v3").values["multi_latent_attention"] is True
    assert registry.model_reading("mixtral-8x7b").values["moe_router_topk"] == 2
    assert registry.model_reading("gpt3-175b") is None
    origin = by_id.origins["num_layers"]
    assert (
        origin.kind == "model"
        and "github.com" in origin.where
        and origin.key == "num_hidden_layers"
    )


def test_registry_entries_all_read_and_cite_a_source():
    models = registry.list_models()
    assert len(models) >= 20
    for model_id, source in models:
        assert source.startswith("https://github.com/"), model_id
        reading = registry.model_reading(model_id)
        for key in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "ffn_hidden_size",
            "normalization",
            "swiglu",
            "kv_channels",
        ):
            assert key in reading, (model_id, key)
        assert "seq_length" not in reading


def test_model_id_from_registry_needs_no_hub():
    assert hf_config.read_model_id("meta-llama/Meta-Llama-3.1-70B").values["num_layers"] == 80


def _fake_hub_cache(root: Path, repo: str, config: dict) -> None:
    base = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))


def test_model_id_from_the_hub_cache_offline(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 3,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    _fake_hub_cache(tmp_path, "someone/tiny-llama", cfg)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    reading = hf_config.read_model_id("someone/tiny-llama")
    assert reading.values["num_layers"] == 3 and reading.values["kv_channels"] == 16
    assert reading.model_name == "someone/tiny-llama"
    with pytest.raises(ConfigError, match=r"config\.json"):
        hf_config.read_model_id("someone/not-cached")


def test_model_id_falls_back_to_the_cache_when_the_network_fails(monkeypatch, tmp_path):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
            }
        )
    )
    calls = []

    def fake(repo_id, filename, local_files_only=False, **_):
        calls.append((repo_id, filename, local_files_only))
        if not local_files_only:
            raise OSError("network unreachable")
        return str(config)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    reading = hf_config.read_model_id("someone/qwen3-tiny")
    assert calls == [("someone/qwen3-tiny", "config.json", True)]  # the cache answers first
    assert reading.values["kv_channels"] == 128  # Qwen3Config's head_dim default


def test_model_id_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ConfigError, match=r"recompute-kit\[hub\]"):
        hf_config.read_model_id("someone/unknown-model")


def test_model_id_without_a_network_is_said_at_once(monkeypatch):
    # a cluster's compute node has no network: the Hub client would retry for about 25 s,
    # logging each try; a host name that does not resolve ends it before the first request
    pytest.importorskip("huggingface_hub")
    import huggingface_hub

    calls = []

    def fake(repo_id, filename, local_files_only=False, **_):
        calls.append(local_files_only)
        raise OSError("not cached")

    def no_dns(*_args, **_kwargs):
        raise OSError("Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    monkeypatch.setattr(hf_config.socket, "getaddrinfo", no_dns)
    with pytest.raises(ConfigError, match="no network"):
        hf_config.read_model_id("someone/not-cached")
    assert calls == [True]  # the cache only: never the Hub


def test_the_nearest_registered_model_is_never_another_size():
    # a skill trial: Llama-3.3-70B-Instruct was offered Llama-3.2-1B-Instruct "if it has the
    # same architecture"; the registry's 70B is the one to name, and none where no size matches
    said = hf_config._nearest("meta-llama/Llama-3.3-70B-Instruct")
    assert "70B" in said and "1B" not in said
    assert "Qwen/Qwen3-4B " in hf_config._nearest("Qwen/Qwen3-4B-Instruct-2507") + " "
    assert hf_config._nearest("google/gemma-4-31B-it") == ""


def test_packing_says_whether_the_sequence_length_is_the_runs_or_a_bound(tmp_path):
    # alignment-handbook's zephyr-7b-beta config_full.yaml (tests/sources/corpus/hf_trainer)
    # with TRL's packing: true / false (a skill trial: packing was listed unused)
    from recompute_kit.sources.resolve import resolve

    corpus = Path(__file__).parent / "corpus" / "hf_trainer"
    text = (corpus / "zephyr-7b-beta_sft_config_full.yaml").read_text()
    for packing, said in (("true", "every row holds seq_length tokens"), ("false", "worst case")):
        path = tmp_path / f"sft_{packing}.yaml"
        path.write_text(text.rstrip("\n") + f"\npacking: {packing}\n")
        r = resolve([str(path)], require_shape=False)
        assert said in r.reading.origins["seq_length"].note
        assert "packing" not in r.reading.unused


def test_a_preset_names_a_model_beside_config_files():
    # a skill trial: `--model llama3-70b` (a preset `recompute-kit presets` lists) was refused
    # with a recipe ("unknown model"), and the recipe's own meta-llama/Meta-Llama-3-70B had no
    # shape offline although the preset was made from that config.json
    from recompute_kit.sources.resolve import read_input, resolve

    reading, what = read_input("llama3-70b")
    assert what == "recompute-kit preset" and reading.get("num_layers") == 80
    assert "ffn_hidden_size" in reading and "seq_length" not in reading  # the model, no run
    by_id, _ = read_input("meta-llama/Meta-Llama-3-70B")
    assert by_id.get("num_query_groups") == 8
    r = resolve([], model="llama3-70b", overrides={"seq_length": 8192})
    assert r.config.model.num_layers == 80 and r.config.model.seq_length == 8192


def test_a_llama_config_without_attention_dropout_has_none():
    # meta-llama/Llama-2-13b-hf's config.json (tests/data/launch/llava) has no
    # attention_dropout key: transformers' LlamaConfig default is 0.0; a skill trial found
    # Megatron-Core's 0.1 in its place (dropout masks counted that the model never keeps)
    from recompute_kit.sources.resolve import resolve

    llava = Path(__file__).resolve().parents[1] / "data" / "launch" / "llava"
    path = llava / "llama2_13b_config.json"
    reading = resolve([str(path)], require_shape=False).reading
    assert reading.get("attention_dropout") == 0.0
    assert "transformers LlamaConfig default" in reading.origins["attention_dropout"].where


def test_a_llama_factory_dpo_stage_says_its_pairs_double_the_forward_batch():
    # hiyouga/LLaMA-Factory @ ff6d4d12 examples/train_lora/qwen3_lora_dpo.yaml, verbatim: DPO
    # (and rm) batch each pair's chosen and rejected sequences together
    # (src/llamafactory/data/collator.py PairwiseDataCollatorWithPadding, "2 * n examples");
    # found checking real configs the tests did not hold: nothing said it
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).resolve().parents[1] / "data" / "launch" / "llamafactory"
    reading = resolve([str(path / "qwen3_lora_dpo.yaml")], require_shape=False).reading
    said = [w for w in reading.warnings if "stage dpo" in w]
    assert said and "2 x per_device_train_batch_size" in said[0]


def test_glm5_is_deepseek_v3s_architecture_and_its_sparse_attention_is_said():
    # A skill trial on Megatron-Bridge's GLM-5 H100 recipe: model_type glm_moe_dsa was "not a
    # family recompute-kit knows", so LayerNorm, an ungated MLP, biases and dropout 0.1 were
    # assumed (Bridge's glm5_bridge.py: RMSNorm, gated, no bias, qk_layernorm=True), and the
    # indexer of DeepSeek sparse attention was passed over in silence.
    path = Path(__file__).parents[1] / "data" / "read" / "nvidia--GLM-5-NVFP4_config.json"
    reading = hf_config.read(path.read_text(), str(path))
    v = reading.values
    assert (v["normalization"], v["swiglu"], v["add_bias_linear"]) == ("RMSNorm", True, False)
    assert v["multi_latent_attention"] is True and v["qk_layernorm"] is True
    assert v["hidden_dropout"] == 0.0
    assert v["num_moe_experts"] == 256 and v["moe_layer_freq"] == [0] * 3 + [1] * 75
    assert not [w for w in reading.warnings if "not a family" in w]
    assert [w for w in reading.warnings if "DeepSeek sparse attention (index_topk 2048" in w]


def test_a_nemotron_h_config_is_read_but_never_sized():
    # Mamba-2 + attention (model_type nemotron_h): the estimator models transformer layers only
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parents[1] / "data" / "read"
    path = path / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json"
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect
    from recompute_kit.memory.estimate import estimate

    config = resolve([str(path)]).config
    config.validate()  # a legal setting needs no size model
    with pytest.raises(ConfigError, match="'nemotron_h', Mamba-2 \\+ attention"):
        estimate(config)
    # the doctor sizes nothing either: no estimate, no finding built on one
    d = diagnose(collect(config=str(path)), 80)
    assert all(f.rule not in ("RK010", "RK011", "RK090") for f in d.findings)


def test_a_vision_language_run_says_its_vision_parts_are_not_modelled():
    # hiyouga/LLaMA-Factory @ 000526908ae92cc1567130559f04a3436855e0cd
    # examples/train_full/qwen2_5vl_full_sft.yaml, verbatim (image_max_pixels, freeze_vision_tower):
    # a skill trial read it with --model Qwen/Qwen2.5-7B and nothing said the vision tower,
    # the projector and the image tokens were left out.
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parents[1] / "data/launch/llamafactory/qwen2_5vl_full_sft.yaml"
    reading = resolve([str(path)], model="Qwen/Qwen2.5-7B", require_shape=False).reading
    said = [w for w in reading.warnings if "a vision-language model" in w]
    assert said and "image_max_pixels" in said[0] and "not modelled" in said[0]
    dense = Path(__file__).parents[1] / "data/launch/llamafactory/qwen3_lora_dpo.yaml"
    assert not [
        w
        for w in resolve([str(dense)], require_shape=False).reading.warnings
        if "vision-language" in w
    ]


def test_a_model_named_as_a_hybrid_is_refused_before_its_config_is_asked_for():
    # A skill trial (Bridge's Qwen3-Next recipe): "not in the registry ... pass the config.json
    # path", and with it, the refusal; the name says the family already
    from recompute_kit.sources.resolve import resolve

    with pytest.raises(ConfigError, match=r"Qwen3-Next\) layers \(by its name\)"):
        resolve([], model="Qwen/Qwen3-Next-80B-A3B-Instruct")
    with pytest.raises(ConfigError, match="not in the registry"):
        resolve([], model="Qwen/Qwen3-Coder-Next-7B")  # not a hybrid's name: the usual words


def test_gemma3_gated_gelu_and_its_sliding_window_are_said():
    # A skill trial on Gemma 3 27B with a config.json that leaves hidden_activation to the class
    # default: the MLP was labelled "gated MLP with silu (SwiGLU)" (Gemma3TextConfig's default
    # is gelu_pytorch_tanh) and sliding_window went to `unused` unsaid.
    from recompute_kit.sources import hf_config

    text = (
        '{"model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62, '
        '"num_attention_heads": 32, "intermediate_size": 21504, "sliding_window": 1024}'
    )
    r = hf_config.read(text, "config.json")
    assert r.get("swiglu") is True and "gelu_pytorch_tanh" in r.origins["swiglu"].note
    assert any("sliding_window=1024" in w and "window mask" in w for w in r.warnings)


def test_a_local_checkpoint_folder_named_by_the_trainer_yaml_gives_the_shape(tmp_path, monkeypatch):
    # A skill trial: LLaMA-Factory's llama3_full_sft.yaml pointed model_name_or_path at a local
    # download (models/Llama-3.1-8B, holding config.json): `read` called it "not in the model
    # registry" and asked for recompute-kit[hub]. from_pretrained reads a folder first.
    from recompute_kit.sources.resolve import resolve

    folder = tmp_path / "models" / "My-Qwen3-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((CORPUS / "Qwen--Qwen3-8B.config.json").read_text())
    sft = Path(__file__).parent / "corpus" / "hf_trainer" / "qwen3_full_sft.yaml"
    text = sft.read_text().replace("Qwen/Qwen3-4B-Instruct-2507", "models/My-Qwen3-8B")
    text = text.replace("deepspeed: examples/deepspeed/ds_z3_config.json", "")
    (tmp_path / "sft.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    resolved = resolve(["sft.yaml"])
    origin = resolved.reading.origins["num_layers"]
    assert resolved.config.model.num_layers == 36 and "models/My-Qwen3-8B/config.json" in (
        origin.where
    )


def test_a_deepspeed_json_not_given_says_its_stage_by_its_name_as_an_assumption(tmp_path):
    # A skill trial (LlamaFactory#5977: llama3 full SFT naming examples/deepspeed/ds_z3_config.json,
    # the YAML given alone) was told "zero_stage = 0" and to move to ZeRO-2
    from recompute_kit.sources.reading import FROM_ASSUMED
    from recompute_kit.sources.resolve import resolve

    sft = (Path(__file__).parent / "corpus" / "hf_trainer" / "qwen3_full_sft.yaml").read_text()
    (tmp_path / "sft.yaml").write_text(sft)
    r = resolve([str(tmp_path / "sft.yaml")], require_shape=False).reading
    assert r.get("zero_stage") == 3 and r.origins["zero_stage"].kind == FROM_ASSUMED
    assert "give the JSON" in r.origins["zero_stage"].note
    offload = sft.replace("ds_z3_config.json", "ds_z2_offload_config.json")
    (tmp_path / "sft.yaml").write_text(offload)
    r = resolve([str(tmp_path / "sft.yaml")], require_shape=False).reading
    assert (r.get("zero_stage"), r.get("optimizer_offload")) == (2, True)
    # a name that says no stage: unknown, said
    (tmp_path / "sft.yaml").write_text(sft.replace("ds_z3_config.json", "my_ds.json"))
    r = resolve([str(tmp_path / "sft.yaml")], require_shape=False).reading
    assert "from the name" not in r.origins["zero_stage"].note  # (the kit's own assumption)
    assert any("my_ds.json not found" in w for w in r.warnings)


def test_gpt_oss_attention_sinks_are_said():
    # a skill trial (NeMo-RL GRPO on gpt-oss-20b at 16k): the estimate assumed a fused
    # attention kernel without saying that gpt-oss's learnable sinks rule FlashAttention out
    # and send Transformer Engine to unfused attention in some setups (its backend filter,
    # transformer_engine/pytorch/attention/dot_product_attention/utils.py "Softmax type")
    path = CORPUS / "openai--gpt-oss-20b.config.json"
    reading = hf_config.read(path.read_text(), str(path))
    said = [w for w in reading.warnings if w.startswith("gpt-oss's attention has learnable")]
    assert said and "--attention unfused" in said[0]
    llama = CORPUS / "meta-llama--Meta-Llama-3.1-8B.config.json"
    assert not any("sinks" in w for w in hf_config.read(llama.read_text(), str(llama)).warnings)
