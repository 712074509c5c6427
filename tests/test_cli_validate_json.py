"""`validate --json` prints one JSON document also when the layout is refused, and takes the
layout overrides estimate / plan take (--dp for a node count the script leaves to SLURM).

The file: tests/sources/corpus/megatron_lm/blind_mixtral_8x7b_distributed.sh
(https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/examples/mixtral/train_mixtral_8x7b_distributed.sh):
TP 1, PP 4, EP 8 on GPUS_PER_NODE=8 x NNODES=${SLURM_NNODES:-"1"}: DP 2 cannot hold EP 8.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MIXTRAL = (
    Path(__file__).parent
    / "sources"
    / "corpus"
    / "megatron_lm"
    / ("blind_mixtral_8x7b_distributed.sh")
)
RK = [sys.executable, "-m", "recompute_kit.cli"]


def _validate(*extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [*RK, "validate", str(MIXTRAL), "--strict", "--json", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_a_refused_layout_is_a_json_document():
    proc = _validate()
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["valid"] is False and "EP 8" in doc["errors"][0]
    assert "EP 8" in proc.stderr  # the one line for a person, as before


def test_dp_override_gives_the_world_the_layout_needs():
    proc = _validate("--dp", "16")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["valid"] is True
    assert doc["read"]["config"]["world_size"] == 64  # DP 16 x TP 1 x PP 4
    assert doc["normalized"]["data_parallel_size"] == 16


def test_modules_without_selective_are_said_without_strict():
    # A skill trial: `validate RECIPE "model.recompute_modules=[moe_act]" --dp 32` on
    # Megatron-Bridge's DeepSeek-V3 recipe (recompute_granularity None) said "valid" and nothing
    # else: Megatron reads recompute_modules only under selective, so the setting does nothing.
    recipe = Path(__file__).parent / "sources/corpus/bridge/bridge_deepseek_v3_h100_recipes.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = [*RK, "validate", str(recipe), "model.recompute_modules=[moe_act]", "--dp", "32"]
    proc = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, timeout=300)
    doc = json.loads(proc.stdout)
    assert doc["valid"] is True
    assert any("recompute_granularity is unset" in w for w in doc["warnings"])


def test_validate_takes_the_recompute_setting_to_check():
    # A skill trial had to write a modified copy of the Mixtral script to check the flags it
    # proposed: --recompute checks a setting on the files' layout.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = [*RK, "validate", str(MIXTRAL), "--dp", "8", "--json", "--recompute"]
    ok = json.loads(
        subprocess.run(
            [*argv, "selective:moe_act"], capture_output=True, text=True, env=env, timeout=300
        ).stdout
    )
    assert ok["valid"] and ok["normalized"]["recompute_modules"] == ["moe_act"]
    bad = json.loads(
        subprocess.run(
            [*argv, "selective:mla_up_proj"], capture_output=True, text=True, env=env, timeout=300
        ).stdout
    )
    assert not bad["valid"] and "multi_latent_attention" in bad["errors"][0]


def test_layers_that_do_not_split_over_the_stages_are_invalid():
    # A skill trial: Megatron-LM's examples/gptoss/02_train.sh (12 layers, PP = WORLD_SIZE = 8)
    # was "valid" under --strict while estimate and plan refused it; Megatron-LM's arguments.py
    # refuses it too. Mixtral's 32 layers over PP 5 here; 4 first / 4 last leave 24 for 3.
    proc = _validate("--dp", "16", "--pp", "5")
    assert proc.returncode == 1
    assert "not divisible by pipeline parallel size 5" in json.loads(proc.stdout)["errors"][0]
    uneven = _validate(
        "--dp", "16", "--pp", "5", "--first-stage-layers", "4", "--last-stage-layers", "4"
    )
    assert uneven.returncode == 0, uneven.stdout
    # a Megatron-LM script runs under Megatron-LM's argument checks: refused without --strict too
    plain = subprocess.run(
        [*RK, "validate", str(MIXTRAL), "--json", "--dp", "16", "--pp", "5"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert plain.returncode == 1 and not json.loads(plain.stdout)["valid"]


def test_recompute_modules_written_none_is_not_a_module_list_set():
    # A skill trial (Bridge's Llama 3 70B perf recipe: `cfg.model.recompute_modules = None`,
    # granularity None) was told "recompute_modules ['core_attn'] is set while
    # recompute_granularity is unset ... set recompute_granularity: selective": None is
    # Megatron's default list, no choice. The same lines in Bridge's gpt-oss H100 recipe:
    recipe = (
        Path(__file__).parent
        / "sources/corpus/bridge_checkout/src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py"
    )
    proc = subprocess.run(
        [*RK, "validate", f"{recipe}::gpt_oss_120b_pretrain_64gpu_h100_bf16_config", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    doc = json.loads(proc.stdout)
    assert not [w for w in doc["warnings"] if "is set while recompute_granularity is unset" in w]


def test_megatron_lm_refuses_te_cross_entropy_fusion_from_0_19(tmp_path):
    # Megatron-LM's arguments.py from core_v0.19.0 (PR #5115, then #5162 moved the guard from
    # Megatron-Core to the training arguments): "Transformer Engine cross entropy loss fusion
    # is disabled due to stability issues." A skill trial's validate passed such a script.
    script = tmp_path / "train.sh"
    script.write_text(
        MIXTRAL.read_text().replace(
            "--untie-embeddings-and-output-weights",
            "--untie-embeddings-and-output-weights --cross-entropy-loss-fusion "
            "--cross-entropy-fusion-impl te",
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def validate(*extra: str) -> dict:
        proc = subprocess.run(
            [*RK, "validate", str(script), "--dp", "16", "--json", *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        return json.loads(proc.stdout)

    refused = validate()
    assert not refused["valid"]
    assert refused["errors"][0].startswith(
        "Transformer Engine cross entropy loss fusion is disabled"
    )
    assert validate("--megatron-core-version", "0.18")["valid"]


def test_strict_keeps_megatron_lm_s_command_line_rules_to_runs_it_parses(capsys):
    """Megatron-Bridge's Moonlight recipe sets TE's fused cross-entropy, which only Megatron-LM's
    arguments.py refuses: `validate --strict` says so as a warning for a Bridge run (a skill
    trial saw it marked invalid) and still refuses it for a Megatron-LM script."""
    from recompute_kit.cli import main

    recipe = (
        Path(__file__).parent / "sources/corpus/bridge_checkout/src/megatron/bridge/recipes"
        "/moonlight/h100/moonlight_16b.py::moonlight_16b_pretrain_8gpu_h100_bf16_config"
    )
    assert main(["validate", str(recipe), "--dp", "4", "--strict", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] and any(
        w.startswith("Megatron-LM's command line refuses: Transformer Engine cross entropy")
        and "megatron-bridge does not run" in w
        for w in doc["warnings"]
    )


def test_a_recompute_setting_the_run_s_keys_cannot_write_is_refused():
    # A skill trial: validate called full:block:4 valid on NeMo-RL's grpo_math_8B_megatron.yaml
    # (NVIDIA-NeMo/RL 7ea279ab, tests/data/nemo_rl_launch/), whose setup.py writes full recompute
    # as uniform, one layer, whatever the YAML says
    config = (
        Path(__file__).parent / "data/nemo_rl_launch/examples/configs/grpo_math_8B_megatron.yaml"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def check(spec: str) -> dict:
        proc = subprocess.run(
            [*RK, "validate", str(config), "--recompute", spec, "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        return json.loads(proc.stdout)

    refused = check("full:block:4")
    assert not refused["valid"] and "uniform, one layer" in refused["errors"][0]
    assert check("full:uniform:1")["valid"] and check("selective:mlp")["valid"]


def test_a_global_batch_that_does_not_split_over_micro_batches_and_dp_is_refused(capsys):
    # A skill trial: Megatron-Bridge's slurm_sft.sh (tests/sources/corpus/bridge_checkout) with
    # GLOBAL_BATCH_SIZE=8 at micro-batch 2 on DP 8 was "valid": Megatron-Core's
    # num_microbatches_calculator refuses it when training starts
    from recompute_kit.cli import main

    checkout = Path(__file__).parent / "sources/corpus/bridge_checkout"
    script = str(checkout / "examples/models/gpt_oss/slurm_sft.sh")
    assert main(["validate", script, "train.micro_batch_size=2", "--dp", "8", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == [
        "global batch size (8) is not divisible by micro batch size (2) times data parallel "
        "size (8)"
    ]
    # as the script runs it (micro-batch 1, DP 4 of its 16 ranks at TP 2 x PP 2): it splits
    assert main(["validate", script, "--json"]) == 0
