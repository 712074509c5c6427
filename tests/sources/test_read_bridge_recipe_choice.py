"""Which Megatron-Bridge recipe a file with several is read as: the one a launch command's
`run_recipe.py --recipe NAME` names, an alias module followed to the function it imports, and
no silent choice. The recipe files are verbatim Megatron-Bridge 067f987 files where they sit in
the checkout (tests/sources/corpus/bridge_checkout/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from recompute_kit.cli.parser import main
from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve

CHECKOUT = Path(__file__).parent / "corpus" / "bridge_checkout"
RECIPES = CHECKOUT / "src" / "megatron" / "bridge" / "recipes" / "qwen"
H100 = RECIPES / "h100" / "qwen3_moe.py"  # 8 recipes, 235B pretraining first in __all__
ALIASES = RECIPES / "qwen3_moe.py"  # qwen3_30b_a3b_pretrain_config = h100's 16-GPU recipe
NAMED = "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
# The skill trial's launch command (run_recipe.py's flags; its docstring, lines 65-66 at
# 067f987, gives the same `--recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config`).
LAUNCH = (
    "torchrun --nnodes 2 --nproc_per_node 8 scripts/training/run_recipe.py --recipe "
    f"{NAMED} --mode pretrain model.recompute_modules=[moe_act,layernorm]\n"
)


def _launch(tmp_path: Path) -> str:
    path = tmp_path / "launch.sh"
    path.write_text(LAUNCH)
    return str(path)


@pytest.mark.parametrize("launch_first", [False, True])
def test_the_recipe_the_launch_command_names_is_the_function_read(tmp_path, launch_first):
    launch = _launch(tmp_path)
    inputs = [launch, str(H100)] if launch_first else [str(H100), launch]
    r = resolve(inputs, require_shape=False).reading
    # h100/qwen3_moe.py L168-170 in the 16-GPU recipe: seq 4096, TP 1, PP 1 (the 235B one,
    # L246-249, sets TP 4, PP 16)
    assert f"recipe {NAMED}()" in r.format
    assert r.origins["pipeline_model_parallel_size"].where.endswith("qwen3_moe.py:170")
    assert r.get("tensor_model_parallel_size") == 1
    assert r.get("pipeline_model_parallel_size") == 1
    assert r.model_name == "Qwen/Qwen3-30B-A3B"
    assert any(f"read {NAMED}, the recipe" in w and "--recipe" in w for w in r.warnings)
    assert not any("recipes and none named" in w for w in r.warnings)
    # the recipe the overrides apply on is read: its keys are not "left to the recipe"
    assert not any("these overrides apply to, not read here" in w for w in r.warnings)


def test_a_file_of_several_recipes_and_no_name_says_which_and_lists_the_others():
    r = resolve([str(H100)], require_shape=False).reading
    said = [w for w in r.warnings if "recipes and none named" in w]
    assert len(said) == 1
    # every other recipe of the file's __all__ is listed, not five and "..."
    for name in (
        NAMED,
        "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config",
        "qwen3_30b_a3b_sft_8gpu_h100_bf16_config",
        "qwen3_235b_a22b_peft_16gpu_h100_bf16_config",
    ):
        assert name in said[0]
    assert "read qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config" in said[0]


def test_an_alias_module_is_followed_to_the_function_it_imports():
    r = resolve([f"{ALIASES}::qwen3_30b_a3b_pretrain_config"], require_shape=False).reading
    assert r.format.endswith(f"h100/qwen3_moe.py::{NAMED}()")
    where = r.origins["pipeline_model_parallel_size"].where
    assert where.endswith("h100/qwen3_moe.py:170"), where
    assert r.get("seq_length") == 4096
    assert r.model_name == "Qwen/Qwen3-30B-A3B"
    # no name: the first pretraining alias, the others listed
    r = resolve([str(ALIASES)], require_shape=False).reading
    assert "qwen3_30b_a3b_pretrain_config()" in r.format
    assert any("the others: qwen3_235b_a22b_pretrain_config" in w for w in r.warnings)


def test_an_alias_module_alone_is_one_error_and_json_gets_a_document(tmp_path, capsys):
    alone = tmp_path / "qwen3_moe.py"
    shutil.copy(ALIASES, alone)
    with pytest.raises(ConfigError, match=f"::{NAMED}"):
        resolve([str(alone)], require_shape=False)
    assert main(["read", "--json", str(alone)]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["error"] in err
    assert "Traceback" not in err


# Megatron-Bridge 067f987: GPTDatasetConfig.finalize() sets sequence_length from seq_length
# (src/megatron/bridge/training/config.py:304); run_recipe.py copies dataset.seq_length into
# model.seq_length after the overrides (scripts/training/run_recipe.py:484 then :515,
# recipe_runner.py:471-487). The trial's command set the two keys that are reset.
def test_overrides_bridge_resets_do_not_set_the_length_and_say_the_key_to_use(tmp_path):
    launch = tmp_path / "launch.sh"
    launch.write_text(LAUNCH.rstrip("\n") + " model.seq_length=8192 dataset.sequence_length=8192\n")
    r = resolve([str(H100), str(launch)], require_shape=False).reading
    assert r.get("seq_length") == 4096  # the recipe's cfg.dataset.seq_length (L168)
    assert r.origins["seq_length"].where.endswith("h100/qwen3_moe.py:168")
    said = [w for w in r.warnings if "does not set the run's length" in w]
    both = "set dataset.seq_length=8192 model.seq_length=8192 together"
    assert len(said) == 2 and all(both in w for w in said)
    assert any(w.startswith(f"{launch}:1: dataset.sequence_length=8192") for w in said)
    assert any("run_recipe.py copies dataset.seq_length" in w for w in said)
    # the key Bridge reads sets it, and wins over model.seq_length (which is then synced)
    launch.write_text(LAUNCH.rstrip("\n") + " model.seq_length=2048 -sl 8192\n")
    r = resolve([str(H100), str(launch)], require_shape=False).reading
    assert r.get("seq_length") == 8192
    assert r.origins["seq_length"].key == "-sl"


# Megatron-Bridge 067f987 src/megatron/bridge/models/qwen/qwen3_moe_bridge.py lines 64-65:
#     provider.moe_router_load_balancing_type = "aux_loss"
#     provider.moe_aux_loss_coeff = 1e-3
# The recipe builds its model with AutoBridge.from_hf_pretrained("Qwen/Qwen3-30B-A3B")
# .to_megatron_provider(), so these are the run's values, not TransformerConfig's 0.0.
def test_the_model_bridge_provider_values_are_the_run_s_and_labelled_so(tmp_path):
    r = resolve([str(H100), _launch(tmp_path)], require_shape=False).reading
    assert r.get("moe_aux_loss_coeff") == 1e-3
    origin = r.origins["moe_aux_loss_coeff"]
    assert origin.where.endswith("src/megatron/bridge/models/qwen/qwen3_moe_bridge.py#L65")
    assert "Qwen3MoEBridge.provider_bridge()" in origin.key
    assert r.get("moe_router_load_balancing_type") == "aux_loss"
    # a value an input writes wins over the provider's
    launch = tmp_path / "launch.sh"
    launch.write_text(LAUNCH.rstrip("\n") + " model.moe_aux_loss_coeff=0.01\n")
    r = resolve([str(H100), str(launch)], require_shape=False).reading
    assert r.get("moe_aux_loss_coeff") == 0.01
    assert r.origins["moe_aux_loss_coeff"].where == f"{launch}:1"


MOONLIGHT = CHECKOUT / "src/megatron/bridge/recipes/moonlight/h100/moonlight_16b.py"


def test_a_deepseek_v3_family_recipe_takes_deepseek_v3_bridge_s_provider_values():
    """Moonlight's recipe builds its model with AutoBridge, which dispatches to
    DeepSeekV3Bridge.provider_bridge(): its fusions, no hidden dropout and sigmoid routing are
    the run's (a skill trial: Megatron-Core's defaults made moe_act's saving 4x too high), and
    the model's q_lora_rank null (no q latent) is not replaced by MLATransformerConfig's 512."""
    r = resolve(
        [f"{MOONLIGHT}::moonlight_16b_pretrain_8gpu_h100_bf16_config"],
        overrides={"data_parallel_size": 4},
    )
    m, read = r.config.model, r.reading
    assert (m.bias_activation_fusion, m.hidden_dropout) == (True, 0.0)
    assert read.get("moe_router_score_function") == "sigmoid"
    assert read.get("attention_softmax_in_fp32") is False
    origin = read.origins["bias_activation_fusion"]
    assert origin.where.endswith("models/deepseek/deepseek_v3_bridge.py#L80")
    assert m.q_lora_rank is None and read.origins["q_lora_rank"].kind == "model"
    # the vocabulary stays unpadded: should_pad_vocab is False in Bridge's GPTModelProvider
    assert "make_vocab_size_divisible_by" not in read.origins or (
        "deepseek" not in read.origins["make_vocab_size_divisible_by"].where
    )
    # recompute_modules None is said as what Megatron-Core makes of it
    assert "['core_attn']" in read.origins["recompute_modules"].note


# --- the flat performance recipes (perf_recipes/, Megatron-Bridge 2026) --------------------------
# https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/perf_recipes/gpt_oss/h100/gpt_oss.py
# line 28: `cfg.mixed_precision = _perf_precision("bf16")`, line 64 `_perf_precision("fp8_cs")`:
# a helper imported from perf_recipes/_common.py that returns Bridge's named precision preset.
PERF_GPT_OSS = CHECKOUT / "src/megatron/bridge/perf_recipes/gpt_oss/h100/gpt_oss.py"


@pytest.mark.parametrize(
    "recipe, fp8, fp8_recipe, line",
    [
        ("gpt_oss_120b_pretrain_64gpu_h100_bf16_config", None, "delayed", 28),  # (its default)
        ("gpt_oss_120b_pretrain_64gpu_h100_fp8cs_config", "hybrid", "tensorwise", 64),
    ],
)
def test_a_precision_returned_by_an_imported_helper_is_read(recipe, fp8, fp8_recipe, line):
    # A skill trial read every H100 perf recipe as "_perf_precision('bf16'): not a literal, left
    # unset", so the fp8 recipes were estimated in bf16.
    r = resolve([f"{PERF_GPT_OSS}::{recipe}"], require_shape=False).reading
    assert (r.get("bf16"), r.get("fp8"), r.get("fp8_recipe")) == (True, fp8, fp8_recipe)
    assert r.origins["fp8"].where.endswith(f"perf_recipes/gpt_oss/h100/gpt_oss.py:{line}")
    assert not [w for w in r.warnings if "not a literal" in w]
    assert r.model_name == "openai/gpt-oss-120b"
    # _perf_precision sets the preset's grad_reduce_in_fp32 = False (line 122) whatever the
    # undecided `if not isinstance(cfg.mixed_precision, str)` of _benchmark_common does: read,
    # not assumed (a skill trial saw "assumed" though every path sets it)
    assert r.get("grad_reduce_in_fp32") is False
    assert r.origins["grad_reduce_in_fp32"].kind == "file"
    # AutoBridge's GPT-OSS provider (models/gpt_oss/gpt_oss_bridge.py:73, a skill trial found
    # it read as Megatron-Core's False: 9.5 GiB more activations on stage 0)
    assert r.get("bias_activation_fusion") is True
    assert r.origins["bias_activation_fusion"].where.endswith("gpt_oss_bridge.py#L73")
    assert "router_aux_loss_coef" in r.origins["moe_aux_loss_coeff"].note  # its own key
    # the GPUs the recipe's name says, assumed and said (DP 16 at TP1 PP4 CP1), not DP 8
    assert r.get("world_size") == 64 and r.origins["world_size"].kind == "assumed"


def test_a_peft_recipe_freezes_the_base_through_default_peft_config():
    # A skill trial on Bridge's llama3_70b_peft recipe: `peft_cfg = default_peft_config(
    # peft_scheme)` then `cfg.peft = peft_cfg` was not read (and default_peft_config was "not
    # found beside the file"), so a LoRA run was sized with the base's gradients and Adam
    # states: 131 GiB more per rank at 70B, "nothing fits". recipes/utils/dataset_utils.py:
    # "lora" / "dora" give LoRA() / DoRA(), None / "none" full training.
    recipe = f"{H100}::qwen3_30b_a3b_peft_4gpu_h100_bf16_config"
    r = resolve([recipe], overrides={"data_parallel_size": 1}).reading
    assert r.get("frozen_base") is True
    assert "default_peft_config('lora')" in r.origins["frozen_base"].note
    assert not [w for w in r.warnings if "default_peft_config()" in w]
    assert any(w.startswith("frozen_base: the adapters' own") for w in r.warnings)  # said
    # Bridge's LoRA regather switch, as a user passes it (a re-trial asked for it)
    words = [recipe, "peft.sequence_parallel_input_regather=true"]
    regather = resolve(words, overrides={"data_parallel_size": 1}).config.parallel
    assert regather.lora_input_regather
    sft = resolve([f"{H100}::qwen3_30b_a3b_sft_8gpu_h100_bf16_config"]).reading
    assert not sft.get("frozen_base")
    # an override that is not section.key=value is said, not dropped (`peft=lora`)
    said = resolve([recipe, "peft=none"], overrides={"data_parallel_size": 1}).reading
    assert "peft=none" in said.unused
    assert any(w.startswith("peft=none: not a section.key=value override") for w in said.warnings)


GPT_OSS = CHECKOUT / "src" / "megatron" / "bridge" / "recipes" / "gpt_oss" / "h100" / "gpt_oss.py"
RUN = "scripts/training/run_recipe.py --recipe gpt_oss_120b_sft_48gpu_h100_bf16_32k_config"


@pytest.mark.parametrize("command", [f"python {RUN}", RUN])
def test_a_launch_alone_reads_the_recipe_it_names_from_the_checkout(monkeypatch, command):
    # A skill trial gave `python scripts/training/run_recipe.py --recipe NAME` from its Bridge
    # checkout's root and got every setting assumed ("1963 GiB per rank"); without `python`,
    # "run_recipe.py: not valid Python". run_recipe.py loads the recipe NAME, then its overrides.
    monkeypatch.chdir(CHECKOUT)
    r = resolve([f"{command} model.pipeline_model_parallel_size=3"]).reading
    assert r.get("pipeline_model_parallel_size") == 3  # the override, after the recipe
    assert r.origins["expert_model_parallel_size"].where.endswith("gpt_oss.py:591")


@pytest.mark.parametrize("launch_first", [False, True])
def test_the_launchs_overrides_win_over_its_recipe_in_either_order(monkeypatch, launch_first):
    # the same trial listed the launch line before the recipe file: the recipe's PP6 won over
    # the launch's PP (run_recipe.py applies its overrides after loading the recipe)
    monkeypatch.chdir(CHECKOUT)
    launch = f"python {RUN} model.pipeline_model_parallel_size=3"
    inputs = [launch, str(GPT_OSS)] if launch_first else [str(GPT_OSS), launch]
    assert resolve(inputs).reading.get("pipeline_model_parallel_size") == 3
