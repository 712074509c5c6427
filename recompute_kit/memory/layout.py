"""Which transformer layers each pipeline rank builds, as Megatron-Core assigns them.

`pipeline_layout(model, parallel)[stage][chunk]` lists the (0-based) layer numbers of one
virtual-pipeline chunk of one stage. Megatron builds one TransformerBlock per chunk; layers are
handed out chunk by chunk, stage by stage (with 8 layers, PP 2, VPP 2: stage 0 holds [0, 1] and
[4, 5], stage 1 holds [2, 3] and [6, 7]). Uneven first/last stages and the embedding or loss
counted as a layer follow `get_num_layers_to_build` in Megatron-Core's transformer_block.py.
"""

from __future__ import annotations

from ..config import ConfigError, ModelConfig, ParallelConfig
from ..config.pipeline_layout import layout_layer_counts


def layers_per_stage(m: ModelConfig, p: ParallelConfig) -> list[int]:
    """Transformer layers on each pipeline stage (all its virtual chunks together)."""
    pp, L = p.pipeline_model_parallel_size, m.num_layers
    if p.pipeline_model_parallel_layout:
        return [sum(c) for c in layout_layer_counts(p.pipeline_model_parallel_layout, pp, L)]
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    if first is not None or last is not None:
        if p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split:
            raise ConfigError(
                "uneven first/last pipeline stages cannot be combined with "
                "account_for_embedding/loss_in_pipeline_split (Megatron refuses it)"
            )
        rest, stages = L - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if rest < 0 or (stages > 0 and rest % stages) or (stages == 0 and rest):
            raise ConfigError(
                f"with {first} layers on the first and {last} on the last pipeline stage, the "
                f"other {rest} layers do not split evenly over {stages} stages"
            )
        middle = rest // stages if stages else 0
        counts = [middle] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return counts
    total = L + p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split
    if total % pp:
        raise ConfigError(
            f"num_layers ({L}"
            + (" + embedding" if p.account_for_embedding_in_pipeline_split else "")
            + (" + loss" if p.account_for_loss_in_pipeline_split else "")
            + f") is not divisible by pipeline parallel size {pp}; set "
            "num_layers_in_first/last_pipeline_stage for uneven stages"
        )
    counts = [total // pp] * pp
    counts[0] -= p.account_for_embedding_in_pipeline_split
    counts[-1] -= p.account_for_loss_in_pipeline_split
    return counts


def pipeline_layout(m: ModelConfig, p: ParallelConfig) -> list[list[list[int]]]:
    """Layer numbers per stage and virtual chunk (see the module docstring)."""
    pp = p.pipeline_model_parallel_size
    vpp = (p.virtual_pipeline_model_parallel_size or 1) if pp > 1 else 1
    if p.pipeline_model_parallel_layout:
        per_chunk = layout_layer_counts(p.pipeline_model_parallel_layout, pp, m.num_layers)
        return _number_layers(per_chunk, pp, len(per_chunk[0]))
    counts = layers_per_stage(m, p)
    per_chunk = []  # per_chunk[stage][chunk] = number of layers
    for stage, n in enumerate(counts):
        # The embedding / loss stand-in was subtracted above; put it back to split the stage
        # into equal chunks, then take it off the first / last chunk again.
        extra_first = p.account_for_embedding_in_pipeline_split and stage == 0
        extra_last = p.account_for_loss_in_pipeline_split and stage == pp - 1
        whole = n + extra_first + extra_last
        if whole % vpp:
            raise ConfigError(
                f"layers of pipeline stage {stage} ({whole}) are not divisible by virtual "
                f"pipeline size {vpp}"
            )
        chunks = [whole // vpp] * vpp
        chunks[0] -= extra_first
        chunks[-1] -= extra_last
        if min(chunks) < 0:
            raise ConfigError(f"not enough layers for pipeline stage {stage}")
        per_chunk.append(chunks)
    return _number_layers(per_chunk, pp, vpp)


def _number_layers(per_chunk: list[list[int]], pp: int, vpp: int) -> list[list[list[int]]]:
    """Layer numbers handed out chunk by chunk, stage by stage (virtual stage k = chunk
    k // PP of rank k % PP)."""
    layout: list[list[list[int]]] = [[[] for _ in range(vpp)] for _ in range(pp)]
    next_layer = 0
    for chunk in range(vpp):
        for stage in range(pp):
            n = per_chunk[stage][chunk]
            layout[stage][chunk] = list(range(next_layer, next_layer + n))
            next_layer += n
    return layout


def micro_batches_in_flight(p: ParallelConfig, stage: int) -> float:
    """Micro-batches whose activations a stage holds at the peak of its schedule, in units of
    the whole stage's layers: 1F1B keeps pp - stage; the interleaved schedule keeps
    (pp - stage - 1) x 2 + (vpp - 1) x pp + 1 chunk-micro-batches, each 1/vpp of the stage
    (Megatron's warm-up count plus the one in flight)."""
    pp = p.pipeline_model_parallel_size
    vpp = p.virtual_pipeline_model_parallel_size or 1
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(pp - stage)
    return ((pp - stage - 1) * 2 + (vpp - 1) * pp + 1) / vpp
