"""Run a grid of recompute settings and produce the table engineers know from NVIDIA's skill:
TFLOP/s per GPU, versus golden, peak memory, result.

Timing separates signal from noise: on the reference layers every config's model is built
first and the timed steps go round-robin over the configs (repeat 1 of every config, then
repeat 2, ...), so drift (a loaded CPU, clocks) hits all configs alike. Each row keeps its step
times, the median and a distribution-free confidence interval of the median. A row is labelled
faster or slower than golden only when its interval excludes golden's; otherwise it is "within
noise". The recommendation is the cheapest setting by the FLOP model among those that fit and
are not measurably slower than golden.

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
import math
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
from .throughput import matmul_ceiling
from .units import byte_unit, in_unit, integer_bytes

GIB = 2**30
# The sizes a runnable preset is ablated at where none is given (the CLI's and the notebook's
# alike): recompute's extra forward shows in the timings of a CPU run of about a minute.
ABLATION_EXAMPLE_SIZES = {"seq_length": 128, "micro_batch_size": 8}
RESULTS = "results.jsonl"
CONFIDENCE = 0.95  # of the median's interval (reached from 6 timed steps on)
# Below this many timed steps a row says it runs, not how fast: the interval of the median of
# 2-4 samples is their range at 50-88% coverage, and ranges of two parts apart by chance.
MIN_JUDGED_STEPS = 5


@dataclass
class AblationRow:
    recompute: str
    status: str  # ok | oom | error
    # golden | within noise | faster | slower | Perf regression | OK (no golden) | OOM | Error,
    # filled once the golden is known
    result: str = ""
    recommended: bool = False
    step_time_s: float | None = None  # median over the timed steps
    step_times_s: list[float] = field(default_factory=list)  # every timed step, in order
    step_time_interval_s: list[float] | None = None  # [low, high] of the median, `confidence`
    confidence: float | None = None  # coverage of that interval (lower with < 6 steps)
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None  # model FLOPs (no recompute) / median step time
    mfu: float | None = None  # tflops_per_gpu / the device's measured matmul ceiling
    vs_golden: float | None = None  # relative TFLOP/s against the golden row (medians)
    vs_golden_interval: list[float] | None = None  # from the two intervals, worst cases
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
        return integer_bytes(asdict(self))


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
    # CPU: torch threads during the sweep. One thread by default: on a shared machine two
    # OpenMP threads spin against other processes, and steps vary tenfold (measured: 0.2-1.7 s
    # vs 42-80 ms for one thread, tiny-gpt, 2 busy cores).
    cpu_threads: int | None = 1

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
                self.cpu_threads,
            ],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def validate_setup(setup: AblationSetup, builds_model: bool = True) -> None:
    """One clear ConfigError for any bad parameter, before anything runs (`builds_model`: the
    kit's reference layers run here, not a training command of the user's)."""
    if not setup.specs:
        raise ConfigError("no recompute specs to run")
    for spec in setup.specs:
        setup.config.with_recompute(parse_spec(spec)).validate()
    if setup.steps < 1 or setup.warmup < 0:
        raise ConfigError(f"steps must be >= 1 and warmup >= 0, got {setup.steps}, {setup.warmup}")
    if setup.memory_budget_gb is not None and setup.memory_budget_gb <= 0:
        raise ConfigError(f"memory budget must be positive, got {setup.memory_budget_gb:g} GiB")
    if setup.cpu_threads is not None and setup.cpu_threads < 1:
        raise ConfigError(f"cpu threads must be >= 1, got {setup.cpu_threads}")
    if not 0 < setup.regression_threshold < 1:
        raise ConfigError(
            f"regression threshold must be in (0, 1), got {setup.regression_threshold:g}"
        )
    if setup.golden:
        setup.config.with_recompute(parse_spec(setup.golden)).validate()
    device = resolve_device(setup.device)
    dtype = resolve_dtype(setup.dtype)
    if builds_model:
        _check_it_fits(setup, device, dtype)


def _available_bytes(device: torch.device) -> int | None:
    """Free memory where the run builds its model: the GPU's, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_it_fits(setup: AblationSetup, device: torch.device, dtype: torch.dtype) -> None:
    """The whole model on one device (the reference layers, no parallelism): refuse a run the
    device cannot hold, before building it (a 30B model on a CPU killed the kernel)."""
    width = torch.tensor([], dtype=dtype).element_size()
    need = min(
        estimate(
            setup.config.with_recompute(parse_spec(spec)), dtype_bytes=width, engine="reference"
        ).total_bytes
        for spec in setup.specs
    )
    free = _available_bytes(device)
    if free is not None and need > free:
        raise ConfigError(
            f"the ablation runs the whole model on one {device.type} device: its lightest "
            f"setting needs {need / GIB:.1f} GiB (weights, gradients, Adam and activations by "
            f"the estimate) and {free / GIB:.1f} GiB is free; ablate a small model of the same "
            "family (a preset: recompute-kit models) or run where it fits"
        )


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


