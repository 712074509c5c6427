"""Exporting recompute settings to Megatron-Bridge, Megatron-LM, NeMo and torchtitan.

Each rendering is read back the way its framework would read it (exec on a cfg namespace,
argparse with Megatron-LM's flags, yaml.safe_load + NeMo's key mapping, tomllib) and compared
with the RecomputeConfig it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from types import SimpleNamespace

import pytest
import yaml

from recompute_kit.config import ConfigError, RecomputeConfig, parse_spec
from recompute_kit.export import FORMATS, render, render_all

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

SPECS = [
    "none",
    "selective",
    "selective:",
    "selective:core_attn,mlp,layernorm",
    "selective:moe,moe_act",
    "full:uniform:1",
    "full:uniform:3",
    "full:block:2",
]
OFFLOADS = {
    "no-offload": {},
    "cpu-offload": {"cpu_offloading": True, "cpu_offloading_num_layers": 2},
    "fine-grained": {
        "fine_grained_activation_offloading": True,
        "offload_modules": ["core_attn", "attn_proj"],
    },
    "distribute": {"distribute_saved_activations": True},
}
CASES = [
    pytest.param(spec, offload, id=f"{spec}-{name}")
    for spec in SPECS
    for name, offload in OFFLOADS.items()
]


def make(spec: str, offload: dict) -> RecomputeConfig:
    return dataclasses.replace(parse_spec(spec), **offload)


def expected(rc: RecomputeConfig) -> RecomputeConfig:
    """What the exported settings must mean: Megatron's default module list made explicit for
    selective, modules irrelevant otherwise, offloading sub-settings only when switched on."""
    selective = rc.recompute_granularity == "selective"
    return RecomputeConfig(
        recompute_granularity=rc.recompute_granularity,
        recompute_method=rc.recompute_method,
        recompute_num_layers=rc.recompute_num_layers,
        recompute_modules=rc.modules if selective else None,
        distribute_saved_activations=rc.distribute_saved_activations,
        cpu_offloading=rc.cpu_offloading,
        cpu_offloading_num_layers=rc.cpu_offloading_num_layers if rc.cpu_offloading else 0,
        fine_grained_activation_offloading=rc.fine_grained_activation_offloading,
        offload_modules=(list(rc.offload_modules) if rc.fine_grained_activation_offloading else []),
    )


def body(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


# ---- header, render_all, errors ----------------------------------------------------------------


@pytest.mark.parametrize(("spec", "offload"), CASES)
def test_every_rendering_starts_with_the_spec_comment(spec, offload):
    rc = make(spec, offload)
    for fmt in FORMATS:
        text = render(rc, fmt)
        assert text.splitlines()[0] == f"# recompute-kit: {rc.spec}", fmt
        assert text.endswith("\n")


def test_render_all_is_render_for_each_format_in_order():
    rc = make("selective:core_attn,mlp", OFFLOADS["fine-grained"])
    out = render_all(rc, num_layers=8)
    assert tuple(out) == FORMATS
    for fmt in FORMATS:
        assert out[fmt] == render(rc, fmt, num_layers=8)


def test_render_does_not_change_its_input():
    rc = RecomputeConfig("selective")  # recompute_modules=None: Megatron's default
    before = dataclasses.replace(rc)
    render_all(rc)
    assert rc == before


def test_unknown_format_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as exc:
        render(parse_spec("none"), "deepspeed")
    assert str(exc.value) == (
        "unknown format 'deepspeed'; choose from megatron-bridge, nemo2, megatron-lm, "
        "megatron-deepspeed, nemo, torchtitan, torchtitan-registry, hf-trainer, llama-factory, "
        "automodel, nemo-rl, nemo-rl-dtensor, llama-factory-mca, llama-factory-mbridge"
    )
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("rc", "fragment"),
    [
        (RecomputeConfig("full", recompute_method=None, recompute_num_layers=2), "method"),
        (RecomputeConfig("full", recompute_method="uniform"), "recompute_num_layers"),
        (RecomputeConfig("selective", recompute_num_layers=1), "selective"),
        (RecomputeConfig("Full"), "granularity"),
        (RecomputeConfig(fine_grained_activation_offloading=True), "offload_modules"),
    ],
)
def test_settings_that_cannot_be_exported_raise(rc, fragment):
    for fmt in FORMATS:
        with pytest.raises(ConfigError, match=fragment):
            render(rc, fmt)


def test_num_layers_must_be_positive():
    with pytest.raises(ConfigError, match="num_layers"):
        render(parse_spec("full:block:2"), "torchtitan", num_layers=0)


# ---- Megatron-Bridge ---------------------------------------------------------------------------

BRIDGE_KEYS = {f.name for f in dataclasses.fields(RecomputeConfig)} | {
    "cpu_offloading_activations",
    "cpu_offloading_weights",
}


def run_bridge(text: str) -> SimpleNamespace:
    cfg = SimpleNamespace(model=SimpleNamespace())
    exec(compile(text, "<megatron-bridge>", "exec"), {"__builtins__": {}, "cfg": cfg})
    return cfg.model


@pytest.mark.parametrize(("spec", "offload"), CASES)
def test_megatron_bridge_round_trip(spec, offload):
    rc = make(spec, offload)
    model = run_bridge(render(rc, "megatron-bridge"))
    attrs = vars(model)
    assert set(attrs) <= BRIDGE_KEYS
    # All four recompute fields are always set, so the override replaces a recipe's settings.
    assert {
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "recompute_modules",
    } <= set(attrs)
    back = RecomputeConfig(
        **{k: v for k, v in attrs.items() if k in {f.name for f in dataclasses.fields(rc)}}
    )
    assert back == expected(rc)
    if rc.cpu_offloading:
        assert attrs["cpu_offloading_activations"] is True
        assert attrs["cpu_offloading_weights"] is False


def test_megatron_bridge_lines():
    text = render(parse_spec("selective:core_attn,mlp"), "megatron-bridge")
    assert body(text) == [
        'cfg.model.recompute_granularity = "selective"',
        'cfg.model.recompute_modules = ["core_attn", "mlp"]',
        "cfg.model.recompute_method = None",
        "cfg.model.recompute_num_layers = None",
    ]
    assert "cfg.model.recompute_granularity = None" in render(parse_spec("none"), "megatron-bridge")


@pytest.mark.parametrize(("spec", "offload"), CASES)
def test_megatron_bridge_override_line_is_the_same_settings(spec, offload):
    # The `# or as overrides:` line, as a shell passes it to a recipe's Hydra / OmegaConf
    # dotlist (Megatron-Bridge's scripts take `model.x=value` overrides): the same values
    # as the Python lines above it.
    from omegaconf import OmegaConf

    rc = make(spec, offload)
    text = render(rc, "megatron-bridge")
    line = next(ln for ln in text.splitlines() if ln.startswith("# or as overrides: "))
    dotlist = shlex.split(line.removeprefix("# or as overrides: "))
    from_hydra = OmegaConf.to_container(OmegaConf.from_dotlist(dotlist))["model"]
    assert from_hydra == vars(run_bridge(text))


# ---- Megatron-LM -------------------------------------------------------------------------------


def megatron_parser() -> argparse.ArgumentParser:
    """The flags as Megatron-LM defines them (megatron/training/arguments.py and the
    TransformerConfig-generated ones), with Megatron's allow_abbrev=False."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-num-layers", type=int, default=None)
    p.add_argument("--recompute-modules", nargs="*", type=str, default=None)
    p.add_argument("--distribute-saved-activations", action="store_true")
    p.add_argument("--cpu-offloading-num-layers", type=int, default=0)
    p.add_argument("--fine-grained-activation-offloading", action="store_true")
    p.add_argument("--offload-modules", nargs="*", type=str, default=[])
    p.add_argument("--moe-layer-recompute", action="store_true")  # deprecated; never rendered
    return p


