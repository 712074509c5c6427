"""NeMo 1.x and NeMo-Framework-Launcher training YAMLs (`megatron_gpt_config.yaml`,
`launcher_scripts/conf/training/<family>/<size>.yaml`).

What NeMo 1.x does with each key is in `nemo/collections/nlp/models/language_modeling/
megatron_base_model.py` (`build_model_parallel_config`, `build_transformer_config`) and
`megatron_gpt_model.py` (`build_transformer_config`, `get_specs`), NVIDIA/NeMo @ 8cfedd72;
defaults are `examples/nlp/language_modeling/conf/megatron_gpt_config.yaml`.

The YAML is read with `yaml.safe_load` (line numbers from a `yaml.compose` node walk); OmegaConf
is used only to resolve `${...}` interpolations over that plain dict, with our own numeric
resolvers (`sum`, `multiply`, `divide_ceil`, `divide_floor`; `gpu_name` never resolves).
Any other resolver (`oc.env`, ...) is left unresolved, never run. This module also holds the
YAML helpers `nemo_rl` uses.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from typing import Any

import yaml

from ..config import ConfigError
from .nemo_rl_overrides import Override
from .nemo_rl_overrides import apply as apply_overrides
from .nemo_rl_overrides import label as label_overrides
from .reading import FROM_ASSUMED, FROM_DERIVED, FROM_FILE, KNOWN_KEYS, Origin, Reading
from .yaml_paths import Path, dotted, lookup

FRAMEWORKS: tuple[str, ...] = ("nemo1",)


# ---------------------------------------------------------------------------------------------
# YAML with line numbers, and safe interpolation (shared with nemo_rl)


def load_yaml(text: str, path: str) -> tuple[dict, dict[Path, int]]:
    """The top-level mapping of a YAML text and the 1-based line of every key path in it."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top, got {type(data).__name__}")
    lines: dict[Path, int] = {}

    def walk(n: Any, prefix: Path) -> None:
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                key = _key_of(key_node)
                here = (*prefix, key)
                lines.setdefault(here, key_node.start_mark.line + 1)
                walk(value_node, here)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                here = (*prefix, i)
                lines.setdefault(here, item.start_mark.line + 1)
                walk(item, here)

    walk(node, ())
    return data, lines


def _key_of(key_node: Any) -> Any:
    """The key as `yaml.safe_load` builds it (so paths match the loaded dict)."""
    if isinstance(key_node, yaml.ScalarNode):
        try:
            return (
                yaml.safe_load(key_node.value)
                if key_node.tag != "tag:yaml.org,2002:str"
                else key_node.value
            )
        except yaml.YAMLError:
            return key_node.value
    return str(key_node.value)


def leaves(data: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
    """Every scalar (and empty container) under `data`, with its path."""
    out: list[tuple[Path, Any]] = []
    if isinstance(data, dict) and data:
        for key, value in data.items():
            out.extend(leaves(value, (*prefix, key)))
    elif isinstance(data, list) and data and any(isinstance(v, (dict, list)) for v in data):
        for i, value in enumerate(data):
            out.extend(leaves(value, (*prefix, i)))
    else:
        out.append((prefix, data))
    return out


def _store(data: Any, p: Path, value: Any) -> None:
    node = data
    for key in p[:-1]:
        node = node[key]
    node[p[-1]] = value


def _num(x: Any) -> int | float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"not a number: {x!r}")
    return x


def _gpu_name(*_: Any) -> str:
    raise ValueError("gpu_name: the GPU is not known when reading a file")


