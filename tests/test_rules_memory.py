"""Tests of the rules in recompute_kit/doctor/rules/memory.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from pathlib import Path

from rule_helpers import (
    GIB,
    LLAMA3_70B_32K,
    LLAMA3_70B_TP8_NO_DISTOPT,
    LLAMA31_8B_128K,
    QWEN25_7B_32K,
    cites,
    covers,
    get,
    ids,
    run,
    spec_patch,
    text,
    top,
)

from recompute_kit.doctor.engine import Diagnosis, build_context
from recompute_kit.doctor.evidence import (
    collect,
)
from recompute_kit.doctor.evidence.code import scan_snippets
from recompute_kit.doctor.evidence.measured import recompute_cost_prose, vocab_memory_prose
from recompute_kit.doctor.evidence.signals import scan_signals
from recompute_kit.doctor.rules import (
    gib,
)

# =============================================================================================
# Rules added for the scenario corpus: their inputs are the corpus's real cases
# (tests/scenarios/*.yaml, each with its source URL in the file)
# =============================================================================================

SCENARIOS = Path(__file__).parent / "scenarios"


def scenario(name: str) -> Diagnosis:
    import yaml

    case = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    return run(
        case.get("log") or "",
        config=case.get("config"),
        config_name=case.get("config_name") or "config.yaml",
        experiments=case.get("experiments"),
        gpu_memory_gb=case.get("gpu_memory_gb"),
    )


NO_GRAD = {"code": "with torch.no_grad():  # around the evaluation loop"}


def _write(body: str):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "train.log"
    path.write_text(body, encoding="utf-8")
    return path


LLAMA3_8B_TP4_8K = """\
num_layers: 32
hidden_size: 4096
num_attention_heads: 32
num_query_groups: 8
ffn_hidden_size: 14336
gated_linear_unit: true
normalization: RMSNorm
seq_length: 8192
micro_batch_size: 1
padded_vocab_size: 128256
share_embeddings_and_output_weights: false
position_embedding_type: rope
add_bias_linear: false
bias_activation_fusion: true
apply_rope_fusion: true
hidden_dropout: 0.0
attention_dropout: 0.0
tensor_model_parallel_size: 4
sequence_parallel: true
data_parallel_size: 8
use_distributed_optimizer: true
bf16: true
"""


def test_a_config_with_a_model_shape_keeps_rk087_away_and_the_knobs_are_still_patched():
    # A real training OOM (https://github.com/NVIDIA-NeMo/Automodel/pull/1975: 4.34 GiB
    # request, 2.59 GiB free, no "allocated by PyTorch" figure) with the Megatron-LM example
    # script as the config. RK087 reads an OOM "without a model shape": here there is one, so
    # it stays silent; the default reading still names micro_batch_size = 8 and patches it.
    d = run(
        text("i12-automodel-1975"),
        config=text("i22-mlm-pretrain-gpt-distributed"),
        config_name="pretrain_gpt_distributed.sh",
    )
    assert "RK087" not in ids(d)
    f = top(d)
    assert f.config_patch == {"micro_batch_size": 4}
    cites(f, "micro_batch_size = 8", "seq_length = 1024")


@covers("RK014")
def test_rk014_oom_with_gradient_checkpointing_off():
    # TRL: gradient_checkpointing defaults to off; OOM on Mistral-7B.
    f = top(scenario("act_trl_gradient_checkpointing_default_off"))
    assert f.rule == "RK014" and f.category == "activation_memory"
    cites(f, "gradient_checkpointing")


@covers("RK015")
def test_rk015_selective_oom_full_fits():
    # Megatron-Bridge PR #5506 (Gemma-4 VL): selective OOMs, full/uniform/1 fits.
    f = top(scenario("act_mbridge_gemma4_vl_selective_oom"))
    assert f.rule == "RK015" and f.category == "activation_memory"
    assert f.config_patch["recompute_granularity"] == "full"


@covers("RK016")
def test_rk016_oom_in_the_logits():
    # Megatron-LM#92: vocab-parallel cross-entropy on output.float().
    f = top(scenario("logits_megatron_large_vocab_ce"))
    assert f.rule == "RK016" and f.category == "logits_memory"
    cites(f, "post_language_model_processing")


@covers("RK017")
def test_rk017_oom_while_building_the_model():
    # ms-swift#9191: OOM inside build_module -> GroupedLinear.__init__.
    f = top(scenario("ms_msswift_glm5_oom_at_model_build"))
    assert f.rule == "RK017" and f.category == "model_state_memory"


@covers("RK017", "RK110")
def test_fb_zero2_oom_initialising_adam_states():
    # https://github.com/deepspeedai/DeepSpeed/issues/237: ZeRO-2 OOM in
    # initialize_optimizer_states (exp_avg zeros_like): the optimizer states do not fit
    f = top(run(text("fb-ds-237-zero2-init-optimizer-states")))
    assert f.category == "model_state_memory"


# ---- RK016: the OOM in the loss over a vocabulary ------------------------------------------


@covers("RK016")
def test_fresh_rk016_fused_ce_zeros_like_over_151936_vocab():
    # https://github.com/mgmalek/efficient_cross_entropy/issues/9: a 17.37 GiB request in the
    # fused projection + cross-entropy's forward, in_feat [30688, 151936]: the loss's own
    # [tokens, vocab] buffer (chunk more: n_loop_iters)
    f = top(run(text("fd-effce-9-logits-zeros-like")))
    assert f.rule == "RK016" and f.category == "logits_memory"


@covers("RK016")
def test_fresh_logits_oom_in_cross_entropy_loss_frame():
    # https://github.com/linkedin/Liger-Kernel/pull/47: a pytest OOM raised in
    # torch._C._nn.cross_entropy_loss. Right before this round.
    f = top(run(text("fz-liger-47-ce-oom-test")))
    assert f.rule == "RK016" and f.category == "logits_memory"
    assert "cross-entropy" in f.fix


@covers("RK620")
def test_fresh_logits_memory_blamed_on_128k_vocab_in_words():
    # https://github.com/facebookresearch/advprompter/issues/1: "insufficient memory since
    # Llama3 has much larger vocab_size (128K)"; the maintainer's fix processes the batch in
    # chunks (num_chunks=2). Before: no finding.
    f = top(run(text("fz-advprompter-1-llama3-vocab-chunks")))
    assert f.rule == "RK620" and f.category == "logits_memory"
    assert "chunks" in f.fix and "128K" in f.evidence


@covers("RK620")
def test_fresh_logits_chunked_ce_for_250k_vocab():
    # https://github.com/EvolvingLMMs-Lab/LongVA/pull/19: chunk-by-chunk cross entropy for a
    # 250K vocabulary, peak memory 43G -> 8G. Before: no finding.
    f = top(run(text("fz-longva-19-chunked-ce")))
    assert f.category == "logits_memory" and "chunks" in f.fix


@covers("RK620")
def test_fresh_logits_128k_vocab_1gib_per_sequence():
    # https://github.com/allenai/open-instruct/pull/777: "for a 128k vocab size and 4k seqlen,
    # bfloat16 logits cost 1 GiB * batch_size". Before: no finding.
    f = top(run(text("fz-openinstruct-777-logits-refs")))
    assert f.category == "logits_memory" and "use_liger_kernel" in f.fix


def test_vocab_memory_prose_needs_a_large_vocab_and_memory():
    assert vocab_memory_prose(["a 128k vocab size costs memory"])[0]["vocab"] == 128_000
    assert vocab_memory_prose(["vocab_size=151936, peak 40 GiB"])[0]["vocab"] == 151_936
    assert not vocab_memory_prose(["a 128k vocab size trains fast"])  # no memory named
    assert not vocab_memory_prose(["an 8k vocab, out of memory"])  # not a large vocabulary


def test_recompute_cost_prose_reads_slow_words_factors_and_faster_without():
    lines = [
        "gradient checkpointing is very slow on 8 GPUs",
        "",
        "activation checkpointing: throughput drops by a factor of 3",
        "",
        "20% faster without activation checkpointing",
        "",
        "gradient checkpointing showed no noticeable slowdown",
        "",
        "training is very slow",  # no checkpointing named
    ]
    got = [c["ratio"] for c in recompute_cost_prose(lines)]
    assert got == [3.0, 1.2, None]


@covers("RK016")
def test_fresh_logits_oom_said_in_a_title_above_loss_frames():
    # https://github.com/hiyouga/LlamaFactory/issues/10367: the title says "报错oom", the
    # frames end in loss_function -> cross_entropy; no exception line. Before: RK420 (a torch
    # bug, default reading). The OOM word after CJK text now counts as an OOM mention.
    f = top(run(text("fl-llamafactory-10367-ce-frames")))
    assert f.rule == "RK016" and f.category == "logits_memory"
    assert "cross-entropy" in f.fix


# ---- RK086: evaluation without torch.no_grad ----------------------------------------------


@covers("RK086")
def test_fresh_rk086_thcudacheck_oom_with_frames_cut_in_evaluate():
    # https://github.com/facebookarchive/loop/issues/57: memory jumps "in validation step";
    # "THCudaCheck FAIL ... error=2 : out of memory" and a traceback cut after `in evaluate`
    # (no exception line). The fix in such threads: evaluate under torch.no_grad().
    d = run(text("fm-loop-57-eval"))
    f = top(d)
    assert f.rule == "RK086" and f.category == "activation_memory"
    assert "'in evaluate'" in f.evidence  # read from the frames, not only from the prose
    assert f.config_patch == NO_GRAD
    assert "no_grad" in f.fix


def test_fresh_thcudacheck_out_of_memory_is_an_oom_event():
    # https://github.com/facebookarchive/loop/issues/57: PyTorch 0.4's THC wording
    ev = collect(logs=[str(_write(text("fm-loop-57-eval")))])
    assert ev.oom and ev.oom[0].generation == "thc_runtime_error"
    assert ev.oom[0].line.startswith("THCudaCheck FAIL")


@covers("RK086")
def test_fresh_rk086_prose_out_of_memory_after_validation():
    # https://github.com/hszhao/semseg/issues/60: "out of memory" occurs after validation; the
    # loop runs model.eval() and output = model(input) with no no_grad (the reporter's fix:
    # "with torch.no_grad():" around the forward). A sentence that suggests no_grad is not code
    # that uses it.
    f = top(run(text("fm-semseg-60-eval-no-grad")))
    assert f.rule == "RK086" and f.category == "activation_memory"
    assert f.config_patch == NO_GRAD


@covers("RK086")
def test_rk086_chinese_prose_after_the_evaluation_stage():
    # https://github.com/hiyouga/LlamaFactory/issues/836 (the reporter's words, verbatim): "the
    # memory blows up right after the evaluation stage ends" (maintainer: turn the validation set
    # off until it is fixed). 评估阶段结束之后 is evaluation as much as 评估时 is.
    said = (
        "两张4090,训练阶段显存占用不多，batchsize设置为1大概13G，但是评估阶段结束之后会直接爆显存。\n"
    )
    assert "RK086" in ids(run(said))
    without = said.replace("但是评估阶段结束之后", "")
    assert "RK086" not in ids(run(without))


@covers("RK086")
def test_fresh_rk086_prose_validation_memory_grows_thc_error():
    # https://github.com/skorch-dev/skorch/issues/218: "cuda runtime error (2) : out of memory",
    # narrowed down to the validation step where memory grows per batch; the maintainers wrapped
    # validation_step in torch.no_grad (PR #219). Evaluation explains the growth: RK086, not
    # the generic leak reading.
    d = run(text("fm-skorch-218-validation"))
    f = top(d)
    assert f.rule == "RK086" and f.config_patch == NO_GRAD
    assert "RK266" not in [x.rule for x in d.findings]


def test_fresh_rk086_prose_needs_no_no_grad_in_code():
    # Mutation guard for the prose reading: the same semseg text with the forward under
    # torch.no_grad() in code is not an evaluation-without-no_grad finding.
    pasted = text("fm-semseg-60-eval-no-grad").replace(
        "        output = model(input)",
        "        with torch.no_grad():\n            output = model(input)",
    )
    assert "RK086" not in [f.rule for f in run(pasted).findings]
    facts = scan_snippets(pasted)
    assert facts.get("no_grad_code")


def test_fresh_memory_growth_prose_needs_steps():
    # a memory figure that rose once is not growth over steps
    assert "memory_growth_prose" not in scan_snippets("The memory increased to 20 GB.\n")
    assert scan_snippets("GPU memory keeps increasing every iteration until OOM\n").get(
        "memory_growth_prose"
    )


def test_fresh_rk086_evaluation_or_training_is_not_evaluation():
    # https://github.com/phil-bergmann/tracking_wo_bnw/issues/57: "launch evaluation or training
    # processes" does not place the OOM in evaluation
    assert "eval_memory_prose" not in scan_snippets(text("fm-tracking-57-gpus-held"))
    assert "eval_memory_prose" not in scan_snippets("CUDA OOM during evaluation or training\n")
    assert scan_snippets("CUDA OOM during evaluation\n").get("eval_memory_prose")


# ---- RK017: the OOM while the model is loaded -----------------------------------------------


@covers("RK017")
def test_fresh_rk017_oom_raised_at_the_from_pretrained_line():
    # https://github.com/QwenLM/Qwen-VL/issues/26: the traceback's one frame is the script's
    # `model = AutoModelForCausalLM.from_pretrained(..., device_map="cuda", bf16=True)` on a
    # 16 GB GPU; the maintainers: the model needs about 23 GB, use the Int4 checkpoint.
    f = top(run(text("fm-qwenvl-26-load-oom")))
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert f.config_patch["load_in_4bit"] is True
    assert "Int4" in f.fix and "from_pretrained" in f.evidence


@covers("RK017")
def test_fresh_rk017_cuda_after_device_map_auto():
    # https://github.com/InternLM/InternLM/issues/79: "The error happens when executing"
    # `from_pretrained(..., device_map="auto", ...).cuda()`: the .cuda() puts every layer the
    # map spread over 8 GPUs back on GPU 0.
    f = top(run(text("fm-internlm-79-device-map-cuda")))
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert "no .cuda()" in f.config_patch["code"]
    assert f.fix.startswith("Drop the .cuda()")


@covers("RK017")
def test_rk017_traceback_cut_inside_the_load_is_possible_only():
    # https://github.com/hiyouga/LlamaFactory/issues/4559: QLoRA of a 70B GPTQ model on 4 x
    # A10G 24 GB; every rank's traceback ends in from_pretrained / _load_pretrained_model and
    # is cut before its exception line, then torch's launcher raises ChildFailedError. The
    # maintainer: the quantized 70B needs 48 GB on one card. The paste does not say OOM: the
    # load's memory is the reading, at low confidence, and the exception line is asked for.
    d = run(text("lf-4559-load-traceback-cut"), config=_LF_4559_CONFIG)
    f = top(d)
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert f.confidence < 0.5 and d.verdict.verdict == "needs_evidence"
    assert d.verdict.collect[0]["id"] == "traceback"
    assert "before its exception line" in d.verdict.collect[0]["what"]
    # from_pretrained's `offload_index` (device_map's disk offload) is not CPU offloading:
    # no offload bug, and no DeepSpeed offload patch for a run with no DeepSpeed config
    assert "RK260" not in ids(d)
    assert all("zero_optimization" not in (g.config_patch or {}) for g in d.findings)


def test_rk017_cut_traceback_outside_the_load_is_not_read_as_the_load():
    cut = text("lf-4559-load-traceback-cut").replace("from_pretrained", "forward")
    cut = cut.replace("_load_pretrained_model", "forward").replace("load_model", "forward")
    d = run(cut, config=_LF_4559_CONFIG)
    assert "RK017" not in ids(d)
    # the default reading reads the rank's own (cut) traceback, not the launcher's
    # ChildFailedError raised in torch/distributed's api.py
    f = get(d, "RK420")
    assert "modeling_utils.py" in f.evidence and "ChildFailedError" not in f.evidence


_LF_4559_CONFIG = (Path(__file__).parent / "data/rules/lf-4559-qlora-config.yaml").read_text()


def test_fresh_rk017_needs_the_load_named_as_the_failing_site():
    # the same code, without the sentence that places the OOM at it and with an OOM from a
    # later line, is no loading finding
    pasted = text("fm-internlm-79-device-map-cuda").replace("The error happens when executing", "")
    assert "RK017" not in [f.rule for f in run(pasted).findings]


def test_fresh_rk017_cites_the_model_load_not_the_tokenizer():
    # InternLM/InternLM#79's text without the trailing .cuda(): the general loading reading,
    # quoting the model's from_pretrained line (the tokenizer's comes first in the paste)
    pasted = text("fm-internlm-79-device-map-cuda").replace(
        "trust_remote_code=True).cuda()", "trust_remote_code=True)"
    )
    f = top(run(pasted))
    assert f.rule == "RK017" and "AutoModelForCausalLM" in f.evidence
    assert f.config_patch["device_map"] == "auto"


@covers("RK017")
def test_fresh_settings_mellama9_oom_while_loading():
    # https://github.com/BIDS-Xu-Lab/Me-LLaMA/issues/9: "It trows `out of memory error` while
    # loading the model" after from_pretrained(...).to(device) of a 13B on 24 GB: the weights.
    f = top(run(text("fq-mellama9-13b-load-24gb")))
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert f.config_patch.get("load_in_4bit") is True
    assert "half precision" in f.fix


@covers("RK017")
def test_fresh_rk017_not_enough_to_load_the_model():
    # https://github.com/shikiw/OPERA/issues/36: "CUDA error: out of memory" on an A6000 with
    # 48 GB, "Is 48 GB not enough to load the model?"; the maintainer: load_in_8bit /
    # load_in_4bit at model initialization.
    f = top(run(text("fs-opera36-llava-a6000-48gb")))
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert f.config_patch.get("load_in_8bit") is True
    assert "load_in_8bit" in f.fix


def test_fresh_rk017_load_fit_prose_needs_the_words():
    # Mutation guard: without the sentence about loading, the OPERA paste is no load reading.
    pasted = text("fs-opera36-llava-a6000-48gb").replace(
        "Is 48 GB not enough to load the model?", "Any idea?"
    )
    assert top(run(pasted)).rule != "RK017"
    assert "load_fit_prose" in scan_signals(["The model does not fit on my GPU"])
    assert "load_fit_prose" not in scan_signals(["the model loads fine"])


# =============================================================================================
# RK010-RK013: which memory dominates, with a model shape
# =============================================================================================


@covers("RK010")
def test_rk010_activations_dominate_llama3_70b_at_64k():
    # Llama-3-70B, TP8 PP4 DP4 (torchrun 8 x 16) at 64k context without recompute, and the
    # H200 OOM of real-formats.md oom-msswift-9191 (139.81 GiB device). (At 32k the script fits
    # that GPU once read as Megatron-LM runs it: bias-SwiGLU fused, DP 4 for the optimizer.)
    config = LLAMA3_70B_32K.replace("32768", "65536")
    d = run(text("oom-msswift-9191"), config=config, config_name="pretrain.sh")
    f = top(d)
    assert f.rule == "RK010" and f.category == "activation_memory"
    ctx = build_context(d.evidence)
    e = ctx.estimate
    cites(f, gib(e.peak_activation_bytes), "'none'")
    cites(f, gib(e.weights_bytes + e.grads_bytes + e.optimizer_bytes))
    # the patch is the planner's choice for this GPU, and the evidence names it
    best = ctx.best.estimate.recompute
    cites(f, f"'{best}'")
    assert f.config_patch["recompute_granularity"] in ("selective", "full")
    assert f.config_patch != spec_patch(None)
    assert e.peak_activation_bytes > e.weights_bytes + e.grads_bytes + e.optimizer_bytes


@covers("RK010")
def test_rk010_recompute_makes_it_fit_though_states_are_larger():
    # The real 23.65 GiB OOM of pytorch/pytorch#16417 with Llama-3-8B on TP4 at 8k: model
    # states outweigh activations, yet the rank does not fit without recompute and does with
    # it. The shape was given: the finding must not fall back to RK005's "without a model
    # shape" advice.
    d = run(text("oom-pt-16417-comment"), config=LLAMA3_8B_TP4_8K, config_name="l8b.yaml")
    f = top(d)
    assert f.rule == "RK010" and f.category == "activation_memory"
    ctx = build_context(d.evidence)
    e = ctx.estimate
    assert e.peak_activation_bytes < e.weights_bytes + e.grads_bytes + e.optimizer_bytes
    assert e.total_bytes > ctx.gpu_bytes
    cites(f, gib(e.total_bytes), "23.65 GiB", f"'{ctx.best.estimate.recompute}'")
    assert f.config_patch["recompute_granularity"] in ("selective", "full")
    assert "RK005" not in ids(d)


@covers("RK010")
def test_rk010_needs_an_oom():
    # The same config without an OOM is a plan, not a diagnosis.
    d = run(config=LLAMA3_70B_32K, config_name="pretrain.sh", gpu_memory_gb=141)
    assert "RK010" not in ids(d)


@covers("RK011")
def test_rk011_model_states_dominate_without_the_distributed_optimizer():
    # Llama-3-70B on TP8 alone, Adam states unsharded, and the real H200 OOM
    # (oom-msswift-9191): recompute cannot help.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_TP8_NO_DISTOPT, config_name="x.sh")
    f = top(d)
    assert f.rule == "RK011" and f.category == "model_state_memory"
    assert f.config_patch == {"use_distributed_optimizer": True}
    e = build_context(d.evidence).estimate
    cites(f, gib(e.weights_bytes), gib(e.grads_bytes), gib(e.optimizer_bytes), "139.81 GiB")


@covers("RK011")
def test_rk011_not_when_states_are_small():
    # Llama-3-70B TP8 PP4 with the distributed optimizer: states are a minority of the GPU.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    assert "RK011" not in ids(d)


@covers("RK012")
def test_rk012_logits_of_a_large_vocabulary_at_32k():
    # Qwen2.5-7B (152064 vocabulary) at 32k tokens on TP2, 80 GiB GPUs.
    d = run(config=QWEN25_7B_32K, config_name="qwen25_7b.yaml", gpu_memory_gb=80)
    f = get(d, "RK012")
    assert f.category == "logits_memory"
    cites(f, "32768 tokens x 152064", "9.28 GiB")  # 4 B x 32768 x 152064 / TP2
    # TE's fused loss: Megatron's native one keeps the same fp32 tensors (a skill trial was
    # given the native fusion, which the kit's own estimate shows frees nothing)
    assert f.config_patch == {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
    assert f.patch_check["peak_after_bytes"] < f.patch_check["peak_before_bytes"]
    # a batch of one is not told to lower the batch (a skill trial: LLaMA-Factory at batch 1)
    assert ("a shorter sequence" in f.fix) == ("micro_batch_size: 1\n" in QWEN25_7B_32K)
    assert ("a smaller micro-batch" in f.fix) != ("a shorter sequence" in f.fix)


@covers("RK012")
def test_rk012_not_for_a_short_sequence():
    # The same model at 4k: 1.16 GiB of fp32 logits per rank is no concern on 80 GiB.
    short = QWEN25_7B_32K.replace("seq_length: 32768", "seq_length: 4096")
    assert "RK012" not in ids(run(config=short, config_name="q.yaml", gpu_memory_gb=80))


def test_even_full_recompute_does_not_fit_and_the_logits_are_its_largest_term():
    # Llama-3.1-8B at 128k context without context parallelism, full recompute on, and the
    # real H200 OOM (oom-msswift-9191). With full recompute the fp32 logits of 131072 tokens x
    # 128256 (62.6 GiB, more with their gradient) outweigh the model states (DP 64, distributed
    # optimizer) and the layers' saved inputs: the logits lead (the old doctor said "model
    # state memory", RK013, whose advice - shard the states - cannot close this gap).
    d = run(text("oom-msswift-9191"), config=LLAMA31_8B_128K, config_name="l8b.yaml")
    f = top(d)
    assert f.rule == "RK012" and f.category == "logits_memory"
    cites(f, "Nothing fits in 139.81 GiB", "its largest term is the embedding, logits, loss")
    assert not {"RK010", "RK013", "RK024", "RK005"} & set(ids(d))  # recompute cannot do it
    assert f.config_patch  # the planner's lever that fits (context parallelism here)


# Llama-2-70B's shape (vocabulary 32000) on TP8 with sequence parallelism
LLAMA2_70B_TP8 = (
    LLAMA31_8B_128K.replace("num_layers: 32", "num_layers: 80")
    .replace("hidden_size: 4096", "hidden_size: 8192")
    .replace("ffn_hidden_size: 14336", "ffn_hidden_size: 28672")
    .replace("num_attention_heads: 32", "num_attention_heads: 64")
    .replace("vocab_size: 128256", "vocab_size: 32000")
    .replace(
        "tensor_model_parallel_size: 1", "tensor_model_parallel_size: 8\n  sequence_parallel: true"
    )
)


@covers("RK013")
def test_rk013_model_states_are_the_largest_term_at_full_recompute():
    # the same shape at 4k tokens with one data-parallel rank: states alone exceed the H200
    config = LLAMA2_70B_TP8.replace("seq_length: 131072", "seq_length: 4096").replace(
        "data_parallel_size: 64", "data_parallel_size: 1"
    )
    d = run(text("oom-msswift-9191"), config=config, config_name="l70.yaml")
    f = get(d, "RK013")
    assert f.category == "model_state_memory" and f.confidence >= 0.8
    cites(f, "its largest term is weights, gradients and optimizer states")
    # the distributed optimizer over one data-parallel rank shards nothing: the fix says so
    # (https://github.com/deepspeedai/DeepSpeed/issues/237's answer, for ZeRO at DP 1)
    assert "there is one, so nothing is sharded" in f.fix
    two = run(
        text("oom-msswift-9191"),
        config=config.replace("data_parallel_size: 1", "data_parallel_size: 2"),
        config_name="l70.yaml",
    )
    states = [g for g in two.findings if g.category == "model_state_memory"]
    assert states and not any("nothing is sharded" in g.fix for g in states)


@covers("RK024")
def test_rk024_the_layers_saved_inputs_are_the_largest_term_at_full_recompute():
    # at 1M tokens the one input each of the 80 layers keeps (160 GiB per rank) is the term
    config = LLAMA2_70B_TP8.replace("seq_length: 131072", "seq_length: 1048576")
    d = run(text("oom-msswift-9191"), config=config, config_name="l70.yaml")
    f = top(d)
    assert f.rule == "RK024" and f.category == "activation_memory"
    cites(f, "its largest term is the layers' saved inputs")
    assert "context parallelism" in f.fix.lower()


@covers("RK013")
def test_rk013_needs_an_oom():
    d = run(config=LLAMA31_8B_128K, config_name="l8b.yaml", gpu_memory_gb=141)
    assert "RK013" not in ids(d)


# =============================================================================================
# RK085-RK100 (issue 12): partial pastes, frames as evidence, recompute silently off, checkpoint
# errors, numbers-derived fixes. Texts are tests/data/rules/i12-*.txt, verbatim from the URLs
# in SOURCES; those from the corpus (tests/corpus/cases) are all in its development split, and
# "[... cut by corpus ...]" marks where the case's author cut the thread's text.
# =============================================================================================


@covers("RK086")
def test_rk086_oom_in_validate_without_no_grad():
    d = run(text("i12-imgcap-57"))
    f = top(d)
    assert f.rule == "RK086" and f.category == "activation_memory"
    assert "validate" in f.evidence and "no_grad" in f.fix and f.config_patch


@covers("RK087")
def test_rk087_bare_training_oom_gets_numbers_and_a_patch():
    d = run(text("i12-automodel-1975"))
    f = top(d)
    assert f.rule == "RK087" and f.category == "activation_memory"
    cites(f, "4.34 GiB", "2.59 GiB", "79.11 GiB")
    assert f.config_patch.get("gradient_checkpointing") is True
    assert "seq_length" in f.evidence


@covers("RK088")
def test_rk088_step_peaks_far_above_rest():
    d = run(text("i12-automodel-2634"))
    f = top(d)
    assert f.rule == "RK088"
    cites(f, "73.94 GiB", "10.33 GiB", "63.61 GiB")
    assert f.config_patch


def test_call_chain_pasted_before_the_oom_is_evidence():
    # NeMo-RL's issue pastes the call chain as "-> f (file:line)" lines, then the OOM line.
    d = run(text("i12-nemorl-2871"))
    assert any("get_next_token_logprobs_from_logits" in line for line in d.evidence.oom[0].context)
    f = top(d)
    assert f.rule == "RK016" and f.category == "logits_memory"


@covers("RK691")
def test_r10a_zero3_module_moved_whole_before_partitioning():
    # https://github.com/deepspeedai/DeepSpeed/issues/2497: ZeRO-3 + offload OOMs at
    # `self.module.to(self.device)`; the maintainer points to deepspeed.zero.Init
    d = run(text("r10a-deepspeed2497-module-to-device"))
    f = top(d)
    assert f.rule == "RK691" and f.category == "model_state_memory"
    assert "self.module.to(self.device)" in f.evidence
    assert "deepspeed.zero.Init" in f.fix
    assert f.config_patch["zero_init"] is True


def test_r10a_whole_move_without_sharding_or_oom_is_silent():
    paste = text("r10a-deepspeed2497-module-to-device")
    no_shard = paste.replace("Zero (Stage-3 + offload)", "plain DDP").replace(
        "as deepspeed requires", "as it requires"
    )
    assert "RK691" not in ids(run(no_shard))
    calm = (
        paste.replace("I got OOM error", "I got an error")
        .replace(" whose parameter size is larger than GPU memory capacity", "")
        .replace("that's where the OOM occurs", "that's where it fails")
    )
    assert "RK691" not in ids(run(calm))


def test_oom_on_a_bridge_config_keeps_its_modules_and_lists_fragmentation():
    # A skill trial: the DeepSeek-V3 Bridge dry-run config (recompute_modules [mla_up_proj, mlp])
    # with an OOM whose 2.31 GiB reserved-but-unallocated exceeds the 1.75 GiB request.
    from pathlib import Path

    name = "deepseek_v3_pretrain_h100_fp8_sc_v1.yaml"
    config = (Path(__file__).parent / "sources" / "corpus" / "bridge" / name).read_text()
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a "
        "total capacity of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
        "this process has 78.08 GiB memory in use. Of the allocated memory 74.12 GiB is "
        "allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated.\n"
    )
    d = run(oom, config=config, config_name=name)
    # no fix recomputes less: none drops the mla_up_proj the run recomputes
    for f in d.findings:
        assert "mla_up_proj" in f.config_patch.get("recompute_modules", ["mla_up_proj"]), f.rule
    # free memory in pieces, more than the request: listed (the free thing to try), not ruled out
    assert "RK001" in ids(d)
    # the config file's own text does not count as someone blaming the vocabulary
    assert "RK620" not in ids(d)


def test_torchtitan_16k_logits_lead_and_the_patch_is_the_planners_lever_in_its_keys():
    # A skill trial: torchtitan's own llama3_8b.toml (tests/sources/corpus/torchtitan/, URL in
    # its .expect.yaml) at seq_len 16384 with activation checkpointing off on 8 x A100 40GB,
    # and the OOM the trial used (PyTorch's wording, its figures). Full recompute still needs
    # 43 GiB, most of it the fp32 logits; the old doctor led with "model state memory" and a
    # tensor-parallel patch the planner's lever table did not rank first.
    toml = (Path(__file__).parent / "sources/corpus/torchtitan/llama3_8b.toml").read_text()
    toml = toml.replace("seq_len = 8192", "seq_len = 16384")
    toml = toml.replace('mode = "selective"', 'mode = "none"')
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 3 has a "
        "total capacity of 39.39 GiB of which 1.12 GiB is free. Including non-PyTorch memory, "
        "this process has 38.26 GiB memory in use. Of the allocated memory 36.90 GiB is "
        "allocated by PyTorch, and 612.45 MiB is reserved by PyTorch but unallocated.\n"
    )
    d = run(oom, config=toml, config_name="llama3_8b.toml", overrides={"data_parallel_size": 8})
    f = top(d)
    assert f.rule == "RK012" and f.category == "logits_memory"
    assert set(f.patch_keys) == {"parallelism.context_parallel_degree"}
    assert "plan --levers" in f.fix and "RK010" not in ids(d)
    assert "RK087" not in ids(d)  # "without a model shape": there is one


def test_deepseek_v3_fsdp_script_predicted_nothing_fits_is_read_by_its_largest_term(tmp_path):
    # Megatron-LM's Megatron-FSDP DeepSeek-V3 sbatch script (tests/data/read/README.md) on 32
    # nodes x 8 GPUs of 79.1 GiB, with the recompute a skill trial's user tried (moe_act), no
    # OOM pasted. Before: RK010 patched 'moe_act mla_up_proj' as "the planner's choice" while
    # the planner found nothing that fits at micro-batch 4, and the verdict said Megatron's
    # validation rejects the config (sequence parallelism at TP 1, which Megatron-LM drops).
    text = (Path(__file__).parent / "data/read/mlm_sbatch_mfsdp_deepseek_v3.sh").read_text()
    for old, new in (
        ("--nodes=your_own_num_nodes", "--nodes=32"),
        ("--ntasks-per-node=your_own_tasks_per_node", "--ntasks-per-node=8"),
        ("--recompute-modules mlp moe mla_up_proj layernorm", "--recompute-modules moe_act"),
    ):
        assert old in text
        text = text.replace(old, new)
    d = run(config=text, config_name="train.sh", gpu_memory_gb=79.1)
    assert "RK010" not in ids(d)
    f = top(d)
    assert f.rule == "RK013" and "prediction" in f.evidence
    # the fastest lever that fits, checked by the estimator (TP 2 with full recompute since
    # the step time counts Megatron-FSDP's gathers in each of micro-batch 1's micro-batches)
    assert f.patch_keys and "plan --levers" in f.fix
    check = f.patch_check
    assert check["peak_after_bytes"] < 0.9 * 79.1 * 2**30 < check["peak_before_bytes"]
    assert "validation rejects" not in d.verdict.why


@covers("RK086")
def test_rk086_a_trainer_run_evaluation_loop_already_has_no_grad():
    # transformers#7926: a Lightning progress bar ("v_num=16", "Validating:") and an OOM in
    # validation, the traceback cut at its first frames. The trainer's validation already runs
    # under no_grad (the fix was eval_accumulation_steps): no no_grad patch, low confidence.
    f = get(run(text("t11-transformers-7926")), "RK086")
    assert f.confidence < 0.5
    assert f.config_patch == {}
    assert "eval_accumulation_steps" in f.fix


@covers("RK024")
def test_rk024_where_cuda_graphs_refuse_full_recompute_the_smallest_candidate_is_read():
    # TE CUDA graphs on attention: Megatron-Core refuses full recompute ("full recompute is
    # only supported with full iteration CUDA graph"), so the smallest candidate is selective
    # and its terms, not those of a full recompute the run cannot have, decide the finding
    config = (
        LLAMA2_70B_TP8.replace("seq_length: 131072", "seq_length: 262144")
        .replace("recompute_granularity: full", "recompute_granularity: selective")
        .replace("  recompute_method: uniform\n", "")
        .replace("  recompute_num_layers: 1\n", "")
        + "  cuda_graph_impl: transformer_engine\n  cuda_graph_scope: [attn]\n"
        + "  attention_dropout: 0.0\n  hidden_dropout: 0.0\n"
    )
    d = run(text("oom-msswift-9191"), config=config, config_name="l70.yaml")
    f = top(d)
    assert f.rule == "RK024" and f.category == "activation_memory"
    cites(f, "Full recompute is not a candidate here")
    cites(f, "With the smallest candidate the largest term is the layers' activations")
    assert "full iteration CUDA graph" in f.fix and "context parallelism" in f.fix


# https://github.com/NVIDIA-NeMo/RL/issues/362 (the frames of the reporter's traceback): an OOM
# in loss.backward() at step 26; torch/autograd/__init__.py is a file, not a constructor
BACKWARD_AT_STEP_26 = """Training to Step 26
Traceback (most recent call last):
  File "/opt/nemo-rl/nemo_rl/models/policy/dtensor_policy_worker.py", line 540, in train
    loss.backward()
  File "/usr/local/lib/python3.12/dist-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
  File "/usr/local/lib/python3.12/dist-packages/torch/autograd/__init__.py", line 347, in backward
    _engine_run_backward(
  File "/usr/local/lib/python3.12/dist-packages/torch/autograd/graph.py", line 823, in \
_engine_run_backward
    return Variable._execution_engine.run_backward(  # Calls into the C++ engine
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total \
capacity of 94.50 GiB of which 1.07 GiB is free.
"""


@covers("RK017")
def test_rk017_a_backward_is_not_model_construction():
    assert "RK017" not in ids(run(BACKWARD_AT_STEP_26))
    # the same OOM raised from a constructor is
    built = BACKWARD_AT_STEP_26.replace(" in backward\n", " in __init__\n").replace(
        "    loss.backward()\n", "    self.layers = build_module(spec)\n"
    )
    built = "\n".join(x for x in built.splitlines() if "_engine_run_backward" not in x) + "\n"
    assert "RK017" in ids(run(built))


@covers("RK016")
def test_rk016_megatrons_fp32_upcast_of_the_returned_logits():
    # NeMo-RL DPO on gpt-oss-120b (the reporter's paste): the OOM is in Megatron's
    # Float16Module turning the last stage's output, the logits NeMo-RL takes log-probs of,
    # into fp32 (float16_to_fp32 -> val.float())
    f = top(run(text("nemorl-2859-dpo-float16-to-fp32")))
    assert f.rule == "RK016" and f.category == "logits_memory"
    cites(f, "float16_to_fp32")


@covers("RK016")
def test_rk016_float16_upcast_in_a_cut_paste_names_megatrons_own_lever():
    # https://github.com/THUDM/slime/issues/1767 (slime: Megatron RL on Qwen3-4B): the paste
    # keeps the traceback's last frames only, module.py's float_conversion (float16_to_fp32's
    # inner function) casting the returned logits to fp32: a 61.34 GiB request on 79.11 GiB
    d = run(text("slime-1767-float-conversion-oom"))
    f = top(d)
    assert f.rule == "RK016" and f.category == "logits_memory"
    assert "fp32_output=False" in f.config_patch["code"] and "Float16Module" in f.fix
    assert "cross_entropy_loss_fusion" not in f.config_patch
    # no "this process has" line: of the two NVML entries, the one as large as PyTorch's
    # reserve (44.61 GiB + 410.55 MiB) is this process (a Ray actor's PID namespace); the
    # sleeping inference engine's 3.17 GiB is the other
    oom = d.evidence.oom[0]
    assert round(oom.process_bytes / GIB, 2) == 48.84
    assert round(oom.other_processes_bytes / GIB, 2) == 3.17


def test_model_states_reading_stands_down_where_recompute_makes_the_rank_fit():
    # the same paste with the reporter's launch script as far as the issue shows it
    # (tests/data/rules/slime-1767-launch-head.sh: the model's arguments, no precision flag,
    # so Megatron-LM's fp32 default): RK011 said "recompute cannot fix this" and patched the
    # recompute `plan --levers` found to fit
    script = (Path(__file__).parent / "data/rules/slime-1767-launch-head.sh").read_text()
    d = run(text("slime-1767-float-conversion-oom"), config=script, config_name="launch.sh")
    assert top(d).rule == "RK016"
    assert "RK011" not in ids(d)
    assert "recompute" in str(get(d, "RK010").config_patch)


@covers("RK016")
def test_a_logits_oom_under_nemo_rls_policy_worker_names_nemo_rls_levers():
    # https://github.com/NVIDIA-NeMo/RL/issues/2859: a skill re-trial got Megatron's
    # cross_entropy_loss_fusion for the float() of the logits under NeMo-RL's policy worker
    f = get(run(text("t24-nemorl-2859-float16-to-fp32")), "RK016")
    assert f.config_patch == {"logprob_chunk_size": 1024, "defer_fp32_logits": True}
    assert "cross_entropy_loss_fusion" not in f.fix


@covers("RK086")
@covers("RK621")
def test_an_oom_in_the_trainers_own_evaluation_loop_is_what_it_gathers():
    # https://github.com/huggingface/transformers/issues/7158: the OOM in Trainer.evaluate's
    # prediction_loop (torch.cat of the predictions); the fix was eval_accumulation_steps
    # (PR #7767). A re-trial was told to wrap the loop in torch.no_grad(), which the Trainer
    # does already. What it gathers is every batch's logits: logits memory.
    d = run(text("t24-transformers-7158-evaluate-oom"))
    f = get(d, "RK621")
    assert f.category == "logits_memory" and "runs under no_grad" in f.evidence
    assert "eval_accumulation_steps" in f.fix
    assert f.config_patch == {"eval_accumulation_steps": 1}
    assert "RK086" not in ids(d)  # no torch.no_grad() advice for a loop that has it


@covers("RK621")
def test_rk621_an_oom_at_the_evaluation_steps_of_a_llama_factory_run():
    # https://github.com/hiyouga/LlamaFactory/issues/5419 (the reporter's words, verbatim): fine
    # in training, an OOM as soon as eval_steps comes; the reporter's fix: eval_accumulation_steps 1
    said = (
        "LLaMA-Factory 0.8.3\n\n"
        "训练时显存还是够用的，但是一到eval_step设置的步数就爆OOM了，这个问题持续很久了。\n"
    )
    f = top(run(said))
    assert f.rule == "RK621" and f.category == "logits_memory"
    assert f.config_patch == {"eval_accumulation_steps": 1}
    # without the framework named, the evaluation reading is RK086's (a loop of unknown make)
    assert "RK621" not in ids(run(said.split("\n\n", 1)[1]))


# NeMo-RL issue 2811 (rule_sources.py): no config, the test's name names the model; 9.27 GiB
# is 4 x 4096 tokens of fp32 logits over Qwen3's 151936 entries
NEMORL_2811 = text("nemorl-2811-logprob-oom")


@covers("RK622")
def test_rk622_the_request_is_one_logits_tensor_of_the_named_model():
    f = get(run(NEMORL_2811), "RK622")
    assert f.category == "logits_memory" and "[16384 x 151936]" in f.evidence
    # the same request with no model family named, or another family's vocabulary: nothing
    assert "RK622" not in ids(run(NEMORL_2811.replace("qwen3_30ba3b", "model")))
    assert "RK622" not in ids(run(NEMORL_2811.replace("qwen3_30ba3b", "gemma")))


def test_logits_shape_of_a_request_needs_a_whole_number_of_token_blocks():
    from recompute_kit.doctor.rules.logits import logits_shape_of_request

    assert logits_shape_of_request(round(9.27 * 2**30), [151936]) == (16384, 151936, 4)
    assert logits_shape_of_request(round(9.40 * 2**30), [151936]) is None  # 16613 tokens
    assert logits_shape_of_request(round(1002.0 * 2**20), [128256]) == (2048, 128256, 4)


@covers("RK620")
def test_peak_memory_blamed_on_the_cross_entropy_in_words():
    # https://github.com/pytorch/torchtitan/pull/996 (its first line, verbatim): the PR chunks
    # the loss; before, no finding
    d = run(
        "Noticed that in the memory snapshot when running the Llama3-8B models, the cross "
        "entropy loss is causing huge spikes in peak memory: \n"
    )
    f = top(d)
    assert f.rule == "RK620" and "the loss / logits" in f.evidence
    # the loss named without memory blamed on it is not this reading
    assert "RK620" not in ids(run("the cross entropy loss is NaN after step 10\n"))
