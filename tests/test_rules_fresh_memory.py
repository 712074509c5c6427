"""Fresh real pastes for the memory rule families (allocator, memory, model states, outside the
allocator, measured, general, default readings): threads other than the rules' own sources and
the corpus, each run through the doctor as the CLI runs it. Every test names its thread's URL
and what its maintainers (or the reporter, confirmed) gave as the remedy."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence import collect
from recompute_kit.doctor.evidence.code import scan_snippets

NO_GRAD = {"code": "with torch.no_grad():  # around the evaluation loop"}


# ---- RK110: the OOM in the optimizer step -------------------------------------------------


@covers("RK110")
def test_fresh_rk110_hybrid_adam_state_allocation():
    # https://github.com/hpcaitech/ColossalAI/issues/3509: the OOM is raised where HybridAdam
    # creates state['exp_avg'] (torch.zeros_like) inside optimizer.step of a ZeRO optimizer.
    f = top(run(text("fm-colossalai-3509-optimizer-step")))
    assert f.rule == "RK110" and f.category == "model_state_memory"
    assert "optimizer step" in f.evidence
    assert "ZeRO" in f.fix or "offload" in f.fix


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


# ---- RK266: memory that grows step after step -----------------------------------------------


@covers("RK266")
def test_fresh_rk266_prose_memory_grows_until_oom():
    # https://github.com/pytorch/pytorch/issues/1840: "the memory grows unlimitly until OOM";
    # soumith: `sum_log_likelihood += neg_log_likelihood` keeps the graph of every step - add
    # the value (.data / .item()), not the tensor.
    f = top(run(text("fm-pt-1840-loss-accumulated")))
    assert f.rule == "RK266"
    assert "loss.item()" in f.fix and "total_loss += loss" in f.evidence


def test_fresh_memory_growth_prose_needs_steps():
    # a memory figure that rose once is not growth over steps
    assert "memory_growth_prose" not in scan_snippets("The memory increased to 20 GB.\n")
    assert scan_snippets("GPU memory keeps increasing every iteration until OOM\n").get(
        "memory_growth_prose"
    )


def _write(body: str):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "train.log"
    path.write_text(body, encoding="utf-8")
    return path


# ---- RK002 / RK360: other processes on the GPU ----------------------------------------------


@covers("RK002")
def test_fresh_rk002_hard_wrapped_message_with_three_other_processes():
    # https://github.com/qibin0506/llm_trainer/issues/2 ("HOW to set CUDA_VISIBLE_DEVICE"): three
    # other processes hold 68.71 GiB of the 79.32 GiB GPU; the paste is cut mid-word
    # ("Includ" / "ing non-PyTorch ...", "expandable_segments:T" / "rue"). The wrapped lines
    # carry the fields, so this process's own 10.58 GiB is read, not taken for another's.
    d = run(text("fm-llmtrainer-2-other-processes"))
    f = top(d)
    assert f.rule == "RK002" and f.category == "other_processes"
    assert "CUDA_VISIBLE_DEVICES" in f.config_patch["env"]
    assert f.evidence.startswith("Other processes hold 68.71 GiB")
    oom = collect(logs=[str(_write(text("fm-llmtrainer-2-other-processes")))]).oom[0]
    assert oom.process_bytes and oom.allocated_bytes and not oom.truncated


@covers("RK360")
def test_fresh_rk360_gpus_full_with_no_process_listed():
    # https://github.com/phil-bergmann/tracking_wo_bnw/issues/57: "CUDA error: out of memory";
    # the maintainer asked whether something else runs on the GPU; gpustat shows GPUs 0, 1, 4,
    # 5 full and 2, 3, 6, 7 empty while nvidia-smi lists no process. Run on an idle GPU.
    f = top(run(text("fm-tracking-57-gpus-held")))
    assert f.rule == "RK360" and f.category == "other_processes"
    assert f.config_patch == {"env": {"CUDA_VISIBLE_DEVICES": "2"}}
    assert "GPU 0, 1, 4, 5" in f.evidence


@covers("RK360")
def test_fresh_rk360_another_code_on_gpu0_in_words():
    # https://github.com/yinboc/DGP/issues/16: "I run another code on GPU0"; the script's own
    # --gpu resets CUDA_VISIBLE_DEVICES (the maintainer: choose the GPU with --gpu).
    f = top(run(text("fm-dgp-16-another-code")))
    assert f.rule == "RK360" and f.category == "other_processes"
    assert "CUDA_VISIBLE_DEVICES" in f.config_patch["env"]
    assert "--gpu" in f.fix


@covers("RK360")
def test_fresh_rk360_already_a_training_in_gpu0():
    # https://github.com/open-mmlab/mmdetection/issues/3020: GPU 0 is out of memory "because
    # there is already a training in GPU 0"
    f = top(run(text("fm-mmdet-3020-gpu0-busy")))
    assert f.rule == "RK360" and f.category == "other_processes"


def test_fresh_rk360_needs_an_oom_and_a_full_gpu():
    # the same gpustat rows without an OOM, or with no GPU over 90%, are no finding
    rows = text("fm-tracking-57-gpus-held").split("\n", 1)[1]
    assert "RK360" not in [f.rule for f in run(rows).findings]
    light = text("fm-tracking-57-gpus-held").replace("15836 / 16130", "1836 / 16130")
    light = light.replace("15825 / 16130", "1825 / 16130").replace("15718", "1718")
    light = light.replace("15682", "1682")
    assert "RK360" not in [f.rule for f in run(light).findings]
    # full GPUs next to an OOM, with processes listed (or nothing said): this job's own usage
    listed = text("fm-tracking-57-gpus-held").replace(
        "and nvidia-smi shows that no processes on GPU were launched\n", ""
    )
    assert "RK360" not in [f.rule for f in run(listed).findings]


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


# ---- RK004: one request larger than the GPU ---------------------------------------------------


@covers("RK004")
def test_fresh_rk004_request_above_the_gpu_with_other_processes_listed():
    # https://github.com/QwenLM/Qwen2.5-Omni/issues/240: a 124.68 GiB request on a 95.22 GiB GPU
    # while two other processes hold 44 GiB; the maintainers asked "Are you using
    # flash-attention?" (an eager attention score matrix). The request alone exceeds the GPU:
    # RK004 leads, not the other processes.
    d = run(text("fm-qwenomni-240-request-over-gpu"))
    f = top(d)
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"
    assert "flash" in f.fix
    assert "124.68 GiB" in f.evidence and "95.22 GiB" in f.evidence
