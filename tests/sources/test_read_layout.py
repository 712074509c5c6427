"""Framework semantics at the front door: DP from the world size, layouts the world cannot hold
refused the same way by every command, SP with TP=1 turned off as Megatron-LM and NeMo do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve

SCRIPT = """\
torchrun --nproc_per_node 8 --nnodes {nodes} pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 \\
    --micro-batch-size 1 --tensor-model-parallel-size {tp} --pipeline-model-parallel-size 2 \\
    --sequence-parallel --bf16 {extra}
"""


def script(tmp_path, nodes=2, tp=4, extra=""):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(nodes=nodes, tp=tp, extra=extra))
    return str(path)


def test_dp_is_derived_from_the_launcher(tmp_path):
    resolved = resolve([script(tmp_path)])
    assert resolved.config.parallel.data_parallel_size == 2  # 16 GPUs / (TP4 x PP2)
    assert resolved.reading.origins["data_parallel_size"].kind == "derived"


def test_a_world_that_cannot_hold_the_layout_is_refused_or_warned(tmp_path):
    path = script(tmp_path, nodes=1, tp=8, extra="--pipeline-model-parallel-size 16")
    with pytest.raises(ConfigError, match="not divisible by TP x PP x CP = 128"):
        resolve([path])
    read = resolve([path], require_shape=False)  # `read` shows it, with the reason
    assert any("cannot run as written" in w for w in read.warnings)
    assert read.reading.origins["data_parallel_size"].kind == "assumed"


def test_dp_asked_on_the_command_line_sets_the_world(tmp_path):
    # A launch script's node count often comes from the scheduler (NNODES=${SLURM_NNODES:-1}),
    # unset where recompute-kit reads it: the user's --dp decides the world, said aloud.
    path = script(tmp_path, nodes=1)
    with pytest.raises(ConfigError, match="does not match a world of 8 GPUs"):
        resolve([path], overrides={"data_parallel_size": 2, "world_size": 8})
    resolved = resolve([path], overrides={"data_parallel_size": 4})
    assert resolved.config.parallel.data_parallel_size == 4
    assert resolved.reading.get("world_size") == 32  # 4 x TP4 x PP2
    said = "--dp 4 x (TP x PP x CP = 8) sets the world size: 32"
    assert any(said in w for w in resolved.reading.warnings)


def test_an_expert_layout_refused_on_an_assumed_world_says_how_to_give_it(tmp_path):
    # Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh: NNODES=${SLURM_NNODES:-"1"},
    # PP4 x EP8 cannot run on the default single node; the refusal names the assumption and
    # the smallest --dp the expert layout allows
    path = tmp_path / "train.sh"
    path.write_text(
        'NNODES=${SLURM_NNODES:-"1"}\n'
        + SCRIPT.format(nodes="$NNODES", tp=1, extra="--pipeline-model-parallel-size 4").replace(
            "--sequence-parallel", "--num-experts 8 --expert-model-parallel-size 8"
        )
    )
    with pytest.raises(ConfigError) as err:
        resolve([str(path)])
    text = str(err.value)
    assert "EP 8 x expert TP 1 does not divide" in text
    assert "the world size 8 is assumed" in text and "SLURM_NNODES" in text
    assert "smallest this expert layout allows is 8, 32 GPUs" in text
    resolved = resolve([str(path)], overrides={"data_parallel_size": 16})
    assert resolved.reading.get("world_size") == 64
    # a world that is read, not assumed, gets no such hint
    path.write_text(path.read_text().replace('${SLURM_NNODES:-"1"}', "1"))
    with pytest.raises(ConfigError) as err:
        resolve([str(path)])
    assert "assumed" not in str(err.value)


def test_sequence_parallel_at_tp1_from_a_file_is_turned_off(tmp_path):
    resolved = resolve([script(tmp_path, tp=1)])
    assert resolved.config.parallel.sequence_parallel is False
    assert any("turned off" in w for w in resolved.warnings)


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sequence_parallel_asked_with_tp1_is_megatrons_error():
    proc = cli("estimate", "--model", "llama3-70b", "--tp", "1", "--sp")
    assert proc.returncode == 1
    assert "Cannot use sequence parallelism without tensor parallelism" in proc.stderr


def test_tp1_on_a_preset_with_sp_turns_it_off():
    proc = cli("estimate", "--model", "llama3-70b", "--tp", "1", "--pp", "16")
    assert proc.returncode == 0, proc.stderr
    assert "sequence_parallel turned off" in proc.stdout


@pytest.mark.slow
def test_every_command_refuses_an_expert_layout_the_same_way():
    lines = set()
    for command in (["estimate"], ["measure"], ["plan", "--gpu-memory-gb", "79"]):
        proc = cli(*command, "--model", "tiny-moe", "--ep", "4", "--dp", "2")
        assert proc.returncode == 1, command
        lines.add(proc.stderr.strip())
    assert lines == {
        "recompute-kit: error: EP 4 x expert TP 1 does not divide the 2 ranks of TP 1 x CP 1 x "
        "DP 2 in each pipeline stage; the world the job ran on says its DP (--dp, the "
        "notebook's dp): a multiple of 4"
    }


def test_a_models_config_is_not_hidden_by_a_scripts_guess():
    # A skill trial: Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh takes its
    # tokenizer.model as $2 (not known here), so the vocabulary is assumed from
    # --tokenizer-type Llama2Tokenizer; with the model named as well (--model, read first), the
    # model's config.json says the vocabulary and the guess must not override it: "assumed:
    # vocab_size" kept the doctor's verdict at needs_evidence.
    script = "tests/sources/corpus/megatron_lm/blind_mixtral_8x7b_distributed.sh"
    alone = resolve([script], require_shape=False).reading
    assert alone.origins["vocab_size"].kind == "assumed"
    mixtral = "mistralai/Mixtral-8x7B-v0.1"
    both = resolve([script], model=mixtral, overrides={"data_parallel_size": 8})
    assert both.reading.origins["vocab_size"].kind == "model"
    assert both.reading.values["vocab_size"] == 32000
    assert not any("vocab_size" in a for a in both.config.assumptions)


def test_a_training_script_beside_its_configs_is_left_out_and_said(tmp_path):
    # A skill trial passed TRL's launch, its Accelerate config and trl/scripts/sft.py (SKILL.md:
    # "every file of the run"): the script refused the whole read. Beside other inputs a Python
    # training script is left out with a warning; alone it is still refused with one line.
    trl = Path(__file__).parent.parent / "data" / "launch" / "trl"
    script = tmp_path / "sft.py"
    script.write_text("from trl import SFTTrainer\n\ndef main(script_args):\n    pass\n")
    accelerate = str(trl / "examples" / "accelerate_configs" / "deepspeed_zero3.yaml")
    r = resolve([str(trl / "launch.sh"), accelerate, str(script)], require_shape=False)
    (said,) = [w for w in r.reading.warnings if str(script) in w]
    assert "a Python training script, not a config: left out" in said
    assert r.reading.values["micro_batch_size"] == 8  # the launch's, read as before
    with pytest.raises(ConfigError, match="not a training config recompute-kit can read"):
        resolve([str(script)], require_shape=False)


def test_a_trainer_micro_batch_given_on_the_command_line_says_the_global_batch_it_makes():
    # A skill trial: `--micro-batch-size 2` on TRL's launch (per-device 8, accumulation 2, 4
    # GPUs) made the levers' global batch 16 instead of 64, without a word.
    trl = Path(__file__).parent.parent / "data" / "launch" / "trl"
    accelerate = str(trl / "examples" / "accelerate_configs" / "deepspeed_zero3.yaml")
    r = resolve(
        [str(trl / "launch.sh"), accelerate],
        overrides={"data_parallel_size": 4, "micro_batch_size": 2},
    )
    assert r.reading.values["global_batch_size"] == 16
    (said,) = [w for w in r.reading.warnings if w.startswith("--micro-batch-size 2")]
    assert "gradient_accumulation_steps stays 2: the global batch read is 16" in said


def test_accelerate_launch_reads_its_config_file_and_its_num_processes_wins(tmp_path):
    # The TRL re-trial: `accelerate launch --config_file deepspeed_zero3.yaml --num_processes 4`
    # read alone gave ZeRO stage 0 (the config file not followed); with the YAML given as well,
    # the YAML's num_processes 8 beat the command's 4 because it came later. Accelerate applies
    # the file first and the command line over it.
    import shutil

    trl = Path(__file__).parent.parent / "data" / "launch" / "trl"
    shutil.copytree(trl / "examples", tmp_path / "examples")
    launch = tmp_path / "launch.sh"
    launch.write_text((trl / "launch.sh").read_text())
    alone = resolve([str(launch)], require_shape=False).reading
    assert alone.values["zero_stage"] == 3 and alone.values["world_size"] == 8
    assert "deepspeed_zero3.yaml:9" in alone.origins["zero_stage"].describe()
    four = tmp_path / "launch4.sh"
    four.write_text(
        (trl / "launch.sh").read_text().replace(" trl/scripts", " --num_processes 4 trl/scripts")
    )
    yaml_file = str(tmp_path / "examples" / "accelerate_configs" / "deepspeed_zero3.yaml")
    r = resolve([str(four), yaml_file], require_shape=False)
    assert r.reading.values["world_size"] == 4
    assert not any(w.startswith("conflict: world_size") for w in r.reading.warnings)
    assert any("read once" in i["format"] for i in r.inputs if i["path"] == yaml_file)
    missing = tmp_path / "elsewhere.sh"
    missing.write_text((trl / "launch.sh").read_text())
    (tmp_path / "examples").rename(tmp_path / "moved")
    said = resolve([str(missing)], require_shape=False).reading.warnings
    named = "--config_file examples/accelerate_configs/deepspeed_zero3.yaml is not beside it"
    assert any(named in w for w in said)
