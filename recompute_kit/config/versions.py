"""Megatron-Core versions: which recompute settings a version runs wrongly, and the settings
Megatron accepts but ignores or reinterprets (`validate --strict` warns; `plan` never proposes
a known-broken one).

An unknown version is treated as the strictest: every setting broken in some supported version
counts as broken.
"""

from __future__ import annotations

import re

from .model import Config, ConfigError
from .pipeline_layout import pipeline_layout

# Megatron-Core clamps the last chunk of full/uniform recompute from 0.17 on (PR #3562,
# `end = min(i + k, L)` in megatron/core/recompute.py; shared/reference/megatron-recompute.md
# section 2.1). Before it, `custom(layer_idx, layer_idx + recompute_num_layers)` in
# transformer_block.py's `_checkpointed_forward` reaches `self._get_layer(index)` past the last
# layer of the chunk: IndexError (NVIDIA/Megatron-LM#2294; the doctor's rule RK064).
UNIFORM_CLAMP_VERSION = (0, 17)
# TransformerConfig.recompute_modules came with Megatron-Core 0.12 (absent from core_r0.11.0)
MODULES_VERSION = (0, 12)

_VERSION_RE = re.compile(r"(?:core_)?[rv]?(\d+)\.(\d+)(?:\.(\d+))?", re.I)


def parse_version(text: str | None) -> tuple[int, int] | None:
    """`0.16.1`, `core_r0.13.0`, `core_v0.12.0`, `v0.17.0rc1`, `0.13` -> (major, minor);
    None for None. Raises ConfigError on text that names no version."""
    if text is None:
        return None
    m = _VERSION_RE.search(str(text).strip())
    if not m:
        raise ConfigError(
            f"megatron-core version {text!r} is not a version (write it as X.Y, e.g. 0.16)"
        )
    return int(m.group(1)), int(m.group(2))


def describe_version(version: tuple[int, int] | None) -> str:
    return "unknown (the strictest is assumed)" if version is None else f"{version[0]}.{version[1]}"


def chunk_layer_counts(cfg: Config) -> list[int]:
    """Transformer layers of every (virtual) pipeline chunk: what Megatron's full recompute
    counts `recompute_num_layers` in (each chunk is its own TransformerBlock)."""
    return [len(chunk) for stage in pipeline_layout(cfg.model, cfg.parallel) for chunk in stage]


def known_broken(cfg: Config, version: tuple[int, int] | None) -> list[str]:
    """Why the recompute settings of `cfg` fail on Megatron-Core `version` (None: unknown, the
    strictest), one line each; empty when none is known."""
    r = cfg.recompute
    if cfg.model.overlap_moe_expert_parallel_comm and "moe" in (r.modules or []):
        # Megatron-Core 0.16.1 lets it through; Megatron-Bridge asserts it at comm-overlap setup
        # (training/comm_overlap.py) and later Megatron-Core at finalize
        return [
            "selective moe with overlap_moe_expert_parallel_comm: Megatron-Bridge and newer "
            "Megatron-Core refuse it ('disable moe in recompute_modules when enabling "
            "overlap_moe_expert_parallel_comm')"
        ]
    if (
        version is not None
        and version < MODULES_VERSION
        and r.recompute_granularity == "selective"
        and r.modules != ["core_attn"]
    ):
        return [
            f"recompute_modules {r.modules} on Megatron-Core {describe_version(version)}: the "
            "field came with 0.12 (core_r0.11.0's TransformerConfig has none); before it "
            "selective recompute is core attention alone (--recompute-activations), and a MoE "
            "layer's whole recompute is --moe-layer-recompute"
        ]
    if r.recompute_granularity != "full" or r.recompute_method != "uniform":
        return []
    n = r.recompute_num_layers
    if not n or n < 1 or (version is not None and version >= UNIFORM_CLAMP_VERSION):
        return []
    try:
        counts = chunk_layer_counts(cfg)
    except ConfigError:
        return []  # the layout itself is refused elsewhere
    bad = sorted({c for c in counts if c % n})
    if not bad:
        return []
    return [
        f"full:uniform:{n} on Megatron-Core {describe_version(version)}: a (virtual) pipeline "
        f"chunk of {bad[0]} layers is not a multiple of recompute_num_layers {n}, so the last "
        "uniform group runs past the last layer (IndexError before 0.17, which clamps it: "
        f"PR #3562); use an N that divides {_divides(counts)} or Megatron-Core >= 0.17"
    ]


