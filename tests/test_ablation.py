"""The ablation runner: rows, OOM handling, resume after a kill, the external command path."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recompute_kit.ablation import (
    AblationRow,
    AblationSetup,
    label_rows,
    median_interval,
    read_rows,
    run_ablation,
    summary_markdown,
)
from recompute_kit.config import ConfigError
from recompute_kit.presets import get_preset

TINY = get_preset("tiny-gpt").config()
SPECS = ["none", "selective", "selective:mlp", "full:uniform:1"]


def setup(**kw):
    base = dict(config=TINY, name="tiny-gpt", specs=SPECS, steps=2, warmup=1, device="cpu")
    return AblationSetup(**{**base, **kw})


def test_rows_have_the_table_and_the_estimate(tmp_path):
    rows = run_ablation(setup(), tmp_path)
    assert [r["recompute"] for r in rows] == SPECS
    for r in rows:
        assert r["status"] == "ok" and r["tflops_per_gpu"] > 0 and r["step_time_s"] > 0
        assert r["peak_memory_bytes"] > r["peak_activation_bytes"] > 0
        # the estimate sits beside the measurement, and agrees
        assert r["estimated_peak_activation_bytes"] == pytest.approx(
            r["peak_activation_bytes"], rel=0.05
        )
    assert rows[0]["vs_golden"] == 0.0 and rows[0]["result"] == "golden"
    for r in rows:  # interleaved rounds: every config has one time per round, and an interval
        assert len(r["step_times_s"]) == 2 and r["setup"]["timing"] == "interleaved"
        low, high = r["step_time_interval_s"]
        assert low <= r["step_time_s"] <= high
        # two timed steps judge no speed (a skill trial: "-17.9% Perf regression" from two)
        assert r["result"] in ("golden", "runs (2 timed steps: too few to judge speed)")
        assert isinstance(r["peak_memory_bytes"], int) and 0 < r["mfu"] < 1
    assert sum(r["recommended"] for r in rows) == 1
    assert rows[-1]["peak_activation_bytes"] < rows[0]["peak_activation_bytes"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| recompute | TFLOP/s/GPU | MFU | vs golden [interval] |" in summary
    assert "Recommended:" in summary
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    assert (tmp_path / "overhead.png").stat().st_size > 1000


def test_budget_marks_configs_oom_on_cpu_and_the_sweep_goes_on(tmp_path):
    free = run_ablation(setup(specs=["none", "full:uniform:1"]), tmp_path / "a")
    peaks = {r["recompute"]: r["peak_memory_bytes"] for r in free}
    budget = (peaks["none"] + peaks["full:uniform:1"]) / 2 / 2**30  # between the two
    rows = run_ablation(
        setup(specs=["none", "full:uniform:1"], memory_budget_gb=budget), tmp_path / "b"
    )
    by = {r["recompute"]: r for r in rows}
    assert by["none"]["status"] == "oom" and by["none"]["oom_simulated"] is True
    assert by["none"]["result"] == "OOM"
    assert by["full:uniform:1"]["status"] == "ok" and by["full:uniform:1"]["recommended"]
    assert "OOM (simulated)" in (tmp_path / "b" / "summary.md").read_text()


def test_regression_label_against_golden_tflops(tmp_path):
    rows = run_ablation(setup(specs=["none"], golden=None, golden_tflops=1e6), tmp_path)
    assert rows[0]["result"] == "Perf regression" and rows[0]["vs_golden"] < -0.99


def test_refuses_to_mix_setups_and_needs_resume(tmp_path):
    run_ablation(setup(specs=["none"]), tmp_path)
    with pytest.raises(ConfigError, match="pass --resume"):
        run_ablation(setup(specs=["none"]), tmp_path)
    with pytest.raises(ConfigError, match="different setup"):
        run_ablation(setup(specs=["none"], steps=3), tmp_path, resume=True)


def test_bad_parameters_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown recompute module 'attn'"):
        run_ablation(setup(specs=["selective:attn"]), tmp_path)
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        run_ablation(setup(steps=0), tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write to output directory"):
        run_ablation(setup(), blocker / "sub")


# A stand-in for a training command: prints one Megatron iteration line and a memory report,
# so a config's row takes milliseconds. The config named in HOLD waits until RELEASE exists: the
# test kills the sweep while it waits, which makes the kill point an event, not a moment.
FAKE_TRAINER = """
import sys, time
from pathlib import Path
spec, work = sys.argv[1], Path(sys.argv[2])
(work / ("started-" + spec.replace(":", "_"))).touch()
if spec == (work / "HOLD").read_text():
    while not (work / "RELEASE").exists():
        time.sleep(0.02)
print(" [2026-01-01 00:00:00] iteration        1/       1 | elapsed time per iteration (ms): 10.0"
      " | throughput per GPU (TFLOP/s/GPU): 1.0 |", flush=True)
print("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0"
      " | reserved: 2.0 | max reserved: 2.0", flush=True)
