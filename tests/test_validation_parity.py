"""Validation parity: 1100 generated configs through Megatron-Core 0.16.1's TransformerConfig and
the kit's `validate()` (what `recompute-kit validate` runs) must give the same verdict.

Not counted, but listed: configs whose outcome depends on Transformer Engine (Megatron asks TE
for its version), configs whose verdict changed between 0.16.1 and the v0.19 rule the kit
follows, and the kit's own rules (full recompute with recompute_num_layers < 1; shapes its
layers cannot run, which Megatron's TransformerConfig accepts).
`python benchmarks/validation_parity.py` prints the table.
"""

import json
import warnings

import pytest

from recompute_kit import cli
from recompute_kit.engines import megatron as engine
from recompute_kit.engines.megatron_validation import (
    Verdict,
    kit_config,
    kit_verdict,
    megatron_verdict,
    transformer_config_kwargs,
)
from recompute_kit.engines.validation_parity import (
    FAMILIES,
    VERSION_NOTES,
    compare,
    generate_configs,
    version_message_differences,
)

pytestmark = pytest.mark.skipif(
    not engine.available(), reason="megatron-core is not installed (make setup installs it)"
)

N_CONFIGS = 1100
SEED = 0
# Measured on megatron-core 0.16.1 with this seed (benchmarks/validation_parity.py), rounded
# down to a whole percent: 1040 counted configs, every verdict equal (988/1037, 95.3%, before
# the kit learnt Megatron's uneven-pipeline and top-1 routing rules and stopped refusing MLA
# and kv_channels shapes it can run); 596 of the 648 messages of configs both reject equal
# (92.0%).
VERDICT_AGREEMENT_FLOOR = 1.00
MESSAGE_AGREEMENT_FLOOR = 0.91

# Every rule the generator must reach, as the start of Megatron's own message.
MEGATRON_RULES = (
    "Cannot use sequence parallelism without tensor parallelism",
    "CPU offloading can be done only for layers less than",
    "Currently there is no support for Pipeline parallelism with CPU offloading",
    "CPU offloading does not work when activation recomputation is enabled",
    "When using recompute_granuarlity:",
    "recompute_method: chunk must be",
    "Using recompute_granularity: full so recompute_method must be",
    "When using recompute_granularity: full recompute_num_layers must be between",
    "When using recompute_granularity: selective recompute_num_layers must be None.",
    "distribute_saved_activations: True must be false when sequence parallel is enabled",
    "Invalid choices for recompute_modules:",
    "moe_act in recompute_modules is only supported with moe_grouped_gemm.",
    "mla_up_proj in recompute_modules is only supported with multi_latent_attention.",
    "shared_experts recompute cannot work with --moe-shared-expert-overlap.",
    "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
    "Do not set --moe-layer-recompute with full recompute granularity.",
    "fine_grained_activation_offloading cannot be enabled with cpu_offloading.",
    "Invalid choices for offload_modules:",
    "attn_proj cannot be set to offload_modules alone without core_attn",
    "Invalid cuda graph implementation: te",
    "CUDA graphs not supported with CPU offloading.",
    "To use full iteration cuda graph, please use cuda_graph_impl=local",
    "moe cuda graph is only supported for MoE.",
    "full recompute is only supported with full iteration CUDA graph.",
    "moe recompute is not supported with moe_router CUDA graph with: ",
    "attention dropout is not supported with graphed attention recomputation.",
    "hidden dropout is not supported with graphed MLP/MoE recomputation.",
    "Please use --moe-router-pre-softmax when topk is 1.",
    "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be",
    "num_layers_in_first_pipeline_stage must be larger than 0",
    "num_layers_in_last_pipeline_stage must be larger than 0",
    "number of layers at first stage:",
    "number of layers at last stage:",
    "Mismatch: ",
    "number of layers at middle stage:",
    "number of layers on each middle pipeline rank:",
    "number of middle layers:",
    "num_layers: ",
    "number of layers on each pipeline rank:",
)


# Megatron-Core 0.16.1 transformer_config.py:1792-1795: the assert's message is two string
# literals on two lines without parentheses, so the second is a statement of its own and
# Megatron prints the first alone; the kit says the whole sentence its source writes.
MOE_ROUTER_CUT = "moe recompute is not supported with moe_router CUDA graph with: "
MOE_ROUTER_WHOLE = MOE_ROUTER_CUT + "--cuda-graph-impl transformer_engine."


