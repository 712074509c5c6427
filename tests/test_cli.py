"""The CLI through its JSON and its exit codes; bad input gives one line, never a traceback."""

import json
import subprocess
import sys

import pytest

from recompute_kit.presets import PRESETS


def run(*args, check_rc=None):
    proc = subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


def test_presets_json():
    doc = json.loads(run("presets", "--json", check_rc=0).stdout)
    assert [p["name"] for p in doc["presets"]] == list(PRESETS)
    tiny = doc["presets"][0]
    assert tiny["runnable"] is True and tiny["config"]["num_layers"] == 4


def test_verify_json_fields():
    proc = run(
        "verify",
        "--model",
        "tiny-gpt",
        "--recompute",
        "selective",
        "full:block:2",
        "--json",
        check_rc=0,
    )
    doc = json.loads(proc.stdout)
    assert doc["all_match"] is True
    assert [r["recompute"] for r in doc["results"]] == ["selective", "full:block:2"]
    for r in doc["results"]:
        assert set(r) >= {
            "recompute",
            "loss_match",
            "max_grad_abs_diff",
            "saved_activation_bytes",
            "baseline_saved_activation_bytes",
        }
        assert isinstance(r["saved_activation_bytes"], int)
        assert r["saved_activation_bytes"] < r["baseline_saved_activation_bytes"]


def test_verify_human_table_mentions_units():
    out = run("verify", "--recompute", "none", "full:uniform:1", check_rc=0).stdout
    assert "saved act (MiB)" in out and "full:uniform:1" in out


def test_validate_json(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("model:\n  num_layers: 8\n  recompute_granularity: selective\n  typo_key: 1\n")
    doc = json.loads(run("validate", str(good), "--json", check_rc=0).stdout)
    assert doc["valid"] is True and doc["errors"] == []
    assert doc["normalized"]["recompute_modules"] == ["core_attn"]
    assert any("typo_key" in w for w in doc["warnings"])

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"recompute_granularity": "full", "recompute_num_layers": 1}))
    proc = run("validate", str(bad), "--json", check_rc=1)
    doc = json.loads(proc.stdout)
    assert doc["valid"] is False
    assert doc["errors"] == [
        'Using recompute_granularity: full so recompute_method must be "block" or "uniform"'
    ]


def test_validate_strict(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("recompute_granularity: selective\nrecompute_method: uniform\n")
    run("validate", str(path), check_rc=0)
    out = run("validate", str(path), "--strict", check_rc=1).stdout
    assert "recompute method is not yet supported for selective recomputing granularity" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["verify", "--model", "gpt9"], "unknown preset 'gpt9'"),
        (["verify", "--recompute", "selective:attention"], "unknown recompute module 'attention'"),
        (["verify", "--recompute", "full:uniform"], "malformed full recompute spec"),
        (
            ["verify", "--recompute", "selective:moe_act"],
            "moe_act in recompute_modules is only supported with moe_grouped_gemm.",
        ),
        (["verify", "--model", "llama3-70b"], "is shape-only"),
        (["validate", "/nonexistent/config.yaml"], "cannot read config file"),
    ],
)
def test_bad_input_is_one_line_exit_1(args, message):
    proc = run(*args, check_rc=1)
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_not_yaml_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {num_layers: [\n")
    proc = run("validate", str(path), check_rc=1)
    assert "is not valid YAML/JSON" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2():
    assert run("verify", "--no-such-flag").returncode == 2
    assert run().returncode == 2
    assert run("verify", "--device", "tpu").returncode == 2


def test_verify_offloading_json():
    proc = run(
        "verify", "--model", "tiny-moe", "--cpu-offloading-num-layers", "2", "--json", check_rc=0
    )
    doc = json.loads(proc.stdout)
    [r] = doc["results"]  # recompute specs are ruled out by cpu_offloading (Megatron rule 3)
    assert r["recompute"] == "none" and r["loss_match"] and r["grads_match"]
    assert r["offloaded_bytes"] > 0
    assert (
        r["saved_activation_bytes"] + r["offloaded_bytes"] == r["baseline_saved_activation_bytes"]
    )


def test_verify_offload_conflict_is_one_line():
    proc = run(
        "verify",
        "--model",
        "tiny-moe",
        "--offload-modules",
        "moe_act",
        "--recompute",
        "selective:moe",
        check_rc=1,
    )
    assert proc.stderr.startswith("recompute-kit: error: Cannot offload ['moe_act'] while")
    assert len(proc.stderr.strip().splitlines()) == 1
