"""Default readings of a failure that no specific rule explains: an exception (a traceback,
typed or cut before its exception line) with no OOM (RK420), and an OOM whose own figures say
the device had room for the request while PyTorch held almost nothing (RK421).

A paste that carries a failure should never come back empty: these give the most plausible
reading at low confidence, from what the paste shows (where the innermost frames are, whether
the paste ties the failure to checkpointing, the exception's type, the OOM's free and reserved
figures).
Like the default readings of rules/fallback.py, the engine asks them only when nothing else
fired, so they never outrank a specific finding.
"""

from __future__ import annotations

from typing import Any

from ..types import Context, Match
from .general import ORPHAN, library_of
from .registry import fact, gib, oom_errors, rule

# Frames of torch that only pass a call on (module __call__, DDP's forward, autograd's entry):
# an innermost frame here says the paste was cut, not that torch failed.
_PLUMBING = (
    "torch/nn/modules/module.py",
    "torch/nn/parallel/",
    "torch/_tensor.py",
    "torch/autograd/__init__.py",
    "torch/autograd/graph.py",
    "torch/_dynamo/eval_frame.py",
)
# Exceptions a framework raises to reject what it was given (a setting, a shape, an argument).
_REJECTS = ("ValueError", "AssertionError", "ConfigError", "ArgumentError", "ArgumentTypeError")


def _failure_without_oom(ctx: Context) -> list[Any]:
    """Exception events of a paste with no OOM in any wording."""
    if ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions"):
        return []
    return [e for e in ctx.evidence.errors if e.kind == "exception"]


def exception_without_oom(ctx: Context) -> bool:
    """The paste fails with an exception and says nothing of memory (for the memory defaults)."""
    return bool(_failure_without_oom(ctx))


def _owner(frames: list[str]) -> tuple[str | None, bool]:
    """(the library of the innermost frame that is not torch's call plumbing, whether the
    innermost frame itself is plumbing: the traceback was cut before the failing frame)."""
    norm = [f.replace("\\", "/") for f in frames]
    cut = bool(norm) and any(p in norm[-1] for p in _PLUMBING)
    for frame in reversed(norm):
        if any(p in frame for p in _PLUMBING):
            continue
        return library_of(frame), cut
    return None, cut


def _ckpt_named(ctx: Context, e) -> str | None:
    """The line of the paste that ties the failure to checkpointing, if any."""
    lines = fact(ctx, "mentions") or []
    if lines:
        return lines[0]
    text = " ".join([e.message, *e.frames]).lower()
    return "checkpoint" if "checkpoint" in text else None