# Safe re-implementations of the frameworks' resolvers (numbers only; never eval).
_RESOLVERS = {
    # NeMo (nemo/core/config/hydra_runner.py) and the Launcher (launcher_scripts/main.py)
    "sum": lambda x, y: _num(x) + _num(y),
    "multiply": lambda x, y: _num(x) * _num(y),
    "divide_ceil": lambda x, y: math.ceil(_num(x) / _num(y)),
    "divide_floor": lambda x, y: math.floor(_num(x) / _num(y)),
    "gpu_name": _gpu_name,
    # NeMo-RL (nemo_rl/utils/config.py)
    "add": lambda a, b: _num(a) + _num(b),
    "mul": lambda a, b: _num(a) * _num(b),
    "div": lambda a, b: _num(a) / _num(b),
    "max": lambda a, b: max(_num(a), _num(b)),
}
NEMO1_RESOLVERS = frozenset({"sum", "multiply", "divide_ceil", "divide_floor", "gpu_name"})
NEMO_RL_RESOLVERS = frozenset({"add", "mul", "div", "max"})
_RESOLVER_CALL = re.compile(r"\$\{\s*([A-Za-z_][\w.\-]*)\s*:")


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
    for name, fn in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            register(name, fn)


def resolve_interpolations(
    data: dict, allowed: frozenset[str], mount: str | None = None
) -> tuple[dict, set[Path]]:
    """A copy of `data` with `${...}` resolved where it can be, and the paths left unresolved
    (a missing key, a resolver outside `allowed` such as `oc.env`, a non-numeric argument).
    `mount`: also make the whole file reachable under that top-level key (the Launcher's
    `${training.model.*}`)."""
    result = copy.deepcopy(data)
    todo = [(p, v) for p, v in leaves(data) if isinstance(v, str) and "${" in v]
    if not todo:
        return result, set()
    unresolved: set[Path] = set()
    prepared = copy.deepcopy(data)
    for p, value in todo:
        if any(name not in allowed for name in _RESOLVER_CALL.findall(value)):
            _store(prepared, p, value.replace("${", "\\${"))  # literal: never run
            unresolved.add(p)
    root = prepared
    if mount and mount not in prepared:
        root = {**prepared, mount: prepared}
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        _register_resolvers()
        cfg = OmegaConf.create(root)
    except Exception:  # keys OmegaConf cannot hold: leave every interpolation as written
        return result, {p for p, _ in todo}
    for p, _ in todo:
        if p in unresolved:
            continue
        try:
            node: Any = cfg
            for key in p:
                node = node[key]
            if isinstance(node, (DictConfig, ListConfig)):
                node = OmegaConf.to_container(node, resolve=True)
        except Exception:
            unresolved.add(p)
            continue
        if any(isinstance(v, str) and "${" in v for _, v in leaves(node)):
            unresolved.add(p)
            continue
        _store(result, p, node)
    return result, unresolved


class FileValues:
    """The (merged, resolved) values of one or more YAML files, with where each key was written:
    `sources` is a list of (file path, raw data, key lines), most specific first."""

    def __init__(
        self,
        reading: Reading,
        resolved: dict,
        sources: list[tuple[str, dict, dict[Path, int]]],
        unresolved: set[Path],
    ) -> None:
        self.reading = reading
        self.data = resolved
        self.sources = sources
        self.unresolved = unresolved
        self.used: set[Path] = set()

    def has(self, *p: Any) -> bool:
        return lookup(self.data, p)[0]

    def raw(self, p: Path) -> Any:
        for _, data, _ in self.sources:
            found, value = lookup(data, p)
            if found:
                return value
        return None

    def where(self, p: Path) -> str:
        for file, data, lines in self.sources:
            if lookup(data, p)[0]:
                line = lines.get(p)
                return f"{file}:{line}" if line else file
        return self.sources[0][0]

    def origin(self, p: Path, note: str = "") -> Origin:
        raw = self.raw(p)
        if isinstance(raw, str) and "${" in raw:
            note = f"{raw}" + (f"; {note}" if note else "")
        return Origin(FROM_FILE, self.where(p), dotted(p), note)

    def get(self, *p: Any, kind: type | tuple | None = None) -> Any:
        """The value at `p` (None when absent, null or unresolved), marking it used."""
        self.used.add(p)
        found, value = lookup(self.data, p)
        if not found or value is None:
            return None
        if p in self.unresolved or (isinstance(value, str) and "${" in value):
            self.reading.warnings.append(
                f"{self.where(p)}: {dotted(p)} = {value!r} could not be resolved here; not read"
            )
            return None
        if kind is not None:
            value = _check(value, kind, self.where(p), dotted(p))
        return value

    def set(self, field: str, value: Any, p: Path, note: str = "") -> None:
        self.reading.set(field, value, self.origin(p, note))

    def take(self, field: str, p: Path, kind: type | tuple | None = None, note: str = "") -> Any:
        value = self.get(*p, kind=kind)
        if value is not None:
            self.set(field, value, p, note)
        return value

    def mark_used(self, p: Path) -> None:
        self.used.add(p)

    def record_unused(self) -> None:
        for p, value in leaves(self.data):
            if not p or any(p[:i] in self.used for i in range(1, len(p) + 1)):
                continue
            self.reading.unused[dotted(p)] = value


