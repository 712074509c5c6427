"""Tests of recompute_kit/doctor/rules/ignored.py (settings the framework accepts and then does
not act on), on Megatron-Bridge's own recipe file read through the shared reader.

The recipe is verbatim (tests/sources/corpus/bridge_checkout/src/megatron/bridge/recipes/qwen/
h100/qwen3_moe.py, Megatron-Bridge 067f987d, URL in that folder's README.md); the launch line
is scripts/training/run_recipe.py's own flags with the Hydra override a skill trial's user
added. The OOM is PyTorch's wording with that trial's
figures (no public paste pairs this recipe with its OOM).
"""

from __future__ import annotations

from pathlib import Path

from rule_helpers import covers, ids, run, text

from recompute_kit.config import config_from_dict
from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import collect

RECIPE = "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
RECIPE_FILE = (
    Path(__file__).parent
    / "sources/corpus/bridge_checkout/src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py"
)
OOM = (
    "[rank12]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.25 GiB. GPU 4 "
    "has a total capacity of 79.11 GiB of which 1.37 GiB is free. Including non-PyTorch "
    "memory, this process has 77.72 GiB memory in use. Of the allocated memory 73.90 GiB is "
    "allocated by PyTorch, and 2.05 GiB is reserved by PyTorch but unallocated.\n"
)


def _doctor(tmp_path, overrides: str):
    recipe = tmp_path / "qwen3_moe.py"
    recipe.write_text(RECIPE_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "torchrun --nnodes 2 --nproc_per_node 8 scripts/training/run_recipe.py "
        f"--recipe {RECIPE} --mode pretrain {overrides}\n",
        encoding="utf-8",
    )
    log = tmp_path / "oom.log"
    log.write_text(OOM, encoding="utf-8")
    evidence = collect(logs=[str(log)], config=[f"{recipe}::{RECIPE}", str(launch)])
    return diagnose(evidence)


@covers("RK025")
def test_recompute_modules_under_the_recipes_unset_granularity_do_nothing(tmp_path):
    # the recipe sets recompute_granularity = None ("fits without activation recomputation");
    # the user's model.recompute_modules=[moe_act,layernorm] is then ignored by Megatron-Core
    d = _doctor(tmp_path, "model.recompute_modules=[moe_act,layernorm]")
    f = next(f for f in d.findings if f.rule == "RK025")
    assert f.category == "recompute_no_effect" and "unset" in f.evidence
    assert f.patch_keys["model.recompute_granularity"] == "selective"
    assert "RK101" not in [g.rule for g in d.findings]  # no LoRA / ZeRO reading of Megatron


def test_selective_granularity_with_the_modules_is_not_rk025(tmp_path):
    d = _doctor(
        tmp_path,
        "model.recompute_granularity=selective model.recompute_modules=[moe_act,layernorm]",
    )
    assert "RK025" not in [f.rule for f in d.findings]


def test_validate_warns_about_modules_without_selective():
    cfg, _ = config_from_dict(
        {
            "num_layers": 4,
            "hidden_size": 256,
            "num_attention_heads": 4,
            "seq_length": 128,
            "recompute_modules": ["mlp"],
        }
    )
    warnings = cfg.validate(strict=True)
    assert any("recompute_granularity is unset" in w for w in warnings), warnings


@covers("RK815")
def test_deepspeed_set_up_but_the_trainer_printed_deepspeed_none():
    # https://github.com/hiyouga/LLaMA-Factory/issues/1936 (the reporter's log, two stored
    # excerpts joined, and accelerate_config.yaml, verbatim): Llama-2-13B LoRA on 5 x 24 GB,
    # started with the `deepspeed` launcher and no --deepspeed; the Accelerate YAML names a
    # ZeRO-3 config but the Trainer's arguments print deepspeed=None, and the OOM comes while
    # the model is built (21.51 GiB allocated of 23.65).
    from pathlib import Path

    config = (Path(__file__).parent / "data/rules/lf-1936-accelerate-config.yaml").read_text()
    d = run(
        text("lf-1936-trainer-deepspeed-none"), config=config, config_name="accelerate_config.yaml"
    )
    f = next(f for f in d.findings if f.rule == "RK815")
    assert f.category == "model_state_memory" and "deepspeed=None" in f.evidence
    assert f.config_patch == {
        "deepspeed": "/root/autodl-tmp/users/xyh/LLaMA-Factory/ds_config.json"
    }
    # the same log with DeepSpeed in effect says nothing of it
    on = text("lf-1936-trainer-deepspeed-none").replace(
        "deepspeed=None,", "deepspeed=ds_config.json,"
    )
    assert "RK815" not in ids(run(on, config=config, config_name="accelerate_config.yaml"))
