"""Hard-wrapped pastes put back together before any parser reads them.

A terminal copy cuts every long line at its width (80, 100, 120 columns), mid-word; a mail
client or an editor re-flows at spaces. Either way one exception message, warning or traceback
frame lands on several lines, and a parser that reads line by line sees half a message. The
width shows in the paste itself: no line is longer than it, and several lines reach it (a hard
wrap: exactly; a re-flow: the next line's first word would not have fitted). Lines are joined
only where the paste shows such a width, never across a new record (a stamped line, a
traceback header or frame, an exception line) nor into a more indented line (the source line
under a frame), so a paste that was not wrapped comes back unchanged.
"""

from __future__ import annotations

import re
from itertools import pairwise

from ...sources.text import _strip_prefixes
from .logs import _RECORD_RE, _starts_record
from .oom import looks_like_oom
from .text import _EXC_SEARCH_RE

_MIN_WIDTH, _MAX_WIDTH = 60, 200
_MAX_FLOW_WIDTH = 100  # mail clients and editors re-flow at 72-100 columns
# Lines that begin something of their own: a table row, a list item, a flag, a YAML key,
# a frame, a "..." elision, a code fence.
_OWN_LINE_RE = re.compile(
    r"^\s*(?:\||[-*+] |--?\w|[a-z_][\w.-]*:\s|File \"|\.\.\.|```|Traceback |\[|\{|\}|#"
    r"|\S+\.py[:\"])"
)
# A traceback frame line that is complete: nothing of it was cut.
_WHOLE_FRAME_RE = re.compile(r'^\s*File "[^"]+", line \d+, in \S+$')


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _may_continue(line: str, previous: str, mode: str) -> bool:
    if not line.strip() or _boxed(previous) or _boxed(line):
        return False
    if _indent(line) > _indent(previous):
        return False  # the source line under a frame, a nested item
    if mode == "hard":  # a cut at the exact width: anything may follow, but not a new record
        if _indent(line) and _indent(line) == _indent(previous):
            return False  # the next item of an indented list, not the rest of a cut line
        text, _, stamp, _ = _strip_prefixes(line)
        head = text.strip()
        # a new record begins at the line's start; the rest of a cut line may name an
        # exception further on ("...test_gradien" / "t_checkpointing - RuntimeError: ...")
        return not stamp and not (
            _RECORD_RE.match(head) or _EXC_SEARCH_RE.match(head) or looks_like_oom(head[:40])
        )
    if _WHOLE_FRAME_RE.match(previous):
        return False
    text, _, stamp, _ = _strip_prefixes(line)
    if stamp or text != line or _OWN_LINE_RE.match(line):
        return False  # a prefix (rank, time, quote) marks a line of its own
    return not _starts_record(text.strip(), False)


def _boxed(line: str) -> bool:
    """A row of a table or a box drawing (nvidia-smi, torch.cuda.memory_summary): such rows
    share one width without being wrapped."""
    s = _strip_prefixes(line)[0].strip()
    return s[:1] in "|+=" and s[-1:] in "|+="


def _row_cut(previous: str, line: str) -> bool:
    """A Markdown table row cut in two: the first piece opens with '|' but does not close,
    the rest closes without opening."""
    p, s = previous.strip(), line.strip()
    return p[:1] == "|" and p[-1:] != "|" and p.count("|") >= 2 and s[-1:] == "|" and s[:1] != "|"


def _width(lines: list[str]) -> tuple[int, str] | None:
    """(width, "hard" | "flow") when the paste looks wrapped, else None."""
    lengths = [len(x) for x in lines if x.strip() and not _boxed(x)]
    if len(lengths) < 2:
        return None
    width = max(lengths)
    if not _MIN_WIDTH <= width <= _MAX_WIDTH:
        return None
    at_width = sum(n == width for n in lengths)
    near = sum(width - 15 <= n < width for n in lengths)
    # a re-flow spreads its line ends below the width, a cut puts them all on it; a cut
    # before a space leaves it at the start of the next line, which a re-flow never does
    spaced = any(
        len(cur) == width and (cur.endswith(" ") or re.match(r" \S", nxt))
        for cur, nxt in pairwise(lines)
    )
    if at_width >= 2 and ((at_width > near and (at_width >= 3 or spaced)) or near == 0):
        return width, "hard"
    if width > _MAX_FLOW_WIDTH:
        return None
    full = 0
    for cur, nxt in pairwise(lines):
        words = nxt.split()
        if words and len(cur) >= width - 25 and len(cur) + 1 + len(words[0]) > width:
            full += 1
    return (width, "flow") if full >= 2 else None


def unwrap(text: str) -> str:
    """`text` with the lines of a hard-wrapped or re-flowed paste joined back (unchanged when
    the paste shows no wrap width)."""
    lines = text.splitlines()
    found = _width(lines)
    if found is None:
        if not any(_row_cut(a, b) for a, b in pairwise(lines)):
            return text
        found = (0, "rows")
    width, mode = found
    out: list[str] = []
    joined = False
    prev_raw = ""
    for line in lines:
        prev = out[-1] if out else None
        if prev is not None and _row_cut(prev_raw, line):
            out[-1] = prev + line.strip()
            joined = True
            prev_raw = line
            continue
        cut = prev is not None and (
            len(prev_raw) == width
            if mode == "hard"
            else mode == "flow" and len(prev_raw) + 1 + len((line.split() or [""])[0]) > width
        )
        if cut and prev is not None and _may_continue(line, prev_raw, mode):
            out[-1] = prev + (line if mode == "hard" else " " + line.strip())
            joined = True
        else:
            out.append(line)
        prev_raw = line
    return "\n".join(out) + ("\n" if text.endswith("\n") else "") if joined else text
