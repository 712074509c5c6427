"""Prose about releases: the same code works on one release and fails (or takes more memory)
on another ("runs fine on PyTorch 2.5.1 but OOMs on 2.9", "worked fine up until 1.7.7. It
stopped working from 1.8.0", "after upgrading to torch 2.1"), a library version stated next to
a leak, and features said to fail only in combination ("X together with Y", "without it, the
error goes away"). Facts for the framework-bug rules (rules/framework_bugs.py, general.py)."""

from __future__ import annotations

import re

# a release: "PyTorch 2.5.1+cu121", "torch==2.9", "v1.8.0", "0.4.1", "1.0.0"
_LIB = (
    r"(?:(py)?(torch|lightning|pytorch[ _-]lightning|transformers|deepspeed|accelerate|peft|"
    r"megatron(?:[ _-]core)?|cudnn|cuda|trl|diffusers|fairscale|vllm|apex|xformers|"
    r"flash[ _-]attn)\s*(?:version\s*)?(?:==|=|\s)\s*)?"
)
_VER = r"v?(\d+\.\d+(?:\.\d+)?(?:[a-z]+\d*)?(?:\+\w+)?)"
_RELEASE = _LIB + _VER
# The release that worked: "runs fine on X", "worked fine up until X", "works fine under X",
# "it only takes 3.5G on X", "was ok in X", "no problem with X"
_GOOD_RE = re.compile(
    r"\b(?:works?|worked|working|runs?|ran|running|trains?|trained|was|were|is)\b\s+"
    r"(?:\w+\s+){0,2}?(?:fine|ok|okay|well|perfect(?:ly)?|normally|without (?:such |any )?"
    r"(?:an? )?(?:issues?|problems?|errors?|oom))\b[^.\n;]{0,30}?\b(?:on|in|under|with|using|"
    r"until|up until|up to|before)\s+(?:the\s+)?"
    + _RELEASE
    + r"|\bonly (?:takes?|uses?|used|needs?|needed)\s+[\d.]+\s*[GM]i?B?\s+(?:on|in|with|under)\s+"
    + _RELEASE,
    re.I,
)
# The release that fails: "OOMs immediately on PyTorch 2.9", "stopped working from 1.8.0",
# "gradually under pytorch 1.0.0", "after upgrading to 2.1", "on master"
_BAD_RE = re.compile(
    r"\b(?:but|while|whereas|however|now|stopped|breaks?|broke|fails?|failed|ooms?|"
    r"out of memory|crash\w*|errors?|more memory|eat\w*|gradually|after (?:upgrading|updating|"
    r"switching|moving|bumping)|since)\b[^.\n]{0,80}?\b(?:on|in|under|with|from|to|since|"
    r"using)\s+(?:the\s+)?" + _RELEASE,
    re.I,
)
_UPGRADE_RE = re.compile(
    r"\bafter (?:upgrading|updating|an? (?:upgrade|update)|bumping|moving)\b[^.\n]{0,40}?"
    r"(?:to\s+)?" + _RELEASE,
    re.I,
)
# One sentence naming both sides: "after upgrading deepspeed from 0.15.0 to 0.16.0, ... OOM",
# "updated transformers from 4.44 to 4.46 and now it fails": the "from" release worked
_FROM_TO_RE = re.compile(
    r"\b(?:upgrad|updat|bump|mov|switch)(?:e|ed|es|ing)\b\s+(?:(?:the|my|our)\s+)?"
    r"(?:(py)?(torch|lightning|transformers|deepspeed|accelerate|peft|megatron(?:[ _-]core)?|"
    r"cudnn|cuda|trl|diffusers|fairscale|vllm|apex|xformers|flash[ _-]attn)\s+)?"
    r"(?:version\s+)?from\s+" + _VER + r"\s+to\s+" + _VER,
    re.I,
)
# Going back fixes it: "downgrading transformers to version 4.37.2 resolves this issue",
# "rolling back to torch 2.1 works": that release worked
_DOWNGRADE_RE = re.compile(
    r"\b(?:downgrad\w*|roll\w*\s+back|revert\w*|going\s+back)\s+(?:\w+\s+){0,3}?(?:to\s+)?"
    + _RELEASE
    + r"[^.\n]{0,60}?\b(?:resolv\w*|fix\w*|solv\w*|works?|worked|helps?|helped|goes away|"
    r"went away|no (?:more )?(?:oom|error))",
    re.I,
)
# The release first, the failure after: "using transformers version 4.38.2 results in an error"
_BAD_AFTER_RE = re.compile(
    _RELEASE + r"[^.\n]{0,30}?\b(?:results?\s+in|leads?\s+to|causes?|gives?|throws?|raises?)"
    r"\b[^.\n]{0,30}?(?:error|\booms?\b|out of memory|crash)",
    re.I,
)
# a development build as the failing side: "on master takes huge amount of memory"
_DEV_BRANCH_RE = re.compile(r"\b(?:on|with|in) (?:the )?(master|nightly|main branch)\b", re.I)
_FAILURE_WORDS_RE = re.compile(
    r"out of memory|\booms?\b|memory|stopped working|\bfail|\berror|crash|broke|leak|slower",
    re.I,
)
# A library version stated in prose: "My pytorch version 0.4.0a0+4d405a4", "torch 2.3.1"
_VERSION_SAID_RE = re.compile(
    r"\b(?:py)?(torch|transformers|deepspeed|lightning|accelerate|megatron|trl|peft)\b\s*"
    r"(?:version\s*"
    r"(?:is\s*)?:?\s*|==\s*|\s)v?(\d+\.\d+[\w.+]*)",
    re.I,
)
# A release named as a point on a timeline, not the one installed: "Starting in PyTorch 2.9"
_TIMELINE_RE = re.compile(
    r"\b(?:starting|beginning|as of|since|until|before|after)\s+(?:in\s+|with\s+|from\s+)?$",
    re.I,
)
# Features failing only together: "using X together with Y", "only get this when I use X with
# Y", "without it, the error goes away"
_TOGETHER_RE = re.compile(
    r"\b(?:together|in combination|combined) with\b|\bonly (?:\w+ ){0,3}(?:when|if) (?:I |we )?"
    r"(?:use|enable|turn on|combine)\b[^.\n]{0,60}\bwith\b",
    re.I,
)
_CUDNN_RE = re.compile(r"\bcudnn\b(?!\s*version)|\bconv(?:[123]d|olution)\b", re.I)
_CODE_RE = re.compile(r"^\s*(?:>>>|\$|#|import |from |def |for |if |[\w.]+\s*=(?!=)|[\w.]+\()")


