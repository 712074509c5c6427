"""The Megatron-LM reader: launch scripts, argument lists, functional-test model_config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.config.pipeline_layout import expand_layout
from recompute_kit.sources import megatron_lm
from recompute_kit.sources.resolve import resolve
from recompute_kit.sources.shell import parse_script

CORPUS = Path(__file__).parent / "corpus" / "megatron_lm"


def _read(path: Path):
    text = path.read_text()
    reading = megatron_lm.read(text, str(path))
    megatron_lm.apply_defaults(reading)
    return reading


# --- focused semantics -------------------------------------------------------------------


def _args(text: str, path: str = "args.txt"):
    reading = megatron_lm.read(text, path)
    megatron_lm.apply_defaults(reading)
    return reading


BASE = "--num-layers 4 --hidden-size 4096 --num-attention-heads 32 "


def test_gqa_trap_num_query_groups_needs_group_query_attention():
    # megatron/training/argument_utils.py: num_query_groups = None unless group_query_attention
    r = _args(BASE + "--num-query-groups 8")
    assert r.get("num_query_groups") == 32
    assert any("--group-query-attention" in w for w in r.warnings)
    r = _args(BASE + "--group-query-attention --num-query-groups 8")
    assert r.get("num_query_groups") == 8
    r = _args(BASE + "--group-query-attention")
    assert r.get("num_query_groups") == 1  # argparse default 1


def test_swiglu_ffn_rule():
    # arguments.py: int((4 * h * 2 / 3) / 64) * 64 -> 10880 for h=4096 (not Llama's 14336)
    assert _args(BASE + "--swiglu").get("ffn_hidden_size") == 10880
    assert _args(BASE).get("ffn_hidden_size") == 16384
    assert _args(BASE).get("kv_channels") == 128


def test_recompute_activations_is_selective_whatever_granularity_says():
    r = _args(BASE + "--recompute-activations --recompute-granularity full")
    assert r.get("recompute_granularity") == "selective"
    assert r.get("recompute_modules") == ["core_attn"]


def test_moe_layer_freq_list_expression_without_eval():
    # https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/arguments.py
    assert megatron_lm.moe_layer_freq("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert megatron_lm.moe_layer_freq("([1]*3+[0]*1)*3") == [1, 1, 1, 0] * 3
    assert megatron_lm.moe_layer_freq("2") == 2
    for bad in ("__import__('os')", "[0]*10**9", "[2]*3", "[0]+1", "([0]*3)+x"):
        with pytest.raises(ValueError):
            megatron_lm.moe_layer_freq(bad)
    with pytest.raises(ConfigError):
        _args(BASE + "--num-experts 8 --moe-layer-freq \"[0]+open('x')\"")


def test_vpp_from_layers_per_virtual_stage_and_layout():
    r = _args(
        BASE.replace("4", "32", 1) + "--pipeline-model-parallel-size 4 "
        "--num-layers-per-virtual-pipeline-stage 2"
    )
    assert r.get("virtual_pipeline_model_parallel_size") == 4
    r = _args(BASE + "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1")
    assert r.get("virtual_pipeline_model_parallel_size") is None  # 1 -> None
    assert len(expand_layout("Et*3|(tt|)*6tmL")) == 8


def test_vpp_waits_for_num_layers_from_the_model():
    r = megatron_lm.read(
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
        "--hidden-size 8 --tensor-model-parallel-size 1",
        "a.txt",
    )
    assert "virtual_pipeline_model_parallel_size" not in r
    r.set("num_layers", 16, megatron_lm.Origin("model", "registry"))
    megatron_lm.apply_defaults(r)
    assert r.get("virtual_pipeline_model_parallel_size") == 4
    assert r.origins["virtual_pipeline_model_parallel_size"].kind == "derived"


def test_sequence_parallel_off_at_tp1_and_dp_from_world():
    r = _args(BASE + "--sequence-parallel")
    assert r.get("sequence_parallel") is False
    assert r.origins["sequence_parallel"].kind == "derived"
    assert any("sequence_parallel" in w for w in r.warnings)


def test_vocab_size_only_with_null_tokenizer():
    # megatron/core/tokenizers/utils/build_tokenizer.py: vocab_size passed only for
    # NullTokenizer / TikTokenizer
    assert (
        _args(BASE + "--vocab-size 1000 --tokenizer-type NullTokenizer").get("vocab_size") == 1000
    )
    r = _args(BASE + "--vocab-size 1000 --tokenizer-type HuggingFaceTokenizer")
    assert "vocab_size" not in r


def test_defaults_and_no_defaults():
    r = _args(BASE)
    assert "seq_length" not in r and "micro_batch_size" not in r and "vocab_size" not in r
    assert r.get("share_embeddings_and_output_weights") is True
    assert r.get("attention_backend") == "auto"
    assert r.get("bias_activation_fusion") is True and r.get("masked_softmax_fusion") is True
    assert r.get("attention_softmax_in_fp32") is False
    assert r.get("bf16") is False and r.get("fp16") is False
    assert megatron_lm.key_for("seq_length") == "--seq-length"
    assert megatron_lm.key_for("share_embeddings_and_output_weights") == (
        "--untie-embeddings-and-output-weights"
    )


def test_use_flash_attn_noted_not_applied():
    r = _args(BASE + "--use-flash-attn")
    assert r.get("attention_backend") == "auto"
    assert any("--use-flash-attn" in w for w in r.warnings)


SCRIPT = """#!/bin/bash
TP=${TP:-2}
NODES=${SLURM_NNODES:-2}
GPUS=8
CKPT=$1
LAYERS=$((4*8))
HALF=$((LAYERS/2))
MODEL_ARGS=(
    --num-layers $LAYERS   # a comment
    --hidden-size 4096 \\
    --num-attention-heads "32"
    --seq-length ${SEQ}
)
if [[ "$TP" == "2" ]]; then
    MODEL_ARGS+=("--sequence-parallel")
