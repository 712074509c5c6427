"""Out-of-memory messages: every PyTorch generation, ROCm/HIP, XPU, NPU, partial pastes."""

from __future__ import annotations

import re
from typing import Any

from .schema import OOMEvent
from .text import _EXC_SEARCH_RE, _compact, _size

# --------------------------------------------------------------------------------------------
# Out-of-memory messages
# --------------------------------------------------------------------------------------------

# Which message format produced an OOMEvent; sources in shared/reference/real-formats.md.
OOM_GENERATIONS = {
    "gen1_cached": "'(GPU 0; T total capacity; A already allocated; F free; C cached)' (0.4.1-1.4; "
    "C is cached but unallocated: reserved = A + C)",
    "gen2_reserved": "'... R reserved in total by PyTorch)' (1.5-1.9)",
    "gen3_max_split": "gen2 plus 'try setting max_split_size_mb' (1.10-2.0)",
    "gen4_capacty": "'GPU 0 has a total capacty of' (typo), per-process list (2.1)",
    "gen5_expandable": "'... PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True' (2.2+)",
    "gen6_pytorch_alloc_conf": "'... PYTORCH_ALLOC_CONF=expandable_segments:True' (2.9+)",
    "gen7_docs_url": "the docs.pytorch.org URL of newer main",
    "xpu_empty_cache": "torch.xpu's 2.1+ layout ending 'Please use `empty_cache` to release all "
    "unoccupied cached memory.'",
    "thc_runtime_error": "'cuda runtime error (2) : out of memory at .../THC...' or 'THCudaCheck "
    "FAIL file=... error=2 : out of memory' (0.3-0.4, no sizes)",
    "modern_truncated": "the 2.1+ layout, cut before the advice that dates it",
    "legacy_truncated": "the <=2.0 layout, cut before the fields that date it",
    "cuda_error": "'CUDA error: out of memory' (a CUDA call, not the caching allocator)",
    "nccl_cuda_failure": "NCCL's \"Cuda failure 2 'out of memory'\" (NCCL's own buffers)",
    "triton_cuda": "'Triton Error [CUDA]: out of memory' (a Triton kernel launch)",
    "unknown": "an out-of-memory message without the allocator's fields",
}

# Digit runs are bounded so that a long run of digits cannot make a field search quadratic.
_SIZE_PAT = r"(\d{1,20}(?:\.\d{1,20})?) ?(bytes|[KMGTPE]iB|[KMGTPE]B)"


def _flex(pattern: str, flags: int = re.I) -> re.Pattern[str]:
    """Compile an OOM field pattern in which every space may be missing (hard-wrap joins);
    case-insensitive unless told (pastes write "tried to allocate 32768.00 Gib")."""
    return re.compile(pattern.replace("SIZE", _SIZE_PAT).replace(" ", r"\s?"), flags)


