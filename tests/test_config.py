"""Config validation (Megatron-Core's rules and messages), spec strings and config files.

Expected messages are copied from Megatron-LM `megatron/core/transformer/transformer_config.py`
(TransformerConfig.__post_init__) and `megatron/training/arguments.py`, typos included; rule
numbers follow shared/reference/megatron-recompute.md section 1.2.
"""

import json
import re

import pytest

from recompute_kit.config import (
    RECOMPUTE_MODULES,
    Config,
    ConfigError,
    RecomputeConfig,
    config_from_dict,
    format_spec,
    load_config,
    parse_spec,
)
from recompute_kit.presets import PRESETS, get_preset


def cfg(**flat):
    return Config().replace(num_layers=4, **flat)


def rejects(message, strict=False, **flat):
    with pytest.raises(ConfigError) as exc:
        cfg(**flat).validate(strict=strict)
    assert str(exc.value) == message


# ---- rules 1-3: CPU offloading --------------------------------------------------------------


def test_rule1_cpu_offloading_layers_out_of_range():
    rejects(
        "CPU offloading can be done only for layers less than 4",
        cpu_offloading=True,
        cpu_offloading_num_layers=4,
    )
    rejects(
        "CPU offloading can be done only for layers less than 4",
        cpu_offloading=True,
        cpu_offloading_num_layers=-1,
    )
    cfg(cpu_offloading=True, cpu_offloading_num_layers=3).validate()


def test_rule2_cpu_offloading_with_pipeline():
    rejects(
        "Currently there is no support for Pipeline parallelism with CPU offloading",
        cpu_offloading=True,
        cpu_offloading_num_layers=1,
        pipeline_model_parallel_size=2,
    )


def test_rule3_cpu_offloading_with_recompute():
    rejects(
        "CPU offloading does not work when activation recomputation is enabled",
        cpu_offloading=True,
        cpu_offloading_num_layers=1,
        recompute_granularity="selective",
    )


# ---- rules 4-9: granularity, method, num_layers ---------------------------------------------


def test_rule4_bad_granularity_keeps_megatron_typo():
    rejects(
        'When using recompute_granuarlity: partial must be "full"or "selective".',
        recompute_granularity="partial",
    )


def test_rule5_bad_method():
    rejects(
        'recompute_method: chunked must be "block" or "uniform".',
        recompute_granularity="full",
        recompute_method="chunked",
        recompute_num_layers=1,
    )


def test_rule6_full_needs_method():
    rejects(
        'Using recompute_granularity: full so recompute_method must be "block" or "uniform"',
        recompute_granularity="full",
        recompute_num_layers=1,
    )


def test_rule7_full_needs_num_layers_message_uses_layers_per_pipeline_rank():
    rejects(
        "When using recompute_granularity: full recompute_num_layers must be between "
        "1 and num_layers_per_pipeline_rank: 2",
        recompute_granularity="full",
        recompute_method="uniform",
        pipeline_model_parallel_size=2,
    )


def test_rule7_range_is_not_checked_like_megatron():
    # Megatron only checks for None; N > layers per rank is accepted (and clamps at run time).
    cfg(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=9).validate()


def test_rule8_selective_rejects_num_layers():
    rejects(
        "When using recompute_granularity: selective recompute_num_layers must be None.",
        recompute_granularity="selective",
        recompute_num_layers=2,
    )


def test_rule9_distribute_saved_activations_with_sequence_parallel():
    rejects(
        "distribute_saved_activations: True must be false when sequence parallel is enabled: True",
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
        distribute_saved_activations=True,
        # Megatron-Core 0.16.1 first refuses sequence parallelism without TP (see the next test).
        tensor_model_parallel_size=2,
        sequence_parallel=True,
    )


def test_sequence_parallel_needs_tensor_parallel_before_any_recompute_rule():
    rejects(
        "Cannot use sequence parallelism without tensor parallelism",
        recompute_granularity="full",
        distribute_saved_activations=True,
        sequence_parallel=True,
    )


# ---- rules 10-17: recompute_modules ---------------------------------------------------------


def test_rule10_default_modules_is_core_attn_and_empty_list_is_valid():
    c = cfg(recompute_granularity="selective")
    c.validate()
    assert c.recompute.recompute_modules == ["core_attn"]
    c = cfg(recompute_granularity="selective", recompute_modules=[])
    assert c.validate() == []
    assert c.recompute.recompute_modules == []


