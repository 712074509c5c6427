"""MFU arithmetic and the GPU benchmark's MFU section, run small on CPU."""

import sys
from pathlib import Path

import pytest

from recompute_kit.memory.flops import recompute_flops, step_flops
from recompute_kit.presets import get_preset
from recompute_kit.throughput import matmul_ceiling, throughput

GPT = get_preset("tiny-gpt").config()


def test_mfu_counts_model_flops_and_hfu_adds_recompute():
    cfg = GPT.with_recompute("full:uniform:1")
    tp = throughput(cfg, step_time_s=0.5, ceiling_tflops=2.0)
    assert tp.model_tflops == pytest.approx(step_flops(cfg) / 0.5 / 1e12)
    assert tp.mfu == pytest.approx(tp.model_tflops / 2.0)
    assert tp.hfu == pytest.approx((step_flops(cfg) + recompute_flops(cfg)) / 0.5 / 1e12 / 2.0)
    assert tp.predicted_overhead == pytest.approx(recompute_flops(cfg) / step_flops(cfg))
    assert tp.predicted_overhead > 0 and throughput(GPT, 0.5, 2.0).predicted_overhead == 0


def test_bad_times_are_one_clear_error():
    with pytest.raises(ValueError, match="must be positive"):
        throughput(GPT, 0.0, 1.0)


def test_matmul_ceiling_is_a_positive_rate_on_cpu():
    assert matmul_ceiling("cpu", size=64, repeats=3) > 0


def test_gpu_benchmark_mfu_section_runs_on_cpu():
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import gpu

    models = {"tiny-moe": ("tiny-moe", dict(bf16=True))}
    gpu.MFU_SPECS["tiny-moe"] = ["none", "selective:moe", "full:uniform:1"]
    result = gpu.mfu_section(rounds=2, device="cpu", models=models, ceiling_size=64)
    rows = result["rows"]
    assert [r["recompute"] for r in rows] == [
        "none",
        "selective:moe",
        "full:uniform:1",
        "moe layer fwd+bwd",
    ]
    assert rows[0]["overhead_median"] == 0.0 and rows[0]["overhead_predicted"] == 0.0
    assert all(r["mfu"] > 0 for r in rows)
    assert "| tiny-moe | full:uniform:1 |" in gpu.markdown({**_header(), "mfu": result})


def _header():
    return {"device": "cpu", "date": "-", "command": "-", "torch": "-"}
