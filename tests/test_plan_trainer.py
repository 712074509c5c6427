"""A Hugging Face Trainer / LLaMA-Factory run planned in its own framework's terms.

Real files: hiyouga/LLaMA-Factory @ ff6d4d12 examples/train_full/qwen3_full_sft.yaml and
examples/deepspeed/ds_z3_config.json, ds_z3_offload_config.json (tests/sources/corpus/hf_trainer,
URLs in their .expect.yaml), Qwen/Qwen3-8B's config.json (tests/sources/corpus/hf_config).
LLaMA-Factory turns gradient checkpointing on itself unless `disable_gradient_checkpointing`
(src/llamafactory/model/model_utils/checkpointing.py @ ff6d4d12, lines 184-195); DeepSpeed's
"auto" is filled from the Trainer's arguments (transformers integrations/deepspeed.py
fill_match)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recompute_kit.cli import main
from recompute_kit.config import parse_spec
from recompute_kit.export import render
from recompute_kit.plan.levers import levers
from recompute_kit.sources.resolve import resolve

HERE = Path(__file__).parent / "sources" / "corpus"
YAML = str(HERE / "hf_trainer" / "qwen3_full_sft.yaml")  # per_device 1, accumulation 2
Z3 = str(HERE / "hf_trainer" / "ds_z3_config.json")  # every batch key "auto"
Z3_OFFLOAD = str(HERE / "hf_trainer" / "ds_z3_offload_config.json")
QWEN3 = str(HERE / "hf_config" / "Qwen--Qwen3-8B.config.json")


def _plan_json(capsys, *extra: str) -> dict:
    args = ["plan", "--config", YAML, Z3, QWEN3, "--dp", "8", "--gpu", "h100-80gb", *extra]
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_deepspeed_auto_never_overrides_the_trainer_yaml(capsys):
    # the JSON given beside the YAML (as the trial did) came later and its "auto" won
    assert main(["read", YAML, Z3, QWEN3, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["gradient_accumulation_steps"] == 2
    assert doc["sources"]["gradient_accumulation_steps"]["key"] == "gradient_accumulation_steps"
    assert "auto" not in doc["unused"].values()


def test_global_batch_is_the_trainers_product_once_dp_is_given():
    r = resolve([YAML, Z3, QWEN3], overrides={"data_parallel_size": 8})
    assert r.reading.get("global_batch_size") == 1 * 2 * 8
    assert r.reading.origins["global_batch_size"].kind == "derived"
    # without a DP nothing is derived from an assumed one
    assert resolve([YAML, Z3, QWEN3]).reading.get("global_batch_size") is None


def test_llama_factory_yaml_gets_llama_factorys_checkpointing_key(capsys):
    doc = _plan_json(capsys, "--seq-length", "4096")
    lines = [x for x in doc["rendered"].splitlines() if not x.startswith("#")]
    assert lines[0] in (
        "disable_gradient_checkpointing: true",
        "disable_gradient_checkpointing: false",
    )
    # --seq-length changed the input's cutoff_len and --dp 8 the assumed world: the plan is
    # for both and says so (the data-parallel size as the GPUs to launch on)
    assert doc["changed_settings"] == {"data_parallel_size": 8, "seq_length": 4096}
    assert lines[1:] == ["cutoff_len: 4096"]
    assert "# data parallel: launch on 8 GPUs" in doc["rendered"]
    # --format still gives the Trainer's key
    doc = _plan_json(capsys, "--seq-length", "4096", "--format", "hf-trainer")
    lines = [x for x in doc["rendered"].splitlines() if not x.startswith("#")]
    assert lines[0].startswith("gradient_checkpointing: ") and lines[1:] == ["max_length: 4096"]


def test_help_names_the_default_it_uses(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps at hyphens
    assert "hf-trainer,orllama-factoryforaLLaMA-FactoryYAML" in help_text


def test_llama_factory_render_is_the_inverse_flag():
    off = render(parse_spec("none"), "llama-factory").splitlines()
    on = render(parse_spec("full:uniform:1"), "llama-factory").splitlines()
    assert off[-1] == "disable_gradient_checkpointing: true"
    assert on[-1] == "disable_gradient_checkpointing: false"
    approx = render(parse_spec("selective:core_attn"), "llama-factory").splitlines()
    assert approx[-1] == "disable_gradient_checkpointing: false"
    assert any("Approximate" in x for x in approx)


def test_trainer_levers_are_the_trainers_own(capsys):
    doc = _plan_json(capsys, "--levers")
    table = doc["levers"]
    assert table["global_batch_size"] == 16  # 1 x 2 x 8
    assert not any("global batch unknown" in n for n in table["notes"])
    rows = table["rows"]
    kinds = {r["lever"] for r in rows}
    assert kinds == {
        "current",
        "gradient checkpointing",
        "micro-batch",
        "ZeRO stage / offload",
        "fused loss",
    }
    settings = {r["setting"] for r in rows}
    assert "disable_gradient_checkpointing=true" in settings  # LLaMA-Factory's key
    assert "per_device_train_batch_size=2 gradient_accumulation_steps=1" in settings
    both = next(
        r for r in rows if r["setting"].endswith("offload_optimizer cpu, offload_param cpu")
    )
    assert both["zero_stage"] == 3 and both["optimizer_offload"] and both["param_offload"]
    current = table["current"]
    # parameters on the host: less GPU memory, and a host-link cost counted in the step time
    assert both["peak_bytes"] < current["peak_bytes"]
    assert both["step_seconds"] > current["step_seconds"]
    assert "host memory per GPU" in both["adds"] and "CPU Adam not timed" in both["adds"]
    # (a skill trial read offload's step as nearly free: it is a lower bound, said as such)
    assert both["step_is_lower_bound"] and not current["step_is_lower_bound"]
    # Liger's loss under ZeRO-3 (this run's ds_z3_config.json) carries the known failure
    fused = next(r for r in rows if r["lever"] == "fused loss")
    assert "Liger-Kernel#767" in fused["adds"]
    stage0 = next(r for r in rows if r["setting"].startswith("zero_optimization.stage 0"))
    assert stage0["peak_bytes"] > current["peak_bytes"]


def test_fsdp_backend_names_fsdp_strategies():
    cfg = resolve([YAML, Z3, QWEN3], overrides={"data_parallel_size": 8}).config
    table = levers(cfg, 79.1, global_batch_size=16, sharding_backend="fsdp")
    sharding = [r.setting for r in table.rows if r.lever == "FSDP sharding"]
    assert "fsdp: full_shard offload" in sharding and "fsdp: shard_grad_op" in sharding
    assert all(s.startswith("fsdp: ") for s in sharding)
    assert not any(s.startswith("fsdp: no_shard offload") for s in sharding)  # FSDPOption


def test_layout_says_what_is_offloaded(capsys):
    args = ["estimate", "--config", YAML, Z3_OFFLOAD, QWEN3, "--dp", "8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 3 (optimizer and parameters offloaded to the host)" in out


def test_zero_rows_of_an_accelerate_config_are_in_its_keys(capsys):
    # a skill trial: alignment-handbook's recipe with accelerate_configs/zero3.yaml got rows in
    # a DeepSpeed JSON's names (zero_optimization.stage, offload_optimizer) that the user's file
    # does not have; Accelerate's deepspeed_config keys are the hand-over
    sft = str(HERE / "hf_trainer" / "zephyr-7b-beta_sft_config_full.yaml")
    acc = str(HERE / "hf_trainer" / "accelerate_deepspeed_zero3.yaml")
    argv = ["plan", "--config", sft, acc, QWEN3, "--dp", "8", "--gpu", "h100-80gb", "--levers"]
    assert main([*argv, "--json"]) in (0, 1)
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    zero = [r["setting"] for r in rows if r["lever"] == "ZeRO stage / offload"]
    assert zero and all(s.startswith("deepspeed_config.zero_stage") for s in zero)
    assert not any("zero_optimization" in s for s in zero)


def test_a_sharding_lever_hands_over_its_deepspeed_keys(capsys):
    # A skill trial: every lever row's `rendered` was the checkpointing line alone, so a row
    # that fits by ZeRO-3 + optimizer offload handed over nothing of ZeRO-3.
    rows = _plan_json(capsys, "--levers")["levers"]["rows"]
    both = next(
        r for r in rows if r["setting"].endswith("offload_optimizer cpu, offload_param cpu")
    )
    json_line = both["rendered"].strip().splitlines()[-1]
    assert json.loads(json_line) == {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        }
    }
    checkpointing = next(r for r in rows if r["lever"] == "gradient checkpointing")
    assert "zero_optimization" not in checkpointing["rendered"]  # its sharding is the run's


def test_micro_batch_and_fused_loss_rows_hand_over_their_own_keys(capsys):
    # A skill trial: the "micro-batch" row `per_device_train_batch_size=2
    # gradient_accumulation_steps=1` rendered only the batch (pasting it changed the global
    # batch) and the "fused loss" row rendered no Liger key at all.
    rows = _plan_json(capsys, "--levers")["levers"]["rows"]
    micro = next(r for r in rows if r["lever"] == "micro-batch")
    assert "per_device_train_batch_size: 2" in micro["rendered"]
    assert "gradient_accumulation_steps: 1" in micro["rendered"]  # 16 = 2 x 1 x 8 kept
    fused = next(r for r in rows if r["lever"] == "fused loss")
    assert "enable_liger_kernel: true" in fused["rendered"]


def _trl_at_full_logits(tmp_path: Path) -> list[str]:
    """TRL's SFT launch and ZeRO-3 Accelerate config (tests/data/launch/trl, huggingface/trl @
    f2cd577) with --loss_type nll: the full logits, as TRL before 1.7 computed the loss."""
    trl = Path(__file__).parent / "data" / "launch" / "trl"
    launch = tmp_path / "launch.sh"
    launch.write_text((trl / "launch.sh").read_text().strip() + " --loss_type nll\n")
    return [str(launch), str(trl / "examples" / "accelerate_configs" / "deepspeed_zero3.yaml")]


def test_where_no_one_lever_fits_each_is_tried_at_micro_batch_1(tmp_path, capsys):
    # A skill trial: Qwen2.5-7B, batch 8 x 4096 under ZeRO-3 on 4 A100 40GB. `plan --levers`
    # priced micro-batch 1 (36 GiB) and Liger's fused loss (46 GiB) apart, neither fitting,
    # and said "no lever fits"; the two together fit (31 GiB), which the trial found by hand.
    files = _trl_at_full_logits(tmp_path)
    argv = ["plan", "--config", *files, "--gpu", "a100-40gb", "--dp", "4", "--levers", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    alone = [r for r in rows if "+" not in r["setting"] and r["lever"] != "current"]
    assert not any(r["fits"] for r in alone)
    smallest = "per_device_train_batch_size=1 gradient_accumulation_steps=16"
    both = next(r for r in rows if r["lever"] == "fused loss" and r["setting"].startswith(smallest))
    assert both["fits"]
    assert "use_liger_kernel: true" in both["setting"] and "liger-kernel" in both["adds"]
    # (ZeRO-3's optimizer step, one sub-group's fp32 gradients, leaves it inside the error
    # band: the rows that clear it rank first)
    assert rows[0]["clears_error_band"] and not both["clears_error_band"]


def test_nothing_fits_names_what_the_run_holds_beside_its_total(tmp_path):
    # A skill trial read "3.1 GiB the run holds beside it" as a figure from its log: the terms
    # are the estimate's (ZeRO-3's gathered parameters and buckets), named with their sizes.
    from recompute_kit.config import ConfigError
    from recompute_kit.plan import plan

    cfg = resolve(_trl_at_full_logits(tmp_path), overrides={"data_parallel_size": 4}).config
    with pytest.raises(ConfigError) as refused:
        plan(cfg, 39.38)
    said = str(refused.value)
    e = cfg.with_recompute("full:uniform:1")
    from recompute_kit.memory.estimate import estimate

    est = estimate(e)
    assert f"gathered parameters {est.gathered_params_bytes / 2**30:.1f} GiB" in said
    assert f"ZeRO buckets {est.zero_buffers_bytes / 2**30:.1f} GiB" in said


def test_trl_dpo_counts_pairs_and_the_reference_model(capsys):
    # A skill trial (tests/data/launch/trl_dpo/SOURCES.md): TRL's DPO at 4 pairs per GPU on 8
    # A100 40GB OOMs, while the kit said it fits at 31.8 GiB: it read 4 sequences (DPOTrainer
    # concatenates each pair's chosen and rejected: 8) and no reference model (a second set
    # of 16-bit weights, ZeRO-3 sharded as the policy's, whole at ZeRO <= 2), and patched
    # SFTConfig's loss_type chunked_nll, which DPOConfig rejects.
    from recompute_kit.memory.model_states import model_states
    from recompute_kit.sources.resolve import resolve

    launch = Path(__file__).parent / "data" / "launch" / "trl_dpo" / "launch.sh"
    resolved = resolve([str(launch)])
    r, cfg = resolved.reading, resolved.config
    assert r.get("micro_batch_size") == 8 and "4 pairs" in r.origins["micro_batch_size"].note
    assert cfg.parallel.reference_model and cfg.parallel.preference_pairs
    with_ref = model_states(cfg).weights
    alone = model_states(cfg.replace(reference_model=False)).weights
    assert with_ref == 2 * alone  # ZeRO-3: both 16-bit copies sharded over the 8 ranks
    stage2 = cfg.replace(zero_stage=2)
    no_ref = stage2.replace(reference_model=False)
    whole = model_states(stage2).weights - model_states(no_ref).weights
    assert whole > 7 * alone  # below ZeRO-3 the reference is whole on every rank
    argv = ["plan", "--config", str(launch), "--gpu", "a100-40gb", "--levers", "--json"]
    main(argv)
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    assert not next(r for r in rows if r["lever"] == "current")["fits"]
    batches = [r["setting"] for r in rows if r["lever"] == "micro-batch"]
    assert batches and all("(pairs)" in s for s in batches)
    assert not [s for s in batches if s.startswith("per_device_train_batch_size=4")]
    # a micro-batch asked in sequences is written in pairs, in the asked format too (a re-trial
    # saw `--micro-batch-size 4 --format hf-trainer` hand back the failing 4 pairs)
    main(
        [
            "plan",
            "--config",
            str(launch),
            "--gpu",
            "a100-40gb",
            "--micro-batch-size",
            "4",
            "--format",
            "hf-trainer",
        ]
    )
    assert "per_device_train_batch_size: 2  # pairs: 4 sequences (DPO)" in capsys.readouterr().out
    # the doctor's logits finding never patches SFTConfig's loss_type into a DPO run
    main(["doctor", "--config", str(launch), "--gpu", "a100-40gb", "--json"])
    assert "chunked_nll" not in capsys.readouterr().out


def test_evaluation_batches_are_said_as_not_counted():
    # A re-trial of TRL's DPO: the command evaluates every 50 steps at the Trainer's default
    # per_device_eval_batch_size (8), a no-grad forward larger than the training step's; the
    # kit said nothing of it
    launch = Path(__file__).parent / "data" / "launch" / "trl_dpo" / "launch.sh"
    warnings = resolve([str(launch)]).reading.warnings
    said = [w for w in warnings if "evaluation (eval_strategy steps)" in w]
    assert said and "per_device_eval_batch_size 8 (transformers' default)" in said[0]


def test_llama_factorys_optimizer_switches_are_said_and_deepspeed_rows_take_its_precision(
    capsys,
):
    # LLaMA-Factory's Muon example (tests/data/read/llama_factory/examples/extras/muon/
    # qwen2_full_sft.yaml: use_muon true, bf16, no deepspeed key: DDP with autocast over fp32
    # weights). A skill trial: use_muon was left "unused" with no word that the states are
    # counted as Adam's; and the ZeRO-1/2 rows of `plan --levers` kept the DDP run's fp32
    # weights and autocast copies where DeepSpeed runs 16-bit weights with an fp32 master copy
    # (a ZeRO-2 row 25 GiB above the same run read with LLaMA-Factory's ds_z2_config.json)
    data = Path(__file__).parent / "data" / "read" / "llama_factory" / "examples"
    muon = str(data / "extras" / "muon" / "qwen2_full_sft.yaml")
    r = resolve([muon], require_shape=False).reading
    said = [w for w in r.warnings if w.startswith("use_muon muon: the optimizer states")]
    assert said and "distributed" not in said[0]  # (LLaMA-Factory's Muon is not DistMuon)
    galore = str(HERE / "hf_trainer" / "blind2_galore_llama3_full_sft.yaml")
    assert any(
        w.startswith("use_galore galore: the optimizer states")
        for w in resolve([galore], require_shape=False).reading.warnings
    )
    base = ["--config", muon, QWEN3, "--dp", "8", "--gpu", "a100-40gb"]
    assert main(["plan", *base, "--levers", "--json"]) in (0, 1)
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    z2 = next(r for r in rows if r["setting"] == "zero_optimization.stage 2")
    z2_json = str(HERE / "hf_trainer" / "blind_ds_z2_config.json")
    spec = z2["recompute"]
    argv = ["estimate", "--config", muon, z2_json, QWEN3, "--dp", "8", "--recompute", spec]
    assert main([*argv, "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)["estimates"][0]
    assert z2["peak_bytes"] == direct["total_bytes"]