class ReferenceRun:
    """One config on the reference layers, kept alive so its timed steps can be interleaved
    with other configs' (`time_step`); `finish` measures the memory and frees the model."""

    def __init__(self, setup: AblationSetup, spec: str) -> None:
        from .layers import GPTModel

        self.device = resolve_device(setup.device)
        dtype = resolve_dtype(setup.dtype)
        self.setup = setup
        self.config = config = setup.config.with_recompute(parse_spec(spec))
        self.row = row = AblationRow(recompute=config.recompute.spec, status="ok")
        # the kit's reference layers run here: estimate what they keep
        est = estimate(
            config, dtype_bytes=torch.tensor([], dtype=dtype).element_size(), engine="reference"
        )
        row.estimated_peak_activation_bytes = est.peak_activation_bytes
        row.estimated_total_bytes = est.total_bytes
        row.recompute_flops_fraction = recompute_flops_fraction(config)
        self.model = self.optimizer = None
        with self._failures():
            torch.manual_seed(setup.seed)
            self.model = GPTModel(config).to(self.device, dtype)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=False)
            self.tokens, self.labels = make_batch(config, self.device, setup.seed)
            if self.device.type == "cuda":  # the peak covers the whole run, first step included
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            for _ in range(max(setup.warmup, 1)):  # the first step also creates optimizer states
                self._step()

    @property
    def alive(self) -> bool:
        return self.row.status == "ok" and self.model is not None

    @contextlib.contextmanager
    def _failures(self):
        try:
            yield
        except torch.OutOfMemoryError as exc:
            self.row.status, self.row.error = "oom", str(exc).splitlines()[0][:300]
            self._free()
        except RuntimeError as exc:  # anything else: record it, go on with the sweep
            self.row.status = "error"
            self.row.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self._free()

    def _step(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)
        self.model(self.tokens, self.labels).backward()
        self.optimizer.step()

    def time_step(self) -> None:
        if not self.alive:
            return
        with self._failures():
            start = time.perf_counter()
            self._step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.row.step_times_s.append(time.perf_counter() - start)

    def finish(self) -> AblationRow:
        """Throughput from the timed steps; one more step, tracked: saved activations and the
        activation peak. Frees the model."""
        row, config, device = self.row, self.config, self.device
        if self.alive:
            with self._failures():
                m = config.model
                row.step_time_s = statistics.median(row.step_times_s)
                row.tokens_per_s = m.micro_batch_size * m.seq_length / row.step_time_s
                row.tflops_per_gpu = step_flops(config) / row.step_time_s / 1e12
                self.optimizer.zero_grad(set_to_none=False)
                state = _model_state_bytes(self.model, self.optimizer)
                if device.type == "cuda":
                    with track_saved_tensors(self.model) as saved:
                        loss = self.model(self.tokens, self.labels)
                    loss.backward()
                    row.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
                    row.peak_reserved_bytes = torch.cuda.max_memory_reserved(device)
                    row.peak_activation_bytes = max(0, row.peak_memory_bytes - state)
                else:
                    with LiveTensorTracker(self.model) as live:
                        with track_saved_tensors(self.model) as saved:
                            loss = self.model(self.tokens, self.labels)
                        loss.backward()
                    row.peak_activation_bytes = live.peak_bytes
                    row.peak_memory_bytes = state + live.peak_bytes
                row.saved_activation_bytes = saved.total_bytes
                budget = self.setup.memory_budget_gb
                if device.type == "cpu" and budget and row.peak_memory_bytes > budget * GIB:
                    row.status, row.oom_simulated = "oom", True
        self._free()
        return row

    def _free(self) -> None:
        self.model = self.optimizer = None  # free the config's memory before the next one
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def run_config(setup: AblationSetup, spec: str) -> AblationRow:
    """Warm up, time `steps` training steps (forward, backward, AdamW), measure the peak."""
    run = ReferenceRun(setup, spec)
    for _ in range(setup.steps):
        run.time_step()
    return run.finish()