@pytest.fixture(scope="module")
def report():
    return compare(generate_configs(N_CONFIGS, SEED))


def _describe(outcomes):
    return "\n".join(f"{o.name}: megatron {o.megatron} | kit {o.kit} | {o.flat}" for o in outcomes)


def test_generator_is_seeded_and_covers_every_family():
    first, again = generate_configs(50, seed=3), generate_configs(50, seed=3)
    assert first == again
    assert first != generate_configs(50, seed=4)
    names = [name for name, _ in generate_configs(N_CONFIGS, SEED)]
    assert len(names) == N_CONFIGS >= 1000
    assert {name.split("-")[1] for name in names} == set(FAMILIES)


def test_generated_configs_reach_every_recompute_rule(report):
    messages = [o.megatron.message or "" for o in report.outcomes]
    missing = [rule for rule in MEGATRON_RULES if not any(m.startswith(rule) for m in messages)]
    assert not missing
    accepted = sum(o.megatron.accepted for o in report.counted)
    assert 0.25 < accepted / len(report.counted) < 0.75  # valid and invalid configs both


def test_verdicts_agree_with_megatron(report):
    assert len(report.counted) >= 1000
    assert report.verdict_agreement >= VERDICT_AGREEMENT_FLOOR, _describe(report.disagreements)


def test_messages_agree_with_megatron(report):
    assert report.message_agreement >= MESSAGE_AGREEMENT_FLOOR
    # Every differing message is one the kit words on purpose (listed in the report).
    versioned = version_message_differences(report)
    for o in report.message_differences:
        if o in versioned:
            continue
        assert (o.megatron.error_type, o.megatron.message) in (
            ("AssertionError", ""),  # Megatron's bare assert on an empty offload_modules
            ("KeyError", "'bogus'"),  # Megatron's CudaGraphScope['bogus']
        ), _describe([o])
    for o in versioned:
        assert o.note in VERSION_NOTES.values()
        if o.note == VERSION_NOTES["rule22_first"]:  # v0.19's rule 22 refuses first
            assert o.kit.message.startswith("Cannot offload [")
        elif o.note == VERSION_NOTES["gdn_norm_out"]:  # a known name in v0.19: later rules
            assert "gdn_norm_out" in o.flat["recompute_modules"]
        else:  # the kit quotes v0.19, whose allowed modules add gdn_norm_out
            assert "gdn_norm_out" in (o.kit.message or "")


def test_excluded_configs_are_the_listed_kinds(report):
    te = report.of("te_cuda")
    assert te and all(o.flat.get("fp8") for o in te)
    assert all(o.megatron.depends_on == "transformer_engine" for o in te)
    version = report.of("version")
    assert version
    for o in version:  # v0.19 rule 22: 0.16.1 accepts, the kit rejects
        assert o.megatron.accepted and not o.kit.accepted
        assert o.kit.message.startswith("Cannot offload [")
    kit_only = report.of("kit_only")
    assert kit_only
    assert all(o.megatron.accepted and not o.kit.accepted for o in kit_only)
    shapes = [o for o in kit_only if o.note.startswith("the kit's layers cannot run it")]
    assert shapes and all(o.note.endswith(o.kit.message) for o in shapes)
    assert all(
        o.kit.message.startswith("recompute_num_layers must be at least 1")
        for o in kit_only
        if o not in shapes
    )
    assert len(te) + len(version) + len(kit_only) + len(report.counted) == N_CONFIGS


def test_te_version_query_is_marked_not_guessed():
    flat = dict(
        num_layers=4,
        fp8="e4m3",
        fp8_recipe="tensorwise",
        recompute_granularity="selective",
        recompute_modules=["layernorm"],
    )
    assert megatron_verdict(kit_config(flat)) == Verdict(False, depends_on="transformer_engine")
    delayed = dict(flat, fp8_recipe="delayed")  # decided before Megatron asks TE
    assert megatron_verdict(kit_config(delayed)) == Verdict(
        False,
        "ValueError",
        "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
    )


def test_moe_layer_recompute_is_normalised_like_megatron():
    config = kit_config(dict(num_layers=4, moe_layer_recompute=True))
    warnings = config.validate()
    assert config.recompute.recompute_granularity == "selective"
    assert config.recompute.recompute_modules == ["core_attn", "moe"]
    assert warnings[0].startswith("--moe-layer-recompute is deprecated.")
    # The module checks ran before the flag: Megatron accepts an unknown name that way.
    flat = dict(num_layers=4, moe_layer_recompute=True, recompute_modules=["attn"])
    assert kit_verdict(flat) == megatron_verdict(kit_config(flat)) == Verdict(True)


