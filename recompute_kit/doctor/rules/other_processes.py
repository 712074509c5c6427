"""Other processes on the GPU, read from an OOM message's unaccounted memory (RK089) or from
nvidia-smi's process table (RK091) (other_processes). The 2.1+ message itemises other
processes itself: rules/allocator.py (RK002) reads that.
"""

from __future__ import annotations

from ..types import GIB, Context, Match
from .registry import all_frames, fact, gib, oom_errors, outside_this_process, rule


@rule(
    "RK089",
    "A large share of the GPU is held outside this process's PyTorch",
    "other_processes",
    symptom="An OOM message whose total, free and 'reserved by PyTorch' sizes leave a large "
    "part of the GPU unaccounted for (often old PyTorch: a few hundred MiB reserved, almost "
    "nothing free; from 2.1, 'this process has' far less than the GPU less its free memory, "
    "and no 'Process <pid> has' line)",
    cause="Something other than this process's caching allocator holds the memory: another "
    "process or rank on the same GPU, an inference engine, NCCL buffers, the CUDA context",
    confirm="nvidia-smi --query-compute-apps=pid,used_memory --format=csv while the job runs",
    fix="Find and stop the holder; one GPU per process (torch.cuda.set_device(local_rank) "
    "before any CUDA call, or CUDA_VISIBLE_DEVICES); smaller NCCL buffers (NCCL_BUFFSIZE)",
    patch={"env": {"CUDA_VISIBLE_DEVICES": "<this rank's GPU only>"}},
    supersedes=("RK005", "RK087"),
)
def _held_elsewhere(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.held_elsewhere_bytes or not oom.total_bytes:
        return None
    held, total = oom.held_elsewhere_bytes, oom.total_bytes
    if oom.other_processes_bytes:
        return None  # the 2.1+ message itemises them; RK002 reads it
    unlisted = oom.process_bytes is not None
    if unlisted:  # 2.1+: this process is counted whole (RK003 reads its non-PyTorch part)
        held = outside_this_process(oom)
    # A desktop GPU's display and CUDA context take a few hundred MiB: not what is meant.
    if held < 0.25 * total or held < max(oom.requested_bytes or 0, int(1.5 * GIB)):
        return None
    if unlisted:
        # NVML names only the processes it can see: another container's or PID namespace's
        # (a colocated inference engine, another job) holds memory without a "Process" line
        return Match(
            min(0.9, 0.5 + held / total / 2),
            f"Of the {gib(total)} GPU, {gib(oom.free_bytes)} is free and this process has "
            f"{gib(oom.process_bytes)} in use: {gib(held)} ({held / total:.0%}) is held by "
            "processes the message does not list (another container or PID namespace: a "
            f"colocated inference engine, another job), more than the "
            f"{gib(oom.requested_bytes)} request.",
        )
    return Match(
        min(0.9, 0.5 + held / total / 2),
        f"Of the {gib(total)} GPU, {gib(oom.free_bytes)} is free and PyTorch reserved "
        f"{gib(total - oom.free_bytes - held)}: {gib(held)} ({held / total:.0%}) is held "
        f"outside this process's allocator, more than the {gib(oom.requested_bytes)} request.",
    )


@rule(
    "RK091",
    "Several processes hold CUDA contexts on one GPU",
    "other_processes",
    symptom="nvidia-smi lists several processes of the job on the same GPU, most of them with "
    "a few hundred MiB (a CUDA context each)",
    cause="Every rank touched CUDA on the default device (GPU 0) before selecting its own, so "
    "GPU 0 carries one context per rank",
    confirm="nvidia-smi's process table: one large process and N small ones on GPU 0",
    fix="Call torch.cuda.set_device(local_rank) (LOCAL_RANK) before any CUDA work, or give "
    "each process CUDA_VISIBLE_DEVICES=<its GPU>",
    patch={"code": "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))"},
    supersedes=("RK087",),
)
def _smi_processes(ctx: Context) -> Match | None:
    by_gpu: dict[int, list[dict]] = {}
    for proc in ctx.evidence.gpu_processes:
        by_gpu.setdefault(proc["gpu"], []).append(proc)
    for gpu, procs in sorted(by_gpu.items()):
        small = [p for p in procs if p["used_bytes"] < 2 * GIB]
        if len(procs) >= 3 and len(small) >= 2:
            extra = sum(p["used_bytes"] for p in small)
            return Match(
                0.85,
                f"nvidia-smi shows {len(procs)} processes on GPU {gpu}; {len(small)} of them "
                f"hold {gib(extra)} together ({gib(small[0]['used_bytes'])} each): CUDA "
                "contexts of ranks that belong on other GPUs.",
            )
    if not (ctx.oom or oom_errors(ctx)):
        return None
    for gpu, procs in sorted(by_gpu.items()):
        # Next to an OOM: one process fills the GPU and another holds only a context (under
        # 1 GiB, a few times less): a job that touched this GPU before selecting its own
        # (or a second job on it), so it fails on memory another process holds.
        big = max(procs, key=lambda p: p["used_bytes"])
        tiny = [p for p in procs if p is not big and p["used_bytes"] < GIB]
        if tiny and big["used_bytes"] >= max(4 * tiny[0]["used_bytes"], 2 * GIB):
            return Match(
                0.75,
                f"nvidia-smi shows {len(procs)} processes on GPU {gpu}: PID {big['pid']} holds "
                f"{gib(big['used_bytes'])}, PID {tiny[0]['pid']} only "
                f"{gib(tiny[0]['used_bytes'])} (a CUDA context): the OOM is on a GPU another "
                "process fills, which this job should not touch.",
                fix="Give the job only its own GPU (CUDA_VISIBLE_DEVICES=<its GPU>, so no "
                "context lands on GPU 0), or torch.cuda.set_device(<its GPU>) before any CUDA "
                "call; or stop the process that fills the GPU",
                config_patch={"env": {"CUDA_VISIBLE_DEVICES": "<this job's GPU only>"}},
            )
    return None


def _alike_processes(ctx: Context) -> tuple[int, int] | None:
    """(count, median bytes) when the OOM lists three or more processes of about one size
    (within 25% of their median) on its GPU: a rank each, sharing the device."""
    sizes = sorted(ctx.oom.other_process_sizes) if ctx.oom else []
    if len(sizes) < 3:
        return None
    median = sizes[len(sizes) // 2]
    if median >= 256 << 20 and all(abs(x - median) <= 0.25 * median for x in sizes):
        return len(sizes), median
    return None


@rule(
    "RK645",
    "Every rank creates a CUDA context on GPU 0",
    "other_processes",
    symptom="The paste says the other ranks (non-0 ranks, every process) occupy memory on GPU 0, "
    "next to a process group whose ranks never call torch.cuda.set_device (missing or "
    "commented out)",
    cause="A rank that has not selected its device uses the current device, GPU 0: "
    "init_process_group / NCCL or the first CUDA call creates a CUDA context (~0.5-1 GB) and "
    "communicator buffers there, so GPU 0 carries one per rank and runs out first",
    confirm="nvidia-smi: N-1 small processes on GPU 0 besides rank 0's own",
    fix="torch.cuda.set_device(local_rank) before init_process_group and any CUDA call, or "
    "launch each rank with CUDA_VISIBLE_DEVICES=<its GPU> so GPU 0 is not visible to it",
    patch={"code": "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))"},
    supersedes=("RK087", "RK089", "RK170", "RK005", "RK002"),
)
def _ranks_on_device0(ctx: Context) -> Match | None:
    alike = _alike_processes(ctx)
    if alike is not None:
        n, each = alike
        return Match(
            0.8,
            f"The OOM message lists {n} processes on this GPU holding about {gib(each)} each: "
            "one per rank, every rank on the same device (a rank that has not selected its "
            "GPU uses GPU 0).",
            fix="Give each rank its own GPU: torch.cuda.set_device(local_rank) (or "
            "device=f'cuda:{local_rank}' where the library takes a device) before any CUDA "
            "work, or CUDA_VISIBLE_DEVICES=<its GPU> per rank; upgrade a library that puts "
            "every rank on cuda:0",
            config_patch={"code": "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))"},
        )
    found = None
    for source in ("log", "config"):
        said = fact(ctx, "settings_prose", source)
        if isinstance(said, dict) and isinstance(said.get("device0"), dict):
            found = said["device0"]
            break
    if found is None:
        return None
    line, set_device = found.get("said"), found.get("set_device")
    if not line and not (set_device in ("missing", "commented") and (ctx.oom or oom_errors(ctx))):
        return None  # the code pattern alone, with nothing on GPU 0 said or failing
    code = {
        "missing": "the pasted code initialises the process group without torch.cuda.set_device",
        "commented": "the pasted code has torch.cuda.set_device commented out",
        "called": "the pasted code calls torch.cuda.set_device: check it runs before the "
        "first CUDA call (init_process_group, a tensor, a model .cuda())",
    }.get(set_device, "")
    words = f"The paste says: '{line}'" if line else "An OOM on a GPU the ranks share"
    return Match(
        0.85 if line and set_device in ("missing", "commented") else 0.75,
        f"{words}; {code or 'no device selection is shown'}: every rank that has not selected "
        "its GPU creates its CUDA context (and NCCL buffers) on GPU 0.",
        fix="Call torch.cuda.set_device(local_rank) before init_process_group and any CUDA "
        "work, or give each rank only its GPU with CUDA_VISIBLE_DEVICES=<its GPU>",
        config_patch={
            "code": "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
            "env": {"CUDA_VISIBLE_DEVICES": "<this rank's GPU only>"},
        },
    )


# torch.load restoring a CUDA tensor to the device it was saved from (torch/serialization.py)
_RESTORE_FRAMES = ("default_restore_location", "_cuda_deserialize")


@rule(
    "RK646",
    "torch.load puts every rank's copy of a checkpoint on the GPU it was saved from",
    "other_processes",
    symptom="An OOM raised inside torch.load (serialization.py default_restore_location / "
    "_cuda_deserialize) when a multi-GPU job resumes from a checkpoint",
    cause="Without map_location, torch.load restores each saved CUDA tensor to the device it "
    "was saved from (cuda:0 for a checkpoint rank 0 wrote): every rank loads its copy onto GPU "
    "0, which holds rank 0's model and runs out",
    confirm="nvidia-smi during the resume: GPU 0 fills while the other GPUs hold only their "
    "own model; the same resume on one GPU works",
    fix="torch.load(path, map_location='cpu') (then load_state_dict moves each tensor to the "
    "parameter's device), or map_location=f'cuda:{local_rank}'",
    patch={"map_location": "cpu"},
    supersedes=("RK102", "RK005", "RK087", "RK170", "RK089"),
)
def _restored_to_saved_device(ctx: Context) -> Match | None:
    if ctx.oom is None and not oom_errors(ctx) and not fact(ctx, "oom_mentions"):
        return None
    frames = all_frames(ctx)
    if not any(f in frames for f in _RESTORE_FRAMES):
        return None
    several = fact(ctx, "several_gpus")
    if not several:
        return None  # one GPU: the copy lands where the model is; other rules size it
    return Match(
        0.75,
        f"The OOM is raised inside torch.load restoring a CUDA tensor to its saved device "
        f"({next(f for f in _RESTORE_FRAMES if f in frames)}), in a job on several GPUs "
        f"('{several[0][:100]}'): without map_location every rank restores onto the GPU the "
        "checkpoint was saved from.",
    )
