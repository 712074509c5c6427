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

import re
from typing import Any

from ..evidence.schema import ErrorEvent
from ..types import Context, Match
from .general import ORPHAN, library_of
from .registry import fact, from_the_launcher, gib, oom_errors, rule

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
# Wording of a message that rejects the caller's input (an argument, a size, a count) rather
# than reporting a broken state inside the library.
_USER_INPUT_RE = re.compile(
    r"\bmust(?: not)? be\b|\bmust not\b|\bexpected\b|\bexceed|\b(?:greater|larger|"
    r"smaller|less|more) than\b|\bat (?:most|least)\b|\bout of range\b|\blimit\b|"
    r"\binvalid\b|\bshould be\b|\btoo (?:long|large|many|few)\b",
    re.I,
)
# Wording of a library's own broken invariant: a bug whatever the input.
_INTERNAL_RE = re.compile(
    r"internal assert|please report|this is a bug|should not happen|"
    r"should never happen|unreachable",
    re.I,
)
# Known limits of checkpointing's API: function -> {argument: the value within its limit}.
_API_LIMITS = {"checkpoint_sequential": {"segments": "len(functions)"}}
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")


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


def _user_input_error(ctx: Context) -> tuple[Any, str | None] | None:
    """(the exception, the library function called from the user's code) when a ValueError /
    AssertionError / TypeError rejects the caller's input: its message speaks of an argument's
    limit, and it is raised right at the call (the innermost frame is the library function the
    user's own frame called) or the paste shows no frame at all."""
    events = [e for e in _failure_without_oom(ctx) if e.message != ORPHAN]
    if not events:
        events = [
            e
            for e in ctx.evidence.errors
            if e.kind == "exception" and e.message != ORPHAN and not ctx.oom and not oom_errors(ctx)
        ]
    if not events and not ctx.oom and not oom_errors(ctx):
        failed = fact(ctx, "assert_failed", "log")  # the AssertionError without its head
        if failed:
            events = [ErrorEvent("AssertionError", failed[1], context=[failed[0]])]
    if not events:
        return None
    e = events[-1]
    kind = e.type.rsplit(".", 1)[-1]
    if kind not in (*_REJECTS, "TypeError", "") or _INTERNAL_RE.search(e.message):
        return None
    if not kind and not e.frames:
        return None  # a message with no type and no frame: too little to read as rejected
    if not _USER_INPUT_RE.search(e.message):
        return None
    frames = [f.replace("\\", "/") for f in e.frames if not any(p in f for p in _PLUMBING)]
    if not frames:
        return e, None
    if library_of(frames[-1]) is None:
        return None  # raised in the script's own code: the script's check, not a library's
    if len(frames) < 2 or library_of(frames[-2]) is not None:
        return None  # deep inside the library: its state, not the caller's argument
    return e, frames[-1].rsplit(" in ", 1)[-1]


def _named_arguments(ctx: Context, e, func: str | None) -> list[str]:
    """The arguments the rejection is about: those the user's call passes that the message or
    the failing line uses; else the settings (snake_case names) the message or its assert
    names."""
    code = dict(fact(ctx, "frame_code", "log") or [])
    said = [e.message, *(code.get(f, "") for f in e.frames[-1:])]
    said += [c for c in e.context if c.lstrip().startswith("assert ")]
    idents = {w for line in said for w in _IDENT_RE.findall(line)}
    passed = [ln.split("=", 1)[0].strip() for ln in fact(ctx, "kwarg_lines", "log") or []]
    named = [a for a in passed if a in idents]
    if func in _API_LIMITS:
        named = [a for a in _API_LIMITS[func] if a in named or a in idents] or named
    if not named:  # a quoted word is a value ("Allowed modules are: {'mla_up_proj', ...}")
        bare = re.sub(r"'[^']*'|\"[^\"]*\"", " ", e.message)
        named = [w for w in dict.fromkeys(_IDENT_RE.findall(bare)) if "_" in w.strip("_")]
    return named[:3]


@rule(
    "RK650",
    "A library rejects the caller's argument: a limit, size or count the input breaks",
    "invalid_config",
    symptom="A ValueError / AssertionError / TypeError whose message speaks of a limit "
    "('must be', 'expected', 'exceeds', 'at most'), raised by the library function the "
    "script calls (or pasted without frames), with no OOM",
    cause="The library checks what it was given and rejects it: an argument outside its "
    "range (checkpoint_sequential's segments above the number of functions), a sample "
    "longer than the per-batch token limit; the input is wrong, not the library",
    confirm="Compare the named argument with the limit the message states (the number of "
    "functions, the longest sample); a value inside the limit runs",
    fix="Bring the named argument within its limit (segments <= len(functions)); for a "
    "sample over a length / token limit raise the limit, cut the sample, or skip it",
    patch={"segments": "len(functions)"},
)
def _user_input(ctx: Context) -> Match | None:
    found = _user_input_error(ctx)
    if found is None:
        return None
    e, func = found
    named = _named_arguments(ctx, e, func)
    if not named:
        return None
    where = f" by {func}(), which the script calls," if func else ""
    said = f"{e.type}: {e.message[:160]}"
    limits = _API_LIMITS.get(func or "", {})
    if any(a in limits for a in named):
        arg = next(a for a in named if a in limits)
        return Match(
            0.6,
            f"{said} is raised{where} on the argument {arg}: {func} splits its functions "
            f"into {arg} pieces, so {arg} must be between 1 and the number of functions.",
            config_patch={arg: limits[arg]},
            fix=f"Pass {arg} at most len(functions) (and at least 1) to {func}; the message "
            "does not say so, the argument is out of range",
        )
    flags = ", ".join(f"--{a.replace('_', '-')}" for a in named)
    arg = named[0]
    long_sample = bool(re.search(r"exceed|too long|longer than", e.message, re.I))
    if long_sample:
        fix = (
            f"One input is beyond {arg}: raise {arg} ({flags}) above the longest input if "
            "memory allows, cut or filter the inputs longer than it, or skip them (the "
            "loader's skip-invalid-size option, fairseq's --skip-invalid-size-inputs-valid-test)"
        )
    else:
        fix = f"Set {arg} ({flags}) within the limit the message states; the input is wrong"
    return Match(
        0.55,
        f"{said} is raised{where or ''} about {', '.join(named)}: the library rejects the "
        "input it was given, not a bug of its own.",
        config_patch={arg: "<within the limit the message states>", "command": f"{flags} ..."},
        fix=fix,
    )


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
    if _user_input_error(ctx) is not None:
        return None  # the caller's input rejected: RK650's reading
    # a launcher's "a rank failed" (ChildFailedError) says nothing of why: the rank's own
    # exception, or its traceback cut before the exception line, is the one to read
    inner = [e for e in events if not from_the_launcher(e)] or events
    typed = [e for e in inner if e.message != ORPHAN]
    e = typed[-1] if typed else inner[-1]
    frames = e.frames or [f for o in inner for f in o.frames]
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
