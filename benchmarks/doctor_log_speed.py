"""How fast `recompute-kit doctor --log` reads a large training log, and in how much memory.

    .venv/bin/python benchmarks/doctor_log_speed.py [--mb 100] [--keep PATH] [--json]

Writes a deterministic Megatron-LM training log of about `--mb` MB: iteration lines in the
format of megatron/training/training.py (the microsecond timestamp of Megatron-LM main,
https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/training.py#L3567-L3650,
as in the verbatim line of https://github.com/NVIDIA/Megatron-LM/pull/5662), a per-rank memory
report every 100 iterations, and at the end an OOM traceback whose message is PyTorch's
(https://github.com/pytorch/pytorch/issues/16417). Then runs `recompute-kit doctor --log FILE
--json` in this process and prints the wall time, the time per MB, the peak RSS growth
(resource.getrusage) and, in a second run, tracemalloc's peak of Python allocations, beside the
file size. Issue #21 asks for under 5 s and under 2x the file's size in memory for 100 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ITERATION = (
    "[{stamp}] iteration {it:8d}/{total:8d} | consumed samples: {samples:12d} | "
    "elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | "
    "learning rate: {lr:.6E} | global batch size:  1024 | lm loss: {loss:.6E} | "
    "loss scale: 1.0 | grad norm: {gn:.3f} | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |\n"
)
MEMORY = (
    "[Rank 0] (after {it} iterations) memory (MB) | allocated: 33270.16 | max allocated: "
    "65670.39 | reserved: 70406.00 | max reserved: 70406.00\n"
)
OOM_TAIL = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 288, in <module>
[rank0]:     pretrain(
[rank0]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 386, in pretrain
[rank0]:     iteration, num_floating_point_operations_so_far = train(
[rank0]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 1451, in train
[rank0]:     train_step(forward_step_func,
"""
OOM_TAIL += (  # PyTorch's message, one line
    "[rank0]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.0"
    "0 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Inclu"
    "ding non-PyTorch memory, this process has 23.60 GiB memory in use. Of the alloca"
    "ted memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTo"
    "rch but unallocated. If reserved but unallocated memory is large try setting PYT"
    "ORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See docum"
    "entation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
    "#environment-variables)"
    "\n"
)


def write_log(path: Path, megabytes: float) -> int:
    """A deterministic Megatron log of about `megabytes` MB (10^6 bytes); returns its size."""
    target = int(megabytes * 1_000_000)
    size = 0
    it = 0
    with open(path, "w", encoding="utf-8") as fh:
        chunk: list[str] = []
        while size < target:
            it += 1
            sec = it * 0.744
            stamp = (
                f"2026-07-10 {5 + int(sec // 3600) % 19:02d}:{int(sec // 60) % 60:02d}:"
                f"{int(sec) % 60:02d}.{(it * 7919) % 1_000_000:06d}"
            )
            line = ITERATION.format(
                stamp=stamp,
                it=it,
                total=10_000_000,
                samples=it * 1024,
                ms=744.0 + (it * 37) % 50 / 10,
                tflops=402.0 + (it * 13) % 30 / 10,
                lr=3e-4 * (1 - it / 10_000_000),
                loss=2.0 + ((it * 7) % 100) / 1000,
                gn=0.5 + ((it * 11) % 100) / 1000,
            )
            if it % 100 == 0:
                line += MEMORY.format(it=it)
            chunk.append(line)
            size += len(line)
            if len(chunk) >= 4096:
                fh.write("".join(chunk))
                chunk = []
        chunk.append(OOM_TAIL)
        fh.write("".join(chunk))
    return path.stat().st_size


class _Tail:
    """stdout for the run: keeps only the last 256 KB written (the findings come last), so the
    output is not counted as the doctor's memory."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.held = 0
        self.bytes = 0

    def write(self, text: str) -> int:
        self.bytes += len(text)
        self.parts.append(text)
        self.held += len(text)
        if self.held > 512 << 10:
            self.parts = [self.tail]
            self.held = len(self.parts[0])
        return len(text)

    @property
    def tail(self) -> str:
        return "".join(self.parts)[-(256 << 10) :]

    def flush(self) -> None:
        pass


def run_doctor(path: Path) -> dict:
    """`recompute-kit doctor --log PATH --json` in this process: the output's size and its
    findings."""
    from recompute_kit.cli import main

    out = _Tail()
    with contextlib.redirect_stdout(out):  # type: ignore[type-var]
        rc = main(["doctor", "--log", str(path), "--json"])
    if rc != 0:
        raise SystemExit(f"doctor exited {rc}")
    at = out.tail.rfind('\n  "findings": ')
    findings = json.JSONDecoder().raw_decode(out.tail, at + len('\n  "findings": '))[0]
    return {"output_bytes": out.bytes, "findings": findings}


def _rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def measure(path: Path, *, traced: bool = True) -> dict:
    """Wall time and memory of one doctor run over `path` (the second run under tracemalloc)."""
    size = path.stat().st_size
    import recompute_kit.cli
    import recompute_kit.doctor.engine  # noqa: F401

    run_doctor(Path(__file__))  # warm: rule catalog and regexes compiled
    gc.collect()
    rss0 = _rss_bytes()
    t0, c0 = time.perf_counter(), time.process_time()
    doc = run_doctor(path)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_growth = max(0, _rss_bytes() - rss0)
    out = {
        "file_bytes": size,
        "seconds": round(seconds, 3),
        "seconds_per_mb": round(seconds / (size / 1e6), 4),
        "cpu_seconds": round(cpu, 3),  # this process's CPU time: steadier on a loaded machine
        "peak_rss_growth_bytes": rss_growth,
        "output_bytes": doc["output_bytes"],
        "top_category": (doc["findings"] or [{}])[0].get("category"),
    }
    if traced:
        gc.collect()
        tracemalloc.start()
        run_doctor(path)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["tracemalloc_peak_bytes"] = peak
        out["tracemalloc_peak_over_file"] = round(peak / size, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="log size in MB (default 100)")
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    parser.add_argument("--no-trace", action="store_true", help="skip the tracemalloc run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "megatron_train.log"
        if not (args.keep and path.exists() and os.path.getsize(path)):
            write_log(path, args.mb)
        result = measure(path, traced=not args.no_trace)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    mb = result["file_bytes"] / 1e6
    print(f"log: {mb:.1f} MB of Megatron iteration lines ending in an OOM")
    print(
        f"doctor --log --json: {result['seconds']:.2f} s wall ({result['seconds_per_mb']:.3f} "
        f"s/MB), {result['cpu_seconds']:.2f} s CPU"
    )
    print(f"peak RSS growth: {result['peak_rss_growth_bytes'] / 1e6:.1f} MB")
    if "tracemalloc_peak_bytes" in result:
        print(
            f"tracemalloc peak: {result['tracemalloc_peak_bytes'] / 1e6:.1f} MB "
            f"({result['tracemalloc_peak_over_file']:.2f}x the file)"
        )
    print(f"top finding: {result['top_category']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