def run_megatron_lm(text: str) -> RecomputeConfig:
    argv = shlex.split(" ".join(body(text)))
    args = megatron_parser().parse_args(argv)
    # validate_args does this (there is no --cpu-offloading: arguments.py lists cpu_offloading
    # among the TransformerConfig fields with no CLI argument)
    args.cpu_offloading = args.cpu_offloading_num_layers > 0
    if args.recompute_granularity == "selective" and args.recompute_modules is None:
        # TransformerConfig.__post_init__ (transformer_config.py:1940 at Megatron-LM HEAD):
        # no modules given means core attention
        args.recompute_modules = ["core_attn"]
    names = [f.name for f in dataclasses.fields(RecomputeConfig)]
    return RecomputeConfig(**{name: getattr(args, name) for name in names})


@pytest.mark.parametrize(("spec", "offload"), CASES)
def test_megatron_lm_round_trip(spec, offload):
    rc = make(spec, offload)
    text = render(rc, "megatron-lm")
    assert len(body(text)) <= 1  # one command-line fragment
    assert run_megatron_lm(text) == expected(rc)


def test_megatron_lm_fragments():
    assert body(render(parse_spec("selective:core_attn,mlp"), "megatron-lm")) == [
        "--recompute-granularity selective --recompute-modules core_attn mlp"
    ]
    assert body(render(parse_spec("full:uniform:1"), "megatron-lm")) == [
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    ]
    # core attention alone is the default: written without --recompute-modules, which a
    # Megatron-LM before Megatron-Core 0.12 does not have (a blind trial on a 2023 fork)
    assert body(render(parse_spec("selective:core_attn"), "megatron-lm")) == [
        "--recompute-granularity selective"
    ]
    none = render(parse_spec("none"), "megatron-lm")
    assert body(none) == []
    # every recompute flag goes (a trial: the user's --recompute-method stayed in their script)
    assert "drop --recompute-granularity, --recompute-method, --recompute-num-layers" in none
    offloaded = render(make("none", OFFLOADS["cpu-offload"]), "megatron-lm")
    assert body(offloaded) == ["--cpu-offloading-num-layers 2"]


