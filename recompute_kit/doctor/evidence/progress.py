"""Training-progress and memory lines of a log: Megatron-LM / Megatron-Bridge / NeMo iteration
lines, tqdm bars, per-rank memory reports, memory_summary() rows, scripts' own allocated /
reserved / peak lines, Megatron's argument dump and the allocator's environment.

`ProgressLines` is the part of the log parser (`logs._LogParser`) that reads these records; the
parser's state machine decides which line goes where.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ...sources.arg_dump import arg_line
from ...sources.values import _assign
from .schema import Iteration, MemoryReport
from .text import _compact, _float, _int, parse_size

if TYPE_CHECKING:
    from .schema import Evidence

_MEGATRON_ITER_RE = re.compile(r"(?:^|\s)iteration\s*(\d+)\s*/\s*(\d+)\s*\|")
# The fields read from a Megatron iteration line, in the order Megatron prints them.
_MEGATRON_LABELS = (
    "elapsed time per iteration (ms):",
    "throughput per GPU (TFLOP/s/GPU):",
    "| learning rate:",
    "global batch size:",
    "| lm loss:",
    "| grad norm:",
)
_MEGATRON_FAST_RE = re.compile(
    r"iteration\s+(\d+)\s*/\s*(\d+) \|"
    + "".join(
        rf"(?:.*?{re.escape(label.lstrip('| '))}([^|]*)(?:\||$))?" for label in _MEGATRON_LABELS
    )
)
_NEMO_ITER_RE = re.compile(r"epoch\s*(\d+),\s*iteration\s*(\d+)\s*/\s*(\d+)")
_NAN_ITERS_RE = re.compile(r"numberofnaniterations:\d")
_STEP_TIME_RE = re.compile(
    r"Step\s?Time\s?:\s?([\d.]+)\s?s\s?GPU\s?utilization:\s?([\d.]+)\s?(?:MODEL_)?TFLOP/s/GPU"
)
_MB_PROGRESS_RE = re.compile(r"Iteration:\s*(\d+)\s+Job throughput:\s*([\d.]+)\s*MODEL_TFLOP")
_TQDM_RE = re.compile(r"\|\s*(\d+)/(\d+)\s*\[[^\]]*?,\s*([\d.]+)\s*(s/it|it/s)(?:,\s*([^\]]*))?\]")
# nvidia-smi's process rows: "|    0   N/A  N/A   2695172      C   ./train.par   26167MiB |";
# drivers before MIG (< 450) print no GI / CI columns: "|  0   32317   C   python   7773MiB |"
_SMI_PROCESS_RE = re.compile(
    r"^\|\s+(\d+)(?:\s+(?:N/A|\d+)\s+(?:N/A|\d+))?\s+(\d+)\s+[CGM+]+\s+(.*?)\s+(\d+)MiB\s*\|$"
)
# Per-step peaks printed by training scripts: "step=1 TRAIN alloc=10.33 peak=73.94 GiB",
# DeepSpeed-Chat's "MaxMemAllocated=44.23GB".
_STEP_PEAK_RE = re.compile(
    r"(?:\balloc(?:ated)?\s*[=:]\s*([\d.]+)\s*([GM]i?B)?\s*,?\s*)?"
    r"\b(?:peak|MaxMemAllocated)\s*[=:]\s*([\d.]+)\s*([GM]i?B)",
    re.I,
)
# torch.cuda.memory_summary() rows: "| Allocated memory      |  14356 MiB |  23806 MiB | ..."
_SUMMARY_ROW_RE = re.compile(
    r"^\|\s*(Allocated memory|GPU reserved memory|Non-releasable memory)\s*\|"
    r"\s*([\d.]+)\s*([KMG]i?B|B)\s*\|\s*([\d.]+)\s*([KMG]i?B|B)\s*\|"
)
_SUMMARY_FIELDS = {
    "Allocated memory": ("allocated_bytes", "max_allocated_bytes"),
    "GPU reserved memory": ("reserved_bytes", "max_reserved_bytes"),
    "Non-releasable memory": ("inactive_bytes", "max_inactive_bytes"),
}
# Scripts' own lines: "Allocated (real tensor memory): 60.93 GB  Reserved (cached by PyTorch):
# 126.97 GB", "memory_allocated: 3.2GB, memory_reserved: 9.1GB".
_ALLOC_RESERVED_RE = re.compile(
    r"allocated[^:=\d]{0,40}[:=]\s*([\d.]+)\s*([KMG]i?B)\b.{0,80}?"
    r"reserved[^:=\d]{0,40}[:=]\s*([\d.]+)\s*([KMG]i?B)\b",
    re.I,
)
_STEP_RE = re.compile(r"\bstep[\s=:]*(\d+)", re.I)
_MEM_REPORT_RE = re.compile(r"\[Rank\s*(\d+)\]\s*(.*?)\s*memory\s*\((MB|GB)\)")
_MEM_COMPLETE_RE = re.compile(r"maxreserved:[\d.]+$|allocated-count:\d+")
_AFTER_ITERS_RE = re.compile(r"after\s*(\d+)\s*iterations")
_THEORY_RE = re.compile(
    r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB"
    r"(?:, activation=([\d.]+) MB)?(?:, total=([\d.]+) MB)?"
)
_ENV_RE = re.compile(
    r"(PYTORCH_(?:CUDA_|HIP_)?ALLOC_CONF)['\"]?\]?\s*(?:=|:\s)\s*['\"]?([A-Za-z_][\w:.,\[\]|=-]*)"
)


def _field(text: str, label: str) -> str | None:
    """The value after `label` up to the next `|` (None if the label is absent)."""
    at = text.find(label)
    if at < 0:
        return None
    start = at + len(label)
    end = text.find("|", start)
    return text[start:end] if end >= 0 else text[start:]


def _pipe_fields(text: str) -> dict[str, str]:
    """`a: 1 | b c: 2` -> {"a": "1", "bc": "2"}: keys without whitespace, lower-case."""
    out: dict[str, str] = {}
    for part in text.split("|")[1:]:
        key, sep, value = part.partition(":")
        if sep:
            out["".join(key.split()).lower()] = value.strip()
    return out


class ProgressLines:
    """Readers of progress and memory records, mixed into the log parser, which owns the
    evidence (`ev`), the parser state below and the bounded adders."""

    ev: Evidence
    _step: Iteration | None  # Megatron-Bridge "Step Time" awaiting its iteration line
    _in_args: bool
    _nemo_memory: tuple | None

    def _add_iteration(self, it: Iteration) -> None:
        raise NotImplementedError

    def _add_memory(self, report: MemoryReport) -> None:
        raise NotImplementedError

    def _summary_row(self, name: str, cur: str, cur_unit: str, peak: str, peak_unit: str) -> None:
        """One row of torch.cuda.memory_summary(); rows of one table fill one report."""
        report = self.ev.memory[-1] if self.ev.memory else None
        if report is None or report.source != "memory_summary" or name == "Allocated memory":
            report = MemoryReport(source="memory_summary", label="torch.cuda.memory_summary()")
            self._add_memory(report)
        now, most = _SUMMARY_FIELDS[name]
        setattr(report, now, parse_size(cur, cur_unit))
        setattr(report, most, parse_size(peak, peak_unit))

    def _alloc_reserved(self, text: str) -> bool:
        m = _ALLOC_RESERVED_RE.search(text)
        if m is None:
            return False
        a, au, r, ru = m.groups()
        self._add_memory(
            MemoryReport(
                allocated_bytes=parse_size(a, au),
                reserved_bytes=parse_size(r, ru),
                label=text.strip()[:120],
                source="allocated-reserved",
            )
        )
        return True

    def _step_peak(self, text: str) -> bool:
        m = _STEP_PEAK_RE.search(text)
        if m is None:
            return False
        alloc, alloc_unit, peak, unit = m.groups()
        step = _STEP_RE.search(text)
        self._add_memory(
            MemoryReport(
                allocated_bytes=parse_size(alloc, alloc_unit or unit) if alloc else None,
                max_allocated_bytes=parse_size(peak, unit),
                label=text.strip()[:120],
                iteration=int(step.group(1)) if step else None,
                source="step-peak",
            )
        )
        return True

    def _iteration(self, text: str, wrapped: bool = False) -> None:
        """A Megatron-LM/Bridge iteration line or a NeMo 2 progress line. Single lines are read
        with plain substring searches (the fast path); wrapped ones without whitespace."""
        src = _compact(text) if wrapped else text

        def get(label: str) -> str | None:
            return _field(src, _compact(label) if wrapped else label)

        nemo = _NEMO_ITER_RE.search(text.split("|", 1)[0]) if "epoch" in text else None
        if nemo is not None:
            it = Iteration(int(nemo.group(2)), source="nemo", total_iterations=int(nemo.group(3)))
            seconds = _float(get("| train_step_timing in s:"))
            it.elapsed_ms = seconds * 1000.0 if seconds is not None else None
            it.tflops_per_gpu = _float(get("| TFLOPS_per_GPU:"))
            it.loss = _float(get("| reduced_train_loss:") or get("| train_loss:"))
            it.learning_rate = _float(get("| lr:"))
            it.global_batch_size = _int(get("| global_batch_size:"))
            it.max_memory_allocated_bytes = _int(get("| max_memory_allocated:"))
            it.max_memory_reserved_bytes = _int(get("| max_memory_reserved:"))
            self._nemo_memory_report(it)
            self._add_iteration(it)
            return
        m = None if wrapped else _MEGATRON_FAST_RE.search(text)
        if m is not None:  # the fast path: one regex for the usual field order
            values = list(m.groups())
            if None in values:
                for i, label in enumerate(_MEGATRON_LABELS, start=2):
                    if values[i] is None and label in text:  # fields in another order
                        values[i] = get(label)
        else:
            m = _MEGATRON_ITER_RE.search(text)
            if m is None:
                return
            values = [m.group(1), m.group(2), *(get(label) for label in _MEGATRON_LABELS)]
        it = Iteration(int(values[0]), source="megatron", total_iterations=int(values[1]))
        it.elapsed_ms = _float(values[2])
        it.tflops_per_gpu = _float(values[3])
        it.learning_rate = _float(values[4])
        it.global_batch_size = _int(values[5])
        it.loss = _float(values[6] if values[6] is not None else get("| loss:"))
        it.grad_norm = _float(values[7])
        step = self._step
        if step is not None:
            self._step = None
            # Megatron-Bridge prints "Step Time" just before the iteration line it belongs to.
            close = (
                it.elapsed_ms is not None
                and step.elapsed_ms is not None
                and abs(step.elapsed_ms - it.elapsed_ms) <= 0.01 * it.elapsed_ms + 10.0
            )
            if close and it.tflops_per_gpu is None:
                it.tflops_per_gpu = step.tflops_per_gpu
                it.source = "megatron-bridge"
            else:
                self._add_iteration(step)
        self._add_iteration(it)

    def _nemo_memory_report(self, it: Iteration) -> None:
        """NeMo 2 prints peak memory on every progress line: report it when it changes."""
        key = (it.max_memory_allocated_bytes, it.max_memory_reserved_bytes)
        if key == (None, None) or key == self._nemo_memory:
            return
        self._nemo_memory = key
        self._add_memory(
            MemoryReport(
                max_allocated_bytes=it.max_memory_allocated_bytes,
                max_reserved_bytes=it.max_memory_reserved_bytes,
                label=f"(iteration {it.iteration})",
                iteration=it.iteration,
                source="nemo",
            )
        )

    def _step_time(self, text: str) -> None:
        m = _STEP_TIME_RE.search(text)
        if m is None:
            return
        if self._step is not None:
            self._add_iteration(self._step)
        self._step = Iteration(
            elapsed_ms=float(m.group(1)) * 1000.0,
            tflops_per_gpu=float(m.group(2)),
            source="megatron-bridge",
        )

    def _tqdm(self, text: str) -> None:
        """NeMo 1 / Lightning progress bars: `795/77225 [9:07:58<..., 41.36s/it, loss=3.1]`."""
        m = _TQDM_RE.search(text)
        if m is None:
            return
        n, total, rate, unit, rest = m.groups()
        value = float(rate)
        elapsed = value * 1000.0 if unit == "s/it" else (1000.0 / value if value else None)
        it = Iteration(int(n), elapsed, source="nemo", total_iterations=int(total))
        metrics = dict(
            part.strip().split("=", 1) for part in (rest or "").split(",") if "=" in part
        )
        it.loss = _float(metrics.get("reduced_train_loss") or metrics.get("loss"))
        self._add_iteration(it)

    def _memory_report(self, text: str, rank: int | None) -> None:
        m = _MEM_REPORT_RE.search(text)
        if m is None:
            return
        unit = 1 << 20 if m.group(3) == "MB" else 10**9  # Megatron divides by 1024*1024
        label = m.group(2).strip()
        after = _AFTER_ITERS_RE.search(label)
        report = MemoryReport(
            rank=int(m.group(1)),
            label=label,
            iteration=int(after.group(1)) if after else None,
            source="megatron" if unit == 1 << 20 else "megatron-bridge",
        )
        targets = {
            "allocated": "allocated_bytes",
            "maxallocated": "max_allocated_bytes",
            "reserved": "reserved_bytes",
            "maxreserved": "max_reserved_bytes",
            "active": "active_bytes",
            "maxactive": "max_active_bytes",
            "inactive": "inactive_bytes",
            "maxinactive": "max_inactive_bytes",
            "totaldevicememoryused": "device_used_bytes",
        }
        for key, value in _pipe_fields(text[m.end() :]).items():
            scale = unit
            if key.startswith("mem-"):  # Megatron-Bridge: mem-max-allocated-gigabytes
                key = key[4:]
                if key.endswith("-bytes"):
                    scale = 1
                key = key.removesuffix("-gigabytes").removesuffix("-bytes")
            key = key.replace("-", "")
            number = _float(value)
            if number is None:
                continue
            if key in targets:
                setattr(report, targets[key], round(number * scale))
            elif key in ("allocretires", "allocretries"):
                report.alloc_retries = int(number)
        self._add_memory(report)

    def _arg_line(self, text: str) -> bool:
        """A line of Megatron's argument dump: `  hidden_size ........ 5120`."""
        pair = arg_line(text, self._in_args)
        if pair is None:
            return False
        key, converted = pair
        _assign(self.ev.config, key, converted)
        # kept apart too: a config given next to the log overrides ev.config, and a rule
        # compares what was asked for with what Megatron printed
        _assign(self.ev.facts.setdefault("args_dump", {}), key, converted)
        return True

    def _env(self, text: str) -> None:
        for m in _ENV_RE.finditer(text):
            if "try setting" in text[max(0, m.start() - 14) : m.start()]:
                continue  # the OOM message's advice, not a setting
            self.ev.env[m.group(1)] = m.group(2).rstrip(".,;")