def _check(value: Any, kind: Any, where: str, key: str) -> Any:
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    elif kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
    elif kind is list and not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list, got {value!r}")
    return value


def derive_data_parallel(reading: Reading, framework: str) -> None:
    world = reading.get("world_size")
    if world is None or "data_parallel_size" in reading:
        return
    tp = reading.get("tensor_model_parallel_size") or 1
    pp = reading.get("pipeline_model_parallel_size") or 1
    cp = reading.get("context_parallel_size") or 1
    if world % (tp * pp * cp):
        reading.warnings.append(
            f"world size {world} is not a multiple of TP {tp} x PP {pp} x CP {cp}: "
            f"{framework} would refuse it; data_parallel_size not derived"
        )
        return
    reading.derive(
        "data_parallel_size",
        world // (tp * pp * cp),
        f"world_size {world} // (TP {tp} x PP {pp} x CP {cp})",
    )


def moe_mla_recompute_defaults(reading: Reading, where: str) -> None:
    """Megatron-Core's defaults for the MoE / MLA / recompute keys (TransformerConfig,
    MLATransformerConfig), for a reading that has experts / MLA / recompute on."""
    if reading.get("num_moe_experts"):
        reading.default("moe_router_topk", 2, where)
        if reading.get("ffn_hidden_size") is not None:
            reading.derive(
                "moe_ffn_hidden_size",
                reading.get("ffn_hidden_size"),
                "Megatron-Core: None -> ffn_hidden_size",
            )
        reading.default("moe_layer_freq", 1, where)
        reading.default("moe_shared_expert_intermediate_size", None, where)
        reading.default("moe_grouped_gemm", False, where)
    if reading.get("multi_latent_attention"):
        mla = "Megatron-Core's MLATransformerConfig default"
        for key, value in (
            ("q_lora_rank", 512),
            ("kv_lora_rank", 512),
            ("qk_head_dim", 128),
            ("qk_pos_emb_head_dim", 64),
            ("v_head_dim", 128),
        ):
            reading.default(key, value, mla)
    if reading.get("recompute_granularity"):
        reading.default("recompute_method", None, where)
        reading.default("recompute_num_layers", None, where)
        reading.default(
            "recompute_modules", ["core_attn"], "Megatron-Core's default (recompute_modules None)"
        )


# ---------------------------------------------------------------------------------------------
# NeMo 1.x / Launcher


def _top_keys(text: str) -> set[str]:
    return set(re.findall(r"(?m)^([A-Za-z_][\w\-]*)\s*:", text))


_NEMO1_TELLS = (
    "encoder_seq_length",
    "megatron_amp_O2",
    "activations_checkpoint_granularity",
    "mcore_gpt",
    "exp_manager",
)


def sniff(text: str, path: str) -> int:
    top = _top_keys(text)
    if "model" not in top or "policy" in top:
        return 0
    tells = sum(tell in text for tell in _NEMO1_TELLS)
    if not tells:
        return 0
    score = 50 + 10 * tells + (10 if "trainer" in top else 0)
    if path.endswith((".yaml", ".yml")):
        score += 5
    return min(score, 95)


