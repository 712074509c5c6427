"""NeMo-RL `defaults:` parents, found where NeMo-RL finds them, on real recipes.

The rule: NeMo-RL resolves a parent relative to the directory of the file that names it
(https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/utils/config.py
`resolve_path(base_dir, default)` with `base_dir = config_path.parent`). The recipe
tests/sources/corpus/nemo_rl/blind_sft-llama3.1-70b-8n8g-tp4pp2-long-megatron.yaml
(https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/recipes/llm/sft-llama3.1-70b-8n8g-tp4pp2-long-megatron.yaml)
starts `defaults: ../../sft.yaml` and leaves out policy.train_micro_batch_size, which its
parent sft.yaml sets to 1 (GRPO's base, grpo_math_1B.yaml, says 4).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from recompute_kit.sources.resolve import resolve

CORPUS = Path(__file__).parent / "corpus" / "nemo_rl"
SFT_RECIPE = CORPUS / "blind_sft-llama3.1-70b-8n8g-tp4pp2-long-megatron.yaml"
DPO_RECIPE = CORPUS / "dpo-llama3.1-8b-instruct-4n8g-megatrontp2pp2-quick.yaml"


def _read(*paths: Path):
    return resolve([str(p) for p in paths], require_shape=False)


def test_recipe_alone_takes_its_named_parents_defaults_not_grpos(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    shutil.copy(SFT_RECIPE, recipe)
    r = _read(recipe)
    reading = r.reading
    assert reading.get("micro_batch_size") == 1  # sft.yaml's, not grpo_math_1B.yaml's 4
    origin = reading.origins["micro_batch_size"].describe()
    assert "examples/configs/sft.yaml" in origin and "grpo" not in origin
    expected = str((tmp_path / "../../sft.yaml").resolve())
    missing = [w for w in reading.warnings if "'../../sft.yaml'" in w]
    assert len(missing) == 1 and expected in missing[0] and "does not exist" in missing[0]
    assert [i["path"] for i in r.inputs] == [str(recipe)]  # no parent was read


def test_a_dpo_recipe_alone_takes_dpo_defaults(tmp_path):
    # dpo-llama3.1-8b-instruct-4n8g-megatrontp2pp2-quick.yaml
    # (https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/recipes/llm/dpo-llama3.1-8b-instruct-4n8g-megatrontp2pp2-quick.yaml)
    # `defaults: ../../dpo.yaml`, Megatron backend, writes only PP 2: TP and SP are dpo.yaml's
    # (megatron_cfg TP 2, sequence_parallel true; grpo_math_1B.yaml's: 1, false)
    recipe = tmp_path / "recipe.yaml"
    shutil.copy(DPO_RECIPE, recipe)
    reading = _read(recipe).reading
    assert reading.get("tensor_model_parallel_size") == 2
    assert reading.get("sequence_parallel") is True
    assert "examples/configs/dpo.yaml" in reading.origins["sequence_parallel"].describe()


def test_parent_at_the_named_path_is_read_silently_and_listed(tmp_path):
    recipe = tmp_path / "recipes" / "llm" / "recipe.yaml"
    recipe.parent.mkdir(parents=True)
    shutil.copy(SFT_RECIPE, recipe)
    shutil.copy(CORPUS / "sft.yaml", tmp_path / "sft.yaml")
    r = _read(recipe)
    assert r.reading.get("micro_batch_size") == 1
    assert r.reading.origins["micro_batch_size"].where == f"{tmp_path / 'sft.yaml'}:40"
    assert not [w for w in r.reading.warnings if "defaults" in w]
    assert r.inputs[1] == {
        "path": str(tmp_path / "sft.yaml"),
        "format": f"the defaults: parent of {recipe}",
        "parent_of": str(recipe),
    }
    assert r.to_json()["inputs"] == r.inputs


def test_parent_found_only_beside_the_recipe_is_read_with_a_warning(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    shutil.copy(SFT_RECIPE, recipe)
    shutil.copy(CORPUS / "sft.yaml", tmp_path / "sft.yaml")
    r = _read(recipe)
    assert r.reading.get("micro_batch_size") == 1
    (warning,) = [w for w in r.reading.warnings if "'../../sft.yaml'" in w]
    assert str(tmp_path / "sft.yaml") in warning and "not the path named" in warning
    assert [i["path"] for i in r.inputs] == [str(recipe), str(tmp_path / "sft.yaml")]


def test_a_nested_chain_lists_every_parent(tmp_path):
    # grpo_math_8B_megatron.yaml -> grpo_math_1B_megatron.yaml -> grpo_math_1B.yaml, side by
    # side as in examples/configs
    for name in ("grpo_math_8B_megatron.yaml", "grpo_math_1B_megatron.yaml", "grpo_math_1B.yaml"):
        shutil.copy(CORPUS / name, tmp_path / name)
    r = _read(tmp_path / "grpo_math_8B_megatron.yaml")
    assert [i["path"] for i in r.inputs[1:]] == [
        str(tmp_path / "grpo_math_1B_megatron.yaml"),
        str(tmp_path / "grpo_math_1B.yaml"),
    ]
    assert not [w for w in r.reading.warnings if "defaults" in w]


def test_a_default_never_hides_what_an_earlier_input_wrote(tmp_path):
    # the parent given as an input of its own, the recipe's named parent missing: the value
    # sft.yaml writes stays the file's, not the stand-in default's
    recipe = tmp_path / "a" / "recipe.yaml"
    recipe.parent.mkdir()
    shutil.copy(SFT_RECIPE, recipe)
    reading = _read(CORPUS / "sft.yaml", recipe).reading
    assert reading.origins["micro_batch_size"].kind == "file"
    assert reading.origins["micro_batch_size"].where.endswith("sft.yaml:40")


def test_a_parent_given_after_its_child_is_not_applied_again(tmp_path):
    # A user passes the whole chain: `read grpo_math_8B_megatron.yaml grpo_math_1B_megatron.yaml
    # grpo_math_1B.yaml`. The child already read both as its parents; applied again after it,
    # the 1B parents' PP 1, micro-batch 4 and sequence 512 undid the 8B file's PP 2, 1 and 4096.
    names = ("grpo_math_8B_megatron.yaml", "grpo_math_1B_megatron.yaml", "grpo_math_1B.yaml")
    for name in names:
        shutil.copy(CORPUS / name, tmp_path / name)
    alone = _read(tmp_path / names[0]).reading
    chain = _read(*(tmp_path / n for n in names))
    for key in ("pipeline_model_parallel_size", "micro_batch_size", "seq_length"):
        assert chain.reading.get(key) == alone.get(key), key
    assert chain.reading.get("pipeline_model_parallel_size") == 2
    assert not [w for w in chain.reading.warnings if w.startswith("conflict")]
    said = [i["format"] for i in chain.inputs if i["path"] == str(tmp_path / names[1])]
    assert f"read once, within {tmp_path / names[0]}: not applied again" in said


def test_sequence_packing_bins_other_than_micro_batch_times_sequence_are_said():
    # grpo_math_1B.yaml turns policy.sequence_packing on with train_mb_tokens interpolated as
    # max_total_sequence_length x train_micro_batch_size: the estimate's b x s, nothing to say.
    # A bin set apart from them is said: a packed micro-batch holds train_mb_tokens tokens
    # (nemo_rl/data_plane/worker_mixin.py max_tokens_per_microbatch). A skill trial found the
    # packing keys left in `unused` with no word.
    base = [str(CORPUS / "grpo_math_8B_megatron.yaml"), "policy.train_micro_batch_size=2"]
    same = resolve(base, require_shape=False).reading
    assert not any("train_mb_tokens" in w for w in same.warnings)
    assert "policy.sequence_packing.train_mb_tokens" not in same.unused  # compared
    other = resolve([*base, "policy.sequence_packing.train_mb_tokens=32768"], require_shape=False)
    (said,) = [w for w in other.reading.warnings if "train_mb_tokens" in w]
    assert "32768" in said and "--micro-batch-size 1 --seq-length 32768" in said


def test_the_megatron_policy_takes_what_its_bridge_sets_and_cp_says_packing():
    # A skill trial on NeMo-RL's grpo-qwen3-30ba3b-8n8g-megatron recipe: moe_grouped_gemm read
    # as Megatron-Core's False (so moe_act was refused), while NeMo-RL builds the model with
    # AutoBridge and Qwen3MoEBridge sets it True (qwen3_moe_bridge.py); and a CP row was
    # rendered alone where NeMo-RL's Megatron policy asserts sequence packing for CP.
    from recompute_kit.export_layout import layout_lines
    from recompute_kit.sources.resolve import resolve

    r = resolve([str(CORPUS / "grpo_math_qwen30ba3b_megatron.yaml")]).reading
    assert r.get("moe_grouped_gemm") is True
    assert "qwen3_moe_bridge.py" in r.origins["moe_grouped_gemm"].where
    lines = layout_lines({"context_parallel_size": 4, "sequence_packing": True}, "nemo-rl", 64)
    assert any("sequence_packing.enabled: true" in line for line in lines)


def test_recompute_granularity_cites_its_own_key_and_colocation_is_said():
    # grpo_math_qwen30ba3b_megatron.yaml (defaults: grpo_math_1B_megatron.yaml, whose
    # megatron_cfg says activation_checkpointing false and recompute_granularity "full" on
    # line 111). NeMo-RL (nemo_rl/models/megatron/setup.py) reads the granularity from its own
    # key once activation_checkpointing is true: the value cites that key, where it is set.
    recipe = CORPUS / "grpo_math_qwen30ba3b_megatron.yaml"
    on = "policy.megatron_cfg.activation_checkpointing=true"
    r = resolve([str(recipe), on], require_shape=False).reading
    o = r.origins["recompute_granularity"]
    assert r.get("recompute_granularity") == "full"
    assert o.where == f"{CORPUS / 'grpo_math_1B_megatron.yaml'}:111"
    assert o.key == "policy.megatron_cfg.recompute_granularity"
    assert "activation_checkpointing true (command line)" in o.note
    selective = "policy.megatron_cfg.recompute_granularity=selective"
    r = resolve([str(recipe), on, selective], require_shape=False).reading
    o = r.origins["recompute_granularity"]
    assert r.get("recompute_granularity") == "selective"
    assert (o.where, o.key) == ("command line", selective)
    # grpo_math_1B.yaml:439 policy.generation.colocated.enabled true: vLLM sleeps on the GPUs
    assert any(
        w.startswith(f"{CORPUS / 'grpo_math_1B.yaml'}:439: generation is colocated")
        for w in r.warnings
    )


def test_chunked_log_probs_are_read_not_left_unused():
    # a skill trial found policy.logprob_chunk_size and defer_fp32_logits in `unused` while
    # the loss they shape set the peak; NeMo-RL's megatron/train.py passes the chunk size to
    # the training loss (ChunkedDistributedLogprob), setup.py asserts defer_fp32_logits with it
    recipe = CORPUS / "grpo_math_qwen30ba3b_megatron.yaml"
    words = ["++policy.logprob_chunk_size=2048", "++policy.megatron_cfg.defer_fp32_logits=true"]
    r = resolve([str(recipe), *words], require_shape=False).reading
    assert "policy.logprob_chunk_size" not in r.unused
    assert "policy.megatron_cfg.defer_fp32_logits" not in r.unused
    assert any(
        w.startswith("NeMo-RL computes the log-probabilities in chunks of 2048") for w in r.warnings
    )
    whole = resolve([str(recipe)], require_shape=False).reading
    assert any("(DistributedLogprob)" in w for w in whole.warnings)


def test_fused_linear_logprobs_is_read_and_said_as_not_priced(capsys):
    # a skill trial (gpt-oss-20b GRPO): use_fused_linear_logprobs was left "unused" and the
    # levers said no fused-loss key is known in NeMo-RL; nemo_rl/models/policy/__init__.py:
    # log-probs "directly from hidden states, avoiding materialization of the full ... logit
    # tensor", fused_linear_logprobs_chunk_size tokens at a time
    from recompute_kit.cli import main

    recipe = str(CORPUS / "grpo_math_qwen30ba3b_megatron.yaml")
    on = "policy.megatron_cfg.use_fused_linear_logprobs=true"
    r = resolve([recipe, on], require_shape=False).reading
    assert "policy.megatron_cfg.use_fused_linear_logprobs" not in r.unused
    assert any(w.startswith("command line: use_fused_linear_logprobs: NeMo-RL") for w in r.warnings)
    argv = ["plan", "--config", recipe, "--gpu", "h100-80gb", "--levers", "--json"]
    assert main(argv) in (0, 1)
    notes = json.loads(capsys.readouterr().out)["levers"]["notes"]
    assert any("use_fused_linear_logprobs" in n and "not priced" in n for n in notes)