def run_interleaved(setup: AblationSetup, specs: list[str]) -> list[AblationRow]:
    """Every config built and warmed up, then `steps` rounds of one timed step per config; the
    order rotates each round so no config always runs right after another's warm cache."""
    runs = [ReferenceRun(setup, spec) for spec in specs]
    for repeat in range(setup.steps):
        shift = repeat % len(runs)
        for run in runs[shift:] + runs[:shift]:
            run.time_step()
    return [run.finish() for run in runs]


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
def cpu_threads(setup: AblationSetup):
    """On CPU, run the sweep with `setup.cpu_threads` torch threads (restored afterwards)."""
    if resolve_device(setup.device).type != "cpu" or setup.cpu_threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(setup.cpu_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def median_interval(samples: list[float], level: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage): a distribution-free confidence interval of the median, between
    order statistics k and n+1-k with k the largest rank whose coverage (from the binomial
    distribution of how many samples fall below the median) is still >= level. With fewer than
    6 samples no pair reaches 95%: the interval is then [min, max] with its lower coverage."""
    xs = sorted(samples)
    n = len(xs)
    if n < 2:
        return (xs[0], xs[0], 0.0) if xs else (math.nan, math.nan, 0.0)

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n+1-k))
        below = sum(math.comb(n, i) for i in range(k)) / 2**n
        return 1.0 - 2.0 * below

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def _timing_stats(row: dict[str, Any]) -> None:
    """Median, interval and coverage from the row's step times (runners that only report a
    median, e.g. an external log with one iteration, keep a point interval)."""
    times = row.get("step_times_s") or ([row["step_time_s"]] if row.get("step_time_s") else [])
    if not times:
        return
    low, high, cover = median_interval(times)
    row["step_time_s"] = row.get("step_time_s") or statistics.median(times)
    row["step_time_interval_s"] = [low, high]
    row["confidence"] = cover


def _compare(row: dict[str, Any], ref: dict[str, Any]) -> str:
    """faster / slower / within noise: slower only when the row's whole interval lies above
    golden's (step time), faster only when it lies below."""
    low, high = row["step_time_interval_s"]
    ref_low, ref_high = ref["step_time_interval_s"]
    if low > ref_high:
        return "slower"
    if high < ref_low:
        return "faster"
    return "within noise"