def test_cli_validate_gives_the_same_verdicts(report, tmp_path, capsys):
    picked = report.counted[::60]
    for o in picked:
        path = tmp_path / f"{o.name}.json"
        path.write_text(json.dumps(o.flat))
        code = cli.main(["validate", str(path), "--json"])
        result = json.loads(capsys.readouterr().out)
        assert result["valid"] is o.megatron.accepted and code == (0 if o.megatron.accepted else 1)
        if not o.megatron.accepted and o.message_agrees:
            assert result["errors"][0].splitlines()[0] == o.kit.message


# ---- rules the wider grid found the kit missing (each config: the old kit disagreed) --------

UNEVEN_PIPELINES = (
    # uneven stages together with the embedding/loss counted as a layer
    dict(
        num_layers=8, num_layers_in_first_pipeline_stage=2, account_for_loss_in_pipeline_split=True
    ),
    dict(num_layers=8, num_layers_in_first_pipeline_stage=0),
    dict(num_layers=8, num_layers_in_last_pipeline_stage=0),
    dict(
        num_layers=8, num_layers_in_first_pipeline_stage=3, virtual_pipeline_model_parallel_size=2
    ),
    dict(num_layers=8, num_layers_in_last_pipeline_stage=1, virtual_pipeline_model_parallel_size=2),
    dict(num_layers=8, num_layers_in_first_pipeline_stage=3),  # 5 layers over 3 stages
    dict(  # 3 stages in the middle of PP 5 get 12 layers: 4 each, not a multiple of VPP 3
        num_layers=18,
        pipeline_model_parallel_size=5,
        num_layers_in_first_pipeline_stage=3,
        num_layers_in_last_pipeline_stage=3,
        virtual_pipeline_model_parallel_size=3,
    ),
    dict(  # both ends given on PP 2: 2 layers left for no middle stage
        num_layers=8,
        pipeline_model_parallel_size=2,
        num_layers_in_first_pipeline_stage=3,
        num_layers_in_last_pipeline_stage=3,
    ),
    dict(num_layers=8, account_for_embedding_in_pipeline_split=True),  # 9 over PP 4
    dict(
        num_layers=8,
        account_for_loss_in_pipeline_split=True,
        virtual_pipeline_model_parallel_size=2,
    ),
    dict(  # 10 + embedding + loss = 12 over PP 4: 3 per rank, not a multiple of VPP 2
        num_layers=10,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
        virtual_pipeline_model_parallel_size=2,
    ),
)


@pytest.mark.parametrize("pipeline", UNEVEN_PIPELINES)
def test_uneven_pipeline_rules_match_megatron(pipeline):
    flat = dict(dict(pipeline_model_parallel_size=4, bf16=True), **pipeline)
    megatron = megatron_verdict(kit_config(flat))
    kit = kit_verdict(flat)
    assert not megatron.accepted and not kit.accepted
    assert kit.message == megatron.message  # the first line, verbatim


def test_valid_uneven_pipelines_stay_accepted():
    for flat in (
        dict(
            num_layers=13, num_layers_in_first_pipeline_stage=2, num_layers_in_last_pipeline_stage=3
        ),
        dict(num_layers=7, account_for_embedding_in_pipeline_split=True),
        dict(
            num_layers=14,
            account_for_embedding_in_pipeline_split=True,
            account_for_loss_in_pipeline_split=True,
            virtual_pipeline_model_parallel_size=2,
        ),
    ):
        flat = dict(pipeline_model_parallel_size=4, bf16=True, **flat)
        assert kit_verdict(flat) == megatron_verdict(kit_config(flat)) == Verdict(True)


