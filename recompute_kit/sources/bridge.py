"""Megatron-Bridge and NeMo 2.0: ConfigContainer YAML/JSON (override files and the serialized
`run_config.yaml` / dry-run configs), Hydra-style overrides (`run_recipe.py` command lines) and
Python recipes (read with `ast` by `recipes.py`, never imported).

Every format is turned into entries `(section, key, value, line, key_as_written)` under the
ConfigContainer's sections (`model`, `train`, `dataset`, `ddp`, `optimizer`, `dist`,
`mixed_precision`, NeMo 2's `trainer`/`strategy`/`data`), then mapped here onto Megatron-Core
field names by `apply_entries`.

Sources (config-formats.md §3, §5): Megatron-Bridge `src/megatron/bridge/training/config.py`,
`models/gpt_provider.py`, `models/llama/llama_provider.py`
(https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/2afd2d34f7d7b2e84095af1a7fd7244902189ebc/src/megatron/bridge/models/llama/llama_provider.py),
`scripts/training/run_recipe.py`; NeMo `nemo/collections/llm/gpt/model/llama.py`
(https://github.com/NVIDIA/NeMo/blob/008df615de39d6e00422c41f86f15fc0b7a03606/nemo/collections/llm/gpt/model/llama.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from ..config import ConfigError
from . import megatron_core
from .reading import (
    FROM_ASSUMED,
    FROM_FILE,
    KNOWN_KEYS,
    MEMORY_KEYS,
    MLA_KEYS,
    MOE_KEYS,
    RECOMPUTE_KEYS,
    Origin,
    Reading,
)

FRAMEWORKS = ("megatron-bridge", "nemo2")

BRIDGE = "megatron-bridge"
NEMO2 = "nemo2"
# how a value set inside an `if` the values read do not decide is noted (recipes.py)
UNDECIDED = "undecided: read as taken"
# reading.unused key that marks a reading made of overrides applied on top of a recipe (its value
# names the recipe, or says it is unknown): the recipe decides what the overrides leave out.
ON_RECIPE = "(applied on top of recipe)"
UNKNOWN_RECIPE = "unknown recipe"  # its value when the file names none
# What a YAML of overrides says of the recipe under it (replaced where that recipe is read).
YAML_ON_RECIPE = (
    "a YAML of overrides, merged on top of a recipe: what it leaves out is the recipe's, "
    "not read here"
)

_PROVIDER_URL = (
    "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/2afd2d34f7d7b2e84095af1a7fd7244902189ebc/"
    "src/megatron/bridge/models/llama/llama_provider.py"
)
_NEMO_QWEN3_URL = (
    "https://github.com/NVIDIA/NeMo/blob/8cfedd7203462cb251a914e700e5605444277561/"
    "nemo/collections/llm/gpt/model/qwen3.py"
)
_NEMO_LLAMA_URL = (
    "https://github.com/NVIDIA/NeMo/blob/008df615de39d6e00422c41f86f15fc0b7a03606/"
    "nemo/collections/llm/gpt/model/llama.py"
)

# NeMo 2.0's LlamaConfig (nemo/collections/llm/gpt/model/llama.py, class LlamaConfig), what its
# Llama2/3/3.1/3.2 configs inherit
_NEMO_LLAMA_DEFAULTS = {
    "num_moe_experts": None,  # a dense model (GPTConfig's default)
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "bias_activation_fusion": True,
    "masked_softmax_fusion": True,
    "apply_rope_fusion": True,
}

# NeMo 2.0's Qwen2Config / Qwen3Config / Qwen3MoEConfig (qwen2.py, qwen3.py at 8cfedd7): no
# dropout; the MoE ones (the *_A3B / *_A22B classes) group their experts behind all-to-all
_NEMO_QWEN3_DEFAULTS = {
    "num_moe_experts": None,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "moe_grouped_gemm": True,
    "moe_token_dispatcher_type": "alltoall",
    "moe_aux_loss_coeff": 1e-3,
}
_NEMO_MIXTRAL_URL = (
    "https://github.com/NVIDIA/NeMo/blob/8cfedd7203462cb251a914e700e5605444277561/"
    "nemo/collections/llm/gpt/model/mixtral.py"
)
# NeMo 2.0's MixtralConfig (mixtral.py at 8cfedd7, lines 55-81), what MixtralConfig8x7B / 8x22B
# inherit: all-to-all dispatch, aux loss 0.01, fused bias-SwiGLU and RoPE, bf16 parameters
_NEMO_MIXTRAL_DEFAULTS = {
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "moe_aux_loss_coeff": 0.01,
    "moe_token_dispatcher_type": "alltoall",
    "bf16": True,
    "apply_rope_fusion": True,
    "bias_activation_fusion": True,
    "masked_softmax_fusion": False,
}
_NEMO_CLASS_DEFAULTS = {  # source -> (the base config class, what it sets)
    _NEMO_LLAMA_URL: ("LlamaConfig", _NEMO_LLAMA_DEFAULTS),
    _NEMO_QWEN3_URL: ("Qwen3Config", _NEMO_QWEN3_DEFAULTS),
    _NEMO_MIXTRAL_URL: ("MixtralConfig", _NEMO_MIXTRAL_DEFAULTS),
}

# Model classes a file may name -> (HF id, the class's own seq_length default or None, source).
# Shape and architecture come from the registry by HF id; only what the class sets beyond the HF
# config (its seq_length) is kept here.
MODEL_CLASSES: dict[str, tuple[str, int | None, str]] = {
    # Megatron-Bridge providers (llama_provider.py, MB v0.3 era)
    "Llama2ModelProvider7B": ("meta-llama/Llama-2-7b-hf", 4096, _PROVIDER_URL),
    "Llama2ModelProvider13B": ("meta-llama/Llama-2-13b-hf", 4096, _PROVIDER_URL),
    "Llama2ModelProvider70B": ("meta-llama/Llama-2-70b-hf", 4096, _PROVIDER_URL),
    "Llama3ModelProvider8B": ("meta-llama/Meta-Llama-3-8B", 8192, _PROVIDER_URL),
    "Llama3ModelProvider70B": ("meta-llama/Meta-Llama-3-70B", 8192, _PROVIDER_URL),
    "Llama31ModelProvider8B": ("meta-llama/Llama-3.1-8B", 131072, _PROVIDER_URL),
    "Llama31ModelProvider70B": ("meta-llama/Llama-3.1-70B", 131072, _PROVIDER_URL),
    "Llama31ModelProvider405B": ("meta-llama/Llama-3.1-405B", 131072, _PROVIDER_URL),
    "Llama32ModelProvider1B": ("meta-llama/Llama-3.2-1B", 131072, _PROVIDER_URL),
    "Llama32ModelProvider3B": ("meta-llama/Llama-3.2-3B", 131072, _PROVIDER_URL),
    # Qwen3 providers: seq_length 40960 (config-formats.md §3, MB03 qwen_provider.py)
    "Qwen3ModelProvider0P6B": ("Qwen/Qwen3-0.6B", 40960, "Megatron-Bridge v0.3 qwen_provider.py"),
    "Qwen3ModelProvider1P7B": ("Qwen/Qwen3-1.7B", 40960, "Megatron-Bridge v0.3 qwen_provider.py"),
    "Qwen3ModelProvider4B": ("Qwen/Qwen3-4B", 40960, "Megatron-Bridge v0.3 qwen_provider.py"),
    "Qwen3ModelProvider8B": ("Qwen/Qwen3-8B", 40960, "Megatron-Bridge v0.3 qwen_provider.py"),
    "Qwen3ModelProvider14B": ("Qwen/Qwen3-14B", 40960, "Megatron-Bridge v0.3 qwen_provider.py"),
    "Qwen3ModelProvider32B": ("Qwen/Qwen3-32B", 40960, "Megatron-Bridge v0.3 qwen_provider.py"),
    "Qwen3MoEModelProvider30B_A3B": (
        "Qwen/Qwen3-30B-A3B",
        40960,
        "Megatron-Bridge v0.3 qwen_provider.py",
    ),
    "Qwen3MoEModelProvider235B_A22B": (
        "Qwen/Qwen3-235B-A22B",
        40960,
        "Megatron-Bridge v0.3 qwen_provider.py",
    ),
    "DeepSeekV3ModelProvider": (
        "deepseek-ai/DeepSeek-V3",
        None,
        "Megatron-Bridge deepseek_provider.py",
    ),
    # NeMo 2.0 configs (nemo/collections/llm/gpt/model/llama.py)
    "Llama2Config7B": ("meta-llama/Llama-2-7b-hf", 4096, _NEMO_LLAMA_URL),
    "Llama2Config13B": ("meta-llama/Llama-2-13b-hf", 4096, _NEMO_LLAMA_URL),
    "Llama2Config70B": ("meta-llama/Llama-2-70b-hf", 4096, _NEMO_LLAMA_URL),
    "Llama3Config8B": ("meta-llama/Meta-Llama-3-8B", 8192, _NEMO_LLAMA_URL),
    "Llama3Config70B": ("meta-llama/Meta-Llama-3-70B", 8192, _NEMO_LLAMA_URL),
    "Llama31Config8B": ("meta-llama/Llama-3.1-8B", 131072, _NEMO_LLAMA_URL),
    "Llama31Config70B": ("meta-llama/Llama-3.1-70B", 131072, _NEMO_LLAMA_URL),
    "Llama31Config405B": ("meta-llama/Llama-3.1-405B", 131072, _NEMO_LLAMA_URL),
    # Llama32Config1B/3B set no seq_length: LlamaConfig's 4096 applies.
    "Llama32Config1B": ("meta-llama/Llama-3.2-1B", 4096, _NEMO_LLAMA_URL),
    "Llama32Config3B": ("meta-llama/Llama-3.2-3B", 4096, _NEMO_LLAMA_URL),
    # NeMo 2.0's Qwen3 configs (nemo/collections/llm/gpt/model/qwen3.py): Qwen2Config's
    # seq_length 4096, which none of them overrides
    "Qwen3Config600M": ("Qwen/Qwen3-0.6B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config1P7B": ("Qwen/Qwen3-1.7B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config4B": ("Qwen/Qwen3-4B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config8B": ("Qwen/Qwen3-8B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config14B": ("Qwen/Qwen3-14B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config32B": ("Qwen/Qwen3-32B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config30B_A3B": ("Qwen/Qwen3-30B-A3B", 4096, _NEMO_QWEN3_URL),
    "Qwen3Config235B_A22B": ("Qwen/Qwen3-235B-A22B", 4096, _NEMO_QWEN3_URL),
    "MixtralConfig8x7B": ("mistralai/Mixtral-8x7B-v0.1", 4096, _NEMO_MIXTRAL_URL),
    "MixtralConfig8x22B": ("mistralai/Mixtral-8x22B-v0.1", 4096, _NEMO_MIXTRAL_URL),
}

# Recipe names (`run_recipe.py --recipe NAME` / `--model NAME`) -> HF id, by prefix; the ids are
# those the recipes pass to AutoBridge.from_hf_pretrained (recipes/llama/llama3.py, ...).
RECIPE_MODELS = (
    ("llama32_1b", "meta-llama/Llama-3.2-1B"),
    ("llama32_3b", "meta-llama/Llama-3.2-3B"),
    ("llama31_8b", "meta-llama/Llama-3.1-8B"),
    ("llama31_70b", "meta-llama/Llama-3.1-70B"),
    ("llama31_405b", "meta-llama/Llama-3.1-405B"),
    ("llama3_8b", "meta-llama/Meta-Llama-3-8B"),
    ("llama3_70b", "meta-llama/Meta-Llama-3-70B"),
    ("qwen3_30b_a3b", "Qwen/Qwen3-30B-A3B"),
    ("qwen3_235b_a22b", "Qwen/Qwen3-235B-A22B"),
    ("qwen3_8b", "Qwen/Qwen3-8B"),
    ("qwen3_32b", "Qwen/Qwen3-32B"),
    ("deepseek_v3", "deepseek-ai/DeepSeek-V3"),
    ("gpt_oss_20b", "openai/gpt-oss-20b"),
    ("gpt_oss_120b", "openai/gpt-oss-120b"),
)

# Old section names (Bridge's first override example: model_config, train_config, ...).
SECTION_ALIASES = {
    "model_config": "model",
    "train_config": "train",
    "optimizer_config": "optimizer",
    "ddp_config": "ddp",
    "dataset_config": "dataset",
    "dist_config": "dist",
    "mixed_precision_config": "mixed_precision",
    "data": "dataset",  # NeMo 2.0 recipe.data
}

_SHARDING_STAGE = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


@dataclass
class Entry:
    """One value a file sets: `section.key = value`, at `line` (1-based; 0 unknown)."""

    section: str
    key: str
    value: Any
    line: int
    written: str  # the key as written (`model.seq_length`, `-tp`, `cfg.model.seq_length`)
    where: str = ""  # `file:line` when not the file read (a recipe helper in another file)
    note: str = ""  # how the value was worked out, when not written as it is


class Unresolved:
    """A value that is not a literal (a variable, a call, `${VAR}`): left unset, with a warning."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<unresolved {self.text}>"


