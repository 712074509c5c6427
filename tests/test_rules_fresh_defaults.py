"""Fresh real pastes that carry little (an OOM message and a line or two, a launch command and
an OOM, a traceback cut short) for the generic readings: RK005 / RK087 / RK102 pressure,
RK170 / RK171 default readings, RK001 fragmentation, RK016 logits, and the default readings of
a failure that nothing specific explains (RK420 exception, RK421 OOM with room). Threads other
than the rules' own sources and the corpus; every test names its URL and the remedy its
maintainers (or the reporter, confirmed) gave."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

from recompute_kit.doctor.evidence.pasted import parse_pasted_settings

# ---- small GPUs, one OOM line: the batch ---------------------------------------------------


@covers("RK102")
def test_fresh_rk102_four_gib_gpu_reduce_batch_or_image_size():
    # https://github.com/microsoft/computervision-recipes/issues/561: "Try reducing the batch
    # size or the image size or both" (a 4 GiB GPU, the old message wording)
    f = top(run(text("fd-cvrecipes-561-4gb")))
    assert f.rule == "RK102" and f.category == "genuine_pressure"
    assert "batch_size" in f.config_patch


@covers("RK102")
def test_fresh_rk102_twelve_gib_gpu_lower_batch_size():
    # https://github.com/RistoranteRist/FastFlow/issues/4: "Lower your batch size"; the
    # 430 MiB reserved-but-unallocated is no fragmentation to lead with
    d = run(text("fd-fastflow-4-12gb"))
    assert top(d).rule == "RK102" and top(d).category == "genuine_pressure"
    assert [f.rule for f in d.findings].index("RK001") > 0


@covers("RK102")
def test_fresh_rk102_two_gib_gpu_after_reducing_the_batch():
    # https://github.com/herbert-chen/tianchi_lvcai/issues/9: a 2 GiB GPU; "after I reduce the
    # batch size" is not a batch size the paste sets
    f = top(run(text("fd-tianchi-9-2gb")))
    assert f.rule == "RK102" and f.category == "genuine_pressure"
    assert "batch_size" not in parse_pasted_settings(text("fd-tianchi-9-2gb"))


# ---- RK005: allocated near the GPU, the batch stated in a sentence --------------------------


@covers("RK005")
def test_fresh_rk005_batch_size_stated_in_prose_is_halved():
    # https://github.com/152334H/DL-Art-School/issues/56: 20.44 of 23.99 GiB allocated;
    # "Training batch size is 188" (the fix in the thread: anything under 100 works). The
    # validation batch size in the next line is not the training one.
    f = top(run(text("fd-dlas-56-batch188")))
    assert f.rule == "RK005" and f.category == "genuine_pressure"
    assert f.config_patch == {"batch_size": 94}
    assert "188 -> 94" in f.evidence


def test_fresh_prose_batch_size_reading_mutations():
    # the sentence is what sets it: without it no batch is read; an evaluation batch alone is
    # not the training batch
    pasted = text("fd-dlas-56-batch188").replace("Training batch size is 188\n", "")
    assert "batch_size" not in parse_pasted_settings(pasted)
    assert top(run(pasted)).config_patch != {"batch_size": 94}
    assert "batch_size" not in parse_pasted_settings("validation batch size is 48\n")
    assert parse_pasted_settings("with a batch size of 4 it OOMs\n") == {"batch_size": 4}


# ---- RK170: the knobs of a pasted script's constants ----------------------------------------


@covers("RK170")
def test_fresh_rk170_micro_batch_size_in_pasted_constants():
    # https://github.com/Lightning-AI/lit-llama/issues/286: "still get OOM, on v100 32GB";
    # lantiga: batch_size does not change memory under gradient accumulation,
    # micro_batch_size does
    f = top(run(text("fd-litllama-286-micro-batch")))
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert f.config_patch == {"micro_batch_size": 1}
    assert "micro_batch_size = 2" in f.evidence
    # micro_batch_size alone does not make a script Megatron (no global_batch_size next to it)
    assert "Megatron" not in f.fix


def test_fresh_knob_assignments_need_a_number_and_a_knob_name():
    # mutation guards: an expression is not read, nor a name that is no memory knob
    got = parse_pasted_settings(text("fd-litllama-286-micro-batch"))
    assert got["micro_batch_size"] == 2 and got["batch_size"] == 6
    assert "gradient_accumulation_steps" not in got  # batch_size // micro_batch_size
    assert "max_iters" not in got
    assert parse_pasted_settings("learning_rate = 3\nmicro_batch_size = mbs\n") == {}


# ---- RK016: the OOM in the loss over a vocabulary ------------------------------------------


@covers("RK016")
def test_fresh_rk016_fused_ce_zeros_like_over_151936_vocab():
    # https://github.com/mgmalek/efficient_cross_entropy/issues/9: a 17.37 GiB request in the
    # fused projection + cross-entropy's forward, in_feat [30688, 151936]: the loss's own
    # [tokens, vocab] buffer (chunk more: n_loop_iters)
    f = top(run(text("fd-effce-9-logits-zeros-like")))
    assert f.rule == "RK016" and f.category == "logits_memory"


# ---- RK101: a full fine-tune whose states exceed the GPU ------------------------------------


@covers("RK101")
def test_fresh_rk101_llama3_8b_zero2_one_gpu_adam_offload():
    # https://github.com/OpenRLHF/OpenRLHF/issues/698: batch 1, max_len 128, checkpointing on,
    # ZeRO-2 on one A100 80GB, OOM in the optimizer step; hijkzzz: "use --adam_offload"
    f = top(run(text("fd-openrlhf-698-adam-offload")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


# ---- RK001: a sliver of slack next to a small request ---------------------------------------


@covers("RK001")
def test_fresh_rk001_reporter_needs_expandable_segments():
    # https://github.com/jhc13/taggui/issues/188: "if I don't set it
    # [PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True] I get OOM"
    f = top(run(text("fd-taggui-188-expandable")))
    assert f.rule == "RK001" and f.category == "fragmentation"
    assert f.config_patch["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


# ---- RK071: the Variable-era wording --------------------------------------------------------


@covers("RK071")
def test_fresh_rk071_element_0_of_variables_with_gradient_checkpointing():
    # https://github.com/kohya-ss/sd-scripts/issues/697: "element 0 of variables does not
    # require grad" with gradient checkpointing and a frozen part (--network_train_unet_only)
    d = run(text("fd-kohya-697-element0"))
    assert top(d).rule == "RK071" and top(d).category == "checkpoint_api_misuse"
    assert top(d).config_patch == {"use_reentrant": False}
    # mutation: another first word is not the message
    other = text("fd-kohya-697-element0").replace("of variables", "of outputs")
    assert "RK071" not in ids(run(other))


# ---- RK420: an exception that nothing specific explains -------------------------------------


@covers("RK420")
def test_fresh_rk420_traceback_cut_short_with_checkpointing_named():
    # https://github.com/bghira/SimpleTuner/issues/543 (labels upstream-bug): "Tensor, not
    # tuple" when USE_GRADIENT_CHECKPOINTING=true; the traceback stops in torch's DDP forward.
    # The maintainer: gradient checkpointing is broken in the current diffusers releases.
    # Before: RK170 read it as activation memory (gradient_checkpointing on).
    d = run(text("fd-simpletuner-543-tensor-not-tuple"))
    f = top(d)
    assert f.rule == "RK420" and f.category == "framework_bug"
    assert f.config_patch == {"gradient_checkpointing": False}
    assert "paste the whole traceback" in f.evidence
    assert "RK170" not in ids(d)


def test_fresh_rk420_needs_an_exception_without_an_oom():
    # mutations: the prose without the traceback is the knobs' reading again; an OOM line in
    # the paste leaves the exception to the memory rules
    body = text("fd-simpletuner-543-tensor-not-tuple")
    prose = body.split("```Error")[0]
    assert "RK420" not in ids(run(prose))
    with_oom = body + "torch.cuda.OutOfMemoryError: CUDA out of memory.\n"
    assert "RK420" not in ids(run(with_oom))


# ---- RK421: an OOM with room on the device and little held by PyTorch -----------------------


@covers("RK421")
def test_rk421_free_above_the_request_with_nothing_held():
    # https://github.com/pytorch/pytorch/issues/16417 (title): 12.50 MiB requested with 9.28 GiB
    # free, 8.57 MiB allocated and 4.68 MiB cached (a driver issue): no other rule reads it;
    # the default reading says so at low confidence instead of nothing
    d = run(text("oom-pt-16417-title"))
    assert ids(d) == ["RK421"] and top(d).category == "framework_bug"
    assert top(d).confidence <= 0.25 and "nvidia-smi" in top(d).config_patch["command"]
    # mutations: no room on the device, or PyTorch holding a real share, is not this reading
    tight = text("oom-pt-16417-title").replace("9.28 GiB free", "9.28 MiB free")
    assert "RK421" not in ids(run(tight))
    held = text("oom-pt-16417-title").replace("4.68 MiB cached", "4.68 GiB cached")
    assert "RK421" not in ids(run(held))