def test_rule11_invalid_module_message():
    with pytest.raises(ConfigError) as exc:
        cfg(recompute_granularity="selective", recompute_modules=["attn"]).validate()
    # Megatron formats Python sets, whose order varies between runs.
    message = str(exc.value)
    assert message.startswith(
        "Invalid choices for recompute_modules: {'attn'}. Allowed modules are: {"
    )
    allowed = set(re.findall(r"'(\w+)'", message.split("Allowed modules are:")[1]))
    assert allowed == {*RECOMPUTE_MODULES, "gdn_norm_out"}


def test_rule11_only_checked_for_selective():
    cfg(
        recompute_granularity="full",
        recompute_method="block",
        recompute_num_layers=1,
        recompute_modules=["attn"],
    ).validate()


def test_rule12_moe_act_needs_grouped_gemm():
    rejects(
        "moe_act in recompute_modules is only supported with moe_grouped_gemm.",
        recompute_granularity="selective",
        recompute_modules=["moe_act"],
    )
    cfg(
        recompute_granularity="selective", recompute_modules=["moe_act"], moe_grouped_gemm=True
    ).validate()


def test_rule13_mla_up_proj_needs_mla():
    rejects(
        "mla_up_proj in recompute_modules is only supported with multi_latent_attention.",
        recompute_granularity="selective",
        recompute_modules=["mla_up_proj"],
    )


def test_rule14_gdn_norm_out_needs_gated_delta_net():
    rejects(
        "gdn_norm_out in recompute_modules is only supported with "
        "experimental_attention_variant='gdn' or 'gdn2'.",
        recompute_granularity="selective",
        recompute_modules=["gdn_norm_out"],
    )


def test_rule15_core_attn_is_a_warning():
    warnings = cfg(recompute_granularity="selective", recompute_modules=["core_attn"]).validate()
    assert warnings == [
        "If you are using transformer_engine as the transformer implementation, the core_attn "
        "is from transformer_engine and may be the fused version. For fused attention, you have "
        "no need to set 'core_attn' to recompute. Please check that the core_attn recompute is "
        "really needed."
    ]


def test_rule16_shared_experts_with_overlap():
    rejects(
        "shared_experts recompute cannot work with --moe-shared-expert-overlap.",
        recompute_granularity="selective",
        recompute_modules=["shared_experts"],
        moe_shared_expert_intermediate_size=128,
        moe_shared_expert_overlap=True,
    )


def test_rule17_fp8_delayed_scaling_with_layernorm_or_moe_act():
    rejects(
        "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
        recompute_granularity="selective",
        recompute_modules=["layernorm"],
        fp8="hybrid",
        fp8_recipe="delayed",
    )
    cfg(
        recompute_granularity="selective",
        recompute_modules=["layernorm"],
        fp8="hybrid",
        fp8_recipe="tensorwise",
    ).validate()


# ---- rules 20-22: fine-grained offloading ---------------------------------------------------


def test_rule20_fine_grained_offloading_excludes_cpu_offloading():
    rejects(
        "fine_grained_activation_offloading cannot be enabled with cpu_offloading.",
        fine_grained_activation_offloading=True,
        offload_modules=["core_attn"],
        cpu_offloading=True,
        cpu_offloading_num_layers=1,
    )


def test_rule20_offload_modules_must_be_known_and_non_empty():
    with pytest.raises(
        ConfigError,
        match=r"^Invalid choices for offload_modules: \{'mlp'\}\. "
        r"Allowed modules are: \{",
    ):
        cfg(fine_grained_activation_offloading=True, offload_modules=["mlp"]).validate()
    with pytest.raises(ConfigError, match="non-empty offload_modules"):
        cfg(fine_grained_activation_offloading=True).validate()


def test_rule21_attn_proj_needs_core_attn():
    rejects(
        "attn_proj cannot be set to offload_modules alone without core_attn because the "
        "input of attn_proj is the output of core_attn, which is needed in "
        "core_attn.backward().",
        fine_grained_activation_offloading=True,
        offload_modules=["attn_proj"],
    )


def test_rule22_no_offload_inside_recomputed_moe():
    rejects(
        "Cannot offload ['moe_act'] while recomputing the entire MoE layer. 'moe' in "
        "recompute_modules wraps the full MoE forward in a checkpoint, so offloading "
        "activations inside it is redundant and will cause errors. Either remove 'moe' from "
        "--recompute-modules or remove ['moe_act'] from --offload-modules.",
        fine_grained_activation_offloading=True,
        offload_modules=["moe_act"],
        recompute_granularity="selective",
        recompute_modules=["moe"],
    )


