"""The error band a plan's estimate carries, and near-ties between candidates.

The band is what the estimate can miss by on its path, plus the memory beside PyTorch's tensors
that the estimate leaves out:

* activations: 1% of the peak on Megatron-Core's local spec (`transformer_impl: local`), where
  every layer's saved bytes equal real Megatron-Core 0.16.1's (benchmarks/RESULTS.md,
  "Estimator vs real Megatron-Core per rank", exact per layer) and the estimator's tolerance
  against measured steps is 1% (RESULTS.md, "Estimator vs measurement": worst 0.2% at full
  size). 10% on the Transformer Engine path (`transformer_impl: transformer_engine`, fused
  norms and TE's flash/fused attention): no run of TE's modules checks the estimate (TE does
  not install on a CPU), and an independent bottom-up count (issue #20) disagreed with it by
  5-40%, so the band is a stated one, not a measured one.
* weights, gradients and optimizer states: 0 (parameter counts equal Megatron-Core's on every
  rank, tests/test_megatron_parity.py).
* the CUDA context, memory/overheads.py's CUDA_CONTEXT_BYTES per process (CUDA >= 11.7 with
  lazy loading takes 300-500 MiB; doctor rule outside_allocator.py), and GEMM workspaces, 64 MiB
  (PyTorch's cuBLAS workspace on Hopper, `:4096:8` = 32 MiB, plus Transformer Engine's 32 MiB
  cuBLASLt workspace).

The allocator's fragmentation and NCCL's buffers stay in `--safety-margin`. The estimate's
other named terms beside the tensors it counts (memory/overheads.py: the MoE routing
imbalance or expert capacity, the allgather dispatcher's buffers, a ZeRO-3 / FSDP unit's
gathered parameters or autocast's weight copies, DeepSpeed ZeRO's gradient buckets) are
memory the run holds: they count
against the usable memory (`planned_bytes`). A candidate "clears the band" when that plus the
band fits the usable memory; the planner prefers a cheaper setting only when it clears the
band too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config
from ..memory.estimate import Estimate
from ..memory.overheads import CUDA_CONTEXT_BYTES

SAFETY_MARGIN = 0.1  # the budget's share kept back by default (--safety-margin)
MIB = 2**20
LOCAL_BAND = 0.01
TE_BAND = 0.10
WORKSPACE_BYTES = 64 * MIB
# Two candidates whose recompute costs differ by less than this share of the step's FLOPs are
# a near-tie (the kit's choice, not a measurement: half a percent of a step is within the
# run-to-run spread of step times one would compare them by).
TIE_FLOPS = 0.005


# Host memory a GPU's offloaded activations may take: a DGX H100 has 2 TiB of system memory
# for 8 GPUs (256 GiB each); 32 GiB of each share is left to the OS, data loading and the
# pinned staging buffers. An assumption, said where an offloading setting is refused for it.
HOST_MEMORY_PER_GPU_BYTES = 224 * 2**30


def fits_host(est: Estimate) -> bool:
    """Whether the activations the setting offloads (all micro-batches in flight) fit the
    host memory of one GPU's share (HOST_MEMORY_PER_GPU_BYTES)."""
    return est.offloaded_bytes <= HOST_MEMORY_PER_GPU_BYTES


def planned_bytes(est: Estimate) -> int:
    """What the run holds per rank against the usable memory: the estimate's total plus its
    named terms that neither the safety margin nor the band covers (module docstring)."""
    return est.held_bytes


@dataclass(frozen=True)
class Band:
    path: str  # "local" or "transformer_engine"
    activation_fraction: float
    activation_bytes: int
    cuda_context_bytes: int
    workspace_bytes: int
    source: str

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.cuda_context_bytes + self.workspace_bytes

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "activation_fraction": self.activation_fraction,
            "activation_bytes": self.activation_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "workspace_bytes": self.workspace_bytes,
            "total_bytes": self.total_bytes,
            "source": self.source,
        }


def error_band(config: Config, est: Estimate) -> Band:
    """The band of one candidate's estimate (see the module docstring)."""
    local = config.model.transformer_impl == "local"
    fraction = LOCAL_BAND if local else TE_BAND
    source = (
        "local spec: measured parity with Megatron-Core 0.16.1 (benchmarks/RESULTS.md)"
        if local
        else f"Transformer Engine path ({config.model.attention_backend} attention): stated, "
        "not measured (TE's modules are not run against the estimate)"
    )
    return Band(
        "local" if local else "transformer_engine",
        fraction,
        round(fraction * est.peak_activation_bytes),
        CUDA_CONTEXT_BYTES,
        WORKSPACE_BYTES,
        source,
    )


def tie_reason(
    best_name: str, best, other_name: str, other, band_bytes: int, dflops: float | None = None
) -> str:
    """Why to pick `best` over a near-tie `other`, or `other` over `best`. `best` and `other`
    are Estimates; `band_bytes` the best's error band; `dflops` the difference of the step's
    recompute cost (else of the estimates' own stages)."""
    gib = 2**30
    if dflops is None:
        dflops = other.recompute_flops_fraction - best.recompute_flops_fraction
    room = best.total_bytes - other.total_bytes  # > 0: other leaves more headroom
    cost = (
        f"{dflops:+.2%} of the step's FLOPs"
        if abs(dflops) >= 5e-5
        else (
            "no more matmul FLOPs (the extra recompute is elementwise, memory-bound kernels: "
            "+1.5% to +8.7% step time measured for moe_act / layernorm on an H100, "
            "benchmarks/RESULTS.md)"
        )
    )
    if room > band_bytes:
        return (
            f"{room / gib:.1f} GiB more headroom, more than the band, for {cost}: pick it if "
            f"the run is near the limit, {best_name} for speed"
        )
    if -room > band_bytes:
        return f"{-room / gib:.1f} GiB less headroom, more than the band, for {cost}"
    if dflops > 0:
        return f"{best_name} recomputes {dflops:.2%} less of the step; memory within the band"
    if best_name.startswith("full:") and other_name.startswith("full:"):
        # whole layers both: the same FLOPs, groups of another size (uniform N)
        return "same cost, memory within the band: both recompute whole layers"
    return f"same cost, memory within the band: {best_name} recomputes fewer modules"
