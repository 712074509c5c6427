"""Megatron-Bridge / NeMo 2.0 reader: the corpus in tests/sources/corpus/bridge and the tricky
semantics (sources quoted per test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources import bridge

CORPUS = Path(__file__).parent / "corpus" / "bridge"
sys.path.insert(0, str(Path(__file__).parent))

EXPECTS = sorted(CORPUS.glob("*.expect.yaml"))


def _artefact(expect: Path) -> Path:
    stem = expect.name[: -len(".expect.yaml")]
    (found,) = [
        p for p in CORPUS.iterdir() if p.stem == stem and not p.name.endswith(".expect.yaml")
    ]
    return found


# --- Hydra overrides ---------------------------------------------------------------------------
# https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/10feab50f643fd47115e72be4c6721b4dfd43e36/scripts/training/run_recipe.py
# "-sl, --seq_length LENGTH  dataset.seq_length=LENGTH ... the runner synchronizes model.seq_length"


def test_shorthands_lists_and_deletion(tmp_path: Path) -> None:
    line = (
        "torchrun --nproc_per_node=8 --nnodes 2 run_recipe.py --recipe llama3_8b_pretrain_config "
        "-tp 2 -pp 2 -sl 16384 -mb 1 model.recompute_granularity=selective "
        "model.recompute_modules=[core_attn,mlp] ~model.recompute_num_layers +model.sequence_parallel=true"  # noqa: E501
    )
    r = bridge.read(line, "cmd.sh")
    assert r.values["tensor_model_parallel_size"] == 2
    assert r.values["seq_length"] == 16384
    assert r.values["recompute_modules"] == ["core_attn", "mlp"]
    assert (
        r.values["recompute_num_layers"] is None
        and "deleted" in r.origins["recompute_num_layers"].note
    )
    assert r.values["sequence_parallel"] is True
    assert r.values["world_size"] == 16
    assert r.model_name == "meta-llama/Meta-Llama-3-8B"
    assert r.origins["tensor_model_parallel_size"].key == "-tp"
    bridge.apply_defaults(r)
    # CP is the recipe's (llama3_8b uses CP 2): DP is not derived from a guess
    assert "data_parallel_size" not in r.values
    assert "micro_batch_size" in r.values and "bf16" not in r.values  # the recipe decides bf16


def test_unresolved_shell_variable_left_unset() -> None:
    r = bridge.read(
        'python pretrain_llama.py model.seq_length="${SEQ}" model.tensor_model_parallel_size=2',
        "x.sh",
    )
    assert "seq_length" not in r.values
    assert any("${SEQ}" in w for w in r.warnings)


# --- YAML -------------------------------------------------------------------------------------
# config-formats.md §3: model.seq_length must equal dataset.seq_length; mixed_precision overwrites
# same-named model fields; ddp. or optimizer.use_distributed_optimizer True turns both on.


def test_yaml_seq_conflict_precision_and_tags() -> None:
    text = """\
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  seq_length: 2048
  attention_backend: !!python/object/apply:megatron.core.transformer.enums.AttnBackend [1]
  fp8: false
  num_layers: 4
  hidden_size: 256
  num_attention_heads: 8
dataset:
  seq_length: 4096
mixed_precision: bf16_mixed
ddp:
  use_distributed_optimizer: false
optimizer:
  use_distributed_optimizer: true
train:
  micro_batch_size: 2
