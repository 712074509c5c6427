"""NeMo-RL YAMLs (`examples/configs/*.yaml`, `examples/configs/recipes/llm/*.yaml`).

Semantics: NVIDIA-NeMo/RL @ 7ea279ab: `nemo_rl/utils/config.py` (`defaults:` inheritance,
`_override_`, resolvers `add`/`mul`/`div`/`max`), `nemo_rl/models/megatron/setup.py` (what
`policy.megatron_cfg.*` sets on the Megatron-Core config), the DTensor (FSDP2) policy for
`policy.dtensor_cfg.*`. Defaults: `examples/configs/grpo_math_1B.yaml`.

`defaults:` parents are read from where NeMo-RL reads them (relative to the file that names
them); a copy of the same name beside the file only with a warning saying so. A parent not found
is a warning naming the path, and the keys the files leave out take the defaults of the base
config of the algorithm the parent's name says (sft.yaml's for an SFT recipe), never another
algorithm's. `InheritingReading.parents` lists the parents read (`read`'s inputs).
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

from ..config import ConfigError
from . import nemo_rl_overrides
from .bridge import dtype_name
from .nemo import (
    NEMO_RL_RESOLVERS,
    FileValues,
    Path,
    derive_data_parallel,
    load_yaml,
    moe_mla_recompute_defaults,
    resolve_interpolations,
)
from .nemo_rl_overrides import Override
from .reading import (
    FROM_DERIVED,
    KNOWN_KEYS,
    MODEL_PARALLEL_SIZES,
    SHAPE_NOT_FROM_NAME,
    Origin,
    Reading,
)

FRAMEWORKS: tuple[str, ...] = ("nemo-rl",)

MEGATRON = "NeMo-RL YAML (Megatron backend)"
DTENSOR = "NeMo-RL YAML (DTensor / FSDP2 backend)"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_MAX_DEPTH = 10


def sniff(text: str, path: str) -> int:
    top = set(re.findall(r"(?m)^([A-Za-z_][\w\-]*)\s*:", text))
    if "policy" not in top:
        return 0
    tells = sum(
        t in text
        for t in (
            "megatron_cfg",
            "dtensor_cfg",
            "max_total_sequence_length",
            "train_micro_batch_size",
        )
    )
    score = 60 + 8 * tells + (10 if "cluster" in top else 0) + (5 if "defaults" in top else 0)
    return min(score, 95)


# ---------------------------------------------------------------------------------------------
# defaults: inheritance (nemo_rl/utils/config.py load_config_with_inheritance)


class InheritingReading(Reading):
    """A NeMo-RL reading, with the `defaults:` parents it read (`read`'s inputs list them)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parents: list[str] = []  # every parent file read, nearest first


def _load_chain(
    text: str,
    path: str,
    reading: InheritingReading,
    missing: list[str],
    depth: int = 0,
    seen: tuple[str, ...] = (),
) -> tuple[dict, list[tuple[str, dict, dict[Path, int]]]]:
    """The merged data of `path` and its parents, and the files' (path, data, lines), most
    specific first (where a key was written: the first file that has it). Parents named but
    not read go to `missing` (their names as written), in the order NeMo-RL merges them."""
    data, lines = load_yaml(text, path)
    data = copy.deepcopy(data)
    parents = data.pop("defaults", None)
    own = [(path, data, lines)]
    if parents is None:
        return data, own
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError(
            f"{path}:{lines.get(('defaults',), 1)}: defaults must be a file name or a list of them"
        )
    where = f"{path}:{lines.get(('defaults',), 1)}"
    base: dict = {}
    chain: list[tuple[str, dict, dict[Path, int]]] = []
    for parent in parents:
        named = _parent_path(path, parent)
        found = named if os.path.isfile(named) else None
        if found is None:
            beside = os.path.join(os.path.dirname(path), os.path.basename(parent))
            if os.path.isfile(beside) and os.path.abspath(beside) != os.path.abspath(path):
                found = beside
                reading.warnings.append(
                    f"{where}: defaults {parent!r} names {os.path.normpath(named)}, which does "
                    f"not exist; read {os.path.normpath(beside)} (beside this file) in its "
                    "place: it is not the path named, and NeMo-RL itself would not find the "
                    "parent"
                )
        if found is None or depth >= _MAX_DEPTH or os.path.abspath(found) in seen:
            missing.append(parent)
            why = (
                f"{os.path.normpath(named)} does not exist"
                if found is None
                else "an inheritance loop or too deep"
            )
            reading.warnings.append(
                f"{where}: defaults {parent!r}: {why}; the parent's values are not read (keys "
                f"this file leaves out take {_base_words(parent)}); put the parent at that "
                "path to read it"
            )
            continue
        try:
            with open(found, encoding="utf-8") as fh:
                parent_text = fh.read()
        except OSError as exc:
            raise ConfigError(f"{found}: cannot read the parent config ({exc.strerror})") from None
        found = os.path.normpath(found)
        reading.parents.append(found)
        parent_data, parent_chain = _load_chain(
            parent_text, found, reading, missing, depth + 1, (*seen, os.path.abspath(path))
        )
        base = _merge_with_override(base, parent_data)
        chain = parent_chain + chain  # later parents win over earlier ones
    merged = _merge_with_override(base, data)
    return merged, own + chain


def _parent_path(path: str, parent: str) -> str:
    """Where NeMo-RL looks for a parent: relative to the directory of the file that names it,
    unless absolute (nemo_rl/utils/config.py resolve_path: `config_path.parent / default`)."""
    if parent.startswith("/"):
        return parent
    return os.path.join(os.path.dirname(path), parent)


def _merge_with_override(base: dict, override: dict) -> dict:
    """OmegaConf.merge, except a top-level mapping with `_override_: true` replaces the base's."""
    base = copy.deepcopy(base)
    override = copy.deepcopy(override)
    for key, value in override.items():
        if isinstance(value, dict) and value.get("_override_", False):
            value.pop("_override_")
            base.pop(key, None)
    return _deep_merge(base, override)


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _deep_merge(base[key], value) if key in base else value
        return out
    return over


# ---------------------------------------------------------------------------------------------
# The base configs NeMo-RL's recipes start from (examples/configs/*.yaml @ 7ea279ab: the root
# files, with no `defaults:` of their own) and the values recompute-kit reads from them: a
# parent that is not found stands in by its algorithm's base, never another algorithm's.

_BASE_VALUES: dict[str, dict[str, Any]] = {
    # policy.max_total_sequence_length, policy.train_micro_batch_size; megatron_cfg's TP, PP,
    # CP, EP, expert TP, SP (None: the base leaves it out); dtensor_cfg's TP, CP, SP,
    # activation_checkpointing. Every base: bfloat16, 1 node x 1 GPU, distributed optimizer.
    "sft": {"seq": 1024, "mbs": 1, "mg": (1, 1, 1, 1, 1, False), "dt": (1, 1, False, False)},
    "dpo": {"seq": 1024, "mbs": 2, "mg": (2, 1, 1, 1, 1, True), "dt": (1, 1, False, False)},
    "grpo_math_1B": {
        "seq": 512,
        "mbs": 4,
        "mg": (1, 1, 1, 1, 1, False),
        "dt": (1, 1, False, False),
    },
    "ppo_math_1B": {
        "seq": 16384,
        "mbs": 4,
        "mg": (1, 1, 1, 1, 1, False),
        "dt": (1, 1, False, False),
    },
    "rm": {"seq": 8192, "mbs": 1, "mg": (2, 2, 1, None, None, False), "dt": (1, 1, False, False)},
    "distillation_math": {
        "seq": 8192,
        "mbs": 1,
        "mg": (2, 2, 2, 1, 1, False),
        "dt": (2, 2, False, True),
    },
}
# A config's file name says its algorithm (examples/configs/*.yaml, recipes/llm/*.yaml).
_ALGORITHM_OF_NAME = (
    (re.compile(r"distillation|xtoken"), "distillation_math"),
    (re.compile(r"^sft"), "sft"),
    (re.compile(r"^dpo"), "dpo"),
    (re.compile(r"^ppo"), "ppo_math_1B"),
    (re.compile(r"^rm(?:[_.\-]|$)"), "rm"),
    (re.compile(r"grpo|gdpo|prorl|dapo"), "grpo_math_1B"),
)
# The top-level section a file without parents trains with.
_ALGORITHM_OF_SECTION = {
    "sft": "sft",
    "dpo": "dpo",
    "grpo": "grpo_math_1B",
    "ppo": "ppo_math_1B",
    "rm": "rm",
    "distillation": "distillation_math",
}


def _base_of_name(name: str) -> str | None:
    stem = os.path.basename(name).lower()
    for pattern, base in _ALGORITHM_OF_NAME:
        if pattern.search(stem):
            return base
    return None


def _base_words(parent: str) -> str:
    base = _base_of_name(parent)
    if base is None:
        return "recompute-kit's assumptions: the name says no algorithm recompute-kit knows"
    return f"NeMo-RL's examples/configs/{base}.yaml defaults"


def _apply_base(reading: Reading, base: str, why: str) -> None:
    """The base config's values for the keys nothing read sets."""
    v = _BASE_VALUES[base]
    where = f"NeMo-RL's examples/configs/{base}.yaml ({why})"
    reading.default("seq_length", v["seq"], where, "policy.max_total_sequence_length")
    reading.default("micro_batch_size", v["mbs"], where, "policy.train_micro_batch_size")
    reading.default("bf16", True, where, "policy.precision bfloat16")
    reading.default("fp16", False, where, "policy.precision bfloat16")
    reading.default("world_size", 1, where, "cluster 1 node x 1 GPU")
    if reading.format.startswith(MEGATRON):
        keys = (*MODEL_PARALLEL_SIZES, "sequence_parallel")
        for key, value in zip(keys, v["mg"], strict=True):
            if value is not None:
                reading.default(key, value, where, f"megatron_cfg.{key}")
        return
    tp, cp, sp, ckpt = v["dt"]
    reading.default("tensor_model_parallel_size", tp, where, "dtensor_cfg.tensor_parallel_size")
    reading.default("context_parallel_size", cp, where, "dtensor_cfg.context_parallel_size")
    reading.default("sequence_parallel", sp, where, "dtensor_cfg.sequence_parallel")
    note = f"dtensor_cfg.activation_checkpointing {str(ckpt).lower()}"
    reading.default("recompute_granularity", "full" if ckpt else None, where, note)
    if ckpt:
        reading.default("recompute_method", "uniform", where, note)
        reading.default("recompute_num_layers", 1, where, note)


def _stand_in_for_parents(
    reading: Reading, path: str, data: dict, has_parents: bool, missing: list[str]
) -> None:
    """Keys the files leave out: a missing parent's algorithm base (the last one named wins,
    as NeMo-RL merges them), or for a file without parents its own algorithm's base."""
    for parent in reversed(missing):
        base = _base_of_name(parent)
        if base is not None:
            _apply_base(reading, base, f"the base of {parent!r}, which is not read")
    if has_parents:
        return
    base = _base_of_name(path)
    if base is None:
        base = next((b for s, b in _ALGORITHM_OF_SECTION.items() if s in data), None)
    if base is not None:
        _apply_base(reading, base, "the base of this file's algorithm")


# ---------------------------------------------------------------------------------------------


def read(
    text: str, path: str, overrides: list[Override] = (), absent: str | None = None
) -> Reading:
    """`overrides`: a launch command's `key=value`s, applied after the `defaults:` chain and
    before `${...}` is resolved (nemo_rl_overrides.py); `absent`: the config the command names
    is not found: only the overrides are read, on the base its name says."""
    reading = InheritingReading(framework="nemo-rl")
    missing: list[str] = [absent] if absent else []
    merged, sources = _load_chain(text, path, reading, missing) if not absent else ({}, [])
    if overrides:
        merged, sources = nemo_rl_overrides.apply(merged, sources, overrides, reading, not missing)
    resolved, unresolved = resolve_interpolations(merged, NEMO_RL_RESOLVERS)
    fv = FileValues(reading, resolved, sources, unresolved)
    policy = resolved.setdefault("policy", {}) if absent else resolved.get("policy")
    if not isinstance(policy, dict):
        raise ConfigError(f"{path}: a NeMo-RL config needs a `policy:` mapping")
    p = "policy"

    name = fv.get(p, "model_name", kind=str)
    if name is not None:
        if _HF_ID.match(name) and not name.startswith((".", "/")):
            reading.model_name = name
            reading.model_name_origin = fv.origin((p, "model_name"))
        else:
            reading.warnings.append(
                f"{fv.where((p, 'model_name'))}: policy.model_name {name!r} is not a Hugging Face "
                f"id (a local path?): {SHAPE_NOT_FROM_NAME}"
            )
    fv.take("seq_length", (p, "max_total_sequence_length"), int)
    if fv.has("dpo"):
        _dpo_pairs(fv)
    else:
        fv.take("micro_batch_size", (p, "train_micro_batch_size"), int)
        fv.take("global_batch_size", (p, "train_global_batch_size"), int)
    precision = fv.get(p, "precision", kind=str)
    if precision is not None:
        flags = {"bfloat16": (True, False), "float16": (False, True), "float32": (False, False)}
        if precision not in flags:
            raise ConfigError(
                f"{fv.where((p, 'precision'))}: policy.precision must be bfloat16, float16 or "
                f"float32, got {precision!r}"
            )
        fv.set("bf16", flags[precision][0], (p, "precision"))
        fv.set("fp16", flags[precision][1], (p, "precision"))

    _packed_micro_batches(fv)
    _log_prob_passes(fv)
    megatron_on = fv.get(p, "megatron_cfg", "enabled", kind=bool)
    if megatron_on:
        reading.format = MEGATRON + (DPO if fv.has("dpo") else "")
        _read_megatron(fv)
        # the training loss takes the chunk size too (models/megatron/train.py); setup.py
        # asserts defer_fp32_logits with it
        chunk = fv.get(p, "logprob_chunk_size", kind=int)
        fv.get(p, "megatron_cfg", "defer_fp32_logits", kind=bool)
        if chunk is not None and chunk > 0:
            reading.warnings.append(_CHUNKED_NOTE.format(chunk=chunk))
        # nemo_rl/models/policy/__init__.py: "a chunked linear cross-entropy fusion kernel
        # directly from hidden states, avoiding materialization of the full ... logit tensor"
        if fv.get(p, "megatron_cfg", "use_fused_linear_logprobs", kind=bool):
            size = fv.get(p, "megatron_cfg", "fused_linear_logprobs_chunk_size", kind=int)
            reading.warnings.append(
                f"{fv.where((p, 'megatron_cfg', 'use_fused_linear_logprobs'))}: "
                "use_fused_linear_logprobs: NeMo-RL computes the log-probabilities from the "
                "hidden states a chunk of tokens at a time"
                + (f" ({size})" if size else "")
                + ", never the whole logits; the estimate counts them whole"
            )
    else:
        reading.format = DTENSOR + (DPO if fv.has("dpo") else "")
        dtensor_on = fv.get(p, "dtensor_cfg", "enabled", kind=bool)
        if dtensor_on is False:
            reading.warnings.append(
                f"{fv.where((p, 'dtensor_cfg', 'enabled'))}: neither policy.megatron_cfg nor "
                "policy.dtensor_cfg is enabled; read as the DTensor backend"
            )
        _read_dtensor(fv)
        megatron_only = [
            o.written
            for o in overrides
            if o.path[:2] == ("policy", "megatron_cfg") and o.path[-1] != "enabled"
        ]
        if megatron_only:  # (a paste's overrides of a Megatron run, on a DTensor base YAML)
            reading.warnings.append(
                f"{', '.join(megatron_only)}: Megatron-backend settings, while "
                f"policy.megatron_cfg.enabled is {megatron_on!r} "
                f"({fv.where((p, 'megatron_cfg', 'enabled'))}): NeMo-RL runs the DTensor backend "
                "and ignores them; add policy.megatron_cfg.enabled=true (and "
                "policy.dtensor_cfg.enabled=false) if the run is on Megatron"
            )

    gpus = fv.get("cluster", "gpus_per_node", kind=int)
    nodes = fv.get("cluster", "num_nodes", kind=int)
    if gpus is not None:
        fv.take("gpus_per_node", ("cluster", "gpus_per_node"), int)
    if gpus is not None or nodes is not None:
        where = ("cluster", "gpus_per_node") if gpus is not None else ("cluster", "num_nodes")
        fv.set(
            "world_size",
            (gpus or 1) * (nodes or 1),
            where,
            f"cluster.gpus_per_node {gpus or 1} x cluster.num_nodes {nodes or 1}",
        )
    colocated = fv.raw((p, "generation", "colocated", "enabled"))
    if isinstance(colocated, bool):
        fv.take("inference_colocated", (p, "generation", "colocated", "enabled"), bool)
    if fv.get(p, "generation", "backend") in (None, "vllm"):
        util = (p, "generation", "vllm_cfg", "gpu_memory_utilization")
        fv.take("inference_gpu_memory_utilization", util, (float, int))
    if colocated is True:
        # nemo_rl/models/generation/vllm/vllm_worker.py sleep(): llm.sleep(level=1) offloads
        # the engine's weights and drops its KV cache before the policy trains; its process
        # stays on the GPU with its CUDA context
        vllm = fv.get(p, "generation", "backend") in (None, "vllm")
        reading.warnings.append(
            f"{fv.where((p, 'generation', 'colocated', 'enabled'))}: generation is colocated: "
            "the generation engine sleeps on the same GPUs while the policy trains"
            + (" (vLLM sleep level 1: weights offloaded, KV cache dropped)" if vllm else "")
            + "; what its process keeps there asleep (at least its own CUDA context) is not "
            "in the estimate"
        )
    if colocated is False:
        reading.warnings.append(
            f"{fv.where((p, 'generation', 'colocated', 'enabled'))}: generation is not colocated: "
            "the policy trains on fewer GPUs than the cluster (generation.colocated.resources); "
            "world_size counts the whole cluster"
        )
    _stand_in_for_parents(reading, path, merged, len(sources) > 1 or bool(missing), missing)
    fv.record_unused()
    nemo_rl_overrides.label(reading, list(overrides))
    return reading


def _log_prob_passes(fv: FileValues) -> None:
    """NeMo-RL's log-prob passes (the previous policy's and the reference's: forward only, no
    gradients) run policy.logprob_batch_size sequences per micro-batch. Above the training
    micro-batch, their logits can set the peak, and the estimate sizes the training step only:
    said aloud, with the keys that chunk them (a skill trial found the key listed unused)."""
    p = "policy"
    passes = fv.get(p, "logprob_batch_size", kind=int)
    train = fv.reading.values.get("micro_batch_size")
    if passes is None or not isinstance(train, int) or passes <= train:
        return
    seq = fv.reading.values.get("seq_length")
    chunk = fv.get(p, "logprob_chunk_size", kind=int)
    tokens = f"{passes} x {seq}" if isinstance(seq, int) else f"{passes} sequences'"
    held = (
        f"in chunks of {chunk} tokens (policy.logprob_chunk_size)"
        if chunk
        else "whole, in fp32 (policy.logprob_chunk_size with policy.megatron_cfg."
        "defer_fp32_logits: true computes them in chunks)"
    )
    fv.reading.warnings.append(
        f"{fv.where((p, 'logprob_batch_size'))}: policy.logprob_batch_size = {passes}, against "
        f"the training micro-batch's {train}: the log-prob passes (forward only) hold logits of "
        f"{tokens} tokens x the vocabulary / TP {held}; the estimate sizes the training step, "
        "not these passes"
    )


# NeMo-RL's DPO trains on preference pairs: each micro-batch holds the chosen and the rejected
# sequence of every example (nemo_rl/algorithms/dpo.py: policy.train(gbs=train_global_batch_size
# * 2, mbs=train_micro_batch_size * 2)); the reference policy's weights wait in host memory and
# are swapped into the policy for the reference log-probs (Megatron backend: models/megatron/
# setup.py setup_reference_model_state, "Store reference state dict on CPU"; DTensor: the
# same, get_cpu_state_dict / setup_reference_model_state)
DPO_NOTE = "DPO: chosen and rejected sequences of each pair (nemo_rl/algorithms/dpo.py, x 2)"
DPO = " (DPO: pairs)"


def _dpo_pairs(fv: FileValues) -> None:
    p, reading = "policy", fv.reading
    for field, key in (
        ("micro_batch_size", "train_micro_batch_size"),
        ("global_batch_size", "train_global_batch_size"),
    ):
        pairs = fv.get(p, key, kind=int)
        if pairs is not None:
            fv.set(field, 2 * pairs, (p, key), f"{pairs} pairs: {DPO_NOTE}")
    reading.set("preference_pairs", True, Origin(FROM_DERIVED, "NeMo-RL's DPO", note=DPO_NOTE))
    reading.warnings.append(
        f"{fv.where(('dpo',))}: DPO's reference policy is kept in host memory (NeMo-RL "
        "stores its state dict on the CPU and swaps it into the policy for the reference "
        "log-probs): not in the GPU figures; it takes about the policy's weights per rank of "
        "host memory, twice that during a swap"
    )


def read_with_overrides(text: str, path: str, words: list[str]) -> Reading:
    """`FILE key=value ...` on recompute-kit's command line: as the launch command gives them."""
    return read(text, path, [Override(w, applies_to=path) for w in words])


def _packed_micro_batches(fv: FileValues) -> None:
    """Sequence packing or dynamic batching: a training micro-batch is a bin of up to
    `train_mb_tokens` tokens (nemo_rl/data_plane/worker_mixin.py max_tokens_per_microbatch),
    which the estimate counts as micro_batch_size x max_total_sequence_length: said where the
    two differ (the shipped configs interpolate one from the other)."""
    p = "policy"
    mbs, seq = fv.reading.values.get("micro_batch_size"), fv.reading.values.get("seq_length")
    for section in ("sequence_packing", "dynamic_batching"):
        if fv.raw((p, section, "enabled")) is not True:  # (left in `unused`: patches read it)
            continue
        tokens = fv.get(p, section, "train_mb_tokens", kind=int)
        if tokens is None or mbs is None or seq is None:
            continue
        fv.mark_used((p, section, "train_mb_tokens"))
        if tokens != mbs * seq:
            fv.reading.warnings.append(
                f"{fv.where((p, section, 'train_mb_tokens'))}: policy.{section} is on: a "
                f"micro-batch holds up to train_mb_tokens {tokens} tokens, not micro_batch_size "
                f"x max_total_sequence_length = {mbs * seq} as estimated: for the packed bin, "
                f"estimate with --micro-batch-size 1 --seq-length {tokens}"
            )


def _read_megatron(fv: FileValues) -> None:
    m = ("policy", "megatron_cfg")
    # the backend this file enables decides the sharding (an inherited DTensor one no longer)
    fv.set("zero_stage", 0, (*m, "enabled"), "Megatron backend: no ZeRO/FSDP sharding")
    for key in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
    ):
        fv.take(key, (*m, key), int)
    fv.take("sequence_parallel", (*m, "sequence_parallel"), bool)

    ckpt = fv.get(*m, "activation_checkpointing", kind=bool)
    granularity = fv.get(*m, "recompute_granularity", kind=str)
    modules = fv.get(*m, "recompute_modules", kind=list)
    where = (*m, "activation_checkpointing")
    if ckpt:
        # the granularity's own key where one says it (a file's line, an override), else
        # activation_checkpointing's (NeMo-RL's default granularity is full)
        said = (*m, "recompute_granularity") if granularity else where
        on = f"activation_checkpointing true ({fv.where(where)})"
        granularity = granularity or "full"
        if granularity == "full":
            fv.set("recompute_granularity", "full", said, f"recompute_granularity full; {on}")
            fv.set("recompute_method", "uniform", said, "NeMo-RL: full -> uniform, 1 layer")
            fv.set("recompute_num_layers", 1, said, "NeMo-RL: full -> uniform, 1 layer")
        elif granularity == "selective":
            fv.set(
                "recompute_granularity", "selective", said, f"recompute_granularity selective; {on}"
            )
            if modules is not None:
                fv.set("recompute_modules", modules, (*m, "recompute_modules"))
        else:
            raise ConfigError(
                f"{fv.where((*m, 'recompute_granularity'))}: policy.megatron_cfg."
                f"recompute_granularity must be 'full' or 'selective', got {granularity!r}"
            )
    elif ckpt is False:
        fv.set(
            "recompute_granularity",
            None,
            where,
            "activation_checkpointing false: recompute_granularity ignored",
        )

    opt = (*m, "optimizer")
    fv.take("use_distributed_optimizer", (*opt, "use_distributed_optimizer"), bool)
    offload = fv.get(*opt, "optimizer_cpu_offload", kind=bool)
    if offload is not None:
        fraction = fv.get(*opt, "optimizer_offload_fraction")
        note = f"optimizer_offload_fraction {fraction}" if offload else ""
        fv.set("optimizer_offload", offload, (*opt, "optimizer_cpu_offload"), note)
    # setup.py passes megatron_cfg.optimizer to OptimizerConfig and this to DDP's config
    fv.take("use_precision_aware_optimizer", (*opt, "use_precision_aware_optimizer"), bool)
    fv.take("store_param_remainders", (*opt, "store_param_remainders"), bool)
    for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        dtype = dtype_name(fv.get(*opt, key))
        if dtype is not None:
            fv.set(key, dtype, (*opt, key))
    ddp = (*m, "distributed_data_parallel_config", "grad_reduce_in_fp32")
    fv.take("grad_reduce_in_fp32", ddp, bool)

    fine = fv.get(*m, "fine_grained_activation_offloading", kind=bool)
    if fine is not None:
        fv.set(
            "fine_grained_activation_offloading", fine, (*m, "fine_grained_activation_offloading")
        )
        if fine:
            fv.take("offload_modules", (*m, "offload_modules"), list)
        else:
            fv.mark_used((*m, "offload_modules"))

    fp8 = (*m, "fp8_cfg")
    enabled = fv.get(*fp8, "enabled", kind=bool)
    if enabled is not None:
        if enabled:
            fmt = fv.get(*fp8, "fp8", kind=str) or "e4m3"
            fv.set("fp8", fmt, (*fp8, "fp8"))
            fv.take("fp8_recipe", (*fp8, "fp8_recipe"), str)
        else:
            fv.set("fp8", None, (*fp8, "enabled"))

    # setup.py _apply_mtp_config copies it whenever the key is there: 0 turns off the MTP
    # layers a model's config.json asks for (DeepSeek-V3's num_nextn_predict_layers)
    mtp = fv.get(*m, "mtp_num_layers", kind=int)
    if mtp is not None:
        fv.set("mtp_num_layers", mtp, (*m, "mtp_num_layers"))
    # Other Megatron-Core fields under megatron_cfg (and model_overrides) go to the model config.
    cfg = fv.data["policy"]["megatron_cfg"]
    for key in list(cfg):
        if key in KNOWN_KEYS and (*m, key) not in fv.used and key != "mtp_num_layers":
            fv.take(key, (*m, key))
    overrides = cfg.get("model_overrides")
    if isinstance(overrides, dict):
        for key in overrides:
            if key in KNOWN_KEYS:
                fv.take(key, (*m, "model_overrides", key))


