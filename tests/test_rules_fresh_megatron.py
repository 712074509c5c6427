"""Fresh public pastes for the Megatron families (Megatron's argument checks and validation
messages, the uniform recompute loop's remainder, measured recompute cost): each text is another
thread than the rule's own sources and tests, copied verbatim into tests/data/rules/fg-*.txt (its
URL in `SOURCES` and in the test's comment). Each test asserts the top finding's rule / category
and that the fix names the remedy the thread (or the message itself) gives."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.measured import _recompute_side

# =============================================================================================
# RK097: Megatron's argument checks, with or without their frames, in every version's wording
# =============================================================================================


@covers("RK097")
def test_fresh_rk097_title_and_cut_validate_args_frame():
    # https://github.com/modelscope/ms-swift/issues/5737: the message only in the issue title
    # (older wording "pipeline-model-parallel size"), the traceback cut after validate_args.
    f = top(run(text("fg-pp-divisible-swift5737")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    assert "num_layers_in_first_pipeline_stage" in f.config_patch


@covers("RK097")
def test_fresh_rk097_model_construction_check():
    # https://github.com/NVIDIA-BioNeMo/bionemo-recipes/issues/784: the check raised from
    # get_num_layers_to_build (transformer_block.py), underscores in the setting's name.
    f = top(run(text("fg-pp-divisible-bionemo784")))
    assert f.rule == "RK097" and "pipeline_model_parallel_size" in f.evidence
    assert "num_layers_in_last_pipeline_stage" in f.config_patch


@covers("RK097")
def test_fresh_rk097_new_wording_states_values():
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5884: newer wording with the values
    # ("num_layers=60 should be divisible by config.pipeline_model_parallel_size=8"), no config:
    # the uneven split is computed from the message's numbers (the PR set first/last stages).
    f = top(run(text("fg-pp-divisible-mbridge5884")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    first = f.config_patch["num_layers_in_first_pipeline_stage"]
    last = f.config_patch["num_layers_in_last_pipeline_stage"]
    assert first + last + 6 * (60 // 8) == 60


@covers("RK097")
def test_fresh_rk097_sequence_parallel_message_without_frames():
    # https://github.com/NVIDIA/NeMo-Framework-Launcher/pull/309: the ValueError quoted in a
    # PR ("When using expert parallelism and tensor parallelism, sequence parallelism must be
    # used"); the PR's fix enables sequence parallelism.
    f = top(run(text("fg-ep-tp-sp-launcher309")))
    assert f.rule == "RK097" and f.config_patch == {"sequence_parallel": True}


def test_rk097_not_on_a_requirement_about_no_parallel_setting():
    # A requirement that names no parallel setting is not Megatron's argument check.
    f = run("AssertionError: batch must be a dict of tensors")
    assert "RK097" not in [x.rule for x in f.findings]


# =============================================================================================
# RK064: the uniform recompute loop runs past the last layer, reported in words
# =============================================================================================


@covers("RK064")
def test_fresh_rk064_reported_in_words():
    # https://github.com/NVIDIA/Megatron-LM/issues/1807: "List out of range" when
    # num_layers_per_pipeline_rank % recompute_num_layers != 0, no traceback; fixed upstream by
    # clamping the chunk (Megatron-Core >= 0.17).
    f = top(run(text("fg-uniform-remainder-mlm1807")))
    assert f.rule == "RK064" and f.category == "framework_bug"
    assert "megatron-core" in f.config_patch["command"]


def test_rk064_not_on_an_out_of_range_without_the_remainder():
    report = "IndexError: list index out of range\nin the data loader, recompute_num_layers = 2"
    assert "RK064" not in [x.rule for x in run(report).findings]


# =============================================================================================
# RK231 / measured tables: the recompute switch's own state beside other on/off options
# =============================================================================================


@covers("RK231")
def test_fresh_rk231_recompute_state_beside_overlap_state():
    # https://github.com/NVIDIA/Megatron-LM/pull/6429: rows "overlap off, recompute on" and
    # "overlap on, recompute off": the recompute run is faster at lower memory.
    f = top(run(text("fg-recompute-on-off-table-mlm6429")))
    assert f.rule == "RK231" and f.category == "informational"
    assert "recompute on" in f.config_patch["recompute"]


def test_recompute_side_reads_the_recompute_switch():
    assert _recompute_side("C. non-overlap baseline — overlap off, recompute on") is True
    assert _recompute_side("A. overlap on, recompute off (context)") is False
    assert _recompute_side("no recompute") is False
    assert _recompute_side("1 card+recompute") is True
