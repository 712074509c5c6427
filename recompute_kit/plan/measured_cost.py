"""Is a measured slowdown what the recompute setting should cost?

The estimator prices a setting by the extra executed FLOPs of the step (`plan.step_cost`: the
slowest pipeline stage with recompute over the slowest without, from `memory/flops.py`). A
measured run pair (a setting against its baseline, the same model) is compared with it: the
step-time change the FLOPs predict, (1 + cost(arm)) / (1 + cost(base)) - 1, beside the measured
one. Used by `skill/scripts/judge.py` and the doctor's measured rules (RK033, RK237, RK238).

ASSUMPTION (EXPLAINED_SLACK): a measured slowdown up to 10 percentage points above the FLOP
prediction is read as what recompute costs; the recomputed forward also re-runs its
communication (tensor-parallel all-gathers, MoE all-to-all), which the FLOP count leaves out.
Beyond that, something other than recompute differs between the runs (node, date, batch,
software) or the recomputed forward runs at lower efficiency than the rest of the step.
"""

from __future__ import annotations

from ..config import Config, ConfigError
from . import step_cost

EXPLAINED_SLACK = 0.10


def predicted_slowdown(config: Config, arm: str, base: str) -> float | None:
    """The step-time change the FLOP model predicts for spec `arm` against spec `base` on this
    model and layout; None when a spec is not a recompute spec the kit reads."""
    try:
        cost_arm = step_cost(config.with_recompute(arm))
        cost_base = step_cost(config.with_recompute(base))
    except (ConfigError, ValueError, KeyError):
        return None
    return (1 + cost_arm) / (1 + cost_base) - 1


def measured_time_change(
    base_step: float | None,
    arm_step: float | None,
    base_tflops: float | None = None,
    arm_tflops: float | None = None,
) -> tuple[float | None, str]:
    """The measured step-time change of the arm over the base, and what it was read from: the
    step times when both have one, else the TFLOP/s (time ~ 1 / TFLOP/s at the same batch, an
    ASSUMPTION that both runs count the same FLOPs per step)."""
    if base_step and arm_step:
        return arm_step / base_step - 1, "step time"
    if base_tflops and arm_tflops:
        return base_tflops / arm_tflops - 1, "TFLOP/s (taken as counting the same FLOPs per step)"
    return None, ""


def explain_slowdown(
    config: Config, arm: str, base: str, measured: float | None, read_from: str = "step time"
) -> dict | None:
    """The measured step-time change of `arm` over `base` set against the FLOP prediction:
    {"arm", "base", "predicted", "measured", "explained" (True: within EXPLAINED_SLACK of the
    prediction or below it), "text"}; None when either number is missing."""
    predicted = predicted_slowdown(config, arm, base)
    if predicted is None or measured is None:
        return None
    explained = measured <= predicted + EXPLAINED_SLACK
    said = f"{predicted:+.0%} FLOPs predicted, {measured:+.0%} measured ({read_from})"
    if explained:
        text = f"'{arm}' vs '{base}': as expected ({said})"
    else:
        text = (
            f"'{arm}' vs '{base}': more than recompute explains ({said}; over "
            f"{EXPLAINED_SLACK:.0%} points above the prediction): look for what else differs "
            "between the runs"
        )
    return {
        "arm": arm,
        "base": base,
        "predicted": round(predicted, 4),
        "measured": round(measured, 4),
        "explained": explained,
        "text": text,
    }
