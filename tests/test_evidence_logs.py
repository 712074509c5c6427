# ruff: noqa: E501  (verbatim log lines are longer than 100 characters and must stay whole)
"""Training logs (iterations, memory reports, argument dumps) and exceptions, tracebacks and
warnings, read from real text (tests/evidence_texts.py)."""

from __future__ import annotations

import json
import re
import traceback
import warnings

import pytest
from evidence_texts import (
    ARGS_LOCAL_V014_FULL,
    ARGS_MLM_495,
    ARGS_NCCL_743,
    CKPT_DDP,
    CKPT_GRAD_REENTRANT,
    CKPT_KWARGS_REENTRANT,
    CKPT_METADATA,
    CKPT_NO_INPUT_GRAD,
    CKPT_USE_REENTRANT_MISSING,
    DATA,
    MB_PR388,
    MB_PR841,
    MLM_756_ITERS,
    MLM_756_MEMORY,
    MLM_PR5662,
    NEMO1_LAUNCHER_55,
    NEMO_14850,
    TC_BAD_GRANULARITY,
    TC_CPU_OFFLOAD_WITH_RECOMPUTE,
    TC_FULL_NO_METHOD,
    TC_MOE_LAYER_RECOMPUTE_WITH_FULL,
    TC_SELECTIVE_BAD_MODULE,
    MiB,
    nbytes,
)

from recompute_kit.doctor.evidence import (
    parse_log,
)

# =============================================================================================
# Training logs: iterations, memory reports, argument dumps
# =============================================================================================


def test_megatron_iteration_lines():
    # ex-mlm-756-iters: https://github.com/NVIDIA/Megatron-LM/issues/756
    its = parse_log(MLM_756_ITERS).iterations
    assert [(i.iteration, i.total_iterations) for i in its] == [(71, 100), (72, 100), (73, 100)]
    assert [i.elapsed_ms for i in its] == [5361.6, 5470.7, 5829.9]
    assert [i.tflops_per_gpu for i in its] == [243.6, 238.7, 224.0]
    assert [i.loss for i in its] == [1.818812, 1.820313, 1.798953]
    assert its[0].learning_rate == 1.42e-05 and its[0].global_batch_size == 128
    assert its[0].grad_norm == 1.3 and its[0].source == "megatron"


def test_megatron_memory_report_in_mib():
    # ex-mlm-756-memory: https://github.com/NVIDIA/Megatron-LM/issues/756 (v0.x format,
    # unrounded). Megatron divides by 1024*1024 although it prints "MB".
    evidence = parse_log(MLM_756_MEMORY)
    (report,) = evidence.memory
    assert report.rank == 1 and report.iteration == 1 and report.label == "(after 1 iterations)"
    assert report.allocated_bytes == nbytes(54250.97802734375, MiB)
    assert report.max_allocated_bytes == nbytes(54250.98583984375, MiB)
    assert report.reserved_bytes == report.max_reserved_bytes == nbytes(61480.0, MiB)
    assert [i.iteration for i in evidence.iterations] == [2, 3]


def test_megatron_main_iteration_and_memory():
    # ex-mlm-pr5662: https://github.com/NVIDIA/Megatron-LM/pull/5662 (microsecond timestamp,
    # no throughput field, report_memory with 2 decimals)
    evidence = parse_log(MLM_PR5662)
    (it,) = evidence.iterations
    assert (it.iteration, it.elapsed_ms, it.tflops_per_gpu, it.loss) == (20, 744.0, None, 1.020935)
    (report,) = evidence.memory
    assert (report.rank, report.iteration) == (0, 20)
    assert report.allocated_bytes == nbytes(3270.16, MiB)
    assert report.max_allocated_bytes == nbytes(5670.39, MiB)
    assert report.max_reserved_bytes == nbytes(6406.00, MiB)


