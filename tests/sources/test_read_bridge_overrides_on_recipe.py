"""An overrides file read beside a Megatron-Bridge recipe applies on top of that recipe (the
skill trial on the real Qwen3-30B-A3B 16-GPU H100 recipe), and the sequence-length overrides
say what Megatron-Bridge does with them. The recipe is the verbatim Megatron-Bridge 067f987
file (tests/sources/corpus/bridge_checkout/README.md); the overrides are the trial's files."""

from __future__ import annotations

from pathlib import Path

from recompute_kit.sources.bridge import ON_RECIPE
from recompute_kit.sources.reading import FROM_ASSUMED, FROM_FILE
from recompute_kit.sources.resolve import resolve

BRIDGE_CHECKOUT = Path(__file__).parent / "corpus/bridge_checkout"
H100 = BRIDGE_CHECKOUT / "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py"
RECIPE = f"{H100}::qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
# The trial's overrides.txt and overrides_8k.txt, verbatim.
OVERRIDES = (
    "model.seq_length=8192 model.recompute_granularity=selective "
    "model.recompute_modules=[moe_act,layernorm] train.micro_batch_size=2\n"
)
OVERRIDES_8K = (
    "model.seq_length=8192 dataset.seq_length=8192 model.recompute_granularity=selective "
    "model.recompute_modules=[moe_act,layernorm] train.micro_batch_size=2\n"
)


def _read(tmp_path: Path, text: str, first: str = RECIPE):
    path = tmp_path / "overrides.txt"
    path.write_text(text)
    return resolve([first, str(path)], overrides={"data_parallel_size": 16}).reading


def test_overrides_after_a_recipe_apply_on_it_with_its_provenance(tmp_path):
    r = _read(tmp_path, OVERRIDES)
    assert ON_RECIPE not in r.unused  # was "unknown recipe" although the recipe was read
    assert not any("unknown recipe" in w for w in r.warnings)
    assert not any(w.startswith("assumed:") for w in r.warnings)
    # bf16_mixed() at line 154 is a whole MixedPrecisionConfig: its fp8 is None
    assert r.get("fp8") is None and r.origins["fp8"].kind == FROM_FILE
    assert r.origins["fp8"].where.endswith("h100/qwen3_moe.py:154")
    for key in ("cpu_offloading", "make_vocab_size_divisible_by", "store_param_remainders"):
        assert r.origins[key].kind != FROM_ASSUMED, key
        assert "the recipe (" not in r.origins[key].describe(), key
    # the overrides still win where they speak
    assert r.get("micro_batch_size") == 2
    assert r.get("recompute_modules") == ["moe_act", "layernorm"]


def test_model_seq_length_alone_says_both_outcomes_and_the_keys_that_set_it(tmp_path):
    r = _read(tmp_path, OVERRIDES)
    assert r.get("seq_length") == 4096  # what run_recipe.py runs: the recipe's dataset length
    said = [w for w in r.warnings if "model.seq_length=8192 alone" in w]
    assert len(said) == 1
    w = said[0]
    # Megatron-Bridge 067f987: run_recipe.py syncs (recipe_runner.py:471-487), other entry
    # points reach ConfigContainer.validate's assert (training/config.py:1644) and stop
    assert "sync_model_dataset_sequence_length" in w and "recipe_runner.py:486" in w
    assert "stops before training at ConfigContainer.validate's assert" in w
    assert "config.py:1644" in w
    assert "set dataset.seq_length=8192 model.seq_length=8192 together" in w
    assert "stops when it differs" not in w  # the old self-contradicting wording


def test_both_lengths_set_together_are_the_run_length_without_a_warning(tmp_path):
    r = _read(tmp_path, OVERRIDES_8K)
    assert r.get("seq_length") == 8192
    assert not any("model.seq_length=8192 together" in w for w in r.warnings)