# A comparison table by release: a header cell naming the library (or "version") and rows
# whose first cell is a release, "| 2.9.1 | ... | OOM at batch=64 |", "| **2.11.0** | Fits |".
_TABLE_LIB_RE = re.compile(
    r"^(?:py)?(torch|lightning|transformers|deepspeed|accelerate|peft|megatron|vllm|cudnn|"
    r"cuda)\b|^(?:release|version)s?$",
    re.I,
)
_TABLE_VER_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+)?(?:[a-z]+\d*)?(?:\+\w+)?)$")
_TABLE_BAD_RE = re.compile(r"\booms?\b|out of memory|\bfail|\berror|crash|\bleak", re.I)
_TABLE_GOOD_RE = re.compile(r"\bfits?\b|\bworks?\b|\bok\b|\bpass(?:es|ed)?\b|\u2705", re.I)


def _table_regression(text: str) -> tuple[str, str, str, str] | None:
    """(library, good, bad, line) from a markdown table comparing releases: one row fails
    (OOM / error) and another works (fits / works / ok)."""
    lib: str | None = None
    good = bad = None
    for raw in text.splitlines():
        # from the first "|": a rank / logger prefix or a quote marker before the row
        row = raw[raw.find("|") :].strip() if raw.count("|") >= 2 else ""
        cells = [c.strip().strip("*`").strip() for c in row.strip("|").split("|")]
        if len(cells) < 2:
            continue
        if lib is None and (m := _TABLE_LIB_RE.match(cells[0])):
            lib = (m.group(1) or "").lower()
            continue
        ver = _TABLE_VER_RE.match(cells[0]) if lib is not None else None
        if ver is None:
            continue
        rest = " ".join(cells[1:])
        line = " ".join(raw.replace("*", "").replace("`", "").split())[:200]
        if _TABLE_BAD_RE.search(rest) and bad is None:
            bad = (ver.group(1), line)
        elif _TABLE_GOOD_RE.search(rest) and good is None:
            good = (ver.group(1), line)
    if lib is None or good is None or bad is None or good[0] == bad[0]:
        return None
    return (lib, good[0], bad[0], f"{good[1][:100]} ... {bad[1][:100]}")