"""
    r = bridge.read(text, "run_config.yaml")
    assert r.values["seq_length"] == 4096
    assert any("requires them equal" in w for w in r.warnings)
    assert r.values["attention_backend"] == "flash"
    assert r.values["fp8"] is None
    assert r.values["bf16"] is True
    assert r.values["use_distributed_optimizer"] is True
    assert r.origins["micro_batch_size"].where == "run_config.yaml:17"
    bridge.apply_defaults(r)
    # GPTModelProvider: tied embeddings, 4h FFN
    assert r.values["share_embeddings_and_output_weights"] is True
    assert r.values["ffn_hidden_size"] == 1024
    assert r.values["num_query_groups"] == 8


def test_attn_backend_enum_string() -> None:
    r = bridge.read(
        "model:\n  _target_: x\n  attention_backend: AttnBackend.fused\ntrain:\n  micro_batch_size: 1\n",  # noqa: E501
        "c.yaml",
    )
    assert r.values["attention_backend"] == "fused"


def test_bare_gpt_provider_defaults() -> None:
    r = bridge.read(
        "model:\n  _target_: x.GPTModelProvider\n  num_layers: 2\ntrain:\n  micro_batch_size: 1\n",
        "c.yaml",
    )
    bridge.apply_defaults(r)
    assert r.values["seq_length"] == 1024
    assert r.values["bf16"] is False
    assert r.values["use_distributed_optimizer"] is False
    # GPTModelProvider.should_pad_vocab False (models/gpt_provider.py): the vocabulary is not
    # padded (two skill trials saw a padded logits width for Bridge runs); with it, 128 x TP
    assert r.values["make_vocab_size_divisible_by"] == 1
    padded = bridge.read(
        "model:\n  _target_: x.GPTModelProvider\n  num_layers: 2\n  should_pad_vocab: true\n"
        "train:\n  micro_batch_size: 1\n",
        "c.yaml",
    )
    bridge.apply_defaults(padded)
    assert padded.values["make_vocab_size_divisible_by"] == 128


def test_sequence_parallel_tp1_turned_off() -> None:
    r = bridge.read(
        "model:\n  _target_: x\n  sequence_parallel: true\ntrain:\n  micro_batch_size: 1\n",
        "c.yaml",
    )
    bridge.apply_defaults(r)
    assert r.values["sequence_parallel"] is False
    assert any("sequence_parallel" in w for w in r.warnings)


def test_bad_yaml_is_config_error() -> None:
    with pytest.raises(ConfigError):
        bridge.read("model: [unclosed\ntrain: 1\n", "bad.yaml")


# --- recipes (ast only) -----------------------------------------------------------------------


def test_recipe_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = f"""\
import os
open({str(marker)!r}, "w").write("x")
SEQ = 4096

def pretrain_config(tp: int = 4, seq_length: int = SEQ):
    cfg = ConfigContainer(model=Llama31ModelProvider8B(tensor_model_parallel_size=tp),
                          mixed_precision="bf16_mixed")
    cfg.dataset.seq_length = seq_length
    cfg.model.pipeline_model_parallel_size = compute_pp()
    cfg.model.recompute_granularity = "full"
    return cfg
"""
    r = bridge.read(text, "recipe.py")
    assert not marker.exists()
    assert r.values["tensor_model_parallel_size"] == 4
    assert r.values["seq_length"] == 4096
    assert r.values["bf16"] is True
    assert "pipeline_model_parallel_size" not in r.values
    assert any("compute_pp()" in w for w in r.warnings)
    assert r.model_name == "meta-llama/Llama-3.1-8B"


def test_nemo2_attribute_assignments_and_autobridge() -> None:
    text = """\
import nemo_run as run
def pretrain_recipe():
    recipe = llm.llama3_8b.pretrain_recipe()
    recipe.trainer.strategy.tensor_model_parallel_size = 2
    recipe.trainer.devices = 8
    recipe.trainer.num_nodes = 4
    recipe.data.seq_length = 4096
    recipe.model.config.recompute_granularity = "selective"
    return recipe