else
    MODEL_ARGS+=(--fp16)
fi
export NCCL_DEBUG=INFO
torchrun --nproc_per_node $GPUS --nnodes=$NODES pretrain_gpt.py \\
    "${MODEL_ARGS[@]}" --tensor-model-parallel-size $TP --save $CKPT \\
    --micro-batch-size $HALF
"""


def test_shell_semantics():
    r = _args(SCRIPT, "run.sh")
    assert r.format == megatron_lm.FORMAT_SCRIPT
    assert r.get("num_layers") == 32 and r.get("micro_batch_size") == 16
    assert r.get("tensor_model_parallel_size") == 2
    assert r.get("sequence_parallel") is True and r.get("fp16") is False
    assert r.get("world_size") == 16 and r.get("data_parallel_size") == 8
    assert "seq_length" not in r  # ${SEQ} unset: not read, and warned
    assert any("SEQ" in w and "--seq-length" in w for w in r.warnings)
    assert r.origins["num_layers"].where == "run.sh:9"
    assert r.origins["num_attention_heads"].where == "run.sh:11"
    assert r.unused.get("--save") is not None


def test_shell_never_executes(tmp_path):
    marker = tmp_path / "ran"
    text = f"touch {marker}\nX=$(touch {marker})\n`touch {marker}`\n" + SCRIPT
    _args(text, "run.sh")
    assert not marker.exists()


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError):
        megatron_lm.read('A="unterminated\n--num-layers 2', "bad.sh")
    with pytest.raises(ConfigError):
        megatron_lm.read("MODEL_ARGS: [1, 2\n", "m.yaml")
    with pytest.raises(ConfigError):
        megatron_lm.read("echo hello\n", "x.sh")
    with pytest.raises(ConfigError):
        _args(BASE + "--num-layers x")


def test_sniff():
    assert megatron_lm.sniff("MODEL_ARGS:\n  --num-layers: 2\n", "model_config.yaml") == 95
    assert megatron_lm.sniff("model:\n  num_layers: 2\n", "c.yaml") == 0
    assert megatron_lm.sniff(SCRIPT, "run.sh") == 90
    assert megatron_lm.sniff('{"num_layers": 2}', "c.json") == 0


def test_parse_script_expands_arrays_and_strings():
    script = parse_script(
        'A="--x 1\n --y 2"\nB=( $A "--z 3" )\npython pretrain_gpt.py ${B[@]}\n', "s.sh"
    )
    (launch,) = script.launches
    assert [f.text for f in launch.args] == ["--x", "1", "--y", "2", "--z", "3"]
    assert [f.line for f in launch.args][:4] == [1, 1, 2, 2]


def test_cross_entropy_loss_fusion_flags():
    """Megatron-LM's --cross-entropy-loss-fusion / --cross-entropy-fusion-impl (arguments.py)
    are Megatron-Core's cross_entropy_loss_fusion / cross_entropy_fusion_impl."""
    reading = _args(BASE + "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te")
    assert reading.get("cross_entropy_loss_fusion") is True
    assert reading.get("cross_entropy_fusion_impl") == "te"
    assert _args(BASE).get("cross_entropy_loss_fusion") in (None, False)


