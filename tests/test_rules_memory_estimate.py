"""RK010 / RK012 / RK014 (rules/memory.py) on real Trainer configs read by the shared reader,
where the estimate's per-module split decides which memory dominates.

The files are the reader corpus's verbatim copies (tests/sources/corpus/, each URL in its
NAME.expect.yaml):
- hf_trainer/qwen3_full_sft.yaml: https://github.com/hiyouga/LLaMA-Factory/blob/ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30/examples/train_full/qwen3_full_sft.yaml
- hf_trainer/ds_z3_config.json: the same commit's examples/deepspeed/ds_z3_config.json
- hf_trainer/accelerate_deepspeed_zero3.yaml: https://github.com/huggingface/alignment-handbook/blob/22dde3b75dab6996273b25787834603ed02dcadf/recipes/accelerate_configs/deepspeed_zero3.yaml
- hf_config/Qwen--Qwen3-8B.config.json: https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/aic-core/src/aiconfigurator_core/model_configs/Qwen--Qwen3-8B_config.json
- hf_trainer/zephyr-7b-beta_sft_config_full.yaml, torchtitan/blind2_llama3_8b-8xb200-8k.toml
edited as a user of a skill trial did (Qwen3-8B at 8k tokens, 2 per GPU, 8 processes, and
`disable_gradient_checkpointing: true`, LLaMA-Factory's switch, hparams/model_args.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rule_helpers import run, text

from recompute_kit.doctor.engine import build_context, diagnose
from recompute_kit.doctor.evidence import collect
from recompute_kit.doctor.rules.memory import activation_split

CORPUS = Path(__file__).parent / "sources" / "corpus"


def _lf_run(tmp: Path, *, checkpointing_off: bool = True, gpu_memory_gb: float = 79.1):
    sft = (CORPUS / "hf_trainer" / "qwen3_full_sft.yaml").read_text(encoding="utf-8")
    for old, new in (
        ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-8B"),
        ("examples/deepspeed/ds_z3_config.json", "ds_z3_config.json"),
        ("cutoff_len: 2048", "cutoff_len: 8192"),
        ("per_device_train_batch_size: 1", "per_device_train_batch_size: 2"),
    ):
        assert old in sft
        sft = sft.replace(old, new)
    if checkpointing_off:
        sft = sft.replace("### train\n", "### train\ndisable_gradient_checkpointing: true\n")
    (tmp / "sft.yaml").write_text(sft, encoding="utf-8")
    shutil.copy(CORPUS / "hf_trainer" / "ds_z3_config.json", tmp / "ds_z3_config.json")
    accel = (CORPUS / "hf_trainer" / "accelerate_deepspeed_zero3.yaml").read_text()
    (tmp / "accel.yaml").write_text(accel.replace("num_processes: 1", "num_processes: 8"))
    shutil.copy(CORPUS / "hf_config" / "Qwen--Qwen3-8B.config.json", tmp / "config.json")
    files = [str(tmp / n) for n in ("sft.yaml", "ds_z3_config.json", "accel.yaml", "config.json")]
    return diagnose(collect(logs=[], config=files), gpu_memory_gb)


def _finding(d, rule: str):
    found = [f for f in d.findings if f.rule == rule]
    assert found, [(f.rule, f.confidence) for f in d.findings]
    return found[0]


def test_rk010_leads_for_a_trainer_run_with_checkpointing_off_and_no_oom(tmp_path):
    # No log: the estimate (~194 GiB, ~179 GiB of it activations) exceeds the 79.1 GiB GPU.
    # The old doctor gave only RK012 (the logits, ~28 GiB) and never named checkpointing.
    d = _lf_run(tmp_path)
    assert d.evidence.read["framework"] == "hf-trainer"
    f = d.findings[0]
    assert f.rule == "RK010" and f.category == "activation_memory"
    e = build_context(d.evidence, 79.1).estimate
    layers, edges = activation_split(e)
    assert layers > 3 * edges and e.total_bytes > 79.1 * 2**30
    assert "No OOM was pasted" in f.evidence and "'full:uniform:1'" in f.evidence
    # LLaMA-Factory switches checkpointing by its own key: the patch turns it back on there
    assert f.patch_keys == {"disable_gradient_checkpointing": False}
    # the logits finding is there, after it, and in LLaMA-Factory's key for Liger
    g = _finding(d, "RK012")
    assert d.findings.index(g) > 0 and g.raw_confidence < f.raw_confidence
    assert g.patch_keys == {"enable_liger_kernel": True}
    assert "enable_liger_kernel: true" in g.fix
    assert "cross_entropy_loss_fusion" not in g.fix and "TransformerEngine" not in g.fix


def test_rk010_says_nothing_when_checkpointing_makes_it_fit(tmp_path):
    # Mutation guard: the same run with checkpointing on (LLaMA-Factory's default) is a plan,
    # not a predicted OOM.
    d = _lf_run(tmp_path, checkpointing_off=False)
    assert "RK010" not in [f.rule for f in d.findings]


def test_rk014_reads_an_inverted_switch(tmp_path):
    # The real OOM of https://github.com/hiyouga/LlamaFactory/issues/1221 with the run above:
    # `disable_gradient_checkpointing: true` is checkpointing off, patched back in its own key.
    log = Path(__file__).parent / "data" / "rules" / "i12-llamafactory-1221.txt"
    _lf_run(tmp_path)
    files = [str(tmp_path / n) for n in ("sft.yaml", "ds_z3_config.json", "accel.yaml")]
    d = diagnose(collect(logs=[str(log)], config=files), None)
    f = _finding(d, "RK014")
    assert "disable_gradient_checkpointing = true" in f.evidence
    assert f.patch_keys == {"disable_gradient_checkpointing": False}


def test_rk012_in_plain_trainer_keys_and_none_for_torchtitan(tmp_path):
    # A plain Trainer YAML (alignment-handbook's zephyr SFT recipe) with checkpointing off:
    # the Trainer's own keys, never LLaMA-Factory's or Megatron's.
    zephyr = (CORPUS / "hf_trainer" / "zephyr-7b-beta_sft_config_full.yaml").read_text()
    (tmp_path / "z.yaml").write_text(
        zephyr.replace("gradient_checkpointing: true", "gradient_checkpointing: false")
    )
    d = diagnose(collect(logs=[], config=[str(tmp_path / "z.yaml")]), 80.0)
    f = d.findings[0]
    assert "gradient_checkpointing: true (activation checkpointing)" in f.fix
    assert "recompute_granularity" not in f.fix
    # with a model shape beside it (Qwen3-8B's config.json) the estimate puts the logits above
    # the layers' activations (checkpointing on): RK012 is in the Trainer's Liger key, and
    # RK010 has no step left to give. (On one assumed GPU even full recompute does not fit and
    # the model states are then the largest term: RK013 leads, as the estimate's prediction.)
    qwen = CORPUS / "hf_config" / "Qwen--Qwen3-8B.config.json"
    zephyr_path = CORPUS / "hf_trainer" / "zephyr-7b-beta_sft_config_full.yaml"
    d = diagnose(collect(logs=[], config=[str(zephyr_path), str(qwen)]), 80.0)
    assert d.findings[0].rule == "RK013" and "prediction" in d.findings[0].evidence
    f = _finding(d, "RK012")
    # alignment-handbook's recipes run TRL's SFTTrainer: TRL's own chunked loss, Liger's beside
    assert f.patch_keys == {"loss_type": "chunked_nll"}
    assert "use_liger_kernel: true" in f.fix and "TransformerEngine" not in f.fix
    assert "RK010" not in [g.rule for g in d.findings]
    # torchtitan has no fused-loss key: RK012 keeps its words and drops its patch, saying so
    titan = CORPUS / "torchtitan" / "blind2_llama3_8b-8xb200-8k.toml"
    g = _finding(diagnose(collect(logs=[], config=[str(titan)]), 80.0), "RK012")
    assert not g.patch_keys and "no torchtitan key sets it" in g.fix
    assert [x["key"] for x in g.patch_check["dropped"]] == ["cross_entropy_loss_fusion"]


def test_rk088_patches_the_configs_own_checkpointing_switch():
    # NeMo-RL's SFT recipe (tests/sources/corpus/nemo_rl/sft.yaml, DTensor backend enabled)
    # with the real per-step peaks of https://github.com/NVIDIA-NeMo/Automodel/issues/2634
    # (tests/data/rules/i12-automodel-2634.txt): the switch is
    # policy.dtensor_cfg.activation_checkpointing; a bare activation_checkpointing is a key
    # NeMo-RL does not read.
    log = Path(__file__).parent / "data" / "rules" / "i12-automodel-2634.txt"
    d = diagnose(collect(logs=[str(log)], config=[str(CORPUS / "nemo_rl" / "sft.yaml")]), None)
    f = _finding(d, "RK088")
    assert f.config_patch == {"policy.dtensor_cfg.activation_checkpointing": True}
    assert f.patch_keys == {"policy.dtensor_cfg.activation_checkpointing": True}


def test_framework_keys_of_one_family_are_translated_for_another():
    # LLaMA-Factory's and NeMo 1.x's own switches in a patch for another framework become that
    # framework's setting (doctor/patches.py _foreign_to_mcore), never a key it ignores.
    from recompute_kit.doctor.patches import _foreign_to_mcore, in_llama_factory_keys

    assert _foreign_to_mcore("disable_gradient_checkpointing", True) == {
        "recompute_granularity": None
    }
    assert _foreign_to_mcore("enable_liger_kernel", True) == {"cross_entropy_loss_fusion": True}
    assert _foreign_to_mcore("activations_checkpoint_granularity", "full") == {
        "recompute_granularity": "full"
    }
    keys = {
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }
    assert in_llama_factory_keys(keys) == {
        "disable_gradient_checkpointing": False,
        "use_reentrant_gc": False,
    }


def test_rk016_with_the_framework_unknown_names_each_frameworks_key():
    # https://github.com/hiyouga/LlamaFactory/issues/10367: the cross-entropy frames alone,
    # no config: the framework is unknown, so the fix names the fused loss in each framework's
    # key rather than Megatron's alone (the patch stays in Megatron-Core names, labelled).
    f = _finding(run(text("fl-llamafactory-10367-ce-frames")), "RK016")
    assert f.patch_framework is None and not f.patch_keys
    assert "use_liger_kernel" in f.fix and "enable_liger_kernel" in f.fix


# The OOM a skill trial used (PyTorch's wording, its figures) on a 23.64 GiB GPU
OOM_4090 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request}. GPU 2 has a "
    "total capacity of 23.64 GiB of which 771.31 MiB is free. Including non-PyTorch memory, "
    "this process has 22.87 GiB memory in use. Of the allocated memory 21.60 GiB is "
    "allocated by PyTorch, and 846.13 MiB is reserved by PyTorch but unallocated.\n"
)


def _qwen3_8b_full_sft_on_4090s(tmp: Path, request: str):
    """LLaMA-Factory full SFT of Qwen3-8B (cutoff_len 2048) under its own ZeRO-3 JSON on 4 GPUs
    of 23.64 GiB (the corpus's real files), with the trial's OOM."""
    sft = (CORPUS / "hf_trainer" / "qwen3_full_sft.yaml").read_text(encoding="utf-8")
    sft = sft.replace("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-8B").replace(
        "examples/deepspeed/ds_z3_config.json", "ds_z3_config.json"
    )
    (tmp / "sft.yaml").write_text(sft, encoding="utf-8")
    shutil.copy(CORPUS / "hf_trainer" / "ds_z3_config.json", tmp / "ds_z3_config.json")
    shutil.copy(CORPUS / "hf_config" / "Qwen--Qwen3-8B.config.json", tmp / "config.json")
    (tmp / "oom.log").write_text(OOM_4090.format(request=request), encoding="utf-8")
    files = [str(tmp / n) for n in ("sft.yaml", "ds_z3_config.json", "config.json")]
    evidence = collect(
        logs=[str(tmp / "oom.log")], config=files, overrides={"data_parallel_size": 4}
    )
    return diagnose(evidence)


def test_rk011_full_finetune_on_4090s_patches_the_planners_deepspeed_lever(tmp_path):
    # A skill trial's case (LLaMA-Factory full SFT, "LoRA works, full fails"). The states
    # (~30 GiB per GPU) exceed the GPU; the OOM's 21.60 GiB allocated is below them (Adam's
    # states come at the first optimizer step), which the finding now says. The old patch was
    # Megatron's distributed optimizer (dropped as harmful, "No patch"); now the planner's
    # first fitting lever, in DeepSpeed's own section.
    d = _qwen3_8b_full_sft_on_4090s(tmp_path, "1002.00 MiB")
    f = _finding(d, "RK011")
    assert "are below them" in f.evidence and "first optimizer step" in f.evidence
    zero = f.config_patch["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu"} and "plan --levers" in f.fix
    assert "No patch" not in f.fix and "use_distributed_optimizer" not in f.config_patch
    # in LLaMA-Factory's own keys: its DeepSpeed file of that stage and offload, beside the one
    # the run names (a trial: a stage set inside ds_z2_config.json leaves out ds_z3's keys)
    assert f.patch_keys == {"deepspeed": str(tmp_path / "ds_z2_offload_config.json")}


def test_rk012_says_when_the_request_is_also_the_embedding_weight(tmp_path):
    # 2048 tokens x 151936 fp32 logits and the bf16 [151936 x 4096] weight are the same 1.16
    # GiB (hidden = 2 x tokens): the request alone cannot say which it is
    d = _qwen3_8b_full_sft_on_4090s(tmp_path, "1.16 GiB")
    f = _finding(d, "RK012")
    assert "embedding / output weight" in f.evidence and f.raw_confidence == 0.6


def test_a_trainer_micro_batch_patch_keeps_the_global_batch(tmp_path):
    # a skill trial: alignment-handbook's zephyr-7b-beta config_full.yaml at 8192 packed tokens
    # with accelerate's ZeRO-3 on 8 GPUs; the doctor's patch lowered per_device_train_batch_size
    # to 1 and said gradient_accumulation_steps=128 (a global batch of 1024, not the run's 128)
    # while `plan --levers` said 16; the patch keeps the run's global batch
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    corpus = Path(__file__).parent / "sources" / "corpus" / "hf_trainer"
    recipe = tmp_path / "config_full.yaml"
    recipe.write_text(
        (corpus / "zephyr-7b-beta_sft_config_full.yaml")
        .read_text()
        .replace("max_seq_length: 2048", "max_seq_length: 8192\npacking: true")
    )
    launcher = tmp_path / "zero3.yaml"
    launcher.write_text(
        (corpus / "accelerate_deepspeed_zero3.yaml")
        .read_text()
        .replace("device: cpu", "device: none")
        .replace("num_processes: 1", "num_processes: 8")
    )
    # https://github.com/huggingface/trl/issues/824 (the reporter's OOM line, verbatim)
    log = tmp_path / "oom.log"
    log.write_text(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB (GPU 1; "
        "39.42 GiB total capacity; 37.39 GiB already allocated; 245.00 MiB free; 38.08 GiB "
        "reserved in total by PyTorch)\n"
    )
    evidence = collect(
        logs=[str(log)], config=[str(recipe), str(launcher)], model="mistralai/Mistral-7B-v0.3"
    )
    d = diagnose(evidence, 79.1)
    gbs = evidence.read["config"]["global_batch_size"]
    assert gbs == 128  # per_device_train_batch_size 16 x 8 GPUs x 1 step
    patched = [
        f.patch_keys or f.config_patch
        for f in d.findings
        if {"micro_batch_size", "per_device_train_batch_size"} & set(f.patch_keys or {})
    ]
    assert patched, [(f.rule, f.patch_keys) for f in d.findings]
    for patch in patched:
        micro = patch.get("per_device_train_batch_size", patch.get("micro_batch_size"))
        assert micro * patch["gradient_accumulation_steps"] * 8 == gbs, patch


def test_an_oom_in_the_loss_follows_the_layers_activations_that_filled_the_gpu():
    # https://github.com/NVIDIA/Megatron-LM/issues/525 (tests/data/launch/mlm525, verbatim):
    # GPT-2 774M, local transformer (unfused attention), micro-batch 4 x 1024 on a 32 GB V100,
    # no recompute; the OOM is raised in vocab_parallel_cross_entropy asking 786 MiB (the fp32
    # logits). The estimate puts the layers' activations at 20 GiB and the loss at about 1: the
    # loss is where the step ran out, recompute is what fits it. The logits findings led with
    # "recompute of transformer layers does not help".
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    mlm525 = Path(__file__).parent / "data" / "launch" / "mlm525"
    log = str(mlm525 / "terminal.txt")
    # the log as a config too, and (a later skill trial, as SKILL.md has it) the log as the log
    # only: its arguments dump (transformer_impl local, use_flash_attn False) is what ran, over
    # the script's defaults (before: a flash-attention estimate and "diagnosed" logits_memory)
    # ...and the log alone (a third trial: with no --config the dump went unread, and the
    # doctor "diagnosed" the logits at 90% for want of the vocabulary the dump prints)
    for config in ([str(mlm525 / "gpt2_755.sh"), log], [str(mlm525 / "gpt2_755.sh")], None):
        d = diagnose(collect(logs=[log], config=config))
        assert d.findings[0].category == "activation_memory", [f.rule for f in d.findings]
        logits = [f for f in d.findings if f.category == "logits_memory"]
        assert logits and all("the layers' activations are why" in f.evidence for f in logits)
        assert d.evidence.read["config"]["attention_backend"] == "unfused"
        # no iteration finished: the OOM came in the first step, before Adam's moments
        # (2 x 4 B x 771M parameters = 5.75 GiB) existed (a skill trial: "11.49 GiB of model
        # states" was said for a rank that held 5.75)
        f = next(f for f in d.findings if f.rule == "RK010")
        assert "Adam's moments (5.75 GiB) did not exist yet" in f.evidence


def test_a_smaller_micro_batch_that_fits_at_no_cost_leads_the_recompute_step():
    # torchtitan's llama3_70b.toml (pytorch/torchtitan @ 038d5fd, verbatim but for a skill
    # trial's three edits: seq_len 16384, mode "selective", selective_ac_option "op") on 64
    # H100s: local_batch_size 8 x 16384 tokens. The doctor's next step was full AC (+32%
    # FLOPs, a 1.23x step) where local_batch_size 1 fits at 1.00x; that one leads now.
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    toml = Path(__file__).parent / "data" / "launch" / "titan70" / "llama3_70b.toml"
    d = diagnose(collect(config=str(toml), overrides={"data_parallel_size": 8}), 79.1)
    f = next(f for f in d.findings if f.rule == "RK010")
    # the step keeps its global batch (torchtitan's -1 would follow local x DP down 8x)
    assert f.patch_keys == {"training.local_batch_size": 1, "training.global_batch_size": 64}
    assert "micro_batch_size=1" in f.evidence and "else 'full:uniform:1'" in f.evidence


def test_an_oom_at_the_loss_under_the_estimate_says_the_estimate_overstates():
    # A skill trial: Megatron-LM's Megatron-FSDP Llama 3 8B fp8 example (tests/data/read) at
    # 16k failed asking for one fp32 copy of the logits (7.83 GiB = 16384 x 128256 x 4 B), so
    # every layer's forward had run, with 69.60 GiB allocated; the estimate (fp8 activations
    # counted at 16 bits) puts 87 GiB there, and the doctor "diagnosed" full:block:17 from it.
    # The message's format is PyTorch 2.x's; its figures are the trial's scenario.
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    oom = (
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 "
        "has a total capacity of 79.11 GiB of which 5.02 GiB is free. Including non-PyTorch "
        "memory, this process has 74.08 GiB memory in use. Of the allocated memory 69.60 GiB is "
        "allocated by PyTorch, and 3.12 GiB is reserved by PyTorch but unallocated.\n"
    )
    script = Path(__file__).parent / "data/read/mlm_train_llama3_8b_fsdp_h100_fp8.sh"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        log.write_text(oom, encoding="utf-8")
        ev = collect(logs=[str(log)], config=str(script), overrides={"seq_length": 16384})
        d = diagnose(ev, 79.11)
    assert d.verdict.verdict == "needs_evidence"
    assert "the OOM is at the loss" in d.verdict.why and "overstates this run" in d.verdict.why

def test_a_trl_sft_oom_asking_for_whole_logits_keeps_them_and_patches_trls_loss_type():
    # A skill trial (tests/data/launch/trl_fsdp2/SOURCES.md): TRL's SFT with no loss_type and
    # no trl version; the reader took TRL 1.7's chunked loss as a plain default, so the doctor
    # found "12.79 GiB the config does not explain" though the OOM asked for exactly one bf16
    # [2 x 8192 x 128256] logits tensor, which the chunked loss never makes. Now the chunked
    # loss is an assumption, the request overrules it, RK012 leads with TRL's own key, and the
    # request is not read as a shorter batch.
    from pathlib import Path

    data = Path(__file__).parent / "data" / "launch" / "trl_fsdp2"
    inputs = [str(data / "launch.sh"), str(data / "examples/accelerate_configs/fsdp2.yaml")]
    d = run((data / "oom.log").read_text(), inputs=inputs, gpu_memory_gb=39.39)
    top = d.findings[0]
    assert top.rule == "RK012" and top.patch_keys == {"loss_type": "chunked_nll"}
    assert "tokens (2 x" not in top.evidence  # one tensor of all 16384 tokens, not fewer
    assert any("which TRL's chunked loss never makes" in a for a in d.assumptions)


def test_a_request_larger_than_any_tensor_of_the_step_keeps_the_estimate_possible(tmp_path):
    # A skill trial fed ms-swift#9403's NPU OOM ("Tried to allocate 26.44 GiB (NPU 2; 60.96
    # GiB total capacity; 30.23 GiB already allocated; ...") beside a Mixtral launch script and
    # was told "recompute more" at 85%: no tensor of that step comes near 26 GiB, so the log is
    # not that step's, and the estimate's finding may not be confident.
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {} GiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 1.20 GiB is free. Of the allocated memory 76.31 "
        "GiB is allocated by PyTorch, and 0.40 GiB is reserved by PyTorch but unallocated.\n"
    )
    _lf_run(tmp_path)  # writes the run's files (Qwen3-8B at 8k tokens, 2 a GPU, no checkpointing)
    names = ("sft.yaml", "ds_z3_config.json", "accel.yaml", "config.json")
    files = [str(tmp_path / n) for n in names]

    def rk010(request: str):
        log = tmp_path / f"oom_{request}.log"
        log.write_text(oom.format(request), encoding="utf-8")
        return _finding(diagnose(collect(logs=[str(log)], config=files), 79.1), "RK010")

    plausible = rk010("2.00")
    assert plausible.confidence > 0.5 and "is larger than any one tensor" not in plausible.evidence
    alien = rk010("40.00")
    assert alien.confidence <= 0.5 and "is larger than any one tensor" in alien.evidence


# https://github.com/NVIDIA/Megatron-LM/issues/818: Llama-3 8B flags pasted from the issue
# (one GPU, no --tensor-model-parallel-size, no --bf16, no distributed optimizer); the GPU's
# size is in no input
_LLAMA3_8B_FLAGS = (
    "--use-mcore-models\n--seq-length 8192\n--num-layers 32\n--hidden-size 4096\n"
    "--ffn-hidden-size 14336\n--num-attention-heads 32\n--swiglu\n"
    "--untie-embeddings-and-output-weights\n--no-position-embedding\n"
    "--use-rotary-position-embeddings\n--max-position-embeddings 8192\n"
    "--normalization 'RMSNorm'\n--tokenizer-type 'HuggingFaceTokenizer'\n"
)


def test_rk011_without_a_gpu_size_fires_when_the_states_exceed_any_common_gpu():
    d = run("", config=_LLAMA3_8B_FLAGS, config_name="flags.sh")
    f = _finding(d, "RK011")
    # fp32 weights and gradients (4 + 4 bytes) and Adam's two moments (8): ~120 GiB per rank
    assert "of an A100/H100 (no input gives the GPU's size)" in f.evidence
    assert f.category == "model_state_memory"
    # a model whose states fit an 80 GiB GPU says nothing without the GPU's size
    small = _LLAMA3_8B_FLAGS.replace("--num-layers 32", "--num-layers 4")
    assert "RK011" not in [g.rule for g in run("", config=small, config_name="flags.sh").findings]


def test_rk012_a_request_that_is_a_whole_fraction_of_the_tokens_is_no_shorter_batch(tmp_path):
    # A skill trial (Llama-3.1-8B, 4 x 8192 tokens per micro-batch): a 3.91 GiB request was
    # read as "a logits tensor of about 16368 tokens (4 x 4092): the batch that failed held
    # fewer tokens (padding)", to the token, from a figure rounded to 0.01 GiB; it is 8192
    # tokens of fp32 logits over 128256 entries, a quarter of the micro-batch's 32768
    (tmp_path / "oom.log").write_text(OOM_4090.format(request="3.91 GiB"), encoding="utf-8")
    evidence = collect(
        logs=[str(tmp_path / "oom.log")],
        model="meta-llama/Meta-Llama-3.1-8B",
        overrides={"data_parallel_size": 8, "seq_length": 8192, "micro_batch_size": 4},
    )
    said = " ".join(f.evidence for f in diagnose(evidence).findings if f.rule == "RK012")
    assert "8192 tokens (to the OOM's rounding), 1/4 of the micro-batch's 32768" in said
    assert "padding" not in said
