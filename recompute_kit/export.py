"""Render a `RecomputeConfig` as the settings of another training framework.

Formats (`FORMATS`):

* ``megatron-bridge`` - Python override lines ``cfg.model.<field> = ...`` on a Megatron-Bridge
  ``ConfigContainer`` (the model provider carries Megatron-Core's TransformerConfig field names).
* ``megatron-lm``     - a Megatron-LM command-line fragment (``--recompute-granularity ...``).
  The flags are the field names with ``_`` -> ``-``: ``--recompute-granularity``,
  ``--recompute-method``, ``--recompute-num-layers``, ``--recompute-modules``,
  ``--distribute-saved-activations`` (written out in ``megatron/training/arguments.py``) and
  ``--cpu-offloading``, ``--cpu-offloading-num-layers``, ``--fine-grained-activation-offloading``,
  ``--offload-modules`` (generated from TransformerConfig by ``ArgumentGroupFactory`` in
  ``megatron/training/argument_utils.py``).
* ``nemo``            - a NeMo 1.x model-config YAML block under ``model:``. NeMo's
  ``MegatronBaseModel.build_transformer_config`` reads the recompute settings from
  ``activations_checkpoint_granularity/_method/_num_layers`` (and these take priority over a
  ``recompute_granularity`` key), hard-codes ``distribute_saved_activations=False``, and passes
  any other TransformerConfig field (``recompute_modules``, ``cpu_offloading``, ...) by name.
  (NeMo 2 configures the model in Python recipes; Megatron-Bridge's own YAML overrides use the
  Megatron-Core names under ``model:``, which is what `config.load_config` reads.)
* ``torchtitan``      - the ``[activation_checkpoint]`` TOML table of torchtitan's JobConfig
  (``mode = "none" | "selective" | "full"``, ``selective_ac_option = "op"`` or ``"<k>"`` for every
  k-th layer). Only some Megatron settings have an exact equivalent; the rendering says so in
  TOML comments. torchtitan's 2026 config refactor replaced this TOML form (the policy is now
  chosen with a ``selective | full | memory-budget | none`` subcommand, and the every-k-th-layer
  option is gone); the mode names are unchanged.
* ``torchtitan-registry`` - that refactor's form (pytorch/torchtitan#2386, main since
  2026-02): Python lines for the registry function that builds the run's ``Trainer.Config``
  (``config.activation_checkpoint = FullAC.Config()``; ``SelectiveAC.Config()`` is per-op SAC,
  ``None`` no AC). Its policies are per-op SAC, every block, or none: Megatron's block:N and
  uniform:N>1 are rendered as the closest with a comment.

* ``hf-trainer``      - ``gradient_checkpointing: true | false`` of the Hugging Face Trainer (TRL,
  LLaMA-Factory's ``disable_gradient_checkpointing``): every decoder layer or none, so only
  none and full:uniform:1 are exact; other settings are rendered as "on" with a comment.
* ``llama-factory``   - the same two states in LLaMA-Factory's own key,
  ``disable_gradient_checkpointing: false | true``. LLaMA-Factory turns checkpointing on itself
  (``model/model_utils/checkpointing.py``: ``if not model_args.disable_gradient_checkpointing:
  model.gradient_checkpointing_enable(...)``, hparams/model_args.py default False), so the
  Trainer's ``gradient_checkpointing: false`` does not turn it off there.

`TRAINER_KEYS` names each Hugging Face stack's own keys for the settings the planner changes
(checkpointing, micro-batch, accumulation, sequence length, Liger kernels).

Every rendering starts with ``# recompute-kit: <spec>`` (every format uses ``#`` comments).
Sources: shared/reference/megatron-recompute.md and pytorch-checkpointing-and-memory.md section 4.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .config import OFFLOAD_MODULES, ConfigError, RecomputeConfig, format_spec
from .export_layout import Spelling, layout_lines

FORMATS = (
    "megatron-bridge",
    "nemo2",
    "megatron-lm",
    "megatron-deepspeed",
    "nemo",
    "torchtitan",
    "torchtitan-registry",
    "hf-trainer",
    "llama-factory",
    "automodel",
    "nemo-rl",
    "nemo-rl-dtensor",
    "llama-factory-mca",
    "llama-factory-mbridge",
)

# Each Hugging Face stack's keys, as its source names them:
# transformers TrainingArguments (v4.57.1 training_args.py: gradient_checkpointing,
# per_device_train_batch_size, gradient_accumulation_steps, use_liger_kernel; the sequence
# length is TRL SFTConfig's max_length) and LLaMA-Factory (hiyouga/LLaMA-Factory @ ff6d4d12
# hparams/model_args.py: disable_gradient_checkpointing, enable_liger_kernel; data_args.py:
# cutoff_len; the batch keys are the Trainer's, its Seq2SeqTrainingArguments).
TRAINER_KEYS: dict[str, dict[str, str]] = {
    "hf-trainer": {
        "checkpointing": "gradient_checkpointing",
        "micro_batch": "per_device_train_batch_size",
        "accumulation": "gradient_accumulation_steps",
        "seq_length": "max_length",
        "liger": "use_liger_kernel",
    },
    "llama-factory": {
        "checkpointing": "disable_gradient_checkpointing",
        "micro_batch": "per_device_train_batch_size",
        "accumulation": "gradient_accumulation_steps",
        "seq_length": "cutoff_len",
        "liger": "enable_liger_kernel",
    },
    # NeMo Automodel recipe YAMLs (NVIDIA-NeMo/Automodel @ 36044ad3, recipes/llm/train_ft.py,
    # recipes/_dist_utils.py): the accumulation follows step_scheduler.global_batch_size over
    # local_batch_size x DP, so only the micro-batch is written; no Liger key.
    "automodel": {
        "checkpointing": "distributed.activation_checkpointing",
        "micro_batch": "step_scheduler.local_batch_size",
        "accumulation": "",
        "seq_length": "dataset.seq_length (packed_sequence.packed_sequence_size when packing)",
        "liger": "",
    },
}

# YAML words that load back as the same string (not null/true/false/numbers).
_PLAIN_WORD = re.compile(
    r"(?!(?:null|true|false|yes|no|on|off|y|n)$)[a-z][a-z0-9_]*", re.IGNORECASE
)


def render(
    recompute: RecomputeConfig,
    fmt: str,
    *,
    num_layers: int | None = None,
    layout: dict[str, Any] | None = None,
    world_size: int = 0,
    spelling: Spelling | None = None,
) -> str:
    """The recompute (and offloading) settings of `recompute` in format `fmt` (see FORMATS).

    `num_layers` (transformer layers per pipeline stage) is only used by the torchtitan
    rendering of ``full:block:N``, to pick the closest every-k-th-layer option. `layout`: the
    parallel layout and shape settings a plan changed from the inputs
    (export_layout.changed_settings), written after the recompute settings in the same
    format's keys; `world_size`: the GPUs that layout takes; `spelling`: a Trainer run's own
    keys and flag syntax (export_layout.spelling_of). Raises
    `ConfigError` (one line) for an unknown format or settings that cannot be exported.
    The result ends with a newline.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    _check(recompute, num_layers)
    header = f"# recompute-kit: {format_spec(recompute)}"
    body = _RENDERERS[fmt](recompute, num_layers)
    body += layout_lines(layout or {}, fmt, world_size, spelling)
    if spelling is not None:
        body = spelling.apply(body)
    return "\n".join([header, *body]) + "\n"