@rule(
    "RK420",
    "Default reading of an exception: where its innermost frames are",
    "framework_bug",
    symptom="A traceback (typed, or cut before its exception line) with no OOM and no specific "
    "pattern, raised in a library's frames, cut short, or tied to checkpointing by the paste "
    "(not a ValueError / AssertionError, not the script's own frames)",
    cause="An exception raised inside a library's own frames, or on a feature the paste names "
    "(activation checkpointing), is most often that library's bug or a version mismatch; one "
    "raised where the paste shows no frame of the failing code is read the same way, at "
    "lower confidence",
    confirm="Paste the whole traceback with its last line; turn the feature named next to it "
    "off for one run: if the error goes, the feature's path is at fault",
    fix="Upgrade the library in the innermost frames and turn the named feature off for one "
    "run (gradient_checkpointing false); paste the whole traceback",
    patch={"command": "pip install -U <the library in the innermost frames>"},
    fallback=True,
)
def _default_exception(ctx: Context) -> Match | None:
    events = _failure_without_oom(ctx)
    if not events:
        return None
    typed = [e for e in events if e.message != ORPHAN]
    e = typed[-1] if typed else events[-1]
    frames = e.frames or [f for o in events for f in o.frames]
    lib, cut = _owner(frames)
    ckpt = _ckpt_named(ctx, e)
    said = f"{e.type}: {e.message[:140]}" if e.message != ORPHAN else "A traceback"
    kind = e.type.rsplit(".", 1)[-1]
    where = f" (innermost frame: {frames[-1].rsplit('/', 1)[-1][:100]})" if frames else ""
    tail = " The paste ends before the failing frame: paste the whole traceback." if cut else ""
    if lib is not None and lib != "torch":
        package = lib.replace("_", "-")
        patch: dict[str, Any] = {"command": f"pip install -U {package}"}
        fix = f"Most likely a bug in {lib} or a version mismatch: upgrade {package}"
        if ckpt:
            patch["gradient_checkpointing"] = False
            fix += "; meanwhile turn gradient checkpointing off for one run"
        worked = fact(ctx, "worked_release")
        if worked and worked[0].replace("_", "-") == package:
            fix += f", or pin {package}=={worked[1]} (the paste says that release worked)"
            patch["command"] = f"pip install {package}=={worked[1]}"
        return Match(
            0.25,
            f"Default reading (no specific pattern matched): {said} is raised in {lib}'s own "
            f"code{where}.{tail}",
            config_patch=patch,
            fix=fix + ", and report the traceback upstream",
        )
    if ckpt:
        if frames and lib is None and not cut:
            return None  # the script's own frames: no fresh paste shows which reading fits
        zero = (fact(ctx, "json_config") or {}).get("zero_optimization.stage")
        if zero == 3:  # ZeRO-3 gathers and releases the parameters the recompute runs with
            return Match(
                0.2,
                f"Default reading (no specific pattern matched): {said}{where}, with "
                f"checkpointing ('{ckpt[:120]}') under ZeRO-3 (zero_optimization.stage 3): "
                "the recompute runs with parameters ZeRO-3 gathers and releases.",
                config_patch={"command": "pip install -U deepspeed"},
                fix="A bug on DeepSpeed's ZeRO-3 + checkpointing path: upgrade deepspeed; "
                "meanwhile ZeRO-2 (zero_optimization.stage 2) or gradient checkpointing off "
                "for one run, and report the traceback upstream",
            )
        return Match(
            0.2,
            f"Default reading (no specific pattern matched): {said}{where}, and the paste ties "
            f"it to checkpointing ('{ckpt[:120]}').{tail} A failure that comes only with "
            "checkpointing on is most often the checkpointed model's code path in a library "
            "release (a tuple where a tensor is expected, a keyword the release does not pass).",
            config_patch={"gradient_checkpointing": False},
            fix="Turn gradient checkpointing off for one run to confirm; then upgrade the "
            "library that implements the model's checkpointed blocks (transformers / diffusers "
            "/ the trainer), or pin the release before the change, and report upstream",
        )
    if kind in _REJECTS:
        return None  # a rejected setting: the specific validation rules read those
    if lib == "torch" and not cut:
        return Match(
            0.2,
            f"Default reading (no specific pattern matched): {said} is raised in torch's own "
            f"code{where}.",
            config_patch={"command": "pip install -U torch"},
            fix="Most likely a PyTorch bug or an unsupported combination: try the current "
            "release, and report the traceback with a minimal reproduction",
        )
    if lib is None and frames and not cut:
        return None  # the script's own code, nothing named: no reading is more likely
    return Match(
        0.15,
        f"Default reading (no specific pattern matched): {said}{where}; the paste shows no "
        f"frame of the code that failed.{tail or ' Paste the whole traceback.'}",
        config_patch={"command": "pip install -U <the library in the innermost frames>"},
        fix="Paste the whole traceback (its innermost frames name the library); upgrade that "
        "library and report the traceback upstream",
    )


@rule(
    "RK421",
    "Default reading of an OOM with room on the device and little held by PyTorch",
    "framework_bug",
    symptom="An OOM message whose free figure is at least the failed request while PyTorch "
    "holds (reserved) less than the request or a twentieth of the GPU, and no specific pattern",
    cause="Neither this run's tensors nor its cache explain it: PyTorch holds almost nothing "
    "and the device reports room, so the allocation was refused below PyTorch (the driver / "
    "toolkit pair, a GPU in a bad state, a context created on another device)",
    confirm="nvidia-smi shows the GPU's state and driver version; a one-line CUDA allocation in "
    "a fresh process fails the same way",
    fix="Check the driver against the PyTorch build's CUDA version (upgrade the driver or "
    "install the matching build), restart the process on a healthy GPU; not a memory setting",
    patch={"command": "nvidia-smi  # driver version and the GPU's state"},
    fallback=True,
)
def _default_room(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.free_bytes or not oom.requested_bytes or not oom.total_bytes:
        return None
    req = oom.requested_bytes
    if oom.free_bytes < req:
        return None
    held = oom.reserved_bytes
    if held is None and oom.allocated_bytes is not None:
        held = oom.allocated_bytes + (oom.reserved_unallocated_bytes or 0)
    if held is None or (held >= req and held >= 0.05 * oom.total_bytes):
        return None  # PyTorch holds a real share: its pool, not the driver, is the question
    return Match(
        0.2,
        f"Default reading (no specific pattern matched): the message says {gib(oom.free_bytes)} "
        f"of {gib(oom.total_bytes)} was free against a request of {gib(req)}, while PyTorch "
        f"held {gib(held)}: the allocation was refused below PyTorch, not for lack of memory.",
        config_patch={"command": "nvidia-smi  # driver version and the GPU's state"},
    )
