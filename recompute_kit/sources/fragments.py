"""Configs pasted into reports and logs: YAML/JSON, Megatron-LM command lines, Hydra overrides,
Python assignments and Megatron argument dumps, to flat Megatron-Core keys. How the diagnosis
of a failed run reads pastes (`parse_config`, `parse_config_with_notes`).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path
from typing import Any

from .arg_dump import _ARG_RE, parse_arg_dump
from .megatron_lm import VALUE_FLAGS
from .text import _DOTTED, clean_line
from .values import (
    _CONFIG_KEY_SET,
    _FLOAT_RE,
    _LIST_KEYS,
    _assign,
    _canonical_key,
    _convert_scalar,
    _convert_value,
    _finalize_config,
    _plain,
)

# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

_CLI_FLAG_RE = re.compile(r"(?:^|\s)--[A-Za-z]")
_HYDRA_RE = re.compile(r"^(\+{0,2}|~)?([A-Za-z_][\w-]*(?:\.[\w-]+)*)=(.*)$", re.S)
_SHELL_VAR_RE = re.compile(r"^\$\{?([A-Za-z_]\w*)\}?$")
# A shell variable expanded where it stands: `$MOE_ARGS`, `${MOE_ARGS}`, `"${MOE_ARGS[@]}"`.
_VAR_USE_RE = re.compile(r"\$\{?([A-Za-z_]\w*)(?:\[[@*]\])?\}?")
_ARG_LIST_NAME_RE = re.compile(r"(?:ARGS|FLAGS|OPTS|OPTIONS|PARAMS)$", re.I)
_MAX_SPLICED = 20_000  # tokens a script's variables may add (a guard, not a limit in practice)
_PY_ASSIGN_RE = re.compile(rf"^\s*({_DOTTED})\s*=(.*)$")
_SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1", "(", ")", "\\"})
# Launch-script and prose shorthands for Megatron-Core keys.
_SHORTHAND = {
    "TP": "tensor_model_parallel_size",
    "PP": "pipeline_model_parallel_size",
    "VPP": "virtual_pipeline_model_parallel_size",
    "CP": "context_parallel_size",
    "EP": "expert_model_parallel_size",
    "DP": "data_parallel_size",
    "MBS": "micro_batch_size",
    "GBS": "global_batch_size",
    "seq_len": "seq_length",
    "SEQ_LEN": "seq_length",
    "SEQ_PARALLEL": "sequence_parallel",
}
_MAX_NODES = 20_000


def _flatten(data: Any, prefix: str, out: list[tuple[str, Any]], depth: int = 0) -> None:
    """(dotted path, leaf value) pairs of a nested mapping, bounded in depth and size."""
    if not isinstance(data, dict) or depth > 20:
        return
    for key, value in data.items():
        if len(out) >= _MAX_NODES:
            return
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            _flatten(value, path, out, depth + 1)
        else:
            out.append((path, value))


def _from_mapping(data: dict[str, Any]) -> dict[str, Any]:
    """Flat keys from a YAML/JSON mapping, flat or nested (`model:` and other sections). A key
    found in several sections is taken from `model` first, then from the shallowest one."""
    pairs: list[tuple[str, Any]] = []
    _flatten(data, "", pairs)
    flat: dict[str, Any] = {}
    rank: dict[str, tuple[int, int]] = {}
    nemo: dict[str, Any] = {}  # NeMo 1.x activations_checkpoint_* -> recompute_* values
    mcore: dict[str, Any] = {}  # the recompute_* keys as written
    for path, value in pairs:
        if isinstance(value, str):
            value = _convert_scalar(value)
        value = _plain(value)
        parts = path.split(".")
        leaf = parts[-1].replace("-", "_")
        if leaf in _NEMO_RECOMPUTE:
            nemo.setdefault(_NEMO_RECOMPUTE[leaf], value)
        elif leaf in _NEMO_RECOMPUTE.values():
            mcore.setdefault(leaf, value)
        probe: dict[str, Any] = {}
        _assign(probe, path, value)
        for key, v in probe.items():
            priority = (int(parts[0] == "model"), -len(parts))
            if key not in rank or priority > rank[key]:
                flat[key], rank[key] = v, priority
    # NeMo 1.x builds the transformer config from activations_checkpoint_*: where a YAML has
    # both spellings, those win, a null included (the recompute_* keys are then ignored).
    overrides = {
        key: {"written": mcore[key], "used": nemo[key]}
        for key in nemo
        if key in mcore and mcore[key] != nemo[key]
    }
    if overrides:
        for key, both in overrides.items():
            flat[key] = both["used"]
        flat["activations_checkpoint_overrides"] = overrides
    return flat


_NEMO_RECOMPUTE = {
    "activations_checkpoint_granularity": "recompute_granularity",
    "activations_checkpoint_method": "recompute_method",
    "activations_checkpoint_num_layers": "recompute_num_layers",
}


def _shell_tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: fall back to plain words
        return text.replace('"', " ").replace("'", " ").split()


def _is_value_token(token: str) -> bool:
    if not token or token in _SHELL_OPERATORS or token in ("...", "…"):
        return False
    if token.startswith("-"):
        return bool(_FLOAT_RE.fullmatch(token))
    return not (token.endswith((".py", ".sh")) or ("=" in token and _HYDRA_RE.match(token)))


def _parse_command_line(
    text: str,
    hydra_only: bool = False,
    shell_vars: dict[str, str] | None = None,
    flag_vars: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Flags (`--recompute-modules core_attn mlp`, `--bf16`, `--x=1`) and Hydra overrides
    (`model.recompute_granularity=selective`) of one or more commands (shell scripts with
    backslash continuations, bash arrays and simple `NAME=value` variables included).

    A variable that holds flags (`MOE_ARGS="--num-experts 8 \\ ... "`, as Megatron-LM's
    example scripts write them) is read where the script expands it (`$MOE_ARGS`), or where
    it is defined when the text never expands it (a paste cut before the launch line).
    `shell_vars` (plain `NAME=value` variables) and `flag_vars` (variables holding flags) carry
    what earlier commands of the same paste defined; both are updated."""
    text = re.sub(r"\\\r?\n", " ", text)
    tokens = _shell_tokens(text)
    shell_vars = {} if shell_vars is None else shell_vars
    used = set(_VAR_USE_RE.findall(text))
    flag_vars = {} if flag_vars is None else flag_vars  # values that are flags, expanded
    spliced = 0
    out: dict[str, Any] = {}

    def resolve(token: str) -> str:
        m = _SHELL_VAR_RE.match(token)
        return shell_vars.get(m.group(1), token) if m else token

    def flag_var(token: str) -> str | None:
        m = _VAR_USE_RE.fullmatch(token)
        return m.group(1) if m and m.group(1) in flag_vars else None

    def holds_flags(token: str) -> bool:
        """`$GPT_ARGS` after a flag is more flags, not that flag's value: a variable known to
        hold flags, or an unknown one named like an argument list."""
        m = _VAR_USE_RE.fullmatch(token)
        if m is None:
            return False
        name = m.group(1)
        if name in flag_vars:
            return True
        if name in shell_vars:
            return not shell_vars[name] or bool(_CLI_FLAG_RE.search(" " + shell_vars[name]))
        return bool(_ARG_LIST_NAME_RE.search(name))

    i = 0
    while i < len(tokens):
        token = tokens[i]
        if (name := flag_var(token)) is not None and spliced < _MAX_SPLICED:
            tokens[i + 1 : i + 1] = flag_vars[name]
            spliced += len(flag_vars[name])
            i += 1
            continue
        if token.startswith("--") and len(token.split()) > 1:
            # a quoted array element holding a flag and its value ("--fp8-format hybrid")
            tokens[i : i + 1] = token.split()
            continue
        if token.startswith("--") and len(token) > 2 and token[2].isalpha():
            name, eq, inline = token[2:].partition("=")
            values: list[str] = []
            i += 1
            if eq:
                values.append(inline)
            else:
                while i < len(tokens) and _is_value_token(tokens[i]) and not holds_flags(tokens[i]):
                    values.append(resolve(tokens[i]))
                    i += 1
                while i < len(tokens) and tokens[i] in ("...", "…"):
                    i += 1
            if not eq and _mentioned_in_prose(name, values):
                continue  # "--checkpoint-activations is no longer valid, use ...": words
            if not eq and not values and f"--{name}" in VALUE_FLAGS:
                continue  # "`--recompute-method` must not be set": a flag that takes a value
            _assign_flag(out, name, values)
            continue
        m = _HYDRA_RE.match(token)
        if m is not None:
            key, value = m.group(2), m.group(3)
            if hydra_only:  # prose: "recompute_granularity=selective, TP=4, PP=2;"
                value = value.rstrip(",;")
            if key in _SHORTHAND:  # launch-script variables: TP=2 SEQ_PARALLEL=0 bash ...
                _assign(out, _SHORTHAND[key], _convert_value(resolve(value)))
            known = _canonical_key(key.rsplit(".", 1)[-1]) in _CONFIG_KEY_SET
            if "." in key or known or (hydra_only and not key.isupper()):
                _assign(out, key, _convert_value(resolve(value)))
            else:
                shell_vars[key] = value.strip("()")
                if _CLI_FLAG_RE.search(value) and spliced < _MAX_SPLICED:
                    inner: list[str] = []
                    for part in _shell_tokens(value):  # `ARGS="$ARGS --x"`: expand now
                        ref = flag_var(part)
                        inner += flag_vars[ref] if ref is not None else [part]
                    spliced += len(inner)
                    flag_vars[key] = inner
                    if key not in used:  # never expanded in this text: read it here
                        tokens[i + 1 : i + 1] = inner
        i += 1
    return out