def settings_line(
    recompute: RecomputeConfig,
    fmt: str,
    *,
    num_layers: int | None = None,
    spelling: Spelling | None = None,
) -> str:
    """The keys `render` writes for `recompute` in `fmt`, on one line without the comments: a
    candidate's setting as the run's framework spells it (`plan` lists one per candidate)."""
    _check(recompute, num_layers)
    body = _RENDERERS[fmt](recompute, num_layers)
    if spelling is not None:
        body = spelling.apply(body)
    return "; ".join(x.strip() for x in body if x.strip() and not x.lstrip().startswith("#"))


def render_all(recompute: RecomputeConfig, *, num_layers: int | None = None) -> dict[str, str]:
    """`render` for every format, keyed by format name in FORMATS order."""
    return {fmt: render(recompute, fmt, num_layers=num_layers) for fmt in FORMATS}


# --------------------------------------------------------------------------------------------
# Checks and the settings every format shares
# --------------------------------------------------------------------------------------------


def _check(rc: RecomputeConfig, num_layers: int | None) -> None:
    g = rc.recompute_granularity
    if g not in (None, "selective", "full"):
        raise ConfigError(
            f"cannot export recompute_granularity {g!r}; expected None, 'selective' or 'full'"
        )
    if g == "full":
        if rc.recompute_method not in ("uniform", "block"):
            raise ConfigError(
                f"cannot export full recompute with recompute_method {rc.recompute_method!r}; "
                "expected 'uniform' or 'block'"
            )
        n = rc.recompute_num_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"cannot export full recompute with recompute_num_layers {n!r}; expected an "
                "integer >= 1"
            )
    if g == "selective" and (
        rc.recompute_method is not None or rc.recompute_num_layers is not None
    ):
        raise ConfigError(
            "cannot export selective recompute with recompute_method/recompute_num_layers set; "
            "Megatron requires both to be None for selective"
        )
    if rc.fine_grained_activation_offloading and not rc.offload_modules:
        raise ConfigError(
            "fine_grained_activation_offloading needs a non-empty offload_modules, "
            f"choose from {list(OFFLOAD_MODULES)}"
        )
    if num_layers is not None and (
        isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1
    ):
        raise ConfigError(f"num_layers must be an integer >= 1, got {num_layers!r}")


