"""LLaMA-Factory YAMLs on its Megatron backends (sources/llama_factory_megatron.py), on
LLaMA-Factory's own examples (tests/data/read/llama_factory, README.md there has the URLs).

A skill trial (round ad) gave examples/megatron/qwen3_moe_full.yaml: it was read as a Trainer
YAML, its PP4 / EP2 / distributed optimizer / full recompute left in `unused` and the run
planned at 519.6 GiB per rank; the trial had to retype the keys as a Megatron-LM command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recompute_kit.cli import main
from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve

LF = Path(__file__).parents[1] / "data" / "read" / "llama_factory" / "examples"
MCA = LF / "megatron" / "qwen3_moe_full.yaml"
MBRIDGE = LF / "megatron_bridge" / "llama3_sft.yaml"


def test_the_mcore_adapter_example_is_read_as_the_megatron_run_it_is():
    r = resolve([str(MCA)], model="Qwen/Qwen3-30B-A3B", overrides={"data_parallel_size": 2})
    reading = r.reading
    assert reading.framework == "llama-factory-mca" and "USE_MCA=1" in reading.format
    assert any("USE_MCA=1" in w for w in reading.warnings)  # the backend, said aloud
    for key, value, line in (
        ("pipeline_model_parallel_size", 4, 26),
        ("expert_model_parallel_size", 2, 34),
        ("use_distributed_optimizer", True, 29),
        ("moe_token_dispatcher_type", "alltoall", 33),
        ("recompute_granularity", "full", 35),
        ("seq_length", 4096, 9),  # cutoff_len
        ("micro_batch_size", 1, 14),  # per_device_train_batch_size
    ):
        assert reading.get(key) == value, key
        assert reading.origins[key].where.endswith(f"qwen3_moe_full.yaml:{line}"), key
    # mcore_adapter's McaModelConfig: full recompute without a method is every layer
    assert (reading.get("recompute_method"), reading.get("recompute_num_layers")) == ("uniform", 1)
    assert "mcore_adapter" in reading.origins["recompute_method"].where
    assert "pipeline_model_parallel_size" not in reading.unused
    assert r.config.model.loss_implementation == "megatron"


def test_its_estimate_is_the_same_settings_as_a_megatron_lm_command(capsys):
    # the trial's workaround: the YAML's keys typed as a Megatron-LM command line
    command = (
        "python pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
        "--expert-model-parallel-size 2 --use-distributed-optimizer --moe-grouped-gemm "
        "--moe-token-dispatcher-type alltoall --seq-length 4096 --micro-batch-size 1 "
        "--global-batch-size 16 --bf16 --recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1"
    )
    totals = []
    for config in (str(MCA), command):
        args = ["estimate", "--config", config, "--model", "Qwen/Qwen3-30B-A3B", "--dp", "2"]
        assert main([*args, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        totals.append(doc["estimates"][0]["stage_total_bytes"])
    assert totals[0] == totals[1]


def test_a_plan_hands_over_in_the_yamls_own_keys(capsys):
    args = ["plan", "--config", str(MCA), "--model", "Qwen/Qwen3-30B-A3B", "--dp", "2"]
    assert main([*args, "--gpu", "h100-80gb", "--pp", "8", "--json"]) in (0, 1)
    rendered = json.loads(capsys.readouterr().out).get("rendered") or ""
    assert "recompute_granularity:" in rendered and "cfg.model" not in rendered
    assert "pipeline_model_parallel_size: 8" in rendered


def test_the_megatron_bridge_example_takes_lf_bridge_arguments_defaults():
    reading = resolve([str(MBRIDGE)], overrides={"data_parallel_size": 8}).reading
    assert reading.framework == "llama-factory-mbridge"
    assert "USE_MEGATRON_BRIDGE=1" in reading.format
    assert reading.get("frozen_base") is True  # finetuning_type: lora
    assert reading.get("use_distributed_optimizer") is True  # the YAML's line 33
    assert reading.get("recompute_granularity") is None  # its recompute lines are comments


def test_selective_modules_go_where_each_backend_takes_them():
    from recompute_kit.config import parse_spec
    from recompute_kit.export import render

    rc = parse_spec("selective:moe_act,layernorm")
    mca = render(rc, "llama-factory-mca")
    bridge = render(rc, "llama-factory-mbridge")
    assert "recompute_modules: moe_act,layernorm" in mca  # mcore_adapter: a comma string
    # LLaMA-Factory's MegatronBridgeArguments has no recompute_modules: extra_config's dot path
    assert "recompute_modules:" not in bridge
    assert '"model.recompute_modules": ["moe_act", "layernorm"]' in bridge


def test_a_script_run_from_its_repositorys_root_finds_the_files_it_names():
    # examples/extras/fsdp_qlora/train.sh names examples/... from LLaMA-Factory's root (the
    # trial had to cd there); with the files given too, their warnings are said once
    script = LF / "extras" / "fsdp_qlora" / "train.sh"
    reading = resolve([str(script)]).reading
    assert reading.get("world_size") == 2 and reading.get("frozen_base") is True
    given = resolve(
        [str(script), str(LF / "extras/fsdp_qlora/llama3_lora_sft.yaml")], require_shape=False
    ).reading
    assert len(given.warnings) == len(set(given.warnings))


def test_a_v1_yaml_is_refused_in_one_line_not_read_as_a_trainer_yaml():
    # LLaMA-Factory v1 (examples/v1/train_full/train_full_fsdp2.yaml: `model:`, `dist_config`,
    # `micro_batch_size`) was read as a Trainer YAML: "no model named" beside `model:
    # Qwen/Qwen3-0.6B`, and LoRA assumed (v0's finetuning_type default) for a full run.
    with pytest.raises(ConfigError, match=r"a LLaMA-Factory v1 YAML \(model: Qwen/Qwen3-0.6B"):
        resolve([str(LF / "v1" / "train_full" / "train_full_fsdp2.yaml")])