def test_router_flags_of_the_deepseek2_lite_script_are_read():
    # https://github.com/NVIDIA/Megatron-LM/blob/988ffe34b775265066da6a6a58e09e8cc6d832f7/
    # examples/deepseek2_lite/train_deepseek2_lite_h100_fp8.sh lines 125 and 130
    from pathlib import Path

    from recompute_kit.sources.resolve import resolve

    script = Path(__file__).parent / "corpus" / "megatron_lm" / "train_deepseek2_lite_h100_fp8.sh"
    m = resolve([str(script)]).config.model
    assert m.moe_router_pre_softmax is True
    assert m.moe_router_load_balancing_type == "seq_aux_loss"


def test_megatron_fsdp_main_grads_dtype_sets_the_gradient_dtype(tmp_path):
    # NVIDIA/Megatron-LM@d98e8a64 examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh line 152:
    # `--megatron-fsdp-main-grads-dtype bf16` (megatron_fsdp_main_grads_dtype): 2 B gradients
    from recompute_kit.sources.resolve import resolve

    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
        "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --bf16 "
        "--vocab-size 1024 --use-megatron-fsdp --megatron-fsdp-main-grads-dtype bf16\n"
    )
    assert resolve([str(script)]).config.parallel.grad_reduce_in_fp32 is False


def test_flags_pasted_one_per_line_are_one_argument_list():
    # The argument list as users paste it into issues, one flag per line and no backslashes
    # (verbatim from https://github.com/NVIDIA/Megatron-LM/issues/818); read as one command
    # it was 13 "commands" of which the first was read and the shape lost.
    text = (
        "    --use-mcore-models\n    --seq-length 8192\n    --num-layers 32\n"
        "    --hidden-size 4096\n    --ffn-hidden-size 14336\n    --num-attention-heads 32\n"
        "    --swiglu\n    --untie-embeddings-and-output-weights\n"
        "    --normalization 'RMSNorm'\n"
    )
    r = _args(text)
    assert (r.get("num_layers"), r.get("hidden_size"), r.get("ffn_hidden_size")) == (
        32,
        4096,
        14336,
    )
    assert r.get("seq_length") == 8192 and r.get("normalization") == "RMSNorm"
    assert r.origins["hidden_size"].where == "args.txt:4"
    assert not any("training commands" in w for w in r.warnings)


def test_fp8_without_a_recipe_is_megatron_cores_delayed_scaling():
    # Megatron-Core's TransformerConfig.fp8_recipe defaults to "delayed" (0.16.1 and main);
    # Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh gives --fp8-format hybrid with
    # --fp8-param-gather and no --fp8-recipe, which Megatron-LM allows only with delayed
    # scaling (megatron/training/arguments.py). The kit's default was "tensorwise".
    from recompute_kit.sources.resolve import resolve

    r = resolve([str(CORPUS / "blind_llama3_8b_h100_fp8.sh")]).reading
    assert r.get("fp8") == "hybrid" and r.get("fp8_recipe") == "delayed"
    assert "TransformerConfig" in r.origins["fp8_recipe"].describe()


