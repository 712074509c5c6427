"""Grouped GEMM (torch._grouped_mm) against the per-expert loop, for the MoE experts' fc1 + fc2
forward and backward, in interleaved rounds (every round runs each variant once per case, in
alternating order), reporting the median loop/grouped time ratio and its spread (min-max over
rounds).

    PYTHONPATH=. python3 benchmarks/moe_grouped.py [--device cuda --dtype bf16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from recompute_kit.layers.moe import expert_offsets, grouped_matmul

CASES = [  # (experts, top-k, tokens)
    (8, 2, 1024),
    (8, 2, 8192),
    (64, 8, 1024),
    (64, 8, 8192),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_case(experts, topk, tokens, hidden, ffn, device, dtype):
    gen = torch.Generator().manual_seed(0)
    picks = torch.randint(0, experts, (tokens * topk,), generator=gen).sort().values
    offsets = expert_offsets(picks.to(device), experts)
    x = torch.randn(tokens * topk, hidden, generator=gen).to(device, dtype)
    w1 = torch.randn(experts, hidden, ffn, generator=gen).to(device, dtype) / hidden**0.5
    w2 = torch.randn(experts, ffn, hidden, generator=gen).to(device, dtype) / ffn**0.5
    return x, w1.requires_grad_(), w2.requires_grad_(), offsets


def run_once(case, grouped: bool, device) -> float:
    x, w1, w2, offsets = case
    x = x.detach().requires_grad_()
    _sync(device)
    start = time.perf_counter()
    out = grouped_matmul(torch.relu(grouped_matmul(x, w1, offsets, grouped)), w2, offsets, grouped)
    out.backward(torch.ones_like(out))
    _sync(device)
    elapsed = time.perf_counter() - start
    w1.grad = w2.grad = None
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(
        f"device {device} dtype {args.dtype} hidden {args.hidden} ffn {args.ffn} "
        f"rounds {args.rounds}; fc1+fc2 forward+backward",
        flush=True,
    )
    print("| experts | top-k | tokens | loop (ms) | grouped (ms) | loop/grouped median | min-max |")
    print("|---|---|---|---|---|---|---|")
    for experts, topk, tokens in CASES:
        case = make_case(experts, topk, tokens, args.hidden, args.ffn, device, dtype)
        for grouped in (True, False):  # warm-up
            run_once(case, grouped, device)
        times = {True: [], False: []}
        for r in range(args.rounds):
            for grouped in (True, False) if r % 2 else (False, True):
                times[grouped].append(run_once(case, grouped, device))
        ratios = [lo / gr for lo, gr in zip(times[False], times[True], strict=True)]
        print(
            f"| {experts} | {topk} | {tokens} | {1e3 * statistics.median(times[False]):.1f} "
            f"| {1e3 * statistics.median(times[True]):.1f} | {statistics.median(ratios):.2f} "
            f"| {min(ratios):.2f}-{max(ratios):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