def test_megatron_bridge_hard_wrapped_log_and_step_time():
    # ex-mb-pr841: https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/841, pasted hard-wrapped
    # (words cut: "number of s / kipped", "max alloca / ted")
    evidence = parse_log(MB_PR841)
    its = evidence.iterations
    assert [i.iteration for i in its] == [10, 20]
    assert [i.elapsed_ms for i in its] == [13212.7, 14260.3]
    assert [i.loss for i in its] == [4.474437, 0.08797448]
    assert [i.global_batch_size for i in its] == [512, 512]
    # "Step Time : 14.26s GPU utilization: 58.2TFLOP/s/GPU" belongs to iteration 20
    assert its[1].tflops_per_gpu == 58.2 and its[1].source == "megatron-bridge"
    assert its[0].tflops_per_gpu is None
    (report,) = evidence.memory
    assert report.allocated_bytes == nbytes(11908.05029296875, MiB)
    assert report.max_allocated_bytes == nbytes(12712.43603515625, MiB)
    assert report.reserved_bytes == report.max_reserved_bytes == nbytes(12954.0, MiB)


def test_megatron_bridge_step_time_alone():
    # ex-mb-pr388: https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/388
    (it,) = parse_log(MB_PR388).iterations
    assert (it.iteration, it.elapsed_ms, it.tflops_per_gpu) == (None, 12780.0, 528.1)
    assert it.source == "megatron-bridge"


def test_megatron_bridge_memory_report_in_gb():
    """fmt-mb-training-log (https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/training/utils/train_utils.py#L1048-L1158):
    the line printed by running its format code on a real memory_stats() (H100)."""
    memory_keys = {  # MEMORY_KEYS, verbatim
        "allocated_bytes.all.current": "mem-allocated-bytes",
        "active_bytes.all.current": "mem-active-bytes",
        "inactive_split_bytes.all.current": "mem-inactive-bytes",
        "reserved_bytes.all.current": "mem-reserved-bytes",
        "allocated_bytes.all.peak": "mem-max-allocated-bytes",
        "active_bytes.all.peak": "mem-max-active-bytes",
        "inactive_split_bytes.all.peak": "mem-max-inactive-bytes",
        "reserved_bytes.all.peak": "mem-max-reserved-bytes",
        "num_alloc_retries": "mem-alloc-retires",
        "allocation.all.current": "mem-allocated-count",
    }
    stats = json.loads((DATA / "memory_stats.json").read_text())
    report = {}  # report_memory(): bytes/1.0e9 to 5 significant digits, 'bytes' -> 'gigabytes'
    for key, name in memory_keys.items():
        if name.endswith("-bytes"):
            report[name.replace("bytes", "gigabytes")] = float(f"{stats[key] / 1.0e9:.5g}")
        else:
            report[name] = stats[key]
    iteration = 10
    memory_string = f"(after {iteration} iterations) memory (GB)"
    for metric, value in report.items():
        memory_string += f" | {metric}: {value}"
    line = "[Rank {}] {}".format(0, memory_string)  # noqa: UP032 - the format code, verbatim

    (mem,) = parse_log(line).memory
    assert mem.source == "megatron-bridge" and mem.iteration == 10 and mem.rank == 0
    gb = report["mem-allocated-gigabytes"]
    assert mem.allocated_bytes == round(gb * 1e9)
    assert abs(mem.allocated_bytes - stats["allocated_bytes.all.current"]) < 1e-4 * 1e9
    assert mem.max_reserved_bytes == round(report["mem-max-reserved-gigabytes"] * 1e9)
    assert mem.inactive_bytes == round(report["mem-inactive-gigabytes"] * 1e9)
    assert mem.alloc_retries == stats["num_alloc_retries"] == 3