def _core(rc: RecomputeConfig) -> dict[str, Any]:
    """The four recompute fields, normalised: method/num_layers only for full, the module list
    (explicit, Megatron's default filled in) only for selective."""
    g = rc.recompute_granularity
    return {
        "recompute_granularity": g,
        "recompute_modules": rc.modules if g == "selective" else None,
        "recompute_method": rc.recompute_method if g == "full" else None,
        "recompute_num_layers": rc.recompute_num_layers if g == "full" else None,
    }


def offload_settings(rc: RecomputeConfig) -> dict[str, Any]:
    """The offloading fields that are switched on (Megatron-Core names)."""
    out: dict[str, Any] = {}
    if rc.distribute_saved_activations:
        out["distribute_saved_activations"] = True
    if rc.cpu_offloading:
        out["cpu_offloading"] = True
        out["cpu_offloading_num_layers"] = rc.cpu_offloading_num_layers
    if rc.fine_grained_activation_offloading:
        out["fine_grained_activation_offloading"] = True
        out["offload_modules"] = list(rc.offload_modules)
    return out


# --------------------------------------------------------------------------------------------
# Megatron-Bridge: Python overrides on cfg.model
# --------------------------------------------------------------------------------------------


def _py(value: Any) -> str:
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted Python literal for these ASCII names
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r}")


