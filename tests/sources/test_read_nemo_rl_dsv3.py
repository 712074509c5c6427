"""NeMo-RL's DeepSeek-V3 GRPO recipes as a skill trial read them (tests/data/read/README.md:
nemo_rl_dsv3): the model named by a sentence, MTP turned off in the base, MLA.

https://github.com/NVIDIA-NeMo/RL/tree/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve

CONFIGS = Path(__file__).parents[1] / "data" / "read" / "nemo_rl_dsv3" / "examples" / "configs"
DSV3 = CONFIGS / "recipes" / "llm" / "grpo-dapomath17k-dsv3-32n4g-megatron.yaml"


def test_mtp_num_layers_0_in_the_base_turns_off_the_models_mtp():
    # grpo_math_1B.yaml line 241 `mtp_num_layers: 0` ("mtp_num_layers=0 disables MTP"), which
    # NeMo-RL copies whenever the key is there (nemo_rl/models/megatron/setup.py
    # _apply_mtp_config): it was read as unset, and DeepSeek-V3's num_nextn_predict_layers 1
    # put an MTP layer on the last stage (59.75 -> 70.93 GiB).
    r = resolve([str(DSV3), "policy.model_name=deepseek-ai/DeepSeek-V3"]).reading
    assert r.get("mtp_num_layers") == 0
    assert r.origins["mtp_num_layers"].where.endswith("grpo_math_1B.yaml:241")


def test_a_sentence_for_model_name_with_model_given_says_where_the_shape_comes_from():
    resolved = resolve([str(DSV3)], model="deepseek-ai/DeepSeek-V3")
    said = [w for w in resolved.reading.warnings if "is not a Hugging Face id" in w]
    assert said and all("the shape is deepseek-ai/DeepSeek-V3's (--model)" in w for w in said)
    assert not any("not known from it" in w for w in resolved.reading.warnings)
    # MLA reads neither: nothing assumed of them
    assumed = [w for w in resolved.reading.warnings if w.startswith("assumed: ")]
    assert not [w for w in assumed if "num_query_groups" in w or "kv_channels" in w], assumed


def test_without_a_model_the_refusal_names_the_sentence_and_the_model_the_file_name_says():
    with pytest.raises(ConfigError) as refused:
        resolve([str(DSV3)])
    said = str(refused.value)
    assert "policy.model_name 'Follow instructions in" in said
    assert "--model deepseek-ai/DeepSeek-V3" in said  # the file name's dsv3
    assert said.count("policy.model_name's config.json") == 1, said  # said once, not per key


def test_nemo_rl_takes_its_own_log_probs_not_a_bridges_fused_loss():
    # NeMo-RL's Megatron policy returns logits and computes log-probabilities itself
    # (nemo_rl/models/megatron/train.py from_parallel_logits_to_logprobs): DeepSeek-V3's bridge
    # setting (cross_entropy_loss_fusion, TE) was read as the loss, 0.25 GiB against gpt-oss's
    # unfused 1.15 GiB for the same NeMo-RL code path.
    for recipe, model in (
        (DSV3, "policy.model_name=deepseek-ai/DeepSeek-V3"),
        (CONFIGS / "recipes" / "llm" / "grpo-gptoss-20b-8n8g-megatron.yaml", None),
    ):
        r = resolve([str(recipe), *([model] if model else [])]).reading
        assert r.get("cross_entropy_loss_fusion") is False
        assert "DistributedLogprob" in r.origins["cross_entropy_loss_fusion"].where
        assert any("fp32 temporaries" in w for w in r.warnings)


def test_what_the_named_models_config_says_of_itself_is_said_through_a_file_too():
    # gpt-oss-20b read alone warns that its 128-token sliding window is counted as global
    # attention; named by the NeMo-RL recipe (policy.model_name) the warning was dropped. Its
    # max_position_embeddings note is not said where the recipe gives the sequence length.
    recipe = CONFIGS / "recipes" / "llm" / "grpo-gptoss-20b-8n8g-megatron.yaml"
    said = resolve([str(recipe)]).reading.warnings
    assert any("sliding_window=128" in w for w in said), said
    assert not any("max_position_embeddings" in w for w in said), said
