"""Ways real users paste a log: cut, re-wrapped, prefixed. Deterministic variants of a corpus
case's text, to measure whether the doctor's top category survives how a paste is cut
(benchmarks/doctor_robustness.py, tests/test_doctor_robustness.py).

Each variant kind is a function of the case (its `artefacts` text and optional `config`) that
returns the perturbed case, or None when the kind does not apply (the text would not change, or
the case lacks the part the kind cuts). Only development cases are ever perturbed.
"""

from __future__ import annotations

import re
import tempfile
import textwrap
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corpus_scoring import load_cases, run_case, split_of

from recompute_kit.doctor.evidence.oom import looks_like_oom
from recompute_kit.doctor.evidence.text import _EXC_SEARCH_RE

# The first line of the error part of a paste: a traceback header, an exception line, an OOM.
_ERROR_LINE_RE = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception)\b:|out of memory"
    r"|OutOfMemory|\bOOM\b",
    re.I,
)
# An exception type at the start of a line, as `(c)` removes it: "torch.OutOfMemoryError: ".
_EXC_HEAD_RE = re.compile(r"^(\s*)(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception):\s?")
# Lines of a configuration or a command: `--flag value`, `key: value`, `key=value`, JSON.
_CONFIG_LINE_RE = re.compile(
    r"(?:^|\s)--[A-Za-z][\w.-]*|^\s*[a-z_][\w.-]*\s*:\s+\S|^\s*[A-Za-z_][\w.]*\s*=\s*\S"
    r"|^\s*\"[\w.-]+\"\s*:|^\s*(?:python|torchrun|deepspeed|accelerate|srun|bash)\b"
)

Case = dict[str, Any]


def _lines(case: Case) -> list[str]:
    return str(case["artefacts"]).splitlines()


def _with(case: Case, lines: list[str], config: Any = "keep") -> Case | None:
    text = "\n".join(lines) + "\n"
    if not text.strip():
        return None
    new = dict(case)
    new["artefacts"] = text
    if config != "keep":
        new["config"] = config
    if new["artefacts"].strip() == str(case["artefacts"]).strip() and config == "keep":
        return None
    return new


def error_start(lines: list[str]) -> int | None:
    """Index of the first line of the error part: traceback, exception line or OOM."""
    for i, line in enumerate(lines):
        if _ERROR_LINE_RE.search(line) or looks_like_oom(line):
            return i
        if ("Error" in line or "Exception" in line) and _EXC_SEARCH_RE.search(line):
            return i
    return None


def tail_from_error(case: Case) -> Case | None:
    """(a) Only the lines from the first error / OOM / traceback line on."""
    lines = _lines(case)
    start = error_start(lines)
    if not start:
        return None
    return _with(case, lines[start:])