def test_megatron_main_memory_report_with_device_memory():
    """fmt-mlm-report-memory-main (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/utils/common_utils.py#L313-L335):
    its format code run with log_device_memory_used on real memory_stats() numbers."""
    stats = json.loads((DATA / "memory_stats.json").read_text())
    mega_bytes = 1024.0 * 1024.0
    string = "(after 5 iterations)" + " memory (MB)"
    string += f" | allocated: {stats['allocated_bytes.all.current'] / mega_bytes:.2f}"
    string += f" | max allocated: {stats['allocated_bytes.all.peak'] / mega_bytes:.2f}"
    string += f" | reserved: {stats['reserved_bytes.all.current'] / mega_bytes:.2f}"
    string += f" | max reserved: {stats['reserved_bytes.all.peak'] / mega_bytes:.2f}"
    string += f" | total device memory used: {812 * 2**20 / mega_bytes:.2f}"
    line = "[Rank {}] {}".format(3, string)  # noqa: UP032 - the format code, verbatim
    (mem,) = parse_log(line).memory
    assert mem.rank == 3 and mem.iteration == 5
    printed = float(f"{stats['allocated_bytes.all.current'] / mega_bytes:.2f}")
    assert mem.allocated_bytes == nbytes(printed, MiB)
    assert mem.device_used_bytes == 812 * 2**20


def test_megatron_theoretical_memory_and_bridge_progress_log():
    """fmt-mlm-theoretical-memory-main (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/theoretical_memory_usage.py#L456-L486)
    and fmt-mb-progress-log (https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/training/train.py#L1237-L1280),
    each printed by its format code."""
    weight_and_optimizer_memory, activation_memory = 18432.5, 30123.25
    total_memory = weight_and_optimizer_memory + activation_memory
    theory = (
        f"Theoretical memory footprints: weight and optimizer={weight_and_optimizer_memory:.2f} MB, "
        f"activation={activation_memory:.2f} MB, total={total_memory:.2f} MB\n"
    )
    saved_ckpt_prefix, step = "Saved checkpoint", 100
    job_throughput, cumulative_throughput = 512.34, 498.0
    num_floating_point_operations_so_far, tokens_so_far = 1.2e18, 3.4e9
    progress = (
        f"{saved_ckpt_prefix}\tIteration: {step}\t"
        f"Job throughput: {job_throughput:.1f} MODEL_TFLOP/s/GPU\t"
        f"Cumulative throughput: {cumulative_throughput:.1f} MODEL_TFLOP/s/GPU\t"
        f"Floating-point operations: {num_floating_point_operations_so_far:.2e}\t"
        f"Tokens (in billions): {tokens_so_far / 10**9:.2f}"
    )
    evidence = parse_log(theory + progress)
    assert evidence.theoretical_memory == {
        "weight_and_optimizer_bytes": int(18432.50 * MiB),
        "activation_bytes": int(30123.25 * MiB),
        "total_bytes": int(48555.75 * MiB),
    }
    (it,) = evidence.iterations
    assert (it.iteration, it.tflops_per_gpu, it.source) == (100, 512.3, "megatron-bridge")


def test_nemo2_progress_lines():
    # ex-nemo-14850: https://github.com/NVIDIA-NeMo/Speech/issues/14850 (srun " 0: " prefixes)
    evidence = parse_log(NEMO_14850)
    its = evidence.iterations
    assert [i.iteration for i in its] == [8, 9, 10, 11]
    assert {i.total_iterations for i in its} == {29}
    assert [i.elapsed_ms for i in its] == [27010.0, 27880.0, 26630.0, 26930.0]
    assert [i.tflops_per_gpu for i in its] == [48.58, 85.8, 85.8, 85.8]
    assert [i.loss for i in its] == [10.22, 10.1, 10.06, 9.924]
    assert its[0].max_memory_reserved_bytes == 57466159104
    assert its[3].max_memory_reserved_bytes == 57675874304
    assert {i.source for i in its} == {"nemo"}
    # a memory report each time the peak changes
    assert [(m.iteration, m.max_reserved_bytes) for m in evidence.memory] == [
        (8, 57466159104),
        (11, 57675874304),
    ]


def test_nemo1_progress_bar():
    # ex-nemo1-launcher-55: https://github.com/NVIDIA/NeMo-Framework-Launcher/issues/55
    (it,) = parse_log(NEMO1_LAUNCHER_55).iterations
    assert (it.iteration, it.total_iterations, it.elapsed_ms, it.loss) == (
        795,
        77225,
        41360.0,
        3.09,
    )