def _megatron_accepts(flat, **extra):
    """Megatron's verdict with TransformerConfig keys the kit's mapping does not pass."""
    from megatron.core.transformer import TransformerConfig

    kwargs = dict(transformer_config_kwargs(kit_config(flat)), **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            TransformerConfig(**kwargs)
        except ValueError as exc:
            return str(exc)
    return True


def test_top1_softmax_routing_needs_pre_softmax_like_megatron():
    flat = dict(num_layers=4, num_moe_experts=4, moe_router_topk=1, add_bias_linear=False)
    megatron = megatron_verdict(kit_config(flat))
    assert megatron.message == "Please use --moe-router-pre-softmax when topk is 1."
    assert kit_verdict(flat).message == megatron.message
    # Megatron's ways out: softmax before top-k, the sinkhorn router, or sigmoid scores.
    for key, value in (
        ("moe_router_pre_softmax", True),
        ("moe_router_load_balancing_type", "sinkhorn"),
        ("moe_router_score_function", "sigmoid"),
    ):
        assert _megatron_accepts(flat, **{key: value}) is True
        assert kit_verdict(dict(flat, **{key: value})) == Verdict(True)


@pytest.mark.parametrize(
    "shape",
    (
        # MLA has no query groups (Megatron and the kit's MLA layer ignore num_query_groups)
        dict(multi_latent_attention=True, num_attention_heads=8, num_query_groups=3),
        # kv_channels sets the head size: hidden_size need not divide by the heads
        dict(hidden_size=60, num_attention_heads=8, kv_channels=16),
        dict(multi_latent_attention=True, hidden_size=60, num_attention_heads=8),
    ),
)
def test_shapes_megatron_and_the_layers_run_are_accepted(shape):
    flat = dict(num_layers=2, **shape)
    assert kit_verdict(flat) == megatron_verdict(kit_config(flat)) == Verdict(True)


@pytest.mark.slow
def test_verdicts_agree_on_a_larger_grid():
    big = compare(generate_configs(8000, seed=1))
    assert len(big.counted) > 7000
    assert not big.disagreements, _describe(big.disagreements)


def test_pipeline_layout_with_other_split_settings_is_refused_like_megatron():
    layout = "Et|tt|tt|tL"
    for other in (
        dict(num_layers_in_first_pipeline_stage=1),
        dict(account_for_loss_in_pipeline_split=True),
    ):
        flat = dict(num_layers=6, pipeline_model_parallel_size=4, bf16=True, **other)
        megatron = _megatron_accepts(flat, pipeline_model_parallel_layout=layout)
        assert megatron.startswith("pipeline_model_parallel_layout cannot be set")
        assert kit_verdict(dict(flat, pipeline_model_parallel_layout=layout)).message == megatron
    flat = dict(num_layers=6, pipeline_model_parallel_size=4, bf16=True)
    assert _megatron_accepts(flat, pipeline_model_parallel_layout=layout) is True
    assert kit_verdict(dict(flat, pipeline_model_parallel_layout=layout)) == Verdict(True)


def test_moe_router_message_is_whole():
    """selective:moe under a transformer_engine moe_router CUDA graph (the Megatron-Bridge
    Qwen3-30B-A3B 16-GPU H100 recipe's scope): Megatron refuses it and the kit says why in
    full, not Megatron's cut text ending in "with: "."""
    flat = dict(
        num_layers=4,
        num_moe_experts=4,
        moe_grouped_gemm=True,
        cuda_graph_impl="transformer_engine",
        cuda_graph_scope=["moe_router", "moe_preprocess"],
        recompute_granularity="selective",
        recompute_modules=["moe"],
    )
    megatron = megatron_verdict(kit_config(flat))
    assert not megatron.accepted and megatron.message == MOE_ROUTER_CUT
    kit = kit_verdict(flat)
    assert not kit.accepted and kit.message == MOE_ROUTER_WHOLE


# overlap_moe_expert_parallel_comm (Megatron-Bridge's MoE recipes turn it on): Megatron-Core's
# own verdict and first line for the recompute settings and layouts it refuses with it
EP_OVERLAP = dict(
    num_layers=4,
    num_moe_experts=8,
    moe_router_topk=2,
    add_bias_linear=False,
    expert_model_parallel_size=2,
    moe_token_dispatcher_type="alltoall",
    bf16=True,
    overlap_moe_expert_parallel_comm=True,
)


@pytest.mark.parametrize(
    "change",
    [
        dict(),
        dict(recompute_granularity="selective", recompute_modules=["layernorm"]),
        dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
        dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
        dict(expert_model_parallel_size=1),
        dict(moe_token_dispatcher_type="allgather"),
        dict(bf16=False),
    ],
)
def test_ep_overlap_rules_match_megatron(change):
    flat = dict(EP_OVERLAP, **change)
    megatron = megatron_verdict(kit_config(flat))
    kit = kit_verdict(flat)
    assert (kit.accepted, kit.message) == (megatron.accepted, megatron.message)
    if change.get("recompute_granularity") == "full":
        assert not kit.accepted  # the point: full recompute is refused with the overlap
