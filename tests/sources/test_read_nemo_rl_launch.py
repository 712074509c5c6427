"""NeMo-RL launch commands and Hydra-style `key=value` overrides.

NeMo-RL (https://github.com/NVIDIA-NeMo/RL @ 7ea279abfbeb698b092856d0dab61e7cf39bc909):
examples/run_grpo.py:65 `parse_known_args()` leaves the overrides, :87 `load_config` merges the
`defaults:` chain, :92 `parse_hydra_overrides` applies them in order (struct mode,
nemo_rl/utils/config.py:172-192), :94 `OmegaConf.to_container(resolve=True)` resolves `${...}`
after them.

Data in tests/data/nemo_rl_launch/ (verbatim):
- examples/configs/{grpo_math_1B,grpo_math_1B_megatron,grpo_math_8B_megatron,grpo_math_8B,dpo}.yaml:
  https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/
- grpo_qwen2.5-32b_readme.sh: README.md lines 392-410 ("GRPO Qwen2.5-32B"),
  https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/README.md#L392-L410
- dpo_multinode_readme.sh: README.md lines 625-638 ("DPO Multi-node"),
  https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/README.md#L625-L638
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve

DATA = Path(__file__).parent.parent / "data" / "nemo_rl_launch"
CORPUS = Path(__file__).parent / "corpus"
# the launch line as users paste it (the form NeMo-RL's docs give, with the 8B Megatron config)
LINE = (
    "uv run examples/run_grpo_math.py --config examples/configs/grpo_math_8B_megatron.yaml "
    "policy.max_total_sequence_length=8192 cluster.gpus_per_node=8\n"
)


def _read(*items: str):
    return resolve(list(items), require_shape=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A NeMo-RL checkout: examples/configs/ with the real YAMLs."""
    shutil.copytree(DATA / "examples", tmp_path / "examples")
    return tmp_path


def test_launch_line_reads_the_config_with_its_overrides(repo):
    launch = repo / "launch.sh"
    launch.write_text("#!/bin/bash\nset -e\n" + LINE)
    r = _read(str(launch))
    reading = r.reading
    assert reading.framework == "nemo-rl"
    assert reading.get("seq_length") == 8192  # the YAML says 4096
    origin = reading.origins["seq_length"]
    assert origin.describe() == f"{launch}:3 policy.max_total_sequence_length=8192"
    assert reading.get("world_size") == 8
    assert reading.origins["world_size"].key == "cluster.gpus_per_node=8"
    # the rest is the YAML's (grpo_math_8B_megatron.yaml: PP 2, TP 1, Megatron backend)
    assert reading.get("pipeline_model_parallel_size") == 2
    assert reading.origins["pipeline_model_parallel_size"].where.endswith(
        "grpo_math_8B_megatron.yaml:41"
    )
    assert reading.get("zero_stage") == 0 and not reading.get("use_torch_fsdp2")
    # Megatron backend defaults, not the DTensor ones, for the launch command's reading
    assert "DTensor" not in reading.origins["virtual_pipeline_model_parallel_size"].describe()
    paths = [(i["path"], i.get("config_of"), i.get("parent_of")) for i in r.inputs]
    assert (str(repo / "examples/configs/grpo_math_8B_megatron.yaml"), str(launch), None) in paths


def test_launch_file_below_the_repo_root_finds_the_config_above(repo):
    (repo / "scripts").mkdir()
    launch = repo / "scripts" / "run.sh"
    launch.write_text(
        "python examples/run_grpo_math.py --config=examples/configs/"
        "grpo_math_8B_megatron.yaml policy.train_micro_batch_size=2\n"
    )
    reading = _read(str(launch)).reading
    assert reading.get("micro_batch_size") == 2
    assert reading.get("pipeline_model_parallel_size") == 2  # the YAML above was read
    assert not [w for w in reading.warnings if "not found" in w]


def test_interpolations_follow_the_overrides(repo):
    launch = repo / "launch.sh"
    launch.write_text(
        LINE.rstrip() + " policy.megatron_cfg.tensor_model_parallel_size=4 "
        "policy.train_micro_batch_size=2\n"
    )
    reading = _read(str(launch)).reading
    unused = reading.unused
    # grpo_math_1B.yaml:395 max_model_len: ${policy.max_total_sequence_length}
    assert unused["policy.generation.vllm_cfg.max_model_len"] == 8192
    # grpo_math_1B_megatron.yaml:67 ${mul:${policy.max_total_sequence_length}, ${...}}
    assert unused["policy.dynamic_batching.train_mb_tokens"] == 8192 * 2
    # grpo_math_1B_megatron.yaml:82 ${policy.megatron_cfg.tensor_model_parallel_size}
    assert unused["policy.make_sequence_length_divisible_by"] == 4
    assert reading.get("tensor_model_parallel_size") == 4


