"""Ablations of your own training command: one run per recompute config, its log parsed.

The template is a command line with placeholders, filled per config:

    {spec}                   the recompute spec, e.g. selective:core_attn,mlp
    {megatron_lm}            Megatron-LM flags: --recompute-granularity selective ...
    {bridge}                 Megatron-Bridge/NeMo Hydra overrides: model.recompute_granularity=...
    {recompute_granularity} {recompute_method} {recompute_num_layers} {recompute_modules}
                             the raw values (modules space-separated; 'null' when unset)

The command runs without a shell (split like a POSIX shell would), with a timeout; its output
goes to DIR/logs/<spec>.log and is read by the doctor's parsers: iteration lines give step time
and TFLOP/s, memory reports the peak, an OOM message the OOM.
"""

from __future__ import annotations

import re
import shlex
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from .ablation import AblationRow, AblationSetup
from .config import ConfigError, RecomputeConfig, parse_spec
from .export import render
from .memory.flops import recompute_flops_fraction, step_flops


def placeholders(rc: RecomputeConfig) -> dict[str, str]:
    def value(v) -> str:
        return "null" if v is None else str(v)

    modules = rc.recompute_modules if rc.recompute_granularity == "selective" else None
    flags = " ".join(
        line for line in render(rc, "megatron-lm").splitlines() if not line.startswith("#")
    )
    bridge = [
        f"model.recompute_granularity={value(rc.recompute_granularity)}",
        f"model.recompute_method={value(rc.recompute_method)}",
        f"model.recompute_num_layers={value(rc.recompute_num_layers)}",
        "model.recompute_modules="
        + ("[" + ",".join(modules) + "]" if modules is not None else "null"),
    ]
    return {
        "spec": rc.spec,
        "megatron_lm": flags,
        "bridge": " ".join(bridge),
        "recompute_granularity": value(rc.recompute_granularity),
        "recompute_method": value(rc.recompute_method),
        "recompute_num_layers": value(rc.recompute_num_layers),
        "recompute_modules": " ".join(modules) if modules else "null",
    }


def fill(template: str, rc: RecomputeConfig) -> list[str]:
    """The argv for one config (placeholders expanded after splitting, so values stay apart)."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"--command-template cannot be split like a shell line: {exc}") from None
    values = placeholders(rc)
    argv: list[str] = []
    for word in words:
        try:
            expanded = word.format(**values)
        except (KeyError, IndexError) as exc:
            raise ConfigError(
                f"--command-template has an unknown placeholder {exc}; known: "
                + ", ".join("{" + k + "}" for k in values)
            ) from None
        # A placeholder that stands alone and holds several flags becomes several words.
        argv += shlex.split(expanded) if re.fullmatch(r"\{\w+\}", word) else [expanded]
    return argv


def external_runner(
    template: str, timeout: float, out_dir: str
) -> Callable[[AblationSetup, str], AblationRow]:
    """A runner for `run_ablation` that launches the user's command per config."""
    fill(template, RecomputeConfig())  # bad placeholders fail before anything runs
    logs = Path(out_dir) / "logs"

    def run(setup: AblationSetup, spec: str) -> AblationRow:
        from .doctor.evidence import parse_log_file

        rc = parse_spec(spec)
        config = setup.config.with_recompute(rc)
        row = AblationRow(
            recompute=rc.spec,
            status="ok",
            recompute_flops_fraction=recompute_flops_fraction(config),
        )
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / (re.sub(r"[^A-Za-z0-9_.-]", "_", rc.spec) + ".log")
        argv = fill(template, rc)
        try:
            with log.open("w") as fh:
                fh.write("# " + shlex.join(argv) + "\n")
                fh.flush()
                proc = subprocess.run(
                    argv, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False
                )
        except FileNotFoundError:
            raise ConfigError(f"--command-template: command not found: {argv[0]}") from None
        except subprocess.TimeoutExpired:
            row.status, row.error = "error", f"timed out after {timeout:g} s (log: {log})"
            return row
        evidence = parse_log_file(log)
        if evidence.oom:
            row.status, row.error = "oom", evidence.oom[-1].line[:300] or "CUDA out of memory"
        elif proc.returncode != 0:
            last = evidence.errors[-1] if evidence.errors else None
            row.status = "error"
            row.error = (
                f"{last.type}: {last.message}" if last else f"exit status {proc.returncode}"
            )[:300] + f" (log: {log})"
        iters = [i for i in evidence.iterations if i.elapsed_ms][setup.warmup :]
        if iters:
            row.step_times_s = [i.elapsed_ms / 1000.0 for i in iters]
            row.step_time_s = statistics.median(row.step_times_s)
            m = config.model
            row.tokens_per_s = m.micro_batch_size * m.seq_length / row.step_time_s
            printed = [i.tflops_per_gpu for i in iters if i.tflops_per_gpu]
            # Logs print TFLOP/s with one decimal: tiny models show 0.0, so fall back to the
            # FLOP model over the measured step time.
            row.tflops_per_gpu = (
                statistics.median(printed)
                if printed
                else step_flops(config) / row.step_time_s / 1e12
            )
        peaks = [r.max_allocated_bytes for r in evidence.memory if r.max_allocated_bytes]
        row.peak_memory_bytes = max(peaks) if peaks else None
        if row.status == "ok" and row.step_time_s is None:
            row.status, row.error = "error", f"no iteration lines in the log ({log})"
        return row

    return run
