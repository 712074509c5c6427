"""Facts about how pasted code calls an API, and what failed or differed: keyword arguments on
their own lines, tensors built without requires_grad and the code looking at gradients, a
trainer handed checkpointing over the model's own kwargs, an assert followed by the message it
printed, lines saying two runs' gradients differ, reports of the tensors saved for backward
(`saved_report`), lines of a compiler's trace (`compiled_trace`) and a compiled backward's
signature (`backward_trace`: its saved_for_backward / cotangents inputs), lines naming a
checkpoint wrapper (`ckpt_wrapper`) and FSDP (`fsdp_named`), torch.compile's activation memory
budget set below 1 (`memory_budget`: [(line, value)]) and a reentrant checkpoint whose output is
stored where its function reaches it (`ckpt_output_cycle`: [checkpoint line, store line, the
container]). evidence/code.py merges them into its facts (`scan_snippets` documents the keys)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# A keyword argument on its own line of a call (PEP 8: no spaces around "="), "segments=4,".
_KWARG_RE = re.compile(r"^([a-z_]\w*)=(?!=)(\S.*?),?\s*\)?$")

# A tensor built outside autograd and bound to a name: "x = torch.randn(10, 4)" (no
# requires_grad=True on the line).
_PLAIN_INPUT_RE = re.compile(
    r"^([A-Za-z_]\w*)\s*=\s*torch\.(?:randn|rand|zeros|ones|empty|full|tensor|arange|randint)"
    r"(?:_like)?\("
)
# Code that looks at a result's gradient state: "print(z.requires_grad)", "w.grad is None".
_GRAD_PROBE_RE = re.compile(r"\w\.(?:requires_grad|grad|grad_fn)\b(?!\s*=[^=])(?!_)")

# Prose / output saying two runs' gradients differ: "grad match: False", "compiled grad
# differs from eager grad", "gradients do not match".
_GRAD_MISMATCH_RE = re.compile(
    r"\bgrad(?:s|ients?)?\b[^.;]{0,40}?(?:\bdiffer|\bmismatch|\bmatch(?:es)?:\s*false|"
    r"\bdo(?:es)?(?: not|n't) match|\bnot (?:equal|close|the same))"
    r"|(?:\bdiffer|\bmismatch)[^.;]{0,30}?\bgrad"
)
# Words of a gradient-mismatch line the rules weigh (what recomputes, what is random).
_MISMATCH_WORDS = (
    "compile",
    "checkpoint",
    "recompute",
    "partitioner",
    "memory_budget",
    "rng",
    "dropout",
    "random",
    "seed",
    "bernoulli",
)
_ASSERT_MSG_RE = re.compile(r"""^\s*assert\s+.+?,\s*f?(["'])(.+)\1\s*\)?\s*$""")


def _assert_then_message(line: str, after: list[str]) -> list[str] | None:
    """[the assert line, its message] when a pasted `assert cond, "message"` (an f-string's
    fields read as anything) is followed by the message it prints: the AssertionError pasted
    without its "AssertionError: " head."""
    m = _ASSERT_MSG_RE.match(line)
    if not m:
        return None
    parts = re.split(r"\{[^{}]*\}", m.group(2))
    if sum(len(p.strip()) for p in parts) < 12:
        return None
    template = re.compile(
        r"^(?:AssertionError:\s*)?" + ".+?".join(re.escape(p) for p in parts) + r"\s*$"
    )
    for nxt in after:
        if nxt.strip() and template.match(nxt.strip()):
            msg = nxt.strip()
            return [
                line.strip(),
                msg.split(":", 1)[1].strip() if msg.startswith("AssertionError:") else msg,
            ]
    return None


_GC_ENABLE_KWARGS_RE = re.compile(
    r"gradient_checkpointing_enable\(\s*gradient_checkpointing_kwargs"
)
_GC_ARG_RE = re.compile(r"\bgradient_checkpointing\s*=\s*(?!False\b)(?!None\b)\w")
_GC_KWARGS_ARG_RE = re.compile(r"\bgradient_checkpointing_kwargs\s*=")


def _trainer_resets_gc(lines: list[str], quote: Callable[[str], str]) -> list[str] | None:
    """[the model's enable call with kwargs, the trainer's argument] when code enables
    checkpointing on the model with gradient_checkpointing_kwargs and also hands the trainer
    gradient_checkpointing=<on> without gradient_checkpointing_kwargs: the trainer enables it
    again with its own (default) kwargs. A pasted diff is read as its old version (the
    "-" and unmarked lines; "+" lines are the change)."""
    enable = arg = None
    trainer_kwargs = False
    for line in lines:
        s = line.strip()
        if s.startswith("+") and not s.startswith("++"):
            continue
        if s.startswith("-") and not s.startswith("--"):
            s = s[1:].strip()
        if _GC_ENABLE_KWARGS_RE.search(s):
            enable = enable or s
        elif _GC_ARG_RE.search(s):
            arg = arg or s
        elif _GC_KWARGS_ARG_RE.search(s) and "{" not in s.split("=", 1)[0]:
            trainer_kwargs = True
    if enable and arg and not trainer_kwargs:
        return [quote(enable), quote(arg)]
    return None


# A report of what autograd keeps for backward: "len(out.grad_fn.saved_tensors)=5",
# "Saved tensors size Thunder: 580.00 MiB", "saved for backward: 12 tensors, 2.3 GiB".
_SAVED_REPORT_RE = re.compile(
    r"saved_tensors\)?\s*[=:]\s*\d+"
    r"|\bsaved[ _](?:tensors?|activations|for[ _]backward)\b[^\n]{0,40}?"
    r"\d+(?:\.\d+)?\s*(?:[KMG]i?B|bytes|tensors)\b",
    re.IGNORECASE,
)
# A line of a compiler's trace / generated program: an nvFuser region call, a primitive, a
# trace's shape annotation ('# t10: "cuda:0 f16[1, 16384, 10240]"'), inductor's kernels.
_COMPILED_TRACE_RE = re.compile(
    r"\bnvFusion\d+\(|\bprims\.\w+\(|#\s*\w+:\s*\"cuda:\d+\s+\w+\[|\bthunder\.jit\("
    r"|\btorch\.compile\(|\btriton_\w+_fused_\w+|\bTorchInductor\b|\bfx_graph\b"
)
# The signature of a compiled backward (thunder's backward_fn, an AOT autograd backward graph):
# its inputs are the tensors saved for backward and the incoming gradients (cotangents).
_BACKWARD_TRACE_RE = re.compile(r"\bdef\s+\w*backward\w*\(\s*[^)]*(?:saved_for_backward|tangents)")


# torch.compile's memory budget for the partitioner (torch._functorch.config.
# activation_memory_budget = 0.5), torchtitan's memory_budget = 0.5, a flag or a JSON key
_MEMORY_BUDGET_RE = re.compile(
    r"\b(?:activation[_-])?memory[_-]budget\b[\"']?\s*[=:]\s*[\"']?(\d*\.\d+|[01])\b"
)

# out = checkpoint(fn, ...) / torch.utils.checkpoint.checkpoint(self.block, ...)
_CKPT_ASSIGN_RE = re.compile(
    r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=\s*(?:[\w.]+\.)?checkpoint\(\s*([A-Za-z_][\w.]*)\s*[,)]"
)
_DEF_RE = re.compile(r"^(\s*)def\s+([A-Za-z_]\w*)\s*\(")
_NAME_RE = re.compile(r"\b[A-Za-z_]\w*\b")


def _store_of(line: str, out: str) -> str | None:
    """The container a line stores `out` in: "data['x'] = out", "self.cache = out",
    "outputs.append(out)"; None when it does not."""
    m = re.match(r"^\s*([A-Za-z_]\w*)(?:\[[^\]]*\]|\.\w+)\s*=\s*(.+)$", line)
    if m and re.search(rf"\b{re.escape(out)}\b", m.group(2)) and "==" not in line:
        return m.group(1)
    m = re.match(r"^\s*([A-Za-z_]\w*)\.(?:append|extend|insert|update|setdefault)\((.*)$", line)
    if m and re.search(rf"\b{re.escape(out)}\b", m.group(2)):
        return m.group(1)
    return None


def _body_names(lines: list[str], name: str) -> set[str]:
    """The names used in the body of `def name(...)` in the paste (empty if not there)."""
    for i, line in enumerate(lines):
        m = _DEF_RE.match(line)
        if not m or m.group(2) != name:
            continue
        indent, names = len(m.group(1)), set()
        body = lines[i + 1 :]
        nxt = next((b for b in body if b.strip()), "")
        flat = len(nxt) - len(nxt.lstrip()) <= indent  # indentation lost (a collapsed paste)
        for line in body:
            if flat and (not line.strip() or _DEF_RE.match(line)):
                break
            if not flat and line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            names.update(_NAME_RE.findall(line.split("#", 1)[0]))
            if flat and line.lstrip().startswith("return"):
                break  # without indentation, the first return ends the body
        return names
    return set()


def _output_cycle(lines: list[str], quote: Callable[[str], str]) -> list[str] | None:
    """[checkpoint line, store line, container] when a reentrant checkpoint's output is stored
    in an object its run function reaches (a closure's variable, or self for a bound method):
    the reentrant CheckpointFunction keeps run_function on its ctx, so output -> graph ->
    run_function -> container -> output is a cycle only the cyclic gc frees."""
    for i, line in enumerate(lines):
        m = _CKPT_ASSIGN_RE.match(line)
        if not m or "use_reentrant=False" in line.replace(" ", ""):
            continue
        out, fn = m.group(1), m.group(2)
        reach = {fn.split(".")[0]} if "." in fn else _body_names(lines, fn)
        if not reach:
            continue
        indent = len(line) - len(line.lstrip())
        for later in lines[i + 1 : i + 12]:
            if later.strip() and len(later) - len(later.lstrip()) < indent:
                break  # the function the checkpoint is called in ended
            if re.match(rf"^\s*{re.escape(out)}\s*=[^=]", later):
                break  # the name now holds something else
            container = _store_of(later, out)
            if container and container in reach and container != out:
                return [quote(line), quote(later), container]
    return None


def scan_calls(
    lines: list[str], is_code: Callable[[str], bool], quote: Callable[[str], str]
) -> dict[str, Any]:
    """The facts above over cleaned lines (is_code / quote: evidence/code.py's)."""
    facts: dict[str, Any] = {}

    def add(key: str, line: str) -> None:
        bucket = facts.setdefault(key, [])
        if len(bucket) < 8:
            bucket.append(quote(line))

    for i, line in enumerate(lines):
        if not line.strip():
            continue
        lower = line.lower()
        if _KWARG_RE.match(line.strip()) and is_code(line):
            add("kwarg_lines", line)
        if is_code(line) and "requires_grad" not in line and _PLAIN_INPUT_RE.match(line.strip()):
            add("plain_inputs", line)
        if _GRAD_PROBE_RE.search(line) and is_code(line) and "File " not in line:
            add("grad_probe", line)
        if "grad" in lower and _GRAD_MISMATCH_RE.search(lower):
            add("grad_mismatch", line)
            words = facts.setdefault("grad_mismatch_words", [])
            words += [w for w in _MISMATCH_WORDS if w in lower and w not in words]
        if "saved" in lower and _SAVED_REPORT_RE.search(line):
            add("saved_report", line)
        if _COMPILED_TRACE_RE.search(line):
            add("compiled_trace", line)
        if "backward" in lower and _BACKWARD_TRACE_RE.search(line):
            add("backward_trace", line)
        if "checkpoint_wrapper" in lower or "apply_activation_checkpointing" in lower:
            add("ckpt_wrapper", line)
        if "fsdp" in lower or "fullyshardeddataparallel" in lower:
            add("fsdp_named", line)
        if line.lstrip().startswith("assert ") and "assert_failed" not in facts:
            failed = _assert_then_message(line, lines[i + 1 : i + 3])
            if failed:
                facts["assert_failed"] = failed
        m = _MEMORY_BUDGET_RE.search(lower) if "budget" in lower else None
        if m and float(m.group(1)) < 1 and len(facts.get("memory_budget", [])) < 4:
            facts.setdefault("memory_budget", []).append((quote(line), float(m.group(1))))
    if any("checkpoint(" in line for line in lines) and (cycle := _output_cycle(lines, quote)):
        facts["ckpt_output_cycle"] = cycle
    reset = _trainer_resets_gc(lines, quote)
    if reset:
        facts["trainer_resets_gc"] = reset
    return facts
