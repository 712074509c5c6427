"""Memory nvidia-smi shows for a process beyond what PyTorch's caching allocator holds: the CUDA
context, library workspaces, communication buffers, a colocated inference engine
(non_pytorch_memory).
"""

from __future__ import annotations

import re

from ..types import GIB, Context, Match
from .registry import fact, gib, oom_errors, outside_this_process, rule

MIB = 2**20
# A CUDA context is ~300-500 MiB per process and device on CUDA >= 11.7 (lazy loading), over
# 1 GiB before; with cuDNN / cuBLAS workspaces a gap up to ~2 GiB is the context's.
CONTEXT_SIZED = 2 * GIB


@rule(
    "RK220",
    "nvidia-smi shows more than PyTorch holds: the CUDA context and libraries",
    "non_pytorch_memory",
    symptom="nvidia-smi's per-process or total 'memory used' is well above what the paste's "
    "torch.cuda.memory_allocated() / memory_reserved() print (often 0 or a few MiB), or above "
    "the cap set with torch.cuda.set_per_process_memory_fraction",
    cause="Memory outside the caching allocator: the CUDA context (~300-500 MiB per process "
    "and per device it touches; over 1 GiB before CUDA 11.7's lazy module loading), cuDNN / "
    "cuBLAS workspaces, NCCL buffers, other libraries' allocations. PyTorch's counters never "
    "include it and set_per_process_memory_fraction does not cap it",
    confirm="torch.cuda.mem_get_info() (free / total as the driver sees them) against "
    "torch.cuda.memory_reserved(); nvidia-smi --query-compute-apps=pid,used_memory "
    "--format=csv lists each process's share, one line per device it touched",
    fix="Budget the CUDA context per process and device rather than hunting a leak: "
    "CUDA_MODULE_LOADING=LAZY (lazy loading, the default from CUDA 11.7) loads only the "
    "kernels used; CUDA_VISIBLE_DEVICES=<its GPU> (or torch.cuda.set_device(local_rank) before "
    "any CUDA call) so each process creates one context; smaller NCCL buffers (NCCL_BUFFSIZE) "
    "in multi-GPU runs. torch.cuda.set_per_process_memory_fraction caps only the caching "
    "allocator, never the context",
    patch={"env": {"CUDA_MODULE_LOADING": "LAZY"}},
    refs=(
        "https://github.com/pytorch/pytorch/issues/107667",
        "https://github.com/pytorch/pytorch/issues/28113",
    ),
)
def _smi_above_pytorch(ctx: Context) -> Match | None:
    smi = fact(ctx, "smi_bytes", "log")
    torch = fact(ctx, "torch_bytes", "log")
    cap = fact(ctx, "memory_cap_bytes", "log")
    if smi is None or (torch is None and cap is None):
        return None
    reserved = bool(fact(ctx, "torch_reserved", "log"))
    held, said = (torch, fact(ctx, "torch_line", "log")) if torch is not None else (cap, None)
    outside = smi - held
    if outside < 100 * MIB or smi < 1.5 * held:
        return None
    # Gigabytes over memory_allocated alone are more likely the allocator's cache (reserved):
    # only a gap of context size, or one over the reserved figure, is memory outside it.
    if outside > CONTEXT_SIZED and not reserved and torch is not None:
        return None
    which = (
        "memory_reserved"
        if reserved
        else "the cap set with set_per_process_memory_fraction"
        if torch is None
        else "its counters"
    )
    evidence = (
        f"nvidia-smi shows {gib(smi)} ('{fact(ctx, 'smi_line', 'log')}') while PyTorch "
        f"reports {gib(held)} ({which}"
        + (f": '{said}'" if said else f": '{fact(ctx, 'cap_line', 'log')}'")
        + f"): {gib(outside)} is held outside the caching allocator."
    )
    if outside <= CONTEXT_SIZED:
        evidence += " That is the size of a CUDA context (~300-500 MiB per process and device)."
    env = {"CUDA_MODULE_LOADING": "LAZY"}
    if "nccl" in ctx.text.lower() or fact(ctx, "smi_line", "log").lower().count("nccl"):
        env["NCCL_BUFFSIZE"] = "2097152"
    return Match(0.8, evidence, config_patch={"env": env})


