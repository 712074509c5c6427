# ruff: noqa: E501  (verbatim log lines are longer than 100 characters and must stay whole)
"""Tests for recompute_kit.doctor.evidence: sizes, out-of-memory messages of every generation
and device. Logs, tracebacks, configs, experiments, memory stats and robustness have files of
their own (tests/test_evidence_*.py); the real texts are in tests/evidence_texts.py.

Every parser input below is real text: verbatim blocks from shared/reference/real-formats.md and
the seeds (each with the URL its block names), output of the real PyTorch code run here or on a
GPU (tests/data/evidence, made by make_gpu_samples.py), or lines printed by running the quoted
Megatron/NeMo format code. The only changes made to real text are noise: rank prefixes, ANSI
colours, timestamps, hard wraps and truncation.
"""

from __future__ import annotations

import textwrap

import pytest
from evidence_texts import (
    ARGS_NCCL_743,
    GPU_OOMS,
    MLM_756_ITERS,
    NEMO_14850,
    OOM_CASES,
    OOM_FIELDS,
    OOM_GEN1,
    OOM_GEN3,
    OOM_GEN5,
    OOM_GEN6,
    OOM_MESSAGES,
    GiB,
    MiB,
    all_parsers,
    check_oom,
    nbytes,
)

from recompute_kit.doctor.evidence import (
    clean_line,
    parse_log,
    parse_oom,
    parse_size,
)

# =============================================================================================
# Sizes and line cleaning
# =============================================================================================


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("12.50 MiB", None, 13107200),
        ("10.92 GiB", None, round(10.92 * GiB)),
        ("512 bytes", None, 512),
        ("1.5 KiB", None, 1536),
        ("3 GB", None, 3_000_000_000),
        ("58.8", "GB", 58_800_000_000),
        ("58.8 (OOM rank0)", "GB", 58_800_000_000),
        ("0 bytes", None, 0),
        ("1024.00 GiB", None, 1024 * GiB),
        ("58.8", None, None),
        ("twelve MiB", None, None),
        ("12 apples", None, None),
        ("", None, None),
        ("-1 GiB", None, None),
    ],
)
def test_parse_size(text, unit, expected):
    assert parse_size(text, unit) == expected


def test_clean_line_strips_noise_but_keeps_indentation():
    # ex-mlm-756-iters (https://github.com/NVIDIA/Megatron-LM/issues/756): timestamp prefix
    line = MLM_756_ITERS.splitlines()[0]
    assert clean_line(line).startswith("iteration       71/     100 |")
    # oom-msswift-9191 (https://github.com/modelscope/ms-swift/issues/9191): [rank97]:
    assert clean_line(OOM_GEN6.strip()).startswith("torch.OutOfMemoryError: CUDA out")
    # ex-nemo-14850 (https://github.com/NVIDIA-NeMo/Speech/issues/14850): srun's " 0: "
    assert clean_line(NEMO_14850.splitlines()[0]).startswith("Training epoch 0, iteration 8/29")
    assert clean_line(NEMO_14850.splitlines()[1]) == ""
    # noise: ANSI colours, torchrun's [default0]:, NeMo's logging prefix, ISO timestamps
    assert clean_line("\x1b[1;31m" + OOM_MESSAGES["gen5"] + "\x1b[0m") == OOM_MESSAGES["gen5"]
    assert clean_line("[default3]:[rank3]: " + OOM_MESSAGES["gen1"]) == OOM_MESSAGES["gen1"]
    stamp = "[NeMo I 2025-01-01 12:00:00 nemo_logging:393] "
    assert clean_line(stamp + OOM_MESSAGES["gen2"]) == OOM_MESSAGES["gen2"]
    assert clean_line("2025-01-01 12:00:00.123 " + OOM_MESSAGES["gen2"]) == OOM_MESSAGES["gen2"]
    assert clean_line("[2025-01-01 12:00:00,123] " + OOM_MESSAGES["gen2"]) == OOM_MESSAGES["gen2"]
    # ex-args-nccl-743 (https://github.com/NVIDIA/nccl/issues/743): indentation survives
    arg = ARGS_NCCL_743.splitlines()[0]
    assert clean_line("[rank0]: " + arg) == arg