def test_dataset_length_alone_outside_run_recipe_warns_of_the_assert(tmp_path):
    r = _read(tmp_path, "dataset.seq_length=8192 model.recompute_granularity=selective\n")
    assert r.get("seq_length") == 8192  # run_recipe.py's outcome (it syncs the model)
    said = [w for w in r.warnings if "without model.seq_length" in w]
    assert len(said) == 1 and "ConfigContainer.validate's assert" in said[0]
    assert "set dataset.seq_length=8192 model.seq_length=8192 together" in said[0]
    # under run_recipe.py the sync makes it whole: nothing to say
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "python scripts/training/run_recipe.py dataset.seq_length=8192 "
        "model.recompute_granularity=selective\n"
    )
    r = resolve([RECIPE, str(launch)], overrides={"data_parallel_size": 16}).reading
    assert r.get("seq_length") == 8192
    assert not any("without model.seq_length" in w for w in r.warnings)


def test_overrides_given_before_the_recipe_still_apply_on_top_of_it(tmp_path):
    path = tmp_path / "overrides.txt"
    path.write_text(OVERRIDES_8K)
    r = resolve([str(path), RECIPE], overrides={"data_parallel_size": 16}).reading
    assert ON_RECIPE not in r.unused
    assert r.get("seq_length") == 8192 and r.get("micro_batch_size") == 2  # not the recipe's
    assert r.origins["micro_batch_size"].where == f"{path}:1"