def test_megatron_lm_leaves_out_offload_layers_when_offloading_is_off():
    # Megatron-LM switches cpu_offloading on for --cpu-offloading-num-layers > 0.
    rc = dataclasses.replace(parse_spec("full:uniform:1"), cpu_offloading_num_layers=3)
    text = render(rc, "megatron-lm")
    assert "cpu-offloading" not in text
    assert run_megatron_lm(text).cpu_offloading is False


# ---- NeMo --------------------------------------------------------------------------------------

NEMO_RECOMPUTE = {
    "activations_checkpoint_granularity": "recompute_granularity",
    "activations_checkpoint_method": "recompute_method",
    "activations_checkpoint_num_layers": "recompute_num_layers",
}


def run_nemo(text: str) -> tuple[RecomputeConfig, dict]:
    """NeMo's build_transformer_config: activations_checkpoint_* become recompute_*,
    distribute_saved_activations is always False, other TransformerConfig fields pass by name."""
    data = yaml.safe_load(text)
    assert set(data) == {"model"}
    model = data["model"]
    names = {f.name for f in dataclasses.fields(RecomputeConfig)}
    fields = {NEMO_RECOMPUTE[k]: v for k, v in model.items() if k in NEMO_RECOMPUTE}
    fields.update({k: v for k, v in model.items() if k in names})
    fields["distribute_saved_activations"] = False
    if fields.get("recompute_granularity") == "selective":
        fields.setdefault("recompute_modules", ["core_attn"])  # TransformerConfig's default
    return RecomputeConfig(**fields), model