# model.<key> -> Megatron-Core field, with the type NeMo passes on.
_MODEL_INT = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "micro_batch_size",
    "global_batch_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "make_vocab_size_divisible_by",
    "num_moe_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "cpu_offloading_num_layers",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "mtp_num_layers",
)
_MODEL_BOOL = (
    "sequence_parallel",
    "share_embeddings_and_output_weights",
    "qk_layernorm",
    "multi_latent_attention",
    "moe_grouped_gemm",
    "moe_shared_expert_overlap",
    "moe_pad_expert_input_to_capacity",
    "cpu_offloading",
    "apply_rope_fusion",
    "cross_entropy_loss_fusion",
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)
_MODEL_FLOAT = (
    "hidden_dropout",
    "attention_dropout",
    "moe_aux_loss_coeff",
    "moe_expert_capacity_factor",
)
_MODEL_STR = ("position_embedding_type", "moe_router_score_function")
# Megatron-Core fields NeMo 1.x sets itself (config_mapping / model_specific_configs), whatever
# a same-named model key says.
_NEMO_OWNS = {
    "recompute_granularity": "activations_checkpoint_granularity",
    "recompute_method": "activations_checkpoint_method",
    "recompute_num_layers": "activations_checkpoint_num_layers",
}
_ATTN_BACKENDS = {
    "flash": "flash",
    "fused": "fused",
    "unfused": "unfused",
    "auto": "auto",
    "local": "unfused",
}


def read(text: str, path: str, overrides: Sequence[Override] = ()) -> Reading:
    """`overrides`: Hydra's `key=value`s as a NeMo 1.x script (megatron_gpt_pretraining.py) or
    the launcher (`training.` before each key) takes them, applied before `${...}` resolves."""
    data, lines = load_yaml(text, path)
    model = data.get("model")
    if not isinstance(model, dict):
        raise ConfigError(f"{path}: a NeMo 1.x training YAML needs a `model:` mapping")
    launcher = "${training." in text
    mount = "training" if launcher and {"run", "model", "trainer"} & set(data) else None
    reading = Reading(
        framework="nemo1",
        format="NeMo-Framework-Launcher training YAML" if launcher else "NeMo 1.x training YAML",
    )
    sources = [(path, data, lines)]
    if overrides:
        data, sources = apply_overrides(data, sources, list(overrides), reading, True, "NeMo 1.x")
    resolved, unresolved = resolve_interpolations(data, NEMO1_RESOLVERS, mount)
    fv = FileValues(reading, resolved, sources, unresolved)
    _read_model(fv)
    _read_precision(fv)
    _read_trainer(fv)
    fv.record_unused()
    label_overrides(reading, list(overrides))
    return reading


def read_with_overrides(text: str, path: str, words: list[str]) -> Reading:
    """`FILE key=value ...` on recompute-kit's command line, as the script or the launcher
    (`training.trainer.num_nodes=16`: the launcher's `training` config is this file) takes them."""
    launcher = "${training." in text

    def own(word: str) -> str:
        op = word[: len(word) - len(word.lstrip("+~"))]
        rest = word[len(op) :]
        return op + rest.removeprefix("training.") if launcher else word

    return read(text, path, [Override(own(w), applies_to=path) for w in words])