def test_mixtral_tokenizer_model_is_the_scripts_argument_and_its_type_gives_the_vocabulary():
    # a skill trial on Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh (the
    # corpus copy, URL in its .expect.yaml): TOKENIZER_MODEL=$2 was called "not set", and the
    # vocabulary 32000 "assumed" beside an unused --tokenizer-type Llama2Tokenizer
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "megatron_lm" / "blind_mixtral_8x7b_distributed.sh"
    resolved = resolve([str(path)], require_shape=False)  # as `read` (its EP 8 needs 4 nodes)
    [said] = [w for w in resolved.warnings if "--tokenizer-model is given" in w]
    assert "set on line 16 to $2, the script's 2nd argument" in said
    assert "does not set" not in said
    vocab = resolved.reading.origins["vocab_size"]
    assert resolved.reading.get("vocab_size") == 32000
    # still assumed (the tokenizer.model is not read), but as the tokenizer type's, at its line
    assert (vocab.kind, vocab.where) == ("assumed", f"{path}:62 --tokenizer-type Llama2Tokenizer")
    assert "32000 pieces" in vocab.note and "--tokenizer-type" not in resolved.reading.unused


def test_an_unset_value_says_where_it_comes_from():
    from recompute_kit.sources.shell import parse_script, unset_because

    script = parse_script("A=$(cat f)\nB=$A\nC=$MYENV\nD=$3\n", "s.sh")
    assert unset_because("B", script.variables) == (
        "set on line 2 to $A, set on line 1 to $(cat f), the output of $(cat f), not run here"
    )
    assert unset_because("C", script.variables).endswith("$MYENV, which the script does not set")
    assert unset_because("D", script.variables).endswith("the script's 3rd argument, unknown here")
    assert unset_because("NEVER", script.variables) == "which the script does not set"


def test_the_world_size_of_a_command_run_by_srun_inside_an_sbatch_heredoc(tmp_path):
    # Megatron-LM's Megatron-FSDP DeepSeek-V3 script (tests/data/read/README.md) builds the
    # training command in TRAINING_CMD and runs `srun ... bash -x -c "${TRAINING_CMD}"` inside
    # `sbatch <<EOF`, whose #SBATCH header says the job's size; a user fills its placeholders
    # (a skill trial: 32 nodes x 8 tasks). Before, DP was assumed (8, the expert layout's least)
    # and the states came out at 953 GiB per GPU.
    real = (Path(__file__).parents[1] / "data/read/mlm_sbatch_mfsdp_deepseek_v3.sh").read_text()
    text = real
    for old, new in (
        ("--nodes=your_own_num_nodes", "--nodes=32"),
        ("--ntasks-per-node=your_own_tasks_per_node", "--ntasks-per-node=8"),
    ):
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "sbatch_mfsdp_deepseek_v3.sh"
    path.write_text(text, encoding="utf-8")
    reading = _read(path)
    assert reading.values["world_size"] == 256
    assert reading.origins["world_size"].key == "#SBATCH --nodes x --ntasks-per-node"
    # with the placeholders left as they are, the header says no size: none read from it
    path.write_text(real, encoding="utf-8")
    placeholder = _read(path)
    assert placeholder.origins.get("world_size") is None or (
        placeholder.origins["world_size"].kind != "file"
    )
    # the nodes filled in, the tasks per node not (a skill trial): said, not passed over
    path.write_text(real.replace("--nodes=your_own_num_nodes", "--nodes=32"), encoding="utf-8")
    nodes_only = _read(path)
    assert "world_size" not in nodes_only.values
    said = [w for w in nodes_only.warnings if "#SBATCH --nodes=32" in w]
    assert said and "--ntasks-per-node=your_own_tasks_per_node" in said[0]
    assert said[0].endswith("give --dp (the world size over TP x PP x CP)")
    # --dp given (a skill trial, round ac): the world is the GPUs it makes, said in the output
    # as world_size, and the request for --dp is no longer printed
    given = resolve([str(path)], overrides={"data_parallel_size": 256}).reading
    assert given.values["world_size"] == 256 and given.origins["world_size"].kind == "derived"
    assert not [w for w in given.warnings if "give --dp" in w]


