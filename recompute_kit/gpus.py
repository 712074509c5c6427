"""GPUs' memory as the GPU reports it to PyTorch, for `plan --gpu NAME`.

The figure is the `total capacity` of PyTorch's out-of-memory message, which is
`torch.cuda.get_device_properties(i).total_memory` (= `torch.cuda.mem_get_info()[1]`) in GiB:
what the driver leaves after its own reservation, less than the marketing "80 GB" (an H100
80GB reports about 79.1 GiB, not 80). Each entry is the lowest figure seen for the device, with
where it was seen; devices whose figure we have no public report of (GH200, B200, ...) are not
listed: pass `--gpu-memory-gb` with what `nvidia-smi --query-gpu=memory.total` or
`torch.cuda.mem_get_info()` says on yours.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    usable_gib: float  # total_memory as PyTorch reports it, GiB (2**30 bytes)
    device: str  # the device name as the driver prints it
    source: str  # where the figure was seen
    # dense BF16 tensor-core peak, TFLOP/s, NVIDIA's datasheets (H100 SXM / H200 989, H100 NVL
    # 835 (its 1,671 is with sparsity), A100 312): the step-time model scales its
    # executed-rate assumption by it (plan/step_time.py)
    dense_bf16_tflops: float = 989.0
    # NVLink per direction, GB/s (H100 SXM / H200: NVLink 4, 900 GB/s both ways; A100 SXM:
    # NVLink 3, 600; H100 NVL: its bridge, 600): the context-parallel ring inside a node
    nvlink_gbps: float = 450.0
    host_link: str = "pcie5"  # the host link its servers have (A100 systems: PCIe 4)


GPUS = {
    g.name: g
    for g in (
        Gpu(
            "h100-80gb",
            79.1,
            "NVIDIA H100 80GB HBM3",
            "OOM messages on H100 80GB: 'total capacity of 79.11 GiB' "
            "(vllm-project/vllm#27508, NVIDIA-NeMo/Automodel PR #1948), 79.18 GiB "
            "(tests/data/evidence/cuda_oom.json, NVIDIA H100 80GB HBM3)",
        ),
        Gpu(
            "h100-nvl",
            93.0,
            "NVIDIA H100 NVL (94 GB)",
            "OOM message on an H100 NVL 94GB: 'total capacity of 93.00 GiB' (ali-vilab/VACE#56)",
            835.0,
            300.0,
        ),
        Gpu(
            "h200",
            139.8,
            "NVIDIA H200 (141 GB)",
            "OOM message on H200: 'total capacity of 139.81 GiB' (THUDM/slime#1951, "
            "tests/corpus/cases/a_slime_1951_logprobs_oom_58gib.yaml)",
        ),
        Gpu(
            "a100-80gb",
            79.1,
            "NVIDIA A100-SXM4-80GB",
            "OOM messages on A100 80GB: 'total capacity of 79.14 GiB' "
            "(lianqi1008/Control-GIC#6), '79.25 GiB total capacity' (levihsu/OOTDiffusion#235)",
            312.0,
            300.0,
            "pcie4",
        ),
        Gpu(
            "a100-40gb",
            39.5,
            "NVIDIA A100 40GB",
            "OOM message on one A100 (40 GB): 'total capacity of 39.50 GiB' (TianheWu/CoSeR#10)",
            312.0,
            300.0,
            "pcie4",
        ),
    )
}


def gpu_names() -> list[str]:
    return list(GPUS)
