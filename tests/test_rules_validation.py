"""Rules RK050-RK077: Megatron's validation messages; the PyTorch / Hugging Face checkpoint API."""

from __future__ import annotations

import pytest
from rule_helpers import (
    LLAMA3_8B_SELECTIVE,
    LLAMA3_70B_MLM_1031,
    MIXTRAL_8X7B_MLP,
    cites,
    covers,
    ids,
    intended_patch,
    run,
    spec_patch,
    text,
    top,
)

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import (
    ErrorEvent,
    Evidence,
)

# =============================================================================================
# RK050-RK064: Megatron's validation messages
# =============================================================================================

VALIDATION_CASES = [
    # (rule, data file, expected patch or None) - the tc-measured-* blocks are Megatron's
    # messages measured on core_v0.14.0 and main (real-formats.md, TransformerConfig).
    ("RK050", "tc-measured-full-no-method", spec_patch("full", "uniform", 1)),
    ("RK051", "tc-measured-full-no-num-layers", spec_patch("full", "uniform", 1)),
    ("RK052", "tc-measured-selective-with-num-layers", None),
    ("RK053", "tc-measured-full-bad-method", None),
    ("RK053", "tc-measured-bad-granularity", None),
    ("RK054", "tc-measured-selective-bad-module", None),
    ("RK055", "tc-measured-moe-act-without-grouped-gemm", {"moe_grouped_gemm": True}),
    ("RK056", "tc-measured-mla-up-proj-without-mla", None),
    ("RK057", "tc-measured-shared-experts-with-overlap", {"moe_shared_expert_overlap": False}),
    ("RK058", "mlm-rule17-delayed-scaling", {"fp8_recipe": "tensorwise"}),
    ("RK059", "tc-measured-cpu-offload-with-recompute", {"cpu_offloading": False}),
    ("RK060", "tc-measured-distribute-saved-with-sp", {"distribute_saved_activations": False}),
    ("RK060", "mlm-rule27-distribute-saved", {"distribute_saved_activations": False}),
    ("RK061", "mlm-rule20-fine-grained-offloading", None),
    ("RK062", "mlm-rule29-cuda-graphs", {"cuda_graph_impl": "none"}),
    ("RK062", "mbridge-skill-cuda-graph", {"cuda_graph_impl": "none"}),
    (
        "RK063",
        "tc-measured-moe-layer-recompute-with-full",
        spec_patch("selective", None, None, ["moe"]),
    ),
]


@pytest.mark.parametrize("rule_id, name, patch", VALIDATION_CASES)
@covers(*sorted({c[0] for c in VALIDATION_CASES}))
def test_megatron_validation_message(rule_id, name, patch):
    d = run(text(name))
    f = top(d)
    assert f.rule == rule_id and f.category == "invalid_config"
    assert f.raw_confidence == 0.95  # the rule's own; calibrated: test_doctor_verdict.py
    assert d.to_json()["verdict"] == "diagnosed"  # Megatron's own message decides
    # the evidence quotes Megatron's message
    message = next(e.message for e in d.evidence.errors)
    assert message[:60] in f.evidence
    if patch is not None:  # (entries the run already has are left out of config_patch)
        assert intended_patch(f) == patch


CONFIG_CASES = [
    # (rule, config text, name, quoted message) - configs Megatron would reject, caught
    # before a run by the kit's own validation (Megatron's messages).
    (
        "RK050",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  recompute_granularity: full\n  recompute_num_layers: 1\n",
        "bridge.yaml",
        'recompute_method must be "block" or "uniform"',
    ),
    (
        "RK055",
        "model.num_layers=32 model.hidden_size=4096 model.num_attention_heads=32 "
        "model.num_moe_experts=8 model.moe_router_topk=2 model.recompute_granularity=selective "
        "model.recompute_modules=[moe_act,layernorm]",
        "overrides.txt",
        "only supported with moe_grouped_gemm",
    ),
    (
        "RK058",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  num_moe_experts: 64\n  moe_grouped_gemm: true\n  fp8: hybrid\n  fp8_recipe: delayed\n"
        "  recompute_granularity: selective\n  recompute_modules: [moe_act, layernorm]\n",
        "fp8.yaml",
        "Delayed scaling does not support",
    ),
    (
        "RK059",
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
        "--cpu-offloading-num-layers 8 --recompute-activations",
        "train.sh",
        "CPU offloading does not work when activation recomputation is enabled",
    ),
    (
        "RK061",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  cpu_offloading: true\n  cpu_offloading_num_layers: 4\n"
        "  fine_grained_activation_offloading: true\n  offload_modules: [core_attn]\n",
        "offload.yaml",
        "cannot be enabled with cpu_offloading",
    ),
]


@pytest.mark.parametrize("rule_id, config, name, quoted", CONFIG_CASES)
@covers(*sorted({c[0] for c in CONFIG_CASES}))
def test_megatron_validation_of_a_config(rule_id, config, name, quoted):
    d = run(config=config, config_name=name)
    f = top(d)
    assert f.rule == rule_id and f.category == "invalid_config"
    assert f.raw_confidence == 0.9
    assert d.to_json()["verdict"] == "diagnosed"  # the kit ran Megatron's validation
    assert f.evidence.startswith("Megatron would reject this config")
    cites(f, quoted)


