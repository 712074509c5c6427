"""Megatron-Core's `pipeline_model_parallel_layout`: which layers each virtual pipeline stage
builds, written as `Et*3|(tt|)*29m|L` (`core/transformer/pipeline_parallel_layer_layout.py`).

Stages are split by `|`; `E` is the embedding, `L` the loss, `t` a transformer layer, `m` a
multi-token-prediction layer; `(...)*n` and `x*n` repeat; commas and spaces are ignored.
Virtual stage k runs on pipeline rank k % PP as its chunk k // PP.
"""

from __future__ import annotations

import re

from .model import ConfigError

_MAX_SYMBOLS = 1_000_000


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
