"""GPU checks and figures: estimate vs CUDA allocator, per-module deltas, step-time ratios, an
ablation with OOMs. Writes gpu_results.json and gpu_results.md into --out.

    PYTHONPATH=. python3 benchmarks/gpu.py --out DIR

Runnable presets are scaled up until a step uses several GB (bf16, SDPA/flash unless noted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from recompute_kit.ablation import AblationSetup, run_ablation
from recompute_kit.memory.estimate import estimate
from recompute_kit.memory.measure import measure
from recompute_kit.presets import get_preset
from recompute_kit.throughput import matmul_ceiling, throughput

GIB = 2**30

SCALED = {
    "gpt-scaled": (
        "tiny-gpt",
        dict(
            num_layers=8,
            hidden_size=2048,
            num_attention_heads=16,
            num_query_groups=8,
            ffn_hidden_size=8192,
            seq_length=4096,
            micro_batch_size=2,
            vocab_size=32000,
            attention_backend="flash",
            bf16=True,
        ),
    ),
    "gpt-scaled-unfused": (
        "tiny-gpt",
        dict(
            num_layers=4,
            hidden_size=2048,
            num_attention_heads=16,
            ffn_hidden_size=8192,
            seq_length=2048,
            micro_batch_size=2,
            vocab_size=32000,
            attention_backend="unfused",
            bf16=True,
        ),
    ),
    "moe-scaled": (
        "tiny-moe",
        dict(
            hidden_size=1024,
            num_attention_heads=16,
            num_query_groups=4,
            ffn_hidden_size=4096,
            seq_length=4096,
            micro_batch_size=2,
            vocab_size=32000,
            num_moe_experts=8,
            moe_ffn_hidden_size=1024,
            moe_shared_expert_intermediate_size=1024,
            attention_backend="flash",
            bf16=True,
        ),
    ),
    "mla-scaled": (
        "tiny-mla",
        dict(
            hidden_size=1024,
            num_attention_heads=16,
            ffn_hidden_size=4096,
            seq_length=4096,
            micro_batch_size=2,
            vocab_size=32000,
            q_lora_rank=512,
            kv_lora_rank=256,
            qk_head_dim=64,
            qk_pos_emb_head_dim=32,
            v_head_dim=64,
            num_moe_experts=8,
            moe_ffn_hidden_size=1024,
            moe_shared_expert_intermediate_size=1024,
            attention_backend="flash",
            bf16=True,
        ),
    ),
}
SPECS = {
    "gpt-scaled": [
        "none",
        "selective",
        "selective:mlp",
        "selective:layernorm",
        "selective:mlp,layernorm",
        "full:uniform:1",
        "full:uniform:2",
        "full:block:4",
    ],
    "gpt-scaled-unfused": ["none", "selective", "selective:mlp", "full:uniform:1"],
    "moe-scaled": [
        "none",
        "selective:moe_act",
        "selective:moe",
        "selective:shared_experts",
        "selective:layernorm,moe_act",
        "full:uniform:1",
    ],
    "mla-scaled": [
        "none",
        "selective:mla_up_proj",
        "selective:moe_act",
        "selective:moe",
        "selective:mla_up_proj,moe_act,layernorm",
        "full:uniform:1",
    ],
}


# Models that fill an H100 for the MFU section: dense hidden 4096 / seq 4096 (the bar),
# and the MoE model whose single layer is timed alone. bf16, flash attention.
MFU_MODELS = {
    "gpt-4096": (
        "tiny-gpt",
        dict(
            num_layers=4,
            hidden_size=4096,
            num_attention_heads=32,
            num_query_groups=8,
            ffn_hidden_size=14336,
            seq_length=4096,
            micro_batch_size=1,
            vocab_size=32000,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            swiglu=True,
            normalization="RMSNorm",
            attention_backend="flash",
            bf16=True,
        ),
    ),
    "moe-scaled": SCALED["moe-scaled"],
    "mla-scaled": SCALED["mla-scaled"],
    # Mixtral-class width (8 experts, top-2, FFN 14336) so the experts' GEMMs fill the GPU
    "moe-4096": (
        "tiny-moe",
        dict(
            num_layers=2,
            moe_layer_freq=[1, 1],
            hidden_size=4096,
            num_attention_heads=32,
            num_query_groups=8,
            ffn_hidden_size=14336,
            seq_length=4096,
            micro_batch_size=1,
            vocab_size=32000,
            num_moe_experts=8,
            moe_router_topk=2,
            moe_ffn_hidden_size=14336,
            moe_shared_expert_intermediate_size=None,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            attention_backend="flash",
            bf16=True,
        ),
    ),
}
MFU_SPECS = {
    "gpt-4096": ["none", "selective", "selective:mlp", "full:uniform:1"],
    "moe-scaled": SPECS["moe-scaled"],
    "mla-scaled": SPECS["mla-scaled"],
    "moe-4096": ["none", "selective:moe_act", "selective:moe", "full:uniform:1"],
}


def config(name: str):
    preset, flat = SCALED[name]
    return get_preset(preset).config().replace(**flat)


def memory_section() -> list[dict]:
    rows = []
    for name in SCALED:
        cfg = config(name)
        for spec in SPECS[name]:
            c = cfg.with_recompute(spec)
            m = measure(c, device="cuda", dtype="bf16")
            e = estimate(c, dtype_bytes=2, engine="reference")  # the kit's own layers
            rows.append(
                {
                    "model": name,
                    "recompute": spec,
                    "measured_saved_bytes": m.activation_bytes,
                    "estimated_saved_bytes": e.activation_bytes,
                    "measured_peak_bytes": m.peak_activation_bytes,
                    "estimated_peak_bytes": e.peak_activation_bytes,
                    "saved_ratio": e.activation_bytes / m.activation_bytes,
                    "peak_ratio": e.peak_activation_bytes / m.peak_activation_bytes,
                    # Megatron-Core's engine (TE / local spec) as the kit estimates it, for the
                    # difference between the reference layers and the Megatron path
                    "estimated_megatron_saved_bytes": estimate(c, dtype_bytes=2).activation_bytes,
                    "measured_modules": m.modules,
                    "estimated_modules": e.modules,
                }
            )
            print(
                f"{name:20s} {spec:40s} saved est/meas {rows[-1]['saved_ratio']:.4f} "
                f"peak est/meas {rows[-1]['peak_ratio']:.4f}",
                flush=True,
            )
            torch.cuda.empty_cache()
    return rows


def timing_section(out: Path) -> list[dict]:
    # Warm the process first (CUDA context, cuBLAS handles, allocator segments): the first
    # config of a fresh process would otherwise pay for them.
    warm = AblationSetup(
        config("moe-scaled"), "warm-up", ["none"], steps=3, warmup=3, device="cuda", dtype="bf16"
    )
    run_ablation(warm, out / "warm-up")
    rows = []
    for name, specs in (
        ("gpt-scaled", SPECS["gpt-scaled"]),
        ("gpt-scaled-unfused", SPECS["gpt-scaled-unfused"]),
        ("moe-scaled", SPECS["moe-scaled"]),
    ):
        setup = AblationSetup(
            config(name), name, specs, steps=10, warmup=3, device="cuda", dtype="bf16"
        )
        for r in run_ablation(setup, out / f"ablation-{name}"):
            rows.append(
                {
                    "model": name,
                    **{
                        k: r[k]
                        for k in (
                            "recompute",
                            "status",
                            "step_time_s",
                            "tflops_per_gpu",
                            "vs_golden",
                            "peak_memory_bytes",
                            "peak_reserved_bytes",
                            "estimated_total_bytes",
                            "recompute_flops_fraction",
                        )
                    },
                }
            )
    return rows


def interleaved_step_times(cfg, specs, rounds: int, device: str, dtype: torch.dtype):
    """Step time per recompute spec on ONE model (same weights), in round-robin rounds: each
    round runs every spec once (order alternating), after a warm-up step per spec."""
    from recompute_kit.config import parse_spec
    from recompute_kit.layers import GPTModel
    from recompute_kit.memory.measure import make_batch

    torch.manual_seed(0)
    model = GPTModel(cfg.with_recompute("none")).to(device, dtype).train()
    tokens, labels = make_batch(cfg, torch.device(device), 0)

    def step(spec: str) -> float:
        model.set_recompute(parse_spec(spec))
        model.zero_grad(set_to_none=False)
        _sync(device)
        start = time.perf_counter()
        model(tokens, labels).backward()
        _sync(device)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {spec: [] for spec in specs}
    for spec in specs:
        step(spec)
    for r in range(rounds):
        for spec in specs if r % 2 == 0 else specs[::-1]:
            times[spec].append(step(spec))
    return times


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def moe_layer_time(cfg, rounds: int, device: str, dtype: torch.dtype) -> list[float]:
    """fwd+bwd of one MoE layer (router, grouped experts, shared expert) alone."""
    from recompute_kit.checkpoint import RecomputePolicy
    from recompute_kit.config import parse_spec
    from recompute_kit.layers.moe import MoELayer

    m = cfg.model
    torch.manual_seed(0)
    layer = MoELayer(m, RecomputePolicy(parse_spec("none"))).to(device, dtype).train()
    x = torch.randn(m.micro_batch_size, m.seq_length, m.hidden_size, device=device, dtype=dtype)
    x.requires_grad_()
    times = []
    for r in range(rounds + 2):
        _sync(device)
        start = time.perf_counter()
        layer(x).backward(torch.ones_like(x))
        _sync(device)
        if r >= 2:
            times.append(time.perf_counter() - start)
    return times


def mfu_section(
    rounds: int = 7, device: str = "cuda", models=None, ceiling_size: int = 8192
) -> dict:
    """MFU per model and recompute spec against a measured bf16 matmul ceiling, and each
    spec's step-time overhead against the FLOP model's prediction, with the spread over rounds
    (per-round ratio to that round's `none`)."""
    from recompute_kit.memory.flops import (
        layer_forward_flops,
        model_recompute_flops_fraction,
        recompute_flops,
        step_flops,
    )

    dtype = torch.bfloat16
    ceiling = matmul_ceiling(device, dtype, ceiling_size)
    print(f"matmul ceiling {ceiling:.1f} TFLOP/s", flush=True)
    rows = []
    for name, (preset, flat) in (models or MFU_MODELS).items():
        cfg = get_preset(preset).config().replace(**flat)
        specs = MFU_SPECS.get(name, ["none", "full:uniform:1"])
        times = interleaved_step_times(cfg, specs, rounds, device, dtype)
        for spec in specs:
            median = statistics.median(times[spec])
            ratios = [t / n - 1 for t, n in zip(times[spec], times["none"], strict=True)]
            c = cfg.with_recompute(spec)
            tp = throughput(c, median, ceiling)
            executed = step_flops(c, executed=True) + recompute_flops(c, executed=True)
            rows.append(
                {
                    "model": name,
                    "recompute": spec,
                    "step_time_s": median,
                    "model_tflops": tp.model_tflops,
                    "hardware_tflops": tp.hardware_tflops,
                    "mfu": tp.mfu,
                    "overhead_median": statistics.median(ratios),
                    "overhead_min": min(ratios),
                    "overhead_max": max(ratios),
                    "overhead_predicted": tp.predicted_overhead,
                    "overhead_predicted_model_flops": model_recompute_flops_fraction(c),
                    "executed_utilisation": executed / median / 1e12 / ceiling,
                }
            )
            r = rows[-1]
            print(
                f"{name:12s} {spec:36s} {1e3 * median:8.1f} ms MFU {tp.mfu:6.1%} overhead "
                f"{r['overhead_median']:+.1%} [{r['overhead_min']:+.1%}, "
                f"{r['overhead_max']:+.1%}] predicted {tp.predicted_overhead:+.1%} "
                f"executed/ceiling {r['executed_utilisation']:.1%}",
                flush=True,
            )
        if cfg.model.num_moe_experts:
            layer_times = moe_layer_time(cfg, rounds, device, dtype)
            ffn = layer_forward_flops(cfg.model, moe_layer=True)
            flops = 3 * sum(ffn.get(k, 0.0) for k in ("router", "experts", "shared_experts"))
            median = statistics.median(layer_times)
            rows.append(
                {
                    "model": name,
                    "recompute": "moe layer fwd+bwd",
                    "step_time_s": median,
                    "model_tflops": flops / median / 1e12,
                    "mfu": flops / median / 1e12 / ceiling,
                    "spread_s": [min(layer_times), max(layer_times)],
                }
            )
            print(f"{name:12s} MoE layer fwd+bwd MFU {rows[-1]['mfu']:.1%}", flush=True)
    return {"ceiling_tflops": ceiling, "rounds": rounds, "rows": rows}


def oom_section(out: Path) -> list[dict]:
    """A budget halfway between the measured reserved peaks of full recompute and no recompute
    (the ablation's own training loop: bf16 AdamW), so some configs must OOM."""
    name = "gpt-scaled"
    cfg = config(name)
    probe = AblationSetup(
        cfg, name, ["none", "full:uniform:1"], steps=2, warmup=1, device="cuda", dtype="bf16"
    )
    # The cap limits the allocator's reserved memory (allocated + fragmentation), so the
    # budget sits between the two configs' reserved peaks.
    peaks = {r["recompute"]: r["peak_reserved_bytes"] for r in run_ablation(probe, out / "probe")}
    budget = (peaks["none"] + peaks["full:uniform:1"]) / 2 / GIB
    torch.cuda.empty_cache()
    setup = AblationSetup(
        cfg,
        name,
        SPECS[name],
        steps=5,
        warmup=2,
        device="cuda",
        dtype="bf16",
        memory_budget_gb=budget,
    )
    rows = run_ablation(setup, out / "ablation-oom")
    return [
        {
            "budget_gb": budget,
            **{
                k: r[k]
                for k in (
                    "recompute",
                    "status",
                    "result",
                    "peak_memory_bytes",
                    "estimated_total_bytes",
                    "tflops_per_gpu",
                    "vs_golden",
                    "error",
                )
            },
        }
        for r in rows
    ]


def markdown(results: dict) -> str:
    lines = [
        f"## GPU figures ({results['device']}, {results['date']})",
        "",
        f"`{results['command']}`, torch {results['torch']}",
        "",
    ]
    lines += [
        "### Estimate vs CUDA allocator (bf16)",
        "",
        "| model | recompute | saved, measured (GiB) | saved est/meas | peak act, measured "
        "(GiB) | peak est/meas |",
        "|---|---|---|---|---|---|",
    ]
    for r in results.get("memory", []):
        lines.append(
            f"| {r['model']} | {r['recompute']} | {r['measured_saved_bytes'] / GIB:.3f} "
            f"| {r['saved_ratio']:.4f} | {r['measured_peak_bytes'] / GIB:.3f} | "
            f"{r['peak_ratio']:.4f} |"
        )
    lines += [
        "",
        "### Step time vs no recompute (median of 10 steps, one run)",
        "",
        "| model | recompute | step (ms) | step vs none | predicted extra FLOPs "
        "| peak allocated (GiB) | peak reserved (GiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r["model"] for r in results.get("timing", [])):
        rows = [r for r in results["timing"] if r["model"] == model]
        base = next((r for r in rows if r["recompute"] == "none" and r["step_time_s"]), None)
        for r in rows:
            ratio = (
                f"{r['step_time_s'] / base['step_time_s'] - 1:+.1%}"
                if base and r["step_time_s"]
                else "-"
            )
            step = f"{1000 * r['step_time_s']:.1f}" if r["step_time_s"] else "-"
            peak = f"{r['peak_memory_bytes'] / GIB:.2f}" if r["peak_memory_bytes"] else "-"
            held = r.get("peak_reserved_bytes")
            reserved = f"{held / GIB:.2f}" if held else "-"
            lines.append(
                f"| {model} | {r['recompute']} | {step} | {ratio} | "
                f"{100 * r['recompute_flops_fraction']:.1f}% | {peak} | {reserved} |"
            )
    if results.get("oom"):
        lines += [
            "",
            f"### Ablation under a {results['oom'][0]['budget_gb']:.2f} GiB budget "
            "(set_per_process_memory_fraction)",
            "",
            "| recompute | result | peak (GiB) | vs golden |",
            "|---|---|---|---|",
        ]
        for r in results["oom"]:
            peak = f"{r['peak_memory_bytes'] / GIB:.2f}" if r["peak_memory_bytes"] else "-"
            vs = f"{r['vs_golden']:+.1%}" if r.get("vs_golden") is not None else "-"
            lines.append(f"| {r['recompute']} | {r['result']} | {peak} | {vs} |")
    if results.get("mfu"):
        mfu = results["mfu"]
        lines += [
            "",
            f"### MFU and overhead vs the FLOP model (bf16; matmul ceiling "
            f"{mfu['ceiling_tflops']:.1f} TFLOP/s measured; {mfu['rounds']} interleaved rounds)",
            "",
            "| model | recompute | step (ms) | model TFLOP/s | MFU | executed FLOP/s / ceiling "
            "| overhead median [min, max] | predicted (executed FLOPs) | predicted (model FLOPs) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in mfu["rows"]:
            over = (
                f"{r['overhead_median']:+.1%} [{r['overhead_min']:+.1%}, {r['overhead_max']:+.1%}]"
                if "overhead_median" in r
                else "-"
            )
            pred = f"{r['overhead_predicted']:+.1%}" if "overhead_predicted" in r else "-"
            pred_model = (
                f"{r['overhead_predicted_model_flops']:+.1%}"
                if "overhead_predicted_model_flops" in r
                else "-"
            )
            used = f"{r['executed_utilisation']:.1%}" if "executed_utilisation" in r else "-"
            lines.append(
                f"| {r['model']} | {r['recompute']} | {1e3 * r['step_time_s']:.1f} "
                f"| {r['model_tflops']:.1f} | {r['mfu']:.1%} | {used} | {over} | {pred} "
                f"| {pred_model} |"
            )
    for key in ("errors",):
        for err in results.get(key, []):
            lines += ["", f"error in {err['section']}: `{err['error']}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="gpu_results.json and gpu_results.md")
    parser.add_argument("--work", default="/tmp/recompute-kit-gpu", help="ablation folders")
    parser.add_argument("--sections", default="memory,timing,oom,mfu", help="which to run")
    parser.add_argument("--rounds", type=int, default=7, help="MFU section rounds")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    results = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "PYTHONPATH=. python3 benchmarks/gpu.py --out DIR " + " ".join(sys.argv[1:]),
        "errors": [],
    }
    for section, fn in (
        ("memory", memory_section),
        ("timing", lambda: timing_section(work)),
        ("oom", lambda: oom_section(work)),
        ("mfu", lambda: mfu_section(rounds=args.rounds)),
    ):
        if section not in args.sections.split(","):
            continue
        start = time.time()
        try:
            results[section] = fn()
        except Exception as exc:  # keep the other sections' figures
            results["errors"].append({"section": section, "error": repr(exc)[:500]})
            traceback.print_exc()
        print(f"section {section}: {time.time() - start:.0f} s", flush=True)
        (out / "gpu_results.json").write_text(json.dumps(results, indent=2, default=str))
        (out / "gpu_results.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