def test_argument_dump_with_header_and_world_sizes():
    # ex-args-local-v014-full: Megatron-LM core_v0.14.0 arguments.py, reproduced
    # (https://github.com/NVIDIA/Megatron-LM/blob/23e00ed0963c35382dfe8a5a94fb3cda4d21e133/megatron/training/arguments.py)
    evidence = parse_log(ARGS_LOCAL_V014_FULL)
    config = evidence.config
    assert config["recompute_granularity"] == "full"
    assert config["recompute_method"] == "uniform"
    assert config["recompute_num_layers"] == 2
    assert config["recompute_modules"] is None
    assert config["distribute_saved_activations"] is False
    assert config["moe_layer_recompute"] is False
    assert config["world_size"] == 8 and config["rank"] == 0 and config["yaml_cfg"] is None
    # from "using world size: 8, data-parallel size: 2, ..."
    assert config["data_parallel_size"] == 2
    assert config["tensor_model_parallel_size"] == 2
    assert config["pipeline_model_parallel_size"] == 2
    assert config["context_parallel_size"] == 1
    (warning,) = evidence.errors
    assert (warning.kind, warning.type) == ("warning", "WARNING")
    assert warning.message.startswith("Setting args.overlap_p2p_comm and args.align_param_gather")


def test_argument_dump_printed_by_megatron_code(capsys):
    """fmt-mlm-print-args-main (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/arguments.py#L1990-L2001):
    _print_args run verbatim (is_rank0 stubbed) on Megatron argument names; a name of 48
    characters or more gets no dots."""
    import argparse
    import enum

    class AttnBackend(enum.Enum):  # megatron.core.transformer.enums.AttnBackend
        flash = 1
        fused = 2
        unfused = 3
        local = 4
        auto = 5

    def is_rank0():
        return True

    def _print_args(title, args):
        """Print arguments."""
        if is_rank0():
            print(f"------------------------ {title} ------------------------", flush=True)
            str_list = []
            for arg in vars(args):
                dots = "." * (48 - len(arg))
                str_list.append("  {} {} {}".format(arg, dots, getattr(args, arg)))  # noqa: UP032 - verbatim
            for arg in sorted(str_list, key=lambda x: x.lower()):
                print(arg, flush=True)
            print(f"-------------------- end of {title} ---------------------", flush=True)

    args = argparse.Namespace(
        recompute_granularity="selective",
        recompute_modules=["core_attn", "mlp"],
        recompute_num_layers=None,
        num_experts=64,
        attention_backend=AttnBackend.auto,
        num_microbatches_with_partial_activation_checkpoints=None,
        lr=0.00015,
    )
    _print_args("arguments", args)
    config = parse_log(capsys.readouterr().out).config
    assert config == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "mlp"],
        "recompute_num_layers": None,
        "num_moe_experts": 64,
        "attention_backend": "auto",
        "num_microbatches_with_partial_activation_checkpoints": None,
        "lr": 0.00015,
    }


def test_argument_dump_fragments_without_header():
    # ex-args-mlm-495 (https://github.com/NVIDIA/Megatron-LM/issues/495), 6-space indent
    config = parse_log(ARGS_MLM_495).config
    assert config["hidden_size"] == 5120 and config["kv_channels"] == 128
    assert config["init_method_std"] == 0.02 and config["hidden_dropout"] == 0.1
    assert config["initial_loss_scale"] == 4294967296
    assert config["group_query_attention"] is False and config["lazy_mpu_init"] is None
    assert config["load"] == "<LOAD_PATH>"
    # ex-args-nccl-743 (https://github.com/NVIDIA/nccl/issues/743)
    config = parse_log(ARGS_NCCL_743).config
    assert config["lr"] == 0.0001 and config["lr_decay_style"] == "linear"
    assert config["loss_scale"] is None and config["lr_warmup_fraction"] == 0.01
    assert len(config) == len(ARGS_NCCL_743.splitlines())