# =============================================================================================
# Out-of-memory messages
# =============================================================================================


@pytest.mark.parametrize("name", list(OOM_CASES))
def test_oom_every_generation(name):
    """Sources: gen1 https://github.com/pytorch/pytorch/issues/16417 (title), gen2
    https://github.com/microsoft/unilm/issues/137, gen3
    https://github.com/NVIDIA/Megatron-LM/issues/525, gen4
    https://github.com/pytorch/pytorch/pull/99699 (hard-wrapped as posted), gen5
    https://github.com/pytorch/pytorch/issues/16417 (comment), gen6
    https://github.com/modelscope/ms-swift/issues/9191, gen7: real tracebacks from torch 2.11."""
    text, generation, expected = OOM_CASES[name]
    events = parse_oom(text)
    assert len(events) == 1
    check_oom(events[0], generation, expected)
    assert "out of memory" in events[0].line


def test_oom_exception_prefixes_and_line():
    # gen1/gen2 print RuntimeError, gen3/gen4 torch.cuda.OutOfMemoryError, gen6 torch.OutOfMemoryError
    assert parse_oom(OOM_GEN1)[0].line.startswith("RuntimeError: CUDA out of memory.")
    assert parse_oom(OOM_GEN3)[0].line.startswith("torch.cuda.OutOfMemoryError: CUDA out")
    assert parse_oom(OOM_GEN6)[0].line.startswith("torch.OutOfMemoryError: CUDA out")
    # the message alone, without any exception type
    bare = OOM_MESSAGES["gen5"].split(": ", 1)[1]
    check_oom(parse_oom(bare)[0], *OOM_CASES["gen5"][1:])


def test_oom_gen7_traceback_gives_error_event_with_frame():
    # real traceback of torch 2.11 (tests/data/evidence/cuda_oom.json, variant "plain")
    evidence = parse_log(GPU_OOMS["plain"]["traceback"])
    assert len(evidence.oom) == 1
    (error,) = evidence.errors
    assert error.type == "torch.OutOfMemoryError" == GPU_OOMS["plain"]["type"]
    assert error.message == GPU_OOMS["plain"]["message"]
    assert len(error.frames) == 1 and error.frames[0].endswith("make_gpu_samples.py:28 in _oom")