def _read_dtensor(fv: FileValues) -> None:
    d = ("policy", "dtensor_cfg")
    where = (*d, "enabled") if fv.has(*d, "enabled") else d
    fv.set(
        "zero_stage",
        3,
        where,
        "DTensor policy: FSDP2 shards parameters, gradients and optimizer states",
    )
    fv.set("use_torch_fsdp2", True, where, "DTensor policy: PyTorch FSDP2")
    fv.take("tensor_model_parallel_size", (*d, "tensor_parallel_size"), int)
    fv.take("context_parallel_size", (*d, "context_parallel_size"), int)
    fv.take("sequence_parallel", (*d, "sequence_parallel"), bool)
    ckpt = fv.get(*d, "activation_checkpointing", kind=bool)
    if ckpt is not None:
        p = (*d, "activation_checkpointing")
        if ckpt:
            note = "activation checkpointing of every decoder layer"
            fv.set("recompute_granularity", "full", p, note)
            fv.set("recompute_method", "uniform", p, note)
            fv.set("recompute_num_layers", 1, p, note)
        else:
            fv.set("recompute_granularity", None, p)
    lora = fv.get(*d, "lora_cfg", "enabled", kind=bool)
    if lora is not None:  # the adapters' switch (a disabled lora_cfg section is no LoRA)
        note = "LoRA adapters on frozen base weights; the adapters' own states not counted"
        fv.set("frozen_base", lora, (*d, "lora_cfg", "enabled"), note if lora else "")
    offload = fv.get(*d, "cpu_offload", kind=bool)
    if offload is not None:
        note = "FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer states on the host"
        fv.set("param_offload", offload, (*d, "cpu_offload"), note if offload else "")
        fv.set("optimizer_offload", offload, (*d, "cpu_offload"), note if offload else "")