# ---- rules 26-28: command-line-only, behind strict=True -------------------------------------

FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def test_rule27_distribute_saved_activations_needs_tp():
    cfg(distribute_saved_activations=True, **FULL).validate()  # TransformerConfig accepts it
    rejects(
        "can distribute recomputed activations only across tensor model parallel groups",
        strict=True,
        distribute_saved_activations=True,
        **FULL,
    )


def test_rule27_distribute_saved_activations_needs_full():
    rejects(
        "distributed recompute activations is only application to full recompute granularity",
        strict=True,
        distribute_saved_activations=True,
        tensor_model_parallel_size=2,
        recompute_granularity="selective",
    )


def test_rule26_28_selective_rejects_method_in_strict_mode_only():
    c = dict(recompute_granularity="selective", recompute_method="uniform")
    cfg(**c).validate()
    rejects(
        "recompute method is not yet supported for selective recomputing granularity",
        strict=True,
        **c,
    )


# ---- spec strings ---------------------------------------------------------------------------

CANONICAL_SPECS = [
    "none",
    "selective",
    "selective:",
    "selective:mlp",
    "selective:layernorm,mlp",
    "selective:core_attn,mlp,layernorm",
    "full:uniform:1",
    "full:uniform:3",
    "full:block:2",
]


@pytest.mark.parametrize("spec", CANONICAL_SPECS)
def test_spec_round_trip(spec):
    rc = parse_spec(spec)
    assert format_spec(rc) == spec
    assert parse_spec(format_spec(rc)) == rc


def test_spec_meanings():
    assert parse_spec("none").recompute_granularity is None
    assert parse_spec("selective").recompute_modules == ["core_attn"]
    assert parse_spec("selective:").recompute_modules == []
    assert parse_spec("selective:core_attn").spec == "selective"
    full = parse_spec("full:block:3")
    assert (full.recompute_granularity, full.recompute_method, full.recompute_num_layers) == (
        "full",
        "block",
        3,
    )


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("selective:attention", "unknown recompute module 'attention'"),
        ("full:uniform", "malformed full recompute spec"),
        ("full:uniform:0", "malformed full recompute spec"),
        ("full:zigzag:2", "malformed full recompute spec"),
        ("partial", "malformed recompute spec 'partial'"),
        ("", "malformed recompute spec"),
    ],
)
def test_bad_specs(spec, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_spec(spec)


def test_every_spec_builds_a_valid_recompute_config():
    for spec in CANONICAL_SPECS:
        Config().with_recompute(spec).validate()
    assert isinstance(parse_spec("none"), RecomputeConfig)


# ---- config files ---------------------------------------------------------------------------


def test_flat_and_nested_files_load_the_same(tmp_path):
    body = {
        "num_layers": 6,
        "hidden_size": 128,
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 2,
    }
    (tmp_path / "flat.json").write_text(json.dumps(body))
    (tmp_path / "nested.yaml").write_text(
        "model:\n" + "".join(f"  {k}: {v}\n" for k, v in body.items())
    )
    flat, w1 = load_config(tmp_path / "flat.json")
    nested, w2 = load_config(tmp_path / "nested.yaml")
    assert flat == nested and w1 == w2 == []
    assert flat.recompute.spec == "full:block:2"


def test_unknown_keys_are_reported_by_name():
    _, warnings = config_from_dict({"num_layer": 3, "model_name": "x"})
    assert warnings[0] == "unknown config key 'num_layer' (did you mean 'num_layers'?) (ignored)"
    assert "unknown config key 'model_name'" in warnings[1]
    # Megatron-Bridge style: the model section, plus our keys found in other sections
    cfg, warnings = config_from_dict(
        {
            "model": {"num_layers": 2, "typo_key": 1},
            "train": {"micro_batch_size": 4, "lr": 1},
            "ddp": {"use_distributed_optimizer": True},
            "seed": 3,
        }
    )
    assert cfg.model.micro_batch_size == 4 and cfg.parallel.use_distributed_optimizer
    assert warnings == ["ignored top-level key 'seed'", "unknown config key 'typo_key' (ignored)"]


def test_bad_files_give_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML/JSON") as exc:
        load_config(bad)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "type.yaml").write_text("num_layers: four\n")
    c, _ = load_config(tmp_path / "type.yaml")
    with pytest.raises(ConfigError, match="num_layers must be an integer, got 'four'"):
        c.validate()


