"""Which transformer layers each pipeline rank builds (re-exported from
`config.pipeline_layout`, where validation can use them too), and the micro-batches each
stage holds at the peak of its schedule."""

from __future__ import annotations

from ..config import ParallelConfig
from ..config.pipeline_layout import layers_per_stage, pipeline_layout

__all__ = [
    "chunk_micro_batches_at_peak",
    "in_flight_words",
    "layers_per_stage",
    "micro_batches_in_flight",
    "pipeline_layout",
]


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


def chunk_micro_batches_at_peak(
    p: ParallelConfig, stage: int, chunk_bytes: list[float], micro_batch_size: int = 1
) -> list[int]:
    """The micro-batches each of a stage's model chunks holds when the stage holds the most
    bytes (`chunk_bytes[c]`: one micro-batch's saved bytes in chunk c), from Megatron's own
    order of work: the interleaved schedule runs the forward of virtual micro-batch v on chunk
    `table[v] (get_schedule_table, groups of pp micro-batches)` and its backward on the mirror
    chunk, warm-up forwards first, then one forward and one backward at a time
    (schedules.py, forward_backward_pipelining_with_interleaving). The chunks do not hold the
    same: the last stage's last chunk, the one with the loss, holds one micro-batch at a time;
    the first chunks hold the warm-up's. Unknown global batch: enough micro-batches that the
    warm-up is not cut short (the steady state)."""
    pp = p.pipeline_model_parallel_size
    vpp = len(chunk_bytes)
    if pp == 1 or vpp == 1:
        return [round(micro_batches_in_flight(p, stage, micro_batch_size))] * vpp
    step = step_micro_batches(p, micro_batch_size) or pp * (vpp + 2)
    table = [  # the chunk of each forward, in Megatron's order (groups of pp micro-batches)
        chunk
        for first in range(0, step, pp)
        for chunk in range(vpp)
        for _ in range(first, min(first + pp, step))
    ]
    total = len(table)
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    held, best, at_best = [0] * vpp, -1.0, [0] * vpp

    def forward(v: int) -> None:
        nonlocal best, at_best
        held[table[v]] += 1
        now = sum(n * b for n, b in zip(held, chunk_bytes, strict=True))
        if now > best:
            best, at_best = now, list(held)

    for v in range(warmup):
        forward(v)
    for k in range(total - warmup):
        forward(warmup + k)
        held[vpp - 1 - table[k]] -= 1  # the backward of virtual micro-batch k
    return at_best


def in_flight_words(in_flight: float, chunks: list[int]) -> str:
    """"6.25 micro-batches in flight (8, 8, 8, 1 in its virtual-pipeline chunks)"."""
    words = f"{in_flight:g} micro-batch{'' if in_flight == 1 else 'es'} in flight"
    if len(set(chunks)) > 1:
        words += f" ({', '.join(map(str, chunks))} in its virtual-pipeline chunks)"
    return words