def test_overrides_apply_in_order_and_as_hydra_allows(repo):
    launch = repo / "launch.sh"
    launch.write_text(
        "uv run python examples/run_grpo_math.py \\\n"
        "  --config examples/configs/grpo_math_8B_megatron.yaml \\\n"
        "  policy.max_total_sequence_length=8192 \\\n"
        "  policy.max_total_sequence_length=2048 \\\n"
        "  policy.no_such_key=3 \\\n"
        "  ~policy.generation.vllm_cfg.max_model_len\n"
    )
    reading = _read(str(launch)).reading
    assert reading.get("seq_length") == 2048  # the later one
    assert reading.origins["seq_length"].where == f"{launch}:4"
    refused = [w for w in reading.warnings if "policy.no_such_key=3" in w]
    assert len(refused) == 1 and "+policy.no_such_key=3" in refused[0]
    assert "policy.no_such_key" not in reading.unused  # not applied: NeMo-RL stops on it
    assert "policy.generation.vllm_cfg.max_model_len" not in reading.unused  # deleted


def test_missing_config_is_one_warning_and_the_overrides_are_read(tmp_path):
    launch = tmp_path / "launch.sh"
    launch.write_text(LINE)
    reading = _read(str(launch)).reading
    said = [w for w in reading.warnings if "examples/configs/grpo_math_8B_megatron.yaml" in w]
    assert len(said) == 1 and "not found" in said[0]
    assert reading.get("seq_length") == 8192
    assert reading.origins["seq_length"].where == f"{launch}:1"
    assert reading.get("world_size") == 8
    # what the YAML leaves to its base: GRPO's (grpo_math_1B.yaml train_micro_batch_size 4)
    assert reading.get("micro_batch_size") == 4
    assert "grpo_math_1B.yaml" in reading.origins["micro_batch_size"].describe()


def test_readme_grpo_qwen_32b_command():
    path = DATA / "grpo_qwen2.5-32b_readme.sh"
    reading = _read(str(path)).reading
    assert reading.model_name == "Qwen/Qwen2.5-32B"  # policy.model_name='Qwen/Qwen2.5-32B'
    assert reading.get("seq_length") == 16384
    # cluster.num_nodes=${NUM_ACTOR_NODES} with NUM_ACTOR_NODES=32 (line 2) x gpus_per_node 8
    assert reading.get("world_size") == 256
    assert f"{path}:9 cluster.num_nodes=32" in reading.origins["world_size"].describe()
    assert reading.get("tensor_model_parallel_size") == 8
    assert reading.get("sequence_parallel") is True
    assert reading.get("use_torch_fsdp2") is True
    assert reading.get("recompute_granularity") == "full"
    assert reading.origins["recompute_granularity"].key == (
        "policy.dtensor_cfg.activation_checkpointing=True"
    )
    # CONTAINER=..., MOUNTS=..., sbatch's own flags are not overrides of the config
    assert not [w for w in reading.warnings if "CONTAINER" in w or "--nodes" in w]


def test_readme_dpo_multinode_command():
    path = DATA / "dpo_multinode_readme.sh"
    reading = _read(str(path)).reading
    assert reading.get("world_size") == 16  # cluster.num_nodes=2 cluster.gpus_per_node=8
    # dpo.yaml's train_micro_batch_size 2 pairs: 4 sequences a micro-batch (dpo.py:603)
    assert reading.get("micro_batch_size") == 4
    assert "(DPO: pairs)" in reading.format
    assert [w for w in reading.warnings if "DPO's reference policy is kept in host memory" in w]
    assert reading.origins["world_size"].where == f"{path}:5"


def test_overrides_after_a_file_on_the_command_line(repo):
    config = repo / "examples/configs/grpo_math_8B_megatron.yaml"
    r = _read(str(config), "policy.max_total_sequence_length=8192", "cluster.gpus_per_node=4")
    reading = r.reading
    assert reading.get("seq_length") == 8192 and reading.get("world_size") == 4
    origin = reading.origins["seq_length"]
    assert origin.kind == "argument" and origin.key == "policy.max_total_sequence_length=8192"
    assert str(config) in origin.note  # which input it applied to
    assert {
        "path": "cluster.gpus_per_node=4",
        "format": "override",
        "override_of": str(config),
    } in (r.inputs)
    assert reading.unused["policy.generation.vllm_cfg.max_model_len"] == 8192


