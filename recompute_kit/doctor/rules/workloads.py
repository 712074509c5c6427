"""Default readings by workload, for OOMs whose paste shows what kind of job failed: a vision
trainer whose images per batch x image size exceed the GPU (RK630), and host (CPU) RAM running
out where the paste shows no GPU OOM at all (RK660). Like rules/fallback.py, they answer in the
paste's own keys; GPU knobs are never the answer to a host-RAM failure.
"""

from __future__ import annotations

import re
from typing import Any

from ..types import Context, Match
from .fallback import numbered_steps
from .knobs import Knobs, read_knobs
from .registry import HALF, fact, gib, oom_errors, oom_where, rule

# --------------------------------------------------------------------------------------------
# RK630: a detection / segmentation workload that is too big for the GPU
# --------------------------------------------------------------------------------------------

_EVAL_WORDS = ("validation", "evaluat", "eval_", "_eval", "metric", "iou", "inference")


def _vision_patch(keys: dict[str, int], k: Knobs, detectron: bool) -> tuple[dict[str, Any], str]:
    """The paste's own images-per-batch key halved, else its image size cut by a quarter,
    else the trainer's key with no value in the paste."""
    for key, n in keys.items():
        if ("PER_BATCH" in key.upper() or key.lower().endswith("per_gpu")) and n > 1:
            return {key: n // 2}, f"{key} {n} -> {n // 2}"
    if k.batch is not None and k.batch[1] > 1:
        key, n = k.batch
        return {key: n // 2}, f"{key} {n} -> {n // 2}"
    for key, n in keys.items():
        if ("SIZE" in key.upper() or "SCALE" in key.upper()) and n >= 64:
            smaller = n * 3 // 4 // 32 * 32
            return {key: smaller}, f"{key} {n} -> {smaller} (about half the pixels)"
    if detectron:
        return {"SOLVER.IMS_PER_BATCH": HALF}, (
            "SOLVER.IMS_PER_BATCH halved (not set in the paste)"
        )
    return {"batch_size": HALF}, "the batch size halved"


@rule(
    "RK630",
    "A detection / segmentation workload: images per batch x image size exceed the GPU",
    "genuine_pressure",
    symptom="An OOM from a vision trainer (detectron2 / mmdetection / YOLO / DETR-style keys "
    "such as IMS_PER_BATCH, MIN_SIZE_TRAIN, samples_per_gpu, img_scale, or a detection / "
    "segmentation task in words), with no LLM sequence or adapter knobs",
    cause="A CNN / detector's memory scales with images per GPU x pixels per image and, for "
    "detection and segmentation, the instances (boxes, masks) per image; nothing is "
    "misconfigured, the workload is larger than this GPU. Activation recompute is rarely the "
    "lever there: the maintainers' answer is fewer or smaller images, or a larger GPU",
    confirm="Halve the images per batch (or the image size) for one run: the OOM goes",
    fix="Halve the images per GPU (detectron2 SOLVER.IMS_PER_BATCH, scaling SOLVER.BASE_LR "
    "with it; mmdet samples_per_gpu; batch_size); smaller images (INPUT.MIN_SIZE_TRAIN / "
    "MAX_SIZE_TRAIN, img_scale, imgsz); mixed precision (AMP); or a larger GPU",
    patch={"SOLVER.IMS_PER_BATCH": HALF},
    supersedes=("RK087", "RK005", "RK102", "RK170"),
)
def _vision_pressure(ctx: Context) -> Match | None:
    lines = fact(ctx, "vision_lines") or []
    if not lines:
        return None
    oom = ctx.oom
    if oom and oom.free_bytes and oom.requested_bytes and oom.free_bytes >= oom.requested_bytes:
        return None
    if not (oom or oom_errors(ctx) or fact(ctx, "oom_mentions")):
        return None
    k = read_knobs(ctx)
    if k.seq or k.lora is not None or k.zero is not None or k.fsdp or k.framework == "megatron":
        return None  # an LLM run: the default readings weigh its knobs
    keys: dict[str, int] = fact(ctx, "vision_keys") or {}
    text = " ".join(lines).lower()
    detectron = any("IMS_PER" in key.upper() or "SIZE_TRAIN" in key.upper() for key in keys) or (
        "detectron" in text or "train_net" in text
    )
    patch, first = _vision_patch(keys, k, detectron)
    steps = [first]
    if detectron:
        steps.append(
            "SOLVER.IMS_PER_BATCH counts the images of all GPUs together and the stock "
            "configs are written for 8 GPUs: on fewer GPUs scale it (and SOLVER.BASE_LR) down "
            "in proportion"
        )
    steps.append(
        "smaller images (INPUT.MIN_SIZE_TRAIN / MAX_SIZE_TRAIN, img_scale, imgsz): memory "
        "grows with the pixels"
    )
    steps.append(
        "images with many instances (boxes, masks) take far more memory than the others: cap "
        "the instances per image or split such images, as one of them can OOM a run after "
        "thousands of iterations"
    )
    where = f"{oom_where(ctx)} {text}"
    if any(w in where for w in _EVAL_WORDS):
        steps.insert(
            0,
            "the OOM is in evaluation: compute the metric's tensors (masks x ground truth x "
            "H x W) in chunks, or on the CPU, and keep fewer predictions per image",
        )
    steps.append("mixed precision (AMP / fp16), or a GPU with more memory")
    said = (
        f"The failed request is {gib(oom.requested_bytes)} with {gib(oom.free_bytes)} free of "
        f"{gib(oom.total_bytes)}. "
        if oom and oom.requested_bytes and oom.total_bytes and oom.free_bytes is not None
        else ""
    )
    keys_said = ", ".join(f"{key} = {n}" for key, n in list(keys.items())[:3])
    return Match(
        0.45,
        f"{said}The paste is a detection / segmentation workload ('{lines[0][:120]}'"
        + (f"; it sets {keys_said}" if keys_said else "")
        + f"): its memory is images x pixels x instances, not a sequence. Cheapest change "
        f"first: {steps[0]}.",
        config_patch=patch,
        fix="The workload is larger than this GPU, cheapest change first: " + numbered_steps(steps),
    )


# --------------------------------------------------------------------------------------------
# RK660: host (CPU) RAM exhausted, not the GPU's memory
# --------------------------------------------------------------------------------------------

# a shortage said in words, not a size ("CPU RSS: 592.20 MB, VMS: 5.79 GB" is a reading); 内存
# is said loosely of a GPU's memory: beside a GPU ("3*V100（16G），还是OOM？到底需要多少内存") it
# means the host only with a host word or a host size ("8*A800 80g and 96g memory")
_HOST_SHORT_RE = re.compile(
    r"(?<![A-Za-z])OOM|out of memory|exhaust|too small|not enough|consum|内存不足", re.I
)
_HOST_EXPLICIT_RE = re.compile(
    r"\b(?:host|cpu|system|node)[\s_-]?(?:memory|ram|mem)\b|(?<![vV])\bRAM\b|\bswap\b|\bRSS\b|系统内存"
    r"|主机内存|\d+\s*[GT]i?B?\s+(?:of\s+)?(?:memory|ram)\b",
    re.I,
)
_GPU_NAMED_RE = re.compile(
    r"\bGPU|(?<![A-Za-z])(?:[ABHL]\d{2,3}S?|[VP]100|T4|A6000|RTX\s?\d{4})(?![A-Za-z0-9])", re.I
)


def _host_shortage(line: str) -> bool:
    if not _HOST_SHORT_RE.search(line):
        return False
    return not _GPU_NAMED_RE.search(line) or bool(_HOST_EXPLICIT_RE.search(line))


_GPU_OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError: CUDA|显存|HIP out of memory", re.I)


@rule(
    "RK660",
    "Host (CPU) RAM is exhausted, not the GPU's memory",
    "genuine_pressure",
    symptom="A process killed by the OS ('Killed', the OOM killer, 'Cannot allocate memory', a "
    "DataLoader worker or Ray task killed for memory, SIGKILL / exitcode -9) or an OOM said of "
    "the machine's memory (RAM, host / CPU memory, 内存, per-process RSS), with no CUDA OOM",
    cause="The host's RAM, not a GPU's, runs out: every rank / DataLoader worker / rollout "
    "worker keeps its own copy of weights loaded on the CPU, CPU-offloaded optimizer states or "
    "parameters, or a dataset in memory; the sum outgrows the node",
    confirm="free -g and dmesg -T | grep -i 'killed process' during the run; the per-process "
    "RSS (top, ps) times the number of processes against the node's RAM",
    fix="More host RAM (or swap), fewer processes holding a CPU copy (fewer DataLoader workers, "
    "rollout workers, ranks per node), less CPU offload, load weights lazily (low_cpu_mem_usage, "
    "mmap); GPU memory knobs (batch, recompute) do not help",
    patch={"dataloader_num_workers": 0},
    supersedes=("RK005", "RK087", "RK102", "RK004", "RK001", "RK630"),
)
def _host_ram(ctx: Context) -> Match | None:
    if ctx.oom is not None or _GPU_OOM_RE.search(ctx.text):
        return None  # a CUDA OOM: the GPU's memory ran out, whatever the host says
    kills: list[str] = fact(ctx, "host_kill_lines") or []
    words = [w for w in fact(ctx, "host_memory_lines") or [] if _host_shortage(w)]
    rows: list[float] = fact(ctx, "host_rows") or []
    if not kills and not words:
        return None
    if not kills and not (fact(ctx, "oom_mentions") or oom_errors(ctx) or rows):
        return None  # host memory named, but nothing ran out
    big = [r for r in rows if r >= 1.0]
    said = f"'{(kills or words)[0][:140]}'"
    evidence = f"The OS, not CUDA, reports the shortage ({said}): host (CPU) RAM ran out."
    if len(big) >= 2:
        evidence += (
            f" {len(big)} processes hold {min(big):g}-{max(big):g} GB of host memory each, "
            f"{sum(big):.0f} GB together: each keeps its own CPU copy."
        )
    workers = next(
        (
            (key, v)
            for key, v in ctx.cfg.items()
            if key.endswith("num_workers") and isinstance(v, int)
        ),
        None,
    )
    patch: dict[str, Any]
    if workers is not None and workers[1] > 0:
        patch = {workers[0]: workers[1] // 2}
        first = f"{workers[0]} {workers[1]} -> {workers[1] // 2} (each worker holds a copy)"
    elif len(big) >= 2:
        need = int(sum(big) * 1.25 + 0.999)
        patch = {"command": "free -g; dmesg -T | grep -i -E 'killed process|out of memory'"}
        first = f"a node with at least {need} GB of host RAM (or swap), or fewer such processes"
    else:
        patch = {"dataloader_num_workers": 0}
        first = "dataloader_num_workers 0 (no forked copies of the dataset)"
    return Match(
        0.7 if kills else 0.6,
        evidence + f" Cheapest change first: {first}.",
        config_patch=patch,
        fix="Host (CPU) memory, not GPU memory, is exhausted: "
        + numbered_steps(
            [
                first,
                "more host RAM or swap, or fewer ranks / rollout or DataLoader workers per node",
                "less CPU offload (optimizer / parameter offload keeps states in host RAM)",
                "load weights lazily (low_cpu_mem_usage=True, safetensors mmap) on one rank",
            ]
        )
        + " GPU knobs (batch, recompute) do not free host RAM",
    )
