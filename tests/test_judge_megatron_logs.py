"""The measured-ablation judge and the doctor on two real Megatron-LM logs (a skill trial):
Mixtral 8x7B without recompute and with full recompute, verbatim lines from
https://github.com/NVIDIA/Megatron-LM/issues/756 (tests/data/measured/mlm756, SOURCES.md).
The logs' memory line is read, loss is compared only at common iterations, the week between
the runs and their different train-iters are confounders, the judge and the doctor make one
judgement, and the measured slowdown is set against the recompute FLOPs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recompute_kit.doctor.evidence import collect, parse_log_file
from recompute_kit.runstats import speed_verdict

DATA = Path(__file__).parent / "data" / "measured" / "mlm756"
JUDGE = Path(__file__).parents[1] / "skill" / "scripts" / "judge.py"
CONTROL, FULL, SCRIPT = DATA / "control.log", DATA / "full.log", DATA / "train_full.sh"


def judge(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(JUDGE), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def logs_judged(*extra: str) -> dict:
    doc = judge(
        "--log", f"none={CONTROL}", "--log", f"full:uniform:1={FULL}",
        "--budget-gib", "79.1", "--golden", "none", *extra,
    )  # fmt: skip
    return {c["recompute"]: c for c in doc["candidates"]} | {"doc": doc}


def test_log_parser_keeps_the_iteration_lines_stamps():
    assert parse_log_file(CONTROL).iteration_stamps == {
        "first": "2024-04-06 02:55:45",
        "last": "2024-04-06 02:59:47",
    }
    assert parse_log_file(FULL).iteration_stamps["first"] == "2024-03-30 20:02:40"


def test_judge_reads_megatrons_memory_line():
    # "[Rank 1] (after 1 iterations) memory (MB) | ... | max reserved: 61480.0"
    got = logs_judged()
    none = got["none"]
    assert none["max_peak_reserved_gib"] == round(61480.0 * 2**20 / 2**30, 3)  # 60.039
    assert none["checks"]["fits"] is True and none["binding_rank"] == 1
    assert "no peak memory recorded" not in none["reasons"]
    # the full-recompute log has no memory line: said, not invented
    assert got["full:uniform:1"]["checks"]["fits"] is None


def test_judge_compares_loss_only_at_common_iterations():
    # control has iterations 2-45, full 10-12: no iteration in common, no loss verdict
    full = logs_judged()["full:uniform:1"]
    assert full["checks"]["loss"] is None and full["loss_rel_diff"] is None
    assert any("no iteration in common" in r and "2-45" in r for r in full["reasons"])
    assert full["verdict"] != "fail"


def test_judge_flags_the_week_and_the_train_iters_as_confounders():
    got = logs_judged()
    fields = {c["field"]: c for c in got["doc"]["confounders"]}
    assert fields["date"]["values"] == {"none": ["2024-04-06"], "full:uniform:1": ["2024-03-30"]}
    assert fields["train_iters"]["values"] == {"none": ["100"], "full:uniform:1": ["500000"]}
    full = got["full:uniform:1"]
    assert full["checks"]["throughput"] is None
    assert full["speed_verdict"]["state"] == "confounded"
    assert any("confounded" in r for r in full["reasons"])


def test_judge_sets_the_slowdown_against_the_recompute_flops():
    full = logs_judged("--config", str(SCRIPT))["full:uniform:1"]
    cost = full["expected_cost"]
    # the estimator's full uniform recompute on Mixtral 8x7B: about a third more FLOPs;
    # measured step time 10036.9 ms / 5533.8 ms (the runs' medians): +81%
    assert 0.25 < cost["predicted"] < 0.40
    assert abs(cost["measured"] - (10036.9 / 5533.8 - 1)) < 1e-3
    assert cost["explained"] is False and "more than recompute explains" in cost["text"]


def test_a_slowdown_the_flops_explain_says_as_expected():
    from recompute_kit.plan.measured_cost import explain_slowdown
    from recompute_kit.sources.resolve import config_from_json, resolve

    cfg = config_from_json(resolve([str(SCRIPT)], require_shape=False).to_json())
    said = explain_slowdown(cfg, "full:uniform:1", "none", 0.30)
    assert said["explained"] is True and said["text"].count("as expected") == 1


def test_doctor_and_judge_make_one_judgement(tmp_path):
    """The trial's table of the two runs: the judge called -44.9% a regression while the
    doctor's RK237 called it "within noise"; now both call speed_verdict."""
    table = tmp_path / "results.md"
    table.write_text(
        "| recompute | elapsed time per iteration (ms) | tflops | max_reserved_gib | run |\n"
        "|---|---|---|---|---|\n| none | 5444.9 | 236.0 | 60.04 | control.log |\n"
        "| full:uniform:1 | 10036.9 | 130.1 | | full.log |\n"
    )
    from recompute_kit.doctor.engine import diagnose

    judged = {c["recompute"]: c for c in judge(str(table), "--golden", "none")["candidates"]}
    ev = collect(experiments=str(table), config=[str(SCRIPT)])
    row = next(r for r in ev.experiments if r["recompute"] == "full:uniform:1")
    assert row["speed_verdict"] == judged["full:uniform:1"]["speed_verdict"]
    assert row["speed_verdict"]["state"] == "regression" and row["within_noise"] is False
    found = {f.rule: f for f in diagnose(ev).findings}
    assert "RK237" not in found and "RK033" in found
    assert "more than recompute explains" in found["RK033"].evidence


def test_speed_verdict_states():
    base = {"change_low": -0.2, "change_high": 0.0, "noise_measured": True}
    assert speed_verdict({**base, "change": -0.1})["state"] == "within_noise"
    assert speed_verdict({"change": -0.45, "noise_measured": False})["check"] is False
    assert speed_verdict({"change": -0.45, "confounded": True, "why": "x"})["state"] == (
        "confounded"
    )
    assert speed_verdict(None)["state"] == "no_value"