def label_rows(rows: list[dict[str, Any]], setup: AblationSetup) -> list[dict[str, Any]]:
    """Fill result / vs_golden / recommended from the golden (a spec or a TFLOP/s figure)."""
    for r in rows:
        _timing_stats(r)
    ref = None
    if setup.golden_tflops is None and setup.golden:
        # A simulated OOM (CPU) still has its measured throughput: it can serve as golden.
        spec = parse_spec(setup.golden).spec
        ref = next((r for r in rows if r["recompute"] == spec and r.get("tflops_per_gpu")), None)
    for r in rows:
        r["recommended"] = False
        r["vs_golden"] = r["vs_golden_interval"] = None
        if r["status"] == "oom":
            r["result"] = "OOM"
            continue
        if r["status"] != "ok":
            r["result"] = "Error"
            continue
        if setup.golden_tflops is not None:  # a figure without spread: the medians decide
            r["vs_golden"] = r["tflops_per_gpu"] / setup.golden_tflops - 1
            slow = r["vs_golden"] < -setup.regression_threshold
            r["result"] = "Perf regression" if slow else "OK"
            continue
        if ref is None:
            r["result"] = "OK"
            continue
        r["vs_golden"] = ref["step_time_s"] / r["step_time_s"] - 1  # TFLOP/s ratio
        low, high = r["step_time_interval_s"]
        ref_low, ref_high = ref["step_time_interval_s"]
        r["vs_golden_interval"] = [ref_low / high - 1, ref_high / low - 1]
        if r is ref:
            r["result"] = "golden"
            continue
        verdict = _compare(r, ref)
        if verdict == "slower" and r["vs_golden"] < -setup.regression_threshold:
            verdict = "Perf regression"
        timed = min(len(r.get("step_times_s") or []), len(ref.get("step_times_s") or []))
        if 0 < timed < MIN_JUDGED_STEPS:
            verdict = f"runs ({timed} timed steps: too few to judge speed)"
        r["result"] = verdict
    fits = [r for r in rows if r["status"] == "ok"]
    not_slower = [r for r in fits if r["result"] not in ("slower", "Perf regression")]
    pool = not_slower or fits
    if pool:
        best = min(
            pool, key=lambda r: (r.get("recompute_flops_fraction") or 0.0, -r["tflops_per_gpu"])
        )
        best["recommended"] = True
    return rows


def ranking_note(rows: list[dict[str, Any]]) -> str | None:
    """A line for the summary when the timings cannot rank the settings that fit, or when they
    contradict the FLOP model (more recompute measured faster: drift or noise)."""
    fits = [r for r in rows if r["status"] == "ok" and r.get("result") != "OK"]
    if len(fits) < 2:
        return None
    differs = [r for r in fits if r["result"] in ("faster", "slower", "Perf regression")]
    if not differs:
        return (
            "The timings cannot rank these settings: every difference from golden is within "
            "noise (the median intervals overlap; a loaded CPU or a tiny model). The "
            "recommendation follows the FLOP model."
        )
    ref = next((r for r in fits if r["result"] == "golden"), None)
    odd = [
        r["recompute"]
        for r in differs
        if r["result"] == "faster"
        and ref is not None
        and (r.get("recompute_flops_fraction") or 0) > (ref.get("recompute_flops_fraction") or 0)
    ]
    if odd:
        return (
            f"Measured faster than golden despite more FLOPs: {', '.join(odd)}; the machine's "
            "speed drifted or the timings are noisy, rerun with more --steps."
        )
    return None


