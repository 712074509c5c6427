"""Training logs: Megatron-LM, Megatron-Bridge, NeMo, tqdm; a line-by-line state machine that
streams files of any size.
"""

from __future__ import annotations

import gzip
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ...sources.arg_dump import _ARG_RE, args_header, world_sizes
from ...sources.text import _strip_prefixes
from ...sources.values import _finalize_config
from .oom import (
    _OOM_TAILS,
    _oom_data_complete,
    _oom_event,
    _oom_fully_complete,
    looks_like_oom,
    oom_fields_go_on,
)
from .progress import (
    _MB_PROGRESS_RE,
    _MEGATRON_ITER_RE,
    _MEM_COMPLETE_RE,
    _NAN_ITERS_RE,
    _NEMO_ITER_RE,
    _SMI_PROCESS_RE,
    _SUMMARY_ROW_RE,
    _THEORY_RE,
    ProgressLines,
)
from .schema import (
    MAX_ERROR_EVENTS,
    MAX_ITERATIONS,
    MAX_LINE_CHARS,
    MAX_MEMORY_REPORTS,
    MAX_NOTES,
    MAX_OOM_EVENTS,
    ErrorEvent,
    Evidence,
    EvidenceError,
    Iteration,
    MemoryReport,
    OOMEvent,
)
from .text import _EXC_SEARCH_RE, _compact, _iter_file_lines
from .tracebacks import (
    _BARE_ERRORS_RE,
    _BARE_WARNINGS,
    _CHAIN_CAUSE,
    _CHAIN_CONTEXT,
    _EXC_LINE_RE,
    _FRAME_RE,
    _MAX_DETAIL_LINES,
    _MAX_FRAMES,
    _MEGATRON_WARN_RE,
    _WARN_RE,
    _Traceback,
)

# (No lazy group before a trailing \s*$ in these patterns: that backtracks quadratically.)
# vLLM / SGLang logger lines: "WARNING 07-29 15:39:27 [env_override.py:17] message".
_LOGGER_WARN_RE = re.compile(
    r"^(WARNING|WARN)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[([\w./-]+):(\d+)\]\s+(.*)$"
)
_RECORD_RE = re.compile(
    r"^(?:Traceback \(most recent|\s*File \"|During handling of the above|The above exception"
    r"|iteration\s+\d+\s*/|Training epoch|\[Rank\s*\d+\]|Step Time|-{3,} |WARNING:)"
)

# Lines with these are read by a parser of their own (never a continuation of another record).
_OTHER_RECORD_KEYS = (
    "ALLOC_CONF",
    "Theoretical memory",
    "using world size",
    "Job throughput",
    "s/it,",
    "it/s,",
)


def _starts_record(text: str, stamped: bool) -> bool:
    """Whether a line begins a new log record (so it cannot continue a wrapped one)."""
    if stamped or _RECORD_RE.match(text):
        return True
    # (A wrapped line "memory. Tried to allocate ..." continues a message: only the heads count.)
    if ("out of memory" in text or "OutOfMemory" in text) and looks_like_oom(text):
        return True
    if ("Error" in text or "Exception" in text) and _EXC_SEARCH_RE.search(text):
        return True
    if " .." in text and (m := _ARG_RE.match(text)) is not None and len(m.group(3)) >= 3:
        return True  # a line of an argument dump
    if any(key in text for key in _OTHER_RECORD_KEYS):
        return True
    return "Warning: " in text and _WARN_RE.match(text) is not None


class _Pending:
    """A record that may continue on the next lines (hard-wrapped pastes)."""

    __slots__ = ("context", "error", "kind", "line_number", "lines", "parts", "phase", "rank")

    def __init__(self, kind: str, text: str, rank: int | None, line_number: int) -> None:
        self.kind = kind  # oom | iteration | memory
        self.parts = [text]
        self.rank = rank
        self.phase = "data"  # oom only: data -> tail (the advice after the fields)
        self.error: ErrorEvent | None = None  # the exception event that printed the OOM
        self.line_number = line_number
        self.lines = 1
        self.context: list[str] = []

    def add(self, text: str) -> None:
        # Joined with nothing: a wrap at a space keeps the space on one side, a wrap inside a
        # word (or a stripped space) must not add one. The field patterns accept a missing
        # space between words.
        self.parts.append(text)
        self.lines += 1

    @property
    def text(self) -> str:
        return self.parts[0] if len(self.parts) == 1 else _join_wrapped(self.parts)