# (RK100 moved here from allocator.py: memory an inference engine holds outside PyTorch)
INFERENCE_WORDS = (
    "cumem_allocator",
    "sleep mode freed",
    "memory is still in use",
    "vllm",
    "sglang",
    "gpu_memory_utilization",
    "mem_fraction_static",
)


@rule(
    "RK100",
    "A colocated inference engine (vLLM / SGLang) holds GPU memory",
    "non_pytorch_memory",
    symptom="OOM in an RL / generation job where vLLM or SGLang shares the GPUs with training "
    "(cumem_allocator errors, 'memory is still in use' after sleep)",
    cause="The engine sizes its KV cache from gpu_memory_utilization (or keeps memory after "
    "sleep); what it holds is invisible to the trainer's allocator",
    confirm="vLLM's log: KV cache size and 'Sleep mode freed X, Y memory is still in use'",
    fix="Lower gpu_memory_utilization (or set kv_cache_memory_bytes) so the engine leaves the "
    "trainer its peak; check that sleep mode releases what it reserved",
    patch={"gpu_memory_utilization": 0.4},
    supersedes=("RK005", "RK087", "RK002"),
)
def _inference_engine(ctx: Context) -> Match | None:
    text = " ".join(
        [ctx.text, ctx.oom.line if ctx.oom else "", " ".join(map(str, ctx.cfg))]
    ).lower()
    hit = next((w for w in INFERENCE_WORDS if w in text), None)
    read = ctx.cfg.get("inference_colocated")  # the config says so (NeMo-RL generation)
    if read is True and hit is None:
        hit = "vllm"
    # an OOM said in words counts where the config says the engine shares the GPUs
    ran_out = ctx.oom or oom_errors(ctx) or (read is True and fact(ctx, "oom_mentions"))
    if hit is None or not (ran_out or "still in use" in text):
        return None
    if read is False or (hit in ("vllm", "sglang") and not read and not _colocated(ctx, text)):
        return None  # an engine on GPUs of its own (vllm_num_engines), not the trainer's
    util = ctx.cfg.get("gpu_memory_utilization") or ctx.cfg.get("inference_gpu_memory_utilization")
    oom = ctx.oom
    if isinstance(util, float) and oom and oom.requested_bytes and oom.total_bytes:
        step = max(0.05, round(oom.requested_bytes / oom.total_bytes + 0.05, 2))
        new = round(max(0.1, util - step), 2)
        patch = {"gpu_memory_utilization": new}
        numbers = f" Lowering gpu_memory_utilization from {util} to {new} frees about " + gib(
            (util - new) * oom.total_bytes
        ) + "."
    else:
        patch, numbers = {"gpu_memory_utilization": 0.4}, ""
    if read is not None:  # NeMo-RL's own key for the share
        patch = {"policy.generation.vllm_cfg.gpu_memory_utilization": patch.popitem()[1]}
    where = (
        f"The config colocates vLLM generation with training (policy.generation.colocated."
        f"enabled{f', gpu_memory_utilization {util}' if util else ''})"
        if read
        else f"The evidence names an inference engine sharing the GPU ('{hit}')"
    )
    trade = (
        " A lower share is a smaller KV cache for generation: fewer sequences at once, slower "
        "rollouts."
    )
    messages = " ".join([ctx.text, oom.line if oom else ""]).lower()
    outside = outside_this_process(oom)
    if isinstance(util, float) and outside and oom.total_bytes:
        share = util * oom.total_bytes
        if abs(outside - share) <= 0.15 * share:
            # what the OOM shows held outside this process is the engine's share: not freed
            return Match(
                0.85,
                f"{where}. The OOM shows {gib(outside)} held outside this process, the engine's "
                f"share ({util} x {gib(oom.total_bytes)} = {gib(share)}): the engine still held "
                f"it when the trainer ran out (sleep mode off, or it did not free it).{numbers}"
                f"{trade}",
                config_patch=patch,
            )
    if read and not any(w in messages for w in ("vllm", "sglang", "sleep", "cumem")):
        # only the config says the engine is there; NeMo-RL puts it to sleep (weights off the
        # GPU, KV cache freed) while the policy trains: possible, not shown
        return Match(
            0.45,
            f"{where}, but nothing in the log shows the engine's memory at the failure: its "
            "sleep mode frees it while the policy trains. Check vLLM's 'Sleep mode freed ... "
            f"memory is still in use' line before lowering the share.{numbers}"
            f"{_beside_the_step(ctx, util)}{trade}",
            config_patch=patch,
        )
    return Match(0.8, f"{where}.{numbers}{trade}", config_patch=patch)


