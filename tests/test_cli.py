"""The CLI through its JSON and its exit codes; bad input gives one line, never a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recompute_kit.cli import main
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
    good.write_text(
        "model:\n  num_layers: 8\n  hidden_size: 256\n  num_attention_heads: 8\n"
        "  recompute_granularity: selective\n  typo_key: 1\n"
    )
    doc = json.loads(run("validate", str(good), "--json", check_rc=0).stdout)
    assert doc["valid"] is True and doc["errors"] == []
    assert doc["normalized"]["recompute_modules"] == ["core_attn"]
    assert any("typo_key" in w for w in doc["warnings"])

    bad = tmp_path / "bad.json"
    shape = {"num_layers": 8, "hidden_size": 256, "num_attention_heads": 8}
    full = {"recompute_granularity": "full", "recompute_num_layers": 1}
    bad.write_text(json.dumps({**shape, **full}))
    proc = run("validate", str(bad), "--json", check_rc=1)
    doc = json.loads(proc.stdout)
    assert doc["valid"] is False
    assert doc["errors"] == [
        'Using recompute_granularity: full so recompute_method must be "block" or "uniform"'
    ]


def test_validate_strict(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\n"
        "recompute_granularity: selective\nrecompute_method: uniform\n"
    )
    run("validate", str(path), check_rc=0)
    out = run("validate", str(path), "--strict", check_rc=1).stdout
    assert "recompute method is not yet supported for selective recomputing granularity" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["verify", "--model", "gpt9"], "unknown model 'gpt9'"),
        (
            ["verify", "--recompute", "selective:moe_act"],
            "moe_act in recompute_modules is only supported with moe_grouped_gemm.",
        ),
        (["verify", "--model", "llama3-70b"], "is shape-only"),
        (["validate", "/nonexistent/config.yaml"], "cannot read /nonexistent/config.yaml"),
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
    assert "is not valid YAML" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2():
    assert run("verify", "--no-such-flag").returncode == 2
    assert run().returncode == 2
    assert run("verify", "--device", "tpu").returncode == 2


@pytest.mark.parametrize(
    "args,message",
    [
        (["verify", "--recompute", "selective:attention"], "unknown recompute module 'attention'"),
        (["verify", "--recompute", "full:uniform"], "malformed full recompute spec"),
        (["estimate", "--recompute", "selective:core_attn,,mlp"], "empty module name"),
        (["plan", "--model", "llama3-70b", "--gpu-memory-gb", "-1"], "must be a positive number"),
        (
            ["plan", "--model", "tiny-gpt", "--gpu-memory-gb", "8", "--format", "toml"],
            "invalid choice: 'toml'",
        ),
        (["ablate", "--out", "x", "--steps", "0"], "must be >= 1"),
        (["ablate", "--out", "x", "--golden", "full:block"], "malformed full recompute spec"),
    ],
)
def test_bad_values_are_usage_errors_before_any_work(args, message):
    """argparse rejects them (exit 2) while reading the command line: nothing is computed."""
    proc = run(*args, check_rc=2)
    last = proc.stderr.strip().splitlines()[-1]
    assert message in last and "Traceback" not in proc.stderr and proc.stdout == ""


def test_repeated_recompute_accumulates():
    doc = json.loads(
        run(
            *["estimate", "--model", "tiny-gpt", "--recompute", "none", "selective"],
            *["--recompute", "full:uniform:1", "--json"],
            check_rc=0,
        ).stdout
    )
    assert [e["recompute"] for e in doc["estimates"]] == ["none", "selective", "full:uniform:1"]
    # the empty selective control stays valid
    doc = json.loads(run("estimate", "--recompute", "selective:", "--json", check_rc=0).stdout)
    assert doc["estimates"][0]["recompute"] == "selective:"


def test_selective_module_the_model_lacks_gets_a_note():
    proc = run("estimate", "--model", "tiny-gpt", "--recompute", "selective:moe", check_rc=0)
    assert "note: selective:moe: this dense model has no moe modules" in proc.stderr
    proc = run("estimate", "--model", "tiny-moe", "--recompute", "selective:moe", check_rc=0)
    assert "note:" not in proc.stderr


BINARY = bytes(range(256)) * 4  # NUL bytes and invalid UTF-8


@pytest.mark.parametrize(
    "args,content,message",
    [
        (["validate", "{path}"], BINARY, "is not text (binary data at byte 0); give the config"),
        (["estimate", "--config", "{path}"], BINARY, "{path} is not text"),
        (["estimate", "--config", "{path}"], b"", "{path} is empty"),
        (["doctor", "--log", "{path}"], BINARY, "--log {path} is not text"),
        (["doctor", "--log", "{path}"], b"\n \n", "--log {path} is empty; pass the training log"),
    ],
)
def test_binary_or_empty_files_are_one_line_with_a_hint(tmp_path, args, content, message):
    path = tmp_path / "input.yaml"
    path.write_bytes(content)
    proc = run(*[a.format(path=path) for a in args], check_rc=1)
    assert message.format(path=path) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_log_with_a_stray_byte_is_still_read(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(
        b"step 1 done \xff\n" + (DATA / "rules" / "oom-pt-16417-comment.txt").read_bytes()
    )
    doc = json.loads(run("doctor", "--log", str(log), "--json", check_rc=0).stdout)
    assert doc["findings"]


def test_plan_json_is_a_document_even_when_nothing_fits():
    proc = run("plan", "--model", "llama3-70b", "--gpu-memory-gb", "10", "--json", check_rc=1)
    doc = json.loads(proc.stdout)
    assert doc["fits"] is False and doc["best"] is None and "nothing fits" in doc["error"]
    assert "nothing fits in 10 GiB" in proc.stderr


def test_json_byte_fields_are_integers_and_tables_pick_a_unit():
    doc = json.loads(run("estimate", "--model", "tiny-gpt", "--json", check_rc=0).stdout)

    def byte_values(node, inside=False):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from byte_values(value, inside or key.endswith("bytes") or key == "modules")
        elif isinstance(node, list):
            for value in node:
                yield from byte_values(value, inside)
        elif inside and node is not None:
            yield node

    values = list(byte_values(doc))
    assert values and all(type(v) is int for v in values), values
    table = run("estimate", "--model", "tiny-gpt", check_rc=0).stdout
    assert "total (MiB)" in table and "0.00 " not in table
    table = run("estimate", "--model", "llama3-8b", "--tp", "4", check_rc=0).stdout
    assert "total (GiB)" in table


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


# ---- estimate / measure / plan ----------------------------------------------------------------

ESTIMATE_FIELDS = {
    "recompute",
    "per_layer_activation_bytes",
    "activation_bytes",
    "peak_activation_bytes",
    "modules",
    "weights_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "total_bytes",
    "recompute_flops_fraction",
    "model_recompute_flops_fraction",
}


def test_estimate_json():
    doc = json.loads(
        run(
            "estimate",
            "--model",
            "llama3-70b",
            "--seq-length",
            "4096",
            "--tp",
            "8",
            "--pp",
            "4",
            "--sp",
            "--recompute",
            "none",
            "selective:mlp",
            "full:uniform:1",
            "--json",
            check_rc=0,
        ).stdout
    )
    rows = doc["estimates"]
    assert [r["recompute"] for r in rows] == ["none", "selective:mlp", "full:uniform:1"]
    for r in rows:
        assert set(r) >= ESTIMATE_FIELDS
        assert isinstance(r["activation_bytes"], int) and isinstance(r["total_bytes"], int)
        assert r["total_bytes"] == pytest.approx(
            r["weights_bytes"]
            + r["grads_bytes"]
            + r["optimizer_bytes"]
            + r["peak_activation_bytes"],
            abs=2,
        )
    assert rows[0]["activation_bytes"] > rows[1]["activation_bytes"] > rows[2]["activation_bytes"]
    assert rows[0]["recompute_flops_fraction"] == 0 < rows[1]["recompute_flops_fraction"]


def test_measure_json_real_and_fake():
    doc = json.loads(
        run(
            "measure",
            "--model",
            "tiny-moe",
            "--recompute",
            "none",
            "selective:moe",
            "--json",
            check_rc=0,
        ).stdout
    )
    real = doc["measurements"]
    assert [m["device"] for m in real] == ["cpu", "cpu"]
    assert real[1]["peak_activation_bytes"] < real[0]["peak_activation_bytes"]
    assert "moe_act" in real[0]["modules"] and real[1]["modules"]["moe_act"] == 0
    doc = json.loads(
        run(
            "measure",
            "--model",
            "llama3-70b",
            "--fake",
            "--recompute",
            "full:uniform:1",
            "--json",
            check_rc=0,
        ).stdout
    )
    [fake] = doc["measurements"]
    assert fake["device"] == "meta" and fake["per_layer_activation_bytes"] > 0
    assert set(fake) >= {
        "recompute",
        "per_layer_activation_bytes",
        "modules",
        "peak_activation_bytes",
    }


def test_plan_json_and_render():
    doc = json.loads(
        run(
            "plan",
            "--model",
            "llama3-70b",
            "--gpu-memory-gb",
            "64",
            "--format",
            "megatron-lm",
            "--json",
            check_rc=0,
        ).stdout
    )
    assert doc["best"]["fits"] is True
    assert doc["best"]["total_bytes"] <= doc["usable_bytes"]
    fitting = [c for c in doc["candidates"] if c["fits"]]
    assert doc["best"] == fitting[0]
    # the cheapest of the settings that clear the estimate's error band (issue #20)
    clear = [c for c in fitting if not c["offload"] and c["clears_error_band"]]
    assert doc["best"]["recompute_flops_fraction"] == min(
        c["recompute_flops_fraction"] for c in clear
    )
    assert all(c["headroom_bytes"] == doc["usable_bytes"] - c["total_bytes"] for c in fitting)
    assert doc["headroom_bytes"] == doc["best"]["headroom_bytes"]
    assert doc["error_band"]["total_bytes"] == doc["error_band_bytes"] <= doc["headroom_bytes"]
    assert doc["rendered"].splitlines()[1].startswith("--recompute-granularity")
    assert doc["best"]["recompute"] in doc["explanation"]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["estimate", "--model", "llama3-70b", "--tp", "3"],
            # validate() runs first and words it as Megatron-Core 0.16.1's TransformerConfig
            "num_attention_heads (64) must be a multiple of tensor_model_parallel_size (3).",
        ),
        (
            ["estimate", "--model", "llama3-70b", "--pp", "3"],
            "num_layers (80) is not divisible by pipeline parallel size 3",
        ),
        (
            ["estimate", "--model", "mixtral-8x7b", "--ep", "3"],
            "num_moe_experts (8) is not divisible by expert parallel size 3",
        ),
        (["plan", "--model", "llama3-70b", "--gpu-memory-gb", "10"], "nothing fits in 10 GiB"),
        (["measure", "--model", "llama3-70b"], "measure it with --fake"),
    ],
)
def test_memory_commands_bad_input_one_line(args, message):
    proc = run(*args, check_rc=1)
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_plan_says_by_how_much_nothing_fits():
    proc = run("plan", "--model", "llama3-70b", "--gpu-memory-gb", "10", check_rc=1)
    assert "GiB too much" in proc.stderr and "smallest candidate" in proc.stderr


# ---- doctor / rules -----------------------------------------------------------------------------

DATA = Path(__file__).parent / "data"
DOCTOR_FINDING_FIELDS = {
    "rule",
    "category",
    "title",
    "symptom",
    "cause",
    "confirm",
    "fix",
    "config_patch",
    "confidence",
    "references",
}


def test_doctor_json_contract_on_a_real_oom_and_config(tmp_path):
    # the OOM message of pytorch/pytorch#16417 (comment), verbatim in tests/data/rules/
    log = DATA / "rules" / "oom-pt-16417-comment.txt"
    config = tmp_path / "train.yaml"
    config.write_text(
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  num_query_groups: 8\n  ffn_hidden_size: 14336\n  seq_length: 8192\n"
        "  swiglu: true\n  padded_vocab_size: 128256\n"
        "  tensor_model_parallel_size: 4\n  sequence_parallel: true\n"
        "  recompute_granularity: selective\n"
    )
    doc = json.loads(
        run("doctor", "--log", str(log), "--config", str(config), "--json", check_rc=0).stdout
    )
    [oom] = doc["evidence"]["oom"]
    assert oom["requested_bytes"] == round(22.00 * 2**20)
    assert oom["allocated_bytes"] == round(22.90 * 2**30)
    for key in (
        "requested_bytes",
        "total_bytes",
        "free_bytes",
        "allocated_bytes",
        "reserved_unallocated_bytes",
        "process_bytes",
        "other_processes_bytes",
    ):
        assert key in oom
    for key in ("iterations", "memory", "errors", "config", "experiments"):
        assert key in doc["evidence"]
    assert doc["evidence"]["config"]["num_layers"] == 32
    assert doc["findings"] and all(set(f) >= DOCTOR_FINDING_FIELDS for f in doc["findings"])
    confidences = [f["confidence"] for f in doc["findings"]]
    assert confidences == sorted(confidences, reverse=True)


def test_doctor_reads_stdin_and_says_when_nothing_is_known():
    proc = subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", "doctor", "--log", "-", "--json"],
        input="all good, step 10 done\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert doc["findings"] == [] and doc["summary"].startswith("No known pattern")


def test_doctor_refuses_a_malicious_snapshot(tmp_path):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "snap.pickle"
    bad.write_bytes(pickle.dumps(Evil()))
    proc = run("doctor", "--snapshot", str(bad), check_rc=1)
    assert "refusing to load snapshot" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not marker.exists()


def test_doctor_needs_input_and_reports_missing_files():
    assert "give the doctor something to read" in run("doctor", check_rc=1).stderr
    proc = run("doctor", "--log", "/nonexistent.log", check_rc=1)
    assert "cannot read" in proc.stderr and "Traceback" not in proc.stderr


def test_rules_markdown_is_the_catalog():
    from recompute_kit.doctor.rules import RULES

    out = run("rules", "--markdown", check_rc=0).stdout
    assert out.startswith("<!-- generated by `recompute-kit rules --markdown`")
    for r in RULES:
        assert f"| {r.id} | {r.category} |" in out
    doc = json.loads(run("rules", "--json", check_rc=0).stdout)
    assert len(doc["rules"]) == len(RULES) >= 30


def test_parse_spec_rejects_empty_module_names():
    from recompute_kit.config import ConfigError, parse_spec

    with pytest.raises(ConfigError):
        parse_spec("selective:core_attn,,mlp")


def test_a_spec_megatron_refuses_is_skipped_among_others():
    """One refused spec is said and skipped; the others are still estimated (one spec alone
    is still an error)."""
    args = ["estimate", "--model", "tiny-moe", "--recompute", "none", "selective:mla_up_proj"]
    proc = run(*args, "full:uniform:1", "--json", check_rc=0)
    doc = json.loads(proc.stdout)
    assert [e["recompute"] for e in doc["estimates"]] == ["none", "full:uniform:1"]
    assert doc["rejected"][0]["recompute"] == "selective:mla_up_proj"
    assert "mla_up_proj" in proc.stderr
    run("estimate", "--model", "tiny-moe", "--recompute", "selective:mla_up_proj", check_rc=1)


def _doctor_layout(*extra: str, log_lines: str = "") -> dict:
    """The doctor on Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh (TP1 PP4
    EP8; its world is 8 x SLURM_NNODES, unset here) and an OOM message."""
    script = (
        DATA.parent / "sources" / "corpus" / "megatron_lm" / "blind_mixtral_8x7b_distributed.sh"
    )
    log = log_lines + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 3 has a "
        "total capacity of 79.11 GiB of which 412.00 MiB is free. Including non-PyTorch memory, "
        "this process has 78.69 GiB memory in use. Of the allocated memory 75.20 GiB is "
        "allocated by PyTorch, and 1.52 GiB is reserved by PyTorch but unallocated.\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recompute_kit.cli",
            "doctor",
            "--log",
            "-",
            "--config",
            str(script),
            "--json",
            *extra,
        ],
        input=log,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_doctor_takes_the_world_from_dp_or_from_megatrons_printed_layout():
    # A launch script leaves the node count to the scheduler: --dp (as estimate and plan take
    # it) or the log's own line (megatron/training/arguments.py prints it at start-up) sets it.
    alone = _doctor_layout()
    # SLURM_NNODES unset: 8 GPUs, which cannot hold EP 8 x PP 4; the world assumed is the
    # smallest that can (32, DP 8), and says the script's 8 beside it
    read = alone["evidence"]["read"]
    assert (read["config"]["world_size"], read["config"]["data_parallel_size"]) == (32, 8)
    assert "gives 8, too few" in read["sources"]["world_size"]["note"]
    by_flag = _doctor_layout("--dp", "16")
    printed = _doctor_layout(
        log_lines="using world size: 64, data-parallel size: 16, context-parallel size: 1, "
        "hierarchical context-parallel sizes: None, tensor-model-parallel size: 1, "
        "pipeline-model-parallel size: 4\n"
    )
    for doc in (by_flag, printed):
        read = doc["evidence"]["read"]["config"]
        assert (read["data_parallel_size"], read["world_size"]) == (16, 64)
    assert any(
        "using world size" in n or "prints the layout" in n for n in printed["evidence"]["notes"]
    )
    for doc in (alone, by_flag, printed):
        assert not any("cannot run" in w for w in doc["evidence"]["read"]["warnings"])


def test_doctor_layout_flags_need_a_config():
    proc = subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", "doctor", "--log", "-", "--dp", "8"],
        input="x\n",
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "give --config" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_validate_warns_about_ignored_modules_only_when_the_input_sets_them(tmp_path):
    # Megatron-LM's examples/mixtral script with full recompute added (the kit's own advice):
    # recompute_modules is then Megatron's default ['core_attn'], which full recompute ignores
    # silently; only modules the script itself sets are worth a warning.
    src = DATA.parent / "sources" / "corpus" / "megatron_lm" / "blind_mixtral_8x7b_distributed.sh"
    text = src.read_text()
    flags = (
        "    --recompute-granularity full --recompute-method block --recompute-num-layers 3 \\\n"
    )
    assert "MODEL_ARGS=(\n" in text
    full = tmp_path / "full.sh"
    full.write_text(text.replace("MODEL_ARGS=(\n", "MODEL_ARGS=(\n" + flags.replace(" \\", ""), 1))
    explicit = tmp_path / "explicit.sh"
    explicit.write_text(
        text.replace(
            "MODEL_ARGS=(\n", "MODEL_ARGS=(\n" + flags.replace(" \\", " --recompute-modules mlp"), 1
        )
    )
    ignored = "Megatron ignores recompute_modules"
    out = run("validate", str(full), "--strict", "--dp", "8", check_rc=0)
    assert "full:block:3" in out.stdout and ignored not in out.stdout + out.stderr
    out = run("validate", str(explicit), "--strict", "--dp", "8", check_rc=0)
    assert ignored in out.stdout + out.stderr


def test_estimate_rows_of_different_stages_say_their_stage():
    # a skill trial: the table said "per rank of pipeline stage 1" while a row was stage 0's
    out = run(
        "estimate",
        "--model",
        "deepseek-v3",
        "--pp",
        "16",
        "--dp",
        "64",
        "--ep",
        "8",
        "--first-stage-layers",
        "1",
        "--last-stage-layers",
        "4",
        "--recompute",
        "none",
        "full:uniform:1",
        check_rc=0,
    ).stdout
    header, _, first, second = out.splitlines()[:4]
    assert header.split()[1] == "stage" and first.split()[1] != second.split()[1]
    assert "per rank of pipeline stage" not in out and "column stage" in out


def test_doctor_estimates_the_pipeline_stage_of_the_rank_that_ran_out(tmp_path):
    # [rankN] of PyTorch's OOM message: with PP 4 over 32 GPUs (DP 8), Megatron's default order
    # puts 8 ranks in a stage, so rank 25 is stage 3 and rank 3 stage 0 (a trial: the doctor
    # described stage 0 for an OOM on the last stage)
    from recompute_kit.doctor.engine import build_context
    from recompute_kit.doctor.evidence import collect

    script = DATA.parent / "sources/corpus/megatron_lm/blind_mixtral_8x7b_distributed.sh"

    def context(rank: int):
        log = tmp_path / f"rank{rank}.log"
        log.write_text(
            f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "896.00 MiB. GPU 1 has a total capacity of 79.11 GiB of which 412.00 MiB is free.\n"
        )
        ev = collect([str(log)], [str(script)], overrides={"data_parallel_size": 8})
        return build_context(ev)

    for rank, stage in ((25, 3), (3, 0)):
        ctx = context(rank)
        assert ctx.estimate.stage == stage
        assert any(f"rank {rank}: pipeline stage {stage} of 4" in n for n in ctx.evidence.notes)
    beyond = context(40)  # beyond the 32 ranks: said, and the stage with the highest total
    assert any("beyond the 32 ranks" in n for n in beyond.evidence.notes)
    from recompute_kit.memory.estimate import estimate

    assert beyond.estimate.stage == estimate(beyond.config).stage  # the highest total's


def test_doctor_shows_the_patch_in_the_runs_own_keys(tmp_path):
    # a skill trial: a LLaMA-Factory run got `use_liger_kernel` (the Trainer's key) shown while
    # the checked patch held LLaMA-Factory's `enable_liger_kernel`
    import shutil

    src = DATA.parent / "sources" / "corpus" / "hf_trainer"
    for name in ("qwen3_full_sft.yaml", "ds_z3_config.json"):
        shutil.copy(src / name, tmp_path / name)
    (tmp_path / "examples" / "deepspeed").mkdir(parents=True)
    shutil.copy(src / "ds_z3_config.json", tmp_path / "examples" / "deepspeed")
    script = tmp_path / "train.sh"
    script.write_text(
        "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train qwen3_full_sft.yaml\n"
    )
    log = DATA / "rules" / "i12-automodel-1975.txt"
    out = run(
        "doctor", "--log", str(log), "--config", str(script), "--gpu-memory-gb", "39.4", check_rc=0
    )
    doc = json.loads(
        run(
            "doctor",
            "--log",
            str(log),
            "--config",
            str(script),
            "--gpu-memory-gb",
            "39.4",
            "--json",
            check_rc=0,
        ).stdout
    )
    differ = [
        f for f in doc["findings"] if f["patch_keys"] and f["patch_keys"] != f["config_patch"]
    ]
    assert differ, [f["config_patch"] for f in doc["findings"]]
    for f in differ:
        assert f"patch:    {json.dumps(f['patch_keys'])} (in the run's own keys)" in out.stdout


def test_doctor_labels_a_patch_without_a_framework_as_a_setting(tmp_path):
    # A bare OOM message (PyTorch's wording, https://github.com/pytorch/pytorch/issues/16417
    # form) and nothing that shows the framework: a patch is a setting in words, not a key to
    # paste (a skill trial's agent pasted HF keys into a diffusers script).
    log = tmp_path / "oom.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 23.64 GiB of which 1.00 GiB is free. Including non-PyTorch memory, "
        "this process has 22.60 GiB memory in use. Of the allocated memory 21.90 GiB is "
        "allocated by PyTorch, and 300.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    out = run("doctor", "--log", str(log), check_rc=0).stdout
    patched = [line for line in out.splitlines() if line.startswith("  patch:")]
    assert patched and all("not a key: no input shows the framework" in p for p in patched)


def test_doctor_takes_the_models_shape_from_model(tmp_path):
    # a skill trial: `read` said "use --model Qwen/Qwen3-4B" for a model id offline, but the
    # doctor had no --model, so it never had the shape and could not estimate
    import shutil

    src = DATA.parent / "sources" / "corpus" / "hf_trainer"
    yaml_text = (src / "qwen3_full_sft.yaml").read_text()
    (tmp_path / "sft.yaml").write_text(
        yaml_text.replace(
            "model_name_or_path: Qwen/Qwen3-4B-Instruct-2507", "model_name_or_path: /data/my-model"
        )
    )
    (tmp_path / "examples" / "deepspeed").mkdir(parents=True)
    shutil.copy(src / "ds_z3_config.json", tmp_path / "examples" / "deepspeed")
    log = DATA / "rules" / "i12-automodel-1975.txt"
    args = ["doctor", "--log", str(log), "--config", str(tmp_path / "sft.yaml"), "--json"]
    without = json.loads(run(*args, check_rc=0).stdout)["evidence"]["read"]["config"]
    assert not without.get("num_layers")
    read = json.loads(run(*args, "--model", "qwen3-8b", check_rc=0).stdout)["evidence"]["read"]
    assert read["config"]["num_layers"] == 36 and read["config"]["hidden_size"] == 4096


def test_estimate_rows_of_one_setting_given_twice_are_one(capsys):
    # A skill trial: `estimate --recompute none selective selective:core_attn` printed two rows
    # both labelled `selective` (core_attn is Megatron's default module list): one row, a note.
    from recompute_kit.cli import main

    argv = ["estimate", "--model", "tiny-gpt", "--recompute", "selective", "selective:core_attn"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert sum(line.startswith("selective ") for line in out.splitlines()) == 1
    assert "selective:core_attn is selective" in err


def test_estimate_says_its_recompute_flops_are_one_stages(capsys):
    # A skill trial took the estimate's recompute FLOPs (the binding stage's, +2.7%) for the
    # step's (+17%: the dense layers the setting recomputes sat on another stage)
    from recompute_kit.cli import main

    argv = [
        "estimate",
        "--model",
        "llama3-8b",
        "--pp",
        "2",
        "--dp",
        "1",
        "--recompute",
        "full:uniform:1",
    ]
    assert main(argv) == 0
    assert "the step's cost is the slowest stage's" in capsys.readouterr().out


def test_estimate_and_plan_run_where_only_the_runs_own_recompute_is_refused(tmp_path, capsys):
    # A skill trial: NeMo-Framework-Launcher's llama2_70b.yaml (verbatim in the reader corpus)
    # with the user's one change, granularity selective, keeps activations_checkpoint_num_layers
    # 0, which Megatron-Core refuses with selective. estimate --recompute SPEC and plan (which
    # choose the setting themselves) stopped on that refusal instead of saying it.
    from recompute_kit.cli import main

    corpus = Path(__file__).parent / "sources" / "corpus" / "nemo"
    text = (corpus / "blind_launcher_llama2_70b.yaml").read_text()
    changed = text.replace(
        "activations_checkpoint_granularity: null", "activations_checkpoint_granularity: selective"
    )
    assert changed != text
    user = tmp_path / "llama2_70b.yaml"
    user.write_text(changed)
    argv = ["--config", str(user), "--dp", "8", "--json"]
    assert main(["estimate", *argv, "--recompute", "none", "full:uniform:1"]) == 0
    out, err = capsys.readouterr()
    assert [r["recompute"] for r in json.loads(out)["estimates"]] == ["none", "full:uniform:1"]
    assert "own recompute setting (selective) is refused" in err
    assert main(["plan", *argv, "--gpu", "a100-80gb"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["fits"]
    # the run's own setting is what it asks for: still one clear error
    assert main(["estimate", *argv]) == 1
    assert "recompute_num_layers must be None" in capsys.readouterr().err


def test_doctor_takes_the_dtype_a_script_leaves_undecided(capsys):
    # A skill trial: a Pai-Megatron-Patch script decides --bf16 in an `if` on its 9th argument;
    # plan took --dtype bf16 but the doctor refused it, and diagnosed the fp32 default.
    from recompute_kit.cli import main

    script = Path(__file__).parent / "data" / "launch" / "pai" / "run_mcore_deepseek.sh"
    argv = ["doctor", "--config", str(script), "--model", "deepseek-ai/DeepSeek-V2-Lite"]
    argv += ["--ep", "8", "--dp", "8", "--gpu-memory-gb", "79.1", "--json"]
    assert main([*argv, "--dtype", "bf16"]) == 0
    read = json.loads(capsys.readouterr().out)["evidence"]["read"]
    assert read["config"]["bf16"] is True and read["sources"]["bf16"]["from"] == "argument"


def test_doctor_takes_a_named_gpu_as_plan_does(capsys):
    # a skill trial: `diagnose.py --gpu a100-40gb` was taken as an abbreviation of
    # --gpu-memory-gb ("invalid float value: 'a100-40gb'")
    from recompute_kit.cli import main
    from recompute_kit.gpus import GPUS

    log = Path(__file__).parent / "data" / "rules" / "ds-examples-186-allocator-flushes.txt"
    for budget in (["--gpu", "a100-40gb"], ["--gpu-memory-gb", str(GPUS["a100-40gb"].usable_gib)]):
        assert main(["doctor", "--log", str(log), "--json", *budget]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["findings"][0]["rule"] == "RK816"


def test_a_model_id_alone_reads_and_takes_grouped_gemm_and_says_its_fusions(capsys):
    # A skill trial (Kimi-K2 by its id, no config file): `read --model ID` wanted a FILE,
    # moe_act could not be estimated (no flag for moe_grouped_gemm), and the fusions the
    # activations depend on were Megatron-Core's defaults without a word.
    assert main(["read", "--model", "moonshotai/Kimi-K2-Instruct", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sources = doc["sources"]
    for key in ("bias_activation_fusion", "apply_rope_fusion"):
        assert sources[key]["from"] == "assumed", key
    argv = [
        "estimate",
        "--model",
        "moonshotai/Kimi-K2-Instruct",
        "--tp",
        "8",
        "--pp",
        "16",
        "--ep",
        "64",
        "--etp",
        "1",
        "--dp",
        "16",
        "--sp",
        "--seq-length",
        "4096",
        "--first-stage-layers",
        "3",
        "--last-stage-layers",
        "2",
        "--recompute",
        "selective:layernorm,moe_act",
        "--json",
    ]
    assert main(argv) == 1  # moe_act without grouped GEMM: refused, with Megatron's words
    assert "only supported with moe_grouped_gemm" in capsys.readouterr().err
    assert main([*argv, "--moe-grouped-gemm"]) == 0
    rows = json.loads(capsys.readouterr().out)["estimates"]
    assert [r["recompute"] for r in rows] == ["selective:layernorm,moe_act"]
    assert main(["read"]) == 1
    assert "give the config files, a model id, or --model" in capsys.readouterr().err


def test_doctor_takes_a_script_with_its_arguments_as_read_does(capsys, tmp_path):
    # A skill trial: `diagnose.py --config 'train_gpt3_175b_distributed.sh /ckpt /tb
    # /data/gpt2-vocab.json ...'` (the script and its positional arguments, as SKILL.md says
    # read/estimate/plan take it) answered "cannot read --config ...: No such file".
    script = Path(__file__).parent / "sources/corpus/megatron_lm/blind_gpt3_175b_distributed.sh"
    log = tmp_path / "train.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
        "this process has 78.08 GiB memory in use. Of the allocated memory 74.40 GiB is "
        "allocated by PyTorch, and 2.61 GiB is reserved by PyTorch but unallocated.\n"
    )
    call = f"{script} /ckpt /tb /data/gpt2-vocab.json /data/gpt2-merges.txt /data/prefix"
    argv = ["doctor", "--log", str(log), "--config", call, "--dp", "16", "--json"]
    assert main(argv) == 0
    read = json.loads(capsys.readouterr().out)["evidence"]["read"]
    assert read["inputs"][0]["format"] == "Megatron-LM launch script with arguments"
    # $3 gave the GPT-2 vocabulary file: the tokenizer's size, not the 32000 fallback
    assert read["config"]["vocab_size"] == 50257
    assert "--vocab-file /data/gpt2-vocab.json" in read["sources"]["vocab_size"]["where"]


def test_estimate_text_says_what_its_figures_leave_out(capsys):
    # a skill trial: the flex dispatcher's unmodelled buffers were said only in the JSON's
    # overhead_assumptions; the table's reader did not see them (Bridge's DeepSeek-V3 GB200
    # recipe, moe_token_dispatcher_type flex)
    bridge = Path(__file__).parent / "sources/corpus/bridge"
    config = bridge / "blind2_deepseek_v3_pretrain_gb200_nvfp4_v1.yaml"
    assert main(["estimate", "--config", str(config), "--dp", "64"]) == 0
    out = capsys.readouterr().out
    assert "not in these figures: flex dispatcher" in out


def test_validate_takes_a_model_alone(capsys):
    # a skill trial: `validate --model llama3-8b --recompute full:uniform:3 --strict` failed on
    # argparse's "CONFIG required" (no JSON); the rule it wanted (uniform N not dividing a
    # chunk before Megatron-Core 0.17) is checked on the model alone
    argv = ["validate", "--model", "llama3-8b", "--recompute", "full:uniform:3", "--strict"]
    # on the version named it fails when it runs: an error, not a warning (a later trial read
    # exit 0 and "valid" as safe to launch)
    assert main([*argv, "--megatron-core-version", "0.16", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert not doc["valid"] and any("IndexError before 0.17" in e for e in doc["errors"])
    assert not any("IndexError" in w for w in doc["warnings"])
    # the version unknown: the strictest is assumed, and said as a warning
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("IndexError before 0.17" in w for w in doc["warnings"])
    assert main(["validate", "--json"]) == 1
    assert "give the config files you train with, or --model" in capsys.readouterr().out


def test_validate_and_plan_say_what_moe_full_recompute_holds_late(capsys):
    # A skill trial (Megatron-LM's examples/mixtral script on Megatron-Core 0.16): `plan` chose
    # full:block:3 and `validate` said nothing of Megatron-LM#3221 (the unfused unpermute's
    # intermediates held until the next iteration; PR #5197 is in no release up to 0.17.1)
    argv = ["validate", "--model", "mixtral-8x7b", "--recompute", "full:block:2", "--json"]
    for version, said in (("0.16", True), ("0.17", True), ("0.18", False)):
        assert main([*argv, "--megatron-core-version", version]) == 0
        warnings = json.loads(capsys.readouterr().out)["warnings"]
        assert any("Megatron-LM#3221" in w for w in warnings) is said, version


def test_moe_permute_fusion_takes_the_path_without_the_late_free(tmp_path, capsys):
    script = tmp_path / "train.sh"
    flags = (
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
        "--num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 1 --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 "
        "--vocab-size 32000 --bf16 --recompute-granularity full --recompute-method block "
        "--recompute-num-layers 2"
    )
    argv = ["validate", str(script), "--megatron-core-version", "0.16", "--json"]
    for extra, said in (("", True), (" --moe-permute-fusion", False)):
        script.write_text(flags + extra + "\n")
        assert main(argv) == 0
        warnings = json.loads(capsys.readouterr().out)["warnings"]
        assert any("Megatron-LM#3221" in w for w in warnings) is said, extra


def test_the_layout_line_says_where_moe_optimizer_states_are_sharded(capsys):
    # A skill trial (Mixtral at EP 8 over DP 8) found no tool saying why the optimizer states
    # stayed 16 GiB with the distributed optimizer on: the experts' shard over expert-DP only
    argv = ["estimate", "--model", "mixtral-8x7b", "--dp", "8", "--ep", "8"]
    assert main([*argv, "--distributed-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "expert states over expert-DP 1: not sharded" in out
    assert "dense states sharded over DP x CP 8" in out


def test_estimate_of_one_stage_keeps_every_stages_totals():
    # A skill trial asked `estimate --stage 7 --json` for one stage's breakdown and got no
    # stage_total_bytes: a second run without --stage was needed for the others.
    args = ("estimate", "--model", "llama3-8b", "--pp", "4", "--json")
    every = json.loads(run(*args, check_rc=0).stdout)["estimates"][0]
    one = json.loads(run(*args, "--stage", "3", check_rc=0).stdout)["estimates"][0]
    assert one["stage"] == 3 and len(every["stage_total_bytes"]) == 4
    assert one["stage_total_bytes"] == every["stage_total_bytes"]
    assert one["total_bytes"] == every["stage_total_bytes"][3]
    shown = run(*args[:-1], "--stage", "3", check_rc=0).stdout
    binding = every["stage"]
    assert ("(the stage that holds the most)" in shown) is (binding == 3)


def test_a_megatron_reading_planned_for_torchtitan_says_its_figures_are_not_fsdp2s():
    # A skill trial planned `--model llama3-8b --dp 8 --format torchtitan`: the TOML it got
    # shards over the 8 ranks (FSDP2) while the figures kept weights and gradients whole.
    args = (
        "plan",
        "--model",
        "llama3-8b",
        "--dp",
        "8",
        "--dtype",
        "bf16",
        "--distributed-optimizer",
    )
    proc = run(*args, "--gpu-memory-gb", "95", "--format", "torchtitan", check_rc=0)
    assert "torchtitan shards them and the optimizer states" in proc.stderr
    proc = run(*args, "--gpu-memory-gb", "95", check_rc=0)
    assert "torchtitan shards" not in proc.stderr