"""


def _wait_for(condition, proc, what: str) -> None:
    """Wait for an event the sweep causes; fail at once if the sweep exits first."""
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the sweep exited ({proc.returncode}) before {what}")
        time.sleep(0.02)


def test_killed_sweep_resumes_with_every_config_once(tmp_path):
    specs = [
        "none",
        "selective",
        "selective:mlp",
        "selective:layernorm",
        "full:uniform:1",
        "full:uniform:2",
        "full:block:1",
        "full:block:2",
    ]
    work, out = tmp_path / "work", tmp_path / "sweep"
    work.mkdir()
    trainer = work / "fake_trainer.py"
    trainer.write_text(FAKE_TRAINER)
    (work / "HOLD").write_text(specs[3])
    cmd = [
        *[sys.executable, "-m", "recompute_kit.cli", "ablate", "--model", "tiny-gpt"],
        *["--out", str(out), "--warmup", "0", "--timeout", "600"],
        *["--command-template", f"{sys.executable} {trainer} {{spec}} {work}"],
        *["--recompute", *specs],
    ]
    # Its own process group, so the kill reaches the fake trainer it is waiting on too.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _wait_for((work / "started-selective_layernorm").exists, proc, "the held config started")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    results = out / "results.jsonl"
    before = results.read_bytes()
    finished = before[: before.rfind(b"\n") + 1].splitlines()
    assert [json.loads(r)["recompute"] for r in finished] == specs[:3]

    (work / "RELEASE").touch()
    done = subprocess.run([*cmd, "--resume", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = results.read_bytes().splitlines()
    assert after[: len(finished)] == finished  # rows already written are byte-identical
    rows = [json.loads(line) for line in after]
    assert [r["recompute"] for r in rows] == specs  # every config exactly once, in order
    assert all(r["status"] == "ok" for r in rows), rows
    assert len(json.loads(done.stdout)["rows"]) == len(specs)


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"recompute": "none"}\n{"recomp')
    assert read_rows(path) == [{"recompute": "none"}]
    assert path.read_text() == '{"recompute": "none"}\n'


def test_external_command_with_torchrun_two_processes(tmp_path):
    """--command-template runs real training per config (torchrun, 2 CPU ranks, gloo) and the
    doctor's parsers turn its Megatron-format log into rows."""
    torchrun = Path(sys.executable).with_name("torchrun")
    template = (
        # --standalone: torchrun picks a free rendezvous port itself (a fixed one collides
        # under parallel runs).
        f"{torchrun} --standalone --nproc-per-node 2 -m recompute_kit.train "
        "--model tiny-gpt --train-iters 4 {megatron_lm}"
    )
    out = tmp_path / "ext"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recompute_kit.cli",
            "ablate",
            "--model",
            "tiny-gpt",
            "--out",
            str(out),
            "--warmup",
            "1",
            "--command-template",
            template,
            "--timeout",
            "240",
            "--recompute",
            "none",
            "full:uniform:1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["recompute"] for r in rows] == ["none", "full:uniform:1"]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["step_time_s"] > 0 and r["tflops_per_gpu"] > 0 and r["peak_memory_bytes"] > 0
    log = (out / "logs" / "full_uniform_1.log").read_text()
    assert "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" in log
    assert "iteration        4/       4" in log
    # recompute lowers the reported peak
    assert rows[1]["peak_memory_bytes"] < rows[0]["peak_memory_bytes"]


# --------------------------------------------------------------------------------------------
# Statistics on injected timings: no training, the labels and the recommendation are exact.
# --------------------------------------------------------------------------------------------


def test_median_interval_uses_order_statistics():
    xs = [float(v) for v in range(10, 0, -1)]  # 10 samples, shuffled order
    low, high, cover = median_interval(xs)
    # n=10: ranks 2 and 9 cover the median with 1 - 2 * P(Binom(10, .5) <= 1) = 97.85%
    assert (low, high) == (2.0, 9.0) and cover == pytest.approx(1 - 2 * 11 / 1024)
    low, high, cover = median_interval([3.0, 1.0, 2.0])  # too few for 95%: min..max, 75%
    assert (low, high, cover) == (1.0, 3.0, 0.75)


NOISE = [0.97, 1.03, 0.99, 1.01, 1.0, 0.98, 1.02, 1.0, 0.995, 1.005]  # +-3 %


def injected(spec: str, scale: float, flops: float, status: str = "ok") -> dict:
    times = [0.1 * scale * n for n in NOISE]
    row = AblationRow(recompute=spec, status=status, step_times_s=times)
    row.step_time_s = sorted(times)[4] / 2 + sorted(times)[5] / 2
    row.tflops_per_gpu = 1e-3 / row.step_time_s
    row.recompute_flops_fraction = flops
    return row.to_json()


def stat_setup(**kw):
    return setup(**{"specs": ["none"], "steps": len(NOISE), **kw})