def _join_wrapped(parts: list[str]) -> str:
    """Rejoin the lines of a hard-wrapped paste. Where neither side has a space, one is put
    back after punctuation and between a word and a number (`MiB.` + `GPU`, `memory` +
    `14.12`); elsewhere the wrap is taken to be inside a word or number and nothing is added."""
    out = parts[0]
    for part in parts[1:]:
        if out and part and not out[-1].isspace() and not part[0].isspace():
            last, first = out[-1], part[0]
            if (
                last in ",;:!?)"
                or (last == "." and not first.isdigit())
                or (last.isalpha() and first.isdigit())
            ):
                out += " "
        out += part
    return out


class _LogParser(ProgressLines):
    """A line-by-line state machine over a training log; `feed` each line, then `finish`."""

    def __init__(self) -> None:
        self.ev = Evidence()
        self._pending: _Pending | None = None
        self._tracebacks: dict[int | None, _Traceback] = {}
        self._chain: dict[int | None, str] = {}
        self._errors: dict[tuple[Any, ...], ErrorEvent] = {}
        self._step: Iteration | None = None  # Megatron-Bridge "Step Time" awaiting its line
        self._in_args = False
        self._line_number = 0
        self._nemo_memory: tuple[Any, ...] | None = None
        self._dropped: dict[str, int] = {}
        self._recent: deque[str] = deque(maxlen=8)  # lines no parser read, for context
        self._last_stamp: dict[int | None, str] = {}  # per rank: the previous line's stamp
        # the raw lines of the first and last iteration: their stamps are read at the end
        # (not per line: a 100 MB log holds hundreds of thousands)
        self._raw = ""
        self._iteration_lines: list[str] = []

    # -- entry points ------------------------------------------------------------------------

    def feed(self, raw: str) -> None:
        self._line_number += 1
        if len(raw) > MAX_LINE_CHARS:
            raw = raw[:MAX_LINE_CHARS]
        self._raw = raw
        if (
            "nan iterations:" in raw
            and self._pending is None
            and not self._tracebacks
            and "\x1b" not in raw
            and "elapsed time per iteration" in raw
        ):
            self._iteration(raw)  # fast path: a complete Megatron iteration line
            return
        text, rank, stamp, level = _strip_prefixes(raw)
        # A launcher or logger that stamps every line of one write (a traceback, a wrapped
        # message) gives them all the same stamp: only a new stamp starts a new record.
        stamped = bool(stamp) and stamp != self._last_stamp.get(rank)
        self._last_stamp[rank] = stamp
        pending = self._pending
        if pending is not None:
            if self._continues(pending, text, rank, stamped):
                return
            self._flush_pending()
        self._dispatch(text, rank, stamped, level)

    def finish(self) -> Evidence:
        if self._pending is not None:
            self._flush_pending()
        for rank in list(self._tracebacks):
            tb = self._tracebacks[rank]
            if tb.event is None and tb.state == "frames" and tb.frames:
                # the paste ends inside the frames: keep them (the exception line is cut)
                tb.event = ErrorEvent(type="", message="(traceback without exception line)")
                tb.event.rank = rank
            self._end_traceback(rank)
        if self._step is not None:
            self._add_iteration(self._step)
            self._step = None
        self.ev.errors = list(self._errors.values())
        self._drop_mentions()
        if self.ev.config:
            self.ev.config = _finalize_config(self.ev.config)
        for what, n in self._dropped.items():
            self._note(f"{n} further {what} were not kept (limit reached)")
        stamps = zip(("first", "last"), self._iteration_lines, strict=False)
        self.ev.iteration_stamps = {
            k: stamp for k, line in stamps if (stamp := _strip_prefixes(line)[2])
        }
        return self.ev

    def _drop_mentions(self) -> None:
        """A sentence that names the error ("I get a CUDA out of memory error") beside the
        message itself is not a second, truncated message: without a field, a rank or an
        exception type of its own, it goes when another message has its fields."""
        ooms = self.ev.oom
        if not any(e.requested_bytes or e.total_bytes for e in ooms):
            return
        mentions = [e for e in ooms if _a_mention(e)]
        for e in mentions:
            ooms.remove(e)
            note = f"line {e.line_number}: the out-of-memory message is truncated"
            if note in self.ev.notes:
                self.ev.notes.remove(note)

    # -- helpers -----------------------------------------------------------------------------

    def _note(self, message: str) -> None:
        if len(self.ev.notes) < MAX_NOTES:
            self.ev.notes.append(message)

    def _drop(self, what: str) -> None:
        self._dropped[what] = self._dropped.get(what, 0) + 1

    def _add_error(self, event: ErrorEvent) -> None:
        key = (event.kind, event.type, event.message[:300], tuple(event.frames), event.chained)
        seen = self._errors.get(key)
        if seen is not None:
            seen.count += 1
        elif len(self._errors) < MAX_ERROR_EVENTS:
            self._errors[key] = event
        else:
            self._drop("distinct errors/warnings")

    def _add_iteration(self, it: Iteration) -> None:
        lines = self._iteration_lines
        if len(lines) < 2:
            lines.append(self._raw)
        else:
            lines[1] = self._raw
        if len(self.ev.iterations) < MAX_ITERATIONS:
            self.ev.iterations.append(it)
        else:
            self._drop("iteration lines")

    def _add_memory(self, report: MemoryReport) -> None:
        if len(self.ev.memory) < MAX_MEMORY_REPORTS:
            self.ev.memory.append(report)
        else:
            self._drop("memory reports")

    # -- wrapped records ---------------------------------------------------------------------

    def _continues(self, p: _Pending, text: str, rank: int | None, stamped: bool) -> bool:
        """Append `text` to the pending record if it continues it; flush when complete."""
        if rank is not None and rank != p.rank:
            return False
        if not text.strip() or p.lines >= 40 or len(p.parts[-1]) > MAX_LINE_CHARS // 2:
            return False
        if p.kind == "oom" and p.phase == "tail":
            piece = _compact(text)
            if not any(piece in tail for tail in _OOM_TAILS):
                return False
        elif p.kind == "oom" and oom_fields_go_on(text):
            pass  # the message's own fields (and its ALLOC_CONF advice) after a hard wrap
        elif _starts_record(text, stamped):
            return False
        elif (
            p.kind == "memory"
            and _MEM_COMPLETE_RE.search(_compact(p.text))
            and not re.fullmatch(r"\s*[\d.]+\s*(?:\|.*)?", text)
        ):
            return False  # complete already; only a number cut at the wrap may follow
        p.add(text)
        self._check_pending(p)
        return True

    def _check_pending(self, p: _Pending) -> None:
        """Flush the pending record when it is complete; move an OOM to its tail phase."""
        compact = _compact(p.text)
        if p.kind == "oom":
            if _oom_fully_complete(compact):
                self._flush_pending()
            elif p.phase == "data" and _oom_data_complete(compact):
                p.phase = "tail"
        elif p.kind == "iteration":
            if _NAN_ITERS_RE.search(compact):
                self._flush_pending()
        elif p.kind == "memory" and "allocated-count:" in compact:
            self._flush_pending()

    def _flush_pending(self) -> None:
        p = self._pending
        if p is None:
            return
        self._pending = None
        text = p.text
        if p.kind == "oom":
            event = _oom_event(text, p.rank, p.line_number)
            if event is not None:
                event.context = p.context
                if len(self.ev.oom) < MAX_OOM_EVENTS:
                    self.ev.oom.append(event)
                else:
                    self._drop("OOM messages")
                if event.truncated:
                    self._note(f"line {p.line_number}: the out-of-memory message is truncated")
            if p.error is not None:
                head = p.error.type + ":"
                at = text.find(head)
                p.error.message = (text[at + len(head) :] if at >= 0 else text).strip()[:2000]
                self._add_error(p.error)
        elif p.kind == "iteration":
            self._iteration(text, wrapped=p.lines > 1)
        elif p.kind == "memory":
            self._memory_report(text, p.rank)

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch(self, text: str, rank: int | None, stamped: bool, level: str) -> None:
        if not text or text.isspace():
            tb = self._tracebacks.get(rank)
            if tb is not None and tb.state == "message":
                self._end_traceback(rank)
            return
        tb = self._tracebacks.get(rank)
        if tb is not None and self._traceback_line(tb, text, rank, stamped):
            return
        if "elapsed time per iteration" in text and "nan iterations:" in text:
            self._iteration(text)  # the most common line of a Megatron log, complete
            return
        if "ALLOC_CONF" in text:
            self._env(text)
        if "Traceback (most recent call last)" in text:
            self._tracebacks[rank] = _Traceback(self._chain.pop(rank, ""))
            return
        if 'File "' in text and _FRAME_RE.match(text):
            # a pasted traceback without its header line
            tb = self._tracebacks[rank] = _Traceback(self._chain.pop(rank, ""))
            self._traceback_line(tb, text, rank, stamped)
            return
        if "above exception" in text:
            if _CHAIN_CAUSE in text:
                self._chain[rank] = "cause"
            elif _CHAIN_CONTEXT in text:
                self._chain[rank] = "context"
            return
        is_oom = looks_like_oom(text)
        if not is_oom and self._warning(text, rank, level):
            return  # a warning, even one that names an exception type
        error = None
        if "Error" in text or "Exception" in text or "Interrupt" in text:
            m = _EXC_SEARCH_RE.search(text)
            if m is not None:
                error = ErrorEvent(type=m.group(1), message=(m.group(2) or "").strip(), rank=rank)
                error.context = self._take_recent()
                if not is_oom:
                    tb = _Traceback(self._chain.pop(rank, ""))
                    tb.state, tb.event = "message", error
                    self._tracebacks[rank] = tb
                    return
        if is_oom:
            self._start_oom(text, rank, error)
            return
        if "iteration" in text:
            if "epoch" in text and _NEMO_ITER_RE.search(text):
                self._iteration(text)
                return
            if "|" in text and _MEGATRON_ITER_RE.search(text):
                self._start_record("iteration", text, rank)
                return
        if "memory (" in text and "[Rank" in text:
            self._start_record("memory", text, rank)
            return
        if "Step Time" in text:
            self._step_time(text)
            return
        if "Job throughput" in text:
            m = _MB_PROGRESS_RE.search(text)
            if m:
                self._add_iteration(
                    Iteration(int(m.group(1)), None, float(m.group(2)), source="megatron-bridge")
                )
            return
        if (" ." in text or self._in_args) and self._arg_line(text):
            return
        if "---" in text and (opens := args_header(text)) is not None:
            self._in_args = opens  # "arguments" ... "end of arguments"
            return
        if "/it" in text or "it/s" in text:
            self._tqdm(text)
            return
        if "using world size" in text:
            printed = self.ev.facts.setdefault("args_dump", {})
            for key, value in world_sizes(text).items():
                self.ev.config.setdefault(key, value)
                printed.setdefault(key, value)  # what Megatron ran with (collect.py)
            return
        if text.startswith("|") and " memory " in text:
            if (m := _SUMMARY_ROW_RE.match(text.strip())) is not None:
                self._summary_row(*m.groups())
            return
        if "eserved" in text and "llocated" in text and self._alloc_reserved(text):
            return
        if text.startswith("|") and "MiB" in text:
            if (m := _SMI_PROCESS_RE.match(text.strip())) is not None:
                gpu, pid, name, mib = m.groups()
                process = {
                    "gpu": int(gpu),
                    "pid": int(pid),
                    "name": name,
                    "used_bytes": int(mib) << 20,
                }
                self.ev.gpu_processes.append(process)
            return
        if ("peak" in text or "MaxMemAllocated" in text) and self._step_peak(text):
            return
        if _BARE_ERRORS_RE.search(text):
            # an error message pasted without its "XError: " head; the lines after it are
            # the rest of its message, as after an exception line
            message = text.strip()
            event = ErrorEvent(type="", message=message[:2000], rank=rank)
            event.context = self._take_recent()
            tb = _Traceback(self._chain.pop(rank, ""))
            tb.state, tb.event = "message", event
            self._tracebacks[rank] = tb
            return
        if "Theoretical memory" in text:
            m = _THEORY_RE.search(text)
            if m:
                for key, value in zip(
                    ("weight_and_optimizer", "activation", "total"), m.groups(), strict=True
                ):
                    if value is not None:
                        self.ev.theoretical_memory[f"{key}_bytes"] = int(float(value) * (1 << 20))
            return
        self._recent.append(text.strip()[:300])

    # -- tracebacks --------------------------------------------------------------------------

    def _traceback_line(self, tb: _Traceback, text: str, rank: int | None, stamped: bool) -> bool:
        """Feed a line to a rank's open traceback; False when the line is not part of it."""
        if tb.state == "frames":
            m = _FRAME_RE.match(text)
            if m is not None:
                file, line, func = m.groups()
                func = (func or "").strip()
                frame = f"{file}:{line}" + (f" in {func}" if func else "")
                tb.frames.append(frame)
                if len(tb.frames) > _MAX_FRAMES:
                    del tb.frames[0]
                tb.source_due = True
                tb.frame_indent = len(text) - len(text.lstrip())
                return True
            # an exception line is indented less than the frames (a pasted block indents all)
            outdented = len(text) - len(text.lstrip()) < tb.frame_indent
            if (
                text[:1].isspace() and not (outdented and _EXC_LINE_RE.match(text.strip()))
            ) or text.lstrip().startswith("[Previous line repeated"):
                if tb.source_due:
                    tb.source = text.strip()
                tb.source_due = False
                return True  # the source line under a frame, carets, repeats
            m = _EXC_LINE_RE.match(text.strip())
            if m is not None and stamped and not _EXC_SEARCH_RE.match(text.strip()):
                m = None  # a new log record ("INFO: ..."), not the exception line
            if m is None and tb.source_due and not stamped and not looks_like_oom(text):
                tb.source_due = False  # the frame's source line, its indentation lost
                tb.source = text.strip()
                return True
            if m is None:
                # Not an exception line: the traceback was cut, or its exception line lost
                # the "XError: " head. A plain line is taken as that message (and still read
                # on its own); a new record ends the traceback with what it had.
                headless = (
                    tb.frames
                    and not stamped
                    and text.lstrip()[:1].isalpha()  # words, not "...", "[cut]" or a fence
                    and not _starts_record(text, False)
                )
                message = text.strip() if headless else "(traceback without exception line)"
                # a failed `assert` statement raises AssertionError: the frame's line says so
                kind = "AssertionError" if headless and tb.source.startswith("assert ") else ""
                tb.event = ErrorEvent(type=kind, message=message[:2000], rank=rank)
                self._end_traceback(rank)
                return False
            event = ErrorEvent(
                type=m.group(1),
                message=(m.group(2) or "").strip(),
                frames=tb.frames,
                rank=rank,
                chained=tb.chained,
            )
            if looks_like_oom(text):
                del self._tracebacks[rank]
                self._start_oom(text, rank, event)
                return True
            tb.state, tb.event = "message", event
            return True
        # message state: further lines of a multi-line exception message
        if _starts_record(text, stamped) or len(tb.details) >= _MAX_DETAIL_LINES:
            self._end_traceback(rank)
            return False
        tb.details.append(text.rstrip())
        return True

    def _end_traceback(self, rank: int | None) -> None:
        tb = self._tracebacks.pop(rank, None)
        if tb is None or tb.event is None:
            return
        event = tb.event
        event.chained = event.chained or tb.chained
        if not event.frames and tb.frames:
            event.frames = tb.frames
        if tb.details:
            event.details = "\n".join(tb.details)[:2000]
        if event.type or event.frames or _BARE_ERRORS_RE.search(event.message):
            self._add_error(event)

    def _warning(self, text: str, rank: int | None, level: str) -> bool:
        """Record a Python warning, Megatron's `WARNING:` line or a NeMo `[NeMo W ...]` line;
        False when `text` is none of these."""
        bare = any(phrase in text for phrase in _BARE_WARNINGS)
        if "Warning" not in text and "WARNING" not in text and level != "W" and not bare:
            return False
        stripped = text.strip()
        m = _WARN_RE.match(stripped)
        if m is not None:
            file, line, kind, message = m.groups()
            frames = [f"{file}:{line}"] if file else []
            event = ErrorEvent(kind, message.strip(), frames, kind="warning", rank=rank)
        else:
            m = _MEGATRON_WARN_RE.match(stripped)
            logger = _LOGGER_WARN_RE.match(stripped) if m is None else None
            if m is not None:
                event = ErrorEvent("WARNING", m.group(1).strip(), kind="warning", rank=rank)
            elif logger is not None:
                _, file, line, message = logger.groups()
                event = ErrorEvent(
                    "WARNING", message.strip(), [f"{file}:{line}"], kind="warning", rank=rank
                )
            elif level == "W":
                event = ErrorEvent("WARNING", stripped, kind="warning", rank=rank)
            elif bare:
                event = ErrorEvent("Warning", stripped, kind="warning", rank=rank)
            else:
                return False
        self._add_error(event)
        return True

    # -- records -----------------------------------------------------------------------------

    def _take_recent(self) -> list[str]:
        lines = list(self._recent)
        self._recent.clear()
        return lines

    def _start_oom(self, text: str, rank: int | None, error: ErrorEvent | None) -> None:
        p = _Pending("oom", text, rank, self._line_number)
        p.context = error.context if error is not None and error.context else self._take_recent()
        p.error = error
        self._pending = p
        self._check_pending(p)

    def _start_record(self, kind: str, text: str, rank: int | None) -> None:
        if kind == "iteration" and "number of nan iterations:" in text:
            self._iteration(text)  # complete on one line: no need to wait for more
            return
        p = _Pending(kind, text, rank, self._line_number)
        self._pending = p
        compact = _compact(text)
        done = (
            _NAN_ITERS_RE.search(compact) if kind == "iteration" else "allocated-count:" in compact
        )
        if done:
            self._flush_pending()


