"""The known-problems table (recompute_kit/doctor/known_problems.yaml) and its engine
(rules/known_problems.py): every row has a verbatim snippet that fires it, every row's link is
one of the URLs its rule cited, and a stated release that has the fix stops a row.

Texts are tests/data/rules/*.txt, verbatim from the URL that tests/rule_sources.py names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from rule_helpers import (
    SOURCES,
    covers,
    ids,
    run,
    text,
    top,
)
from rule_sources import LOCAL

from recompute_kit.doctor.rules import (
    CATEGORIES,
    RULES,
)
from recompute_kit.doctor.rules.known_problems import KNOWN_PROBLEMS, TABLE, load

# Row id -> verbatim snippets (tests/data/rules/<name>.txt) that fire it.
SIGNATURE_TEXTS: dict[str, tuple[str, ...]] = {
    "RK081": ("roformer-39", "nemo-speech-14241"),
    "RK082": ("mbridge-2684",),
    "RK094": ("i12-piccolo-8", "fr-reduced-twice-weight-sharing-ds"),
    "RK096": ("i12-te-3284",),
    "RK154": ("i13-pt-123548",),
    "RK155": ("i13-pt-128478",),
    "RK158": ("i13-open-instruct-838",),
    "RK104": ("i12-llamafactory-1916",),
    "RK156": ("fr-use-reentrant-old-kohya",),
    "RK672": ("ckpt-local-use-reentrant-missing",),  # PyTorch's own warning, run here
    "RK814": ("kp-unsloth-1797-pinned-oom",),
    # round w: collected from the trackers, not from corpus cases
    "RK820": ("kp-w-kohya-1687-ddpoptimizer-higher-order-op",),
    "RK823": ("kp-w-hf-trainer-fsdp-ac-and-gc",),
    "RK825": ("kp-w-examples-1210-offload-to-cpu",),
    # round x: collected from the trackers, not from corpus cases
    "RK830": ("kp-x-hf-27596-set-gc-enable",),
    "RK832": ("kp-x-trl-3683-caching-incompatible-gc",),
    "RK833": ("kp-x-pt-122057-expandable-unsupported",),
    "RK834": ("kp-x-unsloth-1446-driver-error",),
    "RK835": ("kp-x-pt-142104-ca-reentrant",),
    "RK836": ("kp-x-pt-142862-sac-backward-extra",),
    "RK837": ("kp-x-pt-154306-cudagraph-ckpt",),
    "RK839": ("kp-x-ds-5662-invalidate-trace",),
    "RK840": ("kp-x-unsloth-1613-requires-grad-hook",),
    "RK841": ("kp-x-unsloth-zoo-712-output-grads",),
    "RK842": ("kp-x-titan-1631-flex-uncompiled",),
    "RK843": ("kp-x-titan-1408-flex-sac",),
    "RK844": ("kp-x-mlm-996-offload-context",),
    "RK845": ("kp-x-mlm-2582-fp8-param-gather-offload",),
    "RK846": ("kp-x-mlm-5083-hybrid-opt-none",),
    "RK848": ("kp-x-mlm-2758-cudagraph-grad",),
    "RK849": ("kp-x-mlm-1708-te-offload-weights",),
    "RK850": ("kp-x-nemorl-2279-nvte-offload-v1",),
    "RK851": ("kp-x-apex-1314-fused-wgrad",),
}


def test_every_row_is_well_formed_and_in_the_catalog():
    by_id = {r.id: r for r in RULES}
    for p in KNOWN_PROBLEMS:
        row = p.row
        assert row["category"] in CATEGORIES, row["id"]
        assert 0 < row["confidence"] <= 1, row["id"]
        assert row["links"] and all(u.startswith("https://github.com/") for u in row["links"])
        rule = by_id[row["id"]]  # registered as a rule: the catalog and the skill table list it
        assert rule.references == tuple(row["links"]) and rule.fix == row["workaround"]
        # a '#' in an unquoted YAML value starts a comment: no text may end cut short
        for key in ("title", "symptom", "cause", "confirm", "workaround"):
            assert row[key].strip() and not row[key].endswith(("(PR", "(", ",")), (row["id"], key)


def test_every_row_has_a_verbatim_signature_test():
    assert set(SIGNATURE_TEXTS) == {p.id for p in KNOWN_PROBLEMS}
    for rid, names in SIGNATURE_TEXTS.items():
        for name in names:
            # a real source, with its URL, or the real tool's output reproduced (rule_sources.LOCAL)
            assert SOURCES[name].startswith("https://") or SOURCES[name] == LOCAL, name
            d = run(text(name))
            assert top(d).rule == rid, (rid, name, ids(d))


@pytest.mark.parametrize("rid", sorted(SIGNATURE_TEXTS))
def test_a_stated_fixed_release_stops_the_row(rid):
    # Every row, given a fixed_in its paste's library has reached, does not fire as a cause and
    # says so in the notes; the same row with a later fixed_in fires as before.
    problem = next(p for p in KNOWN_PROBLEMS if p.id == rid)
    library = problem.row.get("library") or "torch"
    said = "torch" if library not in ("torch", "megatron", "deepspeed") else library
    log = text(SIGNATURE_TEXTS[rid][0]) + f"\nI am on {said} 0.0.9\n"
    d = run(log)
    assert rid in ids(d)  # the shipped row: 0.0.9 is before any fix it knows
    from recompute_kit.doctor.engine import build_context

    ctx = build_context(d.evidence)
    fixed = dataclasses.replace(problem, row={**problem.row, "library": said, "fixed_in": "0.0.9"})
    assert fixed.match(ctx) is None
    assert any(rid in n and "fixed in 0.0.9" in n for n in ctx.evidence.notes)
    later = dataclasses.replace(problem, row={**problem.row, "library": said, "fixed_in": "0.1"})
    m = later.match(ctx)
    assert m is not None and f"{said} 0.0.9 is an affected release (fixed in 0.1)" in m.evidence


@covers("RK155")
def test_rk155_torch_with_the_fix_is_not_a_cause():
    # pytorch#128478 (RK155's verbatim text) with the reporter's torch stated: before 2.4 the
    # row fires; at 2.4 (pytorch PR #128671, the fix) it does not, and the notes say why.
    before = run(text("i13-pt-128478") + "\ntorch 2.3.1\n")
    f = top(before)
    assert f.rule == "RK155" and "torch 2.3.1 is an affected release (fixed in 2.4)" in f.evidence
    after = run(text("i13-pt-128478") + "\ntorch 2.4.0\n")
    assert "RK155" not in ids(after)
    assert any("RK155" in n and "fixed in 2.4" in n for n in after.evidence.notes)


def test_affected_from_bounds_the_row_below():
    (p,) = load(
        yaml.safe_dump(
            [
                {
                    "id": "RK999",
                    "title": "t",
                    "category": "framework_bug",
                    "confidence": 0.5,
                    "symptom": "s",
                    "cause": "c",
                    "confirm": "c",
                    "workaround": "w",
                    "links": ["https://github.com/pytorch/pytorch/issues/1"],
                    "library": "torch",
                    "affected_from": "2.1",
                    "fixed_in": "2.4.1",
                    "signature": {"message": ["x"]},
                }
            ]
        )
    )
    assert [p.affects(v) for v in ("2.0.1", "2.1", "2.3.1+cu121", "2.4.0", "2.4.1", "v2.5")] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert p.affects("nightly")  # unreadable: assume affected


def test_a_row_with_an_unknown_field_or_no_signature_is_refused():
    row = {"id": "RK998", "signature": {"message": ["x"]}, "oops": 1}
    with pytest.raises(AssertionError, match="unknown fields"):
        load(yaml.safe_dump([row]))
    with pytest.raises(AssertionError, match="needs a message or env"):
        load(yaml.safe_dump([{"id": "RK998", "signature": {}}]))


def test_the_table_ships_as_package_data():
    from pathlib import Path

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert TABLE in pyproject


# ---- the table's rows, one or more tests each (moved from the round-named modules) ----


# =============================================================================================
# RK094: ZeRO-2 reduces a shared weight's gradient twice under the reentrant checkpoint
# =============================================================================================


@covers("RK094")
def test_fresh_rk094_one_layer_reused_six_times_under_zero2():
    # https://github.com/deepspeedai/DeepSpeed/issues/2103 (one layer's weights reused by six
    # checkpointed layers; "AssertionError: The parameter 97 has already been reduced")
    f = top(run(text("fr-reduced-twice-weight-sharing-ds")))
    assert f.rule == "RK094" and f.category == "checkpoint_api_misuse"
    assert "share the weight" in f.fix
    assert f.config_patch["zero_optimization"] == {"stage": 1}


@covers("RK094")
def test_rk094_parameter_reduced_twice_deepspeed():
    f = top(run(text("i12-piccolo-8")))
    assert f.rule == "RK094" and f.category == "checkpoint_api_misuse"
    assert f.config_patch["zero_optimization"] == {"stage": 1}


@covers("RK096")
def test_rk096_te_fp8_recompute_keyerror():
    f = top(run(text("i12-te-3284")))
    assert f.rule == "RK096" and f.category == "nondeterministic_recompute"
    assert "fp8_autocast" in f.fix


@covers("RK154")
def test_rk154_max_split_with_expandable_segments():
    # pytorch#123548: PYTORCH_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True.
    f = top(run(text("i13-pt-123548")))
    assert f.rule == "RK154" and f.category == "framework_bug"
    assert f.config_patch == {"env": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}}


@covers("RK155")
def test_rk155_checkpoint_on_xpu_hits_the_cuda_path():
    # pytorch#128478: test_gradient_checkpointing - RuntimeError: PyTorch was compiled without
    # CUDA support.
    f = top(run(text("i13-pt-128478")))
    assert f.rule == "RK155" and f.category == "framework_bug"
    assert "DefaultDeviceType" in f.fix and "upgrade torch" in f.fix.lower()


@covers("RK158")
def test_rk158_nccl_cumem_warning_from_vllm():
    # open-instruct PR #838: vLLM's "WARNING 07-29 15:39:27 [env_override.py:17] ..." line.
    d = run(text("i13-open-instruct-838"))
    assert d.evidence.errors[0].frames == ["env_override.py:17"]
    f = top(d)
    assert f.rule == "RK158" and f.category == "informational"


@covers("RK104")
def test_rk104_old_checkpointing_format_warning_is_informational():
    d = run(text("i12-llamafactory-1916"))
    assert d.evidence.errors and d.evidence.errors[0].kind == "warning"
    f = top(d)
    assert f.rule == "RK104" and f.category == "informational" and f.config_patch
    # https://github.com/hiyouga/LlamaFactory/issues/1916: the notice alone is informational;
    # the same notice beside a real OOM (pytorch#16417's message) is not the run's problem
    d = run(text("i12-llamafactory-1916") + "\n" + text("oom-pt-16417-comment"))
    assert "RK104" not in ids(d)


@covers("RK814")
def test_rk814_unsloth_offloaded_checkpointing_runs_out_of_pinned_memory():
    # https://github.com/unslothai/unsloth/issues/1797 (the reporter's notebook traceback,
    # verbatim): a bare "RuntimeError: CUDA error: out of memory" inside unsloth_zoo's gradient
    # checkpointing with use_gradient_checkpointing="unsloth" under WSL2; danielhanchen:
    # pinned host memory runs out (unsloth-zoo PR #1257 falls back to pageable memory)
    f = top(run(text("kp-unsloth-1797-pinned-oom")))
    assert f.rule == "RK814" and f.category == "framework_bug"
    assert f.config_patch == {"use_gradient_checkpointing": True}


@covers("RK820", "RK823", "RK825")
def test_round_w_rows_name_their_cause_over_the_default_readings():
    # Before these rows the same pastes got RK420's default reading ("upgrade the library in
    # the innermost frames"); each now names the known cause. (The round's fourth find,
    # pytorch#159359, FSDP2 recomputing in fp32, is RK075's already: test_rules_checkpoint_api.)
    d = run(text("kp-w-kohya-1687-ddpoptimizer-higher-order-op"))
    assert top(d).rule == "RK820" and "optimize_ddp" in top(d).fix
    d = run(text("kp-w-hf-trainer-fsdp-ac-and-gc"))
    assert top(d).rule == "RK823" and top(d).config_patch == {"gradient_checkpointing": False}
    d = run(text("kp-w-examples-1210-offload-to-cpu"))
    assert top(d).rule == "RK825" and top(d).category == "checkpoint_api_misuse"


ROUND_X = {rid: names for rid, names in SIGNATURE_TEXTS.items() if "kp-x-" in names[0]}


@covers(*ROUND_X)
@pytest.mark.parametrize("rid", sorted(ROUND_X))
def test_round_x_rows_quote_their_line_and_keep_their_category(rid):
    # each row collected from the trackers: its verbatim text makes it the top finding, with
    # the row's category and workaround, quoting the line it matched
    row = next(p.row for p in KNOWN_PROBLEMS if p.id == rid)
    f = top(run(text(ROUND_X[rid][0])))
    assert (f.rule, f.category, f.fix) == (rid, row["category"], row["workaround"])
    assert f.evidence.startswith('The log says: "')
    # the same text with the signature's words gone does not fire the row
    cut = text(ROUND_X[rid][0])
    for pattern in next(p for p in KNOWN_PROBLEMS if p.id == rid).message:
        cut = pattern.sub("", cut)
    assert rid not in ids(run(cut))


@covers("RK848")
def test_a_line_row_keeps_its_where():
    # RK848's line is PyTorch's generic refusal; only beside CUDA graphs is it Megatron's bug.
    # A MeanFlow jvp through a reentrant checkpoint (tests/scenarios/api_meanflow_jvp_grad.yaml)
    # is the API misuse, not this row.
    line = (
        "RuntimeError: Checkpointing is not compatible with .grad() or when an `inputs` "
        "parameter is passed to .backward()\n"
    )
    assert "RK848" not in ids(run(line))
    assert "RK848" in ids(run(line + "--cuda-graph-impl transformer_engine\n"))


def test_a_notice_does_not_silence_the_default_reading():
    # https://github.com/meta-pytorch/torchtune/issues/1965 (a development corpus case): PyTorch's
    # "expandable_segments not supported on this platform" notice beside a resolved config; the
    # notice (RK833, informational) fires, and the default reading of the config still follows
    # it and leads (before: the notice alone, the fallback never asked)
    cases = Path(__file__).parent / "corpus" / "cases"
    case = cases / "p_torchtune_1965_vision_lora_oom_long_sample_midepoch.yaml"
    d = run(yaml.safe_load(case.read_text())["artefacts"])
    assert [f.rule for f in d.findings][:2] == ["RK170", "RK833"]