# Words that follow a flag named in a sentence, never a flag's value on a command line.
PROSE_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "the",
        "then",
        "this",
        "that",
        "to",
        "use",
        "was",
        "were",
        "when",
        "which",
        "with",
    ]
)


def _mentioned_in_prose(name: str, values: list[str]) -> bool:
    """A flag written in a sentence (a message or a post), not passed: it ends in
    punctuation ("--recompute-method."), or the word after it is a function word ("and",
    "is", "use")."""
    if name[-1:] in ".,;:)!?":
        return True
    return bool(values) and values[0].lower().rstrip(",.;:") in PROSE_WORDS


def _assign_flag(out: dict[str, Any], name: str, values: list[str]) -> None:
    key = name.replace("-", "_")
    if key.startswith("no_") and _canonical_key(key[3:]) in _CONFIG_KEY_SET and not values:
        out[_canonical_key(key[3:])] = False
        return
    key = _canonical_key(key)
    if not values:
        value: Any = True
    elif key in _LIST_KEYS:
        value = [_convert_scalar(v) for part in values for v in part.split(",") if v.strip()]
    elif len(values) == 1:
        value = _convert_value(values[0])
    else:
        value = [_convert_scalar(v) for v in values]
    out[key] = value


def _strip_py_comment(line: str) -> str:
    """A Python line without its `# comment` (a `#` inside quotes is kept)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


_NOT_LITERAL = object()


def _py_literal(text: str) -> Any:
    s = text.strip().rstrip(",").strip()
    if not s or len(s) > 100_000:
        return _NOT_LITERAL
    try:
        return _plain(ast.literal_eval(s))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _parse_python_assignments(text: str) -> dict[str, Any]:
    """`cfg.model.recompute_modules = ["core_attn"]` lines and `recompute_num_layers=4,`
    keyword arguments (Megatron-Bridge recipes); values must be Python literals."""
    out: dict[str, Any] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _PY_ASSIGN_RE.match(_strip_py_comment(lines[i]))
        i += 1
        if m is None:
            continue
        key, rhs = m.group(1), m.group(2).strip()
        if rhs[:1] in "[({" and rhs.count(rhs[0]) > rhs.count(
            {"[": "]", "(": ")", "{": "}"}[rhs[0]]
        ):
            # a literal over several lines: read on until its brackets balance
            parts = [rhs]
            while i < len(lines) and len(parts) < 200:
                parts.append(_strip_py_comment(lines[i]))
                i += 1
                joined = " ".join(parts)
                if _py_literal(joined) is not _NOT_LITERAL:
                    break
            rhs = " ".join(parts)
        value = _py_literal(rhs)
        if value is not _NOT_LITERAL:
            _assign(out, key, value)
    return out


def _has_arg_dump(text: str) -> bool:
    count = 0
    for line in text.splitlines()[:5000]:
        m = _ARG_RE.match(clean_line(line))
        if m is not None and (m.group(1) or len(m.group(3)) >= 3):
            count += 1
            if count >= 2:
                return True
    return "------------------------ arguments" in text and count >= 1


def parse_config_with_notes(text: str, name: str = "") -> tuple[dict[str, Any], list[str]]:
    """`parse_config`, plus notes saying how the text was read and what was not understood."""
    notes: list[str] = []
    try:
        flat = _parse_config(text, name, notes)
        return _finalize_config(flat), notes
    except Exception as exc:  # never raise on garbage: the diagnosis must run
        notes.append(f"could not read config {name or '<text>'}: {type(exc).__name__}: {exc}")
        return {}, notes


def parse_config(text: str, name: str = "") -> dict[str, Any]:
    """Flat Megatron-Core keys (see `recompute_kit.config.CONFIG_KEYS`) from a config in any of:

    * YAML or JSON, flat or nested (`model:` sections as in Megatron-Bridge and NeMo; NeMo's
      `activations_checkpoint_*` keys become `recompute_*`);
    * a Megatron-LM command line or launch script (`--recompute-granularity full ...`;
      `--recompute-activations` means selective, `--num-experts` is `num_moe_experts`,
      `--fp8-format` is `fp8`);
    * Hydra-style overrides (`model.recompute_modules=[mlp,core_attn] trainer.devices=8`);
    * Python assignments of a Megatron-Bridge recipe (`cfg.model.recompute_num_layers = 4`);
    * Megatron's argument dump (`  recompute_granularity ........ full`).

    Unknown keys are kept (as dotted paths when nested) with typed values. Never raises:
    unreadable text gives {} (see `parse_config_with_notes` for why)."""
    return parse_config_with_notes(text, name)[0]


def _parse_config(text: str, name: str, notes: list[str]) -> dict[str, Any]:
    if not isinstance(text, str) or not text.strip():
        notes.append("the config is empty")
        return {}
    suffix = Path(name).suffix.lower() if name else ""
    stripped = text.lstrip()
    if stripped[:1] in "{[" or suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            notes.append("read as JSON")
            return _from_mapping(data)
    if _has_arg_dump(text):
        notes.append("read as a Megatron argument dump")
        return parse_arg_dump(text)
    is_cli = bool(_CLI_FLAG_RE.search(text))
    if suffix in (".yaml", ".yml") or not is_cli:
        data = _safe_yaml(text)
        if isinstance(data, dict) and data:
            notes.append("read as YAML")
            return _from_mapping(data)
    if is_cli:
        notes.append("read as a command line")
        return _parse_command_line(text)
    flat = _parse_command_line(text, hydra_only=True)
    flat.update(_parse_python_assignments(text))
    if flat:
        notes.append("read as Hydra overrides / Python assignments")
    else:
        notes.append(NO_KEYS)
    return flat


NO_KEYS = "no configuration keys found"


def _safe_yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None
