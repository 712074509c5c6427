"""Recompute spec strings (`none`, `selective:mlp`, `full:uniform:2`, ...) to and from
`RecomputeConfig`, and the specs that apply to a model."""

from __future__ import annotations

import itertools

from .model import RECOMPUTE_MODULES, Config, ConfigError, RecomputeConfig

SPEC_HELP = (
    "none | selective | selective:MOD[,MOD...] | selective: | full:uniform:N | full:block:N "
    f"(MOD in {', '.join(RECOMPUTE_MODULES)})"
)


def full_recompute_chunks(
    rc: RecomputeConfig, num_layers: int, training: bool = True
) -> list[tuple[int, int, bool]]:
    """Split the layers [0, num_layers) of one TransformerBlock into (start, end, checkpointed)
    runs, as Megatron's full recompute does (each virtual-pipeline chunk is its own block).

    uniform, N: chunks of N layers, each one checkpoint (the last chunk is clamped).
    block, N:   the first N layers checkpointed one by one, the rest run normally.
    """
    if not (training and rc.recompute_granularity == "full"):
        return [(0, num_layers, False)]
    n = rc.recompute_num_layers or 1
    if rc.recompute_method == "uniform":
        return [(i, min(i + n, num_layers), True) for i in range(0, num_layers, n)]
    if rc.recompute_method == "block":
        chunks = [(i, i + 1, True) for i in range(min(n, num_layers))]
        if n < num_layers:
            chunks.append((n, num_layers, False))
        return chunks
    raise ConfigError("Invalid activation recompute method.")


def parse_spec(spec: str) -> RecomputeConfig:
    """Parse a recompute spec string into a RecomputeConfig (raises ConfigError on bad input)."""
    text = spec.strip()
    head, _, rest = text.partition(":")
    if text == "none":
        return RecomputeConfig()
    if head == "selective":
        if ":" not in text:
            return RecomputeConfig("selective", recompute_modules=["core_attn"])
        items = [mod.strip() for mod in rest.split(",")]
        if rest.strip() and not all(items):  # `selective:` alone is the empty control
            raise ConfigError(f"empty module name in spec {spec!r} (a doubled or trailing comma)")
        modules = [mod for mod in items if mod]
        unknown = [mod for mod in modules if mod not in RECOMPUTE_MODULES]
        if unknown:
            raise ConfigError(
                f"unknown recompute module {unknown[0]!r} in spec {spec!r}; "
                f"choose from {', '.join(RECOMPUTE_MODULES)}"
            )
        return RecomputeConfig("selective", recompute_modules=list(dict.fromkeys(modules)))
    if head == "full":
        method, _, num = rest.partition(":")
        if method not in ("uniform", "block") or not num.isdigit() or int(num) < 1:
            raise ConfigError(
                f"malformed full recompute spec {spec!r}; expected full:uniform:N or "
                "full:block:N with N >= 1"
            )
        return RecomputeConfig("full", recompute_method=method, recompute_num_layers=int(num))
    raise ConfigError(f"malformed recompute spec {spec!r}; expected {SPEC_HELP}")


def applicable_modules(config: Config) -> list[str]:
    """The recompute modules that act on this model (and pass Megatron's validation)."""
    m = config.model
    modules = ["core_attn", "layernorm"]
    if m.num_moe_layers < m.num_layers:
        modules.append("mlp")
    if m.num_moe_layers:
        modules.append("moe")
        if m.moe_grouped_gemm:
            modules.append("moe_act")
        if m.moe_shared_expert_intermediate_size and not m.moe_shared_expert_overlap:
            modules.append("shared_experts")
    if m.multi_latent_attention:
        modules.append("mla_up_proj")
    return [mod for mod in RECOMPUTE_MODULES if mod in modules]


def all_specs(config: Config) -> list[str]:
    """The specs worth checking on this model: none, the empty selective control, every module
    alone, every pair, all of them together, and full uniform/block for every N from 1 to
    num_layers. (With three modules or fewer that is every subset.)"""
    modules = applicable_modules(config)
    specs = ["none", "selective:"]
    sizes = sorted({1, 2, len(modules)} & set(range(1, len(modules) + 1)))
    for r in sizes:
        specs += ["selective:" + ",".join(c) for c in itertools.combinations(modules, r)]
    specs = [format_spec(parse_spec(spec)) for spec in specs]  # canonical: selective:core_attn
    for method in ("uniform", "block"):
        specs += [f"full:{method}:{n}" for n in range(1, config.model.num_layers + 1)]
    return specs


def format_spec(rc: RecomputeConfig) -> str:
    """The canonical spec string of a RecomputeConfig (`selective:core_attn` prints `selective`)."""
    if rc.recompute_granularity is None:
        return "none"
    if rc.recompute_granularity == "full":
        return f"full:{rc.recompute_method}:{rc.recompute_num_layers}"
    modules = rc.modules
    if modules == ["core_attn"]:
        return "selective"
    return "selective:" + ",".join(modules)


def parse_spec_list(specs: str | list[str] | tuple[str, ...]) -> list[str]:
    """Several specs, as a list (a YAML list from papermill's `-y`) or one string separated by
    commas, semicolons or spaces. In a string a bare module name continues the selective spec
    before it: "none,selective:core_attn,mlp,full:uniform:1" is three specs. Each is checked."""
    if isinstance(specs, str):
        items: list[str] = []
        for token in (t.strip() for t in specs.replace(";", ",").replace(" ", ",").split(",")):
            if not token:
                continue
            # (never after `selective:` alone: that is the empty control, complete as it is)
            if (
                token in RECOMPUTE_MODULES
                and items
                and items[-1].startswith("selective:")
                and (items[-1] != "selective:")
            ):
                items[-1] = f"{items[-1]},{token}"
            else:
                items.append(token)
    elif isinstance(specs, (list, tuple)) and all(isinstance(s, str) for s in specs):
        items = [s.strip() for s in specs]
    else:
        raise ConfigError(f"recompute specs must be a string or a list of strings, got {specs!r}")
    for item in items:
        parse_spec(item)
    if not items:
        raise ConfigError("no recompute spec given")
    return list(dict.fromkeys(items))