# ---- presets --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_validate(name):
    assert get_preset(name).config().validate() == []


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'gpt5'; choose from tiny-gpt"):
        get_preset("gpt5")


# ---- configs read with Megatron's own names and defaults --------------------------------------

BRIDGE_YAML = """
model:
  num_layers: 80
  hidden_size: 8192
  num_attention_heads: 64
  num_query_groups: 8
  ffn_hidden_size: 28672
  gated_linear_unit: true
  activation_func: torch.nn.functional.silu
  add_bias_linear: false
  normalization: rmsnorm
  position_embedding_type: rope
  seq_length: 8192
  tensor_model_parallel_size: 8
  pipeline_model_parallel_size: 4
  sequence_parallel: true
  bf16: true
  padded_vocab_size: 128256
train:
  micro_batch_size: 1
ddp:
  use_distributed_optimizer: true
"""


def test_bridge_yaml_keeps_swiglu_vocab_and_megatron_defaults(tmp_path):
    path = tmp_path / "llama.yaml"
    path.write_text(BRIDGE_YAML)
    cfg, warnings = load_config(path)
    m = cfg.model
    assert m.swiglu and not m.add_bias_linear and m.normalization == "RMSNorm"
    assert m.vocab_size == 128256 and m.attention_backend == "auto"  # Megatron's default
    assert cfg.parallel.use_distributed_optimizer and cfg.model.micro_batch_size == 1
    assert warnings == []
    assert not any("vocab_size" in a or "swiglu" in a for a in cfg.assumptions)
    assert any(a.startswith("attention_backend not given") for a in cfg.assumptions)


def test_missing_memory_keys_are_assumed_aloud():
    cfg, _ = config_from_dict({"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4})
    said = " ".join(cfg.assumptions)
    for key in ("vocab_size", "seq_length", "micro_batch_size", "bf16", "attention_backend"):
        assert f"{key} not given" in said


def test_data_parallel_size_from_the_launcher_world():
    cfg, _ = config_from_dict(
        {
            "nproc_per_node": 8,
            "nnodes": 4,
            "tensor_model_parallel_size": 2,
            "use_distributed_optimizer": True,
        }
    )
    assert cfg.parallel.data_parallel_size == 16
    assert any("data_parallel_size derived" in a for a in cfg.assumptions)


def test_megatron_lm_flag_names():
    cfg, warnings = config_from_dict(
        {
            "disable_bias_linear": True,
            "decoder_first_pipeline_num_layers": 1,
            "decoder_last_pipeline_num_layers": 4,
            "untie_embeddings_and_output_weights": True,
        }
    )
    p, m = cfg.parallel, cfg.model
    assert not m.add_bias_linear and not m.share_embeddings_and_output_weights
    assert (p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage) == (1, 4)
    assert warnings == []


def test_spec_lists_keep_multi_module_specs_together():
    from recompute_kit.config import parse_spec_list

    assert parse_spec_list("none,selective:core_attn,mlp,full:uniform:1") == [
        "none",
        "selective:core_attn,mlp",
        "full:uniform:1",
    ]
    assert parse_spec_list(["none", "selective:moe_act"]) == ["none", "selective:moe_act"]
    with pytest.raises(ConfigError):  # the empty control is complete: `mlp` alone is no spec
        parse_spec_list("selective:,mlp")
    with pytest.raises(ConfigError):
        parse_spec_list("none,bogus")
    with pytest.raises(ConfigError):
        parse_spec_list([1, 2])


# ---- validate --strict: settings Megatron ignores -------------------------------------------


def test_strict_warns_about_recompute_modules_written_with_full_granularity():
    full = dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=1)
    ignored = "Megatron ignores recompute_modules"
    # Written out, even as Megatron's default list: Megatron ignores it under full.
    written = cfg(recompute_modules=["core_attn"], **full).validate(strict=True)
    assert any(ignored in w and "['core_attn']" in w for w in written)
    # Left out (validation fills in the default itself) or empty: nothing to say.
    assert not any(ignored in w for w in cfg(**full).validate(strict=True))
    assert not any(ignored in w for w in cfg(recompute_modules=[], **full).validate(strict=True))
    # Not strict: no such warning.
    assert not any(ignored in w for w in cfg(recompute_modules=["mlp"], **full).validate())
