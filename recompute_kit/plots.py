"""Matplotlib figures shared by the notebooks and the CLI (files written with the Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files, never a window: notebooks still show the returned figures
import matplotlib.pyplot as plt

GIB = 2**30
ROLE_ORDER = [
    "layernorm",
    "qkv",
    "core_attn",
    "mla_up_proj",
    "proj",
    "residual",
    "mlp",
    "router",
    "experts",
    "moe_act",
    "shared_experts",
    "layer_inputs",
]


def _unit(values: list[float]) -> tuple[str, float]:
    return ("GiB", GIB) if max(values, default=0) >= GIB / 10 else ("MiB", 2**20)


def pareto(rows: list[dict[str, Any]], budget_gb: float | None = None):
    """Peak memory vs throughput per config; OOM rows as crosses, the budget as a line."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = [r for r in rows if r.get("tflops_per_gpu") and r.get("peak_memory_bytes")]
    unit, scale = _unit([r["peak_memory_bytes"] for r in ok] + [(budget_gb or 0) * GIB])
    for r in ok:
        oom = r["status"] == "oom"
        ax.scatter(
            r["peak_memory_bytes"] / scale,
            r["tflops_per_gpu"],
            marker="x" if oom else ("*" if r.get("recommended") else "o"),
            s=120 if r.get("recommended") else 40,
            color="tab:red" if oom else "tab:blue",
        )
        ax.annotate(
            r["recompute"],
            (r["peak_memory_bytes"] / scale, r["tflops_per_gpu"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    if budget_gb:
        ax.axvline(budget_gb * GIB / scale, color="tab:red", linestyle="--", label="budget")
        ax.legend(loc="best")
    ax.set_xlabel(f"peak memory ({unit})")
    ax.set_ylabel("model TFLOP/s per GPU")
    ax.set_title("Memory vs throughput (x: OOM, *: recommended)")
    fig.tight_layout()
    return fig


def module_breakdown(
    measured: dict[str, dict[str, float]], estimated: dict[str, dict[str, float]] | None = None
):
    """Stacked per-role activation bytes per layer for each config; estimate beside measurement."""
    names = list(measured)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4.5))
    roles = [r for r in ROLE_ORDER if any(measured[n].get(r) for n in names)]
    values = [v for n in names for v in measured[n].values()]
    unit, scale = _unit([sum(measured[n].values()) for n in names] or values)
    width = 0.4 if estimated else 0.8
    colors = plt.get_cmap("tab20")
    for offset, source, hatch in ((0.0, measured, ""), (width, estimated, "//")):
        if not source:
            continue
        bottom = [0.0] * len(names)
        for i, role in enumerate(roles):
            heights = [source.get(n, {}).get(role, 0.0) / scale for n in names]
            ax.bar(
                [k + offset for k in range(len(names))],
                heights,
                width,
                bottom=bottom,
                color=colors(i),
                hatch=hatch,
                edgecolor="white",
                label=role if offset == 0 else None,
            )
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks([k + (width / 2 if estimated else 0) for k in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"activation memory per layer ({unit})")
    ax.set_title(
        "Per-module activations"
        + (" (left: measured, right hatched: estimate)" if estimated else "")
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def overhead(rows: list[dict[str, Any]], golden: str = "none"):
    """Measured step-time overhead vs the FLOP model's recompute fraction."""
    base = next((r for r in rows if r["recompute"] == golden and r.get("step_time_s")), None)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    if base:
        pts = [
            (
                r["recompute_flops_fraction"],
                r["step_time_s"] / base["step_time_s"] - 1,
                r["recompute"],
            )
            for r in rows
            if r.get("step_time_s") and r.get("recompute_flops_fraction") is not None
        ]
        for x, y, name in pts:
            ax.scatter(100 * x, 100 * y, color="tab:blue")
            ax.annotate(
                name, (100 * x, 100 * y), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        top = max([100 * p[0] for p in pts] + [100 * p[1] for p in pts] + [1])
        ax.plot([0, top], [0, top], color="gray", linestyle=":", label="measured = predicted")
        ax.legend(loc="best")
    ax.set_xlabel("predicted extra FLOPs (%)")
    ax.set_ylabel(f"measured step time vs {golden} (%)")
    ax.set_title("Recompute overhead: measured vs FLOP model")
    fig.tight_layout()
    return fig


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ablation_figures(rows: list[dict[str, Any]], budget_gb: float | None, out: Path) -> list[Path]:
    """The sweep's PNGs: the Pareto and the overhead plot."""
    return [
        save(pareto(rows, budget_gb), out / "pareto.png"),
        save(overhead(rows), out / "overhead.png"),
    ]
