"""Achieved TFLOP/s and MFU of a training step, against the device's measured matmul ceiling.

MFU (model FLOPs utilisation) counts the model's FLOPs only (forward + backward, no
recompute: `memory.flops.step_flops`), so recompute lowers it; hardware FLOP/s adds the re-run
forward (`hardware_flops_per_step`). The ceiling is measured, not a datasheet figure: the
rate of one large dense GEMM in the run's dtype on the run's device (`matmul_ceiling`), taken
once per run. The FLOP model's predicted overhead of a recompute setting is its executed
recompute FLOPs over the step's executed FLOPs (`recompute_flops_fraction`: causal flash/fused
attention costs half the s x s), to compare with a measured step-time ratio.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from .config import Config
from .memory.flops import hardware_flops_per_step, recompute_flops_fraction, step_flops


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    size: int = 8192,
    repeats: int = 20,
) -> float:
    """Dense matmul rate in TFLOP/s: the median of `repeats` timed [size, size] x [size, size]
    products after a warm-up (2·size³ FLOPs each)."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    rates = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        rates.append(2 * size**3 / (time.perf_counter() - start) / 1e12)
    return statistics.median(rates)


@dataclass(frozen=True)
class Throughput:
    model_tflops: float  # model FLOPs per second (no recompute), TFLOP/s
    hardware_tflops: float  # FLOPs executed per second (recompute included), TFLOP/s
    mfu: float  # model_tflops / ceiling
    hfu: float  # hardware_tflops / ceiling
    predicted_overhead: float  # executed recompute FLOPs / executed FLOPs of the step


def throughput(
    config: Config, step_time_s: float, ceiling_tflops: float, micro_batches: int = 1
) -> Throughput:
    """Throughput of one step of `config` (its recompute settings) that took `step_time_s`
    for `micro_batches` micro-batches, on a device whose matmul ceiling is `ceiling_tflops`."""
    if step_time_s <= 0 or ceiling_tflops <= 0:
        raise ValueError("step time and ceiling must be positive")
    model = step_flops(config) * micro_batches / step_time_s / 1e12
    hardware = hardware_flops_per_step(config) * micro_batches / step_time_s / 1e12
    return Throughput(
        model_tflops=model,
        hardware_tflops=hardware,
        mfu=model / ceiling_tflops,
        hfu=hardware / ceiling_tflops,
        predicted_overhead=recompute_flops_fraction(config),
    )