# The last release without PR #5197 (megatron/core/transformer/moe/moe_utils.py unpermute:
# `del output_tokens, permuted_tokens, sorted_indices`): not in core_v0.16.1, 0.17.0 or 0.17.1.
MOE_FULL_RECOMPUTE_LEAK_UNTIL = (0, 17)


def held_beyond_estimate(cfg: Config, version: tuple[int, int] | None) -> list[str]:
    """Memory Megatron-Core `version` (None: unknown) holds under `cfg`'s recompute that the
    estimate does not count, one line each: the run works, but above its estimate."""
    r = cfg.recompute
    moe = cfg.model.num_moe_experts and any(
        cfg.model.is_moe_layer(n) for n in range(cfg.model.num_layers)
    )
    if not moe or r.recompute_granularity != "full" or cfg.model.moe_permute_fusion:
        return []
    if cfg.model.loss_implementation in ("hf", "torchtitan"):
        return []  # Hugging Face's / torchtitan's own MoE code: not Megatron-Core's unpermute
    if version is not None and version > MOE_FULL_RECOMPUTE_LEAK_UNTIL:
        return []
    return [
        f"full recompute of MoE layers on Megatron-Core {describe_version(version)}: the "
        "unfused unpermute's intermediates stay referenced until the next iteration "
        "(Megatron-LM#3221; fixed by PR #5197, in no release up to 0.17.1), held above this "
        "estimate and growing with recompute_num_layers; moe_permute_fusion (Transformer "
        "Engine's fused permute) avoids that path, or recompute selectively (moe_act, moe)"
    ]


def ignored_settings(cfg: Config, modules_as_written: list[str] | None = None) -> list[str]:
    """Settings Megatron accepts but does not act on as written, one line each.
    `modules_as_written`: recompute_modules as the input gave it (validation fills in the
    default ["core_attn"] before this runs); None: the config's own list, where ["core_attn"]
    may be that default and is not reported."""
    r, out = cfg.recompute, []
    modules = modules_as_written
    if modules is None and r.recompute_modules != ["core_attn"]:
        modules = r.recompute_modules
    n = r.recompute_num_layers
    if r.recompute_granularity == "full" and n:
        try:
            most = max(chunk_layer_counts(cfg), default=0)
        except ConfigError:
            most = 0
        if most and n > most:
            vpp = cfg.parallel.virtual_pipeline_model_parallel_size
            per = "virtual pipeline chunk" if vpp and vpp > 1 else "pipeline stage"
            out.append(
                f"recompute_num_layers {n} is larger than the {most} layers of any {per} "
                "(Megatron counts it per chunk of a stage's TransformerBlock): with block it "
                f"acts as {most}"
                + (
                    ", with uniform it runs past the last layer before 0.17"
                    if r.recompute_method == "uniform"
                    else ""
                )
            )
    if r.recompute_granularity is None and modules:
        out.append(
            f"recompute_modules {modules} is set while recompute_granularity is unset: "
            "Megatron recomputes nothing then (it reads recompute_modules only under "
            "selective); set recompute_granularity: selective"
        )
    if r.recompute_granularity == "full" and modules:
        out.append(
            f"recompute_modules {modules} is set while recompute_granularity is "
            "full: Megatron ignores recompute_modules then (it recomputes whole layers)"
        )
    return out


def _divides(counts: list[int]) -> str:
    sizes = sorted(set(counts))
    return f"{sizes[0]} layers" if len(sizes) == 1 else "every chunk size " + str(sizes)