@pytest.mark.parametrize(("spec", "offload"), CASES)
def test_nemo_round_trip(spec, offload):
    rc = make(spec, offload)
    back, model = run_nemo(render(rc, "nemo"))
    assert back == dataclasses.replace(expected(rc), distribute_saved_activations=False)
    # NeMo would override these keys from activations_checkpoint_*: never write them.
    for key in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        assert key not in model
    assert set(NEMO_RECOMPUTE) <= set(model)
    if rc.cpu_offloading:
        assert model["cpu_offloading_activations"] is True
        assert model["cpu_offloading_weights"] is False


def test_nemo_says_distribute_saved_activations_is_not_exported():
    text = render(make("full:uniform:1", OFFLOADS["distribute"]), "nemo")
    assert "distribute_saved_activations" not in yaml.safe_load(text)["model"]
    assert any("distribute_saved_activations" in line for line in text.splitlines() if "#" in line)


def test_nemo_lists_are_flow_style():
    text = render(parse_spec("selective:core_attn,mlp"), "nemo")
    assert "  recompute_modules: [core_attn, mlp]" in text.splitlines()
    # a skill trial on the launcher's Nemotron-4 340B YAML (container nemo:24.09, Megatron-Core
    # before 0.12): NeMo drops a field its TransformerConfig lacks, silently; said, and core
    # attention alone is written without the key
    assert "needs Megatron-Core >= 0.12" in text
    assert "recompute_modules" not in render(parse_spec("selective:core_attn"), "nemo")


# ---- torchtitan --------------------------------------------------------------------------------


def run_torchtitan(text: str) -> dict:
    data = tomllib.loads(text)
    assert set(data) == {"activation_checkpoint"}
    table = data["activation_checkpoint"]
    assert set(table) <= {"mode", "selective_ac_option"}
    assert table["mode"] in ("none", "selective", "full")
    if table["mode"] == "selective":
        option = table["selective_ac_option"]
        assert option == "op" or option.isdigit()
    else:
        assert "selective_ac_option" not in table
    return table


def torchtitan_checkpointed_layers(table: dict, num_layers: int) -> set[int]:
    """The layers (1-based) torchtitan wraps whole, as its _apply_layer_sac counts them."""
    if table["mode"] == "full":
        return set(range(1, num_layers + 1))
    if table["mode"] == "none":
        return set()
    k = int(table["selective_ac_option"])
    return {i for i in range(1, num_layers + 1) if not k or i % k == 0}


TORCHTITAN_MODE = {
    "none": ("none", None),
    "selective": ("selective", "op"),
    "selective:": ("none", None),
    "selective:core_attn,mlp,layernorm": ("selective", "op"),
    "selective:moe,moe_act": ("selective", "op"),
    "full:uniform:1": ("full", None),
    "full:uniform:3": ("full", None),
    "full:block:2": ("full", None),  # without num_layers: the safe choice, with a comment
}


@pytest.mark.parametrize(("spec", "offload"), CASES)
def test_torchtitan_mode(spec, offload):
    rc = make(spec, offload)
    text = render(rc, "torchtitan")
    table = run_torchtitan(text)
    assert (table["mode"], table.get("selective_ac_option")) == TORCHTITAN_MODE[spec]
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    if rc.cpu_offloading:
        assert "cpu_offloading" in comments and "no activation CPU-offloading key" in comments
    if rc.fine_grained_activation_offloading:
        assert "fine_grained_activation_offloading" in comments and "no equivalent" in comments
    if rc.distribute_saved_activations:
        assert "distribute_saved_activations: no torchtitan equivalent" in comments


def test_torchtitan_comments_on_inexact_equivalents():
    uniform = render(parse_spec("full:uniform:3"), "torchtitan")
    assert "checkpoints every layer" in uniform and "recompute buffer" in uniform
    assert "Approximate" not in render(parse_spec("full:uniform:1"), "torchtitan")
    selective = render(parse_spec("selective:core_attn,mlp"), "torchtitan")
    assert "Not module-for-module" in selective and "matmul" in selective
    block = render(parse_spec("full:block:2"), "torchtitan")
    assert "num_layers" in block and "every-k-th" in block