# =============================================================================================
# Exceptions, tracebacks and warnings
# =============================================================================================

CKPT_CASES = [
    # (block, [(kind, type, message start)])
    (
        CKPT_GRAD_REENTRANT,
        [("exception", "RuntimeError", "When use_reentrant=True, torch.utils.checkpoint is")],
    ),
    (
        CKPT_NO_INPUT_GRAD,
        [
            ("warning", "UserWarning", "None of the inputs have requires_grad=True."),
            ("exception", "RuntimeError", "element 0 of tensors does not require grad"),
        ],
    ),
    (
        CKPT_USE_REENTRANT_MISSING,
        [("warning", "UserWarning", "torch.utils.checkpoint: the use_reentrant parameter")],
    ),
    (
        CKPT_METADATA,
        [
            (
                "exception",
                "torch.utils.checkpoint.CheckpointError",
                "torch.utils.checkpoint: Recomputed values for the following tensors have "
                "different metadata",
            )
        ],
    ),
    (CKPT_KWARGS_REENTRANT, [("exception", "ValueError", "Unexpected keyword arguments: scale")]),
    (CKPT_DDP, [("exception", "RuntimeError", "Expected to mark a variable ready only once.")]),
]


@pytest.mark.parametrize(("block", "expected"), CKPT_CASES)
def test_checkpoint_errors_and_warnings(block, expected):
    # ckpt-local-*: reproduced with the public PyTorch code on CPU (real-formats.md)
    errors = parse_log(block).errors
    got = [
        (e.kind, e.type, e.message[: len(m)])
        for e, (_, _, m) in zip(errors, expected, strict=False)
    ]
    assert got == expected
    assert len(errors) == len(expected)


def test_checkpoint_metadata_error_keeps_its_details():
    # ckpt-local-metadata: the message continues over lines until the blank line
    (error,) = parse_log(CKPT_METADATA).errors
    assert error.details.splitlines()[0] == "tensor at position 0:"
    assert "recomputed metadata: {'shape': torch.Size([2, 3])" in error.details
    assert "Tip:" not in error.details
    # the DDP error's second line
    (error,) = parse_log(CKPT_DDP).errors
    assert error.details.startswith("Parameter at index 1 with name block.bias")


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            TC_FULL_NO_METHOD,
            [
                (
                    "ValueError",
                    'Using recompute_granularity: full so recompute_method must be "block" or "uniform"',
                    2,
                )
            ],
        ),
        (
            TC_BAD_GRANULARITY,
            [
                (
                    "ValueError",
                    'When using recompute_granuarlity: partial must be "full"or "selective".',
                    2,
                )
            ],
        ),
        (
            TC_CPU_OFFLOAD_WITH_RECOMPUTE,
            [
                (
                    "ValueError",
                    "CPU offloading does not work when activation recomputation is enabled",
                    2,
                )
            ],
        ),
        (
            TC_SELECTIVE_BAD_MODULE,
            [
                (
                    "AssertionError",
                    "Invalid choices for recompute_modules: {'attention'}. Allowed modules are: {'mlp', 'shared_experts', 'mla_up_proj', 'core_attn', 'moe_act', 'layernorm', 'moe'}",
                    1,
                ),
                (
                    "AssertionError",
                    "Invalid choices for recompute_modules: {'attention'}. Allowed modules are: {'mla_up_proj', 'shared_experts', 'mhc', 'layernorm', 'core_attn', 'moe', 'gdp_in_proj', 'gdp_qkv', 'mlp', 'gdn_norm_out', 'moe_act'}",
                    1,
                ),
            ],
        ),
        (
            TC_MOE_LAYER_RECOMPUTE_WITH_FULL,
            [
                (
                    "ValueError",
                    "Do not set --moe-layer-recompute with full recompute granularity.   [warnings: --moe-layer-recompute is deprecated. Use --recompute-granularity selective --recompute-modules moe_layer instead.]",
                    2,
                )
            ],
        ),
    ],
)
def test_megatron_validation_messages(block, expected):
    # tc-measured-*: TransformerConfig validation, measured on core_v0.14.0 and main
    # (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030)
    errors = parse_log(block).errors
    assert [(e.type, e.message, e.count) for e in errors] == expected