@covers("RK050", "RK051", "RK052", "RK053", "RK054", "RK055", "RK056", "RK057")
def test_validation_rules_silent_on_valid_configs():
    # Megatron-LM#1031's full/uniform/5 and the 8B selective launcher are valid.
    for cfg in (LLAMA3_70B_MLM_1031, LLAMA3_8B_SELECTIVE, MIXTRAL_8X7B_MLP):
        d = run(config=cfg, config_name="x.sh", gpu_memory_gb=80)
        assert not [f for f in d.findings if f.category == "invalid_config"], ids(d)


@covers("RK064")
def test_rk064_index_error_inside_megatron_recompute():
    # https://github.com/modelscope/ms-swift/issues/6149: IndexError from _get_layer under
    # tensor_parallel.checkpoint (Megatron core_v0.13.1).
    f = top(run(text("msswift-6149")))
    assert f.rule == "RK064" and f.category == "framework_bug"
    cites(f, "index 36 is out of range")


@covers("RK064")
def test_rk064_names_the_non_divisible_layer_count():
    # https://github.com/NVIDIA/Megatron-LM/issues/2294: the error and the config.
    d = run(text("mlm-2294-error"), config=text("mlm-2294-config"), config_name="repro.py")
    f = top(d)
    assert f.rule == "RK064"
    cites(f, "index 24 is out of range", "24 layers", "recompute_num_layers 7")


@covers("RK064")
def test_rk064_not_for_an_index_error_in_a_data_loader():
    # https://github.com/Atcold/pytorch-PPUU/issues/21: "list index out of range" in
    # dataloader.py - nothing to do with recompute.
    d = run(text("ppuu-21"))
    assert d.evidence.errors and d.evidence.errors[0].type == "IndexError"
    assert "RK064" not in ids(d)


# =============================================================================================
# RK070-RK077: PyTorch / Hugging Face checkpoint API
# =============================================================================================

SELECTIVE_DEFAULT = {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
CHECKPOINT_CASES = [
    ("RK070", "ckpt-local-grad-reentrant", "checkpoint_api_misuse", {"use_reentrant": False}),
    ("RK071", "ckpt-local-no-input-grad", "checkpoint_api_misuse", {"use_reentrant": False}),
    # The warning alone (no error): usually harmless (frozen blocks, no_grad), RK099 says so.
    (
        "RK099",
        "bnb-182",
        "informational",
        {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    ),
    # the use_reentrant warning alone (PyTorch >= 2.4 wording): informational, RK672 (RK072
    # reads it only beside a failure)
    (
        "RK672",
        "ckpt-local-use-reentrant-missing",
        "informational",
        {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    ),
    ("RK073", "ckpt-local-kwargs-reentrant", "checkpoint_api_misuse", {"use_reentrant": False}),
    ("RK074", "ckpt-local-ddp", "checkpoint_api_misuse", {"use_reentrant": False}),
    (
        "RK075",
        "ckpt-local-metadata",
        "nondeterministic_recompute",
        {"code": "torch.utils.checkpoint.set_checkpoint_debug_enabled(True)"},
    ),
    (
        "RK077",
        "chatglm-tuning-56",
        "invalid_config",
        {"command": "pip install -U transformers"},
    ),
    (
        "RK077",
        "transformers-17464",
        "invalid_config",
        {"command": "pip install -U transformers"},
    ),
    ("RK081", "roformer-39", "framework_bug", SELECTIVE_DEFAULT),
    ("RK081", "nemo-speech-14241", "framework_bug", SELECTIVE_DEFAULT),
    (
        "RK082",
        "mbridge-2684",
        "invalid_config",
        {"cpu_offloading_activations": True, "cpu_offloading_weights": False},
    ),
]


@pytest.mark.parametrize("rule_id, name, category, patch", CHECKPOINT_CASES)
@covers(*sorted({c[0] for c in CHECKPOINT_CASES}))
def test_message_rules(rule_id, name, category, patch):
    d = run(text(name))
    f = top(d)
    assert f.rule == rule_id and f.category == category
    assert f.config_patch == patch
    assert f.evidence.startswith('The log says: "')
    first = d.evidence.errors[0]
    assert first.message[:50] in f.evidence


@covers("RK070", "RK071", "RK072", "RK073", "RK074", "RK075", "RK077", "RK081", "RK082")
def test_message_rules_silent_on_an_oom():
    # None of the message rules fires on a plain OOM (real-formats.md oom-pt-16417-comment).
    d = run(text("oom-pt-16417-comment"))
    message_rules = {c[0] for c in CHECKPOINT_CASES} | {c[0] for c in VALIDATION_CASES}
    assert not message_rules & set(ids(d))


@covers("RK076")
def test_rk076_use_cache_warning_through_the_parser():
    # transformers logs this warning as a bare line (logger.warning_once); the parser knows it.
    # https://github.com/OEvortex/unsloth/issues/18: the warning behind a tqdm bar.
    assert "RK076" in ids(run(text("unsloth-18")))


@covers("RK076")
def test_rk076_use_cache_warning_as_an_event():
    # The same verbatim message (unsloth#18), handed over as the warning event it is.
    line = text("unsloth-18").strip()
    message = line[line.index("`use_cache") :]
    d = diagnose(Evidence(errors=[ErrorEvent("WARNING", message, kind="warning")]))
    f = top(d)
    assert f.rule == "RK076" and f.category == "informational"
    assert f.config_patch == {"use_cache": False}
    cites(f, "`use_cache=True` is incompatible with gradient checkpointing")