def run_ablation(
    setup: AblationSetup,
    out_dir: str | Path,
    resume: bool = False,
    runner: Callable[[AblationSetup, str], AblationRow] = run_config,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every spec not yet in DIR/results.jsonl; write summary.md and the plots."""
    validate_setup(setup, builds_model=runner in (run_config, run_config_isolated))
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
    device = resolve_device(setup.device).type
    isolated = runner is run_config and device == "cuda"
    interleaved = runner is run_config and not isolated
    if isolated:  # one process per config (and the cap is set inside each)
        runner = run_config_isolated
    info = {
        "model": setup.name,
        "seq_length": setup.config.model.seq_length,
        "micro_batch_size": setup.config.model.micro_batch_size,
        "device": device,
        "dtype": setup.dtype,
        "steps": setup.steps,
        "warmup": setup.warmup,
        "memory_budget_gb": setup.memory_budget_gb,
        "key": key,
        "timing": "interleaved" if interleaved else "sequential",
        "cpu_threads": setup.cpu_threads if device == "cpu" else None,
    }

    def record(row: AblationRow) -> None:
        row.setup = info
        append_row(results, row.to_json())

    if interleaved and todo:
        # All configs share the machine's drift; the rows are written once the rounds end.
        say(f"{len(todo)} configs, {setup.steps} interleaved rounds ...")
        start = time.perf_counter()
        with memory_cap(setup), cpu_threads(setup):
            # The denominator of MFU, measured once per sweep (a 2048^2 GEMM keeps it short
            # on a CPU).
            info["matmul_tflops"] = matmul_ceiling(
                resolve_device(setup.device), resolve_dtype(setup.dtype), size=2048, repeats=4
            )
            for row in run_interleaved(setup, todo):
                if row.tflops_per_gpu:
                    row.mfu = row.tflops_per_gpu / info["matmul_tflops"]
                record(row)
        say(f"done ({time.perf_counter() - start:.1f} s)")
    else:
        with contextlib.nullcontext() if isolated else memory_cap(setup):
            for i, spec in enumerate(todo, 1):
                say(f"[{i}/{len(todo)}] {spec} ...")
                start = time.perf_counter()
                row = runner(setup, spec)
                record(row)
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


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def summary_markdown(rows: Iterable[dict[str, Any]], setup: AblationSetup) -> str:
    rows = list(rows)
    unit, scale = byte_unit(
        [r.get("peak_memory_bytes") for r in rows] + [r.get("estimated_total_bytes") for r in rows]
    )
    info = rows[0]["setup"] if rows else {}
    covers = [r["confidence"] for r in rows if r.get("confidence") is not None]
    level = min(covers, default=0.0)
    lines = [
        f"# Recompute ablation: {setup.name}",
        "",
        f"seq {setup.config.model.seq_length}, micro-batch {setup.config.model.micro_batch_size}, "
        f"device {info.get('device', '?')}, dtype {setup.dtype}, {setup.steps} timed steps per "
        f"config after {setup.warmup} warm-up, timed {info.get('timing', 'sequential')}, golden "
        f"{setup.golden_tflops or setup.golden}, regression threshold "
        f"{setup.regression_threshold:.0%}"
        + (f", memory budget {setup.memory_budget_gb:g} GiB" if setup.memory_budget_gb else "")
        + (
            f", matmul ceiling {info['matmul_tflops']:.3g} TFLOP/s"
            if info.get("matmul_tflops")
            else ""
        ),
        "",
        f"Step times: median [interval of the median, >= {level:.0%} confidence]. A row is "
        "faster or slower than golden only when its interval excludes golden's.",
        "",
        "| recompute | TFLOP/s/GPU | MFU | vs golden [interval] | step ms [interval] "
        f"| peak memory ({unit}) | est. total ({unit}) | recompute FLOPs (%) | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        result = r["result"] + (" (simulated)" if r.get("oom_simulated") else "")
        result += " **recommended**" if r.get("recommended") else ""
        tflops = f"{r['tflops_per_gpu']:.4g}" if r.get("tflops_per_gpu") else "-"
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
        vs = _pct(r.get("vs_golden"))
        if r.get("vs_golden_interval") and r.get("result") != "golden":
            low, high = r["vs_golden_interval"]
            vs += f" [{low:+.1%}, {high:+.1%}]"
        step = "-"
        if r.get("step_time_s"):
            step = f"{1000 * r['step_time_s']:.2f}"
            if r.get("step_time_interval_s"):
                low, high = r["step_time_interval_s"]
                step += f" [{1000 * low:.2f}, {1000 * high:.2f}]"
        frac = r.get("recompute_flops_fraction")
        lines.append(
            f"| {r['recompute']} | {tflops} | {mfu} | {vs} | {step} | "
            f"{in_unit(r.get('peak_memory_bytes'), scale)} | "
            f"{in_unit(r.get('estimated_total_bytes'), scale)} | "
            f"{'-' if frac is None else f'{100 * frac:.1f}'} | {result} |"
        )
    best = next((r for r in rows if r.get("recommended")), None)
    lines += [
        "",
        f"Recommended: **{best['recompute']}** (the cheapest setting by the FLOP model among "
        "those that fit and are not measurably slower than golden)."
        if best
        else "Recommended: none - every setting ran out of memory or failed.",
    ]
    note = ranking_note(rows)
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