def _real_checkpoint_tracebacks() -> tuple[str, str]:
    """Run the public torch.utils.checkpoint code into the errors of ckpt-local-kwargs-reentrant
    and ckpt-local-grad-reentrant, chained both ways; return Python's own tracebacks."""
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    first: ValueError | None = None
    try:
        try:
            checkpoint(lambda t, scale: lin(t) * scale, x, use_reentrant=True, scale=2.0)
        except ValueError as exc:
            first = exc
            out = checkpoint(lin, x, use_reentrant=True)
            torch.autograd.grad(out.sum(), x)
    except RuntimeError as second:
        context = traceback.format_exc()
        try:
            raise second from first
        except RuntimeError:
            cause = traceback.format_exc()
    return context, cause


def test_real_chained_tracebacks():
    context, cause = _real_checkpoint_tracebacks()
    for text, chained in ((context, "context"), (cause, "cause")):
        errors = parse_log(text).errors
        assert [e.type for e in errors] == ["ValueError", "RuntimeError"]
        assert errors[0].message == "Unexpected keyword arguments: scale"
        assert errors[1].message.startswith("When use_reentrant=True, torch.utils.checkpoint")
        assert [e.chained for e in errors] == ["", chained]
        # frames, innermost last
        assert re.search(r"torch/utils/checkpoint\.py:\d+ in checkpoint$", errors[0].frames[-1])
        assert re.search(r"torch/utils/checkpoint\.py:\d+ in backward$", errors[1].frames[-1])
        assert "test_evidence_logs.py" in errors[1].frames[0] or "<" in errors[1].frames[0]


def test_tracebacks_of_two_ranks_interleaved():
    # noise: two ranks print the same real traceback, torchrun prefixes, lines interleaved
    context, _ = _real_checkpoint_tracebacks()
    a = ["[rank0]: " + line for line in context.splitlines()]
    b = ["[rank1]: " + line for line in context.splitlines()]
    mixed = [line for pair in zip(a, b, strict=True) for line in pair]
    errors = parse_log("\n".join(mixed)).errors
    assert [(e.type, e.count, e.rank) for e in errors] == [
        ("ValueError", 2, 0),
        ("RuntimeError", 2, 0),
    ]
    single = parse_log(context).errors
    assert [e.frames for e in errors] == [e.frames for e in single]


# https://github.com/pytorch/torchtitan/issues/1971 : Python 3.13's traceback, pasted as an
# indented block (frames at four spaces, the exception line at two), the tail verbatim
INDENTED_TRACEBACK = """\
    File "/home/danvm/.conda/envs/torch/lib/python3.13/site-packages/torch/utils/checkpoint.py", line 1090, in pack_hook
      raise CheckpointError(
      ...<3 lines>...
      )
  torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: trying to save more tensors during recomputation than during the original forward pass.
"""


def test_indented_paste_keeps_its_exception_line():
    (error,) = parse_log(INDENTED_TRACEBACK).errors
    assert error.type == "torch.utils.checkpoint.CheckpointError"
    assert error.message.startswith("torch.utils.checkpoint: trying to save more tensors")
    assert error.frames[-1].endswith("checkpoint.py:1090 in pack_hook")
    # the source line under a frame, indented deeper, stays a source line
    nested = INDENTED_TRACEBACK.replace("  torch.utils", "        torch.utils")
    assert all(e.type != "torch.utils.checkpoint.CheckpointError" for e in parse_log(nested).errors)