def _render_bridge(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    settings = {**_core(rc), **offload_settings(rc)}
    if rc.cpu_offloading:
        # What TE's offload context moves; Megatron-Core's defaults, set explicitly because TE
        # refuses an offload with neither (Megatron-Bridge#2684).
        settings["cpu_offloading_activations"] = True
        settings["cpu_offloading_weights"] = False
    lines = [f"cfg.model.{key} = {_py(value)}" for key, value in settings.items()]
    # the same as the Hydra-style overrides a recipe's launch script takes (OmegaConf dotlist)
    overrides = " ".join(_hydra(f"model.{key}", value) for key, value in settings.items())
    env = []
    if rc.fine_grained_activation_offloading:
        # Megatron-Bridge's ConfigContainer.validate refuses it otherwise (training/config.py)
        env = ["# with Transformer Engine >= 2.10 also set NVTE_CPU_OFFLOAD_V1=1 in the job's env"]
    return [*lines, f"# or as overrides: {overrides}", *env]


def _render_nemo2(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """NeMo 2.0: the recipe object's model config (nemo.collections.llm recipes return a
    run.Partial; the Megatron-Core fields sit on recipe.model.config), or the same as NeMo-Run
    command-line overrides."""
    settings = {**_core(rc), **offload_settings(rc)}
    lines = [f"recipe.model.config.{key} = {_py(value)}" for key, value in settings.items()]
    overrides = " ".join(_hydra(f"model.config.{key}", value) for key, value in settings.items())
    return [*lines, f"# or as NeMo-Run overrides (nemo llm ... --factory ...): {overrides}"]


def _hydra(key: str, value: Any) -> str:
    """`model.x=value` in OmegaConf's dotlist syntax, shell-quoted where it has brackets."""
    if isinstance(value, list):
        return f"'{key}=[{','.join(map(str, value))}]'"
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    return f"{key}={value}"


# --------------------------------------------------------------------------------------------
# Megatron-LM: command-line flags
# --------------------------------------------------------------------------------------------


def _render_megatron_lm(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    core = _core(rc)
    comments: list[str] = []
    flags: list[str] = []
    after: list[str] = []  # said below the flags
    g = core["recompute_granularity"]
    if g is None:
        comments.append(
            "# no recompute: drop --recompute-granularity, --recompute-method, "
            "--recompute-num-layers, --recompute-modules and --recompute-activations"
        )
    else:
        flags += ["--recompute-granularity", g]
    core_attn_only = core["recompute_modules"] == ["core_attn"]
    if g == "selective" and not core_attn_only:
        # core_attn alone is the flag's default, and all a Megatron-LM before Megatron-Core
        # 0.12 has (no --recompute-modules there): written only where it says more
        flags += ["--recompute-modules", *core["recompute_modules"]]
        if not core["recompute_modules"]:
            comments.append(
                "# --recompute-modules with no names is the no-op control (nothing recomputed); "
                "it needs a parser that takes nargs='*'"
            )
    if g == "full":
        flags += [
            "--recompute-method",
            core["recompute_method"],
            "--recompute-num-layers",
            str(core["recompute_num_layers"]),
        ]
        after = [
            "# these replace the script's recompute flags: drop --recompute-modules and "
            "--recompute-activations (it forces selective) where the script has them"
        ]
    elif g == "selective":
        # --recompute-activations sets the same granularity (arguments.py) and may stay
        after = [
            "# these replace the script's recompute flags: drop --recompute-method and "
            "--recompute-num-layers"
            + (" and --recompute-modules" if core_attn_only else "")
            + " where the script has them"
        ]
    if rc.distribute_saved_activations:
        flags.append("--distribute-saved-activations")
    if rc.cpu_offloading:
        # no --cpu-offloading flag: Megatron-LM turns it on for a layer count above 0
        # (arguments.py: cpu_offloading is among the fields with no CLI argument)
        flags += ["--cpu-offloading-num-layers", str(rc.cpu_offloading_num_layers)]
    if rc.fine_grained_activation_offloading:
        flags += ["--fine-grained-activation-offloading", "--offload-modules", *rc.offload_modules]
        comments.append(
            "# fine-grained offloading needs --transformer-impl transformer_engine; "
            "with TE >= 2.10 also set NVTE_CPU_OFFLOAD_V1=1"
        )
    return comments + ([" ".join(flags)] if flags else []) + after


# --------------------------------------------------------------------------------------------
# Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed): Megatron-LM v3's recompute flags without
# --recompute-modules (its selective is core attention only), beside the old
# --checkpoint-activations, which takes precedence (megatron/model/transformer.py)
# --------------------------------------------------------------------------------------------

_MDS_FLAGS = (
    "--checkpoint-activations, --checkpoint-num-layers, --recompute-activations, "
    "--recompute-granularity, --recompute-method and --recompute-num-layers"
)


_MDS_DROP_OLD = (
    "# these replace the script's recompute flags: drop --checkpoint-activations and "
    "--checkpoint-num-layers (--checkpoint-activations takes precedence)"
)


def _render_megatron_deepspeed(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    core = _core(rc)
    g = core["recompute_granularity"]
    # no activation offloading flags; distribute_saved_activations is its own flag there
    notes = [n for n in _unexported_notes(rc, "Megatron-DeepSpeed") if "distribute" not in n]
    extra = " --distribute-saved-activations" if rc.distribute_saved_activations else ""
    if g is None:
        return [*notes, f"# no recompute: drop {_MDS_FLAGS}"]
    if g == "selective":
        if list(core["recompute_modules"]) != ["core_attn"]:
            notes.append(
                f"# Not expressible: Megatron-DeepSpeed's selective recompute is core attention "
                f"only (no --recompute-modules); {format_spec(rc)} has no flag"
            )
        return [*notes, f"--recompute-granularity selective{extra}", _MDS_DROP_OLD]
    if core["recompute_method"] == "uniform":  # the script's own flags say it
        return [
            *notes,
            f"--checkpoint-activations --checkpoint-num-layers {core['recompute_num_layers']}"
            + extra,
            "# these replace the script's recompute flags: drop --recompute-activations, "
            "--recompute-granularity, --recompute-method and --recompute-num-layers",
        ]
    return [
        *notes,
        f"--recompute-granularity full --recompute-method {core['recompute_method']} "
        f"--recompute-num-layers {core['recompute_num_layers']}{extra}",
        _MDS_DROP_OLD,
    ]


# --------------------------------------------------------------------------------------------
# NeMo 1.x: model config YAML
# --------------------------------------------------------------------------------------------


def _yaml(value: Any) -> str:
    """A YAML scalar or flow list (module and method names are plain lower-case words)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value if _PLAIN_WORD.fullmatch(value) else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r}")


def _render_nemo(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    core = _core(rc)
    model: dict[str, Any] = {
        "activations_checkpoint_granularity": core["recompute_granularity"],
        "activations_checkpoint_method": core["recompute_method"],
        "activations_checkpoint_num_layers": core["recompute_num_layers"],
    }
    modules = core["recompute_modules"] if core["recompute_granularity"] == "selective" else None
    if modules is not None and modules != ["core_attn"]:  # (core attention: the default)
        model["recompute_modules"] = modules
    offload = offload_settings(rc)
    offload.pop("distribute_saved_activations", None)
    model.update(offload)
    if rc.cpu_offloading:
        # NeMo's GPT config defaults cpu_offloading_weights to True; these settings offload
        # activations only.
        model["cpu_offloading_activations"] = True
        model["cpu_offloading_weights"] = False
    comments = [
        "# NeMo reads activations_checkpoint_* into Megatron-Core's recompute_granularity/method/"
        "num_layers;",
        "# the other keys go to TransformerConfig by name (if your Megatron-Core has the field).",
    ]
    if "recompute_modules" in model:
        comments.append(
            "# recompute_modules needs Megatron-Core >= 0.12: an older one has no such field, "
            "NeMo drops the key and selective recomputes core attention alone"
        )
    if rc.distribute_saved_activations:
        comments.append("# distribute_saved_activations: not exported, NeMo hard-codes it to False")
    lines = ["model:"] + [f"  {key}: {_yaml(value)}" for key, value in model.items()]
    return comments + lines


# --------------------------------------------------------------------------------------------
# torchtitan: [activation_checkpoint] TOML
# --------------------------------------------------------------------------------------------


def _render_torchtitan(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    core = _core(rc)
    g = core["recompute_granularity"]
    notes: list[str] = []
    option: str | None = None
    if g is None:
        mode = "none"
    elif g == "selective" and not core["recompute_modules"]:
        mode = "none"
        notes.append(
            "# selective with an empty recompute_modules recomputes nothing: same as mode none"
        )
    elif g == "selective":
        mode, option = "selective", "op"
        modules = ", ".join(core["recompute_modules"])
        notes += [
            f"# Not module-for-module the same as Megatron's recompute_modules [{modules}]:",
            "# torchtitan's op-level SAC saves the outputs of compute-heavy ops (matmuls - except",
            "# every second one -, attention kernels, collectives) in every layer and recomputes",
            "# the cheap ops around them.",
        ]
    elif core["recompute_method"] == "uniform":
        mode = "full"
        n = core["recompute_num_layers"]
        if n > 1:
            stored = (
                f"{num_layers} layer inputs instead of {-(-num_layers // n)}"
                if num_layers is not None
                else f"about {n}x as many layer inputs"
            )
            notes += [
                "# Approximate: torchtitan's full mode checkpoints every layer on its own;",
                f"# Megatron's uniform:{n} checkpoints chunks of {n} layers. Full mode stores",
                f"# {stored}, but its recompute buffer holds one layer's",
                f"# activations instead of {min(n, num_layers or n)} layers'.",
            ]
    else:
        mode, option = _block_to_torchtitan(core["recompute_num_layers"], num_layers, notes)
    notes += _unexported_notes(rc, "torchtitan")
    form = [
        "# torchtitan JobConfig TOML (before its 2026 config refactor, which selects the mode as",
        "# a subcommand and dropped the every-k-th-layer selective_ac_option).",
    ]
    table = ["[activation_checkpoint]", f'mode = "{mode}"']
    if option is not None:
        table.append(f'selective_ac_option = "{option}"')
    return form + notes + table


_REGISTRY_POLICY = {
    "none": "None",
    "selective": "SelectiveAC.Config()",
    "full": "FullAC.Config()",
}


def _render_torchtitan_registry(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """The TOML rendering's mode in main's registry form; no every-k-th-layer policy there."""
    lines = _render_torchtitan(rc, num_layers)
    table = lines.index("[activation_checkpoint]")
    notes = [n for n in lines[:table] if not n.startswith("# torchtitan JobConfig TOML")]
    notes = [n for n in notes if not n.startswith("# a subcommand and dropped")]
    mode = lines[table + 1].split('"')[1]
    option = lines[table + 2].split('"')[1] if len(lines) > table + 2 else None
    if mode == "selective" and option != "op":
        notes += [
            "# torchtitan main has no every-k-th-block policy (the TOML's selective_ac_option",
            f"# {option!r} is gone): FullAC recomputes every block, more than this setting.",
        ]
        mode = "full"
    return [
        "# torchtitan config registry (main since 2026-02): in the function that builds the",
        "# run's Trainer.Config, with FullAC / SelectiveAC imported from",
        "# torchtitan.distributed.activation_checkpoint.",
        *notes,
        f"config.activation_checkpoint = {_REGISTRY_POLICY[mode]}",
        f"# or on the command line (it wins over the function): activation-checkpoint:{mode}",
    ]


def _block_to_torchtitan(n: int, layers: int | None, notes: list[str]) -> tuple[str, str | None]:
    """Megatron full:block:N checkpoints the first N layers of each pipeline stage (all of them
    when N >= L). torchtitan's layer SAC, selective_ac_option = "k", checkpoints layers
    k, 2k, ... (counting from 1) of each model chunk: L // k layers."""
    if layers is None:
        notes += [
            f"# Exact only if block:{n} covers every layer (N >= layers per pipeline stage).",
            "# Otherwise torchtitan's closest is every-k-th-layer selective AC",
            '# (mode = "selective", selective_ac_option = "k" with k = L // N): render with',
            "# num_layers to get it. Full mode recomputes more than block:N does.",
        ]
        return "full", None
    if n >= layers:
        notes.append(f"# block:{n} with {layers} layers checkpoints every layer: same as full")
        return "full", None
    k = layers // n
    count = layers // k
    if k == 1:
        notes += [
            f"# Approximate: block:{n} of {layers} layers; torchtitan's every-k-th-layer option",
            f"# checkpoints {layers // 2} (k = 2) or all {layers} (full) layers. Full is used: it",
            "# recomputes more but saves at least as much memory.",
        ]
        return "full", None
    where = f"layers {k}, {2 * k}, ... (counting from 1), not the first {n}"
    if count == n:
        notes += [
            f"# Same number of checkpointed layers as block:{n} of {layers} ({n}), but at",
            f"# {where}.",
        ]
    else:
        notes += [
            f"# Approximate: checkpoints {count} of {layers} layers instead of block:{n}'s {n},",
            f"# at {where}; no every-k-th option gives exactly {n}.",
        ]
    return "selective", str(k)


def _unexported_notes(rc: RecomputeConfig, framework: str) -> list[str]:
    """Comments for the Megatron settings `framework` has no key for."""
    notes = []
    if rc.distribute_saved_activations:
        notes.append(
            f"# distribute_saved_activations: no {framework} equivalent (Megatron shards the "
            "saved layer inputs across TP ranks); not exported"
        )
    if rc.cpu_offloading:
        notes.append(
            f"# cpu_offloading ({rc.cpu_offloading_num_layers} layers): {framework} has no "
            "activation CPU-offloading key; not exported"
        )
    if rc.fine_grained_activation_offloading:
        notes.append(
            f"# fine_grained_activation_offloading ({', '.join(rc.offload_modules)}): "
            f"{framework} has no equivalent key; not exported"
        )
    return notes


def _render_hf_trainer(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """The Trainer (and TRL / LLaMA-Factory) checkpoints every decoder layer or none."""
    core = _core(rc)
    g = core["recompute_granularity"]
    off = g is None or (g == "selective" and not core["recompute_modules"])
    exact = off or (
        g == "full" and core["recompute_method"] == "uniform" and core["recompute_num_layers"] == 1
    )
    notes = [
        "# Hugging Face TrainingArguments / TRL YAML (LLaMA-Factory: disable_gradient_"
        f"checkpointing: {str(off).lower()})"
    ]
    if not exact:
        notes += [
            f"# Approximate: the Trainer checkpoints every decoder layer or none; "
            f"{format_spec(rc)} has",
            "# no equivalent. On (every layer, like full:uniform:1) saves at least as much.",
        ]
    notes += _unexported_notes(rc, "the Trainer")
    return [*notes, f"gradient_checkpointing: {str(not off).lower()}"]


def _render_llama_factory(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """LLaMA-Factory's disable_gradient_checkpointing: the inverse of the Trainer's key."""
    lines = _render_hf_trainer(rc, num_layers)
    on = lines[-1] == "gradient_checkpointing: true"
    notes = [
        "# LLaMA-Factory YAML: checkpointing is on unless disable_gradient_checkpointing is true",
        "# (the Trainer's gradient_checkpointing: false does not turn it off there)",
    ]
    return [*notes, *lines[1:-1], f"disable_gradient_checkpointing: {str(not on).lower()}"]


def _whole_layers(rc: RecomputeConfig, num_layers: int | None, who: str, header: str, key: str):
    """A framework that checkpoints every decoder layer or none, by one switch `key`: the
    Trainer's rendering's notes, said of `who`, under `header`."""
    lines = _render_hf_trainer(rc, num_layers)
    on = lines[-1] == "gradient_checkpointing: true"
    notes = [header, *[n.replace("the Trainer", who) for n in lines[1:-1]]]
    return [*notes, f"{key}: {str(on).lower()}"]


def _render_automodel(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """NeMo Automodel checkpoints every decoder layer (activation_checkpointing: true) or none;
    its "selective" is PyTorch's per-op policy, not Megatron's modules."""
    return _whole_layers(
        rc,
        num_layers,
        "Automodel",
        "# NeMo Automodel recipe YAML (dotted keys: nest each under its section): "
        "distributed.activation_checkpointing wraps every decoder layer (true) or none",
        "distributed.activation_checkpointing",
    )


def _render_nemo_rl(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """NeMo-RL's Megatron policy: activation_checkpointing turns on full recompute of every
    layer (uniform, 1: nemo_rl/models/megatron/setup.py); selective recompute by module is
    recompute_granularity / recompute_modules from v0.7.0 (NVIDIA-NeMo/RL #2280). Its DTensor
    policy checkpoints whole layers only (dtensor_cfg.activation_checkpointing)."""
    core = _core(rc)
    g = core["recompute_granularity"]
    section = "policy.megatron_cfg"
    lines = [
        "# NeMo-RL YAML (dotted keys: nest each under its section; as Hydra overrides: key=value)"
    ]
    if g is None:
        return [*lines, f"{section}.activation_checkpointing: false"]
    whole = core["recompute_method"] == "uniform" and core["recompute_num_layers"] == 1
    if g == "full" and not whole:
        lines += [
            f"# Approximate: NeMo-RL's full recompute is uniform, 1 layer; {format_spec(rc)} "
            "has no key (it saves at least as much)"
        ]
    lines += _unexported_notes(rc, "NeMo-RL")
    lines.append(f"{section}.activation_checkpointing: true")
    if g == "selective":
        modules = ", ".join(core["recompute_modules"])
        lines += [
            f"{section}.recompute_granularity: selective  # NeMo-RL >= 0.7.0",
            f"{section}.recompute_modules: [{modules}]",
        ]
    lines.append(
        "# DTensor policy instead: policy.dtensor_cfg.activation_checkpointing: true (whole layers)"
    )
    return lines


def _render_nemo_rl_dtensor(rc: RecomputeConfig, num_layers: int | None) -> list[str]:
    """NeMo-RL's DTensor (FSDP2) policy checkpoints whole decoder layers or none
    (policy.dtensor_cfg.activation_checkpointing); it has no selective recompute."""
    return _whole_layers(
        rc,
        num_layers,
        "NeMo-RL's DTensor policy",
        "# NeMo-RL YAML, DTensor policy (dotted keys: nest each under its section; as Hydra "
        "overrides: key=value): whole decoder layers or none",
        "policy.dtensor_cfg.activation_checkpointing",
    )


# The config snippet a command prints by default: the format of the framework the inputs use
# (the shared reader's `framework`; a LLaMA-Factory YAML has its own checkpointing key).
FORMAT_OF_FRAMEWORK = {
    "megatron-lm": "megatron-lm",
    "nemo2": "nemo2",
    "nemo1": "nemo",
    "torchtitan": "torchtitan",
    "hf-trainer": "hf-trainer",
    "automodel": "automodel",
    "nemo-rl": "nemo-rl",
    "llama-factory-mca": "llama-factory-mca",
    "llama-factory-mbridge": "llama-factory-mbridge",
}
# the reader's `format` text of a NeMo-RL run on its DTensor (FSDP2) policy
_DTENSOR = "DTensor"


def format_for(framework: str | None, reading_format: str = "") -> str:
    """The export format of a run the reader read as `framework` (its `format` text tells a
    LLaMA-Factory YAML from the Trainer's); Megatron-Bridge's where none is known."""
    if framework == "hf-trainer" and "LLaMA-Factory" in reading_format:
        return "llama-factory"
    if framework == "nemo-rl" and _DTENSOR in reading_format:
        return "nemo-rl-dtensor"
    if framework == "megatron-lm" and "Megatron-DeepSpeed" in reading_format:
        return "megatron-deepspeed"
    if framework == "torchtitan" and "torchtitan config registry" in reading_format:
        return "torchtitan-registry"
    return FORMAT_OF_FRAMEWORK.get(framework or "", "megatron-bridge")


def _render_llama_factory_megatron(rc: RecomputeConfig, bridge: bool) -> list[str]:
    """A LLaMA-Factory YAML on its Megatron backend: the recompute keys at the top level
    (mcore_adapter's DistributingParallelArguments; LLaMA-Factory's MegatronBridgeArguments),
    what they have no key for in their dict of model overrides (mcore_adapter's
    additional_configs, set on the model config by name; Megatron-Bridge's extra_config,
    dot paths into its config container: hparams/megatron_bridge_args.py)."""
    core = _core(rc)
    g = core["recompute_granularity"]
    backend = "USE_MEGATRON_BRIDGE=1" if bridge else "USE_MCA=1, mcore_adapter"
    lines = [f"# LLaMA-Factory YAML on its Megatron backend ({backend}): top-level keys"]
    lines += [
        f"recompute_granularity: {_yaml(g)}",
        f"recompute_method: {_yaml(core['recompute_method'])}",
        f"recompute_num_layers: {_yaml(core['recompute_num_layers'])}",
    ]
    extra: dict[str, Any] = dict(offload_settings(rc))
    modules = core["recompute_modules"]
    if modules is not None and not bridge:
        lines.append(f"recompute_modules: {','.join(modules)}")  # (a comma-separated string)
    elif modules is not None:
        extra = {"recompute_modules": modules, **extra}
    if extra:
        key = "extra_config" if bridge else "additional_configs"
        doc = {f"model.{k}" if bridge else k: v for k, v in extra.items()}
        lines += [
            f"# merge into the YAML's own {key} if it has one",
            f"{key}: '{json.dumps(doc)}'",
        ]
    if core["recompute_method"] == "block" and not bridge:
        lines.append(
            "# (mcore_adapter's recompute_method field lists uniform and recompute; a YAML's "
            "value reaches Megatron-Core's TransformerConfig as written)"
        )
    return lines


_RENDERERS = {
    "megatron-bridge": _render_bridge,
    "nemo2": _render_nemo2,
    "megatron-lm": _render_megatron_lm,
    "megatron-deepspeed": _render_megatron_deepspeed,
    "nemo": _render_nemo,
    "torchtitan": _render_torchtitan,
    "torchtitan-registry": _render_torchtitan_registry,
    "hf-trainer": _render_hf_trainer,
    "llama-factory": _render_llama_factory,
    "automodel": _render_automodel,
    "nemo-rl": _render_nemo_rl,
    "nemo-rl-dtensor": _render_nemo_rl_dtensor,
    "llama-factory-mca": lambda rc, _: _render_llama_factory_megatron(rc, bridge=False),
    "llama-factory-mbridge": lambda rc, _: _render_llama_factory_megatron(rc, bridge=True),
}