def _read_model(fv: FileValues) -> None:
    m = "model"
    fv.take("seq_length", (m, "encoder_seq_length"), int)
    for key in _MODEL_INT:
        fv.take(key, (m, key), int)
    for key in _MODEL_BOOL:
        fv.take(key, (m, key), bool)
    for key in _MODEL_FLOAT:
        fv.take(key, (m, key), float)
    for key in _MODEL_STR:
        fv.take(key, (m, key), str)
    freq = fv.get(m, "moe_layer_freq", kind=(int, list))
    if freq is not None:
        fv.set("moe_layer_freq", freq, (m, "moe_layer_freq"))
    fv.take("recompute_modules", (m, "recompute_modules"), list)
    fv.take("offload_modules", (m, "offload_modules"), list)

    activation = fv.get(m, "activation", kind=str)
    if activation is not None:
        name = activation.lower()
        glu = name.endswith("glu")
        notes = {
            "swiglu": "a GLU with silu",
            "fast-swiglu": "a GLU with silu",
            "geglu": "a GLU with gelu: counted as swiglu (a gated MLP, same memory)",
            "fast-geglu": "a GLU with gelu: counted as swiglu (a gated MLP, same memory)",
            "reglu": "a GLU with relu: counted as swiglu (a gated MLP, same memory)",
            "fast-reglu": "a GLU with relu: counted as swiglu (a gated MLP, same memory)",
        }
        note = notes.get(name, "" if name == "gelu" else f"{activation}: not a gated linear unit")
        fv.set("swiglu", glu, (m, "activation"), note)
    fv.take("add_bias_linear", (m, "bias"), bool)

    norm = fv.get(m, "normalization", kind=str)
    if norm is not None:
        low = norm.lower()
        if low in ("layernorm", "layernorm1p"):
            note = "layernorm1p: LayerNorm with zero-centred gamma" if low == "layernorm1p" else ""
            fv.set("normalization", "LayerNorm", (m, "normalization"), note)
        elif low == "rmsnorm":
            fv.set("normalization", "RMSNorm", (m, "normalization"))
        else:
            fv.reading.warnings.append(
                f"{fv.where((m, 'normalization'))}: model.normalization {norm!r} is not one "
                "Megatron-Core supports (layernorm, rmsnorm, layernorm1p); not read"
            )

    # recompute: NeMo 1.x copies activations_checkpoint_* into the TransformerConfig ...
    granularity_path = (m, "activations_checkpoint_granularity")
    if fv.has(*granularity_path):
        granularity = fv.get(*granularity_path, kind=str)
        if granularity is not None and granularity not in ("full", "selective"):
            raise ConfigError(
                f"{fv.where(granularity_path)}: model.activations_checkpoint_granularity must be "
                f"'full', 'selective' or null, got {granularity!r}"
            )
        fv.set("recompute_granularity", granularity, granularity_path)
    # (a null the file writes is read as written: NeMo passes it on as None)
    for field, key, kind in (
        ("recompute_method", "activations_checkpoint_method", str),
        ("recompute_num_layers", "activations_checkpoint_num_layers", int),
    ):
        if fv.has(m, key):
            fv.set(field, fv.get(m, key, kind=kind), (m, key))
    # ... and ignores recompute_* keys of the same names (config_mapping wins).
    for field, nemo_key in _NEMO_OWNS.items():
        if fv.has(m, field):
            fv.reading.warnings.append(
                f"{fv.where((m, field))}: model.{field} is ignored by NeMo 1.x (it sets "
                f"{field} from model.{nemo_key}); not used"
            )

    # Transformer Engine, attention
    te = fv.get(m, "transformer_engine", kind=bool)
    if te is not None:
        fv.set(
            "transformer_impl", "transformer_engine" if te else "local", (m, "transformer_engine")
        )
    mcore = fv.get(m, "mcore_gpt", kind=bool)
    if mcore is False:
        fv.reading.warnings.append(
            f"{fv.where((m, 'mcore_gpt'))}: model.mcore_gpt False builds NeMo's legacy GPT model, "
            "not Megatron-Core's: the estimate is for the Megatron-Core model"
        )
    backend = fv.get(m, "attention_backend", kind=str)
    if backend is not None:
        name = backend.split(".")[-1].lower()
        if name not in _ATTN_BACKENDS:
            raise ConfigError(
                f"{fv.where((m, 'attention_backend'))}: model.attention_backend {backend!r} is not "
                "one of flash, fused, unfused, local, auto"
            )
        note = "local: Megatron-Core's DotProductAttention" if name == "local" else ""
        fv.set("attention_backend", _ATTN_BACKENDS[name], (m, "attention_backend"), note)
    flash = fv.get(m, "use_flash_attention", kind=bool)
    if flash and te is not True and "attention_backend" not in fv.reading:
        if mcore is False:
            fv.set(
                "attention_backend",
                "flash",
                (m, "use_flash_attention"),
                "legacy model's flash attention",
            )
        else:
            fv.reading.warnings.append(
                f"{fv.where((m, 'use_flash_attention'))}: model.use_flash_attention does nothing "
                "for the Megatron-Core model without transformer_engine (local spec: unfused "
                "attention)"
            )

    fp8 = fv.get(m, "fp8", kind=bool)
    if fp8 is not None:
        if not fp8:
            fv.set("fp8", None, (m, "fp8"))
        elif fv.get(m, "fp8_e4m3"):
            fv.set("fp8", "e4m3", (m, "fp8"), "fp8_e4m3")
        elif fv.get(m, "fp8_hybrid"):
            fv.set("fp8", "hybrid", (m, "fp8"), "fp8_hybrid")
        else:
            raise ConfigError(
                f"{fv.where((m, 'fp8'))}: model.fp8 is on but neither fp8_e4m3 nor fp8_hybrid "
                "is set (NeMo refuses it)"
            )

    name = fv.get(m, "optim", "name", kind=str)
    if name is not None:
        dist = name in ("distributed_fused_adam", "mcore_distributed_optim")
        fv.set("use_distributed_optimizer", dist, (m, "optim", "name"))
    sync = fv.get(m, "optim", "grad_sync_dtype", kind=str)
    if sync is not None:
        # megatron_gpt_model.py setup_mcore_distributed_parallel: DistributedDataParallelConfig(
        # grad_reduce_in_fp32=(optim.grad_sync_dtype == 'fp32')); the gradient buffer's dtype
        fv.set(
            "grad_reduce_in_fp32",
            sync in ("fp32", "float32"),
            (m, "optim", "grad_sync_dtype"),
            f"grad_sync_dtype {sync}: the gradient buffer's dtype",
        )
    elif name == "mcore_distributed_optim":
        fv.reading.default(
            "grad_reduce_in_fp32",
            True,
            "NeMo's megatron_gpt_model.py (optim.get('grad_sync_dtype', 'fp32') == 'fp32')",
        )

    fsdp = fv.get(m, "fsdp", kind=bool)
    if fsdp is not None:
        strategy = fv.get(m, "fsdp_sharding_strategy") or "full"
        stage = (2 if strategy == "grad" else 3) if fsdp else 0
        fv.set("zero_stage", stage, (m, "fsdp"), f"torch FSDP, sharding {strategy}" if fsdp else "")

    # NeMo builds the embedding with override_vocab_size when set (megatron_gpt_model.py:
    # `padded_vocab_size = override_vocab_size or the tokenizer's, padded`)
    fv.take(
        "vocab_size",
        (m, "override_vocab_size"),
        int,
        "override_vocab_size: the tokenizer's is not used",
    )
    tok_model = fv.raw((m, "tokenizer", "model"))
    sized = re.search(r"(\d+)k\.model$", tok_model) if isinstance(tok_model, str) else None
    if sized and "vocab_size" not in fv.reading:
        # a SentencePiece file named for its size (nemotron_2_256k.model): a guess, said
        fv.reading.set(
            "vocab_size",
            int(sized.group(1)) * 1000,
            Origin(
                FROM_ASSUMED,
                fv.where((m, "tokenizer", "model")),
                "+model.override_vocab_size=N",
                f"the tokenizer file's name (model.tokenizer.model) says {sized.group(1)}k; "
                "the file is not read",
            ),
        )
    tok_lib = fv.raw((m, "tokenizer", "library"))
    tok_type = fv.raw((m, "tokenizer", "type"))
    if tok_lib == "huggingface" and isinstance(tok_type, str) and "/" in tok_type:
        fv.reading.tokenizer = tok_type
        fv.reading.tokenizer_origin = Origin(
            FROM_FILE, fv.where((m, "tokenizer", "type")), "model.tokenizer.type"
        )

    # mcore_customization_config: passed straight to the TransformerConfig (setattr, last).
    custom = fv.data.get("model", {}).get("mcore_customization_config")
    if isinstance(custom, dict):
        for key in custom:
            if key in KNOWN_KEYS:
                fv.take(key, (m, "mcore_customization_config", key))


