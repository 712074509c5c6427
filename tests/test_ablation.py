"""The ablation runner: rows, OOM handling, resume after a kill, the external command path."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recompute_kit.ablation import AblationSetup, read_rows, run_ablation
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
    assert rows[0]["vs_golden"] == 0.0 and rows[0]["result"] in ("OK",)
    assert sum(r["recommended"] for r in rows) == 1
    assert rows[-1]["peak_activation_bytes"] < rows[0]["peak_activation_bytes"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| recompute | TFLOP/s/GPU | vs golden |" in summary and "Recommended:" in summary
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