_LOGPROBS = (
    "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/"
    "nemo_rl/distributed/model_utils.py DistributedLogprob"
)
_LOGPROBS_NOTE = (
    "NeMo-RL computes the log-probabilities itself (DistributedLogprob), not with Megatron's "
    "loss: its fp32 softmax kept for backward is counted as Megatron's unfused cross-entropy "
    "keeps it; the fp32 temporaries of its forward (the copy, the shifted logits and the "
    "log-softmax beside the 16-bit logits, by its code) are not"
)
_CHUNKED_NOTE = (
    "NeMo-RL computes the log-probabilities in chunks of {chunk} tokens "
    "(policy.logprob_chunk_size {chunk} with defer_fp32_logits: ChunkedDistributedLogprob): "
    "its fp32 copies are a chunk's at a time and it keeps the 16-bit logits for backward; the "
    "estimate counts the loss as Megatron's unfused cross-entropy keeps it"
)


def _logprobs_note(reading: Reading) -> tuple[str, bool]:
    """How NeMo-RL's training loss holds the logits (the chunked note the reader said where
    policy.logprob_chunk_size is set, else whole), and whether it is said already."""
    head = _CHUNKED_NOTE.split("{", 1)[0]
    chunked = next((w for w in reading.warnings if w.startswith(head)), None)
    return (chunked, True) if chunked else (_LOGPROBS_NOTE, False)


