"""Tests of the rules in recompute_kit/doctor/rules/stated.py (a symptom said in words, no
artefact that explains it) and of the phrases doctor/symptoms.py reads, on verbatim real text
(tests/data/rules/stated-*, each file's URL in tests/rule_sources.py and in a comment by the
test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

import pytest
from rule_helpers import covers, ids, run, text, top

from recompute_kit.doctor import symptoms
from recompute_kit.doctor.rules.stated import STATED_CONFIDENCE


def _reading(name: str, rule: str, category: str) -> None:
    d = run(text(name))
    f = top(d)
    assert (f.rule, f.category) == (rule, category), [(g.rule, g.category) for g in d.findings]
    assert f.raw_confidence == STATED_CONFIDENCE and f.config_patch == {}  # a guess patches nothing
    assert d.verdict.verdict == "needs_evidence" and d.verdict.collect
    # the evidence quotes the user's line that states it
    assert any(line.strip()[:40] in f.evidence for line in text(name).splitlines() if line.strip())


@covers("RK800")
def test_no_change_in_memory_said_in_chinese():
    # https://github.com/hiyouga/LlamaFactory/issues/6232 (title): memory unchanged before and
    # after setting gradient_checkpointing
    _reading("stated-llamafactory-6232-no-change", "RK800", "recompute_no_effect")


@covers("RK800")
def test_cannot_reduce_peak_memory():
    # https://github.com/pytorch/pytorch/issues/147449 (title)
    _reading("stated-pt-147449-cannot-reduce", "RK800", "recompute_no_effect")


def test_checkpointing_never_enabled_on_a_code_path():
    # https://github.com/sam-paech/auto-antislop/issues/3 (the reporter's first post as stored):
    # "## 1. Gradient checkpointing is never enabled when `finetune_use_unsloth: false`" - a
    # Markdown heading, not a code comment; and the adapters its code names (get_peft_model)
    d = run(text("stated-antislop-3-never-enabled"))
    f = top(d)
    assert (f.rule, f.category) == ("RK800", "recompute_no_effect")
    default = next(g for g in d.findings if g.rule == "RK170")
    assert "full training assumed" not in default.evidence


@covers("RK809")
def test_enabling_checkpointing_raises_an_error():
    # https://github.com/CStanKonrad/long_llama/issues/9: "when I fine-tune long_llama with
    # gradient_checkpointing, it raises an error" (the maintainer added checkpointing support)
    d = run(text("stated-longllama-9-error"))
    _reading("stated-longllama-9-error", "RK809", "framework_bug")
    # the paste says checkpointing is on: no finding patches it on again
    assert all(not f.config_patch.get("gradient_checkpointing") for f in d.findings)


@covers("RK810")
def test_a_smaller_batch_that_does_not_help_points_away_from_activations():
    # https://github.com/wanghao9610/OV-DINO/issues/47: total_batch_size 16 -> 2 and "I still
    # faced the CUDA out of memory problem"; the maintainer: freeze the text encoder (fewer
    # trainable weights). Before: RK087 (activations, "halve the micro-batch") first.
    _reading("stated-ovdino-47-batch-no-help", "RK810", "model_state_memory")
    assert symptoms.stated("Reducing the batch size to 4 fixed the out of memory") == []


def test_a_warning_notice_is_not_read_alone_beside_a_cut_traceback():
    # https://github.com/modelscope/ms-swift/issues/2590: the use_reentrant UserWarning, then a
    # [rank2] traceback cut before its exception line: something failed, so the known-problems
    # notice "use_reentrant warning alone: nothing fails" (RK672) must not be said
    d = run(text("msswift-2590-reentrant-warning-then-traceback"))
    assert "RK672" not in ids(d)
    # the warning beside a failure it may not explain is no confident finding, and the cut
    # traceback is asked for whole
    assert next(f for f in d.findings if f.rule == "RK072").raw_confidence < 0.5
    assert d.verdict.collect[0]["id"] == "traceback"


@covers("RK801")
def test_checkpointing_makes_training_slow():
    # https://github.com/pytorch/ao/issues/2445 (title)
    _reading("stated-ao-2445-slow", "RK801", "recompute_overhead")


@covers("RK802")
def test_lora_weights_not_updated_with_checkpointing():
    # https://github.com/cloneofsimo/lora/issues/26: "prevents LoRA weight updates"
    _reading("stated-cloneofsimo-26-no-updates", "RK802", "checkpoint_api_misuse")


def test_grads_none_said_next_to_what_explains_it_is_read_by_the_specific_rule():
    # https://github.com/microsoft/LoRA/issues/120: "all gradients will be 'None'" with LoRA
    # under checkpointing: RK149 reads the pattern itself; the stated reading stays away
    d = run(text("stated-lora-120-grads-none"))
    assert symptoms.stated(text("stated-lora-120-grads-none")) == ["grads_none"]
    assert top(d).category == "checkpoint_api_misuse" and "RK802" not in ids(d)


@covers("RK803")
def test_loss_diverges_with_checkpointing_and_dropout():
    # https://github.com/openai/guided-diffusion/issues/167 (title); the body names the cause
    # (the RNG state not restored), which RK147 reads
    _reading("stated-guided-diffusion-167-title", "RK803", "nondeterministic_recompute")
    d = run(text("stated-guided-diffusion-167-diverge"))
    assert top(d).category == "nondeterministic_recompute" and "RK803" not in ids(d)


@covers("RK804")
def test_hangs_with_activation_checkpointing():
    # https://github.com/pytorch/pytorch/issues/77030 (lessw2020's summary of three runs)
    _reading("stated-pt-77030-hangs", "RK804", "framework_bug")


@covers("RK805")
def test_memory_grows_slowly():
    # https://github.com/dingo-gw/dingo/issues/60; moskomule/homura#16 says it too ("memory
    # consumption gradually and slowly grows"), which RK266 reads
    _reading("stated-dingo-60-grows", "RK805", "framework_bug")
    assert symptoms.stated(text("stated-homura-16-grows")) == ["memory_grows"]


@covers("RK805")
def test_an_oom_only_after_some_epochs_reads_as_growth_and_asks_for_the_series():
    # https://github.com/pytorch/pytorch/issues/18313: a bare "CUDA error: out of memory" in
    # backward, and "The problem was occurring after some epochs": memory that grows (the
    # thread: tensors kept across epochs), not a step's activations (a skill trial got RK087)
    d = run(text("stated-pt-18313-oom-after-epochs"))
    assert top(d).rule == "RK805"
    assert d.verdict.collect[0]["id"] == "memory_series"


@covers("RK806")
def test_oom_while_saving_a_checkpoint_said_in_chinese():
    # https://github.com/ByteDance-Seed/Bagel/issues/139 (title): OOM when saving the ckpt
    _reading("stated-bagel-139-oom-saving", "RK806", "model_state_memory")


def test_a_finding_that_explains_the_symptom_keeps_the_reading_away():
    # the artefact (RK075's CheckpointError) explains "the loss differs with checkpointing":
    # the stated reading is not added beside it
    d = run(
        "The loss differs when I enable gradient checkpointing.\n"
        "torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: Recomputed values for "
        "the following tensors have different metadata than during the forward pass.\n"
    )
    assert "RK803" not in ids(d) and top(d).category == "nondeterministic_recompute"


@pytest.mark.parametrize(
    "line",
    [
        # a tool's warning, not the user's words (torch.utils.checkpoint's UserWarning)
        "UserWarning: None of the inputs have requires_grad=True. Gradients will be None",
        "None of the inputs have requires_grad=True. Gradients will be None",
        # a code comment and a negation (pytorch/pytorch#84413's reproducer)
        "# gc.collect() # with gc.collect is ok - not real memory leak, only a cyclic reference",
        # an exception's own text (huggingface/peft#313: DDP's message names checkpointing)
        "> RuntimeError: Expected to mark a variable ready only once. This error is caused by "
        "one of the following reasons: 1) Use of a module parameter outside the `forward` "
        "function. 2) Reused parameters in multiple reentrant backward passes. For example, if "
        "you use multiple `checkpoint` functions to wrap the same part of your model, ... no "
        "change",
        # LoRA named as working, but no full fine-tune to contrast it with
        "I use lora. Training is fine until step 300, then CUDA out of memory",
        # an expectation, not an observation (huggingface/transformers#26221)
        "gradient checkpointing should make (top) and (bottom) use the same memory",
    ],
)
def test_what_is_not_a_stated_symptom(line):
    assert symptoms.stated(line) == []


@covers("RK811")
def test_activation_memory_said_to_grow_with_the_sequence():
    # https://github.com/pytorch/torchtitan/issues/678 (a planning question at 128k, no OOM):
    # "the activation value memory increases significantly", "50G of activation value memory"
    _reading("stated-torchtitan-678-activation-memory", "RK811", "activation_memory")
    assert symptoms.stated("the activation memory is reduced by checkpointing") == []


@covers("RK812")
@pytest.mark.parametrize(
    "name",
    [
        # https://github.com/NVIDIA/TransformerEngine/issues/1261: "it still shows memory usage of
        # 14B" for a 7B model in FP8; timmoon10: expected, TE keeps the weights and their FP8
        # transposes (fp8_model_init keeps FP8 weights only)
        "stated-te-1261-fp8-memory-not-halved",
        # https://github.com/NVIDIA/TransformerEngine/issues/1764: "same memory usage as bf16";
        # NVIDIA: --fp8-param-gather / fp8_model_init drop the high-precision copy
        "stated-te-1764-fp8-same-memory-as-bf16",
        # https://github.com/NVIDIA/TransformerEngine/issues/712: "when looking at peak memory,
        # it does not decrease that much, in fact enabling fp8 without setting the primary
        # weights to fp8 is worse"; a skill trial found it read as activations
        "stated-te-712-fp8-peak-not-lower",
    ],
)
def test_fp8_said_not_to_lower_memory_reads_as_model_states(name):
    _reading(name, "RK812", "model_state_memory")
    assert "fp8_model_init" in top(run(text(name))).fix


@pytest.mark.parametrize(
    "line",
    [
        "FP8 training reduced the memory by 30% against bf16",
        "The memory usage is the same as bf16",  # no FP8 said anywhere
    ],
)
def test_what_is_not_fp8_memory_not_lower(line):
    assert "fp8_memory_not_lower" not in symptoms.stated(line)


def test_conda_init_output_is_not_a_stated_symptom():
    # https://github.com/NVIDIA/Megatron-LM/issues/525, the reporter's terminal.txt (lines 25-34):
    # `conda init` prints "no change     <path>" per file on a login shell; read as "no change"
    # (in memory) it fired RK800, "recompute has no effect", on a run with no recompute at all.
    log = "no change     /ocean/projects/asc200010p/jjia1/TOOLS/mambaforge/condabin/conda\n"
    log += "no change     /ocean/projects/asc200010p/jjia1/TOOLS/mambaforge/bin/conda\n"
    assert symptoms.stated(log + "CUDA out of memory with activation checkpointing\n") == []


@covers("RK813")
def test_sharding_said_to_raise_memory_reads_as_a_bug_to_confirm():
    # https://github.com/NVIDIA/Megatron-LM/issues/2772: "using Megatron-FSDP + Expert
    # Parallelism(EP) consumes more GPU memory than using EP alone" (45.6 vs 55.6 GB reserved);
    # the maintainer: TE 2.10's FusedAdam made unsharded optimizer states; fixed in TE main.
    _reading("stated-mlm-2772-mfsdp-more-memory", "RK813", "framework_bug")
    assert symptoms.stated("FSDP cut the memory by half, as expected") == []


@covers("RK807")
def test_slower_than_yesterday_with_the_same_config_reads_as_a_regression():
    # https://github.com/unslothai/unsloth/issues/1111 (the first post): "become slower", the
    # same config 1 h 30 yesterday and 3 h 40 today, "Possibly from this commit?"; no
    # checkpointing named, so not "slower with recompute" (RK801). Before: no finding.
    d = run(text("stated-unsloth-1111-slower-since-yesterday"))
    assert top(d).rule == "RK807" and top(d).category == "framework_bug"
    assert "RK801" not in ids(d)
