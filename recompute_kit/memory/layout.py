"""Which transformer layers each pipeline rank builds (re-exported from
`config.pipeline_layout`, where validation can use them too), and the micro-batches each
stage holds at the peak of its schedule."""

from __future__ import annotations

from ..config import ParallelConfig
from ..config.pipeline_layout import layers_per_stage, pipeline_layout

__all__ = ["layers_per_stage", "micro_batches_in_flight", "pipeline_layout"]


def micro_batches_in_flight(p: ParallelConfig, stage: int, micro_batch_size: int = 1) -> float:
    """Micro-batches whose activations a stage holds at the peak of its schedule, in units of
    the whole stage's layers: 1F1B keeps pp - stage; the interleaved schedule keeps
    (pp - stage - 1) x 2 + (vpp - 1) x pp + 1 chunk-micro-batches, each 1/vpp of the stage
    (Megatron's warm-up count plus the one in flight). Never more than the step has: Megatron
    caps the warm-up at the step's micro-batches (schedules.py, `min(..., num_microbatches)`),
    known where the global batch is (global_batch_size / (micro_batch_size x DP))."""
    pp = p.pipeline_model_parallel_size
    vpp = p.virtual_pipeline_model_parallel_size or 1
    if pp == 1:
        return 1.0
    step = step_micro_batches(p, micro_batch_size)
    if vpp == 1:
        return float(min(pp - stage, step or pp))
    chunks = (pp - stage - 1) * 2 + (vpp - 1) * pp + 1
    return min(chunks, (step or chunks) * vpp) / vpp


def step_micro_batches(p: ParallelConfig, micro_batch_size: int) -> int | None:
    """The micro-batches of one step on a data-parallel rank (None: the global batch is not
    known, or does not divide)."""
    gbs, per = p.global_batch_size, micro_batch_size * p.data_parallel_size
    if not gbs or per <= 0 or gbs % per:
        return None
    return gbs // per