def test_real_python_warnings():
    # real warnings, formatted by Python's warnings module: torch's checkpoint without inputs
    # that need grad (ckpt-local-no-input-grad) and the stdlib re module's FutureWarning
    import torch
    from torch.utils.checkpoint import checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint(torch.nn.Linear(4, 4), torch.randn(2, 4), use_reentrant=True)
        re.compile("[[a]]")
    text = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught
    )
    errors = parse_log(text).errors
    assert [(e.kind, e.type) for e in errors] == [
        ("warning", "UserWarning"),
        ("warning", "FutureWarning"),
    ]
    assert errors[0].message == "None of the inputs have requires_grad=True. Gradients will be None"
    assert re.search(r"torch/utils/checkpoint\.py:\d+$", errors[0].frames[0])
    assert errors[1].message == "Possible nested set at position 1"


def test_warning_naming_an_exception_stays_a_warning():
    # noise: NeMo's logging prefix around the real tc-measured-moe-layer warning text, and a
    # Python warning whose message quotes an exception line (ckpt-local-kwargs-reentrant)
    text = (
        "[NeMo W 2025-01-01 12:00:00 arguments:1] --moe-layer-recompute is deprecated. "
        "Use --recompute-granularity selective --recompute-modules moe_layer instead.\n"
        "train.py:3: UserWarning: " + CKPT_KWARGS_REENTRANT
    )
    errors = parse_log(text).errors
    assert [(e.kind, e.type) for e in errors] == [
        ("warning", "WARNING"),
        ("warning", "UserWarning"),
    ]
    assert errors[1].message == CKPT_KWARGS_REENTRANT.strip()
    assert errors[1].frames == ["train.py:3"]


def test_exception_message_does_not_swallow_other_records():
    # a standalone exception line (ckpt-local-kwargs-reentrant), then lines other parsers need
    text = (
        CKPT_KWARGS_REENTRANT
        + ARGS_NCCL_743
        + NEMO1_LAUNCHER_55
        + "PYTORCH_ALLOC_CONF=expandable_segments:True\n"
    )
    evidence = parse_log(text)
    (error,) = evidence.errors
    assert error.details == ""
    assert evidence.config["lr"] == 0.0001
    assert evidence.iterations[0].iteration == 795
    assert evidence.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}


def test_repeated_warnings_are_counted():
    # ckpt-local-use-reentrant-missing printed by 8 ranks
    text = "\n".join(f"[rank{r}]: " + CKPT_USE_REENTRANT_MISSING.strip() for r in range(8))
    (warning,) = parse_log(text).errors
    assert warning.count == 8 and warning.rank == 0


# huggingface/trl issue #2819 (https://github.com/huggingface/trl/issues/2819), its opening
# paragraphs as the search index stores them (the blank quoted lines without their trailing
# space): a sentence names the error
# ("I get a CUDA out of memory error") before the message itself is pasted.
TRL_2819 = """\
> @codeslayed @younesbelkada HELP PLEASE!
>
> If I try to use gradient checkpointing I get this error: RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn
>
> If I try to use_cache = True for this error like @codeslayed  said, I get a CUDA out of memory error. I have tried everything including for efficient memory handling including LoRA configs with peft, bnb configs to load 4 bits, using batching and setting batch_size to 1 etc. Regardless of how small of a model I use, even 0.5B parameters, somehow the GPU VRAM overflows and causes errors. I am using a 4GB RTX 3050 card.
>
> OutOfMemoryError: CUDA out of memory. Tried to allocate 150.00 MiB. GPU 0 has a total capacity of 3.80 GiB of which 130.31 MiB is free. Including non-PyTorch memory, this process has 3.66 GiB memory in use. Of the allocated memory 3.52 GiB is allocated by PyTorch, and 53.87 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""


def test_a_sentence_naming_the_error_is_not_a_second_truncated_message():
    # A skill trial counted two OOMs here, the first with every field empty and a note that it
    # was truncated; a bare head of a real message (no sentence beside a full one) stays one.
    ev = parse_log(TRL_2819)
    assert len(ev.oom) == 1
    assert ev.oom[0].requested_bytes == nbytes(150.00, MiB)
    assert not [n for n in ev.notes if "truncated" in n]
    assert len(parse_log("torch.OutOfMemoryError: CUDA out of memory.\n").oom) == 1