def _beside_the_step(ctx: Context, util: object) -> str:
    """The engine's share beside the estimated training step, where both are known."""
    est, gpu = ctx.estimate, ctx.gpu_bytes or (ctx.oom.total_bytes if ctx.oom else None)
    if est is None or not gpu or not isinstance(util, (int, float)):
        return ""
    step = est.total_with_overheads_bytes or est.total_bytes
    share = util * gpu
    if step + share <= gpu:
        return (
            f" The engine's share ({util} x {gib(gpu)} = {gib(share)}) and the estimated "
            f"training step ({gib(step)}) fit together."
        )
    return (
        f" The engine's share ({util} x {gib(gpu)} = {gib(share)}) and the estimated training "
        f"step ({gib(step)}) need {gib(step + share)} of the {gib(gpu)} GPU: the step fits "
        "only where sleep mode frees the engine's memory first."
    )


def _colocated(ctx: Context, text: str) -> bool:
    """The engine shares the trainer's GPUs: named in the messages (not only in config key
    names, as OpenRLHF's vllm_num_engines places engines on GPUs of their own), a colocate
    / hybrid-engine switch, a memory fraction it sizes its cache from, or sleep mode."""
    messages = " ".join([ctx.text, ctx.oom.line if ctx.oom else ""]).lower()
    if "vllm" in messages or "sglang" in messages:
        return True
    keys = " ".join(f"{k}={v}" for k, v in ctx.cfg.items()).lower()
    if re.search(r"colocate_(?:all|actor)[\w]*=true|hybrid_engine=true|enable_sleep", keys):
        return True
    return "rollout.name" in keys or "sleep" in text