def test_dp_given_to_the_kit_settles_an_assumed_world_of_the_same_size(tmp_path):
    # Megatron-LM's Mixtral script (the reader corpus's copy) on 4 nodes, NNODES from
    # ${SLURM_NNODES:-4}: an assumed world of 32. With --dp 8 (TP1 PP4: 32 GPUs) the world is
    # the user's word, not an assumption the estimate and diagnose keep asking for (a skill
    # trial was told to "set SLURM_NNODES or --dp" after passing --dp 8).
    from recompute_kit.sources.resolve import resolve

    text = (CORPUS / "blind_mixtral_8x7b_distributed.sh").read_text()
    path = tmp_path / "train.sh"
    path.write_text(text.replace('SLURM_NNODES:-"1"', 'SLURM_NNODES:-"4"'), encoding="utf-8")
    alone = resolve([str(path)]).reading
    assert alone.values["world_size"] == 32 and alone.origins["world_size"].kind == "assumed"
    given = resolve([str(path)], overrides={"data_parallel_size": 8}).reading
    assert given.values["world_size"] == 32 and given.origins["world_size"].kind == "derived"
    assert not any("assumed: world_size" in w for w in given.warnings)


def test_retired_recompute_flags_are_said_with_their_new_names(tmp_path):
    # Megatron-LM renamed them in 2022 (commits cfd2e21, bbab79f); argparse now refuses them,
    # so a script passing them never starts: said, never silently dropped
    script = tmp_path / "train.sh"
    script.write_text(
        "python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 \\\n"
        "  --seq-length 2048 --micro-batch-size 4 --activations-checkpoint-method uniform \\\n"
        "  --activations-checkpoint-num-layers 1\n"
    )
    r = resolve([str(script)], require_shape=False)
    said = [w for w in r.warnings if "no longer a Megatron-LM flag" in w]
    assert len(said) == 2 and "it is now --recompute-method" in said[0]
    assert r.reading.get("recompute_method") is None  # not read as the new flag


READ_DATA = Path(__file__).parents[1] / "data" / "read"


def test_gpt_oss_script_reads_quick_geglu_as_gated_and_says_what_is_not_modelled():
    # Megatron-LM's gpt-oss example (tests/data/read/README.md): a skill trial found
    # --quick-geglu (argument_utils.py: gated_linear_unit with quick_gelu) among the unused
    # flags, the MLP counted ungated, and --fp8-param-gather passed over in silence.
    reading = _read(READ_DATA / "mlm_gptoss_02_train.sh")
    assert reading.values["swiglu"] is True
    assert reading.origins["swiglu"].key == "--quick-geglu"
    assert "--quick-geglu" not in reading.unused
    said = " ".join(reading.warnings)
    assert "--quick-geglu: a gated MLP with quick_gelu, counted as SwiGLU" in said
    assert "--fp8-param-gather: the weights are kept in fp8" in said


def test_megatron_fsdp_script_uses_its_sharding_strategy_and_says_its_benchmark_flags():
    # Megatron-LM's Megatron-FSDP DeepSeek-V3 script: --data-parallel-sharding-strategy gave
    # the ZeRO stage and was still listed as unused; --moe-router-force-load-balancing and
    # --fsdp-double-buffer were unused without a word (a skill trial).
    reading = _read(READ_DATA / "mlm_sbatch_mfsdp_deepseek_v3.sh")
    assert reading.values["zero_stage"] == 3
    assert "--data-parallel-sharding-strategy" not in reading.unused
    said = " ".join(reading.warnings)
    assert "--moe-router-force-load-balancing: the router is forced to balanced routing" in said
    assert "--fsdp-double-buffer: Megatron-FSDP's double buffer" in said
    # read as a setting: no routing skew is planned for a run that forces balance (a skill
    # trial on Bridge's DeepSeek-V3 perf recipe, which sets it: RK018 planned imbalance 2)
    assert reading.values["moe_router_force_load_balancing"] is True
    from recompute_kit.doctor.rules.estimate_gap import _dropless_moe
    from recompute_kit.doctor.types import Context
    from recompute_kit.sources.resolve import resolve

    config = resolve(
        [str(READ_DATA / "mlm_sbatch_mfsdp_deepseek_v3.sh")], overrides={"data_parallel_size": 256}
    ).config
    assert not _dropless_moe(Context(evidence=None, config=config))


