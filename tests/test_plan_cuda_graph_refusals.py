"""The planner on a recipe whose CUDA graphs make Megatron-Core refuse recompute settings: the
Megatron-Bridge 067f987 Qwen3-30B-A3B 16-GPU H100 recipe (cuda_graph_impl transformer_engine,
scope [moe_router, moe_preprocess]; verbatim under
tests/sources/corpus/bridge_checkout/, README.md there gives its URL), with the skill trial's
overrides. Megatron-Core 0.16.1 refuses full recompute there ("full recompute is only
supported with full iteration CUDA graph.") and selective `moe` ("moe recompute is not
supported with moe_router CUDA graph ..."): no plan and no lever may show them, and the
list of settings not proposed names that rule, not the version rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recompute_kit.cli.parser import main
from recompute_kit.plan import NothingFits, plan
from recompute_kit.plan.levers import levers
from recompute_kit.sources.resolve import resolve

H100 = (
    Path(__file__).parent
    / "sources/corpus/bridge_checkout/src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py"
)
RECIPE = f"{H100}::qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
# The trial's overrides_8k.txt (nothing fits on the layout as given) and fixA.txt (CP4: fits).
OVERRIDES_8K = (
    "model.seq_length=8192 dataset.seq_length=8192 model.recompute_granularity=selective "
    "model.recompute_modules=[moe_act,layernorm] train.micro_batch_size=2\n"
)
FIX_A = (
    "model.seq_length=8192 dataset.seq_length=8192 model.context_parallel_size=4 "
    "model.recompute_granularity=selective model.recompute_modules=[moe_act,layernorm] "
    "train.micro_batch_size=2\n"
)
FULL_REFUSED = "full recompute is only supported with full iteration CUDA graph."


def _config(tmp_path: Path, text: str):
    path = tmp_path / "overrides.txt"
    path.write_text(text)
    return resolve([RECIPE, str(path)], overrides={"data_parallel_size": 16}).config


def test_levers_never_show_a_refused_setting_and_nothing_fits_does_not_fit(tmp_path):
    table = levers(_config(tmp_path, OVERRIDES_8K), 79.1, global_batch_size=1024)
    for row in table.rows:
        row.config.validate()  # raises on a setting Megatron refuses
        assert row.config.recompute.recompute_granularity != "full", row.setting
        if "nothing fits" in row.setting:
            assert not row.fits, row.setting
    pick = next(r for r in table.rows if r.lever == "recompute")
    # was "plan's pick, recompute full:uniform:1 (nothing fits)" with fits true
    assert "nothing fits" in pick.setting and not pick.fits
    assert "full:uniform" not in pick.setting


def test_not_proposed_names_the_cuda_graph_rule(tmp_path):
    p = plan(_config(tmp_path, FIX_A), 79.1)
    assert p.best.recompute.recompute_granularity != "full"
    reasons = dict(p.excluded)
    assert reasons["full:uniform:5"] == "Megatron-Core refuses it: " + FULL_REFUSED
    assert reasons["full:block:1"] == "Megatron-Core refuses it: " + FULL_REFUSED
    assert reasons["selective:moe"].startswith("Megatron-Core refuses it: moe recompute")
    assert (
        f"Megatron-Core refuses them: full:uniform:1-48, full:block:1-48 ({FULL_REFUSED})"
        in p.explanation
    )
    # was: full:uniform:5, 7, ... "(the last uniform group would run past the last layer
    # before 0.17 ...)", a rule that is not why Megatron refuses them here
    assert "run past the last layer" not in p.explanation


def test_plan_json_lists_the_refusals(tmp_path, capsys):
    path = tmp_path / "fixA.txt"
    path.write_text(FIX_A)
    args = ["plan", "--config", RECIPE, str(path), "--dp", "16", "--gpu", "h100-80gb"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    refused = {e["recompute"]: e["reason"] for e in doc["excluded"]}
    assert refused["full:uniform:1"] == "Megatron-Core refuses it: " + FULL_REFUSED


def test_estimate_selective_moe_says_megatrons_message_whole(capsys):
    code = main(["estimate", "--config", RECIPE, "--dp", "16", "--recompute", "selective:moe"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    # was "... moe_router CUDA graph with: " and nothing after it
    assert (
        "moe recompute is not supported with moe_router CUDA graph with: "
        "--cuda-graph-impl transformer_engine." in err
    )


def test_a_json_error_after_an_earlier_json_command_is_still_a_document(tmp_path, capsys):
    """main() run twice in one process: the second command's error is its own document on
    stdout (the first command's document counted against it before)."""
    path = tmp_path / "fixA.txt"
    path.write_text(FIX_A)
    assert main(["plan", "--config", RECIPE, str(path), "--dp", "16", "--gpu", "h100-80gb",
                 "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["read", "--json", str(tmp_path / "missing.yaml")]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["error"] in err


def test_nothing_fits_says_that_full_recompute_is_refused(tmp_path):
    # at 8k with micro-batch 2 nothing fits; the one setting that saves the most is refused by
    # the CUDA graphs, and the error says so (it was silent: "the smallest candidate" only)
    with pytest.raises(NothingFits) as info:
        plan(_config(tmp_path, OVERRIDES_8K), 79.1)
    assert info.value.full_refused == "Megatron-Core refuses it: " + FULL_REFUSED.rstrip(".")
    assert "Full recompute is not a candidate here: Megatron-Core refuses it: full" in str(
        info.value
    )
    assert info.value.smallest.recompute.recompute_granularity == "selective"


def test_ep_overlap_refuses_full_recompute_even_without_cuda_graphs(tmp_path):
    # the perf recipes set comm_overlap.overlap_moe_expert_parallel_comm (Megatron-Bridge
    # 067f987 perf_recipes/qwen/h100/qwen3_moe.py:41): with CUDA graphs off, full recompute is
    # still refused ("disable full recomputation when enabling overlap_moe_expert_parallel_comm")
    # and so is selective moe (Bridge's comm_overlap.py); a skill trial was offered
    # full:block:33, which the run would refuse at setup
    config = _config(
        tmp_path,
        OVERRIDES_8K.strip()
        + " comm_overlap.overlap_moe_expert_parallel_comm=true model.cuda_graph_impl=none\n",
    )
    assert config.model.overlap_moe_expert_parallel_comm
    p = plan(config, 141.0)
    assert p.best.recompute.recompute_granularity != "full"
    reasons = dict(p.excluded)
    assert reasons["full:uniform:1"] == (
        "Megatron-Core refuses it: disable full recomputation when enabling "
        "overlap_moe_expert_parallel_comm"
    )
    assert "disable moe in recompute_modules" in reasons["selective:moe"]
    # without the overlap the same layout may recompute fully
    plain = _config(tmp_path, OVERRIDES_8K.strip() + " model.cuda_graph_impl=none\n")
    assert "full:uniform:1" not in dict(plan(plain, 141.0).excluded)