# ----------------------------------------------------------------------------------------------
# sniff / read


def sniff(text: str, path: str) -> int:
    low = path.partition("::")[0].lower()  # recipe.py::function names one recipe of a file
    if low.endswith(".py"):
        if re.search(
            r"\b(ConfigContainer|ModelProvider|AutoBridge|MegatronStrategy|nemo_run|run\.Config)\b",
            text,
        ):
            return 90
        # a module of aliases (`from megatron.bridge.recipes.qwen.h100.qwen3_moe import
        # qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config as qwen3_30b_a3b_pretrain_config`)
        alias = r"^from\s+megatron\.bridge\.recipes\.(?!utils\b|common\b)\S+\s+import"
        if re.search(alias, text, re.M):
            return 80
        # a snippet of a recipe: `cfg.model.recompute_granularity = "selective"`
        if re.search(r"^\s*\w+\.(model|train|ddp|optimizer|dataset)\.\w+\s*=", text, re.M):
            return 60
        return 0
    overrides = re.search(
        r"(^|\s)[\"']?[+~]?(model|train|dataset|ddp|optimizer|dist|mixed_precision)\.\w+=", text
    )
    if re.search(r"\b(run_recipe\.py|pretrain_\w+\.py)\b", text) and overrides:
        return 85
    if re.search(r"\brun_recipe\.py\b", text) and re.search(r"--(?:recipe|model)\b", text):
        return 85  # Megatron-Bridge's launcher with its shorthands only (`-sl 8192 -tp 2`)
    # Megatron-Bridge's example scripts (examples/models/*/finetune_<model>.py): a YAML of
    # overrides by --config-file, then Hydra-style overrides on the command line
    if re.search(EXAMPLE_SCRIPT, text) and (overrides or "--config-file" in text):
        return 85
    if low.endswith((".yaml", ".yml", ".json")):
        score = 0
        if "megatron.bridge." in text or "ConfigContainer" in text:
            score = 95
        tops = set(re.findall(r"^([A-Za-z_]\w*):", text, re.M))
        if {"model", "train"} <= tops or {"model_config", "train_config"} <= tops:
            score = max(score, 60)
        if tops & {"ddp", "dist", "mixed_precision", "rng", "scheduler"} and tops & {
            "model",
            "train",
        }:
            score = max(score, 70)
        if json_sections(text):
            score = max(score, 70)
        return score
    if re.search(r"(^|\s)[+~]?model\.\w+=", text):
        return 40
    return 0