def test_fp8_is_said_not_modelled():
    # A skill trial (Megatron-LM's train_llama3_8b_h100_fp8.sh): the estimate of the fp8 run
    # and of the same script in bf16 were the same to the byte, and nothing said fp8 was not
    # in it.
    from recompute_kit.sources.resolve import resolve

    warnings = resolve([str(READ_DATA / "mlm_gptoss_02_train.sh")], require_shape=False).warnings
    said = [w for w in warnings if w.startswith("fp8 (")]
    assert said and "the estimate counts activations at 16-bit sizes" in said[0]
    assert "--fp8-format" in said[0]


def test_a_case_of_literal_patterns_is_decided_and_a_hybrid_mamba_model_is_never_sized():
    # A skill trial on Megatron-LM's hybrid Mamba example: the `case "${MODEL_SCALE}" in
    # "800M") ... ;; "8B") ... ;; *) ... esac` block was skipped, so TP, the hidden size and the
    # heads were "not set" though MODEL_SCALE="800M" decides them; and after --num-layers was
    # added by hand the estimator sized 48 transformer layers for 20 Mamba + 4 attention +
    # 24 MLP layers without a word.
    from recompute_kit.sources.resolve import resolve

    script = f"{READ_DATA / 'mlm_mamba_train.sh'} /data/corpus_text_document /data/tok.model"
    reading = resolve([script], require_shape=False).reading
    assert reading.values["hidden_size"] == 1024
    assert reading.values["num_attention_heads"] == 16
    assert reading.values["tensor_model_parallel_size"] == 1
    assert reading.origins["tensor_model_parallel_size"].kind == "file"
    assert not [w for w in reading.warnings if "`case` block is not followed" in w]
    said = [w for w in reading.warnings if "a hybrid model with Mamba layers" in w]
    assert said and "makes no estimate of this model" in said[0]
    assert not [w for w in reading.warnings if "no model shape" in w]  # (none to add)
    with pytest.raises(ConfigError, match="recompute-kit models transformer, MoE and MLA"):
        resolve([script])  # (no "add num_layers": Megatron takes them from the pattern)
    # with a layer count the run is validated, never sized
    from recompute_kit.memory.estimate import estimate

    config = resolve([script], overrides={"num_layers": 48}).config
    config.validate()
    with pytest.raises(ConfigError, match="makes no estimate of this model"):
        estimate(config)


def test_a_case_the_script_does_not_decide_is_not_read_and_a_glob_pattern_matches(tmp_path):
    from recompute_kit.sources.shell import parse_script

    undecided = 'case "$SIZE" in\n  small) HIDDEN=1024 ;;\n  *) HIDDEN=4096 ;;\nesac\n'
    script = parse_script(undecided, "u.sh")
    assert "HIDDEN" not in script.variables or not script.variables["HIDDEN"]
    # glob patterns match as bash matches them (Megatron-Bridge's slurm scripts:
    # `case "$DATASET_NAME" in openmathinstruct2*) ...;; *) ...;; esac`); a quoted one is literal
    globbed = 'SIZE=8B\ncase "$SIZE" in\n  7*) HIDDEN=2048 ;;\n  8*) HIDDEN=4096 ;;\nesac\n'
    assert parse_script(globbed, "g.sh").variables["HIDDEN"] == [("4096", 4)]
    quoted = 'SIZE=8B\ncase "$SIZE" in\n  "8*") HIDDEN=4096 ;;\n  *) HIDDEN=1 ;;\nesac\n'
    assert parse_script(quoted, "q.sh").variables["HIDDEN"] == [("1", 4)]
    chosen = 'SIZE=8B\ncase "$SIZE" in\n  1B|2B) HIDDEN=2048 ;;\n  8B) HIDDEN=4096 ;;\nesac\n'
    assert parse_script(chosen, "c.sh").variables["HIDDEN"] == [("4096", 4)]