def _read_precision(fv: FileValues) -> None:
    p_path = ("model", "precision")
    if lookup(fv.data, p_path)[1] is None:
        fv.mark_used(p_path)
        p_path = ("trainer", "precision")
    precision = fv.get(*p_path)
    o2_path = ("model", "megatron_amp_O2")
    o2 = fv.get(*o2_path, kind=bool)
    if precision is None:
        return
    text = str(precision).lower()
    if text in ("bf16", "bf16-mixed"):
        dtype = "bf16"
    elif text in ("16", "16-mixed"):
        dtype = "fp16"
    elif text in ("32", "32-true"):
        dtype = "fp32"
    else:
        raise ConfigError(
            f"{fv.where(p_path)}: {dotted(p_path)} {precision!r} is not a precision NeMo 1.x knows "
            "(bf16, bf16-mixed, 16, 16-mixed, 32)"
        )
    note = f"{dotted(p_path)} {precision}"
    if o2 is None:
        o2 = True
        note += ", megatron_amp_O2 absent: megatron_gpt_config.yaml's True"
    else:
        note += f", megatron_amp_O2 {o2}"
    if not o2 and dtype != "fp32":
        note += ": fp32 parameters with autocast"
    fv.set("bf16", dtype == "bf16" and o2, p_path, note)
    fv.set("fp16", dtype == "fp16" and o2, p_path, note)