def apply_defaults(reading: Reading) -> None:
    yml = "NeMo-RL's default (examples/configs/grpo_math_1B.yaml)"
    mcore = "Megatron-Core's TransformerConfig default"
    # seq_length and micro_batch_size differ by algorithm (sft 1024 x 1, grpo 512 x 4): the
    # reader fills them from the base of the algorithm it knows, else they are assumed
    reading.default("bf16", True, yml, "policy.precision bfloat16")
    reading.default("fp16", False, yml, "policy.precision bfloat16")
    reading.default("world_size", 1, yml, "cluster 1 node x 1 GPU")
    # several inputs read as "... + ...": the last one (the file that inherits) decides
    if reading.format.rsplit(" + ", 1)[-1].endswith(MEGATRON):  # also a launch command's
        # the Megatron policy builds its model with Megatron-Bridge's AutoBridge: what the
        # model's bridge sets (Qwen3-MoE: grouped GEMM, alltoall) where the YAML says nothing
        # (nemo_rl/models/megatron/setup.py overrides only the keys megatron_cfg has)
        from .bridge_common import apply_provider_settings

        # The policy's forward returns the logits and NeMo-RL takes the log-probabilities
        # itself (models/megatron/train.py from_parallel_logits_to_logprobs: an fp32 copy, its
        # log-softmax, the fp32 softmax kept for backward), never Megatron's loss: the fp32
        # softmax is what Megatron's unfused cross-entropy keeps, not a bridge's fused one.
        note, said = _logprobs_note(reading)
        reading.set("cross_entropy_loss_fusion", False, Origin(FROM_DERIVED, _LOGPROBS, note=note))
        if not said:
            reading.warnings.append(note)
        apply_provider_settings(reading)
        for key in MODEL_PARALLEL_SIZES:
            if key != "expert_tensor_parallel_size":  # (Bridge's own default, below)
                reading.default(key, 1, yml)
        from .bridge_common import apply_expert_tensor_parallel_default

        apply_expert_tensor_parallel_default(reading)
        reading.default("virtual_pipeline_model_parallel_size", None, mcore)
        reading.default("sequence_parallel", False, yml)
        reading.default(
            "use_distributed_optimizer",
            True,
            yml,
            "megatron_cfg.optimizer.use_distributed_optimizer",
        )
        reading.default("zero_stage", 0, "Megatron backend: no ZeRO/FSDP sharding")
        reading.default("optimizer_offload", False, yml)
        reading.default(
            "grad_reduce_in_fp32",
            False,
            yml,
            "megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32",
        )
        opt_default = (
            "Megatron-Core's OptimizerConfig default (NeMo-RL passes megatron_cfg.optimizer)"
        )
        reading.default("use_precision_aware_optimizer", True, yml, "megatron_cfg.optimizer")
        for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            reading.default(key, "fp32", opt_default)
        reading.default("store_param_remainders", True, opt_default)
        reading.default(
            "recompute_granularity", None, yml, "megatron_cfg.activation_checkpointing false"
        )
        reading.default("fp8", None, yml, "megatron_cfg.fp8_cfg.enabled false")
        reading.default("attention_backend", "auto", mcore)
        reading.default("cpu_offloading", False, mcore)
        reading.default("fine_grained_activation_offloading", False, yml)
    else:
        dt = "NeMo-RL's DTensor policy"
        reading.default("tensor_model_parallel_size", 1, yml, "dtensor_cfg.tensor_parallel_size")
        reading.default("context_parallel_size", 1, yml, "dtensor_cfg.context_parallel_size")
        reading.default("pipeline_model_parallel_size", 1, dt, "no pipeline parallelism")
        reading.default("virtual_pipeline_model_parallel_size", None, dt, "no pipeline parallelism")
        reading.default("expert_model_parallel_size", 1, dt)
        reading.default("sequence_parallel", False, yml)
        reading.default("zero_stage", 3, dt, "FSDP2")
        reading.default(
            "use_distributed_optimizer", False, dt, "FSDP2, not Megatron's distributed optimizer"
        )
        reading.default("optimizer_offload", False, yml, "dtensor_cfg.cpu_offload false")
        reading.default("param_offload", False, yml, "dtensor_cfg.cpu_offload false")
        reading.default(
            "recompute_granularity", None, yml, "dtensor_cfg.activation_checkpointing false"
        )
        reading.default("fp8", None, dt)
        reading.default("cpu_offloading", False, dt)
        reading.default("fine_grained_activation_offloading", False, dt)
    derive_data_parallel(reading, "NeMo-RL")
    moe_mla_recompute_defaults(reading, mcore)


