"""Settings pasted next to an error: the launch command line (`python train.py --model_name_or_path
... --finetuning_type full`, `torchrun --nproc_per_node 8 ...`) or a trainer's YAML block that issue
threads put above the traceback. Read from short logs only; what they set goes into the config
under the keys the log parser and an explicit --config already gave (those win).
"""

from __future__ import annotations

import re
from typing import Any

from ...sources.fragments import _from_mapping, _parse_command_line, _safe_yaml
from ...sources.text import clean_line

MAX_PASTED_SCAN_BYTES = 2 << 20  # pastes live in short logs, not in 100 MB ones
_FLAG_RE = re.compile(r"(?:^|[\s\"'=(])--[A-Za-z][\w.-]*")  # `ARGS="--x 1 \\` too
# `key: value` / `key:` with a lower-case snake_case key (exception lines start upper-case)
_YAML_LINE_RE = re.compile(r"^\s*[a-z_][a-z0-9_.-]{0,80}:(?:[ \t]+\S.*)?$")
_ENV_PREFIX_RE = re.compile(r"(?:^|\s)(CUDA_VISIBLE_DEVICES|ASCEND_RT_VISIBLE_DEVICES)=([\d,]+)")
_MIN_YAML_LINES = 3
_OVERRIDE_RE = re.compile(
    r"(?:^|[\s'\"(\[,])[+~]{0,2}([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)=([^\s'\",)\]]+)"
)
_IDENT_RE = re.compile(r"^[a-z_][a-z0-9_]*$")  # Megatron module names: lower snake_case


def parse_pasted_settings(text: str) -> dict[str, Any]:
    """Flat config keys from the command lines and YAML blocks in a pasted log ({} when none).
    Never raises."""
    try:
        return _parse(text)
    except Exception:  # a paste is never a reason to fail the diagnosis
        return {}


def _parse(text: str) -> dict[str, Any]:
    if not isinstance(text, str) or len(text) > MAX_PASTED_SCAN_BYTES:
        return {}
    lines = [_unquote(clean_line(line)) for line in text.splitlines()]
    flat: dict[str, Any] = {}
    for block in _yaml_blocks(lines):
        data = _safe_yaml("\n".join(block))
        if isinstance(data, dict):
            flat.update(_from_mapping(data))
    # GPUS_PER_NODE=8 ... --nproc_per_node $GPUS_PER_NODE; MOE_ARGS="--num-experts 8 ..." on
    # one command, $MOE_ARGS on the launch line
    shell_vars, flag_vars = _simple_vars(lines), {}
    for command in _commands(lines):
        flat.update(_parse_command_line(command, shell_vars=shell_vars, flag_vars=flag_vars))
    # Hydra overrides (NeMo-RL, Megatron-Bridge, NeMo): `++policy.train_micro_batch_size=1`, on
    # a command or quoted in a script's list (`f'++policy.x=1 '`); a dotted key only
    for line in lines:
        for key, value in _OVERRIDE_RE.findall(line):
            parsed = _safe_yaml(value)
            flat.setdefault(key, parsed if isinstance(parsed, (int, float, bool)) else value)
    modules = flat.get("recompute_modules")
    if isinstance(modules, list):
        # module names are identifiers: a flag's values that run on into glued prose
        # ("...recompute_granularity=selective...") are not the user's settings
        kept = [m for m in modules if isinstance(m, str) and _IDENT_RE.match(m)]
        flat["recompute_modules"] = kept
        if not kept:
            del flat["recompute_modules"]
    for key, value in _knob_lines(lines).items():  # commands and YAML win
        flat.setdefault(key, value)
    for line in lines:  # CUDA_VISIBLE_DEVICES=0,1 python train.py ...: the GPUs it uses
        if (m := _ENV_PREFIX_RE.search(line)) is not None:
            flat.setdefault("visible_devices", len([d for d in m.group(2).split(",") if d]))
            break
    return flat


# `micro_batch_size = 2` in a pasted script or its constants (one number, a memory knob's name)
_KNOB_ASSIGN_RE = re.compile(
    r"^\s*([a-z_]*(?:batch_size|seq_len(?:gth)?|max_length|max_len|accumulation_steps|"
    r"accumulation_iters))\s*=\s*(\d+)\s*,?\s*(?:#.*)?$"
)
# "Training batch size is 188", "a batch size of 4", "batch_size=8" in prose; not the
# evaluation's batch, not a batch the sentence says was tried away ("reduce ... to")
_PROSE_BATCH_RE = re.compile(
    r"(?<![\w.-])(?:(train(?:ing)?|val(?:idation)?|eval(?:uation)?|test|inference)[ _]+)?"
    r"batch[ _-]?size\s*(?:is|of|=|:)\s*(\d+)\b",
    re.I,
)