def _read_trainer(fv: FileValues) -> None:
    devices = fv.get("trainer", "devices")
    nodes = fv.get("trainer", "num_nodes", kind=int)
    if devices is None and nodes is None:
        return
    if isinstance(devices, list):
        devices = len(devices)
    if devices is not None and (
        isinstance(devices, bool) or not isinstance(devices, int) or devices < 1
    ):
        fv.reading.warnings.append(
            f"{fv.where(('trainer', 'devices'))}: trainer.devices {devices!r} depends on the "
            "machine; world_size not read"
        )
        return
    p = ("trainer", "devices") if devices is not None else ("trainer", "num_nodes")
    d, n = devices or 1, nodes or 1
    note = f"trainer.devices {d} x trainer.num_nodes {n}"
    if devices is None or nodes is None:
        note += " (the other absent: 1)"
    fv.set("world_size", d * n, p, note)


def apply_defaults(reading: Reading) -> None:
    yml = "NeMo's default (examples/nlp/language_modeling/conf/megatron_gpt_config.yaml)"
    code = "NeMo's default (megatron_gpt_model.py)"
    if not reading.model_name:
        reading.default("num_layers", 12, yml)
        reading.default("hidden_size", 768, yml)
        reading.default("num_attention_heads", 12, yml)
    heads, hidden = reading.get("num_attention_heads"), reading.get("hidden_size")
    if heads:
        reading.derive(
            "num_query_groups", heads, "model.num_query_groups null: multi-head attention"
        )
        if hidden:
            reading.derive(
                "kv_channels", hidden // heads, "model.kv_channels null: hidden_size // heads"
            )
    if hidden and "ffn_hidden_size" not in reading:
        if reading.origins.get("hidden_size") and reading.origins["hidden_size"].kind == "default":
            reading.default("ffn_hidden_size", 3072, yml)
        else:
            reading.derive(
                "ffn_hidden_size",
                4 * hidden,
                "Megatron-Core: ffn_hidden_size None -> 4 x hidden_size",
            )
    reading.default("seq_length", 512, yml, "model.encoder_seq_length")
    reading.default("micro_batch_size", 4, yml)
    reading.default("normalization", "LayerNorm", yml, "layernorm")
    reading.default("swiglu", False, yml, "activation gelu")
    reading.default("add_bias_linear", True, yml, "bias True")
    reading.default("share_embeddings_and_output_weights", True, yml)
    reading.default("position_embedding_type", "learned_absolute", yml)
    reading.default("qk_layernorm", False, "Megatron-Core's TransformerConfig default")
    reading.default("transformer_impl", "local", yml, "transformer_engine False")
    if reading.get("transformer_impl") == "local":
        reading.derive(
            "attention_backend",
            "unfused",
            "transformer_engine False: local layer spec, DotProductAttention",
        )
    reading.default("attention_backend", "auto", code, "attention_backend auto")
    reading.default("bf16", True, yml, "trainer.precision bf16, megatron_amp_O2 True")
    reading.default("fp16", False, yml, "trainer.precision bf16")
    reading.default("fp8", None, yml, "fp8 False")
    reading.default("num_moe_experts", None, code)
    reading.default("multi_latent_attention", False, code)
    reading.default("tensor_model_parallel_size", 1, yml)
    reading.default("pipeline_model_parallel_size", 1, yml)
    reading.default("virtual_pipeline_model_parallel_size", None, yml)
    reading.default("context_parallel_size", 1, code)
    reading.default("expert_model_parallel_size", 1, yml)
    reading.default("sequence_parallel", False, yml)
    if reading.get("sequence_parallel") and reading.get("tensor_model_parallel_size") == 1:
        reading.set(
            "sequence_parallel",
            False,
            Origin(
                FROM_DERIVED,
                "NeMo turns sequence_parallel off at TP=1 (megatron_base_model.py)",
                note="true in the file",
            ),
        )
        reading.warnings.append("sequence_parallel is on with TP=1: NeMo turns it off")
    reading.default("world_size", 1, yml, "trainer.devices 1 x trainer.num_nodes 1")
    derive_data_parallel(reading, "NeMo")
    reading.default("use_distributed_optimizer", False, yml, "optim.name fused_adam")
    reading.default("zero_stage", 0, yml, "fsdp False")
    reading.default("recompute_granularity", None, yml, "activations_checkpoint_granularity null")
    reading.default("cpu_offloading", False, yml)
    if reading.get("cpu_offloading") and reading.get("num_layers"):
        reading.default(
            "cpu_offloading_num_layers", reading.get("num_layers") - 1, yml, "num_layers - 1"
        )
    reading.default(
        "fine_grained_activation_offloading", False, "NeMo 1.x has no fine-grained offloading"
    )
    moe_mla_recompute_defaults(reading, "Megatron-Core's TransformerConfig default")


_KEY_FOR = {
    "seq_length": "model.encoder_seq_length",
    "swiglu": "model.activation",
    "add_bias_linear": "model.bias",
    "bf16": "trainer.precision + model.megatron_amp_O2",
    "fp16": "trainer.precision + model.megatron_amp_O2",
    "fp8": "model.fp8 (+ fp8_e4m3 / fp8_hybrid)",
    "use_distributed_optimizer": "model.optim.name",
    "zero_stage": "model.fsdp",
    "world_size": "trainer.devices x trainer.num_nodes",
    "data_parallel_size": "trainer.devices x trainer.num_nodes",
    "recompute_granularity": "model.activations_checkpoint_granularity",
    "recompute_method": "model.activations_checkpoint_method",
    "recompute_num_layers": "model.activations_checkpoint_num_layers",
    "transformer_impl": "model.transformer_engine",
    "vocab_size": "+model.override_vocab_size=N, or the tokenizer",
}


def key_for(field: str) -> str:
    return _KEY_FOR.get(field, f"model.{field}")