_KEY_FOR = {
    "seq_length": "policy.max_total_sequence_length",
    "micro_batch_size": "policy.train_micro_batch_size",
    "global_batch_size": "policy.train_global_batch_size",
    "bf16": "policy.precision",
    "fp16": "policy.precision",
    "fp8": "policy.megatron_cfg.fp8_cfg",
    "world_size": "cluster.gpus_per_node x cluster.num_nodes",
    "data_parallel_size": "cluster.gpus_per_node x cluster.num_nodes",
    "use_distributed_optimizer": "policy.megatron_cfg.optimizer.use_distributed_optimizer",
    "optimizer_offload": "policy.megatron_cfg.optimizer.optimizer_cpu_offload",
    "recompute_granularity": "policy.megatron_cfg.activation_checkpointing + recompute_granularity",
    "zero_stage": "policy.dtensor_cfg.enabled",
}


_PARALLEL = (
    *MODEL_PARALLEL_SIZES,
    "sequence_parallel",
    "recompute_modules",
    "fine_grained_activation_offloading",
    "offload_modules",
    "virtual_pipeline_model_parallel_size",
    "cpu_offloading",
    "attention_backend",
)


def key_for(field: str) -> str:
    if field in _KEY_FOR:
        return _KEY_FOR[field]
    if field in KNOWN_KEYS and field not in _PARALLEL:
        # shape and architecture: the model's config.json (policy.model_name)
        return f"policy.model_name's config.json, or policy.megatron_cfg.model_overrides.{field}"
    return f"policy.megatron_cfg.{field}"