@rule(
    "RK360",
    "Another job holds the GPU: said in words, or memory used with no process listed",
    "other_processes",
    symptom="An OOM where the paste says another process / job / training runs on the same GPU, "
    "or (OOM or not, at lower confidence) that the GPU was already occupied / used by another "
    "process, or nvidia-smi / gpustat shows GPUs nearly full while no process of this job is "
    "listed",
    cause="The GPU is shared: another job (a colleague's, an earlier run that did not exit, a "
    "process in another container, whose PIDs nvidia-smi cannot show) holds the memory this "
    "one needs; the model's own size is not the problem",
    confirm="nvidia-smi --query-compute-apps=pid,used_memory --format=csv before launching; "
    "the OOM goes away on an idle GPU",
    fix="Run on a GPU no other job uses (CUDA_VISIBLE_DEVICES=<idle GPU>, and check that the "
    "script does not override it with its own --gpu / set_device), or stop the other job",
    patch={"env": {"CUDA_VISIBLE_DEVICES": "<an idle GPU>"}},
    supersedes=("RK005", "RK087", "RK102"),
)
def _another_job(ctx: Context) -> Match | None:
    taken = fact(ctx, "gpu_taken_prose") or []  # "a GPU that was consumed already"
    leftover = fact(ctx, "leftover_prose") or []  # "instances of my script", "kill -9"
    if not (ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions")):
        if leftover and not taken:
            return Match(
                0.5,
                f"The paste says processes of earlier runs were still alive "
                f"('{leftover[0][:160]}'): they keep their GPU memory until they exit, "
                "whatever this run needs.",
                fix="List the GPU's processes (nvidia-smi --query-compute-apps=pid,"
                "used_memory --format=csv) and stop the earlier runs' (kill PID) before "
                "launching; make the launcher end its workers on failure (a signal handler, "
                "torchrun's own process group)",
                config_patch={"env": {"CUDA_VISIBLE_DEVICES": "<an idle GPU>"}},
            )
        if not taken:
            return None
        # no OOM in the paste: only words that the GPU was taken by something else
        return Match(
            0.5,
            f"The paste says the GPU was already occupied ('{taken[0][:160]}'): another "
            "process holds it, whatever this job needs.",
            config_patch={"env": {"CUDA_VISIBLE_DEVICES": "<an idle GPU>"}},
        )
    rows = fact(ctx, "gpu_rows") or []
    full = [gpu for gpu, used, total in rows if used >= 0.9 * total]
    idle = [gpu for gpu, used, total in rows if used <= 0.05 * total]
    patch = {"env": {"CUDA_VISIBLE_DEVICES": str(idle[0]) if idle else "<an idle GPU>"}}
    if full and fact(ctx, "no_processes_listed"):
        free = f"; GPU {', '.join(map(str, idle))} idle" if idle else ""
        return Match(
            0.75,
            f"GPU {', '.join(map(str, full))} {'is' if len(full) == 1 else 'are'} over 90% "
            f"used while no process is listed{free}: memory held by processes this view "
            "cannot show (another container or user), not by this job.",
            config_patch=patch,
        )
    said = (fact(ctx, "other_job_prose") or []) + taken + leftover
    if said:
        return Match(
            0.7,
            f"The paste says another job shares the GPU ('{said[0]}').",
            config_patch=patch,
        )
    return None


@rule(
    "RK481",
    "The CUDA context / driver memory that PyTorch's counters leave out",
    "non_pytorch_memory",
    symptom="nvidia-smi (or the used GPU memory) shows hundreds of MiB to over a GiB more "
    "than torch.cuda.memory_allocated / memory_reserved; the paste calls it CUDA overhead, "
    "the CUDA context or driver memory",
    cause="Each process's CUDA context (driver state, loaded kernels, cuDNN / cuBLAS "
    "handles) lives outside PyTorch's caching allocator: ~300-500 MiB with lazy module "
    "loading (CUDA >= 11.7), over 1 GiB before; no PyTorch counter includes it",
    confirm="torch.cuda.mem_get_info() right after the first CUDA call against "
    "torch.cuda.memory_reserved(): the gap is the context",
    fix="Budget the context (about 0.5-1 GiB per process and device) in the memory plan; "
    "load kernels lazily (CUDA_MODULE_LOADING=LAZY, CUDA >= 11.7); keep one process per GPU "
    "so no second context lands on it",
    patch={"env": {"CUDA_MODULE_LOADING": "LAZY"}},
    supersedes=("RK170", "RK005"),
)
def _context_prose(ctx: Context) -> Match | None:
    lines = fact(ctx, "context_prose") or []
    if not lines:
        return None
    return Match(
        0.65,
        f"The paste places memory outside PyTorch's counters in the CUDA context / driver "
        f"('{lines[0][:160]}').",
        config_patch={"env": {"CUDA_MODULE_LOADING": "LAZY"}},
    )


@rule(
    "RK480",
    "Allocator fragmentation named in words",
    "fragmentation",
    symptom="The thread says the OOM comes from memory fragmentation (reserved memory growing "
    "over time, a cached block split so its remainder fits no later request), not from a "
    "larger peak",
    cause="The caching allocator splits cached segments for smaller requests; the free "
    "remainders are pinned by the live block beside them and fit no later request, so "
    "reserved memory grows while allocated memory stays flat",
    confirm="torch.cuda.memory_stats(): reserved_bytes grows step over step while "
    "allocated_bytes.all.peak stays flat; the OOM goes with expandable_segments",
    fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place, no split "
    "remainders); where expandable segments cannot be used, max_split_size_mb caps which "
    "blocks may be split",
    patch={"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
    supersedes=("RK170", "RK005", "RK266"),
)
def _fragmentation_prose(ctx: Context) -> Match | None:
    lines = fact(ctx, "fragmentation_prose") or []
    if not lines:
        return None
    for event in ctx.evidence.oom or []:  # the OOM's own numbers outrank the words
        capacity = ctx.gpu_bytes
        spare = event.reserved_unallocated_bytes
        if spare is not None and capacity and spare < 0.03 * capacity:
            return None
    return Match(
        0.6,
        f"The paste names allocator fragmentation ('{lines[0][:160]}').",
        config_patch={"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
    )
