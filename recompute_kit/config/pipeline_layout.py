"""Megatron-Core's `pipeline_model_parallel_layout`: which layers each virtual pipeline stage
builds, written as `Et*3|(tt|)*29m|L` (`core/transformer/pipeline_parallel_layer_layout.py`).

Stages are split by `|`; `E` is the embedding, `L` the loss, `t` a transformer layer, `m` a
multi-token-prediction layer; `(...)*n` and `x*n` repeat; commas and spaces are ignored.
Virtual stage k runs on pipeline rank k % PP as its chunk k // PP.
"""

from __future__ import annotations

import re

from .model import ConfigError, ModelConfig, ParallelConfig

_MAX_SYMBOLS = 1_000_000


_SYMBOL_OF_LAYER = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def layout_from_stages(stages: list) -> str:
    """The string form of a layout given as Megatron's other spelling, a list of virtual
    stages of layer-type names (`[["embedding", "decoder"], ..., ["decoder", "loss"]]`,
    LayerType's names, as Megatron-Bridge YAMLs write it)."""
    if not isinstance(stages, (list, tuple)) or not all(
        isinstance(stage, (list, tuple)) for stage in stages
    ):
        raise ConfigError(
            f"pipeline_model_parallel_layout must be a string or a list of lists, got {stages!r}"
        )
    text = []
    for stage in stages:
        names = [str(name).rsplit(".", 1)[-1].lower() for name in stage]  # LayerType.decoder
        unknown = sorted({n for n in names if n not in _SYMBOL_OF_LAYER})
        if unknown:
            raise ConfigError(
                f"pipeline_model_parallel_layout: unknown layer type {unknown[0]!r} "
                f"(one of {', '.join(_SYMBOL_OF_LAYER)})"
            )
        text.append("".join(_SYMBOL_OF_LAYER[n] for n in names))
    return "|".join(text)


def expand_layout(text: str) -> list[str]:
    """The virtual stages of a layout, each as its expanded symbols (`["Et", "tt", ..., "mL"]`).
    Raises ConfigError (one line) on a malformed layout."""
    s = re.sub(r"[\s,]", "", str(text).strip().strip("'\""))
    try:
        flat = _expand(s, 0)
    except ValueError as exc:
        raise ConfigError(f"pipeline_model_parallel_layout {text!r}: {exc}") from None
    return flat.split("|")


def _expand(s: str, depth: int) -> str:
    if depth > 20:
        raise ValueError("too deeply nested")
    out, i = "", 0
    while i < len(s):
        c = s[i]
        if c == "(":
            d, j = 1, i + 1
            while j < len(s) and d:
                d += {"(": 1, ")": -1}.get(s[j], 0)
                j += 1
            if d:
                raise ValueError("unbalanced parentheses")
            inner = _expand(s[i + 1 : j - 1], depth + 1)
            m = re.match(r"\*(\d+)", s[j:])
            n = int(m.group(1)) if m else 1
            i = j + (m.end() if m else 0)
        elif c in "EtmL|":
            inner = c
            m = re.match(r"\*(\d+)", s[i + 1 :])
            n = int(m.group(1)) if m else 1
            i += 1 + (m.end() if m else 0)
        else:
            raise ValueError(f"unexpected {c!r} (symbols: E, t, m, L, |, (...)*n)")
        if len(out) + len(inner) * n > _MAX_SYMBOLS:
            raise ValueError("too long")
        out += inner * n
    return out


def layout_layer_counts(text: str, pp: int, num_layers: int) -> list[list[int]]:
    """Transformer layers per pipeline rank and virtual chunk: counts[rank][chunk]."""
    stages = expand_layout(text)
    if len(stages) % pp:
        raise ConfigError(
            f"pipeline_model_parallel_layout has {len(stages)} stages, not a multiple of the "
            f"pipeline size {pp}"
        )
    total = sum(stage.count("t") for stage in stages)
    if total != num_layers:
        raise ConfigError(
            f"pipeline_model_parallel_layout places {total} transformer layers, the model has "
            f"{num_layers}"
        )
    vpp = len(stages) // pp
    return [[stages[chunk * pp + rank].count("t") for chunk in range(vpp)] for rank in range(pp)]


# Which transformer layers each pipeline rank builds, as Megatron-Core assigns them.
# Which transformer layers each pipeline rank builds, as Megatron-Core assigns them.
#
# `pipeline_layout(model, parallel)[stage][chunk]` lists the (0-based) layer numbers of one
# virtual-pipeline chunk of one stage. Megatron builds one TransformerBlock per chunk; layers are
# handed out chunk by chunk, stage by stage (with 8 layers, PP 2, VPP 2: stage 0 holds [0, 1] and
# [4, 5], stage 1 holds [2, 3] and [6, 7]). Uneven first/last stages and the embedding or loss
# counted as a layer follow `get_num_layers_to_build` in Megatron-Core's transformer_block.py.


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
            "num_layers_in_first/last_pipeline_stage for uneven stages (the CLI's "
            "--first-stage-layers / --last-stage-layers)"
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
