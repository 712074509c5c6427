"""Measured step times from a training log, for calibrating the step-time model.

Reads Megatron-LM's iteration lines (megatron/training/training.py `training_log`):
`iteration 10/ 100 | consumed samples: ... | elapsed time per iteration (ms): 1234.5 | ...`.
The doctor's log parser reads the same lines with much more; the planner must not import the
doctor, so this is the small piece it needs.
"""

from __future__ import annotations

import re
import statistics

from ..config import ConfigError

_ITER_RE = re.compile(
    r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)"
)
WARMUP_ITERATIONS = 2  # the first steps pay for compilation, allocator growth, NCCL set-up


def iteration_seconds(text: str) -> list[tuple[int, float]]:
    """(iteration, seconds) of every Megatron iteration line in `text`."""
    return [(int(m.group(1)), float(m.group(2)) / 1000) for m in _ITER_RE.finditer(text)]


def measured_step_seconds(text: str, warmup: int = WARMUP_ITERATIONS) -> tuple[float, int]:
    """(median step seconds, iterations used) over the iteration lines after the first
    `warmup` (all of them when there are no more than `warmup`). Megatron averages each line
    over its log interval; the median of those lines is taken."""
    steps = iteration_seconds(text)
    if not steps:
        raise ConfigError(
            "no Megatron iteration lines ('elapsed time per iteration (ms): ...') in the log"
        )
    used = steps[warmup:] if len(steps) > warmup else steps
    return statistics.median(s for _, s in used), len(used)
