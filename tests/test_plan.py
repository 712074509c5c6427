"""The planner (issue #20): every module combination, Megatron-Core version awareness, error
bands and near-ties, every pipeline stage, and budgets as the GPU reports them."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from recompute_kit.config import (
    Config,
    ConfigError,
    RecomputeConfig,
    applicable_modules,
    parse_spec,
)
from recompute_kit.config.versions import known_broken, parse_version
from recompute_kit.gpus import GPUS
from recompute_kit.plan import plan
from recompute_kit.plan.margins import LOCAL_BAND, TE_BAND, planned_bytes
from recompute_kit.plan.search import candidates
from recompute_kit.presets import get_preset

GIB = 2**30


def deepseek_v3():
    # README's example: `plan --model deepseek-v3 --pp 16 --dp 64 --first-stage-layers 1
    # --last-stage-layers 4 --distributed-optimizer`
    return (
        get_preset("deepseek-v3")
        .config()
        .replace(
            pipeline_model_parallel_size=16,
            data_parallel_size=64,
            num_layers_in_first_pipeline_stage=1,
            num_layers_in_last_pipeline_stage=4,
            use_distributed_optimizer=True,
        )
    )


def test_every_module_combination_is_searched():
    cfg = deepseek_v3()
    n = len(applicable_modules(cfg))
    assert n == 7
    specs = {
        tuple(rc.recompute_modules)
        for rc, off in candidates(cfg)
        if rc.recompute_granularity == "selective" and not off and rc.recompute_modules
    }
    # every combination (was only singles, pairs and all seven) but those naming moe_act
    # beside moe, which recomputes the whole MoE layer and its activation with it: a skill
    # trial (Mixtral) saw "selective:moe,moe_act" rows equal to "selective:moe" to the byte
    assert len(specs) == 2**n - 1 - 2 ** (n - 2)
    assert ("layernorm", "moe_act", "mla_up_proj") in specs
    assert not any("moe" in s and "moe_act" in s for s in specs)
    from recompute_kit.memory.estimate import estimate

    both, moe = cfg.with_recompute("selective:moe,moe_act"), cfg.with_recompute("selective:moe")
    assert estimate(both).total_bytes == estimate(moe).total_bytes


def test_deepseek_v3_triple_is_tried_and_ranked():
    """Issue #20: at 4k the plan picked mla_up_proj alone and never tried
    mla_up_proj, moe_act, layernorm at the same cost. Before this change the best was
    selective:moe_act at 71.1 of 72.0 GiB usable (0.9 GiB, inside any error band)."""
    p = plan(deepseek_v3(), 80)
    by_name = {c.estimate.recompute: c for c in p.candidates if not c.offload}
    triple = by_name["selective:layernorm,moe_act,mla_up_proj"]
    alone = by_name["selective:mla_up_proj"]
    assert triple.estimate.total_bytes < alone.estimate.total_bytes - 6 * GIB
    assert triple.estimate.recompute_flops_fraction == alone.estimate.recompute_flops_fraction
    assert p.best.clears_band
    assert p.best.estimate.recompute != "selective:moe_act"  # 0.9 GiB under the line
    assert by_name["selective:moe_act"].fits and not by_name["selective:moe_act"].clears_band
    # nothing costlier than the triple is picked while it fits and clears the band. (Since
    # the TE path counts the attention output once, memory/te_saves.py, selective:layernorm,
    # moe_act clears the band with no matmul FLOPs and is picked; before, the triple was a
    # near-tie of mla_up_proj alone.)
    assert triple.clears_band
    assert p.best.estimate.recompute_flops_fraction <= triple.estimate.recompute_flops_fraction


def test_version_parsing():
    assert parse_version("0.16.1") == (0, 16)
    assert parse_version("core_r0.13.0") == (0, 13)
    assert parse_version("core_v0.12.0") == (0, 12)
    assert parse_version("v0.17.0rc1") == (0, 17)
    assert parse_version(None) is None
    with pytest.raises(ConfigError):
        parse_version("latest")


def test_uniform_not_dividing_is_broken_before_0_17():
    """Megatron-Core 0.16.1's transformer_block.py `_checkpointed_forward` calls
    `custom(layer_idx, layer_idx + recompute_num_layers)` without clamping (IndexError past the
    last layer); 0.17 clamps (PR #3562, shared/reference/megatron-recompute.md section 2.1)."""
    cfg = get_preset("llama3-70b").config().replace(pipeline_model_parallel_size=4)  # 20/stage
    assert known_broken(cfg.with_recompute("full:uniform:7"), (0, 13))
    assert known_broken(cfg.with_recompute("full:uniform:7"), None)  # unknown: strictest
    assert not known_broken(cfg.with_recompute("full:uniform:7"), (0, 17))
    assert not known_broken(cfg.with_recompute("full:uniform:5"), (0, 13))
    assert not known_broken(cfg.with_recompute("full:block:7"), (0, 13))
    # per virtual chunk: VPP 2 gives chunks of 10 layers, so 4 breaks and 5 does not
    vpp = cfg.replace(virtual_pipeline_model_parallel_size=2)
    assert known_broken(vpp.with_recompute("full:uniform:4"), (0, 16))
    assert not known_broken(vpp.with_recompute("full:uniform:5"), (0, 16))


def test_plan_never_proposes_broken_uniform():
    cfg = get_preset("llama3-70b").config().replace(pipeline_model_parallel_size=4)
    p = plan(cfg, 79.1, megatron_core_version="0.13")
    names = {c.estimate.recompute for c in p.candidates}
    assert "full:uniform:7" not in names and "full:uniform:5" in names
    assert "full:uniform:7" in {spec for spec, _ in p.excluded}
    newer = plan(cfg, 79.1, megatron_core_version="0.17")
    assert "full:uniform:7" in {c.estimate.recompute for c in newer.candidates}
    assert not newer.excluded
    # the version from the config (the reader) counts when no flag is given
    cfg.megatron_core_version = "0.17.0"
    assert not plan(cfg, 79.1).excluded
    # said as ranges, not one by one (a skill trial: 59 settings listed on a 61-layer stage)
    from recompute_kit.plan import not_proposed

    said = " ".join(not_proposed(p.excluded, (0, 13)))
    assert "full:uniform:6-9, full:uniform:11-19" in said  # 20 layers: 1, 2, 4, 5, 10 divide


def test_validate_strict_warns():
    cfg = get_preset("llama3-70b").config().replace(pipeline_model_parallel_size=4)
    broken = cfg.with_recompute("full:uniform:7")
    assert not any("uniform" in w for w in broken.validate())  # only --strict
    assert any("runs past the last layer" in w for w in broken.validate(strict=True))
    broken.megatron_core_version = "0.17"
    assert not any("runs past" in w for w in broken.validate(strict=True))
    big = cfg.with_recompute("full:block:30")  # 20 layers per stage
    assert any("larger than the 20 layers" in w for w in big.validate(strict=True))
    ignored = cfg.with_recompute(
        RecomputeConfig("full", "uniform", 1, recompute_modules=["mlp", "layernorm"])
    )
    assert any("Megatron ignores recompute_modules" in w for w in ignored.validate(strict=True))
    assert not any("ignores" in w for w in cfg.with_recompute("full:uniform:1").validate(True))


def test_error_band_by_path():
    cfg = deepseek_v3()
    te = plan(cfg, 79.1)
    assert te.error_band.path == "transformer_engine"
    assert te.error_band.activation_fraction == TE_BAND
    local = plan(cfg.replace(transformer_impl="local"), 79.1)
    assert local.error_band.activation_fraction == LOCAL_BAND
    b = local.error_band
    assert b.activation_bytes == round(LOCAL_BAND * local.best.estimate.peak_activation_bytes)
    assert b.total_bytes == b.activation_bytes + b.cuda_context_bytes + b.workspace_bytes
    assert local.headroom_bytes == local.usable_bytes - planned_bytes(local.best.estimate)


def test_every_stage_and_the_binding_one():
    p = plan(deepseek_v3(), 79.1)
    assert len(p.stages) == 16
    top = max(p.stages, key=lambda s: s.total_bytes)
    assert top.total_bytes == p.best.estimate.total_bytes  # the best is the binding stage's
    assert [s.total_bytes for s in p.stages] == p.best.estimate.stage_total_bytes
    first, last = top.ranks
    assert p.binding.startswith(f"stage {top.stage} (global ranks {first}-{last} in ")
    assert "micro-batches in flight" in p.binding and "MoE layers" in p.binding
    # the runner-up's headroom is said as headroom, beside its total (a trial read "next is
    # stage 1 with 18.32 GiB" as its total)
    runner = sorted(p.stages, key=lambda s: s.headroom_bytes)[1]
    assert (
        f"next is stage {runner.stage} with {runner.headroom_bytes / 2**30:.2f} GiB of headroom"
        in p.binding
    )
    assert f"total {runner.total_bytes / 2**30:.2f} GiB)" in p.binding
    assert p.stages[0].embedding and p.stages[-1].output_and_loss


def test_gpu_table_is_gib_as_reported():
    assert GPUS["h100-80gb"].usable_gib < 80  # what the GPU reports, not the name's 80 GB
    assert GPUS["h200"].usable_gib == pytest.approx(139.8)
    assert all(g.source for g in GPUS.values())
    # each entry is the lowest figure its cited OOM messages show, rounded down to 0.1 GiB
    for gpu in GPUS.values():
        seen = [float(x) for x in re.findall(r"(\d+\.\d+) GiB", gpu.source)]
        assert seen, gpu.name
        assert gpu.usable_gib == math.floor(min(seen) * 10) / 10, gpu.name


def test_uniform_spec_still_parses_for_any_n():
    assert parse_spec("full:uniform:7").recompute_num_layers == 7


def test_cli_plan_gpu_and_version(capsys):
    import json

    from recompute_kit.cli.parser import main

    args = ["plan", "--model", "llama3-70b", "--pp", "4", "--gpu", "h100-80gb", "--json"]
    assert main([*args, "--megatron-core-version", "core_r0.13.0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["budget_bytes"] == int(79.1 * GIB)
    assert doc["gpu"]["name"] == "h100-80gb" and doc["megatron_core_version"] == "0.13"
    assert "full:uniform:7" in {e["recompute"] for e in doc["excluded"]}
    assert len(doc["stages"]) == 4 and doc["binding_stage"]["reason"]
    for key in ("headroom_bytes", "error_band_bytes", "error_band", "ties", "best"):
        assert key in doc


def test_cli_validate_strict_reads_the_version(tmp_path, capsys):
    from recompute_kit.cli.parser import main

    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
        "--seq-length 4096 --micro-batch-size 1 --recompute-granularity full "
        "--recompute-method uniform --recompute-num-layers 7\n"
    )
    main(["validate", str(script), "--strict"])
    assert "runs past the last layer" in capsys.readouterr().out
    main(["validate", str(script), "--strict", "--megatron-core-version", "0.17"])
    assert "runs past the last layer" not in capsys.readouterr().out


def test_when_nothing_clears_the_band_the_most_headroom_is_picked():
    cfg = deepseek_v3()
    roomy = plan(cfg, 200.0, safety_margin=0.0)
    smallest = min(roomy.candidates, key=lambda c: planned_bytes(c.estimate))
    # a budget where the smallest candidate fits with half its error band to spare
    budget = (planned_bytes(smallest.estimate) + smallest.band.total_bytes // 2) / GIB
    tight = plan(cfg, budget, safety_margin=0.0)
    fitting = [c for c in tight.candidates if c.fits]
    assert fitting and not any(c.clears_band for c in fitting)
    assert tight.best.headroom_bytes == max(c.headroom_bytes for c in fitting if not c.offload)
    assert "no setting clears it" in tight.explanation
    assert "cheapest setting that clears the band" not in tight.explanation


def test_nothing_fits_on_assumed_layout_says_the_assumption(capsys):
    from pathlib import Path

    from recompute_kit.cli import main

    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "llama3_8b.toml"
    assert main(["plan", "--config", str(toml), "--gpu", "h100-80gb"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nothing fits" in err and "rests on assumed values: data_parallel_size = 1" in err


def test_torchtitan_runs_get_torchtitans_own_modes_and_their_cost():
    from pathlib import Path

    from recompute_kit.config import format_spec
    from recompute_kit.memory.flops import recompute_flops_fraction
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "llama3_8b.toml"
    cfg = resolve([str(toml)], overrides={"data_parallel_size": 8}).config
    specs = [format_spec(rc) for rc, offload in candidates(cfg) if not offload]
    selective = [s for s in specs if s.startswith("selective")]
    assert len(selective) == 1  # the per-op policy: one mode, not 2^n module sets
    blocks = sorted(int(s.rsplit(":", 1)[1]) for s in specs if s.startswith("full:block"))
    assert blocks == sorted({32 // k for k in range(2, 33)})  # every k-th block of 32
    assert all(offload == "" for _, offload in candidates(cfg))  # no activation offloading
    # the per-op policy re-runs wk, wo and w3 of every block: not free
    op = cfg.with_recompute(selective[0])
    assert 0.08 < recompute_flops_fraction(op) < 0.15


def test_named_overheads_count_against_the_usable_memory():
    # A skill trial: headroom was usable minus total_bytes while the estimate's own MoE terms
    # (allgather dispatcher buffers, expert capacity) sat outside both the margin and the band.
    cfg = deepseek_v3().replace(moe_expert_capacity_factor=1.5)
    p = plan(cfg, 79.1)
    c = next(c for c in p.candidates if c.estimate.moe_imbalance_bytes > 0)
    e = c.estimate
    assert e.dispatcher_buffers_bytes > 0
    assert c.headroom_bytes == p.usable_bytes - e.total_bytes - e.moe_imbalance_bytes - (
        e.dispatcher_buffers_bytes + e.gathered_params_bytes
    )
    assert c.fits == (c.headroom_bytes >= 0)
    assert "counted against the usable memory" in p.explanation
    # the usable memory says what it keeps aside (a trial compared the estimate's NCCL and
    # context overheads against the whole GPU and read the plan's headroom as double-counted)
    kept = (79.1 * 2**30 - p.usable_bytes) / 2**30
    assert "79.1 GiB less the safety margin" in p.explanation and f"{kept:.1f} GiB" in p.explanation


def test_offloading_beyond_the_hosts_memory_does_not_fit():
    # Llama-3-70B at 128k on TP8 alone: offloading 79 layers' activations would put about
    # 350 GB per GPU in host memory (a DGX H100 has 256 GiB per GPU): not a setting that fits.
    from recompute_kit.plan.margins import HOST_MEMORY_PER_GPU_BYTES

    cfg = (
        get_preset("llama3-70b")
        .config()
        .replace(
            seq_length=131072,
            tensor_model_parallel_size=8,
            pipeline_model_parallel_size=1,
            sequence_parallel=True,
            data_parallel_size=32,
            use_distributed_optimizer=True,
        )
    )
    p = plan(cfg, 1000.0)  # device memory is no limit here: only the host's is
    offloads = [c for c in p.candidates if c.offload.startswith("cpu_offloading")]
    big = [c for c in offloads if c.estimate.offloaded_bytes > HOST_MEMORY_PER_GPU_BYTES]
    assert big and not any(c.fits for c in big)
    assert any(c.fits for c in offloads if c not in big)


def test_torchtitan_selective_specs_are_said_to_be_one_mode(capsys):
    from pathlib import Path

    from recompute_kit.cli import main

    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "llama3_70b.toml"
    args = ["estimate", "--config", str(toml), "--dp", "8"]
    assert main([*args, "--recompute", "selective", "selective:mlp", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "torchtitan has one selective mode" in err
    rows = json.loads(out)["estimates"]
    assert rows[0]["total_bytes"] == rows[1]["total_bytes"]
    assert rows[0]["recompute_flops_fraction"] == rows[1]["recompute_flops_fraction"]


def test_nothing_fits_names_the_frameworks_own_levers():
    # a skill trial: torchtitan's llama3_70b.toml on 16 GPUs was told to use "the distributed
    # optimizer" (Megatron's; FSDP2 already shards the optimizer) and never local_batch_size
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "llama3_70b.toml"
    titan = resolve([str(toml)], overrides={"data_parallel_size": 2}).config
    with pytest.raises(ConfigError) as err:
        plan(titan, 79.1)
    said = str(err.value)
    assert "local_batch_size" in said and "distributed optimizer" not in said
    with pytest.raises(ConfigError) as err:
        plan(get_preset("llama3-70b").config(), 10)
    assert "the distributed optimizer" in str(err.value)
    # levers the run has already used up are not offered (skill trials: torchtitan at batch 1,
    # Megatron-FSDP with the distributed optimizer on)
    one = titan.replace(micro_batch_size=1)
    with pytest.raises(ConfigError) as err:
        plan(one, 30)
    # (and its weights, gradients and optimizer states alone exceed 30 GiB: a shorter sequence
    # cannot help either, so it is not offered; a skill trial was told to shorten it)
    assert "local_batch_size" not in str(err.value) and "shorten seq_len" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        plan(one.replace(seq_length=131072), 79.1)
    assert "shorten seq_len" in str(err.value)  # states fit there: the activations do not
    sharded = get_preset("llama3-70b").config().replace(use_distributed_optimizer=True)
    with pytest.raises(ConfigError) as err:
        plan(sharded, 10)
    assert "distributed optimizer" not in str(err.value)
    # a Hugging Face Trainer run already at ZeRO-3 and batch 1 (a skill trial: LLaMA-Factory
    # with ds_z3_config.json was told to "shard the model states" and lower the batch)
    hf = get_preset("llama3-70b").config()
    hf = Config(
        dataclasses.replace(hf.model, loss_implementation="hf", micro_batch_size=1),
        dataclasses.replace(hf.parallel, zero_stage=3, data_parallel_size=8),
        hf.recompute,
    )
    with pytest.raises(ConfigError) as err:
        plan(hf, 3)
    said = str(err.value)
    assert "shard the model states" not in said and "per_device_train_batch_size" not in said
    assert "offload the optimizer states" in said
    # ZeRO-2 and batch 2 of an 8B model at 32k tokens: its states fit 40 GiB, its activations
    # do not (a 70B's states alone exceed any GPU here: batch and length cannot help it)
    small = get_preset("llama3-8b").config()
    small = Config(
        dataclasses.replace(
            small.model, loss_implementation="hf", micro_batch_size=2, seq_length=32768
        ),
        dataclasses.replace(small.parallel, zero_stage=2, data_parallel_size=8),
        small.recompute,
    )
    with pytest.raises(ConfigError) as err:
        plan(small, 40)
    said = str(err.value)
    assert "shard the model states" in said and "per_device_train_batch_size" in said
    with pytest.raises(ConfigError) as err:
        plan(hf.replace(zero_stage=2, micro_batch_size=2), 3)
    assert "per_device_train_batch_size" not in str(err.value)


def test_plan_json_carries_the_estimates_moe_caveats():
    # a skill trial: plan.py said `assumptions: []` and "fits" for a dropless MoE run whose
    # estimate assumes balanced routing (no bound without a capacity factor)
    import subprocess
    import sys

    argv = [sys.executable, "-m", "recompute_kit.cli", "plan", "--model", "qwen3-30b-a3b"]
    argv += ["--gpu-memory-gb", "79.1", "--tp", "2", "--ep", "8", "--dp", "8", "--sp"]
    argv += ["--distributed-optimizer", "--seq-length", "16384", "--json"]
    doc = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    said = " ".join(doc["assumptions"])
    assert "balanced routing" in said and "dropless" in said
    assert "NCCL buffers" not in said  # the safety margin's, said in the explanation


def test_plan_json_says_the_total_it_compares_with_the_budget():
    # a skill trial read best.total_gib (50.17) as what fits while the plan compared 66.17
    # (the MoE imbalance beside the total): planned_bytes carries the compared figure
    import dataclasses

    cfg = (
        get_preset("mixtral-8x7b")
        .config()
        .replace(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=4,
            expert_model_parallel_size=8,
            data_parallel_size=8,
            use_distributed_optimizer=True,
        )
    )
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, moe_routing_imbalance=2.0))
    best = plan(cfg, 79.1).best.to_json()
    assert best["moe_imbalance_bytes"] > 0
    assert best["planned_bytes"] == best["total_bytes"] + best["moe_imbalance_bytes"] + (
        best["dispatcher_buffers_bytes"] + best["gathered_params_bytes"]
    )


def test_a_nemo_rl_plan_proposes_only_what_its_keys_say():
    # NeMo-RL's full recompute is uniform, one layer (activation_checkpointing) and it has no
    # offloading keys: full:block:N, full:uniform:N>1 and offloading are not candidates
    cfg = (
        get_preset("llama3-8b")
        .config()
        .replace(seq_length=8192, data_parallel_size=8, use_distributed_optimizer=True)
    )
    result = plan(cfg, 79.1, fmt="nemo-rl")
    specs = {c.estimate.recompute for c in result.candidates} | {result.best.estimate.recompute}
    fulls = {s for s in specs if s.startswith("full")}
    assert fulls <= {"full:uniform:1"}
    assert not any(c.offload for c in result.candidates)
    assert "policy.megatron_cfg" in result.rendered


def test_the_steps_cost_is_the_slowest_stages():
    # a skill trial (DeepSeek-V3, PP16 with three dense layers on the first stage): the plan
    # ranked by the binding stage's recompute share (6.6%) while the all-MoE stages, which set
    # the step, paid 19.3%; the step's cost is the slowest stage's
    from recompute_kit.plan import step_cost

    cfg = get_preset("deepseek-v3").config()
    cfg = cfg.replace(
        seq_length=8192,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        pipeline_model_parallel_size=16,
        num_layers_in_first_pipeline_stage=4,  # 3 dense + 1 MoE; 14 x 4 MoE; 1 last
        num_layers_in_last_pipeline_stage=1,
        expert_model_parallel_size=64,
        data_parallel_size=32,
        use_distributed_optimizer=True,
    )
    result = plan(cfg, 79.1)
    clearing = [c for c in result.candidates if c.fits and c.clears_band and not c.offload]
    assert result.best.step_cost == min(c.step_cost for c in clearing)
    for c in clearing:
        assert c.step_cost == pytest.approx(step_cost(cfg.with_recompute(c.recompute)))
    # somewhere the binding stage's share and the step's differ: the plan says the step's
    assert any(abs(c.step_cost - c.estimate.recompute_flops_fraction) > 0.01 for c in clearing)
    assert f"adds {result.best.step_cost:.1%} to the step's FLOPs" in result.explanation


def test_no_recompute_modules_before_megatron_core_0_12():
    # TransformerConfig.recompute_modules came with Megatron-Core 0.12 (core_r0.11.0 has no
    # such field): a skill trial's Pai-Megatron-Patch run on Megatron-LM-241113 (0.10) was
    # handed --recompute-modules layernorm, which its Megatron-LM rejects.
    cfg = (
        get_preset("qwen3-30b-a3b")
        .config()
        .replace(
            seq_length=4096,
            expert_model_parallel_size=8,
            data_parallel_size=8,
            use_distributed_optimizer=True,
        )
    )
    old = plan(cfg, 140, megatron_core_version="0.10")
    assert all(
        c.recompute.recompute_granularity != "selective" or c.recompute.modules == ["core_attn"]
        for c in old.candidates
    )
    assert any("field came with 0.12" in why for _, why in old.excluded)
    new = plan(cfg, 140, megatron_core_version="0.12")
    selective = [c for c in new.candidates if c.recompute.recompute_granularity == "selective"]
    assert any(c.recompute.modules != ["core_attn"] for c in selective)


def test_megatron_lm_rendering_drops_only_flags_the_script_has_and_names_its_variables(capsys):
    # Skill trials: on Megatron-LM's Megatron-FSDP DeepSeek-V3 script the rendering said "drop
    # --recompute-method, --recompute-num-layers and --recompute-activations" (none of them
    # in the script) and wrote --micro-batch-size 1 where the script sets it from MBS (line
    # 24); on the gpt-oss script (--recompute-activations) "no recompute" names that flag only.
    from recompute_kit.cli import main

    data = Path(__file__).parent / "data" / "read"
    fsdp = [str(data / "mlm_sbatch_mfsdp_deepseek_v3.sh"), "--dp", "256", "--micro-batch-size", "1"]
    assert main(["plan", "--config", *fsdp, "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "drop --recompute-method" not in out
    assert "# the script sets --micro-batch-size from a variable (line 24): change it" in out
    gptoss = [str(data / "mlm_gptoss_02_train.sh"), "--first-stage-layers", "3"]
    gptoss += ["--last-stage-layers", "3"]
    assert main(["plan", "--config", *gptoss, "--gpu", "h100-80gb"]) == 0
    assert "# no recompute: drop --recompute-activations\n" in capsys.readouterr().out


def test_a_near_tie_of_two_full_settings_is_not_said_to_recompute_fewer_modules():
    # A skill trial (GLM-5's recipe): "full:uniform:3 recomputes fewer modules" than
    # full:uniform:1; both recompute every module of whole layers.
    from types import SimpleNamespace

    from recompute_kit.plan.margins import tie_reason

    same = SimpleNamespace(recompute_flops_fraction=0.279, total_bytes=60 * 2**30)
    said = tie_reason("full:uniform:3", same, "full:uniform:1", same, 2**30)
    assert said == "same cost, memory within the band: both recompute whole layers"
    selective = tie_reason("selective:mlp", same, "selective:mlp,layernorm", same, 2**30)
    assert selective.endswith("selective:mlp recomputes fewer modules")


def test_nemo_rl_dpo_is_planned_in_sequences_and_handed_over_in_pairs(capsys):
    # A skill trial (NeMo-RL's DPO Llama 3.1 8B Megatron recipe): the estimate counted one
    # sequence a micro-batch where DPO runs the chosen and the rejected one together
    # (nemo_rl/algorithms/dpo.py: mbs = train_micro_batch_size * 2), and a corrected plan
    # rendered train_micro_batch_size in sequences (twice the pairs meant).
    from recompute_kit.cli import main

    recipe = (
        Path(__file__).parent
        / "sources/corpus/nemo_rl/dpo-llama3.1-8b-instruct-4n8g-megatrontp2pp2-quick.yaml"
    )
    assert (
        main(["plan", "--config", str(recipe), "--micro-batch-size", "4", "--gpu", "h100-80gb"])
        == 0
    )
    assert "policy.train_micro_batch_size: 2  # pairs: 4 sequences (DPO)" in capsys.readouterr().out


def test_settings_left_out_on_the_version_say_their_own_reason():
    # A skill trial (Bridge's Qwen3-30B-A3B with EP overlap) read "the 4 selective sets with
    # moe (the last uniform group would run past the last layer before 0.17 ...)": every
    # known-broken setting was given the uniform clamp's reason
    from recompute_kit.plan import not_proposed

    overlap = (
        "selective moe with overlap_moe_expert_parallel_comm: Megatron-Bridge and newer "
        "Megatron-Core refuse it"
    )
    said = not_proposed(
        [
            ("selective:moe", overlap),
            ("full:uniform:3", "full:uniform:3 on Megatron-Core unknown: a chunk of 8 layers"),
        ],
        None,
    )
    moe = next(s for s in said if "selective:moe" in s)
    uniform = next(s for s in said if "full:uniform:3" in s)
    assert "overlap_moe_expert_parallel_comm" in moe and "past the last layer" not in moe
    assert "past the last layer" in uniform


def test_settings_the_run_s_keys_cannot_write_are_said_not_proposed():
    # A skill trial: at 45 GiB the plan for NeMo-RL's grpo_math_8B_megatron.yaml (NVIDIA-NeMo/RL
    # 7ea279ab) picked selective:mlp and never said why full:block:N, which fits with less
    # recompute, was no candidate: NeMo-RL writes full recompute as uniform, one layer.
    from recompute_kit.config import format_spec
    from recompute_kit.sources.resolve import resolve

    data = Path(__file__).parent / "data/nemo_rl_launch/examples/configs"
    run = resolve([str(data / "grpo_math_8B_megatron.yaml")]).config
    excluded: list[tuple[str, str]] = []
    specs = [format_spec(rc) for rc, _ in candidates(run, None, excluded, "nemo-rl")]
    assert "full:uniform:1" in specs and not any("block" in s for s in specs)
    result = plan(run, 45, fmt="nemo-rl")
    said = "the run's keys cannot write them: full:uniform:2-16, full:block:1-16"
    assert said in result.explanation
    assert "uniform, one layer" in result.explanation


def test_no_candidate_recomputes_a_module_that_changes_nothing():
    # A skill trial on NeMo-RL's DeepSeek-V3 recipe (stage 1 all MoE layers) found
    # `selective:mlp` and `selective:mlp,layernorm,...` listed beside the same settings without
    # `mlp`, holding and costing the same (mlp acts on dense layers only), and `selective:`
    # beside none: 98 candidates, most of them copies.
    from recompute_kit.plan import _modules
    from recompute_kit.sources.resolve import resolve

    data = Path(__file__).parent / "data" / "read" / "nemo_rl_dsv3" / "examples" / "configs"
    recipe = data / "recipes" / "llm" / "grpo-dapomath17k-dsv3-32n4g-megatron.yaml"
    run = resolve([str(recipe)], model="deepseek-ai/DeepSeek-V3").config
    result = plan(run, gpu_memory_gb=173.2, fmt="nemo-rl")
    shown = [c for c in result.candidates if not c.offload]
    assert not any(c.estimate.recompute in ("selective:", "selective:mlp") for c in shown)
    for c in shown:
        for d in shown:
            mine, theirs = _modules(c.recompute), _modules(d.recompute)
            if c is d or mine is None or theirs is None or not theirs < mine:
                continue
            same = abs(planned_bytes(c.estimate) - planned_bytes(d.estimate)) < 2**20
            assert not (same and d.step_cost <= c.step_cost), (c.name, d.name)
    assert any(c.estimate.recompute == "selective:mla_up_proj" for c in shown)