def test_megatron_deepspeed_reads_its_own_recompute_flags_and_is_planned_in_them(capsys):
    # A skill trial on Megatron-DeepSpeed's 6.7B example (tests/data/read/README.md):
    # --checkpoint-activations was "no longer a Megatron-LM flag" (recompute none, and RK065
    # advised selective), --num-experts 1 (its dense default) made a MoE model that failed
    # validation, the log redirection `&> file` became flag values, and the plan rendered
    # --recompute-modules and --attention-backend, which its argparse rejects.
    from recompute_kit.cli import main
    from recompute_kit.sources.resolve import resolve

    script = str(READ_DATA / "mds_ds_pretrain_gpt_6.7B_dense.sh")
    reading = resolve([script], overrides={"data_parallel_size": 1}).reading
    v = reading.values
    assert (v["recompute_granularity"], v["recompute_method"], v["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    assert v["num_moe_experts"] is None and v["attention_backend"] == "unfused"
    assert reading.format.startswith("Megatron-DeepSpeed launch script")
    assert not [w for w in reading.warnings if "no longer a Megatron-LM flag" in w]
    assert not [k for k, x in reading.unused.items() if "&>" in str(x)]
    assert main(["plan", "--config", script, "--dp", "1", "--gpu", "a100-40gb"]) == 0
    out = capsys.readouterr().out
    assert "--recompute-modules" not in out and "--attention-backend" not in out
    assert "drop --checkpoint-activations" in out


def test_megatron_deepspeed_gqa_flag_and_pipelined_checkpointing(tmp_path):
    # Megatron-DeepSpeed's GQA flag is --num-key-value-heads (its megatron/arguments.py;
    # Megatron-LM's is --num-query-groups), and under its pipeline (DeepSpeed's PipelineModule)
    # activation checkpointing is every-k-layers only: no block rows in a PP>1 plan.
    from recompute_kit.config import format_spec
    from recompute_kit.plan.search import candidates

    text = (READ_DATA / "mds_ds_pretrain_gpt_6.7B_dense.sh").read_text()
    text = text.replace(
        "--num-attention-heads ${NUM_ATTN_HEADS} \\",
        "--num-attention-heads ${NUM_ATTN_HEADS} \\\n        --num-key-value-heads 8 \\",
    )
    script = tmp_path / "mds.sh"
    script.write_text(text)
    script = str(script)
    reading = resolve([script], overrides={"data_parallel_size": 1}).reading
    assert reading.values["num_query_groups"] == 8
    assert "--num-key-value-heads" not in reading.unused
    cfg = resolve(
        [script], overrides={"data_parallel_size": 1, "pipeline_model_parallel_size": 2}
    ).config
    specs = [format_spec(rc) for rc, _ in candidates(cfg, fmt="megatron-deepspeed")]
    assert "full:uniform:1" in specs and not [s for s in specs if ":block:" in s]
    cfg1 = resolve([script], overrides={"data_parallel_size": 1}).config
    flat = [format_spec(rc) for rc, _ in candidates(cfg1, fmt="megatron-deepspeed")]
    assert [s for s in flat if ":block:" in s]


def test_megatron_deepspeed_levers_only_in_its_own_flags():
    # Megatron-DeepSpeed has no context parallelism (--ds-sequence-parallel-size is Ulysses),
    # no uneven-stage flags, and under --deepspeed no VPP or distributed optimizer (ZeRO
    # shards): a lever it cannot set is left out and said, and its layout is written in its
    # own flags (megatron/arguments.py: --moe-expert-parallel-size)
    from recompute_kit.export_layout import layout_lines
    from recompute_kit.plan.levers import levers

    script = str(READ_DATA / "mds_ds_pretrain_gpt_6.7B_dense.sh")
    cfg = resolve(
        [script], overrides={"data_parallel_size": 2, "pipeline_model_parallel_size": 2}
    ).config
    table = levers(cfg, 40, global_batch_size=64, plan_format="megatron-deepspeed")
    kinds = {r.lever for r in table.rows}
    assert not kinds & {"vpp", "uneven stages", "distributed optimizer"}
    assert not [r for r in table.rows if r.setting.startswith("cp=") and "cp=1 " not in r.setting]
    said = " ".join(table.notes)
    assert "context parallelism" in said and "uneven stages" in said
    assert "distributed optimizer" in said
    changes = {"expert_model_parallel_size": 4, "context_parallel_size": 2}
    lines = layout_lines(changes, "megatron-deepspeed", 8)
    assert "--moe-expert-parallel-size 4" in lines[-1]
    assert any("no Megatron-DeepSpeed flag" in x for x in lines)


def test_transformer_impl_default_says_the_version_it_depends_on(tmp_path):
    # A blind trial on Megatron-LM#525 (a 2023 fork, --transformer-impl local by default there):
    # given the script alone, today's default (transformer_engine) was applied silently and the
    # run that crashed "fit". The default is said with the release it came with.
    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1\n"
    )
    r = resolve([str(script)], overrides={"data_parallel_size": 1}).reading
    o = r.origins["transformer_impl"]
    assert r.get("transformer_impl") == "transformer_engine" and o.kind == "default"
    assert "core_r0.6.0" in o.note and "local" in o.note


# https://github.com/deepspeedai/DeepSpeed/issues/237 (the reporter's launch, cut): a script for
# Megatron-LM v1 (DeepSpeedExamples' copy), whose --model-parallel-size was tensor parallelism
# and --batch-size the micro-batch; the sizes of torch.distributed.launch are in a variable
V1_LAUNCH = """python -m torch.distributed.launch $DISTRIBUTED_ARGS \\
       pretrain_gpt2.py \\
       --model-parallel-size 8 \\
       --num-layers 60 \\
       --hidden-size 6144 \\
       --num-attention-heads 32 \\
       --batch-size 8 \\
       --seq-length 1024 \\
       --max-position-embeddings 1024 \\
       --checkpoint-activations \\
       --deepspeed \\
       --deepspeed_config ds_zero2_config.json
"""


def test_megatron_lm_v1_flags_are_read_as_their_successors(tmp_path):
    path = tmp_path / "launch.sh"
    path.write_text(V1_LAUNCH)
    r = resolve([str(path)], require_shape=False).reading
    assert r.values["tensor_model_parallel_size"] == 8
    assert r.values["micro_batch_size"] == 8
    assert r.values["recompute_granularity"] == "full"
    assert "--model-parallel-size" not in r.unused and "--batch-size" not in r.unused
    assert "Megatron-LM v1" in r.origins["tensor_model_parallel_size"].note
    assert any("written for Megatron-LM v1" in w for w in r.warnings)
    # `torch.distributed.launch $DISTRIBUTED_ARGS`: no world of one process read from the file
    assert r.origins["data_parallel_size"].kind == "assumed"
    assert "world_size" not in r.values or r.origins["world_size"].kind != "file"
    # today's flags: nothing of the kind
    today = V1_LAUNCH.replace("--model-parallel-size", "--tensor-model-parallel-size").replace(
        "--batch-size", "--micro-batch-size"
    )
    path.write_text(today)
    r = resolve([str(path)], require_shape=False).reading
    assert not any("Megatron-LM v1" in w for w in r.warnings)


def test_a_for_loop_is_read_once_over_literal_values_and_skipped_over_unknown_ones():
    from recompute_kit.sources.shell import parse_script

    once = 'for C in "2,1" "4,2"; do\n  IFS=\',\' read -r TP PP <<< "$C"\ndone\n'
    script = parse_script(once, "f.sh")
    assert (script.variables["TP"], script.variables["PP"]) == ([("2", 2)], [("1", 2)])
    assert any("over 2 values is read once" in w for w in script.warnings)
    unknown = "for N in $(seq 1 4); do\n  TP=$N\ndone\n"
    script = parse_script(unknown, "u.sh")
    assert "TP" not in script.variables
    assert any("`for` block is not followed" in w for w in script.warnings)
