"""Matplotlib figures shared by the notebooks and the CLI.

Figures are `matplotlib.figure.Figure` objects made without pyplot: no backend is chosen or
switched here and no global figure list is kept, so the CLI writes files without a window and a
notebook kernel keeps its inline backend. `show` saves a figure and displays it inline when an
IPython kernel is running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure

from .units import byte_unit

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


def new_figure(width: float, height: float = 4.5):
    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot()


def pareto(rows: list[dict[str, Any]], budget_gb: float | None = None):
    """Peak memory vs throughput per config; OOM rows as crosses, the budget as a line."""
    fig, ax = new_figure(7)
    ok = [r for r in rows if r.get("tflops_per_gpu") and r.get("peak_memory_bytes")]
    unit, scale = byte_unit([r["peak_memory_bytes"] for r in ok] + [(budget_gb or 0) * GIB])
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
    fig, ax = new_figure(max(6, 1.1 * len(names)))
    roles = [r for r in ROLE_ORDER if any(measured[n].get(r) for n in names)]
    values = [v for n in names for v in measured[n].values()]
    unit, scale = byte_unit([sum(measured[n].values()) for n in names] or values)
    width = 0.4 if estimated else 0.8
    colors = colormaps["tab20"]
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
    """Per config: the measured step-time overhead against golden with its interval (from the
    two medians' intervals, worst cases) beside the FLOP model's predicted recompute share."""
    base = next((r for r in rows if r["recompute"] == golden and r.get("step_time_s")), None)
    pts = [
        r for r in rows if r.get("step_time_s") and r.get("recompute_flops_fraction") is not None
    ]
    fig, ax = new_figure(max(6, 0.9 * len(pts)))
    if base and pts:
        b_low, b_high = base.get("step_time_interval_s") or [base["step_time_s"]] * 2
        xs = range(len(pts))
        measured, err_low, err_high = [], [], []
        for r in pts:
            low, high = r.get("step_time_interval_s") or [r["step_time_s"]] * 2
            mid = 100 * (r["step_time_s"] / base["step_time_s"] - 1)
            measured.append(mid)
            err_low.append(max(0.0, mid - 100 * (low / b_high - 1)))
            err_high.append(max(0.0, 100 * (high / b_low - 1) - mid))
        predicted = [100 * r["recompute_flops_fraction"] for r in pts]
        ax.bar(
            [x - 0.2 for x in xs],
            measured,
            0.4,
            yerr=[err_low, err_high],
            capsize=3,
            color="tab:blue",
            label="measured (median, interval)",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            predicted,
            0.4,
            color="tab:gray",
            label="FLOP model: recompute share",
        )
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["recompute"] for r in pts], rotation=30, ha="right", fontsize=8)
        ax.legend(loc="best", fontsize=8)
    ax.set_ylabel(f"extra step time vs {golden} (%)")
    ax.set_title("Recompute overhead: measured vs FLOP model")
    fig.tight_layout()
    return fig


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def show(fig, path: Path) -> Path:
    """Save the figure, then display the saved PNG inline when running in an IPython kernel
    (JupyterLab, papermill): the notebook shows exactly the file it wrote."""
    save(fig, path)
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return path
    if get_ipython() is not None:
        display(Image(data=Path(path).read_bytes(), format="png"))
    return path


def ablation_figures(rows: list[dict[str, Any]], budget_gb: float | None, out: Path) -> list[Path]:
    """The sweep's PNGs: the Pareto and the overhead plot."""
    return [
        save(pareto(rows, budget_gb), out / "pareto.png"),
        save(overhead(rows), out / "overhead.png"),
    ]
