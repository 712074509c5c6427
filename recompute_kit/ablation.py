"""Run a grid of recompute settings and produce the table engineers know from NVIDIA's skill:
TFLOP/s per GPU, versus golden, peak memory, result (OOM / Perf regression / OK).

Each row is appended to `DIR/results.jsonl` (flushed and fsynced) as soon as its config
finishes, so a killed sweep loses at most the config that was running; `resume=True` skips the
rows already there (and drops a torn last line). OOM-safe: on CUDA a `torch.OutOfMemoryError`
is caught, memory freed and the row recorded as OOM; with a budget the process is capped with
`set_per_process_memory_fraction`. On a CPU the peak is measured by the live-tensor tracker and
a config whose peak exceeds the budget is marked OOM (simulated, and the row says so).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config import Config, ConfigError, parse_spec
from .memory.estimate import estimate
from .memory.flops import recompute_flops_fraction, step_flops
from .memory.measure import (
    LiveTensorTracker,
    make_batch,
    resolve_device,
    resolve_dtype,
    track_saved_tensors,
)

GIB = 2**30
RESULTS = "results.jsonl"


@dataclass
class AblationRow:
    recompute: str
    status: str  # ok | oom | error
    result: str = ""  # OK | OOM | Perf regression | Error (filled once the golden is known)
    recommended: bool = False
    step_time_s: float | None = None  # median over the timed steps
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None  # model FLOPs (no recompute) / step time
    vs_golden: float | None = None  # relative TFLOP/s against the golden row
    peak_memory_bytes: int | None = None  # weights + grads + optimizer + activation peak
    peak_reserved_bytes: int | None = None  # CUDA: what a per-process memory cap limits
    peak_activation_bytes: int | None = None
    saved_activation_bytes: int | None = None
    estimated_peak_activation_bytes: int | None = None
    estimated_total_bytes: int | None = None
    recompute_flops_fraction: float | None = None  # the FLOP model's prediction
    oom_simulated: bool = False  # CPU: peak above the budget, not a real allocator failure
    error: str | None = None
    setup: dict[str, Any] = field(default_factory=dict)  # model, device, dtype, steps, key

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AblationSetup:
    config: Config
    name: str  # preset name or config path, for the reports
    specs: list[str]
    steps: int = 5
    warmup: int = 1
    device: str = "auto"
    dtype: str = "fp32"
    memory_budget_gb: float | None = None
    golden: str | None = "none"  # a spec whose TFLOP/s is the reference
    golden_tflops: float | None = None
    regression_threshold: float = 0.10
    seed: int = 0

    def key(self) -> str:
        """Identifies the setup, so a resumed sweep never mixes rows of different setups."""
        body = json.dumps(
            [
                self.config.model.__dict__,
                self.config.parallel.__dict__,
                self.steps,
                self.warmup,
                self.device,
                self.dtype,
                self.memory_budget_gb,
                self.seed,
            ],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def validate_setup(setup: AblationSetup) -> None:
    """One clear ConfigError for any bad parameter, before anything runs."""
    if not setup.specs:
        raise ConfigError("no recompute specs to run")
    for spec in setup.specs:
        setup.config.with_recompute(parse_spec(spec)).validate()
    if setup.steps < 1 or setup.warmup < 0:
        raise ConfigError(f"steps must be >= 1 and warmup >= 0, got {setup.steps}, {setup.warmup}")
    if setup.memory_budget_gb is not None and setup.memory_budget_gb <= 0:
        raise ConfigError(f"memory budget must be positive, got {setup.memory_budget_gb:g} GiB")
    if not 0 < setup.regression_threshold < 1:
        raise ConfigError(
            f"regression threshold must be in (0, 1), got {setup.regression_threshold:g}"
        )
    if setup.golden:
        setup.config.with_recompute(parse_spec(setup.golden)).validate()
    resolve_device(setup.device)
    resolve_dtype(setup.dtype)


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create DIR and check it is writable (one clear error otherwise)."""
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"cannot write to output directory {str(path)!r}: {exc.strerror}"
        ) from None
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Finished rows of a results.jsonl; a torn last line (a killed sweep) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    rows = []
    for line in data.decode().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def append_row(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# --------------------------------------------------------------------------------------------
# Running one config on the reference layers
# --------------------------------------------------------------------------------------------


def _model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(
        p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None
    )
    for state in optimizer.state.values():
        total += sum(
            t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor)
        )
    return total