def test_overrides_after_a_launch_file_come_last(repo):
    launch = repo / "launch.sh"
    launch.write_text(LINE)
    reading = _read(str(launch), "policy.max_total_sequence_length=16384").reading
    assert reading.get("seq_length") == 16384
    assert reading.origins["seq_length"].kind == "argument"


def test_overrides_after_a_bridge_yaml():
    config = CORPUS / "bridge" / "blind2_llama32_1b_finetune.yaml"
    reading = _read(str(config), "model.tensor_model_parallel_size=2").reading
    assert reading.get("tensor_model_parallel_size") == 2  # the YAML says 1
    origin = reading.origins["tensor_model_parallel_size"]
    assert origin.key == "model.tensor_model_parallel_size=2" and str(config) in origin.note


def test_override_without_a_config_or_after_another_format_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="give that file first"):
        _read("policy.max_total_sequence_length=8192", str(tmp_path))
    toml = CORPUS / "torchtitan" / "blind2_llama3_8b-8xb200-8k.toml"
    with pytest.raises(ConfigError, match="is not one"):
        _read(str(toml), "training.seq_len=8192")


def test_what_follows_the_command_is_not_an_override(repo):
    launch = repo / "launch.sh"
    launch.write_text(LINE.rstrip() + " 2>&1 | tee logs/run.log\n")
    reading = _read(str(launch)).reading
    assert reading.get("seq_length") == 8192
    assert not [w for w in reading.warnings if "tee" in w or "2>&1" in w]


def test_a_megatron_lm_script_is_not_a_nemo_rl_launch():
    from recompute_kit.sources import nemo_rl_launch

    text = "python run_pretrain.py --num-layers 32 --hidden-size 4096 --seq-length 4096\n"
    assert nemo_rl_launch.sniff(text, "train.sh") == 0


# NVIDIA-NeMo/RL issue #903 (https://github.com/NVIDIA-NeMo/RL/issues/903): an SFT run pasted as
# its overrides alone (the f-string fragments, here as plain override lines).
RL_903 = (
    "++policy.megatron_cfg.tensor_model_parallel_size=1\n"
    "++policy.megatron_cfg.context_parallel_size=2\n"
    "++policy.train_global_batch_size=1024\n"
    "++policy.max_total_sequence_length=32768\n"
    "++policy.train_micro_batch_size=1\n"
)


def test_a_file_of_overrides_applies_to_the_config_before_it_and_alone_says_so(tmp_path):
    # A skill trial: the overrides file was "not a training config recompute-kit can read"
    # alone, and after NeMo-RL's sft.yaml too; on that DTensor base its megatron_cfg settings
    # (CP 2, the setting the thread turned on) were dropped without a word.

    sft = Path(__file__).parent / "corpus" / "nemo_rl" / "sft.yaml"
    overrides = tmp_path / "overrides.txt"
    overrides.write_text(RL_903, encoding="utf-8")
    with pytest.raises(ConfigError, match="key=value overrides alone, with no config before"):
        resolve([str(overrides)], require_shape=False)
    reading = resolve([str(sft), str(overrides)], require_shape=False).reading
    assert reading.values["seq_length"] == 32768
    said = [w for w in reading.warnings if "Megatron-backend settings" in w]
    assert said and "++policy.megatron_cfg.context_parallel_size=2" in said[0]
    on = resolve(
        [str(sft), str(overrides), "++policy.megatron_cfg.enabled=true"], require_shape=False
    ).reading
    assert on.values["context_parallel_size"] == 2
    assert not [w for w in on.warnings if "Megatron-backend settings" in w]


def test_log_prob_passes_larger_than_the_training_micro_batch_are_said_unsized():
    # grpo_math_8B_megatron.yaml sets policy.logprob_batch_size 4 beside train_micro_batch_size
    # 1 (a skill trial found it listed unused, with no word that the estimate leaves it out)
    r = _read(str(DATA / "examples/configs/grpo_math_8B_megatron.yaml"))
    (said,) = [w for w in r.warnings if "policy.logprob_batch_size = 4" in w]
    assert "training micro-batch's 1" in said and "4 x 4096 tokens" in said
    assert "policy.logprob_chunk_size" in said and "not these passes" in said
    # the 1B config keeps them equal (logprob_batch_size: ${policy.train_micro_batch_size})
    small = _read(str(DATA / "examples/configs/grpo_math_1B_megatron.yaml"))
    assert not any("logprob_batch_size" in w for w in small.warnings)