EXAMPLE_SCRIPT = r"\b(?:pretrain|finetune)_(\w+)\.py\b"


def json_sections(text: str) -> bool:
    s = text.lstrip()
    if not s.startswith("{"):
        return False
    return '"model"' in s and ('"train"' in s or '"ddp"' in s)


def read(text: str, path: str) -> Reading:
    if path.partition("::")[0].lower().endswith(".py"):
        from . import recipes

        return recipes.read(text, path)
    if path.lower().endswith((".yaml", ".yml", ".json")) or json_sections(text):
        return read_yaml(text, path)
    from . import hydra

    return hydra.read(text, path)


def read_with_overrides(text: str, path: str, words: list[str]) -> Reading:
    """`FILE key=value ...` on recompute-kit's command line: Hydra-style overrides after it."""
    from . import hydra

    return hydra.apply_after(read(text, path), words, path)


# ----------------------------------------------------------------------------------------------
# YAML / JSON


class _TolerantLoader(yaml.SafeLoader):
    """SafeLoader that reads unknown tags (`!!python/object/apply:...`, `!Foo`) as plain data."""


def _plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


_TolerantLoader.add_multi_constructor("!", _plain)
_TolerantLoader.add_multi_constructor("tag:yaml.org,2002:python/", _plain)


def load_yaml(text: str, path: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The document and the 1-based line of every mapping key path."""
    loader = _TolerantLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    finally:
        loader.dispose()
    lines: dict[tuple[str, ...], int] = {}

    def walk(n: yaml.Node, prefix: tuple[str, ...]) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    p = (*prefix, str(k.value))
                    lines.setdefault(p, k.start_mark.line + 1)
                    walk(v, p)

    walk(node, ())
    return data, lines


def read_yaml(text: str, path: str) -> Reading:
    data, lines = load_yaml(text, path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a Megatron-Bridge config must be a mapping of sections (model, train, ...)"
        )
    prefix: tuple[str, ...] = ()
    if set(data) == {"ConfigContainer"} or (
        "ConfigContainer" in data
        and isinstance(data["ConfigContainer"], dict)
        and "model" not in data
    ):
        prefix = ("ConfigContainer",)
        extra = {k: v for k, v in data.items() if k != "ConfigContainer"}
        data = data["ConfigContainer"]
    else:
        extra = {}
    reading = Reading(framework=BRIDGE)
    complete = "_target_" in data or (
        isinstance(data.get("model"), dict) and "_target_" in data["model"]
    )
    reading.format = (
        "Megatron-Bridge ConfigContainer (serialized)"
        if complete
        else "Megatron-Bridge YAML overrides"
    )
    entries: list[Entry] = []
    for section, body in data.items():
        sec = SECTION_ALIASES.get(section, section)
        if isinstance(body, dict):
            for key, value in body.items():
                line = lines.get((*prefix, section, key), 0)
                entries.append(Entry(sec, str(key), value, line, f"{section}.{key}"))
        else:
            entries.append(Entry(sec, "", body, lines.get((*prefix, section), 0), section))
    for key, value in extra.items():
        reading.unused[key] = value
    apply_entries(reading, entries, path)
    if not complete:
        reading.unused[ON_RECIPE] = UNKNOWN_RECIPE
        reading.warnings.append(f"{path}: {YAML_ON_RECIPE}")
    return reading


# ----------------------------------------------------------------------------------------------
# entries -> Megatron-Core fields


def _origin(path: str, e: Entry, note: str = "") -> Origin:
    where = e.where or (f"{path}:{e.line}" if e.line else path)
    # a value set inside an `if` the values read do not decide is the file's only if that
    # branch runs: an assumption, said as one (recipes.py notes the branch)
    kind = FROM_ASSUMED if UNDECIDED in (note or e.note) else FROM_FILE
    return Origin(kind, where, e.written, note or e.note)


def _as_bool(v: Any) -> Any:
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def _target_name(v: Any) -> str | None:
    """`torch.nn.functional.silu` from `{_target_: ..., _call_: false}` or a plain string."""
    if isinstance(v, dict):
        v = v.get("_target_")
    if isinstance(v, str):
        return v
    return None


def _attention_backend(v: Any) -> tuple[str, str]:
    if v is None:
        return "auto", "null: Transformer Engine chooses (as auto)"
    if isinstance(v, (list, tuple)) and v:  # !!python/object/apply:...AttnBackend [1]
        v = v[0]
    if isinstance(v, int):
        names = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}  # AttnBackend enum
        return names.get(v, "auto"), f"AttnBackend value {v}"
    s = str(v).split(".")[-1].lower()
    if s not in ("flash", "fused", "unfused", "auto", "local"):
        raise ConfigError(f"unknown attention_backend {v!r}")
    return s, "" if s == str(v) else f"{v}"


def _fp8(v: Any) -> Any:
    if v in (None, False, "none", "None", "null", "False", "false"):
        return None
    return str(v)


def _set(reading: Reading, key: str, value: Any, origin: Origin) -> None:
    if isinstance(value, Unresolved):
        reading.warnings.append(
            f"{origin.where} {origin.key} = {value.text}: not a literal, left unset"
        )
        return
    reading.set(key, value, origin)


# Keys of Megatron-Bridge's HybridModelProvider (models/hybrid/hybrid_provider.py) and the
# MambaModelProvider before it: a layer pattern with Mamba layers
_HYBRID_KEYS = ("hybrid_layer_pattern", "hybrid_override_pattern", "is_hybrid_model")


def apply_entries(reading: Reading, entries: list[Entry], path: str) -> None:
    """Map ConfigContainer entries onto Megatron-Core fields of `reading`."""
    seq: dict[str, tuple[Any, Entry]] = {}
    glu: tuple[Any, Entry] | None = None
    act: tuple[Any, Entry] | None = None
    dist_opt: list[tuple[Any, Entry]] = []
    precision: list[tuple[str, Any, Entry]] = []  # from model (lower) then mixed_precision (higher)
    sharding: tuple[Any, Entry] | None = None
    for e in entries:
        sec, key, v = e.section, e.key, e.value
        if isinstance(v, str) and key and key not in ("_target_",):
            v = _as_bool(v)
        if sec == "model" and key in ("", "_target_"):
            name = _target_name(v) if key == "_target_" else None
            if key == "" and isinstance(v, Unresolved):
                reading.warnings.append(f"{path}: model = {v.text}: not read")
            elif name:
                reading.unused[e.written] = v
            continue
        if sec in ("model", "strategy"):
            hybrid = any("hybrid/Mamba" in said for said in reading.not_modelled)
            if key in _HYBRID_KEYS and v not in (None, "", False) and not hybrid:
                # Megatron's hybrid stack (Nemotron-H, Nemotron 3): Mamba layers, not sized
                reading.not_modelled.append(
                    f"{e.where} {e.written}: a hybrid model with Mamba layers (Megatron's "
                    "hybrid/Mamba stack)"
                )
            if key in ("seq_length",):
                seq["model"] = (v, e)
            elif key == "gated_linear_unit":
                glu = (v, e)
            elif key == "activation_func":
                act = (v, e)
            elif key == "attention_backend":
                if isinstance(v, Unresolved):
                    _set(reading, key, v, _origin(path, e))
                else:
                    name, note = _attention_backend(v)
                    reading.set(key, name, _origin(path, e, note))
            elif key in _PRECISION_KEYS:
                precision.append((key, v, e))
            elif key == "hf_model_id" and isinstance(v, str):
                set_model_name(reading, v, _origin(path, e))
            elif key in ("world_size", "global_batch_size", "data_parallel_size"):
                reading.unused[e.written] = v
            elif key == "moe_layer_freq" and isinstance(v, str) and v.startswith("["):
                try:
                    _set(reading, key, json.loads(v), _origin(path, e))
                except ValueError:
                    reading.unused[e.written] = v
            elif key == "ddp" and sec == "strategy":
                reading.unused[e.written] = v
            elif key in KNOWN_KEYS:
                if key == "num_moe_experts" and v == 0:
                    v = None
                _set(reading, key, v, _origin(path, e))
            else:
                reading.unused[e.written] = v
        elif sec == "train" and key in ("micro_batch_size", "global_batch_size"):
            _set(reading, key, v, _origin(path, e))
        elif sec == "dataset" and key in ("seq_length", "sequence_length"):
            seq["dataset"] = (v, e)
        elif (
            sec == "dataset"
            and key in ("micro_batch_size", "global_batch_size")
            and reading.framework == NEMO2
        ):
            _set(reading, key, v, _origin(path, e))
        elif sec in ("ddp", "optimizer") and key == "use_distributed_optimizer":
            dist_opt.append((v, e))
        elif sec == "optimizer" and key == "optimizer_cpu_offload":
            _set(reading, "optimizer_offload", v, _origin(path, e))
        elif sec == "optimizer" and key in _OPTIMIZER_FLAG_KEYS:
            _set(reading, key, v, _origin(path, e))
        elif sec == "optimizer" and key in _OPTIMIZER_DTYPE_KEYS:
            _set_dtype(reading, key, v, _origin(path, e))
        elif sec == "ddp" and key == "grad_reduce_in_fp32":
            precision.append((key, v, e))
        elif sec == "ddp" and key == "data_parallel_sharding_strategy":
            sharding = (v, e)
        elif (
            sec == "comm_overlap"
            and key in ("tp_comm_overlap", "overlap_moe_expert_parallel_comm")
            and isinstance(v, bool)
        ):
            _set(reading, key, v, _origin(path, e))
        elif sec in ("dist", "ddp") and key in ("use_megatron_fsdp", "use_torch_fsdp2"):
            if sec == "dist" or key not in reading:
                _set(reading, key, v, _origin(path, e))
            else:
                reading.unused[e.written] = v
        elif sec == "mixed_precision":
            if key == "":
                precision.extend(precision_fields(v, e))
            elif key in _PRECISION_KEYS:
                precision.append((key, v, e))
            elif key == "dtype":  # a shorthand some override examples use
                precision.extend(precision_fields(f"{v}_mixed", e))
            else:
                reading.unused[e.written] = v
        else:
            reading.unused[e.written] = v
    # precision: MixedPrecisionConfig.setup (training/mixed_precision.py) overwrites the
    # same-named fields of the model, optimizer and DDP configs with its own, so its line wins
    precision.sort(key=lambda t: t[2].section == "mixed_precision")  # stable: model/ddp first
    for key, v, e in precision:
        if isinstance(v, Unresolved):
            _set(reading, key, v, _origin(path, e))
        elif key == "fp8":
            reading.set("fp8", _fp8(v), _origin(path, e))
        elif key == "fp8_recipe":
            if v is not None:
                reading.set("fp8_recipe", str(v), _origin(path, e))
        elif UNDECIDED in (e.note or "") and reading.get(key) == bool(v):
            continue  # an `if` not decided sets what a line read as run set already: that one
        else:
            reading.set(
                key, bool(v), _origin(path, e, "" if isinstance(v, bool) else f"{e.written}: {v}")
            )
    # GLU + activation -> swiglu
    if glu is not None or act is not None:
        gv = glu[0] if glu else None
        aname = _target_name(act[0]) if act else None
        e = (glu or act)[1]
        if isinstance(gv, Unresolved):
            _set(reading, "swiglu", gv, _origin(path, e))
        elif gv is not None:
            silu = aname is None or aname.endswith("silu")
            note = f"gated_linear_unit {gv}" + (f", activation {aname}" if aname else "")
            if gv and not silu:
                reading.warnings.append(f"{path}: a GLU with {aname}, read as swiglu (same memory)")
            reading.set("swiglu", bool(gv), _origin(path, e, note))
        elif act is not None:
            reading.unused[act[1].written] = act[0]
    # distributed optimizer: either section's True turns both on; within one section the
    # last assignment is what runs (a NeMo 2.0 LoRA branch sets optim.config's to False
    # after the base recipe's optimizer factory set it True)
    last: dict[str, tuple[Any, Entry]] = {}
    for v, e in dist_opt:
        last[e.section] = (v, e)
    if any(v is True for v, _ in last.values()):
        dist_opt = [(v, e) for v, e in last.values() if v is True]
    else:  # every section's last word is off (or unknown): it is what runs
        dist_opt = []
        for v, e in last.values():
            _set(reading, "use_distributed_optimizer", v, _origin(path, e))
    for v, e in dist_opt:
        if isinstance(v, Unresolved):
            _set(reading, "use_distributed_optimizer", v, _origin(path, e))
        elif v or "use_distributed_optimizer" not in reading:
            reading.set("use_distributed_optimizer", bool(v), _origin(path, e))
    if sharding is not None and not isinstance(sharding[0], Unresolved):
        stage = _SHARDING_STAGE.get(str(sharding[0]))
        if stage and reading.get("use_megatron_fsdp") is not True:
            # Megatron's DDP ignores the strategy: only Megatron-FSDP shards by it
            reading.warnings.append(
                f"{path}: ddp.data_parallel_sharding_strategy {sharding[0]} has no effect "
                "without dist.use_megatron_fsdp (Megatron's DDP ignores it)"
            )
            stage = 0
        if stage is not None:
            reading.set("zero_stage", stage, _origin(path, sharding[1], f"sharding {sharding[0]}"))
    # seq_length lives twice: the dataset's is what the data has; Bridge asserts they are equal
    if "dataset" in seq and "model" in seq:
        dv, de = seq["dataset"]
        mv, me = seq["model"]
        if not isinstance(dv, Unresolved) and not isinstance(mv, Unresolved) and dv != mv:
            reading.warnings.append(
                f"{path}: {me.written} {mv} != {de.written} {dv}: Megatron-Bridge requires them equal; "  # noqa: E501
                f"using the dataset's {dv}"
            )
    pick = seq.get("dataset") or seq.get("model")
    if pick is not None:
        if isinstance(pick[0], Unresolved) and "model" in seq and pick is not seq["model"]:
            pick = seq["model"]
        _set(reading, "seq_length", pick[0], _origin(path, pick[1]))


# MixedPrecisionConfig's fields that recompute-kit uses; setup() copies each onto the model /
# optimizer / DDP config that has a field of that name.
_PRECISION_KEYS = ("bf16", "fp16", "fp8", "fp8_recipe", "grad_reduce_in_fp32")
_OPTIMIZER_FLAG_KEYS = ("use_precision_aware_optimizer", "store_param_remainders")
# OptimizerConfig's precision-aware optimizer dtypes (torch dtypes in a serialized config)
_OPTIMIZER_DTYPE_KEYS = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
_DTYPE_NAMES = {
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "uint8": "fp8",  # Megatron-LM's map_dtype spells fp8 moments as torch.uint8
    "fp8": "fp8",
}


def dtype_name(v: Any) -> str | None:
    """`{_target_: torch.bfloat16}`, `torch.bfloat16`, `bf16` -> "bf16" (None: not a dtype)."""
    if isinstance(v, dict):
        v = v.get("_target_")
    if not isinstance(v, str):
        return None
    name = v.strip().removeprefix("torch.").lower()
    return _DTYPE_NAMES.get(name, "fp8" if name.startswith("float8") else None)


def _set_dtype(reading: Reading, key: str, v: Any, origin: Origin) -> None:
    if isinstance(v, Unresolved):
        _set(reading, key, v, origin)
        return
    name = dtype_name(v)
    if name is None:
        reading.warnings.append(f"{origin.where} {origin.key} = {v!r}: not a dtype, left unset")
        return
    reading.set(key, name, origin)


def precision_fields(v: Any, e: Entry | None) -> list[tuple[str, Any, Entry | None]]:
    """`bf16_mixed`, `bf16-mixed`, `fp16_mixed`, `bf16_with_fp8_..._mixed` (training/mixed_precision.py)."""  # noqa: E501
    if v is None:
        return []
    if isinstance(v, Unresolved):
        return [("bf16", v, e)]
    if isinstance(v, dict):
        out = []
        for k in _PRECISION_KEYS:
            if k in v:
                out.append((k, v[k], e))
        return out
    s = str(v).lower().replace("-", "_")
    # bf16_mixed and the recipes built on it reduce gradients in fp32, fp16_mixed's in fp16
    out = [
        ("bf16", s.startswith("bf16"), e),
        ("fp16", s.startswith("fp16"), e),
        ("grad_reduce_in_fp32", s.startswith("bf16"), e),
    ]
    if "fp8" not in s:
        # a named MixedPrecisionConfig is whole: its fp8 (None) overwrites the model's
        # (training/mixed_precision.py update_config_with_precision_overrides)
        out.append(("fp8", None, e))
    else:
        out.append(("fp8", "hybrid", e))
        for part, recipe in _RECIPE_OF_NAME:
            if part in s:
                out.append(("fp8_recipe", recipe, e))
                break
    return out


# The fp8 recipe each named MixedPrecisionConfig sets (training/mixed_precision.py).
_RECIPE_OF_NAME = (
    ("delayed_scaling", "delayed"),
    ("mxfp8", "mxfp8"),
    ("nanov2_bf16_with_fp8_current_scaling", "blockwise"),
    ("current_scaling", "tensorwise"),
    ("subchannel_scaling", "blockwise"),
)


def set_model_name(reading: Reading, name: str, origin: Origin) -> None:
    """An HF id, a provider / NeMo config class, or a recipe name -> reading.model_name."""
    hf = None
    if name in MODEL_CLASSES:
        hf = MODEL_CLASSES[name][0]
        origin = Origin(origin.kind, origin.where, origin.key, f"{name} -> {hf}")
    elif "/" in name:
        hf = name.removeprefix("hf://")
    else:
        low = name.lower()
        for prefix, model in RECIPE_MODELS:
            if low.startswith(prefix):
                hf = model
                origin = Origin(origin.kind, origin.where, origin.key, f"recipe {name} -> {hf}")
                break
    if hf is None:
        reading.warnings.append(
            f"{origin.where}: model {name!r} is not one recompute-kit maps to a Hugging Face id"
        )
        return
    reading.model_name = hf
    reading.model_name_origin = origin
    if name in MODEL_CLASSES:
        reading.unused["(model class)"] = name


# ----------------------------------------------------------------------------------------------
# defaults


def _bridge_defaults() -> dict[str, Any]:
    """GPTModelProvider / TransformerConfig / ConfigContainer defaults (config-formats.md §2-3):
    Megatron-Core's, with the provider's own seq_length, tied embeddings and vocab padding."""
    return {
        **{k: v for k, v in megatron_core.DEFAULTS.items() if k in MEMORY_KEYS},
        "seq_length": 1024,
        "share_embeddings_and_output_weights": True,
        "make_vocab_size_divisible_by": 128,
    }


# What a named model class fixes beyond its HF config: left to the registry (shape, norm, GLU...)
_ARCH_KEYS = (
    "normalization",
    "swiglu",
    "add_bias_linear",
    "share_embeddings_and_output_weights",
    "position_embedding_type",
    "qk_layernorm",
    "num_moe_experts",
    "multi_latent_attention",
    "make_vocab_size_divisible_by",
)
# Keys a recipe decides when the file is overrides applied on top of it.
_RECIPE_KEYS = (
    "seq_length",
    "micro_batch_size",
    "bf16",
    "fp16",
    "fp8",
    "attention_backend",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "sequence_parallel",
    "use_distributed_optimizer",
    "zero_stage",
    "recompute_granularity",
    "cpu_offloading",
    "fine_grained_activation_offloading",
    *_ARCH_KEYS,
    *RECOMPUTE_KEYS,
)


# Gradient and optimizer-state dtypes when the file leaves them out: Megatron-Core's
# DistributedDataParallelConfig / OptimizerConfig defaults, which Bridge's ddp and optimizer
# sections subclass (a mixed_precision section overrides grad_reduce_in_fp32, read before).
_STATE_DTYPE_DEFAULTS = (
    ("grad_reduce_in_fp32", False, "DistributedDataParallelConfig.grad_reduce_in_fp32"),
    ("use_precision_aware_optimizer", False, "OptimizerConfig.use_precision_aware_optimizer"),
    ("main_params_dtype", "fp32", "OptimizerConfig.main_params_dtype"),
    ("exp_avg_dtype", "fp32", "OptimizerConfig.exp_avg_dtype"),
    ("exp_avg_sq_dtype", "fp32", "OptimizerConfig.exp_avg_sq_dtype"),
    ("store_param_remainders", True, "OptimizerConfig.store_param_remainders"),
)


# Over a recipe not read: Bridge's recipes build on recipes/common.py's _pretrain_common, whose
# ddp.grad_reduce_in_fp32=True (and bf16_mixed) differs from Megatron-Core's DDP default False.
_RECIPE_STATE_DEFAULTS = {
    "grad_reduce_in_fp32": (
        True,
        "Megatron-Bridge's _pretrain_common (recipes/common.py ddp.grad_reduce_in_fp32, "
        "mixed_precision bf16_mixed)",
    ),
}


def apply_defaults(reading: Reading) -> None:
    nemo = reading.framework == NEMO2
    fw = "NeMo 2.0" if nemo else "Megatron-Bridge"
    where_cls = (
        "GPTConfig / MegatronStrategy (nemo/collections/llm/gpt/model/base.py)"
        if nemo
        else (
            "GPTModelProvider / TransformerConfig / ConfigContainer (models/gpt_provider.py, training/config.py)"  # noqa: E501
        )
    )
    on_recipe = reading.unused.get(ON_RECIPE)
    if not nemo:
        from .bridge_common import apply_provider_settings

        apply_provider_settings(reading)
        padded = any(
            k.endswith("should_pad_vocab") and str(v).lower() == "true"
            for k, v in reading.unused.items()
        )
        if not padded:
            # GPTModelProvider.should_pad_vocab False (models/gpt_provider.py provide():
            # padded_vocab_size = self.vocab_size): make_vocab_size_divisible_by pads nothing
            reading.default(
                "make_vocab_size_divisible_by",
                1,
                "Megatron-Bridge's GPTModelProvider (should_pad_vocab False: the vocabulary "
                "is not padded)",
            )
    model_class = reading.unused.get("(model class)")
    named = reading.model_name is not None
    defaults = _bridge_defaults()
    # Both fused on by default (GPTModelProvider's fields, models/gpt_provider.py lines 204-205;
    # NeMo 2.0's GPTConfig, nemo/collections/llm/gpt/model/base.py), not Megatron-Core's off
    defaults["cross_entropy_loss_fusion"] = True
    defaults["masked_softmax_fusion"] = True
    if nemo:
        defaults["attention_backend"] = "auto"
    skipped: list[str] = []
    # a named model class: its own seq_length (provider/config file)
    if isinstance(model_class, str) and model_class in MODEL_CLASSES and not on_recipe:
        _, seq, src = MODEL_CLASSES[model_class]
        if seq is not None:
            reading.default("seq_length", seq, f"{fw}'s default ({model_class}.seq_length, {src})")
    family = MODEL_CLASSES.get(model_class, ("", 0, ""))[2] if isinstance(model_class, str) else ""
    base, class_defaults = _NEMO_CLASS_DEFAULTS.get(family, ("", {}))
    for key, value in class_defaults.items():
        # NeMo 2.0's base config of the class (LlamaConfig, Qwen3Config / Qwen3MoEConfig): no
        # dropout, fusions on, (Qwen3 MoE) grouped experts behind an all-to-all dispatcher;
        # not Megatron-Core's TransformerConfig defaults
        dense_qwen3 = family == _NEMO_QWEN3_URL and not model_class.endswith(("_A3B", "_A22B"))
        if key.startswith("moe_") and dense_qwen3:
            continue
        reading.default(key, value, f"NeMo's {base}, which {model_class} extends ({family})")
    for key, value in defaults.items():
        if key in reading:
            continue
        if on_recipe and key in _RECIPE_KEYS:
            skipped.append(key)
            continue
        if named and key in _ARCH_KEYS:
            continue  # the model's registry entry (applied before) decides
        if named and key == "seq_length" and not model_class:
            continue  # AutoBridge: max_position_embeddings of the HF config
        reading.default(key, value, f"{fw}'s default ({where_cls})")
    for key, value, where in _STATE_DTYPE_DEFAULTS:
        if not on_recipe:
            reading.default(key, value, f"{fw}'s default ({where})")
        elif not nemo:  # the recipe's, not read: what Bridge's recipes start from, said so
            value, where = _RECIPE_STATE_DEFAULTS.get(key, (value, f"Megatron-Core {where}"))
            reading.default(key, value, f"{where}; the recipe ({on_recipe}) may set another")
    if skipped:
        reading.warnings.append(
            f"{', '.join(skipped)}: set by the recipe ({on_recipe}) these overrides apply to, not read here"  # noqa: E501
        )
    if reading.get("recompute_granularity") is not None and not on_recipe:
        if reading.get("recompute_granularity") == "full":
            reading.default("recompute_method", None, f"{fw}'s default (TransformerConfig)")
        for key in ("recompute_method", "recompute_num_layers", "recompute_modules"):
            if key not in reading:
                reading.default(key, None, f"{fw}'s default (TransformerConfig)")
    if not nemo:
        from .bridge_common import apply_expert_tensor_parallel_default

        apply_expert_tensor_parallel_default(reading)
    _derive(reading, fw)


def _derive(reading: Reading, fw: str) -> None:
    h, heads = reading.get("hidden_size"), reading.get("num_attention_heads")
    if isinstance(h, int) and isinstance(heads, int) and heads:
        reading.derive(
            "num_query_groups",
            heads,
            "TransformerConfig: num_query_groups None -> num_attention_heads",
        )
        reading.derive(
            "kv_channels", h // heads, "TransformerConfig: kv_channels None -> hidden_size // heads"
        )
        reading.derive(
            "ffn_hidden_size", 4 * h, "TransformerConfig: ffn_hidden_size None -> 4 * hidden_size"
        )
    if reading.get("num_moe_experts"):
        ffn = reading.get("ffn_hidden_size")
        if ffn is not None:
            reading.derive(
                "moe_ffn_hidden_size",
                ffn,
                "TransformerConfig: moe_ffn_hidden_size None -> ffn_hidden_size",
            )
        for key, value in (
            ("moe_router_topk", 2),
            ("moe_layer_freq", 1),
            ("moe_grouped_gemm", False),
            ("moe_shared_expert_intermediate_size", None),
        ):
            if key in MOE_KEYS and key not in reading:
                reading.default(key, value, f"{fw}'s default (TransformerConfig)")
    if reading.get("multi_latent_attention"):
        for key, value in (
            ("q_lora_rank", 512),
            ("kv_lora_rank", 512),
            ("qk_head_dim", 128),
            ("qk_pos_emb_head_dim", 64),
            ("v_head_dim", 128),
        ):
            if key in MLA_KEYS and key not in reading:
                reading.default(key, value, f"{fw}'s default (MLATransformerConfig)")
    if reading.get("sequence_parallel") and reading.get("tensor_model_parallel_size") == 1:
        reading.warnings.append("sequence_parallel with tensor_model_parallel_size 1: turned off")
        reading.set(
            "sequence_parallel", False, Origin("derived", "sequence parallelism needs TP > 1")
        )
    world = reading.get("world_size")
    sizes = [
        reading.get(k)
        for k in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
        )
    ]
    if isinstance(world, int) and all(isinstance(s, int) and s > 0 for s in sizes):
        div = sizes[0] * sizes[1] * sizes[2]
        if world % div == 0:
            reading.derive(
                "data_parallel_size", world // div, f"world_size {world} // (TP*PP*CP {div})"
            )
        else:
            reading.warnings.append(f"world_size {world} is not a multiple of TP*PP*CP {div}")


_KEY_SECTION = {
    "micro_batch_size": "train.micro_batch_size",
    "global_batch_size": "train.global_batch_size",
    "seq_length": "dataset.seq_length (and model.seq_length)",
    "use_distributed_optimizer": "ddp.use_distributed_optimizer",
    "bf16": "mixed_precision",
    "fp16": "mixed_precision",
    "fp8": "mixed_precision.fp8",
    "use_megatron_fsdp": "dist.use_megatron_fsdp",
    "use_torch_fsdp2": "dist.use_torch_fsdp2",
    "zero_stage": "ddp.data_parallel_sharding_strategy",
    "world_size": "torchrun --nproc_per_node x --nnodes",
    "data_parallel_size": "the world size (torchrun --nproc_per_node x --nnodes) over "
    "TP*PP*CP, or --dp",
    "swiglu": "model.gated_linear_unit + model.activation_func",
    "optimizer_offload": "optimizer.optimizer_cpu_offload",
    "grad_reduce_in_fp32": "mixed_precision.grad_reduce_in_fp32 (over ddp.grad_reduce_in_fp32)",
    "fp8_recipe": "mixed_precision.fp8_recipe (over model.fp8_recipe)",
    "use_precision_aware_optimizer": "optimizer.use_precision_aware_optimizer",
    "main_params_dtype": "optimizer.main_params_dtype",
    "exp_avg_dtype": "optimizer.exp_avg_dtype",
    "exp_avg_sq_dtype": "optimizer.exp_avg_sq_dtype",
    "store_param_remainders": "optimizer.store_param_remainders",
}


def key_for(field: str) -> str:
    return _KEY_SECTION.get(field, f"model.{field}")