def first_half(case: Case) -> Case | None:
    """(b) Only the first half of the lines."""
    lines = _lines(case)
    if len(lines) < 2:
        return None
    return _with(case, lines[: (len(lines) + 1) // 2])


def no_exception_head(case: Case) -> Case | None:
    """(c) Without 'Traceback (most recent call last):' and the exception-type prefix of the
    exception lines ("RuntimeError: CUDA out of memory." -> "CUDA out of memory.")."""
    out = []
    for line in _lines(case):
        if "Traceback (most recent call last)" in line:
            continue
        out.append(_EXC_HEAD_RE.sub(r"\1", line, count=1))
    return _with(case, out)


def _prefixed(prefix: str) -> Callable[[Case], Case | None]:
    def variant(case: Case) -> Case | None:
        return _with(case, [prefix + line for line in _lines(case)])

    variant.__doc__ = f"(d) Every line prefixed with {prefix!r}."
    return variant


def hard_wrap(case: Case) -> Case | None:
    """(e) Hard-wrapped at 80 columns, as a terminal copy cuts: mid-word, no space added."""
    out = []
    for line in _lines(case):
        out.extend([line[i : i + 80] for i in range(0, len(line), 80)] or [""])
    return _with(case, out)


def word_wrap(case: Case) -> Case | None:
    """(e') Re-wrapped at 80 columns at spaces (mail and editor re-flow), indentation kept."""
    out = []
    for line in _lines(case):
        if len(line) <= 80:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.extend(
            textwrap.wrap(
                line,
                80,
                initial_indent="",
                subsequent_indent=indent,
                break_long_words=True,
                break_on_hyphens=False,
            )
        )
    return _with(case, out)


def elide_middle(case: Case) -> Case | None:
    """(f) The middle third of the lines replaced by '...'."""
    lines = _lines(case)
    n = len(lines)
    if n < 6:
        return None
    keep = n // 3
    return _with(case, [*lines[:keep], "...", *lines[n - keep :]])


def _config_lines(lines: list[str], start: int | None) -> list[int]:
    end = start if start is not None else len(lines)
    return [i for i in range(end) if _CONFIG_LINE_RE.search(lines[i])]


def config_only(case: Case) -> Case | None:
    """(g) The configuration / command part without the error part: the lines before the first
    error line that look like settings, and the case's config."""
    lines = _lines(case)
    start = error_start(lines)
    picked = _config_lines(lines, start)
    if start is None or not (picked or case.get("config")):
        return None
    if not picked:  # the settings are the case's config only: an empty paste with it
        return {**case, "artefacts": ""}
    return _with(case, [lines[i] for i in picked])


def error_only(case: Case) -> Case | None:
    """(g') The error part without the configuration / command part (and without the case's
    config), where the case has both."""
    lines = _lines(case)
    start = error_start(lines)
    picked = set(_config_lines(lines, start))
    if start is None or not (picked or case.get("config")):
        return None
    return _with(case, [line for i, line in enumerate(lines) if i not in picked], config=None)


def fenced(case: Case) -> Case | None:
    """(h) Inside a Markdown code fence."""
    return _with(case, ["```", *_lines(case), "```"])


def quoted(case: Case) -> Case | None:
    """(h') Every line behind GitHub's quote marker '> '."""
    return _with(case, [("> " + line).rstrip() for line in _lines(case)])


def collapsed(case: Case) -> Case | None:
    """(h'') Whitespace collapsed: indentation gone, runs of spaces one space."""
    return _with(case, [" ".join(line.split()) for line in _lines(case)])


VARIANTS: dict[str, Callable[[Case], Case | None]] = {
    "a_tail_from_error": tail_from_error,
    "b_first_half": first_half,
    "c_no_exception_head": no_exception_head,
    "d_rank": _prefixed("[rank3]: "),
    "d_torchrun": _prefixed("[default0]:"),
    "d_srun": _prefixed("0: "),
    "d_logger": _prefixed("2024-05-01 12:00:01,123 - ERROR - "),
    "e_hard_wrap": hard_wrap,
    "e_word_wrap": word_wrap,
    "f_elide_middle": elide_middle,
    "g_config_only": config_only,
    "g_error_only": error_only,
    "h_fenced": fenced,
    "h_quoted": quoted,
    "h_collapsed": collapsed,
}


def robustness(cases_dir: Path, kinds: list[str] | None = None) -> list[dict[str, Any]]:
    """For every development case the doctor gets right unperturbed, one row per applicable
    variant kind: {"id", "kind", "expected", "got", "rule", "kept"}."""
    cases = [c for c in load_cases(cases_dir) if split_of(c["source"]) == "dev"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in cases:
            if not run_case(case, work).category_ok:
                continue
            for kind, make in VARIANTS.items():
                if kinds and kind not in kinds:
                    continue
                variant = make(case)
                if variant is None:
                    continue
                r = run_case(variant, work)
                rows.append(
                    {
                        "id": case["id"],
                        "kind": kind,
                        "expected": case["expected_category"],
                        "got": r.got,
                        "rule": r.rule,
                        "kept": r.category_ok,
                        "error": r.error,
                    }
                )
    return rows


def summarize(rows: list[dict[str, Any]], by: str) -> dict[str, dict[str, int]]:
    """{value of `by`: {"n", "kept"}} plus "all"."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"n": 0, "kept": 0})
    for row in rows:
        for key in (row[by], "all"):
            out[key]["n"] += 1
            out[key]["kept"] += bool(row["kept"])
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "all", kv[0])))
