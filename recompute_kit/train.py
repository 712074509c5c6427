"""A small trainer for the presets that logs like Megatron-LM, for `ablate --command-template`.

    python -m recompute_kit.train --model tiny-gpt --train-iters 10 \\
        --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
    torchrun --nproc-per-node 2 -m recompute_kit.train --model tiny-moe ...

Recompute flags are Megatron-LM's. Under torchrun it trains with DistributedDataParallel
(gloo on CPU, NCCL on CUDA). It prints Megatron's iteration lines and `report_memory` lines
(on a CPU the live-tensor tracker stands in for the CUDA allocator), so the doctor's parsers
read its log exactly as they read Megatron's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from .config import ConfigError, config_from_dict
from .memory.flops import step_flops
from .memory.measure import LiveTensorTracker, make_batch, resolve_device, resolve_dtype
from .presets import get_preset

MB = 1024.0 * 1024.0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    parser = argparse.ArgumentParser(
        prog="python -m recompute_kit.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="tiny-gpt", help="a runnable preset")
    parser.add_argument("--train-iters", type=int, default=10)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--recompute-granularity", choices=["full", "selective"])
    parser.add_argument("--recompute-method", choices=["uniform", "block"])
    parser.add_argument("--recompute-num-layers", type=int)
    parser.add_argument("--recompute-modules", nargs="*")
    parser.add_argument(
        "--recompute-activations",
        action="store_true",
        help="Megatron's shorthand for --recompute-granularity selective",
    )
    parser.add_argument("--seq-length", type=int)
    parser.add_argument("--micro-batch-size", type=int)
    args = parser.parse_args(argv)
    flat = {
        "recompute_granularity": args.recompute_granularity
        or ("selective" if args.recompute_activations else None),
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "recompute_modules": args.recompute_modules,
    }
    for key in ("seq_length", "micro_batch_size"):
        if getattr(args, key) is not None:
            flat[key] = getattr(args, key)
    return args, flat


def main(argv: list[str] | None = None) -> int:
    try:
        args, flat = parse_args(argv)
        base = get_preset(args.model)
        if not base.runnable:
            raise ConfigError(f"preset {args.model!r} is shape-only; train a runnable preset")
        config, _ = config_from_dict(flat, base=base.config())
        for warning in config.validate():
            print(f"WARNING: {warning}", flush=True)
    except ConfigError as exc:
        print(f"recompute_kit.train: error: {exc}", file=sys.stderr)
        return 1
    return train(config, args)


def train(config, args) -> int:
    from .layers import GPTModel

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(args.device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(args.seed)
    model = GPTModel(config).to(device, resolve_dtype(args.dtype))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    m = config.model
    flops = step_flops(config)
    last = rank == world - 1  # Megatron prints iteration lines on the last rank
    for iteration in range(1, args.train_iters + 1):
        tokens, labels = make_batch(config, device, args.seed + 1000 * iteration + rank)
        # The memory report covers iteration `report_at` (optimizer states exist by then); on a
        # CPU the live-tensor tracker watches its forward and backward.
        report_at = min(2, args.train_iters)
        tracker = (
            LiveTensorTracker(model) if device.type == "cpu" and iteration == report_at else None
        )
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        with tracker or _null():
            loss = model(tokens, labels)
            loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if iteration == report_at:
            _report_memory(rank, iteration, model, optimizer, device, tracker)
        if last and iteration % args.log_interval == 0:
            print(
                f" [{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
                f" iteration {iteration:8d}/{args.train_iters:8d} |"
                f" consumed samples: {iteration * m.micro_batch_size * world:12d} |"
                f" elapsed time per iteration (ms): {elapsed * 1000.0:.1f} |"
                f" throughput per GPU (TFLOP/s/GPU): {flops / elapsed / 1e12:.1f} |"
                f" learning rate: {1e-4:.6E} |"
                f" global batch size: {m.micro_batch_size * world:5d} |"
                f" lm loss: {loss.item():.6E} |"
                f" loss scale: 1.0 |"
                f" number of skipped iterations:   0 |"
                f" number of nan iterations:   0 |",
                flush=True,
            )
    if world > 1:
        # every rank done with its last allreduce, and DDP's reducer gone, before the group
        # is torn down (gloo aborts a process whose peer destroys it mid-collective)
        dist.barrier()
        del model, optimizer
        dist.destroy_process_group()
        # gloo's worker threads can abort the interpreter's own teardown ("terminate called
        # without an active exception", SIGABRT, seen in about 1 run in 3 on 2 CPU ranks): the
        # run is done and its lines are written, so the process ends here
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _report_memory(rank, iteration, model, optimizer, device, tracker) -> None:
    """Megatron's report_memory line. On CUDA the allocator's figures; on a CPU the live-tensor
    tracker's peak on top of the model state stands in for 'max allocated'."""
    if device.type == "cuda":
        allocated, peak = (
            torch.cuda.memory_allocated(device),
            torch.cuda.max_memory_allocated(device),
        )
        reserved, max_reserved = (
            torch.cuda.memory_reserved(device),
            torch.cuda.max_memory_reserved(device),
        )
    else:
        state = sum(p.numel() * p.element_size() for p in model.parameters()) * 2
        state += sum(
            t.numel() * t.element_size()
            for s in optimizer.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        )
        allocated, peak = state, state + (tracker.peak_bytes if tracker else 0)
        reserved, max_reserved = allocated, peak
    print(
        f"[Rank {rank}] (after {iteration} iterations) memory (MB)"
        f" | allocated: {allocated / MB:.2f} | max allocated: {peak / MB:.2f}"
        f" | reserved: {reserved / MB:.2f} | max reserved: {max_reserved / MB:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
