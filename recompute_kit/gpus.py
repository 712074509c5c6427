"""GPUs' memory as the GPU reports it to PyTorch, for `plan --gpu NAME`.

The figure is the `total capacity` of PyTorch's out-of-memory message, which is
`torch.cuda.get_device_properties(i).total_memory` (= `torch.cuda.mem_get_info()[1]`) in GiB:
what the driver leaves after its own reservation, less than the marketing "80 GB" (an H100
80GB reports about 79.1 GiB, not 80). Each entry is the lowest figure seen for the device, with
where it was seen; devices whose figure we have no public report of (GH200, ...) are not
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
            "b200",
            178.3,
            "NVIDIA B200",
            "OOM message on a B200: 'total capacity of 178.35 GiB' (stas00/ml-engineering "
            "debug/pytorch.md, 'On NVIDIA B200 w/ 180GiB'); 2,250 dense BF16 TFLOP/s at "
            "1,000 W (HGX B200, glennklockwood.com/garden/processors/B200 from NVIDIA's "
            "figures); NVLink 5 at 1.8 TB/s both ways; the host link taken as an x86 HGX "
            "server's PCIe 5 (not stated there)",
            2250.0,
            900.0,
        ),
        Gpu(
            "gb200",
            184.3,
            "NVIDIA GB200",
            "OOM messages on GB200: 'total capacity of 184.31 GiB' (vllm-project/vllm#43951, "
            "#52511: '4x NVIDIA GB200 (184 GiB)'); 2,500 dense BF16 TFLOP/s at 1,200 W (GB200 "
            "variant, glennklockwood.com/garden/processors/B200); NVLink 5 at 1.8 TB/s both "
            "ways; its Grace host over NVLink-C2C",
            2500.0,
            900.0,
            "nvlink-c2c",
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
        Gpu(
            "a800-80gb",
            79.3,
            "NVIDIA A800-SXM4-80GB",
            "OOM messages on A800 80GB: '79.35 GiB total capacity' (hiyouga/LlamaFactory#1158, "
            "deepseek-ai/DeepSeek-Coder#78); A100's compute with NVLink at 400 GB/s",
            312.0,
            200.0,
            "pcie4",
        ),
        Gpu(
            "v100-32gb",
            31.7,
            "Tesla V100-SXM2-32GB",
            "OOM messages on V100 32GB: '31.75 GiB total capacity' (hiyouga/LlamaFactory#1221, "
            "#182); no BF16: its 125 TFLOP/s are FP16 tensor cores (V100 datasheet), "
            "NVLink 2 at 300 GB/s",
            125.0,
            150.0,
            "pcie3",
        ),
        Gpu(
            "rtx-a6000",
            44.5,
            "NVIDIA RTX A6000",
            "OOM message on RTX A6000 48GB: 'total capacity of 44.55 GiB' "
            "(modelscope/ms-swift#2753); 154.8 dense FP16/BF16 tensor TFLOP/s with FP32 "
            "accumulate (GA102 whitepaper); a two-card NVLink bridge at 112.5 GB/s",
            154.8,
            56.0,
            "pcie4",
        ),
        Gpu(
            "rtx-4090",
            23.6,
            "NVIDIA GeForce RTX 4090",
            "OOM messages on RTX 4090 24GB: 'total capacity of 23.64 GiB' (ali-vilab/VGen#104), "
            "'total capacity of 23.61 GiB' (pinokiofactory/flux-webui#11), '23.65 GiB total "
            "capacity' (tloen/llama-int8#7); one says '23.99 GiB total capacity' "
            "(hpcaitech/ColossalAI#4962): the least is taken; 165.2 dense BF16 tensor TFLOP/s "
            "with FP32 accumulate (Ada whitepaper); no NVLink or peer-to-peer: GPUs talk over "
            "PCIe 4",
            165.2,
            32.0,
            "pcie4",
        ),
        Gpu(
            "rtx-3090",
            23.5,
            "NVIDIA GeForce RTX 3090",
            "OOM messages on RTX 3090 24GB: '23.69 GiB total capacity' "
            "(jwkirchenbauer/lm-watermarking#15), 'total capacity of 23.56 GiB' "
            "(roboflow/rf-detr#1084); 71 dense BF16 tensor TFLOP/s with FP32 accumulate (GA102 "
            "whitepaper); a two-card NVLink bridge at 112.5 GB/s",
            71.0,
            56.0,
            "pcie4",
        ),
    )
}


def gpu_names() -> list[str]:
    return list(GPUS)