"""
    r = bridge.read(text, "my_recipe.py")
    assert r.framework == "nemo2"
    assert r.values["tensor_model_parallel_size"] == 2
    assert r.values["world_size"] == 32
    assert r.values["seq_length"] == 4096
    r2 = bridge.read(
        'def pretrain_config():\n    m = AutoBridge.from_hf_pretrained("Qwen/Qwen3-8B")\n'
        "    cfg = ConfigContainer(model=m)\n",
        "r.py",
    )
    assert r2.model_name == "Qwen/Qwen3-8B"


def test_provider_seq_length_default() -> None:
    # Llama31ModelProvider8B.seq_length = 131072 (MB llama_provider.py @2afd2d34)
    r = bridge.read(
        "def pretrain_config():\n    return Llama31ModelProvider8B(tensor_model_parallel_size=2)\n",
        "r.py",
    )
    bridge.apply_defaults(r)
    assert r.values["seq_length"] == 131072
    assert "normalization" not in r.values  # the registry's, by HF id


def test_sniff() -> None:
    assert bridge.sniff((CORPUS / "bridge_llama3_8b.py").read_text(), "llama3_8b.py") > 50
    assert bridge.sniff("print('hi')\n", "x.py") == 0
    assert bridge.sniff("a: 1\n", "x.yaml") == 0


def test_a_layout_written_as_a_list_of_stages_is_megatrons_layout_string():
    # Megatron-Bridge serializes pipeline_model_parallel_layout as lists of LayerType names
    # (Megatron-Core's PipelineParallelLayerLayout takes a str or such a list).
    from recompute_kit.config.pipeline_layout import layout_from_stages
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "bridge"
    resolved = resolve([str(path / "blind2_deepseek_v3_pretrain_gb200_nvfp4_v1.yaml")])
    layout = resolved.config.parallel.pipeline_model_parallel_layout
    assert layout == "Etttt|" + "tttt|" * 14 + "tmL"
    assert layout_from_stages([["embedding", "decoder"], ["LayerType.decoder", "loss"]]) == "Et|tL"
    with pytest.raises(ConfigError, match="unknown layer type 'encoder'"):
        layout_from_stages([["embedding", "encoder"]])


def test_mtp_layers_are_in_the_estimate_of_the_stage_that_holds_them():
    """DeepSeek-V3's Bridge recipe sets mtp_num_layers 1: the config carries it, the stage
    that holds the loss (here the layout's `tmL` stage) counts the MTP block and its
    parameters, and nothing says MTP is left out (it was, with a warning)."""
    from recompute_kit.memory.estimate import estimate
    from recompute_kit.memory.model_states import rank_parameters
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "bridge" / "deepseek_v3_pretrain_h100_fp8_sc_v1.yaml"
    resolved = resolve([str(path)])
    assert not any("not in the estimate" in w for w in resolved.reading.warnings)
    config = resolved.config
    assert config.model.mtp_num_layers == 1
    last = config.parallel.pipeline_model_parallel_size - 1
    with_mtp = estimate(config, stage=last)
    without = estimate(config.replace(mtp_num_layers=None), stage=last)
    assert set(with_mtp.mtp_bytes) == {"mtp_embedding", "mtp_layers", "mtp_output", "mtp_loss"}
    per_micro_batch = sum(with_mtp.mtp_bytes.values())
    added = with_mtp.activation_bytes - without.activation_bytes
    # the MTP block is the last chunk's (`mL`), with the loss: one micro-batch at a time there.
    # Without it the stage's peak is another moment of the schedule (chunk 0 holding one more
    # micro-batch of two decoder layers, the loss chunk none), so MTP adds at most its own bytes
    assert with_mtp.chunk_micro_batches == [8, 8, 8, 1]
    assert without.chunk_micro_batches == [9, 8, 8, 0]
    assert 0 < added <= per_micro_batch
    assert without.mtp_bytes == {} and estimate(config, stage=0).mtp_bytes == {}
    extra = (
        rank_parameters(config, last)["expert"]
        - rank_parameters(config.replace(mtp_num_layers=None), last)["expert"]
    )
    assert extra > 0  # DeepSeek-V3's last layer is MoE, so is its MTP layer


def test_an_override_file_without_a_model_suggests_the_one_its_name_says():
    # A skill trial: the Qwen3-30B-A3B override example was told to try --model
    # meta-llama/Llama-3.1-8B. The name is only a suggestion: nothing is read from it.
    from recompute_kit.sources.registry import named_in
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "bridge"
    name = "qwen3_moe_30b_a3b_pretrain_override_example.yaml"
    with pytest.raises(ConfigError, match="the file or recipe name suggests Qwen/Qwen3-30B-A3B"):
        resolve([str(path / name)])
    assert named_in("train_and_eval") is None


# --- recipes built on a shared helper (Megatron-Bridge 2026) ----------------------------------
# https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py
# (verbatim in the corpus): `cfg = _pretrain_common()` (recipes/common.py), then
# `cfg.model.tensor_model_parallel_size = 2`, ...; recipe functions named `*_h100_bf16_config`.
DEEPSEEK_H100 = CORPUS / "bridge_deepseek_v3_h100_recipes.py"


def test_a_recipe_named_in_the_file_is_read_by_its_attribute_assignments() -> None:
    from recompute_kit.sources.resolve import resolve

    name = "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config"
    r = resolve([f"{DEEPSEEK_H100}::{name}"], require_shape=False).reading
    v = r.values
    assert (v["tensor_model_parallel_size"], v["pipeline_model_parallel_size"]) == (2, 8)
    assert (v["expert_model_parallel_size"], v["sequence_parallel"]) == (32, True)
    # L360-362: full / uniform / 1, each with its line
    assert (v["recompute_granularity"], v["recompute_method"], v["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    assert r.origins["recompute_granularity"].where.endswith(
        "bridge_deepseek_v3_h100_recipes.py:360"
    )
    assert v["moe_grouped_gemm"] is True  # L355
    # L323 -> the file's own layout function, layout_map[(8, 1)] (L56)
    assert (
        v["pipeline_model_parallel_layout"]
        == "E" + "t" * 8 + "|" + "t" * 8 * 1 + ("|" + "t" * 8) * 5 + "|tttttmL"
    )
    assert v["moe_token_dispatcher_type"] == "flex"  # L328 hybridep, L410 apply_flex_...
    # L373 grad_reduce_in_fp32=False, L380-382 bf16 moments
    assert v["grad_reduce_in_fp32"] is False
    assert (v["exp_avg_dtype"], v["exp_avg_sq_dtype"]) == ("bf16", "bf16")
    # _pretrain_common is not beside the file: its values are said to come from a pinned copy
    helper = [w for w in r.warnings if "_pretrain_common()" in w]
    assert helper and "micro_batch_size=2" in helper[0] and "067f987" in helper[0]
    assert v["micro_batch_size"] == 1  # the recipe's L334 wins over the helper's 2


def test_a_helper_beside_the_file_is_followed_and_one_not_found_is_named(tmp_path: Path) -> None:
    recipes = tmp_path / "src" / "megatron" / "bridge" / "recipes"
    (recipes / "fam").mkdir(parents=True)
    (recipes / "common.py").write_text(
        "def _pretrain_common() -> ConfigContainer:\n"
        "    cfg = ConfigContainer(\n"
        "        train=TrainingConfig(micro_batch_size=3),\n"
        "        ddp=DistributedDataParallelConfig(grad_reduce_in_fp32=False),\n"
        "        mixed_precision='bf16_mixed',\n"
        "    )\n"
        "    return cfg\n"
    )
    recipe = recipes / "fam" / "model.py"
    recipe.write_text(
        "from megatron.bridge.recipes.common import _pretrain_common\n"
        "def model_pretrain_8gpu_config() -> ConfigContainer:\n"
        "    cfg = _pretrain_common()\n"
        "    cfg.model.tensor_model_parallel_size = 4\n"
        "    return cfg\n"
    )
    r = bridge.read(recipe.read_text(), str(recipe))
    assert r.values["micro_batch_size"] == 3
    assert r.origins["micro_batch_size"].where == f"{(recipes / 'common.py').resolve()}:3"
    # bf16_mixed's grad_reduce_in_fp32 overwrites the DDP config's (MixedPrecisionConfig.setup)
    assert r.values["grad_reduce_in_fp32"] is True and r.values["bf16"] is True
    assert r.values["tensor_model_parallel_size"] == 4
    assert not any("not beside" in w for w in r.warnings)
    # re-exported under another name, called from a function of the same name as the recipe
    (recipes / "fam" / "alias.py").write_text(
        "from megatron.bridge.recipes.fam.model import model_pretrain_8gpu_config as model_cfg\n"
    )
    perf = tmp_path / "src" / "megatron" / "bridge" / "perf" / "model.py"
    perf.parent.mkdir(parents=True)
    perf.write_text(
        "from megatron.bridge.recipes.fam.alias import model_cfg\n"
        "def model_pretrain_8gpu_config() -> ConfigContainer:\n"
        "    cfg = model_cfg()\n"
        "    cfg.model.pipeline_model_parallel_size = 2\n"
        "    return cfg\n"
    )
    r = bridge.read(perf.read_text(), str(perf))
    assert r.values["tensor_model_parallel_size"] == 4 and r.values["micro_batch_size"] == 3
    assert r.values["pipeline_model_parallel_size"] == 2
    # a helper that is neither in the file, beside it nor known: each key left to defaults named
    lone = tmp_path / "lone.py"
    lone.write_text(recipe.read_text().replace("recipes.common", "recipes.elsewhere"))
    r = bridge.read(lone.read_text(), str(lone))
    (w,) = [w for w in r.warnings if "not found beside the file" in w]
    assert "_pretrain_common()" in w and "micro_batch_size" in w and "seq_length" in w


def test_recipe_expressions_are_evaluated_not_run(tmp_path: Path) -> None:
    text = (
        "def _layout(pp, vp=None):\n"
        "    last = ['decoder'] * 2 + ['loss']\n"
        "    table = {(2, 1): [['embedding'] + ['decoder'] * 2, last]}\n"
        "    return table[(pp, 1 if vp is None else vp)]\n"
        "def set_layout(model_cfg, layout=None):\n"
        "    if layout is not None:\n"
        "        model_cfg.pipeline_model_parallel_layout = layout\n"
        "        return\n"
        "    model_cfg.pipeline_model_parallel_layout = _layout(\n"
        "        model_cfg.pipeline_model_parallel_size or 1,\n"
        "        getattr(model_cfg, 'virtual_pipeline_model_parallel_size', 1))\n"
        "def small_pretrain_4gpu_config(use_cp: bool = False) -> ConfigContainer:\n"
        "    cfg = make_cfg()\n"
        "    tp = 2\n"
        "    cfg.model.tensor_model_parallel_size = tp * 2\n"
        "    cfg.model.pipeline_model_parallel_size = 2\n"
        "    cfg.model.virtual_pipeline_model_parallel_size = None\n"
        "    set_layout(cfg.model)\n"
        "    if use_cp:\n"
        "        cfg.model.context_parallel_size = 8\n"
        "    else:\n"
        "        cfg.model.context_parallel_size = 1\n"
        "    cfg.model.num_layers = len([0] * 10**12)\n"
        "    cfg.model.expert_model_parallel_size = 2 ** 10 ** 10\n"
        "    cfg.model.seq_length = compute_seq()\n"
        "    return cfg\n"
    )
    r = bridge.read(text, str(tmp_path / "r.py"))
    assert r.values["tensor_model_parallel_size"] == 4
    assert r.values["pipeline_model_parallel_layout"] == [
        ["embedding", "decoder", "decoder"],
        ["decoder", "decoder", "loss"],
    ]
    assert r.origins["pipeline_model_parallel_layout"].where.endswith("r.py:9")
    assert r.values["context_parallel_size"] == 1  # the parameter's default decides the branch
    for key in ("num_layers", "expert_model_parallel_size", "seq_length"):
        assert key not in r.values
        assert any(f"cfg.model.{key} = " in w and "not a literal" in w for w in r.warnings)


def test_over_a_recipe_not_read_grad_reduce_is_bridges_helper_value_said_so() -> None:
    # DDP's grad_reduce_in_fp32 defaults to False in Megatron-Core
    # (megatron/core/distributed/distributed_data_parallel_config.py); True is Bridge's
    # _pretrain_common (recipes/common.py L82 @067f987) and bf16_mixed.
    line = "run_recipe.py --recipe deepseek_v3_pretrain_config model.tensor_model_parallel_size=2"
    r = bridge.read(line, "cmd.sh")
    bridge.apply_defaults(r)
    assert r.values["grad_reduce_in_fp32"] is True
    where = r.origins["grad_reduce_in_fp32"].where
    assert "_pretrain_common" in where and "TransformerConfig" not in where


def test_an_assumed_data_parallel_size_names_dp():
    # a skill trial: the assumption named `(WORLD_SIZE // (TP*PP*CP))` and not the kit's --dp
    from recompute_kit.sources.resolve import resolve

    recipe = Path(__file__).parent / "corpus" / "bridge" / "bridge_deepseek_v3_h100_recipes.py"
    r = resolve([str(recipe)], require_shape=False)
    [said] = [a for a in r.config.assumptions if a.startswith("data_parallel_size")]
    assert "--dp" in said and "--nproc_per_node" in said


def test_a_value_set_in_an_undecided_branch_is_said():
    # Megatron-Bridge's DeepSeek-V3 H100 recipe (tests/sources/corpus/bridge, its URL in the
    # corpus README) sets cfg.dist.enable_megatron_core_experimental inside
    # `if cfg.model.apply_rope_fusion:`, which the values read do not decide; a perf script's
    # `if recompute_num_layers is not None:` set recompute_granularity full the same way (a
    # skill trial): what such a branch sets is read as taken and said so
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "bridge" / "bridge_deepseek_v3_h100_recipes.py"
    r = resolve([str(path)], require_shape=False)
    said = [w for w in r.warnings if "is not decided by the values read" in w]
    assert any("apply_rope_fusion" in w and "enable_megatron_core_experimental" in w for w in said)


def test_a_value_from_an_undecided_branch_is_an_assumption_and_no_verdict_rests_on_it(tmp_path):
    # A skill trial on Megatron-Bridge's perf configs (v0.5.0 scripts/performance/utils/
    # overrides.py: `if cpu_offloading_num_layers is not None and cpu_offloading_num_layers >
    # 0: recipe.model.cpu_offloading = True`, the layer count a function argument the file
    # does not give): cpu_offloading True was read as the file's, beside recompute, and the
    # doctor "diagnosed" Megatron's CPU-offloading refusal at 90%. The branch's values are
    # assumptions; a refusal resting on them is a possibility.
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect
    from recompute_kit.sources.resolve import resolve

    recipe = tmp_path / "perf.py"
    recipe.write_text(
        "from megatron.bridge.models import Llama3ModelProvider8B\n"
        "from megatron.bridge.training.config import ConfigContainer\n"
        "def perf_config(cpu_offloading_num_layers=settings.offload_layers) -> ConfigContainer:\n"
        "    cfg = ConfigContainer(model=Llama3ModelProvider8B())\n"
        "    cfg.model.recompute_granularity = 'full'\n"
        "    cfg.model.recompute_method = 'uniform'\n"
        "    cfg.model.recompute_num_layers = 1\n"
        "    if cpu_offloading_num_layers is not None and cpu_offloading_num_layers > 0:\n"
        "        cfg.model.cpu_offloading = True\n"
        "    return cfg\n"
    )
    r = resolve([str(recipe)], require_shape=False)
    assert r.reading.get("cpu_offloading") is True
    assert r.reading.origins["cpu_offloading"].kind == "assumed"
    d = diagnose(collect(config=str(recipe)), gpu_memory_gb=79.1)
    refusal = [f for f in d.findings if f.rule == "RK059"]
    assert refusal and all(f.raw_confidence <= 0.5 for f in refusal)
    assert d.verdict.verdict == "needs_evidence"


def test_a_nemo2_llama_config_has_no_dropout_and_its_fusions_on() -> None:
    # A skill trial on NeMo 2.0's llama3_70b recipe: hidden / attention dropout were read as
    # Megatron-Core's 0.1 and the bias-activation / softmax / RoPE fusions as off; NeMo's
    # LlamaConfig, which every Llama*Config* extends, sets 0.0 and True (NVIDIA/NeMo
    # nemo/collections/llm/gpt/model/llama.py). With dropout the estimate kept 18% more.
    from recompute_kit.sources.resolve import resolve

    recipe = CORPUS / "nemo2_llama3_8b.py"
    r = resolve([str(recipe)], require_shape=False).reading
    for key, value in (("hidden_dropout", 0.0), ("attention_dropout", 0.0)):
        assert r.get(key) == value, key
    for key in ("bias_activation_fusion", "masked_softmax_fusion", "apply_rope_fusion"):
        assert r.get(key) is True, key
    # (the dropout here also comes from the registry's HF config; the fusions only from NeMo)
    assert "NeMo's LlamaConfig" in r.origins["bias_activation_fusion"].describe()


def test_autobridge_llama_runs_take_the_llama_bridges_settings_not_megatron_cores():
    # A skill trial on Bridge's Llama 3 70B perf recipe (cfg.model = AutoBridge
    # .from_hf_pretrained(...)): hidden and attention dropout 0.1 and both fusions off were
    # read as "Megatron-Core's TransformerConfig default"; Bridge's LlamaBridge sets dropout 0.0
    # and the fusions on (models/llama/llama_bridge.py lines 55-57), as the resolved config of a
    # real Bridge Llama run shows (blind_llama3_70b_sft_gb200_fp8_mx_v1.yaml lines 275-389).
    # The stage-0 estimate fell from 65.6 to 54.1 GiB.
    from recompute_kit.sources import bridge_common
    from recompute_kit.sources.reading import Reading
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "bridge" / "bridge_llama3_8b.py"
    r = resolve([str(path)]).reading
    assert (r.get("bias_activation_fusion"), r.get("masked_softmax_fusion")) == (True, True)
    assert r.origins["bias_activation_fusion"].where.endswith("llama/llama_bridge.py#L56")
    # a Llama id the registry does not hold: the family its id names, said
    unregistered = Reading(framework="megatron-bridge", model_name="meta-llama/Meta-Llama-3-70B")
    bridge_common.apply_provider_settings(unregistered)
    assert unregistered.get("hidden_dropout") == 0.0
    assert unregistered.get("attention_dropout") == 0.0
    said = unregistered.origins["hidden_dropout"].note
    assert "by the model id meta-llama/Meta-Llama-3-70B" in said


def test_a_deepseek_v3_family_id_the_registry_lacks_takes_the_transformers_class_dropout():
    # Bridge's Moonlight-16B recipe (recipes/moonlight/h100/moonlight_16b.py) read
    # attention_dropout 0.1, Megatron-Core's default; AutoBridge copies config.json's
    # attention_dropout (model_bridge.py CONFIG_MAPPING line 469), and transformers'
    # DeepseekV3Config defaults it to 0.0 (models/deepseek_v3/configuration_deepseek_v3.py).
    from recompute_kit.sources import bridge_common
    from recompute_kit.sources.reading import Reading

    moonlight = Reading(framework="megatron-bridge", model_name="moonshotai/Moonlight-16B-A3B")
    bridge_common.apply_provider_settings(moonlight)
    assert moonlight.get("attention_dropout") == 0.0
    assert "DeepseekV3Config" in moonlight.origins["attention_dropout"].note


def test_a_provider_class_in_the_checkout_gives_the_shape_it_sets(tmp_path):
    # Bridge's OLMoE recipe builds OlMoEModelProvider(...), which sets the whole shape as
    # dataclass defaults (models/olmoe/olmoe_provider.py lines 53-95); the recipe read alone was
    # refused ("no model shape ... --model meta-llama/Llama-3.1-8B"). In its checkout (the
    # package's __init__ re-exports the class) the provider's own lines are read; without the
    # checkout the refusal names the class and what would give the shape.
    from recompute_kit.sources.resolve import resolve

    root = Path(__file__).parent / "corpus" / "bridge_checkout" / "src"
    recipe = root / "megatron" / "bridge" / "recipes" / "olmoe" / "h100" / "olmoe_7b.py"
    r = resolve([str(recipe)]).reading
    shape = [r.get(k) for k in ("num_layers", "hidden_size", "num_moe_experts", "moe_router_topk")]
    assert shape == [16, 2048, 64, 8]
    assert r.origins["num_layers"].where.endswith("olmoe_provider.py:69")
    assert r.get("attention_dropout") == 0.0  # the provider's, not Megatron-Core's 0.1
    # what the recipe writes after the class wins over the class's default
    assert r.get("recompute_granularity") == "selective"
    alone = tmp_path / "olmoe_7b.py"
    alone.write_text(recipe.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"OlMoEModelProvider .* not beside this file"):
        resolve([str(alone)])


@pytest.mark.parametrize(
    "recipe",
    ["nemotron_3_nano.py", "nemotron_3_nano.py::nemotron_3_nano_pretrain_8gpu_h100_bf16_config"],
)
def test_a_hybrid_provider_with_mamba_layers_is_read_but_not_sized(recipe):
    # Bridge's Nemotron 3 recipes build HybridModelProvider(hybrid_layer_pattern="MEMEM*E...",
    # is_hybrid_model=True): its 52 layers were sized as 52 attention + MoE layers (weights
    # 20.5 GiB and optimizer 99.7 GiB a rank on 8 GPUs); the first recipe names a model
    # (NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16) the family names did not catch either.
    from recompute_kit.sources.resolve import resolve

    folder = Path(__file__).parent / "corpus" / "bridge_checkout" / "src"
    path = folder / "megatron" / "bridge" / "recipes" / "nemotronh" / "h100" / recipe
    resolved = resolve([str(path)])
    assert "hybrid_layer_pattern=): a hybrid model with Mamba" in resolved.config.model.not_modelled
    assert len(resolved.reading.not_modelled) == 1, resolved.reading.not_modelled  # said once


@pytest.mark.parametrize(
    ("name", "hybrid"),
    [
        ("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16", True),
        ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", True),
        ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", True),
        ("nvidia/Llama-3.1-Nemotron-Nano-8B-v1", False),  # a Llama
        ("nvidia/Nemotron-4-340B-Base", False),
    ],
)
def test_hybrid_families_by_name(name, hybrid):
    from recompute_kit.sources import resolve as resolving

    assert bool(resolving._NOT_MODELLED_NAME.search(name)) is hybrid


def test_a_fresh_optimizer_config_replaces_the_distributed_adam_it_follows():
    # Bridge's Kimi K2 recipe: _pretrain_common() builds distributed Adam, then
    # _apply_kimi_k2_optimizer(cfg, "muon") assigns a fresh OptimizerConfig(optimizer=
    # "dist_muon", ...) (its use_distributed_optimizer left at Megatron-Core's False) and sets
    # ddp.use_distributed_optimizer = False: both sections off, so Bridge's sync
    # (_validate_and_sync_distributed_optimizer_settings) leaves it off. It was read on (the
    # replaced Adam's True). Muon's states are not Adam's: said.
    from recompute_kit.sources.resolve import resolve

    root = Path(__file__).parent / "corpus" / "bridge_checkout" / "src"
    recipe = root / "megatron" / "bridge" / "recipes" / "kimi" / "h100" / "kimi_k2.py"
    r = resolve([str(recipe)], require_shape=False).reading
    assert r.get("use_distributed_optimizer") is False
    assert r.origins["use_distributed_optimizer"].where.endswith("kimi_k2.py:74")
    assert any("dist_muon" in w and "upper bound" in w for w in r.warnings)


def test_bridge_takes_expert_tp_1_where_the_recipe_leaves_it_unset():
    # Megatron-Bridge finalizes an unset expert_tensor_parallel_size to 1 under expert
    # parallelism (models/transformer_config.py lines 80-88), not Megatron-Core's TP: a skill
    # trial had gpt_oss_120b_sft_48gpu_h100_bf16_32k_config (TP2, EP4) refused with "Bias in
    # Moe is only supported when ETP==1" and had to pass --etp 1 everywhere.
    from recompute_kit.memory.estimate import estimate
    from recompute_kit.sources.resolve import resolve

    root = Path(__file__).parent / "corpus" / "bridge_checkout" / "src"
    recipe = root / "megatron" / "bridge" / "recipes" / "gpt_oss" / "h100" / "gpt_oss.py"
    resolved = resolve([f"{recipe}::gpt_oss_120b_sft_48gpu_h100_bf16_32k_config"])
    r = resolved.reading
    assert (r.get("expert_model_parallel_size"), r.get("expert_tensor_parallel_size")) == (4, 1)
    assert r.origins["expert_tensor_parallel_size"].where.endswith("transformer_config.py#L80")
    assert estimate(resolved.config).total_bytes > 0  # validated and sized


def test_dp_that_sets_the_world_drops_the_warning_about_the_world_it_replaces():
    # A skill trial: `--pp 4 --dp 1` on the 48-GPU gpt-oss-120b recipe said both "world_size 48
    # is not a multiple of TP*PP*CP 32" and "--dp 1 ... sets the world size: 32 GPUs".
    from recompute_kit.sources.resolve import resolve

    root = Path(__file__).parent / "corpus" / "bridge_checkout" / "src"
    recipe = root / "megatron" / "bridge" / "recipes" / "gpt_oss" / "h100" / "gpt_oss.py"
    over = {"pipeline_model_parallel_size": 4, "data_parallel_size": 1}
    r = resolve([f"{recipe}::gpt_oss_120b_sft_48gpu_h100_bf16_32k_config"], overrides=over).reading
    assert r.get("world_size") == 32
    assert not any("is not a multiple of TP*PP*CP" in w for w in r.warnings), r.warnings
    assert any("sets the world size: 32 GPUs" in w for w in r.warnings)
