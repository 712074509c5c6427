"""Estimator vs real Megatron-Core, one rank of N of full-size layouts (meta device, fake
process group), and the small multi-process layouts: the figures in benchmarks/RESULTS.md.

    python benchmarks/megatron_parity.py            # full-size layouts (about a minute)
    python benchmarks/megatron_parity.py --small    # also the gloo layouts of the test suite
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

warnings.filterwarnings("ignore")


def full_size() -> None:
    from test_megatron_parity import FULL_SIZE, full_size_specs

    from recompute_kit.engines import megatron as engine
    from recompute_kit.memory.estimate import estimate, layer_activation_bytes
    from recompute_kit.memory.model_states import rank_parameters
    from recompute_kit.presets import get_preset

    print(
        "| layout | stage | recompute | s | layers measured | max per-layer error "
        "| parameters | optimizer error |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (preset, keys, stage) in sorted(FULL_SIZE.items()):
        base = get_preset(preset).config().replace(transformer_impl="local", **keys)
        for spec in full_size_specs(base):
            config = base.with_recompute(spec)
            start = time.perf_counter()
            rank = engine.measure_one_rank(config, "bf16", stage)
            seconds = time.perf_counter() - start
            m, p, rc = config.model, config.parallel, config.recompute
            errors = [
                abs(sum(layer_activation_bytes(m, rc, p, 2, m.is_moe_layer(n)).values()) - saved)
                / saved
                for n, saved in zip(rank.layer_numbers, rank.saved_per_layer, strict=True)
            ]
            expected = {k: round(v) for k, v in rank_parameters(config, stage).items()}
            optimizer = sum(
                12 * n / rank.optimizer_shards[k] for k, n in rank.parameters_by_kind.items()
            )
            est_opt = estimate(config, stage=stage).optimizer_bytes
            params = sum(rank.parameters_by_kind.values())
            same = "equal" if expected == rank.parameters_by_kind else "DIFFER"
            print(
                f"| {name} | {stage} | {spec} | {seconds:.1f} | {len(errors)} | "
                f"{max(errors):.1e} | {same}"
                f" ({params:,}) | {abs(est_opt - optimizer) / optimizer:.1e} |"
            )


def plans() -> None:
    """The planner's choice for two full-size layouts, and its model-state bytes against the
    engine's parameters on the planned stage (one rank of N, meta device)."""
    from test_megatron_parity import FULL_SIZE

    from recompute_kit.engines import megatron as engine
    from recompute_kit.plan import plan
    from recompute_kit.presets import get_preset

    print("\n| layout | budget | plan | stage | model states (plan) | from the engine's params |")
    print("|---|---|---|---|---|---|")
    for name in ("deepseek-v3-tp2-ep64-pp16-uneven", "mixtral-8x7b-pp4-ep8-dp8"):
        preset, keys, _ = FULL_SIZE[name]
        config = get_preset(preset).config().replace(transformer_impl="local", **keys)
        best = plan(config, 80.0).best
        est = best.estimate
        rank = engine.measure_one_rank(config, "bf16", est.stage)
        n = rank.parameters_by_kind
        shards = rank.optimizer_shards
        engine_states = 2 * sum(n.values()) + 4 * sum(n.values())  # bf16 weights, fp32 grads
        engine_states += sum(12 * n[k] / shards[k] for k in n)  # Adam, distributed optimizer
        planned = est.weights_bytes + est.grads_bytes + est.optimizer_bytes
        same = "equal" if planned == round(engine_states) else "DIFFER"
        print(
            f"| {name} | 80 GB | {best.recompute.spec} | {est.stage} | {planned:,} B "
            f"| {round(engine_states):,} B ({same}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="also the gloo layouts")
    args = parser.parse_args()
    full_size()
    plans()
    if args.small:
        import pytest

        sys.exit(pytest.main(["-q", "-W", "ignore", "tests/test_megatron_parity.py"]))


if __name__ == "__main__":
    main()