@pytest.mark.parametrize("num_layers", [1, 2, 3, 4, 5, 6, 7, 8, 12, 24])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_torchtitan_block_with_num_layers(n, num_layers):
    text = render(parse_spec(f"full:block:{n}"), "torchtitan", num_layers=num_layers)
    table = run_torchtitan(text)
    got = torchtitan_checkpointed_layers(table, num_layers)
    want = min(n, num_layers)  # Megatron block:N checkpoints the first min(N, L) layers
    if n >= num_layers:
        assert table == {"mode": "full"}
        assert "Approximate" not in text
    elif len(got) == want:
        assert table["mode"] == "selective"
        assert "Same number of checkpointed layers" in text
    else:
        # No every-k-th option matches: it must say so and never save less memory.
        assert "Approximate" in text
        assert len(got) > want


def test_torchtitan_block_exact_option():
    text = render(parse_spec("full:block:2"), "torchtitan", num_layers=8)
    assert run_torchtitan(text) == {"mode": "selective", "selective_ac_option": "4"}
    assert torchtitan_checkpointed_layers(run_torchtitan(text), 8) == {4, 8}


def test_hf_trainer_is_gradient_checkpointing_on_or_off():
    on = render(parse_spec("full:uniform:1"), "hf-trainer")
    assert on.splitlines()[-1] == "gradient_checkpointing: true"
    assert "disable_gradient_checkpointing: false" in on and "Approximate" not in on
    off = render(parse_spec("none"), "hf-trainer")
    assert off.splitlines()[-1] == "gradient_checkpointing: false"
    assert "disable_gradient_checkpointing: true" in off
    approx = render(parse_spec("selective:mlp"), "hf-trainer")
    assert approx.splitlines()[-1] == "gradient_checkpointing: true" and "Approximate" in approx


def test_plan_for_a_trainer_run_offers_what_the_trainer_can_do():
    # A skill trial: LLaMA-Factory got selective:layernorm / full:block:N in Bridge syntax.
    from pathlib import Path

    from recompute_kit.config import format_spec
    from recompute_kit.plan.search import candidates
    from recompute_kit.sources.resolve import resolve

    yaml_file = (
        Path(__file__).parent
        / "sources"
        / "corpus"
        / "hf_trainer"
        / "blind_llama3_fp8_deepspeed_sft.yaml"
    )
    cfg = resolve([str(yaml_file)], overrides={"data_parallel_size": 8}).config
    assert [format_spec(rc) for rc, _ in candidates(cfg)] == ["none", "full:uniform:1"]


def test_nemo_rl_renders_its_own_keys():
    # NeMo-RL: activation_checkpointing is full recompute of every layer (uniform, 1:
    # nemo_rl/models/megatron/setup.py); module-level selective needs v0.7.0 (NVIDIA-NeMo/RL #2280)
    full = render(parse_spec("full:uniform:1"), "nemo-rl")
    assert "policy.megatron_cfg.activation_checkpointing: true" in full
    assert "recompute_granularity" not in full and "Approximate" not in full
    selective = render(parse_spec("selective:mlp,moe_act"), "nemo-rl")
    assert "policy.megatron_cfg.recompute_modules: [mlp, moe_act]" in selective
    assert "NeMo-RL >= 0.7.0" in selective
    assert "activation_checkpointing: false" in render(parse_spec("none"), "nemo-rl")
    assert "Approximate" in render(parse_spec("full:block:4"), "nemo-rl")


def test_automodel_renders_dotted_keys():
    out = render(parse_spec("full:uniform:1"), "automodel")
    assert out.rstrip().endswith("distributed.activation_checkpointing: true")


def test_bridge_layout_changes_come_as_overrides_too():
    # a skill trial asked for Hydra overrides and got only `cfg.model.context_parallel_size = 2`
    from recompute_kit.export_layout import layout_lines

    lines = layout_lines({"context_parallel_size": 2, "seq_length": 8192}, "megatron-bridge", 16)
    assert "cfg.model.context_parallel_size = 2" in lines
    assert lines[-1] == (
        "# or as overrides: model.context_parallel_size=2 model.seq_length=8192 "
        "dataset.seq_length=8192"
    )