def test_oom_hip_same_format():
    # ROCm builds print the same allocator message, hipified (CUDA -> HIP in the text and the
    # env var). No verbatim ROCm text is in the references: the real gen5 message is
    # hipified here the way the ROCm build does it.
    hip = OOM_MESSAGES["gen5"].replace("CUDA out of memory", "HIP out of memory")
    hip = hip.replace("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
    (event,) = parse_oom("[rank2]: " + hip)
    assert event.backend == "hip" and event.rank == 2
    check_oom(event, "gen5_expandable", OOM_CASES["gen5"][2])
    assert parse_oom(OOM_GEN5)[0].backend == "cuda"


def test_oom_outside_the_caching_allocator_and_launcher_prefixes():
    """Real lines quoted verbatim in the doctor's scenario cases (tests/scenarios/*.yaml; each
    case's `why` says so), from the public threads named below."""
    # https://github.com/nvidia-cosmos/cosmos-rl/pull/731: NCCL's own cudaMalloc fails
    nccl = (
        "include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
    )
    evidence = parse_log(nccl)
    assert [o.generation for o in evidence.oom] == ["nccl_cuda_failure"]
    assert not evidence.oom[0].truncated
    assert [e.type for e in evidence.errors] == ["ncclUnhandledCudaError"]
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/3767: a Triton kernel launch
    (oom,) = parse_oom("[rank52]: RuntimeError: Triton Error [CUDA]: out of memory")
    assert (oom.generation, oom.rank, oom.truncated) == ("triton_cuda", 52, False)
    # https://github.com/chnsh/DCRNN_PyTorch/issues/6: no space after "RuntimeError:"
    text = (
        "RuntimeError:CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.80 GiB total "
        "capacity; 4.36 GiB already allocated; 6.69 MiB free; 4.63 GiB reserved in total by "
        "PyTorch)"
    )
    evidence = parse_log(text)
    check_oom(
        evidence.oom[0],
        "gen2_reserved",
        dict(
            requested_bytes=nbytes(20.00, MiB),
            device=0,
            total_bytes=nbytes(5.80, GiB),
            allocated_bytes=nbytes(4.36, GiB),
            free_bytes=nbytes(6.69, MiB),
            reserved_bytes=nbytes(4.63, GiB),
            reserved_unallocated_bytes=nbytes(4.63, GiB) - nbytes(4.36, GiB),
        ),
    )
    assert [e.type for e in evidence.errors] == ["RuntimeError"]
    # https://github.com/hiyouga/LlamaFactory/issues/747: DeepSpeed's pdsh prefixes every line
    # with the host; a (noise) gen6 OOM between its verbatim lines stays one record
    deepspeed = [
        "192.168.0.32: /mnt/anaconda/envs/llama_etuning/lib/python3.10/site-packages/transformers/optimization.py:411: FutureWarning: This implementation of AdamW is deprecated and will be removed in a future version. Use the PyTorch implementation torch.optim.AdamW instead, or set `no_deprecation_warning=True` to disable this warning",
        "192.168.0.32:   warnings.warn(",
        "192.168.0.32: " + OOM_MESSAGES["gen6"][:75],
        "192.168.0.32: [2023-08-31 11:58:27,249] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 1612505",
    ]
    evidence = parse_log("\n".join(deepspeed))
    (oom,) = evidence.oom
    assert oom.requested_bytes == nbytes(48.00, MiB) and oom.truncated
    assert "Killing" not in oom.line
    (warning, error) = evidence.errors
    assert (warning.type, warning.frames) == (
        "FutureWarning",
        [
            "/mnt/anaconda/envs/llama_etuning/lib/python3.10/site-packages/transformers/optimization.py:411"
        ],
    )
    assert error.type == "torch.OutOfMemoryError"


NOISES = {
    "rank_prefix": lambda m: "[rank3]: " + m,
    "srun_prefix": lambda m: " 3: " + m,
    "ansi": lambda m: "\x1b[31m" + m.replace(": CUDA", "\x1b[0m: \x1b[1mCUDA", 1) + "\x1b[0m",
    "timestamp": lambda m: "[2025-01-01 12:00:00,123] [rank3]: " + m,
    "wrap80_columns": lambda m: "\n".join(m[i : i + 80] for i in range(0, len(m), 80)),
    "wrap80_words": lambda m: "\n".join(textwrap.wrap(m, 80)),
    "wrap80_each_line_prefixed": lambda m: "\n".join(
        "[rank3]: " + m[i : i + 80] for i in range(0, len(m), 80)
    ),
    "wrap40_ansi_in_log": lambda m: (
        MLM_756_ITERS.splitlines()[0]
        + "\n\x1b[31m"
        + "\n".join(textwrap.wrap(m, 40))
        + "\x1b[0m\n"
        + MLM_756_ITERS.splitlines()[1]
    ),
    "crlf_wrap": lambda m: "\r\n".join(textwrap.wrap(m, 70)) + "\r\n",
}


@pytest.mark.parametrize("noise", list(NOISES))
@pytest.mark.parametrize("name", list(OOM_CASES))
def test_oom_with_noise(name, noise):
    _, generation, expected = OOM_CASES[name]
    text = NOISES[noise](OOM_MESSAGES[name])
    events = parse_oom(text)
    assert len(events) == 1, text
    expected = {k: v for k, v in expected.items() if k != "rank"}
    check_oom(events[0], generation, expected)
    if "rank" in noise or "prefixed" in noise or "srun" in noise or "timestamp" in noise:
        assert events[0].rank == 3


@pytest.mark.parametrize("name", list(OOM_CASES))
def test_oom_truncated_at_every_position(name):
    """A message cut anywhere: no parser raises, and every field parse_oom gives is the full
    message's value."""
    message = OOM_MESSAGES[name]
    full = parse_oom(message)[0]
    for cut in range(len(message)):
        all_parsers(message[:cut])
        events = parse_oom(message[:cut])
        assert len(events) <= 1
        for event in events:
            for field in OOM_FIELDS:
                value = getattr(event, field)
                assert value is None or value == getattr(full, field), (cut, field)
            if cut < len(message) * 0.5:
                assert event.truncated


def test_oom_truncated_then_next_record():
    # a cut message followed by a log line: the OOM keeps its partial fields, the line is read
    cut = OOM_MESSAGES["gen6"][:120]
    assert cut.endswith("139.81 GiB of whi")
    evidence = parse_log(cut + "\n" + MLM_756_ITERS)
    assert len(evidence.oom) == 1 and evidence.oom[0].truncated
    assert evidence.oom[0].requested_bytes == nbytes(48.00, MiB)
    assert evidence.oom[0].total_bytes == nbytes(139.81, GiB)
    assert evidence.oom[0].free_bytes is None
    assert [it.iteration for it in evidence.iterations] == [71, 72, 73]
    assert any("truncated" in note for note in evidence.notes)


def test_oom_many_ranks_interleaved():
    # noise: the gen6 message printed by four ranks, lines interleaved
    lines = [f"[rank{r}]: " + OOM_MESSAGES["gen6"] for r in (5, 1, 7, 3)]
    events = parse_oom("\n".join(lines))
    assert [e.rank for e in events] == [5, 1, 7, 3]
    assert {e.requested_bytes for e in events} == {nbytes(48.00, MiB)}


def test_oom_advice_is_not_an_env_setting():
    # the gen5/gen6 messages *advise* PYTORCH_CUDA_ALLOC_CONF=...; that is not a setting seen
    assert parse_log(OOM_GEN5 + OOM_GEN6).env == {}
    # seeds/001 mentions the setting as text: it is recorded
    evidence = parse_log("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert evidence.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


# =============================================================================================
# Other devices' and old PyTorch's out-of-memory wordings (issue 13), verbatim from the threads
# =============================================================================================


def test_oom_xpu_and_npu_wordings():
    # https://github.com/intel/intel-extension-for-pytorch/issues/629 (IPEX, old layout, no
    # "free" field)
    (ipex,) = parse_oom(
        "RuntimeError: XPU out of memory. Tried to allocate 1.71 GiB (GPU 0; 15.56 GiB total "
        "capacity; 176.00 MiB already allocated; 176.00 MiB reserved in total by PyTorch)"
    )
    assert (ipex.backend, ipex.device, ipex.free_bytes) == ("xpu", 0, None)
    assert ipex.total_bytes == nbytes(15.56, GiB) and ipex.reserved_bytes == nbytes(176.0, MiB)
    # the same thread: IPEX's per-allocation cap, printed with "(GPU  0;" (two spaces)
    (cap,) = parse_oom(
        "RuntimeError: Current platform can NOT allocate memory block with size larger than "
        "4GB! Tried to allocate 6.85 GiB (GPU  0; 15.56 GiB total capacity; 0 bytes already "
        "allocated; 0 bytes reserved in total by PyTorch)"
    )
    assert (cap.backend, cap.device, cap.allocation_limit_bytes) == ("xpu", 0, 4 * GiB)
    # https://github.com/intel/torch-xpu-ops/issues/3011 (torch.xpu 2.12: the 2.1+ layout with
    # its own advice), rank-prefixed and hard-wrapped here the way torchrun prints it
    message = (
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a "
        "total capacity of 5.65 GiB of which 5.65 GiB is free. Of the allocated memory 195.50 "
        "KiB is allocated by PyTorch, and 1.81 MiB is reserved by PyTorch but unallocated. "
        "Please use `empty_cache` to release all unoccupied cached memory."
    )
    (xpu,) = parse_oom(message)
    assert (xpu.generation, xpu.backend, xpu.truncated) == ("xpu_empty_cache", "xpu", False)
    assert xpu.reserved_unallocated_bytes == nbytes(1.81, MiB)
    wrapped = "\n".join("[rank1]: " + message[i : i + 70] for i in range(0, len(message), 70))
    (again,) = parse_log(wrapped + "\n[rank1]: next line").oom
    assert (again.rank, again.requested_bytes) == (1, xpu.requested_bytes)
    # https://github.com/vllm-project/vllm-ascend/issues/19 (torch_npu, "current active")
    (npu,) = parse_oom(
        "RuntimeError: NPU out of memory. Tried to allocate 22.00 MiB (NPU 0; 60.97 GiB total "
        "capacity; 10.24 GiB already allocated; 10.24 GiB current active; 19.52 MiB free; 10.65 "
        "GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation."
    )
    assert (npu.backend, npu.generation) == ("npu", "gen3_max_split")
    assert npu.free_bytes == nbytes(19.52, MiB)
    # 60.97 - 0.02 free - 10.65 reserved: 50.3 GiB held outside this process's allocator
    assert 50.2 * GiB < npu.held_elsewhere_bytes < 50.4 * GiB


def test_oom_pytorch_0_3_and_0_4_thc_message():
    # https://github.com/jiesutd/NCRFpp/issues/121 and https://github.com/chenyuntc/
    # pytorch-best-practice/issues/3 (no spaces): THC's error, no sizes at all
    for line in (
        "RuntimeError: cuda runtime error (2) : out of memory at "
        "/pytorch/torch/lib/THC/generic/THCStorage.cu:58",
        "RuntimeError:cuda runtime error(2):out of memory",
    ):
        evidence = parse_log(line)
        (oom,) = evidence.oom
        assert (oom.generation, oom.truncated, oom.requested_bytes) == (
            "thc_runtime_error",
            False,
            None,
        )
        assert evidence.errors[0].type == "RuntimeError"


def test_oom_gen1_cached_is_reserved_but_unallocated():
    # https://github.com/BaberMuyu/2020CCF-NER/issues/6 (PyTorch <= 1.4): "cached" is what the
    # allocator holds unallocated, so only 0.86 GiB of the 7.79 GiB GPU is outside PyTorch.
    (oom,) = parse_oom(
        "RuntimeError: CUDA out of memory. Tried to allocate 294.00 MiB (GPU 0; 7.79 GiB total "
        "capacity; 6.27 GiB already allocated; 61.62 MiB free; 617.88 MiB cached)"
    )
    assert oom.reserved_unallocated_bytes == nbytes(617.88, MiB)
    assert oom.reserved_bytes == nbytes(6.27, GiB) + nbytes(617.88, MiB)
    assert 0.8 * GiB < oom.held_elsewhere_bytes < 0.9 * GiB


def test_pasted_settings_command_line_and_yaml():
    from recompute_kit.doctor.evidence.pasted import parse_pasted_settings

    # https://github.com/openai/improved-diffusion/issues/3: flags inside shell variables
    flat = parse_pasted_settings(
        'MODEL_FLAGS="--image_size 256 --num_channels 128 --num_res_blocks 2"\n'
        'TRAIN_FLAGS="--lr 1e-4 --batch_size 4"\n'
        "mpiexec -n 4 python scripts/image_train.py --data_dir /home/ubuntu/custom-data "
        "$MODEL_FLAGS $TRAIN_FLAGS\n"
    )
    assert flat["image_size"] == 256 and flat["batch_size"] == 4
    # https://github.com/hiyouga/LlamaFactory/issues/5977: a YAML block with comment lines
    flat = parse_pasted_settings(
        "### model\nmodel_name_or_path: /data/llm/Meta-Llama-3-8B-Instruct\n\n### method\n"
        "stage: sft\ndo_train: true\nfinetuning_type: full\n"
        "deepspeed: examples/deepspeed/ds_z3_config.json\n"
    )
    assert flat["finetuning_type"] == "full" and flat["do_train"] is True
    # exception lines are not YAML, frames are not flags
    assert parse_pasted_settings(OOM_GEN1) == {}


def test_the_process_list_says_when_this_process_is_among_its_entries():
    # https://github.com/hiyouga/LLaMA-Factory/issues/1936 (PyTorch 2.1's message, verbatim):
    # five "Process <pid> has" entries and no "this process has" line: the failing rank's own
    # 21.98 GiB is one of them, so the sum is not other processes' alone.
    from recompute_kit.doctor.evidence.oom import _oom_event

    msg = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 136.00 MiB. GPU 0 "
        "has a total capacty of 23.65 GiB of which 93.81 MiB is free. Process 62201 has 398.00 "
        "MiB memory in use. Process 62203 has 398.00 MiB memory in use. Process 62204 has "
        "398.00 MiB memory in use. Process 62200 has 21.98 GiB memory in use. Process 62202 "
        "has 398.00 MiB memory in use. Of the allocated memory 21.51 GiB is allocated by "
        "PyTorch, and 2.30 MiB is reserved by PyTorch but unallocated."
    )
    event = _oom_event(msg, None)
    # the entries add up to the 23.56 GiB in use and one alone holds PyTorch's reserve
    # (21.51 GiB + 2.30 MiB): that one is this process, the four of 398 MiB are the others
    assert event.listed_self is True and event.process_bytes == nbytes(21.98, GiB)
    assert event.other_processes_bytes == 4 * nbytes(398.00, MiB)
    # a list that does not add up to the memory in use (a process not listed): not decided
    short = msg.replace(
        "Process 62200 has 21.98 GiB memory in use. ", "Process 62200 has 23.00 GiB memory in use. "
    )
    assert _oom_event(short, None).process_bytes is None


def test_a_lone_process_entry_is_this_process():
    # A container's OOM lists its own process by PID ("Process 2670 has ...") with no "this
    # process" line: with one entry that is this process, not another one holding the GPU.
    # Verbatim from https://github.com/andimarafioti/florence2-finetuning/issues/17
    lone = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 108.00 MiB. GPU 0 has a total "
        "capacty of 15.89 GiB of which 65.12 MiB is free. Process 2670 has 15.82 GiB memory in "
        "use. Of the allocated memory 15.36 GiB is allocated by PyTorch, and 168.02 MiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory "
        "Management and PYTORCH_CUDA_ALLOC_CONF"
    )
    event = parse_oom(lone)[0]
    assert event.process_bytes == nbytes(15.82, GiB)
    assert event.other_processes_bytes == 0 and event.listed_self
    # two entries (https://github.com/NVIDIA/TransformerEngine/issues/3006): which one is this
    # process is not said, so both stay listed
    two = lone.replace(
        "Process 2670 has 15.82 GiB memory in use.",
        "Process 1720765 has 24.15 GiB memory in use. Process 1726543 has 522.00 MiB memory "
        "in use.",
    )
    event = parse_oom(two)[0]
    assert event.process_bytes is None
    assert event.other_processes_bytes == nbytes(24.15, GiB) + nbytes(522.00, MiB)


def test_a_flag_in_a_markdown_code_span_takes_only_the_spans_words():
    from recompute_kit.doctor.evidence.pasted import parse_pasted_settings

    # https://github.com/NVIDIA/Megatron-LM/pull/403 (the PR's text, verbatim): prose around
    # code spans is not the flags' values, and a value flag alone in a span sets nothing
    flat = parse_pasted_settings(
        "In the new `TransformerConfig`, when `--recompute-granularity` is set, it is checked "
        "whether `--recompute-method` is in allowed the values and not `None`. However, when "
        "`--recompute-granularity selective` is used, `--recompute-method` _must not_ be set "
        "(i.e. it must be `None`) according to `megatron/arguments.py`."
    )
    assert flat == {"recompute_granularity": "selective"}
