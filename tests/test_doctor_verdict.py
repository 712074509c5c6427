"""The doctor's verdict (doctor/verdict.py), calibrated confidence (doctor/calibration.py),
the symptom the user states (doctor/symptoms.py) and the corpus's decidable labels.

Pastes are verbatim from the threads named beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recompute_kit.doctor import calibration, symptoms
from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import collect
from recompute_kit.doctor.types import Finding
from recompute_kit.doctor.verdict import COLLECT, COLLECT_FOR, DECIDED_BY

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "corpus" / "cases"

# https://github.com/huggingface/sentence-transformers/issues/527 : a full OOM message whose
# sizes say another process holds the GPU (0 bytes reserved by PyTorch, 43 MiB free of 14.76 GiB)
OTHER_PROCESS = (
    "RuntimeError: CUDA out of memory. Tried to allocate 90.00 MiB (GPU 0; 14.76 GiB total "
    "capacity; 0 bytes already allocated; 43.44 MiB free; 0 bytes reserved in total by PyTorch)\n"
)
# https://github.com/NVIDIA-NeMo/Automodel/pull/1975 : the OOM message without a config
OOM_ONLY = (
    "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.34 GiB.\n"
    "         GPU 5 has a total capacity of 79.11 GiB of which 2.59 GiB is free.\n"
    "         ... this process has 76.51 GiB memory in use.\n"
)
# https://github.com/verl-project/verl/issues/224 : host RAM held by rollout workers
HOST_RAM = """I tested qwen7b on single node with 8*A800 80g and 96g memory and got OOM.
There were 8 rollout processes and each consumed 11G memory:
```
PID     MEM(GB) COMMAND
40126   11.20   ray::WorkerDict.actor_rollout_generate_sequences
40125   11.17   ray::WorkerDict.actor_rollout_generate_sequences
40032   11.17   ray::WorkerDict.actor_rollout_generate_sequences
39907   0.54    ray::main_task
```
"""
THIN = "recompute has no effect, memory is the same. RuntimeError: CUDA out of memory.\n"


def run(tmp_path: Path, text: str, **kw):
    log = tmp_path / "paste.log"
    log.write_text(text, encoding="utf-8")
    return diagnose(collect(logs=[str(log)]), **kw)


def test_full_message_that_decides_is_diagnosed(tmp_path):
    d = run(tmp_path, OTHER_PROCESS)
    doc = d.to_json()
    assert doc["verdict"] == "diagnosed", doc["verdict_why"]
    assert d.findings[0].category == "other_processes"
    assert "full_oom" in doc["deciding_evidence"] and doc["collect"] == []
    assert d.findings[0].confidence >= 0.85


def test_thin_paste_needs_evidence_with_what_would_decide(tmp_path):
    doc = run(tmp_path, THIN).to_json()
    assert doc["verdict"] == "needs_evidence"
    assert doc["deciding_evidence"] == []
    assert all(h["label"] == "possible" for h in doc["hypotheses"])
    assert doc["hypotheses"][0]["category"] == "recompute_no_effect"
    ids = [c["id"] for c in doc["collect"]]
    # chosen per competing category: the config and recompute on/off for no-effect first
    assert ids[:2] == ["resolved_config", "memory_by_step"]
    assert "oom_message" in ids and "timings" not in ids


def test_oom_sizes_alone_do_not_split_memory_and_ask_for_the_config(tmp_path):
    doc = run(tmp_path, OOM_ONLY).to_json()
    assert doc["verdict"] == "needs_evidence"
    ids = [c["id"] for c in doc["collect"]]
    assert "resolved_config" in ids and "oom_message" not in ids  # the message was given


def test_host_ram_is_out_of_scope(tmp_path):
    doc = run(tmp_path, HOST_RAM).to_json()
    assert doc["verdict"] == "out_of_scope" and doc["scope"] == "host_ram"


def test_data_loader_worker_is_out_of_scope(tmp_path):
    # https://github.com/pytorch/pytorch/issues/8976 (the error as PyTorch words it)
    text = "RuntimeError: DataLoader worker (pid 4138) is killed by signal: Killed.\n"
    doc = run(tmp_path, text).to_json()
    assert doc["verdict"] == "out_of_scope" and doc["scope"] == "data_loader"


# https://github.com/NVIDIA/TensorRT-LLM/issues/10580 : an OOM raised inside an inference
# engine's request (a skill trial's log: the doctor read it as a training step's memory)
TRTLLM_OOM = (
    "FAILED tests/integration/defs/accuracy/test_llm_api_autodeploy.py::TestNemotronMOE::test_bf16 "
    "- tensorrt_llm.executor.utils.RequestError: CUDA out of memory. Tried to allocate 3.99 GiB. "
    "GPU 0 has a total capacity of 79.11 GiB of which 3.16 GiB is free. Process 328448 has "
    "592.00 MiB memory in use. Including non-PyTorch memory, this process has 75.36 GiB memory "
    "in use. Of the allocated memory 67.16 GiB is allocated by PyTorch, with 121.83 MiB "
    "allocated in private pools (e.g., CUDA Graphs), and 6.90 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
)


def test_an_oom_inside_an_inference_engine_is_out_of_scope(tmp_path):
    doc = run(tmp_path, TRTLLM_OOM).to_json()
    assert doc["verdict"] == "out_of_scope" and doc["scope"] == "inference"
    # beside a training step (a rollout's engine in RL training) it stays in scope
    frames = (
        "Traceback (most recent call last):\n"
        '  File "/workspace/grpo_train.py", line 88, in train_step\n'
        "    outputs = llm.generate(prompts)\n"
    )
    trained = run(tmp_path, frames + TRTLLM_OOM.split(" - ", 1)[1]).to_json()
    assert trained["verdict"] != "out_of_scope"


def test_oom_numbers_decide_only_the_cause_they_show(tmp_path):
    from recompute_kit.doctor.engine import build_context
    from recompute_kit.doctor.verdict import decides, deciding, present

    def kinds(text):
        log = tmp_path / "paste.log"
        log.write_text(text, encoding="utf-8")
        ctx = build_context(collect(logs=[str(log)]))
        return present(ctx), deciding(ctx)

    # 6.90 GiB reserved-unallocated beside a 3.99 GiB request on 79 GiB, 592 MiB in another
    # process, 1.3 GiB outside the allocator: PyTorch's own allocations fill the GPU, and which
    # of them (weights, activations, logits) the message does not say
    shown, decisive = kinds(TRTLLM_OOM.split(" - ", 1)[1])
    assert "full_oom" in shown and not any(k.startswith("oom:") for k in shown)
    assert decisive == {}  # the corpus labels such a paste thin
    for category in ("fragmentation", "other_processes", "genuine_pressure", "model_state_memory"):
        assert not decides(category, shown)
    # 0 bytes reserved by PyTorch, 43 MiB free of 14.76 GiB: the numbers show another holder
    shown, decisive = kinds(OTHER_PROCESS)
    assert "oom:other_processes" in decisive and decides("other_processes", shown)
    assert not decides("fragmentation", shown)
    # PyTorch >= 2.1 counts this process whole ("this process has"): what it holds beyond its
    # allocator is its own (outside the allocator), what is neither free nor it another's.
    # The message as c10/cuda/CUDACachingAllocator.cpp words it, with these sizes:
    whole = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 1.00 GiB is free. Including non-PyTorch memory, "
        "this process has 78.00 GiB memory in use. Of the allocated memory 57.00 GiB is "
        "allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.\n"
    )
    assert "oom:non_pytorch_memory" in kinds(whole)[0]
    others = whole.replace("this process has 78.00 GiB", "this process has 58.10 GiB")
    assert "oom:other_processes" in kinds(others)[0]
    assert "oom:non_pytorch_memory" not in kinds(others)[0]


def test_every_category_has_what_decides_it_and_what_to_collect():
    from recompute_kit.doctor.rules import CATEGORIES

    assert set(CATEGORIES) == set(COLLECT_FOR) == set(DECIDED_BY)
    assert all(item in COLLECT for items in COLLECT_FOR.values() for item in items)


def test_human_output_leads_with_the_verdict(tmp_path):
    log = tmp_path / "paste.log"
    log.write_text(THIN, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", "doctor", "--log", str(log)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert out.startswith("verdict: needs_evidence")
    assert "collect, to decide:" in out.split("\n\n")[0]


# ----- calibration -------------------------------------------------------------------------


def test_undecided_finding_is_capped_and_raw_kept(tmp_path):
    d = run(tmp_path, THIN)
    top = d.findings[0]
    assert top.raw_confidence == 0.7 and top.confidence <= calibration.UNDECIDED_CAP
    raw = run(tmp_path, THIN, calibrated=False).findings[0]
    assert raw.confidence == raw.raw_confidence == 0.7


def test_confidences_never_rise_down_the_ranking(tmp_path):
    # https://github.com/huggingface/peft/issues/137-style paste: the use_reentrant warning under
    # lost gradients (PyTorch's own warning texts)
    text = (
        "/usr/local/lib/python3.10/site-packages/torch/utils/checkpoint.py:464: UserWarning: "
        "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. In "
        "version 2.4 we will raise an exception if use_reentrant is not passed. "
        "use_reentrant=False is recommended, but if you need to preserve the current default "
        "behavior, you can pass use_reentrant=True. Refer to docs for more details on the "
        "differences between the two variants.\n"
        "/usr/local/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: "
        "None of the inputs have requires_grad=True. Gradients will be None\n"
    )
    conf = [f.confidence for f in run(tmp_path, text).findings]
    assert len(conf) >= 2 and conf == sorted(conf, reverse=True)


def test_calibration_table_is_from_the_development_split_with_its_date_and_command():
    doc = json.loads(calibration.TABLE.read_text())
    assert doc["split"] == "dev" and doc["command"] == "python benchmarks/calibrate.py"
    assert doc["produced"] and doc["table"]
    for rows in doc["table"].values():
        p = [r["p"] for r in rows]
        assert p == sorted(p)  # non-decreasing in the raw confidence


def test_fit_pools_small_groups_and_is_monotone():
    pts = [("fragmentation", True, 0.9, False, "RK001")] + [("x", True, 0.6, True, "RKx")] * 10
    table = calibration.fit(pts)
    frag = [r["p"] for r in table["fragmentation|decided"]]
    assert frag == sorted(frag) and 0.3 < frag[-1] < 1.0  # one miss does not make it 0
    assert calibration.calibrate(0.95, "fragmentation", False, {"table": table}) <= 0.6


def test_a_rule_with_a_miss_of_its_own_is_less_sure_than_its_category():
    # one category, two rules: RKa right 6 times in 6, RKb wrong once in 2 at the same band
    pts = [("fragmentation", True, 0.9, True, "RKa")] * 6 + [
        ("fragmentation", True, 0.9, True, "RKb"),
        ("fragmentation", True, 0.9, False, "RKb"),
    ]
    doc = {"table": calibration.fit(pts)}
    cat = calibration.calibrate(0.9, "fragmentation", True, doc)
    assert calibration.calibrate(0.9, "fragmentation", True, doc, rule="RKb") < cat < 0.9
    assert calibration.calibrate(0.9, "fragmentation", True, doc, rule="RKa") >= cat
    # a rule the split never saw takes its category's row
    assert calibration.calibrate(0.9, "fragmentation", True, doc, rule="RKz") == cat


def test_calibrated_confidence_is_rounded_down():
    doc = {"table": {"c|decided": [{"n": 1, "right": 1, "p": 0.847}] * 4}}
    assert calibration.calibrate(0.9, "c", True, doc) == 0.84  # never 0.85: not measured


# ----- the stated symptom ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "symptom"),
    [
        ("Activation checkpointing has no effect on memory", "recompute_no_effect"),
        ("recompute_granularity does not reduce memory at all", "recompute_no_effect"),
        ("training is 30% slower since upgrading to 0.9", ("slower", "after_update")),
        ("After switching to full activation recomputation the TFLOPs dropped a lot", "slower"),
        ("with gradient checkpointing on, the step time went up from 1.2 s to 1.7 s", "slower"),
        # throughput up (or time down) with recompute off is not a slowdown said this way
        ("max reserved is the same with --recompute-activations; MFU is higher", None),
        # https://github.com/NVIDIA-NeMo/Automodel/issues/1927 (a change landed, same config)
        ("After #1904 got merged,  main is running into OOM while running it", "after_update"),
        ("OOM since pulling the latest main", "after_update"),
        # https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/1856 (title)
        ("All FSDP jobs start to have OOM", "after_update"),
        # https://github.com/NVIDIA-NeMo/Automodel/issues/1986
        (
            "a legacy issue in the code and silently disabled activation checkpointing even "
            "if enabled in the config",
            "recompute_no_effect",
        ),
        ("gradient checkpointing is silently skipped for VLMs", "recompute_no_effect"),
        ("pydantic ValidationError: 1 validation error for Config", "validation_error"),
        ("ValidationError: 1 validation error for ConfigContainer", "validation_error"),
        ("the LoRA grads are None after backward", "grads_none"),
        ("lora_B.default.weight.grad=None", "grads_none"),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", None),
    ],
)
def test_stated_symptoms(text, symptom):
    expected = list(symptom) if isinstance(symptom, tuple) else [symptom] if symptom else []
    assert symptoms.stated(text) == expected


def _finding(rule, category, confidence):
    return Finding(rule, category, "t", "s", "c", "c", "f", {}, confidence, [], "e")


def test_symptom_ranks_the_categories_that_explain_it_first():
    found = [
        _finding("RK672", "informational", 0.95),
        _finding("RK087", "activation_memory", 0.7),
        _finding("RK149", "checkpoint_api_misuse", 0.6),
    ]
    ranked = symptoms.rank(found, symptoms.stated("after backward the grads are None"))
    assert [f.rule for f in ranked] == ["RK149", "RK672", "RK087"]
    assert symptoms.rank(found, []) == found


def test_stated_symptom_reaches_the_ranking(tmp_path, monkeypatch):
    # the user says recompute does nothing: the engine hands that to symptoms.rank
    seen = []
    real = symptoms.rank

    def spy(findings, stated):
        seen.append(stated)
        return real(findings, stated)

    monkeypatch.setattr("recompute_kit.doctor.engine.rank_by_symptom", spy)
    d = run(tmp_path, "We set recompute_granularity: full but it has no effect.\n" + OOM_ONLY)
    assert d.evidence.facts["log"]["symptoms"] == ["recompute_no_effect"]
    assert seen == [["recompute_no_effect"]]


# ----- the corpus's decidable labels -------------------------------------------------------


def test_every_case_is_labelled_decidable_with_a_reason():
    for path in sorted(CASES.glob("*.yaml")):
        case = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(case.get("decidable"), bool), path.name
        assert case.get("decidable_why"), path.name
        assert case["decidable_why"].startswith("thin") != case["decidable"], path.name


def test_labels_are_what_the_rule_proposes():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "label_decidable.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout == "", out.stdout  # no case whose label differs from the rule's proposal


def test_benchmark_reports_decidable_and_thin_apart():
    from corpus_scoring import CaseResult, format_table, table

    def case(decidable, verdict, ok, collect_decides=False, conf=0.9):
        r = CaseResult("x", "u", "dev", "fragmentation", "fragmentation", "RK001", ok, ok)
        r.decidable, r.verdict, r.collect_decides, r.confidence = (
            decidable,
            verdict,
            collect_decides,
            conf,
        )
        return r

    results = [
        case(True, "diagnosed", True),
        case(True, "needs_evidence", False, conf=0.5),
        case(False, "needs_evidence", False, True, 0.5),
        case(False, "needs_evidence", False, False, 0.5),
    ]
    v = table(results)["dev_verdict"]
    assert v["decidable"] == {"n": 2, "top1": 1, "diagnosed": 1}
    assert v["thin"]["needs_evidence"] == 2 and v["thin"]["needs_evidence_deciding_collect"] == 1
    assert v["confident"] == {"n": 1, "right": 1}
    assert "thin, needs_evidence + deciding collect 1/2 (50%)" in format_table(table(results))


def test_an_estimate_of_a_layout_the_files_cannot_run_decides_nothing():
    # A skill trial: NeMo 2.0's llama31_405b.py on 72 nodes (576 GPUs, a replica of 256): the
    # reader said "this layout cannot run as written" in its warnings, and the doctor went on
    # with findings on a data-parallel size of 1 that cannot exist. The verdict says so and
    # asks for the layout the job ran with. (Here: llama3_70b.py, TP 4 x PP 4 x CP 2 = 32, on
    # 3 nodes of 8, and the trial's OOM.)
    from pathlib import Path

    from rule_helpers import run

    recipe = (
        Path(__file__).parent
        / "sources/corpus/nemo2_checkout/nemo/collections/llm/recipes/llama3_70b.py"
    )
    d = run(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.11 GiB of which 1.48 GiB is free. Including non-PyTorch memory, "
        "this process has 77.61 GiB memory in use. Of the allocated memory 73.50 GiB is "
        "allocated by PyTorch, and 2.55 GiB is reserved by PyTorch but unallocated.\n",
        inputs=[f"{recipe}::pretrain_recipe(num_nodes=3)"],
        gpu_memory_gb=79.11,
    )
    assert any("cannot run as written" in w for w in d.evidence.read["warnings"])
    assert d.verdict.verdict == "needs_evidence"
    assert "rests on the estimate of a layout the files cannot run" in d.verdict.why


def test_measured_runs_without_an_oom_are_not_asked_for_an_oom(tmp_path):
    """A skill trial: an ablation table with no OOM got a collect list of the OOM message, a
    traceback and nvidia-smi; what decides measured settings is their interleaved repeats."""
    from test_judge_tables import CI_FULL, CI_NONE

    lines = ["recompute,iteration,iteration-time"]
    for spec, values in (("none", CI_NONE), ("full:uniform:1", CI_FULL)):
        lines += [f"{spec},{i},{v}" for i, v in enumerate(values.split(), start=2)]
    table = tmp_path / "ci.csv"
    table.write_text("\n".join(lines) + "\n")
    doc = diagnose(collect(experiments=str(table))).to_json()
    ids = [c["id"] for c in doc["collect"]]
    assert doc["findings"][0]["category"] == "recompute_overhead"
    assert "repeats" in ids and not {"oom_message", "traceback", "nvidia_smi"} & set(ids)


# https://github.com/NVIDIA-NeMo/RL/issues/2814 : a GRPO job's OOM raised in its vLLM worker
# (the weight refit), the message's first line verbatim
VLLM_WORKER_OOM = (
    "Error in VllmInternalWorkerExtension.update_weights_via_ipc_zmq: CUDA out of memory. "
    "Tried to allocate 448.00 MiB. GPU 0 has a total capacity of 79.11 GiB of which 431.38 MiB "
    "is free. Including non-PyTorch memory, this process has 57.04 GiB memory in use. Process "
    "3130101 has 21.51 GiB memory in use. Of the allocated memory 57.87 GiB is allocated by "
    "PyTorch, with 12.23 GiB allocated in private pools (e.g., CUDA Graphs), and 477.92 MiB is "
    "reserved by PyTorch but unallocated.\n"
)


def test_an_oom_in_an_rl_job_s_generation_worker_is_out_of_scope(tmp_path):
    # a re-trial: the OOM notebook diagnosed it as the training recipe's own memory
    doc = run(tmp_path, VLLM_WORKER_OOM).to_json()
    assert doc["verdict"] == "out_of_scope" and doc["scope"] == "inference"
    assert doc["evidence"]["oom"][0]["prefix"].startswith("Error in VllmInternalWorkerExtension")


def test_a_slowdown_without_an_oom_is_not_asked_for_an_oom_message(tmp_path):
    # one hypothesis (recompute's cost): the usual deciders join it, but where nothing ran out
    # of memory an OOM message, a memory summary or nvidia-smi decide nothing
    d = run(tmp_path, "Training became about 30% slower after I enabled gradient checkpointing.")
    asked = [c["id"] for c in d.verdict.collect]
    assert asked[0] == "timings" and "versions" in asked
    assert not {"oom_message", "memory_summary", "nvidia_smi", "expandable"} & set(asked)
    # the same words beside an OOM keep the OOM's deciders
    d = run(tmp_path, "Out of memory with gradient checkpointing, and training is slower with it.")
    assert "oom_message" in [c["id"] for c in d.verdict.collect]


def test_no_expandable_segments_rerun_asked_of_a_run_that_has_them(tmp_path):
    # a skill trial: a Megatron-Bridge perf recipe sets PYTORCH_CUDA_ALLOC_CONF=
    # expandable_segments:True, and the doctor still asked for "the same step with" it
    d = run(tmp_path, OOM_ONLY)
    assert "expandable" in [c["id"] for c in d.verdict.collect]
    d = run(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" + OOM_ONLY)
    assert "expandable" not in [c["id"] for c in d.verdict.collect]


def test_memory_that_grows_asks_for_the_step_by_step_figures_first(tmp_path):
    # A skill trial: every leak case got the same OOM collect list (expandable segments,
    # nvidia-smi); what decides a leak from a high peak is the memory after each step, with
    # and without gc.collect(), and two snapshots a few steps apart.
    # https://github.com/pytorch/torchtitan/issues/1467 (verbatim)
    d = run(
        tmp_path,
        "When turn on the activation checkpoint, I saw unexpected memory leaks, and I can "
        "locate the problem that comes from `all_to_all_single_autograd` (I am on PyTorch 2.6, "
        "this op has the same behavior on the latest torch) \n",
    )
    assert d.verdict.verdict == "needs_evidence"
    assert d.verdict.collect[0]["id"] == "memory_series"
    assert "gc.collect()" in d.verdict.collect[0]["what"]


def test_no_oom_in_the_paste_asks_for_no_oom_message(tmp_path):
    # https://github.com/NVIDIA/Megatron-LM/issues/1886 (verbatim): memory that does not go
    # down with core_attn recompute, no OOM. A re-trial got the OOM message, an expandable-
    # segments re-run and the peak twice in its collect list.
    d = run(
        tmp_path,
        "When enabling activation checkpointing (recomputation) for the core_attn module in "
        "Megatron-LM, the overall GPU memory consumption does not decrease as expected.\n"
        "Moreover, the lifetime of Q/K/V tensors seems to be extended, leading to higher peak "
        "memory usage during forward + backward.\n",
    )
    ids = [c["id"] for c in d.verdict.collect]
    assert "oom_message" not in ids and "expandable" not in ids
    assert len(ids) == len(set(ids)) and "memory_by_step" in ids
    f = d.findings[0]
    assert f.rule == "RK020" and "nothing pasted says which it is" in f.evidence


def test_runs_that_did_not_fail_are_asked_for_their_peaks_not_a_failure(tmp_path):
    # torchtitan PR 808 (tests/data/rules/titan-808-float8-step-memory.txt,
    # https://github.com/pytorch/torchtitan/pull/808): three runs' step lines, nothing failed.
    # A skill trial was asked for "the full OOM message", "the full traceback" and nvidia-smi
    # "just before the failing step"; the step lines were read as allocated memory (torchtitan
    # prints max reserved) and the GPU's size they state (47.65 GiB is 50.16%) went unused.
    paste = Path(__file__).parent / "data" / "rules" / "titan-808-float8-step-memory.txt"
    d = diagnose(collect(logs=[str(paste)]))
    ids = [i["id"] for i in d.verdict.collect]
    assert "traceback" not in ids and "oom_message" not in ids, ids
    assert all("failing step" not in i["what"] for i in d.verdict.collect)
    assert "Nothing in it failed" in d.summary and "full OOM message" not in d.summary
    assert "3 step line(s) with memory" in d.summary
    series = d.evidence.facts["log"]["memory_series"]
    assert [kind for _, _, kind, _ in series] == ["reserved"] * 3
    assert any("95.0 GiB" in a for a in d.assumptions)