def _split_lines(text: str) -> Iterator[str]:
    if not isinstance(text, str):
        return iter(())
    return iter(text.splitlines())


def parse_log(text: str) -> Evidence:
    """Parse a whole training log given as a string (see `parse_log_file` for files)."""
    parser = _LogParser()
    for line in _split_lines(text):
        parser.feed(line)
    return parser.finish()


def parse_log_file(path: str | Path) -> Evidence:
    """Parse a training log file, streamed in 256 KiB chunks (gzip if it ends in .gz).

    Raises EvidenceError (one line) if the file cannot be opened."""
    path = Path(path)
    parser = _LogParser()
    try:
        raw: IO[bytes] = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise EvidenceError(f"cannot read log '{path}': {exc.strerror or exc}") from None
    try:
        with raw:
            for line in _iter_file_lines(raw):
                parser.feed(line)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        parser.ev.notes.append(f"log '{path}' could not be read to the end: {exc}")
    evidence = parser.finish()
    evidence.sources.append(f"log:{path}")
    return evidence


def parse_oom(text: str) -> list[OOMEvent]:
    """Every out-of-memory message in `text`, hard-wrapped or not, with rank prefixes or not.

    Recognises all PyTorch generations (see `OOM_GENERATIONS`), ROCm's "HIP out of memory" and
    the `torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError` / `RuntimeError` prefixes.
    Truncated messages give events with the fields that were there (`truncated=True`)."""
    parser = _LogParser()
    for line in _split_lines(text):
        parser.feed(line)
    return parser.finish().oom


_EXCEPTION_HEAD_RE = re.compile(r"[\w.]*(?:Error|Exception)\b")


def _a_mention(e: OOMEvent) -> bool:
    """An OOM 'message' with nothing of a message: no size, no rank, no exception type."""
    sizes = (e.requested_bytes, e.total_bytes, e.free_bytes, e.allocated_bytes, e.process_bytes)
    return (
        all(v is None for v in sizes)
        and e.rank is None
        and not _EXCEPTION_HEAD_RE.match(e.line)
    )
