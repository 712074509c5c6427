"""Launch commands of Hugging Face stacks (sources/hf_launch.py): the world size from the
launcher, the trainer settings from the config it names or from its own arguments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve

HERE = Path(__file__).parent
HF = HERE / "corpus" / "hf_trainer"
# The launch command pasted in https://github.com/hiyouga/LlamaFactory/issues/1158, verbatim
# (its line continuations lost in the paste: each flag on its own line).
DS_1158 = HERE.parent / "data" / "launch" / "llamafactory_1158_deepspeed.sh"


def _beside(tmp_path: Path, command: str) -> Path:
    """LLaMA-Factory's examples/train_full/qwen3_full_sft.yaml and its DeepSpeed JSON
    (tests/sources/corpus/hf_trainer) beside a launch script."""
    for name in ("qwen3_full_sft.yaml", "ds_z3_config.json"):
        shutil.copy(HF / name, tmp_path / name)
    (tmp_path / "examples" / "deepspeed").mkdir(parents=True)
    shutil.copy(HF / "ds_z3_config.json", tmp_path / "examples" / "deepspeed" / "ds_z3_config.json")
    script = tmp_path / "train.sh"
    script.write_text(command)
    return script


def test_llamafactory_cli_takes_the_world_from_nproc_per_node(tmp_path):
    script = _beside(
        tmp_path,
        "FORCE_TORCHRUN=1 NNODES=2 NPROC_PER_NODE=8 llamafactory-cli train qwen3_full_sft.yaml\n",
    )
    r = resolve([str(script)], require_shape=False).reading
    assert r.get("world_size") == 16 and r.origins["world_size"].key == "NPROC_PER_NODE x NNODES"
    assert r.get("data_parallel_size") == 16
    assert r.origins["micro_batch_size"].where.startswith(str(tmp_path / "qwen3_full_sft.yaml"))
    assert r.get("recompute_granularity") == "full"  # LLaMA-Factory checkpoints by default


def test_llamafactory_cli_overrides_after_the_yaml(tmp_path):
    # llamafactory-cli train cfg.yaml key=value: LLaMA-Factory's read_args merges
    # OmegaConf.from_cli(argv[2:]) over the YAML (src/llamafactory/hparams/parser.py); the
    # YAML says cutoff_len 2048, the command 8192 (a run that fits at one and not the other)
    script = _beside(
        tmp_path,
        "#!/bin/bash\nexport NPROC_PER_NODE=4\n"
        "llamafactory-cli train qwen3_full_sft.yaml cutoff_len=8192 \\\n"
        "    per_device_train_batch_size=2 > train.log 2>&1 output_dir=x\n",
    )
    r = resolve([str(script)], require_shape=False).reading
    assert (r.get("seq_length"), r.get("micro_batch_size")) == (8192, 2)
    o = r.origins["seq_length"]
    assert (o.where, o.key) == (f"{script}:3", "cutoff_len=8192")
    assert o.note.startswith(f"override of {tmp_path / 'qwen3_full_sft.yaml'};")
    # the exported NPROC_PER_NODE is on line 2 (its own line, not the one before it)
    assert r.origins["world_size"].where == f"{script}:2"
    # what the YAML sets and no override changes keeps the YAML's line
    assert r.origins["gradient_accumulation_steps"].where.endswith("qwen3_full_sft.yaml:30")


def test_llamafactory_overrides_on_recompute_kits_command_line(monkeypatch, tmp_path):
    script = _beside(tmp_path, "")
    monkeypatch.chdir(tmp_path)
    r = resolve(["qwen3_full_sft.yaml", "cutoff_len=8192"], require_shape=False).reading
    assert r.get("seq_length") == 8192 and r.origins["seq_length"].where == "command line"
    # the whole launch command typed as one quoted input
    quoted = "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train qwen3_full_sft.yaml"
    for command in (quoted, quoted.split(" ", 2)[2], quoted + " cutoff_len=4096"):
        r = resolve([command], require_shape=False).reading
        assert r.get("seq_length") == (4096 if "4096" in command else 2048), command
    assert r.get("world_size") == 4
    # a DeepSpeed JSON takes no key=value: said in one line
    with pytest.raises(ConfigError, match="applies to a LLaMA-Factory YAML"):
        resolve(["ds_z3_config.json", "stage=2"], require_shape=False)
    assert script.exists()


def test_torchrun_with_the_trainer_yaml(tmp_path):
    script = _beside(
        tmp_path, "#!/bin/bash\ntorchrun --nproc_per_node 4 src/train.py qwen3_full_sft.yaml\n"
    )
    r = resolve([str(script)], require_shape=False).reading
    assert (r.get("world_size"), r.get("data_parallel_size")) == (4, 4)
    assert r.origins["world_size"].where == f"{script}:2"


def test_deepspeed_command_with_trainer_arguments_of_issue_1158():
    r = resolve([str(DS_1158)], require_shape=False).reading
    # deepspeed --include localhost:4,5,6,7: four GPUs
    assert (r.get("world_size"), r.get("data_parallel_size")) == (4, 4)
    assert r.get("seq_length") == 1536 and r.origins["seq_length"].key == "--cutoff_len"
    assert r.get("micro_batch_size") == 1 and r.get("bf16") is True
    assert r.format.startswith("launch command, LLaMA-Factory")  # --stage / --finetuning_type
    # --deepspeed ds_config.json is a flag's value, not the trainer config; the JSON is not
    # beside the paste, so its ZeRO stage is an assumption said with the key that sets it
    assert r.origins["zero_stage"].kind == "assumed"
    assert r.model_name == "/home/work/record/llm_models/Baichuan2-13B-Chat"


def test_a_megatron_launch_is_not_claimed():
    from recompute_kit.sources import hf_launch

    megatron = "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64\n"
    assert hf_launch.sniff(megatron, "run.sh") == 0
    assert hf_launch.sniff("deepspeed --num_gpus 8 train.py --deepspeed ds.json\n", "run.sh") > 0


def test_a_script_word_glued_to_its_continuation_backslash(tmp_path):
    # https://github.com/hiyouga/LLaMA-Factory/issues/1936 (the reporter's launch, verbatim head):
    # `src/train_bash.py\` has no space before the backslash, which bash accepts (the next line's
    # indentation ends the word). It was read as an escaped space and no command was found.
    script = tmp_path / "train_rm.sh"
    script.write_text(
        "deepspeed  --include localhost:0,1,2,3,4 --master_port=9901 src/train_bash.py\\\n"
        "    --stage rm \\\n"
        "    --do_train \\\n"
        "    --model_name_or_path /root/autodl-tmp/users/xyh/Llama-2-13b-hf \\\n"
        "    --finetuning_type lora \\\n"
        "    --per_device_train_batch_size 1 \\\n"
        "    --gradient_accumulation_steps 4 \\\n"
        "    --bf16\n"
    )
    reading = resolve([str(script)], require_shape=False).reading
    assert reading.get("micro_batch_size") == 1 and reading.get("world_size") == 5
    assert reading.get("bf16") is True


def test_lora_counts_frozen_16_bit_base_weights_without_their_states(tmp_path):
    # https://github.com/hiyouga/LLaMA-Factory/issues/1936: `--finetuning_type lora --bf16` on
    # Llama-2-13B, 5 x 24 GB GPUs, the deepspeed launcher without --deepspeed: the OOM came at
    # setup with 21.51 GiB allocated. Counted as a full fine-tune the estimate said 48.5 GiB of
    # fp32 weights, as much in gradients and twice that in Adam states; the frozen base is
    # bf16 weights alone (13.0e9 x 2 B = 24.2 GiB), no gradients, no optimizer states.
    from recompute_kit.memory.model_states import model_state_bytes

    script = tmp_path / "train_rm.sh"
    script.write_text(
        "deepspeed --include localhost:0,1,2,3,4 src/train_bash.py \\\n"
        "    --model_name_or_path meta-llama/Llama-2-13b-hf \\\n"
        "    --finetuning_type lora \\\n"
        "    --per_device_train_batch_size 1 \\\n"
        "    --bf16\n"
    )
    # meta-llama/Llama-2-13b-hf's config.json (its shape keys, verbatim values)
    model = tmp_path / "config.json"
    model.write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",'
        ' "hidden_size": 5120, "intermediate_size": 13824, "max_position_embeddings": 4096,'
        ' "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 40,'
        ' "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "vocab_size": 32000}'
    )
    config = resolve([str(script)], model=str(model)).config
    weights, grads, optimizer = model_state_bytes(config)
    assert config.parallel.frozen_base is True
    assert (grads, optimizer) == (0, 0)
    assert 24.0 * 2**30 < weights < 24.5 * 2**30
    full = resolve([str(script)], model=str(model), overrides={"frozen_base": False}).config
    assert model_state_bytes(full)[2] > 90 * 2**30


LLAVA = Path(__file__).resolve().parents[1] / "data" / "launch" / "llava"


def test_llava_finetune_script_reads_model_max_length_and_keeps_words_as_words(capsys):
    # haotian-liu/LLaVA @ c121f04 scripts/v1_5/finetune.sh and scripts/zero3.json, verbatim;
    # llama2_13b_config.json: meta-llama/Llama-2-13b-hf's config.json (Vicuna-13B v1.5 is that
    # architecture). A skill trial: --model_max_length 2048 was unused and seq_length assumed
    # 4096; `--evaluation_strategy "no"` read as false (YAML 1.1); the plan rendered TRL's
    # max_length as YAML for a command line.
    from recompute_kit.cli import main

    script = str(LLAVA / "scripts" / "v1_5" / "finetune.sh")
    files = [str(LLAVA / "llama2_13b_config.json"), script, str(LLAVA / "scripts" / "zero3.json")]
    resolved = resolve(files)
    reading = resolved.reading
    assert reading.get("seq_length") == 2048
    # the JSON the script's --deepspeed names, given too, is read once (its keys were listed
    # twice in `unused`, with and without "deepspeed.")
    assert "read once, within" in resolved.inputs[2]["format"]
    assert not [k for k in reading.unused if k.startswith("zero_optimization")]
    assert reading.origins["seq_length"].key == "--model_max_length"
    assert reading.unused["evaluation_strategy"] == "no"
    argv = ["plan", "--config", *files, "--dp", "8", "--gpu", "a100-40gb", "--json"]
    assert main([*argv, "--seq-length", "512"]) == 0
    rendered = json.loads(capsys.readouterr().out)["rendered"].splitlines()
    assert "--model_max_length 512" in rendered and "--gradient_checkpointing true" in rendered
    assert not [line for line in rendered if not line.startswith(("#", "--"))]


def test_an_example_script_run_by_plain_python_is_read(tmp_path):
    # https://github.com/huggingface/transformers/issues/3360 (the reporter's command, verbatim):
    # Hugging Face's example script with the Trainer's arguments, run by plain python (it was
    # claimed by the NeMo-RL launch reader, a run_*.py, and refused)
    script = tmp_path / "cmd.sh"
    script.write_text(
        "python /content/transformers/examples/run_language_modeling.py "
        "--train_data_file=shakespeare.txt --model_type=gpt2 --model_name_or_path=gpt2 "
        "--output_dir=output --do_train\n"
    )
    r = resolve([str(script)], require_shape=False).reading
    assert "launch command" in r.format and r.framework == "hf-trainer"
    assert any("run by plain python" in w for w in r.warnings)
    # run_clm.py's --block_size is the sequence length
    script.write_text(
        "python run_clm.py --model_name_or_path gpt2 --per_device_train_batch_size 4 "
        "--block_size 1024 --do_train --output_dir out\n"
    )
    r = resolve([str(script)], require_shape=False).reading
    assert r.get("seq_length") == 1024 and r.origins["seq_length"].key == "--block_size"
    assert r.get("micro_batch_size") == 4