def _knob_lines(lines: list[str]) -> dict[str, Any]:
    """Memory knobs set outside a command line: Python assignments of one number to a batch /
    sequence / accumulation name, and a training batch size stated in a sentence."""
    found: dict[str, Any] = {}
    for line in lines:
        if (m := _KNOB_ASSIGN_RE.match(line)) is not None:
            found.setdefault(m.group(1), int(m.group(2)))
    if not any(k.endswith("batch_size") for k in found):
        for line in lines:
            for m in _PROSE_BATCH_RE.finditer(line):
                word = (m.group(1) or "train").lower()
                if word.startswith("train") and int(m.group(2)) > 0:
                    found.setdefault("batch_size", int(m.group(2)))
    return found


def _commands(lines: list[str]):
    """Command lines with flags, a backslash-continued command joined into one (and a quoted
    shell value read on to its closing quote: `GPT_ARGS="--num-layers 24 \\` ... `"`)."""
    parts: list[str] = []
    for line in [*lines, ""]:
        if line.lstrip().startswith(("File ", "#", ">>>")):
            line = ""
        stripped = line.rstrip()
        if parts or _FLAG_RE.search(stripped):
            parts.append(stripped.rstrip("\\"))
            if stripped.endswith("\\"):
                continue
            if _open_quote(parts) and len(parts) < _MAX_QUOTED_LINES and line:
                continue
        if parts:
            yield " ".join(parts)
            parts = []


# `MBS=2`, `export SEQ_LEN=4096`, `TP="4"`: a launch script's plain variables (one word each)
_SIMPLE_VAR_RE = re.compile(
    r"""^\s*(?:export\s+)?([A-Za-z_]\w*)=(["']?)([\w.,:/-]+)\2\s*(?:#.*)?$"""
)


def _simple_vars(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        if (m := _SIMPLE_VAR_RE.match(line)) is not None:
            found[m.group(1)] = m.group(3)
    return found


_MAX_QUOTED_LINES = 200
_QUOTED_VALUE_RE = re.compile(r"^\s*(?:export\s+)?[A-Za-z_]\w*=\"")


def _open_quote(parts: list[str]) -> bool:
    """A `NAME="...` value whose closing quote is on a later line."""
    return bool(_QUOTED_VALUE_RE.match(parts[0])) and sum(p.count('"') for p in parts) % 2 == 1


_SHELL_ASSIGN_RE = re.compile(r"""^\s*(?:export\s+)?[A-Z][A-Z0-9_]*=(["'])(.*)\1\s*$""")


def _unquote(line: str) -> str:
    """Flags inside a shell variable (`TRAIN_FLAGS="--lr 1e-4 --batch_size 4"`) or Markdown code
    spans (`--gradient_checkpointing`) read as flags."""
    if (m := _SHELL_ASSIGN_RE.match(line)) is not None:
        return m.group(2)
    if "`" not in line:
        return line
    # each code span is a command of its own: its flag's values end where the span does
    # ("when `--recompute-granularity selective` is used": selective, not "is used")
    return line.replace("`", " ; ") if line.count("`") % 2 == 0 else line.replace("`", " ")


def _yaml_blocks(lines: list[str]) -> list[list[str]]:
    """Runs of YAML mapping lines (comments and blank lines may sit between them), at least
    three `key: value` lines each."""
    blocks: list[list[str]] = []
    current: list[str] = []
    keys = 0
    for line in [*lines, "<end>"]:
        stripped = line.strip()
        if _YAML_LINE_RE.match(line) and "://" not in line.split(":", 1)[0]:
            current.append(line)
            keys += 1
            continue
        if current and (not stripped or stripped.startswith("#")):
            current.append(line)
            continue
        if current and line[:1].isspace() and stripped.startswith("- "):
            current.append(line)  # a YAML list under the previous key
            continue
        if keys >= _MIN_YAML_LINES:
            blocks.append(current)
        current, keys = [], 0
    return blocks