def test_a_yaml_of_overrides_beside_the_recipe_names_it(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text("model:\n  recompute_granularity: selective\ntrain:\n  micro_batch_size: 2\n")
    r = resolve([RECIPE, str(path)], overrides={"data_parallel_size": 16}).reading
    assert ON_RECIPE not in r.unused
    assert not any("not read here" in w for w in r.warnings)
    assert any(
        "applied on top of recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config" in w
        for w in r.warnings
    )
    assert r.get("fp8") is None and r.origins["fp8"].kind == FROM_FILE


def test_a_lone_length_override_is_said_not_refused():
    # A skill trial: `read RECIPE model.seq_length=8192 --dp 32` failed with "no Megatron-Bridge
    # overrides (key=value) found": the one override, which run_recipe.py resets from
    # dataset.seq_length, had been dropped before the check. It is read, and its warning says so.
    r = resolve([RECIPE, "model.seq_length=8192"], overrides={"data_parallel_size": 16}).reading
    assert r.get("seq_length") == 4096  # the recipe's dataset.seq_length is what runs
    assert any("model.seq_length=8192 alone does not set the run's length" in w for w in r.warnings)


def test_a_named_precision_override_and_bridge_0_5s_full_iteration_graph_are_read(tmp_path):
    # A skill trial on Megatron-Bridge#4587 (Qwen3-30B-A3B fp8_mx): `mixed_precision=
    # bf16_with_mxfp8_mixed` (Bridge's docs map --bf16 to mixed_precision=bf16_mixed) was
    # "not a section.key=value override" and fp8 "assumed None"; `model.cuda_graph_impl=
    # full_iteration` (Bridge v0.5.0's recipes, Megatron-Core 0.18's spelling) was refused.
    from recompute_kit.sources.hydra import apply_after

    r = _read(tmp_path, "mixed_precision=bf16_with_mxfp8_mixed train.micro_batch_size=2\n")
    assert (r.get("fp8"), r.get("fp8_recipe")) == ("hybrid", "mxfp8")
    assert r.origins["fp8"].key.startswith("mixed_precision")
    after = apply_after(_read(tmp_path, OVERRIDES), ["mixed_precision=bf16_with_mxfp8_mixed"], "x")
    assert after.get("fp8_recipe") == "mxfp8"
    assert not any("not a section.key=value" in w for w in after.warnings)

    graph = "model.cuda_graph_impl=full_iteration model.cuda_graph_scope=[] " + (
        "model.recompute_granularity=full "
        "model.recompute_method=uniform model.recompute_num_layers=1\n"
    )
    path = tmp_path / "graph.txt"
    path.write_text(graph)
    cfg = resolve([RECIPE, str(path)], overrides={"data_parallel_size": 16}).config
    cfg.validate()  # the version unknown: 0.18's meaning, a full-iteration graph
    import dataclasses

    import pytest

    from recompute_kit.config import ConfigError

    old = dataclasses.replace(cfg, megatron_core_version="0.16")
    with pytest.raises(ConfigError, match="spells it cuda_graph_impl local"):
        old.validate()


# Megatron-Bridge 067f987's examples/models/qwen/qwen3_next/finetune_qwen3_next_80b_a3b.py
# docstring commands and conf/qwen3_next_80b_a3b_finetune_override_example.yaml (cut), verbatim:
# https://github.com/NVIDIA-NeMo/Megatron-Bridge/tree/067f987df03b8355b03192d88d70f1709fedf51a/examples/models/qwen/qwen3_next
EXAMPLE_CLI = (
    "torchrun --nproc_per_node=8 finetune_qwen3_next_80b_a3b.py "
    "model.tensor_model_parallel_size=4 train.train_iters=100000\n"
)
EXAMPLE_YAML_CMD = (
    "torchrun --nproc_per_node=8 finetune_qwen3_next_80b_a3b.py --config-file "
    "conf/qwen3_next_80b_a3b_pretrain_override_example.yaml\n"
)
EXAMPLE_YAML = (
    "model:\n  seq_length: 2048\n  cross_entropy_loss_fusion: False\n\ntrain:\n"
    "  train_iters: 600\n  global_batch_size: 64\n  micro_batch_size: 1\n  eval_iters: 5\n"
    "\ndataset:\n  seq_length: 2048\n"
)


def test_an_example_scripts_command_is_read_as_bridge_overrides_on_its_recipe(tmp_path):
    # was refused: "no training command found (torchrun, deepspeed, accelerate)", the Hugging
    # Face launch reader's, which claimed it for the .yaml it names
    cmd = tmp_path / "cmd.sh"
    cmd.write_text(EXAMPLE_CLI)
    r = resolve([str(cmd)], require_shape=False).reading
    assert r.framework == "megatron-bridge" and "finetune_qwen3_next_80b_a3b.py" in r.format
    assert r.get("tensor_model_parallel_size") == 4 and r.get("world_size") == 8
    assert r.unused[ON_RECIPE] == "unknown recipe"  # the script's recipe is not read: said


def test_an_example_scripts_config_file_is_merged_under_its_overrides(tmp_path):
    cmd = tmp_path / "cmd.sh"
    cmd.write_text(EXAMPLE_YAML_CMD.replace("\n", " dataset.seq_length=8192\n"))
    missing = resolve([str(cmd)], require_shape=False).reading
    assert any("--config-file conf/qwen3_next" in w and "not found" in w for w in missing.warnings)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/qwen3_next_80b_a3b_pretrain_override_example.yaml").write_text(EXAMPLE_YAML)
    r = resolve([str(cmd)], require_shape=False).reading
    assert r.get("global_batch_size") == 64 and r.get("micro_batch_size") == 1
    assert r.get("seq_length") == 8192  # the command's override wins over the YAML's 2048
    assert r.origins["global_batch_size"].where.endswith("example.yaml:7")


def test_a_bridge_slurm_script_is_read_with_its_variables_its_case_and_its_layout_loop():
    # Megatron-Bridge's own slurm_sft.sh (bridge_checkout/README.md): its overrides sit in a
    # quoted variable over 25 lines (was "cannot split the command line (No closing
    # quotation)"); the recipe name comes from a `case` on glob patterns, the layout from a
    # `for` over PARALLELISM_CONFIGS split by `IFS=',' read -r TP PP EP CP SP <<< "$CONFIG"`
    # (were "not followed": a skill trial typed the layout in by hand)
    script = BRIDGE_CHECKOUT / "examples/models/gpt_oss/slurm_sft.sh"
    r = resolve([str(script)], require_shape=False).reading
    assert r.get("micro_batch_size") == 1  # =$MICRO_BATCH_SIZE, set to 1 on line 87
    assert r.origins["micro_batch_size"].where.endswith("slurm_sft.sh:199")
    assert r.get("world_size") == 16  # #SBATCH --nodes=2 x --ntasks-per-node=8
    assert r.model_name == "openai/gpt-oss-20b"  # --recipe gpt_oss_20b_sft_config (the `*)` arm)
    assert (r.get("seq_length"), r.get("global_batch_size")) == (2048, 8)
    layout = ("tensor_model_parallel_size", "pipeline_model_parallel_size")
    assert [r.get(k) for k in layout] == [2, 2] and r.get("expert_model_parallel_size") == 4
    assert r.get("sequence_parallel") is True
    said = "\n".join(r.warnings)
    assert "a `for` loop over 2 values is read once, with its first: CONFIG=2,2,4,1,True" in said


def test_bridge_slurm_scripts_with_quoted_overrides_or_a_quoted_command_name_their_recipe():
    # Megatron-Bridge's gemma4 slurm_pretrain.sh quotes each override ("model.seq_length=...")
    # and mentions pretrain_gpt.py: it was read as a Megatron-LM script ("no Megatron-LM
    # training command or flags found"); deepseek_v4's slurm_sft.sh runs run_recipe.py inside
    # `bash -c "..."`: its --recipe was not seen
    gemma = BRIDGE_CHECKOUT / "examples/models/gemma/gemma4/slurm_pretrain.sh"
    r = resolve([str(gemma)], require_shape=False).reading
    assert r.framework == "megatron-bridge" and "gemma4_e4b_pretrain_config" in r.format
    assert r.origins["world_size"].where.endswith("slurm_pretrain.sh:240")  # $GPUS_PER_NODE's
    deepseek = BRIDGE_CHECKOUT / "examples/models/deepseek_v4/slurm_sft.sh"
    r = resolve([str(deepseek)], require_shape=False).reading
    assert "on recipe deepseek_v4_flash_sft_config" in r.format  # MTP=${MTP:-on}'s case arm


def test_a_peft_recipe_or_mode_trains_adapters_on_frozen_weights(tmp_path):
    # Megatron-Bridge's gpt_oss slurm_peft.sh names gpt_oss_20b_peft_config, which run_recipe.py
    # runs as LoRA (scripts/training/recipe_metadata.py infer_recipe_mode: `_peft_` / `_lora_`
    # LoRA, `_dora_` DoRA); the estimate counted full fine-tuning's states
    peft = BRIDGE_CHECKOUT / "examples/models/gpt_oss/slurm_peft.sh"
    r = resolve([str(peft)], require_shape=False).reading
    assert r.get("frozen_base") is True and r.origins["frozen_base"].key == "--recipe"
    # --mode says it whatever the name; a pretraining recipe and --mode sft do not
    cmd = tmp_path / "cmd.sh"
    cmd.write_text("python run_recipe.py --recipe qwen3_8b_pretrain_config --mode lora -sl 4096\n")
    assert resolve([str(cmd)], require_shape=False).reading.get("frozen_base") is True
    cmd.write_text("python run_recipe.py --recipe qwen3_8b_pretrain_config -sl 4096\n")
    assert resolve([str(cmd)], require_shape=False).reading.get("frozen_base") is not True
    sft = BRIDGE_CHECKOUT / "examples/models/gpt_oss/slurm_sft.sh"  # --mode sft
    assert resolve([str(sft)], require_shape=False).reading.get("frozen_base") is not True


def test_the_default_reading_says_the_dtype_the_reader_assumed():
    # the doctor on that script (no OOM, an H100): its default reading said "dtype: not in the
    # paste (fp32 unless set)" while the reader had taken Megatron-Bridge's bf16 mixed precision
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    peft = BRIDGE_CHECKOUT / "examples/models/gpt_oss/slurm_peft.sh"
    d = diagnose(collect(config=[str(peft)]), 79.1)
    said = " ".join(f.evidence for f in d.findings if f.rule == "RK170")
    assert "dtype: nothing read sets it (bf16 assumed)" in said and "fp32 unless set" not in said
    assert "LoRA (adapters on frozen weights)" in said