def test_nemo1_layout_names_the_node_count_to_set():
    # a skill trial: the NeMo 1.x hand-over said "launch on 128 GPUs (trainer.devices x
    # trainer.num_nodes; DP 8)" without the value to set
    from recompute_kit.export_layout import layout_lines

    lines = layout_lines({"data_parallel_size": 8}, "nemo", 128)
    assert "# trainer.num_nodes: 16 with trainer.devices: 8 (the GPUs of a node)" in lines


def test_megatron_lm_flags_say_which_recompute_flags_they_replace():
    # A skill trial: the script set --recompute-granularity selective --recompute-modules
    # moe_act; the plan handed over the full-recompute flags alone, so pasting them left
    # --recompute-modules (and a second --recompute-granularity) in the script.
    from recompute_kit.config import parse_spec
    from recompute_kit.export import render

    full = render(parse_spec("full:block:4"), "megatron-lm", num_layers=32).splitlines()
    flags = next(i for i, line in enumerate(full) if line.startswith("--recompute-granularity"))
    assert "drop --recompute-modules" in "\n".join(full[flags + 1 :])
    selective = render(parse_spec("selective:moe_act"), "megatron-lm", num_layers=32)
    assert "drop --recompute-method and --recompute-num-layers" in selective


def test_megatron_deepspeed_renders_in_its_own_flags():
    # microsoft/Megatron-DeepSpeed@f4157bea megatron/arguments.py: --recompute-granularity
    # full|selective (selective: core attention only, no --recompute-modules), --recompute-method,
    # --recompute-num-layers, and the old --checkpoint-activations / --checkpoint-num-layers
    # (uniform groups), which take precedence (megatron/model/transformer.py).
    def flags(spec: str) -> list[str]:
        return body(render(parse_spec(spec), "megatron-deepspeed"))

    assert flags("selective") == ["--recompute-granularity selective"]
    assert flags("full:uniform:2") == ["--checkpoint-activations --checkpoint-num-layers 2"]
    assert flags("full:block:3") == [
        "--recompute-granularity full --recompute-method block --recompute-num-layers 3"
    ]
    assert flags("none") == []
    said = render(parse_spec("selective:mlp"), "megatron-deepspeed")
    assert "Not expressible: Megatron-DeepSpeed's selective recompute is core attention" in said


def test_bridge_fine_grained_offloading_says_the_environment_it_needs():
    # Megatron-Bridge refuses fine-grained activation offloading on Transformer Engine >= 2.10
    # without NVTE_CPU_OFFLOAD_V1=1 (training/config.py; a skill trial rendered it without)
    rc = dataclasses.replace(
        parse_spec("selective:layernorm"),
        fine_grained_activation_offloading=True,
        offload_modules=["core_attn"],
    )
    assert "NVTE_CPU_OFFLOAD_V1=1" in render(rc, "megatron-bridge", num_layers=4)
    assert "NVTE_CPU_OFFLOAD_V1" not in render(parse_spec("selective:layernorm"), "megatron-bridge")


def test_registry_pipeline_micro_batch_is_a_training_token_key():
    # A skill trial: the pipeline rows of `plan --levers` rendered
    # `--parallelism.num_tokens_per_microbatch_per_dp_rank`; the registry's TrainingConfig holds
    # it (torchtitan/config/configs.py), in tokens
    from recompute_kit.export_layout import SEQUENCE_TOKENS, _torchtitan_registry

    changes = {"pipeline_model_parallel_size": 2, "micro_batch_size": 1, SEQUENCE_TOKENS: 8192}
    lines = _torchtitan_registry(changes, world=8)
    assert "config.training.num_tokens_per_microbatch_per_dp_rank = 8192" in lines
    assert not any("parallelism.num_tokens" in line for line in lines)
