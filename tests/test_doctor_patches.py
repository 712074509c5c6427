"""Patches that cannot hurt (issue #21, doctor/patches.py): real configs of the reader corpus
(tests/sources/corpus/, each file's URL in its NAME.expect.yaml) read through the shared reader,
with a real OOM message where the case is an OOM:
tests/data/rules/i12-automodel-1975.txt, https://github.com/NVIDIA-NeMo/Automodel/pull/1975
("Tried to allocate 4.34 GiB. GPU 5 has a total capacity of 79.11 GiB").

Each test fails on the engine before doctor/patches.py (the rules' patches shown as written).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import collect
from recompute_kit.doctor.evidence.text import config_artefact_text, strip_comment

ROOT = Path(__file__).parent
CORPUS = ROOT / "sources" / "corpus"
OOM = ROOT / "data" / "rules" / "i12-automodel-1975.txt"


def doctor(config: str, log: Path | None = OOM, gpu_memory_gb: float | None = None):
    logs = [str(log)] if log else []
    return diagnose(collect(logs=logs, config=str(CORPUS / config)), gpu_memory_gb)


def finding(d, rule: str):
    found = [f for f in d.findings if f.rule == rule]
    assert found, [(f.rule, f.config_patch) for f in d.findings]
    return found[0]


# ---- never lowers recompute or raises the estimated peak -------------------------------------


def test_moe_mla_patch_that_drops_recomputed_modules_is_not_shown():
    # Megatron-LM functional test config: MLA + MoE (--moe-layer-freq ([0]*3+[1]*13)),
    # selective recompute of [layernorm mla_up_proj mlp moe_act]. RK021 used to patch
    # recompute_modules [layernorm, moe_act]: dropping mla_up_proj and mlp, which by the
    # kit's own estimate raises the peak by 7.39 GiB per GPU (7.28 before the TE path's
    # dense `mlp` checkpoint took the fused pre-MLP norm inside, memory/te_saves.py) on the
    # stage with the highest total; the OOM pasted is on rank 5, pipeline stage 1 of 2 (4
    # ranks a stage), where it raises that stage's peak by 4.38 GiB.
    d = doctor("megatron_lm/blind_ft_moe_mla_selective_recompute.yaml")
    assert any("rank 5: pipeline stage 1 of 2" in n for n in d.evidence.notes)
    # mlp acts on the three dense layers: RK021 ("does nothing") is not said at all now
    assert "RK021" not in [f.rule for f in d.findings]
    current = {"layernorm", "mla_up_proj", "mlp", "moe_act"}
    for f in d.findings:  # no finding recomputes less than the run does
        mods = f.config_patch.get("recompute_modules")
        assert mods is None or current <= set(mods), (f.rule, mods)
        assert f.config_patch.get("recompute_granularity", "selective") == "selective"


def test_deepseek_v3_bridge_dense_layers_keep_mlp_recompute():
    # Megatron-Bridge DeepSeek-V3 recipe (recompute [mla_up_proj, mlp], dense layers 0-2):
    # RK021 used to say "mlp does nothing" and offer [layernorm, moe_act], dropping both
    # modules; mlp recomputes the dense layers' MLPs, so no finding says so or drops them.
    d = doctor("bridge/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml")
    assert "RK021" not in [f.rule for f in d.findings]
    for f in d.findings:
        mods = f.config_patch.get("recompute_modules")
        assert mods is None or {"mla_up_proj", "mlp"} <= set(mods), (f.rule, mods)


def test_patch_rejected_by_validation_is_not_shown(tmp_path: Path):
    # An all-MoE Mixtral-8x7B recomputing mlp (which Megatron skips on MoE layers) under fp8
    # with Megatron-LM's default delayed scaling: RK021's [layernorm, moe_act] is what
    # Megatron-Core refuses for fp8 delayed (transformer_config.py), so it is not shown.
    from rule_helpers import MIXTRAL_8X7B_MLP

    script = tmp_path / "mixtral.sh"
    script.write_text(MIXTRAL_8X7B_MLP.replace("--bf16", "--bf16 --fp8-format hybrid"))
    d = diagnose(collect(logs=[str(OOM)], config=str(script)), None)
    f = finding(d, "RK021")
    assert f.config_patch == {}
    assert "rejected by Megatron-Core's validation" in f.fix
    plain = tmp_path / "plain.sh"
    plain.write_text(MIXTRAL_8X7B_MLP)
    shown = finding(diagnose(collect(logs=[str(OOM)], config=str(plain)), None), "RK021")
    assert shown.config_patch["recompute_modules"] == ["layernorm", "moe_act"]


def test_deepseek_v3_bridge_that_fits_by_the_estimate_gets_no_recompute_step():
    # With the file's gradient / optimizer dtypes read (2 B grads, bf16 Adam moments) its own
    # setting [mla_up_proj, mlp] is 63.6 GiB on a 79.11 GiB GPU: "recompute more" (RK010) has
    # nothing to add, and no finding's patch recomputes less than the run does.
    d = doctor("bridge/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml")
    assert "RK010" not in [f.rule for f in d.findings]
    for f in d.findings:
        modules = f.config_patch.get("recompute_modules")
        if modules is not None and f.category != "recompute_overhead":
            assert "mla_up_proj" in modules, (f.rule, f.config_patch)


def test_full_recompute_nemo_rl_is_never_advised_less_recompute():
    # NeMo-RL DPO recipe with dtensor_cfg.activation_checkpointing: true (full recompute):
    # nothing may switch it to selective or off, nor re-set what it already has.
    d = doctor("nemo_rl/dpo-mistral-nemo-instruct-2407-1n8g-fsdp2tp8-actckpt-long.yaml")
    for f in d.findings:
        if f.category == "recompute_overhead":
            continue  # speed: lowering recompute is its point (and it says the memory cost)
        assert "recompute_granularity" not in f.config_patch, (f.rule, f.config_patch)
    # the default reading names the run's knobs and patches none it already sets
    assert d.findings and all(
        "activation_checkpointing" not in str(f.patch_keys or {}) for f in d.findings
    )


def test_speed_finding_keeps_lowering_recompute_and_says_the_memory_it_costs():
    # Megatron-LM functional test config with full, uniform recompute and room on an 80 GiB
    # GPU: RK032 (recompute overhead) advises turning recompute off; that is its point.
    d = doctor("megatron_lm/blind_ft_gpt3_uniform_full_recompute.yaml", None, gpu_memory_gb=80)
    f = finding(d, "RK032")
    assert f.config_patch["recompute_granularity"] is None
    assert f.patch_keys["--recompute-granularity"] is None
    assert "trades memory for speed: raises the estimated peak from" in f.fix
    assert "(+2.63 GiB)" in f.fix


# ---- in the framework's own keys -------------------------------------------------------------


def test_nemo1_patch_in_activations_checkpoint_keys():
    # NeMo 1.x launcher config (Mixtral 8x22B): NeMo 1.x reads activations_checkpoint_*, never
    # recompute_*.
    d = doctor("nemo/blind2_launcher_mixtral_8x22b.yaml")
    f = finding(d, "RK010")
    assert f.patch_framework == "nemo1"
    assert f.patch_keys == {
        "model.activations_checkpoint_granularity": "full",
        "model.activations_checkpoint_method": "uniform",
        "model.activations_checkpoint_num_layers": 1,
    }
    # the recompute_* keys NeMo 1.x sets itself from activations_checkpoint_* (config_mapping
    # wins over the YAML's own): never patched
    owned = ("recompute_", "model.recompute_granularity", "model.recompute_method")
    for f in d.findings:
        assert not any(k.startswith(owned) for k in f.patch_keys or {})
        assert "model.recompute_num_layers" not in (f.patch_keys or {})


def test_nemo1_recompute_modules_go_in_the_model_block():
    # NeMo 1.x Nemotron-340B launcher config: build_transformer_config passes TransformerConfig
    # fields of `model:` by name (NVIDIA/NeMo megatron_base_model.py, `elif field.name in cfg`),
    # so RK020's selective modules are model.recompute_modules beside the
    # activations_checkpoint_* keys (a skill trial: it had said "nemo1 has no key", while the
    # plan's rendering wrote model.recompute_modules).
    d = doctor("nemo/blind_launcher_nemotron_340b.yaml")
    f = finding(d, "RK020")
    assert f.patch_keys["model.recompute_modules"] == ["mlp"]
    assert f.patch_keys["model.activations_checkpoint_granularity"] == "selective"
    assert f.patch_check["peak_after_bytes"] < f.patch_check["peak_before_bytes"]
    # a DeepSpeed JSON section NeMo 1.x does not read: never patched (RK101, which counted
    # the states by the model's name and patched a ZeRO stage, now leaves a run with a model
    # shape to the estimate's rules)
    assert all("zero_optimization" not in f.config_patch for f in d.findings)
    assert "RK101" not in [f.rule for f in d.findings]


def test_nemo_rl_gets_its_own_checkpointing_key_not_gradient_checkpointing():
    # NeMo-RL SFT recipe (DTensor backend): RK014 used to patch Hugging Face's
    # gradient_checkpointing, which NeMo-RL does not read.
    d = doctor("nemo_rl/sft.yaml")
    f = finding(d, "RK014")
    assert "gradient_checkpointing" not in f.config_patch
    assert f.patch_keys == {"policy.dtensor_cfg.activation_checkpointing": True}
    assert f.patch_framework == "nemo-rl"


def test_bridge_gets_cross_entropy_fusion_not_liger():
    # Megatron-Bridge Llama-3 70B SFT recipe: RK620 used to patch use_liger_kernel (a Hugging
    # Face / Liger key); Bridge's own fused cross entropy is model.cross_entropy_loss_fusion,
    # which this recipe already sets (line 298): no patch, and the fix says so. The prose
    # blaming the vocabulary is a real paste (tests/rule_sources.py), not the config's text.
    d = doctor(
        "bridge/blind_llama3_70b_sft_gb200_fp8_mx_v1.yaml",
        Path(__file__).parent / "data" / "rules" / "fz-advprompter-1-llama3-vocab-chunks.txt",
    )
    f = finding(d, "RK620")
    assert "use_liger_kernel" not in f.config_patch and not f.patch_keys
    assert any("megatron-bridge's own setting" in n for n in f.patch_check["notes"])
    assert "Already set in the inputs (cross_entropy_loss_fusion" in f.fix


def test_unknown_framework_stays_in_megatron_core_names_and_says_so():
    # A model's config.json says nothing of the trainer: the framework is unknown.
    d = doctor("hf_config/meta-llama--Meta-Llama-3.1-8B.config.json")
    f = next(f for f in d.findings if f.config_patch)
    assert f.patch_framework is None and f.patch_keys is None
    assert f.patch_check["keys"] == "megatron-core"
    assert any("framework unknown" in n for n in f.patch_check["notes"])


# ---- never already set -----------------------------------------------------------------------


def test_distributed_optimizer_already_set_is_not_patched():
    # NeMo 1.x Mixtral 8x22B launcher config sets optim.name: distributed_fused_adam (line 143).
    # RK011's patch is the planner's first lever that fits (plan --levers), never the
    # distributed optimizer the file already turns on.
    d = doctor("nemo/blind2_launcher_mixtral_8x22b.yaml")
    for f in d.findings:
        assert "use_distributed_optimizer" not in f.config_patch, f.rule
    f = finding(d, "RK011")
    assert "plan --levers" in f.fix and f.config_patch


def test_bridge_distributed_optimizer_already_set():
    # Megatron-Bridge Llama-3 70B SFT recipe sets ddp.use_distributed_optimizer: true.
    d = doctor("bridge/blind_llama3_70b_sft_gb200_fp8_mx_v1.yaml")
    for f in d.findings:
        assert "use_distributed_optimizer" not in f.config_patch, f.rule


# ---- findings come from artefacts, not comments or the environment ---------------------------


def test_yaml_comment_naming_fragmentation_fires_nothing():
    # NeMo 1.x megatron_gpt_config.yaml line 171: "gradient_as_bucket_view: True # PyTorch DDP
    # argument. Allocate gradients in a contiguous bucket to save memory (less fragmentation
    # and buffer memory)" - documentation, not a report of fragmentation.
    d = doctor("nemo/megatron_gpt_config.yaml")
    assert "RK480" not in [f.rule for f in d.findings]
    assert not any(
        "fragmentation" in line
        for line in d.evidence.facts["config"].get("fragmentation_prose", [])
    )


def test_cublas_workspace_in_the_environment_fires_nothing():
    # Megatron-LM functional test config: ENV_VARS: CUBLAS_WORKSPACE_CONFIG: :4096:8 (the run's
    # environment, not a report of memory left after freeing).
    d = doctor("megatron_lm/blind2_ft_gpt3_345m_tp1_pp2_fp16.yaml", None)
    assert "RK264" not in [f.rule for f in d.findings]


def test_comment_is_not_the_model_size():
    # Megatron-LM DeepSeek2-Lite launch script: "# Model architecture parameters for
    # DeepSeek2-Lite (1.3B parameters)" is a comment (and wrong: the model is 15.7B).
    d = doctor("megatron_lm/train_deepseek2_lite_h100_fp8.sh", None)
    assert "model_prose" not in d.evidence.facts.get("config", {})
    assert not any("1.3B" in f.evidence for f in d.findings)


@pytest.mark.parametrize(
    "line, kept",
    [
        ("gradient_as_bucket_view: True # PyTorch DDP argument", "gradient_as_bucket_view: True"),
        ("# Model architecture parameters for DeepSeek2-Lite (1.3B parameters)", ""),
        ('name: "run # 3"', 'name: "run # 3"'),
        ("url: https://x.org/a#frag", "url: https://x.org/a#frag"),
        ("echo $# args", "echo $# args"),
    ],
)
def test_strip_comment(line, kept):
    assert strip_comment(line) == kept


def test_config_artefact_text_drops_environment_lines():
    text = "ENV_VARS:\n  CUBLAS_WORKSPACE_CONFIG: :4096:8\nexport NCCL_DEBUG=INFO\nMODEL: x\n"
    assert config_artefact_text(text).split("\n") == ["", "", "", ""]
    assert config_artefact_text("  --num-layers: 24\n") == "  --num-layers: 24"


def test_recompute_step_keeps_the_modules_the_run_recomputes():
    # The same config on a smaller budget: its own setting no longer fits, and the planner's
    # overall cheapest (selective:moe) would drop the mla_up_proj the run recomputes; the step
    # RK010 gives keeps it (a skill trial found the drop).
    d = doctor("bridge/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml", gpu_memory_gb=60)
    rk010 = finding(d, "RK010")
    modules = rk010.config_patch["recompute_modules"]
    assert {"mla_up_proj", "mlp"} <= set(modules), modules
    assert "keeps what the run recomputes" in rk010.evidence


def test_a_paste_without_config_is_patched_in_the_keys_its_frames_name(tmp_path: Path):
    # https://github.com/pytorch/torchtitan/issues/439 (the corpus case's paste, verbatim):
    # no config given, but the traceback runs through torchtitan/parallelisms/: the patch is
    # written in torchtitan's keys ([activation_checkpoint] mode), not the Trainer's
    # gradient_checkpointing (a skill trial saw Megatron / HF keys for torchtitan pastes)
    import yaml

    case = (
        ROOT / "corpus" / "cases" / "a_torchtitan_439_checkpointpolicy_importerror_old_torch.yaml"
    )
    log = tmp_path / "paste.log"
    log.write_text(yaml.safe_load(case.read_text())["artefacts"])
    d = diagnose(collect(logs=[str(log)]))
    f = d.findings[0]
    assert f.patch_framework == "torchtitan"
    assert (
        "activation_checkpoint.mode" in f.patch_keys
        and "gradient_checkpointing" not in f.patch_keys
    )


def test_adding_moe_does_not_keep_the_moe_act_it_covers(tmp_path):
    # Megatron-LM's MLA + MoE functional-test config recomputes [layernorm mla_up_proj mlp
    # moe_act]; on a 16 GiB budget the next step recomputes the whole MoE layer, which covers
    # moe_act: the patch is the planner's setting, not it with a redundant moe_act beside moe
    # (a skill trial got [..., moe, moe_act, ...] from the doctor and [..., moe, ...] from plan)
    # (with its --overlap-moe-expert-parallel-comm off: Megatron-LM main refuses moe recompute
    # with that overlap, and the config sets it)
    text = (CORPUS / "megatron_lm/blind_ft_moe_mla_selective_recompute.yaml").read_text()
    config = tmp_path / "no_overlap.yaml"
    config.write_text(text.replace("--overlap-moe-expert-parallel-comm: true", ""))
    d = diagnose(collect(logs=[str(OOM)], config=str(config)), 16)
    f = finding(d, "RK010")
    mods = set(f.config_patch["recompute_modules"])
    assert "moe" in mods and "moe_act" not in mods
    assert {"layernorm", "mla_up_proj", "mlp"} <= mods  # nothing else the run recomputes dropped
    # as written (the overlap on) the next step keeps moe_act and adds no moe
    d = doctor("megatron_lm/blind_ft_moe_mla_selective_recompute.yaml", gpu_memory_gb=16)
    mods = set(finding(d, "RK010").config_patch["recompute_modules"])
    assert "moe" not in mods and {"layernorm", "mla_up_proj", "mlp", "moe_act"} <= mods


def test_nemo_rl_fused_logprobs_key_is_named_with_what_refuses_it(tmp_path):
    # NeMo-RL's GRPO 8B Megatron config (tests/data/nemo_rl_launch/, NVIDIA-NeMo/RL 7ea279ab)
    # launched at 8192 tokens on PP 1, and an OOM of the fp32 logits' size (8192 x 128256 x 4
    # = 3.91 GiB; PyTorch's wording with a skill trial's figures). The fused loss there is
    # policy.megatron_cfg.use_fused_linear_logprobs, which GRPO refuses with sequence packing
    # (on in this config): the patch is NeMo-RL's chunked log-probs, which packing allows (a
    # skill trial; before: nothing, and before that a model_overrides key NeMo-RL never reads).
    import shutil

    shutil.copytree(
        Path(__file__).parent / "data" / "nemo_rl_launch" / "examples", tmp_path / "examples"
    )
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "uv run python examples/run_grpo_math.py --config "
        "examples/configs/grpo_math_8B_megatron.yaml policy.max_total_sequence_length=8192 "
        "policy.megatron_cfg.pipeline_model_parallel_size=1\n"
    )
    log = tmp_path / "train.log"
    log.write_text(
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 3 "
        "has a total capacity of 79.11 GiB of which 2.02 GiB is free. Including non-PyTorch "
        "memory, this process has 77.08 GiB memory in use. Of the allocated memory 68.44 GiB "
        "is allocated by PyTorch, and 7.13 GiB is reserved by PyTorch but unallocated.\n"
    )
    d = diagnose(collect(logs=[str(log)], config=str(launch)))
    f = finding(d, "RK012")
    assert f.patch_keys == {
        "policy.logprob_chunk_size": 1024,
        "policy.megatron_cfg.defer_fp32_logits": True,
    }
    assert "model_overrides" not in str(f.patch_check)


def test_a_pick_that_fits_only_with_offloading_is_patched_with_it():
    # Megatron-Bridge's own recipe, verbatim (NVIDIA-NeMo/Megatron-Bridge @ 067f987,
    # src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py), at a skill trial's overrides: its
    # TE CUDA graphs refuse moe and full recompute, so the planner's pick fits only with
    # fine-grained activation offloading. The patch had the recompute keys alone (107 GiB by
    # the kit's own estimate, on an 79.1 GiB GPU).
    recipe = CORPUS / "bridge_checkout" / "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py"
    overrides = {
        "expert_model_parallel_size": 8,
        "pipeline_model_parallel_size": 2,
        "micro_batch_size": 2,
        "seq_length": 8192,
        "data_parallel_size": 8,
    }
    config = f"{recipe}::qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
    d = diagnose(collect(config=config, overrides=overrides), 79.1)
    f = finding(d, "RK010")
    assert f.config_patch["fine_grained_activation_offloading"] is True
    assert f.config_patch["offload_modules"] and "offload" in f.evidence
    assert f.patch_keys["model.offload_modules"] == f.config_patch["offload_modules"]
    # the logits as the run keeps them (TE's fused cross-entropy: 4.6 GiB on the last stage,
    # the estimator's loss term) are no cause here; an fp32 copy and its gradients (27.8 GiB)
    # had made RK012 a finding that said "the loss is where the step ran out" with no OOM
    assert "RK012" not in {f.rule for f in d.findings}


def test_gpt_oss_script_gets_a_next_step_megatron_accepts_and_its_own_recompute_flag():
    # A skill trial on Megatron-LM's gpt-oss example (tests/data/read/README.md): fp8 with the
    # delayed recipe, `--recompute-activations`, 12 layers over PP 8 given 3 / 3 end stages.
    # RK020 named 'selective:layernorm,moe_act' as the next step, which Megatron refuses with
    # delayed scaling; RK090's patch removed --recompute-granularity, a flag the script has not
    # (it turns recompute on with --recompute-activations), and its fix read "... for
    # throughput. spends the GPU's unused memory ...".
    script = ROOT / "data" / "read" / "mlm_gptoss_02_train.sh"
    layout = {"num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 3}
    d = diagnose(collect(config=str(script), overrides=layout), 80)
    no_effect = finding(d, "RK020")
    assert "Next: 'selective:moe'" in no_effect.evidence
    assert no_effect.config_patch["recompute_modules"] == ["moe"]
    headroom = finding(d, "RK090")
    assert headroom.patch_keys == {"--recompute-activations": None}
    assert "The patch spends the GPU's unused memory on speed" in headroom.fix


NEMO_RL_903 = """\
When using nemo-rl for SFT on the Qwen-1.5B model, our configuration is as follows:
```
f'++policy.megatron_cfg.tensor_model_parallel_size=1 '
f'++policy.megatron_cfg.context_parallel_size=2 '
f'++policy.train_global_batch_size=1024 '
f'++policy.max_total_sequence_length=32768'
f'++policy.train_micro_batch_size=1
```
However, with these settings, we encounter an OOM (out of memory) error even when running on 64 nodes.
"""  # noqa: E501


def test_nemo_rl_overrides_in_a_paste_are_its_settings_and_its_keys(tmp_path: Path):
    # https://github.com/NVIDIA-NeMo/RL/issues/903 (the report, verbatim; the reporter's fix
    # was context_parallel_size=4). A skill trial: the overrides were "not in the paste" and
    # the patch was the Hugging Face Trainer's gradient_checkpointing for a NeMo-RL run.
    log = tmp_path / "paste.txt"
    log.write_text(NEMO_RL_903)
    d = diagnose(collect(logs=[str(log)]), None)
    assert d.evidence.config["policy.train_micro_batch_size"] == 1
    assert d.evidence.config["policy.max_total_sequence_length"] == 32768
    for f in d.findings:
        keys = f.patch_keys or {}
        assert "gradient_checkpointing" not in keys and "gradient_checkpointing" not in (
            f.config_patch or {}
        )
    top = d.findings[0]
    assert top.patch_framework == "nemo-rl"
    assert all(k.startswith("policy.") for k in (top.patch_keys or {})), top.patch_keys


def test_an_unknown_model_beside_the_config_still_reads_the_config(tmp_path: Path):
    # a skill trial: `diagnose --config trl.yaml --model <an id the kit cannot have>` read
    # nothing (the framework went from hf-trainer to unknown); the files are read without it
    config = CORPUS / "hf_trainer" / "qwen3_full_sft.yaml"
    d = diagnose(collect(logs=[str(OOM)], config=str(config), model="not-a-model"), None)
    assert (d.evidence.read or {}).get("framework") == "hf-trainer"
    assert any("--model not-a-model not applied" in n for n in d.evidence.notes)


def test_a_memory_patch_that_frees_nothing_is_not_shown():
    # NVIDIA/Megatron-LM#525 (tests/data/launch/mlm525, verbatim): an OOM in the loss. A skill
    # trial was given --cross-entropy-loss-fusion, whose native implementation keeps the same
    # fp32 tensors by the kit's own estimate (memory/estimate.py loss_bytes): TE's is the patch,
    # and a patch that leaves the estimate where it is goes, with the reason said
    import dataclasses

    from recompute_kit.doctor.engine import build_context
    from recompute_kit.doctor.patches import check_patches

    mlm525 = ROOT / "data" / "launch" / "mlm525"
    evidence = collect(logs=[str(mlm525 / "terminal.txt")], config=str(mlm525 / "gpt2_755.sh"))
    d = diagnose(evidence, 32)
    f = finding(d, "RK012")
    # the logits as the loss holds them: the padded vocabulary (the OOM asked 786.00 MiB)
    assert "4096 tokens x 50304 vocabulary (the 50257 padded" in f.evidence
    assert "one fp32 copy of the logits is 786.00 MiB" in f.evidence
    te = {"--cross-entropy-loss-fusion": True, "--cross-entropy-fusion-impl": "te"}
    assert f.patch_keys == te
    native = dataclasses.replace(
        f, config_patch={"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "native"}
    )
    check_patches(build_context(evidence, 32), [native])
    assert not native.patch_keys
    assert "it frees nothing" in native.patch_check["harmful"]


# ---- never already set: a DeepSpeed zero_optimization patch ----------------------------------


@pytest.mark.parametrize(
    ("config", "patch", "kept"),
    [
        # ds_z3_config.json (LLaMA-Factory's examples/deepspeed) is stage 3 with no offload
        ("hf_trainer/ds_z3_config.json", {"stage": 3}, False),
        ("hf_trainer/ds_z3_config.json", {"offload_optimizer": {"device": "none"}}, False),
        ("hf_trainer/ds_z3_config.json", {"offload_optimizer": {"device": "cpu"}}, True),
        (
            "hf_trainer/ds_z2_offload_config.json",
            {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            False,
        ),
        ("hf_trainer/ds_z2_offload_config.json", {"stage": 3}, True),
    ],
)
def test_deepspeed_patch_already_in_the_inputs_is_not_shown(config, patch, kept):
    from recompute_kit.doctor.engine import build_context
    from recompute_kit.doctor.patches import check_patches
    from recompute_kit.doctor.types import Finding

    ctx = build_context(collect(logs=[str(OOM)], config=str(CORPUS / config)))
    f = Finding(
        "RK000",
        "model_state_memory",
        "t",
        "",
        "",
        "",
        "",
        {"zero_optimization": patch},
        0.5,
        [],
        "",
    )
    check_patches(ctx, [f])
    assert ("zero_optimization" in f.config_patch) is kept, f.patch_check
    if not kept:
        assert "already so in the inputs" in f.patch_check["dropped"][0]["reason"]


@pytest.mark.parametrize(
    "name", ["dots-ocr-196", "ipex-629", "i12-pytorch-40863", "ex-mlm-pr5662", "therock-1054"]
)
def test_no_patch_shows_a_change_in_place_of_a_value(name):
    # a skill trial: RK004's patch {"micro_batch_size": "half of the current one"} was checked
    # by Megatron's validation as a value. Texts whose rules (RK004, RK102, RK265) patch "half
    # of the current one": no shown patch carries it; with a Megatron-LM script that gives the
    # micro-batch (4), a batch patch is that halved
    from recompute_kit.doctor.rules.registry import HALF

    log = ROOT / "data" / "rules" / f"{name}.txt"
    script = CORPUS / "megatron_lm" / "blind_llama3_8b_h100_fp8.sh"
    for config in (None, script):
        d = diagnose(collect(logs=[str(log)], config=str(config) if config else None))
        for f in d.findings:
            for patch in (f.config_patch or {}, f.patch_keys or {}):
                assert HALF not in map(str, patch.values()), (f.rule, patch)
            if config and any("half of" in n for n in f.patch_check.get("notes", [])):
                assert f.config_patch["micro_batch_size"] == 2, f.config_patch


def test_half_of_the_micro_batch_is_written_where_the_inputs_give_it():
    # Megatron-Bridge's llama32_1b finetune recipe (blind2_llama32_1b_finetune.yaml) sets the
    # micro-batch: "half of the current one" is that halved, in the run's own key
    from recompute_kit.doctor.engine import build_context
    from recompute_kit.doctor.patches import check_patches
    from recompute_kit.doctor.rules.registry import HALF
    from recompute_kit.doctor.types import Finding

    config = CORPUS / "bridge" / "blind2_llama32_1b_finetune.yaml"
    ctx = build_context(collect(logs=[str(OOM)], config=str(config)))
    now = ctx.evidence.read["config"]["micro_batch_size"]
    assert now > 1
    f = Finding(
        "RK000", "activation_memory", "t", "", "", "", "", {"batch_size": HALF}, 0.5, [], ""
    )
    check_patches(ctx, [f])
    assert f.config_patch == {"micro_batch_size": now // 2}
    assert any(n.startswith("batch_size: half of") for n in f.patch_check["notes"])