def run_config(setup: AblationSetup, spec: str) -> AblationRow:
    """Warm up, time `steps` training steps (forward, backward, AdamW), measure the peak."""
    from .layers import GPTModel

    device = resolve_device(setup.device)
    dtype = resolve_dtype(setup.dtype)
    config = setup.config.with_recompute(parse_spec(spec))
    m = config.model
    row = AblationRow(recompute=config.recompute.spec, status="ok")
    est = estimate(config, dtype_bytes=torch.tensor([], dtype=dtype).element_size())
    row.estimated_peak_activation_bytes = est.peak_activation_bytes
    row.estimated_total_bytes = est.total_bytes
    row.recompute_flops_fraction = recompute_flops_fraction(config)
    model = optimizer = None
    try:
        torch.manual_seed(setup.seed)
        model = GPTModel(config).to(device, dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        tokens, labels = make_batch(config, device, setup.seed)

        def step() -> None:
            optimizer.zero_grad(set_to_none=False)
            model(tokens, labels).backward()
            optimizer.step()

        if device.type == "cuda":  # the peak covers the whole run, first step included
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(max(setup.warmup, 1)):  # the first step also creates optimizer states
            step()
        times = []
        for _ in range(setup.steps):
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        row.step_time_s = statistics.median(times)
        row.tokens_per_s = m.micro_batch_size * m.seq_length / row.step_time_s
        row.tflops_per_gpu = step_flops(config) / row.step_time_s / 1e12

        # One more step, tracked: saved activations and the activation peak.
        optimizer.zero_grad(set_to_none=False)
        state = _model_state_bytes(model, optimizer)
        if device.type == "cuda":
            with track_saved_tensors(model) as saved:
                loss = model(tokens, labels)
            loss.backward()
            row.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
            row.peak_reserved_bytes = torch.cuda.max_memory_reserved(device)
            row.peak_activation_bytes = max(0, row.peak_memory_bytes - state)
        else:
            with LiveTensorTracker(model) as live:
                with track_saved_tensors(model) as saved:
                    loss = model(tokens, labels)
                loss.backward()
            row.peak_activation_bytes = live.peak_bytes
            row.peak_memory_bytes = state + live.peak_bytes
        row.saved_activation_bytes = saved.total_bytes
        budget = setup.memory_budget_gb
        if device.type == "cpu" and budget and row.peak_memory_bytes > budget * GIB:
            row.status, row.oom_simulated = "oom", True
    except torch.OutOfMemoryError as exc:
        row.status, row.error = "oom", str(exc).splitlines()[0][:300]
    except RuntimeError as exc:  # anything else: record it, go on with the sweep
        row.status, row.error = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    finally:
        model = optimizer = None  # free the config's memory before the next one
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def run_config_isolated(setup: AblationSetup, spec: str) -> AblationRow:
    """`run_config` in a fresh Python process. On CUDA a caught OOM can leave memory held in
    the process (the failed step's tensors), which would fail every later config; a process
    per config starts each from an empty GPU. The budget cap is applied inside the worker."""
    import subprocess

    job = {
        "config": setup.config.to_flat(),
        "name": setup.name,
        "spec": spec,
        "steps": setup.steps,
        "warmup": setup.warmup,
        "device": setup.device,
        "dtype": setup.dtype,
        "memory_budget_gb": setup.memory_budget_gb,
        "seed": setup.seed,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "recompute_kit.ablation", "--worker"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["worker failed"])[-1]
        return AblationRow(recompute=parse_spec(spec).spec, status="error", error=last[:300])
    return AblationRow(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _worker() -> None:
    from .config import config_from_dict

    job = json.loads(sys.stdin.read())
    config, _ = config_from_dict(job.pop("config"))
    spec = job.pop("spec")
    setup = AblationSetup(config=config, specs=[spec], **job)
    with memory_cap(setup):
        row = run_config(setup, spec)
    print(json.dumps(row.to_json()))


@contextlib.contextmanager
def memory_cap(setup: AblationSetup):
    """On CUDA, cap this process at the budget (emulating a smaller GPU)."""
    device = resolve_device(setup.device)
    if device.type != "cuda" or not setup.memory_budget_gb:
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, setup.memory_budget_gb * GIB / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


def label_rows(rows: list[dict[str, Any]], setup: AblationSetup) -> list[dict[str, Any]]:
    """Fill result / vs_golden / recommended from the golden (a spec or a TFLOP/s figure)."""
    golden = setup.golden_tflops
    if golden is None and setup.golden:
        # A simulated OOM (CPU) still has its measured throughput: it can serve as golden.
        spec = parse_spec(setup.golden).spec
        ref = next((r for r in rows if r["recompute"] == spec and r.get("tflops_per_gpu")), None)
        golden = ref["tflops_per_gpu"] if ref else None
    for r in rows:
        if r.get("tflops_per_gpu") and golden:
            r["vs_golden"] = r["tflops_per_gpu"] / golden - 1
        regressed = r.get("vs_golden") is not None and r["vs_golden"] < -setup.regression_threshold
        if r["status"] == "oom":
            r["result"] = "OOM"
        elif r["status"] != "ok":
            r["result"] = "Error"
        else:
            r["result"] = "Perf regression" if regressed else "OK"
        r["recommended"] = False
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        max(ok, key=lambda r: r["tflops_per_gpu"])["recommended"] = True
    return rows


def run_ablation(
    setup: AblationSetup,
    out_dir: str | Path,
    resume: bool = False,
    runner: Callable[[AblationSetup, str], AblationRow] = run_config,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every spec not yet in DIR/results.jsonl; write summary.md and the plots."""
    validate_setup(setup)
    out = prepare_out_dir(out_dir)
    results = out / RESULTS
    key = setup.key()
    existing = read_rows(results) if resume else []
    if not resume and results.exists() and results.stat().st_size:
        raise ConfigError(
            f"{results} already has results; pass --resume to continue that sweep or choose "
            "another --out"
        )
    other = [r for r in existing if r.get("setup", {}).get("key") != key]
    if other:
        raise ConfigError(
            f"{results} holds results of a different setup (model, steps, device, dtype or "
            "budget); use another --out"
        )
    done = {r["recompute"] for r in existing}
    todo = [s for s in dict.fromkeys(parse_spec(s).spec for s in setup.specs) if s not in done]
    if setup.golden and parse_spec(setup.golden).spec not in done | set(todo):
        todo.insert(0, parse_spec(setup.golden).spec)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    isolated = runner is run_config and resolve_device(setup.device).type == "cuda"
    if isolated:  # one process per config (and the cap is set inside each)
        runner = run_config_isolated
    with contextlib.nullcontext() if isolated else memory_cap(setup):
        for i, spec in enumerate(todo, 1):
            say(f"[{i}/{len(todo)}] {spec} ...")
            start = time.perf_counter()
            row = runner(setup, spec)
            row.setup = {
                "model": setup.name,
                "device": resolve_device(setup.device).type,
                "dtype": setup.dtype,
                "steps": setup.steps,
                "warmup": setup.warmup,
                "memory_budget_gb": setup.memory_budget_gb,
                "key": key,
            }
            append_row(results, row.to_json())
            say(
                f"[{i}/{len(todo)}] {spec}: {row.status}"
                + (f", {row.step_time_s:.3f} s/step" if row.step_time_s else "")
                + f" ({time.perf_counter() - start:.1f} s)"
            )
    rows = label_rows(read_rows(results), setup)
    write_reports(rows, setup, out)
    return rows


def write_reports(rows: list[dict[str, Any]], setup: AblationSetup, out: Path) -> None:
    (out / "summary.md").write_text(summary_markdown(rows, setup))
    from . import plots

    plots.ablation_figures(rows, setup.memory_budget_gb, out)


def summary_markdown(rows: Iterable[dict[str, Any]], setup: AblationSetup) -> str:
    rows = list(rows)
    peaks = [r.get("peak_memory_bytes") or 0 for r in rows]
    unit, scale = ("GiB", GIB) if max(peaks, default=0) >= GIB / 10 else ("MiB", 2**20)
    lines = [
        f"# Recompute ablation: {setup.name}",
        "",
        f"device {rows[0]['setup']['device'] if rows else '?'}, dtype {setup.dtype}, "
        f"{setup.steps} timed steps after {setup.warmup} warm-up, golden "
        f"{setup.golden_tflops or setup.golden}, regression threshold "
        f"{setup.regression_threshold:.0%}"
        + (f", memory budget {setup.memory_budget_gb:g} GiB" if setup.memory_budget_gb else ""),
        "",
        f"| recompute | TFLOP/s/GPU | vs golden | step (s) | peak memory ({unit}) "
        f"| est. total ({unit}) "
        "| recompute FLOPs (%) | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def num(key: str, fmt: str, r=r) -> str:
            return format(r[key], fmt) if r.get(key) is not None else "-"

        result = r["result"] + (" (simulated)" if r.get("oom_simulated") else "")
        result += " **recommended**" if r.get("recommended") else ""
        peak = f"{r['peak_memory_bytes'] / scale:.3f}" if r.get("peak_memory_bytes") else "-"
        est = f"{r['estimated_total_bytes'] / scale:.3f}" if r.get("estimated_total_bytes") else "-"
        vs = f"{r['vs_golden']:+.1%}" if r.get("vs_golden") is not None else "-"
        frac = (
            f"{100 * r['recompute_flops_fraction']:.1f}"
            if r.get("recompute_flops_fraction") is not None
            else "-"
        )
        lines.append(
            f"| {r['recompute']} | {num('tflops_per_gpu', '.4g')} | {vs} | "
            f"{num('step_time_s', '.4f')} | {peak} | {est} | {frac} | {result} |"
        )
    best = next((r for r in rows if r.get("recommended")), None)
    lines += [
        "",
        f"Recommended: **{best['recompute']}** (the fastest setting that fits)."
        if best
        else "Recommended: none - every setting ran out of memory or failed.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