def _release(m: re.Match[str]) -> tuple[str, str] | None:
    groups = m.groups()
    # each alternative has (py, lib, version): the first filled triple; "pytorch" is torch
    for i in range(0, len(groups), 3):
        _, lib, ver = groups[i : i + 3]
        if ver:
            name = (lib or "").lower().replace(" ", "-").replace("_", "-")
            return ("lightning" if name.startswith("pytorch-") else name), ver
    return None


def scan_versions(text: str) -> dict:
    """`release_regression` ((library, good, bad, line)): the paste says one release works and
    another fails or takes more memory (library "" when not named), in prose or in a table
    comparing releases; `version_said`
    ((library, version), the first stated); `versions_said` ({library: version}, each library's
    first); `cudnn_said` (cuDNN or a convolution named);
    `together_prose` (lines saying features fail only when combined)."""
    facts: dict = {}
    good: tuple[str, str, str] | None = None
    bad: tuple[str, str, str] | None = None
    for raw in text.splitlines():
        line = " ".join(raw.replace("*", "").replace("`", "").split())
        if not line or _CODE_RE.match(line) or 'File "' in line:
            continue
        for m in [*_GOOD_RE.finditer(line), *_DOWNGRADE_RE.finditer(line)]:
            rel = _release(m)
            if rel and good is None:
                good = (*rel, line[:200])
        if _FAILURE_WORDS_RE.search(line) and good is None and (m := _FROM_TO_RE.search(line)):
            lib = (m.group(2) or "").lower().replace(" ", "-").replace("_", "-")
            good, bad = (lib, m.group(3), line[:200]), (lib, m.group(4), line[:200])
        if _FAILURE_WORDS_RE.search(line):
            found = [*_BAD_RE.finditer(line), *_UPGRADE_RE.finditer(line)]
            for m in [*found, *_BAD_AFTER_RE.finditer(line)]:
                rel = _release(m)
                if rel and bad is None and (good is None or rel[1] != good[1]):
                    bad = (*rel, line[:200])
            if bad is None and (m := _DEV_BRANCH_RE.search(line)):
                bad = ("", m.group(1).lower(), line[:200])
        for v in _VERSION_SAID_RE.finditer(line):
            if _TIMELINE_RE.search(line[: v.start()]):
                continue  # "Starting in PyTorch 2.9, ... will raise": a warning's timeline
            said = (v.group(1).lower(), v.group(2).rstrip("."))
            facts.setdefault("version_said", said)  # the first one, as before
            facts.setdefault("versions_said", {}).setdefault(*said)  # each library's first
        if _CUDNN_RE.search(line):
            facts["cudnn_said"] = True
        if _TOGETHER_RE.search(line):
            facts.setdefault("together_prose", []).append(line[:200])
    if good and bad and good[1] != bad[1]:
        lib = good[0] or bad[0]
        facts["release_regression"] = (
            lib,
            good[1],
            bad[1],
            good[2] if good[2] == bad[2] else f"{good[2][:100]} ... {bad[2][:100]}",
        )
    elif (table := _table_regression(text)) is not None:
        facts["release_regression"] = table
    return facts