# Partial pastes count: a message without its "RuntimeError: CUDA out of memory." head starts
# at "Tried to allocate"; torch_npu says "NPU out of memory"; vLLM's cumem allocator "CUDA Error".
_OOM_START_RE = re.compile(
    r"(?:CUDA|HIP|XPU|NPU)\s?out\s?of\s?memory|(?i:CUDA error: out of memory)|OutOfMemoryError"
    r"|Cuda failure \d+ 'out of memory'|Triton Error \[CUDA\]: out of memory"
    r"|NCCL WARN Failed to CUDA calloc(?: async)? \d+ bytes"
    r"|(?i:cuda\s?runtime\s?error\s?\(2\)\s?:\s?out\s?of\s?memory)"
    r"|THCudaCheck FAIL file=\S+ line=\d+ error=2 : out of memory"
    r"|(?:^|(?<=[\s:.!]))Tried to allocate (?:more than )?\d"
)
_OOM_VALID_RE = re.compile(
    r"(?:cuda|hip|xpu|npu)outofmemory|cudaerror:outofmemory|outofmemoryerror:|triedtoallocate"
    r"|cudafailure\d+'outofmemory'|tritonerror\[cuda\]:outofmemory|ncclwarnfailedtocudacalloc"
    r"|cudaruntimeerror\(2\):outofmemory|thcudacheckfail\S{0,200}error=2:outofmemory"
)
_OOM_FIELDS: dict[str, re.Pattern[str]] = {
    "requested_bytes": _flex(r"Tried to allocate (?:more than )?SIZE"),
    "old_device": _flex(r"\((?:GPU|NPU)\s*(\d+) ;"),  # IPEX prints "(GPU  0;"
    "old_total": _flex(r"SIZE total capacity"),
    "old_allocated": _flex(r"SIZE already allocated"),
    "old_free": _flex(r"SIZE free ?[;)]"),
    "old_reserved": _flex(r"SIZE reserved in total by PyTorch"),
    "old_cached": _flex(r"SIZE cached"),
    "new_device": _flex(r"GPU (\d+) has a total capac(?:i)?ty"),
    "new_total": _flex(r"total capac(?:i)?ty of SIZE"),
    "new_free": _flex(r"of which SIZE is free"),
    "process_bytes": _flex(r"this process has SIZE memory in use"),
    "allowed_bytes": _flex(r"SIZE allowed ?;"),
    "new_allocated": _flex(r"Of the allocated memory SIZE is allocated by PyTorch"),
    "private_pool_bytes": _flex(r"with SIZE allocated in private pools"),
    "reserved_unallocated_bytes": _flex(r"and SIZE is reserved by PyTorch but unallocated"),
}
# "Current platform can NOT allocate memory block with size larger than 4GB!" (IPEX)
_ALLOC_LIMIT_RE = re.compile(r"allocate memory block with size larger than (\d{1,4}) ?GB", re.I)
# Case matters here: "Process 123 has" is another process, "this process has" is this one.
_OOM_OTHER_PROCESS_RE = _flex(r"Process (\d+) has SIZE memory in use", flags=0)
# The advice that ends each message generation, without whitespace: continuation lines of a
# hard-wrapped message are pieces of one of these (ROCm builds say PYTORCH_HIP_ALLOC_CONF).
_OOM_TAILS = (
    *(
        _compact(tail).replace("PYTORCH_CUDA_ALLOC_CONF", env)
        for env in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
        for tail in (
            "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
            "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
            "If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
            "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
            "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
            "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        )
    ),
    _compact("Please use `empty_cache` to release all unoccupied cached memory."),  # torch.xpu
)


def _oom_data_complete(compact: str) -> bool:
    """Whether a (compacted) OOM message has all its fields: old layout up to its ')', new
    layout up to 'but unallocated'."""
    if "butunallocated" in compact:
        return True
    gpu = compact.find("(GPU")
    if gpu < 0:
        gpu = compact.find("(NPU")  # torch_npu keeps the <= 2.0 layout
    return gpu >= 0 and compact.find(")", gpu) >= 0


def _oom_fully_complete(compact: str) -> bool:
    """Whether a (compacted) OOM message includes the final words of its advice."""
    if compact.endswith(")") and "cuda.html#" in compact:
        return True
    if compact.endswith("unoccupiedcachedmemory."):  # torch.xpu
        return True
    return compact.endswith("ALLOC_CONF") and "max_split_size_mb" in compact


def _oom_generation(compact: str) -> str:
    if "(GPU" in compact and "cached" in compact and "reservedintotal" not in compact:
        return "gen1_cached"
    if "reservedintotalbyPyTorch" in compact:
        return "gen3_max_split" if "max_split_size_mb" in compact else "gen2_reserved"
    if "totalcapactyof" in compact:
        return "gen4_capacty"
    if "unoccupiedcachedmemory" in compact:
        return "xpu_empty_cache"
    if "docs.pytorch.org" in compact or "optimizing-memory-usage" in compact:
        return "gen7_docs_url"
    if "PYTORCH_ALLOC_CONF=" in compact:
        return "gen6_pytorch_alloc_conf"
    if "ALLOC_CONF=expandable" in compact:
        return "gen5_expandable"
    if "totalcapacityof" in compact:
        return "gen4_capacty" if "max_split_size_mb" in compact else "modern_truncated"
    if "(GPU" in compact or "totalcapacity" in compact:
        return "legacy_truncated"
    lower = compact.lower()
    if "cudaerror:outofmemory" in lower:
        return "cuda_error"
    if ("cudafailure" in lower and "'outofmemory'" in lower) or "failedtocudacalloc" in lower:
        return "nccl_cuda_failure"
    if "tritonerror[cuda]:outofmemory" in lower:
        return "triton_cuda"
    if "cudaruntimeerror(2):outofmemory" in lower or "error=2:outofmemory" in lower:
        return "thc_runtime_error"
    return "unknown"


def _oom_event(text: str, rank: int | None, line_number: int | None = None) -> OOMEvent | None:
    """Parse one OOM message (possibly joined from several lines); None if it is not one."""
    compact = _compact(text)
    if not _OOM_VALID_RE.search(compact.lower()):
        return None
    flat = " ".join(text.split())
    start = _OOM_START_RE.search(flat)
    # Keep the exception type in `line` (torch.OutOfMemoryError: CUDA out of memory. ...).
    exc = _EXC_SEARCH_RE.search(flat)
    if exc is not None and (start is None or exc.start() <= start.start()):
        begin = exc.start(1)
    else:
        begin = start.start() if start is not None else 0
    event = OOMEvent(
        rank=rank,
        line=flat[begin : begin + 300],
        line_number=line_number,
        prefix=flat[max(0, begin - 200) : begin].strip(),
    )
    values: dict[str, Any] = {}
    for name, pattern in _OOM_FIELDS.items():
        m = pattern.search(flat)
        if m is None:
            continue
        values[name] = int(m.group(1)) if name.endswith("device") else _size(*m.groups())
    event.requested_bytes = values.get("requested_bytes")
    event.device = values.get("old_device", values.get("new_device"))
    event.total_bytes = values.get("old_total", values.get("new_total"))
    event.free_bytes = values.get("old_free", values.get("new_free"))
    event.allocated_bytes = values.get("old_allocated", values.get("new_allocated"))
    event.reserved_bytes = values.get("old_reserved")
    cached = values.get("old_cached")
    if event.reserved_bytes is None and cached is not None:
        # 0.4.1-1.4 print "C cached": memory the allocator holds but has not handed out
        # (amount_cached - amount_allocated), so PyTorch's reserve is allocated + C.
        event.reserved_unallocated_bytes = cached
        if event.allocated_bytes is not None:
            event.reserved_bytes = event.allocated_bytes + cached
    event.process_bytes = values.get("process_bytes")
    event.allowed_bytes = values.get("allowed_bytes")
    event.private_pool_bytes = values.get("private_pool_bytes")
    if event.reserved_unallocated_bytes is None:
        event.reserved_unallocated_bytes = values.get("reserved_unallocated_bytes")
    if (
        event.reserved_unallocated_bytes is None
        and event.reserved_bytes is not None
        and event.allocated_bytes is not None
    ):
        # 1.5-2.0 print "R reserved in total by PyTorch": the cache it holds unhanded is R - A
        event.reserved_unallocated_bytes = max(0, event.reserved_bytes - event.allocated_bytes)
    others = [_size(n, u) for _, n, u in _OOM_OTHER_PROCESS_RE.findall(flat)]
    if others:
        event.other_processes_bytes = sum(x for x in others if x is not None)
        event.other_process_sizes = [x for x in others if x is not None]
        # NVML lists every process on the GPU; PyTorch names its own on a line of its own,
        # unless its PID is not the one NVML sees: then it is among the entries
        event.listed_self = event.process_bytes is None
        sizes = event.other_process_sizes
        ended = "allocated by pytorch" in flat.lower()  # (the allocator's sentence follows)
        if event.listed_self and ended and len(others) == 1:
            # one entry and no "this process" line in a list that ended: the entry is this
            # process (a container's PID namespace)
            event.process_bytes, event.other_processes_bytes = others[0], 0
        elif event.listed_self and ended and (reserved := _reserved(event)) is not None:
            # several entries that add up to the GPU's used memory (so this process is among
            # them): it holds at least what its allocator reserved, and one entry alone that
            # large is it (a Ray actor beside a sleeping inference engine)
            mine = [x for x in sizes if x >= reserved]
            used = (event.total_bytes or 0) - (event.free_bytes or 0)
            whole = event.total_bytes and abs(sum(sizes) - used) <= 0.02 * event.total_bytes
            if len(mine) == 1 and whole:
                event.process_bytes = mine[0]
                event.other_processes_bytes = sum(sizes) - mine[0]
    event.generation = _oom_generation(compact)
    lower = flat.lower()
    event.backend = next(
        (b for b in ("hip", "xpu", "npu") if f"{b} out of" in lower or f"({b} " in lower), "cuda"
    )
    limit = _ALLOC_LIMIT_RE.search(flat)
    if limit is not None:  # IPEX on Intel GPUs: a cap on one allocation, not on the device
        event.backend = "xpu"
        event.allocation_limit_bytes = int(limit.group(1)) << 30
    event.held_elsewhere_bytes = _held_elsewhere(event)
    outside_allocator = ("cuda_error", "nccl_cuda_failure", "triton_cuda", "thc_runtime_error")
    event.truncated = event.generation not in outside_allocator and not _oom_data_complete(compact)
    return event


def _reserved(event: OOMEvent) -> int | None:
    """What PyTorch's allocator holds: "R reserved in total" (<= 2.0), or allocated plus
    reserved-but-unallocated (>= 2.1)."""
    if event.reserved_bytes is not None:
        return event.reserved_bytes
    if event.allocated_bytes is not None and event.reserved_unallocated_bytes is not None:
        return event.allocated_bytes + event.reserved_unallocated_bytes
    return None


def _held_elsewhere(event: OOMEvent) -> int | None:
    """Device memory that is neither free nor reserved by this process's PyTorch allocator:
    other processes, the CUDA context, NCCL and library buffers. None when the message lacks
    total, free or PyTorch's reserved size."""
    if event.total_bytes is None or event.free_bytes is None:
        return None
    pytorch = _reserved(event)
    if pytorch is None:
        return None
    return max(0, event.total_bytes - event.free_bytes - pytorch)


def looks_like_oom(text: str) -> bool:
    """Whether a line starts (or is part of the head of) an out-of-memory message."""
    # "emory" covers "out of memory", "OutOfMemory" and "Out of memory" in one scan.
    if "emory" in text or "Tried to allocate" in text or "CUDA calloc" in text:
        return _OOM_START_RE.search(text) is not None
    return False


# Fields of the allocator's message: a wrapped line holding them continues the OOM, even when it
# also holds the message's own "PYTORCH_CUDA_ALLOC_CONF=..." advice.
_OOM_FIELD_PIECES = (
    "memory in use",
    "allocated by PyTorch",
    "reserved by PyTorch",
    "already allocated",
    "reserved in total",
)


def oom_fields_go_on(text: str) -> bool:
    """Whether a line holds fields of an OOM message without starting a new one."""
    if not any(piece in text for piece in _OOM_FIELD_PIECES):
        return False
    return not (("out of memory" in text or "OutOfMemory" in text) and looks_like_oom(text))