def test_labels_follow_the_intervals_and_the_cheapest_fitting_setting_is_recommended():
    rows = label_rows(
        [
            injected("none", 1.0, 0.0),
            injected("selective", 1.02, 0.03),  # overlaps golden: within noise, not "slower"
            injected("selective:mlp", 0.985, 0.10),  # faster by noise only: within noise
            injected("full:block:1", 1.08, 0.12),  # interval above golden's, under 10 %: slower
            injected("full:uniform:1", 1.40, 0.32),  # clearly slower, over 10 %: regression
            injected("full:block:2", 0.80, 0.24),  # interval below golden's: faster
        ],
        stat_setup(),
    )
    by = {r["recompute"]: r for r in rows}
    assert by["none"]["result"] == "golden"
    assert by["selective"]["result"] == "within noise"
    assert by["selective:mlp"]["result"] == "within noise"
    assert by["full:block:1"]["result"] == "slower"
    assert by["full:uniform:1"]["result"] == "Perf regression"
    assert by["full:block:2"]["result"] == "faster"
    assert [r["recompute"] for r in rows if r["recommended"]] == ["none"]
    low, high = by["selective"]["vs_golden_interval"]
    assert low < 0 < high  # the TFLOP/s interval against golden straddles zero
    note = summary_markdown(rows, stat_setup())
    assert "despite more FLOPs: full:block:2" in note


def test_without_golden_in_memory_the_cheapest_not_slower_setting_wins():
    rows = label_rows(
        [
            injected("none", 1.0, 0.0, status="oom"),  # simulated OOM still serves as golden
            injected("full:uniform:1", 1.40, 0.32),
            injected("selective:mlp", 1.01, 0.10),
            injected("selective", 1.15, 0.03),  # cheaper by the FLOP model, measurably slower
        ],
        stat_setup(),
    )
    by = {r["recompute"]: r for r in rows}
    assert by["none"]["result"] == "OOM" and by["selective"]["result"] == "Perf regression"
    assert [r["recompute"] for r in rows if r["recommended"]] == ["selective:mlp"]
    # when every fitting setting is measurably slower, the cheapest of them is still named
    rows = label_rows(
        [injected("none", 1.0, 0.0, status="oom"), injected("full:uniform:1", 1.4, 0.32)],
        stat_setup(),
    )
    assert rows[1]["recommended"] and rows[1]["result"] == "Perf regression"


def test_summary_says_when_timings_cannot_rank(tmp_path):
    def runner(s, spec):
        row = AblationRow(**{k: v for k, v in injected(spec, 1.0, 0.0).items() if k != "setup"})
        row.recompute_flops_fraction = 0.0 if spec == "none" else 0.3
        return row

    rows = run_ablation(stat_setup(specs=["none", "full:uniform:1"]), tmp_path, runner=runner)
    assert [r["result"] for r in rows] == ["golden", "within noise"]
    assert rows[0]["recommended"] and rows[0]["setup"]["timing"] == "sequential"
    summary = (tmp_path / "summary.md").read_text()
    assert "The timings cannot rank these settings" in summary
    assert "Perf regression" not in summary and "faster" not in summary.split("|---")[1]


def test_a_model_the_device_cannot_hold_is_refused_before_it_is_built(tmp_path):
    # A skill trial gave the ablation notebook a Qwen3-30B-A3B recipe: it built the model on the
    # CPU for 85 s and the kernel died with no output. The estimate refuses it first.
    from recompute_kit.ablation import validate_setup

    big = get_preset("qwen3-30b-a3b").config().replace(seq_length=4096)
    with pytest.raises(ConfigError, match=r"needs \d+\.\d GiB .* is free"):
        validate_setup(setup(config=big, name="qwen3-30b-a3b", device="cpu"))
    validate_setup(setup(device="cpu"))  # the small model still runs


def test_the_cli_ablates_a_preset_at_the_notebooks_sizes_and_records_them(tmp_path, capsys):
    # A skill trial: `ablate --model tiny-moe` ran the preset's own sizes (5 MiB peak) while the
    # notebook ran 128 x 8 (43 MiB), and neither results.jsonl said which; "same code" disagreed.
    from recompute_kit.ablation import ABLATION_EXAMPLE_SIZES
    from recompute_kit.cli import main

    out = tmp_path / "cli"
    argv = ["ablate", "--model", "tiny-gpt", "--recompute", "none", "--steps", "1"]
    assert main([*argv, "--warmup", "0", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    row = read_rows(out / "results.jsonl")[0]
    assert {k: row["setup"][k] for k in ABLATION_EXAMPLE_SIZES} == ABLATION_EXAMPLE_SIZES
    assert "seq 128, micro-batch 8" in (out / "summary.md").read_text()


def test_five_timed_steps_are_judged():
    # from MIN_JUDGED_STEPS timed steps on, the intervals decide (here apart: slower)
    from recompute_kit.ablation import MIN_JUDGED_STEPS, label_rows

    def row(spec, times):
        return {"recompute": spec, "status": "ok", "step_times_s": times, "tflops_per_gpu": 1.0}

    n = MIN_JUDGED_STEPS
    rows = label_rows([row("none", [1.0] * n), row("full:uniform:1", [2.0] * n)], setup())
    assert [r["result"] for r in rows] == ["golden", "Perf regression"]
    few = [row("none", [1.0] * (n - 1)), row("full:uniform:1", [2.0] * (n - 1))]
    rows = label_rows(few, setup())
    assert rows[1]["result"] == f"runs ({n - 1} timed steps: too few to judge speed)"
