"""Produce the real CUDA samples in this folder. Needs a CUDA GPU; run from the repo root:

    python tests/data/evidence/make_gpu_samples.py OUTDIR

Writes, all straight from PyTorch's own functions (nothing edited by hand):

* cuda_snapshot.pickle   - torch.cuda.memory._dump_snapshot() after freeing some blocks, a
                           CUDA-graph private pool and an OOM (history kept to 64 entries);
* memory_stats.json      - json.dumps(torch.cuda.memory_stats()) at the same moment;
* memory_stats_repr.txt  - print(torch.cuda.memory_stats()), the printed dict;
* cuda_oom.json          - str() and traceback.format_exc() of real OutOfMemoryErrors:
                           plain, under set_per_process_memory_fraction ("allowed"), and with
                           memory held in a CUDA graph's private pool; plus the versions.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch


def _oom(variant: str, nbytes: int) -> dict[str, str]:
    try:
        torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as exc:
        return {
            "variant": variant,
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    raise SystemExit(f"{variant}: allocating {nbytes} bytes did not fail")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=64, stacks="python")
    sizes = (3 << 20, 5 << 20, 7 << 20, 11 << 20, 1 << 10, 600, 4 << 20, 25 << 20)
    blocks = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    del blocks[1], blocks[2]  # free blocks between live ones: inactive split blocks
    # A CUDA graph whose output lives in the graph's private pool.
    x = torch.ones(8 << 20, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = x * 2
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    del y  # the graph keeps its pool: the freed output is cached there ("private pools")
    torch.cuda.synchronize()
    ooms = [_oom("private_pool", 1 << 40)]
    del graph
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.01)
    ooms.append(_oom("allowed", total // 20))
    torch.cuda.set_per_process_memory_fraction(1.0)
    ooms.append(_oom("plain", 1 << 40))
    torch.cuda.memory._dump_snapshot(str(out / "cuda_snapshot.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    (out / "memory_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    (out / "memory_stats_repr.txt").write_text(f"{stats}\n")
    meta = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "live_blocks": len(blocks),
    }
    (out / "cuda_oom.json").write_text(json.dumps({"meta": meta, "ooms": ooms}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
