"""NVIDIA NeMo Automodel recipe YAMLs (`examples/**/*.yaml` of NVIDIA-NeMo/Automodel).

Semantics: NVIDIA-NeMo/Automodel @ 36044ad3 (`AM_BLOB`):

* `model.pretrained_model_name_or_path` (or `model.config.pretrained_model_name_or_path` for a
  `from_config` model): a Hugging Face id, whose config.json gives the shape.
* `step_scheduler.local_batch_size`: the samples of one forward/backward on one GPU
  (`components/training/step_scheduler.py`; `recipes/llm/train_ft.py` reads it with default
  1); under pipeline parallelism each of its `distributed.pipeline.pp_microbatch_size`
  microbatches (default 1, train_ft.py) is what a stage holds.
* The sequence: `packed_sequence.packed_sequence_size` > 0 packs every sample to that length
  (train_ft.py infers the pipeline's pp_seq_len from it, else from `dataset.seq_len`); otherwise
  the dataset's `seq_len` (mock / nanogpt datasets: every sample that long) or `seq_length`
  (squad / chat datasets: the longest a sample is padded or truncated to). Without either, a
  batch is padded to its longest sample: no length is known from the file.
* `distributed:` (`recipes/_dist_utils.py` parse_distributed_section): strategy fsdp2 (default)
  / megatron_fsdp / ddp; tp/pp/cp/ep sizes (default 1), dp_size (None: the world over
  tp x pp x cp), dp_replicate_size (HSDP); `activation_checkpointing` true/"full" wraps every
  decoder layer in a checkpoint, "selective" PyTorch's per-op selective AC
  (`components/distributed/activation_checkpointing.py`, torchtitan's op policy).
  FSDP2Config (`components/distributed/config.py`): bf16 compute, fp32 gradient reduction.
* `model.torch_dtype`: the resident (sharded) parameters' dtype; torch.optim keeps its states in
  it, so bf16 storage means bf16 Adam states and no fp32 master copy
  (docs/guides/mixed-precision-training.mdx).
"""

from __future__ import annotations

import re
from typing import Any

from ..config import ConfigError
from .nemo import FileValues, derive_data_parallel, load_yaml, moe_mla_recompute_defaults
from .reading import (
    FROM_DEFAULT,
    KNOWN_KEYS,
    MODEL_PARALLEL_SIZES,
    SHAPE_NOT_FROM_NAME,
    Origin,
    Reading,
)

FRAMEWORKS: tuple[str, ...] = ("automodel",)
FORMAT = "NeMo Automodel recipe YAML"

AM_COMMIT = "36044ad3d139363fb6c73c24af2e7c6b65ec52f6"
AM_BLOB = f"https://github.com/NVIDIA-NeMo/Automodel/blob/{AM_COMMIT}"
DIST_UTILS = "nemo_automodel/recipes/_dist_utils.py"
DIST_CONFIG = "nemo_automodel/components/distributed/config.py"
TRAIN_FT = "nemo_automodel/recipes/llm/train_ft.py"
AUTO_MODEL = "nemo_automodel/_transformers/auto_model.py"
# What resolve labels a field no Automodel key or code decides (Megatron-Core's default).
UNSET_DEFAULT = (
    "assumed by recompute-kit: Megatron-Core's TransformerConfig default (no Automodel key sets it)"
)
PURE_BF16 = "bf16 resident parameters: torch.optim keeps bf16 states, no fp32 master copy"

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_NONE_WORDS = ("none", "None", "null")  # Automodel's loader reads "none" as None (loader.py)
_TOP_TELLS = ("step_scheduler", "dist_env", "distributed", "packed_sequence", "recipe")


def _top_keys(text: str) -> set[str]:
    return set(re.findall(r"(?m)^([A-Za-z_][\w\-]*)\s*:", text))


def sniff(text: str, path: str) -> int:
    """Automodel's own sections: `step_scheduler:` beside `model:` and `distributed:` or
    `dist_env:` (no other framework the kit reads has a step_scheduler), or its package's
    `_target_`s."""
    top = _top_keys(text)
    if "model" not in top:
        return 0
    tells = sum(t in top for t in _TOP_TELLS)
    if "step_scheduler" in top and tells >= 2:
        return 97
    if "nemo_automodel." in text and tells >= 1:
        return 96
    return 0


# -- reading ---------------------------------------------------------------------------------


def _size(fv: FileValues, key: str) -> int | None:
    """distributed.<key>: an integer >= 1, or None for absent / null / "none"."""
    p = ("distributed", key)
    value = fv.get(*p)
    if value is None or value in _NONE_WORDS:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{fv.where(p)}: distributed.{key} must be an integer >= 1 or none")
    return value


def read(text: str, path: str) -> Reading:
    data, lines = load_yaml(text, path)
    reading = Reading(framework="automodel", format=FORMAT)
    fv = FileValues(reading, data, [(path, data, lines)], set())
    for p in (("recipe",), ("model", "_target_")):
        fv.mark_used(p)
    _read_model(fv)
    pp = _read_distributed(fv)
    _read_batch(fv, pp)
    _read_sequence(fv)
    _read_precision(fv)
    _read_loss(fv)
    fv.record_unused()
    return reading


def _read_model(fv: FileValues) -> None:
    reading = fv.reading
    for p in (("model", "pretrained_model_name_or_path"),
              ("model", "config", "pretrained_model_name_or_path")):  # fmt: skip
        name = fv.get(*p)
        if name is None:
            continue
        if isinstance(name, str) and _HF_ID.match(name) and not name.startswith((".", "/")):
            reading.model_name = name
            reading.model_name_origin = fv.origin(p, "the Hugging Face model trained")
        else:
            reading.warnings.append(
                f"{fv.where(p)}: {'.'.join(p)} {name!r} is not a Hugging Face id (a local "
                f"path?): {SHAPE_NOT_FROM_NAME}; pass its config.json"
            )
        break
    attn_p = ("model", "backend", "attn")
    attn = fv.get(*attn_p)
    if attn is None:
        attn_p = ("model", "attn_implementation")
        attn = fv.get(*attn_p)
    if isinstance(attn, str):
        eager = attn == "eager"
        fv.set(
            "attention_backend",
            "unfused" if eager else "flash",
            attn_p,
            "eager attention keeps the s x s scores"
            if eager
            else f"{attn}: a fused attention kernel, no s x s scores kept",
        )


def _read_distributed(fv: FileValues) -> int:
    """The sharding, the parallel sizes and activation checkpointing; returns PP."""
    d = "distributed"
    reading = fv.reading
    strategy = fv.get(d, "strategy", kind=str)
    s_where = (d, "strategy") if strategy is not None else (d,)
    name = (strategy or "fsdp2").lower()
    if name == "fsdp2":
        if fv.has(d):
            note = "FSDP2 fully_shard: parameters, gradients and optimizer states sharded"
            fv.set("zero_stage", 3, s_where, note)
            fv.set("use_torch_fsdp2", True, s_where, "PyTorch FSDP2")
            fv.set("use_distributed_optimizer", False, s_where, "FSDP2 shards the optimizer")
    elif name == "megatron_fsdp":
        stage = fv.get(d, "zero_dp_strategy", kind=int)
        where = (d, "zero_dp_strategy") if stage is not None else s_where
        stage = 3 if stage is None else stage
        note = f"Megatron-FSDP, zero_dp_strategy {stage} (MegatronFSDPConfig default 3)"
        fv.set("zero_stage", stage, where, note)
        fv.set("use_megatron_fsdp", True, s_where)
        fv.set("use_distributed_optimizer", True, s_where, "Megatron-FSDP shards the optimizer")
        fv.take("grad_reduce_in_fp32", (d, "grad_reduce_in_fp32"), bool)
    elif name == "ddp":
        fv.set("zero_stage", 0, s_where, "DDP: every rank holds the whole model states")
        fv.set("use_distributed_optimizer", False, s_where, "DDP")
    else:
        raise ConfigError(
            f"{fv.where(s_where)}: distributed.strategy {strategy!r} (fsdp2, megatron_fsdp or ddp)"
        )
    sizes = {
        "tp_size": "tensor_model_parallel_size",
        "pp_size": "pipeline_model_parallel_size",
        "cp_size": "context_parallel_size",
        "ep_size": "expert_model_parallel_size",
    }
    got = {}
    for key, field in sizes.items():
        value = _size(fv, key)
        if value is not None:
            fv.set(field, value, (d, key))
            got[key] = value
    dp = _size(fv, "dp_size")
    if dp is not None:
        fv.set("data_parallel_size", dp, (d, "dp_size"))
    replicate = _size(fv, "dp_replicate_size")
    if replicate and replicate > 1:
        reading.warnings.append(
            f"{fv.where((d, 'dp_replicate_size'))}: HSDP (dp_replicate_size {replicate}): "
            "states are sharded over dp_size / dp_replicate_size ranks, not the whole "
            "data-parallel group; the estimate shards over all of it"
        )
    if got.get("ep_size", 1) > 1:
        fv.set(
            "expert_tensor_parallel_size",
            1,
            (d, "ep_size"),
            "Automodel shards experts over ep only (no expert tensor parallelism)",
        )
    fv.take("sequence_parallel", (d, "sequence_parallel"), bool)
    offload = fv.get(d, "offload_policy")
    if isinstance(offload, dict):
        note = "FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer states on the host"
        fv.set("param_offload", True, (d, "offload_policy"), note)
        fv.set("optimizer_offload", True, (d, "offload_policy"), note)
    pp = got.get("pp_size", 1)
    if fv.has(d, "pipeline"):
        if pp <= 1:
            fv.mark_used((d, "pipeline"))
            reading.warnings.append(
                f"{fv.where((d, 'pipeline'))}: distributed.pipeline is set but pp_size is "
                f"{pp}: Automodel ignores the pipeline settings ({DIST_UTILS})"
            )
        else:
            schedule = fv.get(d, "pipeline", "pp_schedule")
            if isinstance(schedule, str) and _MULTI_STAGE.search(schedule):
                # the virtual stages follow from the model's layer count, known only once the
                # model's shape is read: apply_defaults derives them (`_virtual_stages`)
                reading.unused["distributed.pipeline.pp_schedule"] = schedule
    _read_activation_checkpointing(fv, name)
    return pp


def _read_activation_checkpointing(fv: FileValues, strategy: str) -> None:
    p = ("distributed", "activation_checkpointing")
    value = fv.get(*p)
    if value is None:
        return
    words = str(value).lower().replace("-", "_")
    if value is True or words in ("true", "on", "full", "enabled", "yes"):
        note = "every decoder layer wrapped in a checkpoint"
        if strategy == "megatron_fsdp":
            note = "Megatron-FSDP: the transformer MLP layers checkpointed (MegatronFSDPConfig)"
            fv.reading.warnings.append(
                f"{fv.where(p)}: under megatron_fsdp activation_checkpointing checkpoints the "
                "MLPs only; counted as every layer fully checkpointed, which keeps less"
            )
        fv.set("recompute_granularity", "full", p, note)
        fv.set("recompute_method", "uniform", p, note)
        fv.set("recompute_num_layers", 1, p, note)
        fv.set("recompute_modules", None, p, "whole layers, no per-module recompute")
    elif value is False or words in ("false", "off", "none", "disabled", "no"):
        fv.set("recompute_granularity", None, p, "no activation checkpointing")
    elif words == "selective":
        fv.set("recompute_granularity", "selective", p, "PyTorch per-op selective AC")
        fv.set(
            "recompute_modules",
            ["layernorm"],
            p,
            "ops outside the save list (matmuls, attention, collectives): norms, activations",
        )
        fv.reading.warnings.append(
            f"{fv.where(p)}: Automodel's selective AC is torchtitan's per-op policy (saves "
            "matmul, attention and collective outputs, recomputes every second matmul and the "
            "elementwise ops): counted as Megatron's layernorm recompute, which keeps more"
        )
    else:
        raise ConfigError(
            f"{fv.where(p)}: distributed.activation_checkpointing {value!r} "
            "(true, false, full or selective)"
        )
    scope = fv.get("distributed", "activation_checkpointing_scope")
    if scope not in (None, "all", ["all"]):
        fv.reading.warnings.append(
            f"{fv.where(('distributed', 'activation_checkpointing_scope'))}: "
            f"activation_checkpointing_scope {scope!r}: only those layer groups are "
            "checkpointed; the estimate counts the decoder layers as checkpointed"
        )


def _read_batch(fv: FileValues, pp: int) -> None:
    s = "step_scheduler"
    local = fv.get(s, "local_batch_size", kind=int)
    if pp > 1:
        mbs_p = ("distributed", "pipeline", "pp_microbatch_size")
        mbs = fv.get(*mbs_p, kind=int)
        if mbs is not None:
            fv.set("micro_batch_size", mbs, mbs_p, f"PP {pp}: each pipeline microbatch")
        else:
            fv.reading.set(
                "micro_batch_size",
                1,
                Origin(
                    FROM_DEFAULT,
                    f"Automodel's default ({TRAIN_FT})",
                    "distributed.pipeline.pp_microbatch_size",
                    f"PP {pp}: the local batch split into microbatches of 1",
                ),
            )
    elif local is not None:
        fv.set("micro_batch_size", local, (s, "local_batch_size"), "samples per GPU per pass")
    fv.take("global_batch_size", (s, "global_batch_size"), int)


def _read_sequence(fv: FileValues) -> None:
    packed_p = ("packed_sequence", "packed_sequence_size")
    packed = fv.get(*packed_p, kind=int)
    if packed:
        fv.set("seq_length", packed, packed_p, "every sample packed to this many tokens")
        return
    for key, note in (
        ("seq_len", "every sample this long (mock / pre-tokenized datasets)"),
        (
            "seq_length",
            "the longest a sample is padded or truncated to: a batch of shorter samples is "
            "padded to its longest only",
        ),
    ):
        value = fv.get("dataset", key, kind=int)
        if value is not None:
            fv.set("seq_length", value, ("dataset", key), note)
            return


_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "auto": "auto",
}


def _dtype(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return _DTYPES.get(value.removeprefix("torch.").lower())


def _read_precision(fv: FileValues) -> None:
    p = ("model", "torch_dtype")
    raw = fv.get(*p)
    if raw is None:
        return
    dtype = _dtype(raw)
    if dtype is None:
        raise ConfigError(f"{fv.where(p)}: model.torch_dtype {raw!r} is not a dtype")
    if dtype == "auto":
        fv.reading.warnings.append(
            f"{fv.where(p)}: model.torch_dtype auto keeps the checkpoint's dtype (its "
            "config.json torch_dtype); counted as fp32 resident parameters"
        )
        return
    compute = "bf16 compute (FSDP2 MixedPrecisionPolicy param_dtype bfloat16)"
    if dtype == "fp16":
        fv.set("fp16", True, p, "fp16 resident parameters")
        fv.set("bf16", False, p)
        return
    fv.set("bf16", True, p, compute)
    fv.set("fp16", False, p)
    if dtype == "fp32":
        fv.set("param_precision", "amp", p, "fp32 resident parameters, bf16 compute")
        return
    # bf16 resident parameters: the optimizer decides whether an fp32 master copy exists
    o = ("optimizer", "_target_")
    optimizer = fv.get(*o)
    if isinstance(optimizer, str) and optimizer.endswith("FusedAdam"):
        master = fv.get("optimizer", "master_weights", kind=bool)
        if master:
            note = "TE FusedAdam master_weights: fp32 master and Adam states beside bf16 params"
            fv.set("param_precision", "fp32_master", ("optimizer", "master_weights"), note)
            fv.take("store_param_remainders", ("optimizer", "store_param_remainders"), bool)
            for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
                said = _dtype(fv.get("optimizer", key))
                if said in ("fp32", "bf16", "fp16"):
                    fv.set(key, said, ("optimizer", key))
            return
    if isinstance(optimizer, str) and not optimizer.startswith("torch.optim."):
        fv.reading.warnings.append(
            f"{fv.where(o)}: optimizer {optimizer!r} with bf16 model.torch_dtype: its state "
            "dtypes are not read; counted as torch.optim's (bf16, no fp32 master copy)"
        )
    fv.set("param_precision", "pure", p, PURE_BF16)
    for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        fv.set(key, "bf16", p, "torch.optim states take the parameters' dtype")


def _read_loss(fv: FileValues) -> None:
    p = ("loss_fn", "_target_")
    target = fv.get(*p)
    if not isinstance(target, str):
        return
    if target.endswith("MaskedCrossEntropy"):
        fv.set(
            "loss_implementation",
            "hf",
            p,
            "the model's logits upcast to fp32 (fp32_upcast true) before torch cross_entropy",
        )
    elif target.endswith(("FusedLinearCrossEntropy", "TEParallelCrossEntropy")):
        fv.reading.warnings.append(
            f"{fv.where(p)}: {target.rsplit('.', 1)[-1]} never holds the whole fp32 logits; "
            "the estimate counts them as Hugging Face's loss does, so the loss is over-counted"
        )


# -- defaults --------------------------------------------------------------------------------


# Schedules that put several stages on each pipeline rank (torch.distributed.pipelining's
# interleaved, looped and zero-bubble schedules); 1F1B and GPipe put one.
_MULTI_STAGE = re.compile(r"interleaved|looped|zero_?bubble|zbv", re.I)
PIPELINING = "nemo_automodel/components/distributed/pipelining/functional.py"


def _virtual_stages(reading: Reading) -> None:
    """A multi-stage schedule's stages per rank (Automodel's calculate_virtual_stages):
    ceil(layers / layers_per_stage) stages, rounded to a multiple of pp_size as
    round_virtual_stages_to_pp_multiple says (else Automodel refuses), over pp_size ranks."""
    schedule = reading.unused.get("distributed.pipeline.pp_schedule")
    per = reading.unused.get("distributed.pipeline.layers_per_stage")
    layers, pp = reading.get("num_layers"), reading.get("pipeline_model_parallel_size") or 1
    if not schedule or "virtual_pipeline_model_parallel_size" in reading:
        return
    if not isinstance(per, int) or per < 1 or not layers:
        reading.warnings.append(
            f"distributed.pipeline.pp_schedule {schedule!r} puts several stages on each rank; "
            "without distributed.pipeline.layers_per_stage (or the model's layer count) the "
            "virtual-pipeline size is not derived"
        )
        return
    stages = -(-layers // per)
    rounding = reading.unused.get("distributed.pipeline.round_virtual_stages_to_pp_multiple")
    if stages % pp:
        if rounding == "up":
            stages += pp - stages % pp
        elif rounding == "down":
            stages -= stages % pp
        else:
            reading.warnings.append(
                f"{layers} layers / layers_per_stage {per} = {stages} stages, not a multiple "
                f"of pp_size {pp}: Automodel refuses it ({PIPELINING} calculate_virtual_stages)"
            )
            return
    reading.derive(
        "virtual_pipeline_model_parallel_size",
        stages // pp,
        f"{schedule}: ceil({layers} layers / layers_per_stage {per}) = {stages} stages over "
        f"pp_size {pp} ({PIPELINING} calculate_virtual_stages)",
    )


def apply_defaults(reading: Reading) -> None:
    """Automodel's defaults for what the YAML leaves out, each with the file that sets it."""
    d = reading.default
    dist = f"Automodel's default ({DIST_UTILS} _PARALLELISM_DEFAULTS)"
    fsdp2 = f"Automodel's default ({DIST_CONFIG} FSDP2Config)"
    strategy = "Automodel's default (distributed.strategy fsdp2, " + DIST_UTILS + ")"
    for key in MODEL_PARALLEL_SIZES:
        d(key, 1, dist)
    if (reading.get("pipeline_model_parallel_size") or 1) == 1:
        d("virtual_pipeline_model_parallel_size", None, dist, "no pipeline")
    else:
        _virtual_stages(reading)
    d("micro_batch_size", 1, f"Automodel's default ({TRAIN_FT})", "step_scheduler.local_batch_size")
    d("zero_stage", 3, strategy, "FSDP2 fully_shard: parameters, gradients, optimizer sharded")
    if reading.get("zero_stage") == 3 and not reading.get("use_megatron_fsdp"):
        d("use_torch_fsdp2", True, strategy, "PyTorch FSDP2")
    d("use_distributed_optimizer", False, strategy, "FSDP2 shards the optimizer")
    d("sequence_parallel", False, fsdp2, "distributed.sequence_parallel")
    d("bf16", True, fsdp2, "mp_policy param_dtype bfloat16: bf16 compute")
    d("fp16", False, fsdp2, "mp_policy param_dtype bfloat16")
    d("fp8", None, f"Automodel's default ({TRAIN_FT})", "no fp8 section")
    d("grad_reduce_in_fp32", True, fsdp2, "mp_policy reduce_dtype float32")
    if "param_precision" not in reading:
        d(
            "param_precision",
            "amp",
            f"Automodel's default ({AUTO_MODEL} from_pretrained torch_dtype 'auto')",
            "the checkpoint's dtype, counted as fp32 resident parameters with bf16 compute",
        )
        reading.warnings.append(
            "model.torch_dtype not set: Automodel loads the checkpoint's dtype (torch_dtype "
            "'auto', bf16 for most Hub checkpoints, and torch.optim then keeps bf16 states); "
            "counted as fp32 resident parameters: set model.torch_dtype to say which"
        )
    if reading.get("param_precision") != "pure":
        opt = "torch.optim (optimizer._target_): states in the parameters' dtype"
        d("use_precision_aware_optimizer", False, opt)
        for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            d(key, "fp32", opt)
    d(
        "recompute_granularity",
        None,
        f"Automodel's default ({DIST_UTILS})",
        "distributed.activation_checkpointing false",
    )
    if reading.get("recompute_granularity") is None:
        for key in ("recompute_method", "recompute_num_layers", "recompute_modules"):
            d(key, None, f"Automodel's default ({DIST_UTILS})", "no activation checkpointing")
    for key in ("param_offload", "optimizer_offload"):
        d(key, False, fsdp2, "offload_policy None")
    d("cpu_offloading", False, fsdp2, "no Megatron activation offloading")
    d("fine_grained_activation_offloading", False, fsdp2, "no Megatron activation offloading")
    d(
        "attention_backend",
        "flash",
        f"Automodel's default ({AUTO_MODEL}: attn_implementation flash_attention_2 or sdpa)",
        "a fused attention kernel, no s x s scores kept",
    )
    d(
        "loss_implementation",
        "hf",
        f"Automodel's loss (loss_fn MaskedCrossEntropy, {AM_BLOB}/nemo_automodel/components/"
        "loss/masked_ce.py)",
        "the model's logits upcast to fp32 before torch cross_entropy",
    )
    d(
        "transformer_impl",
        "local",
        "Automodel's Hugging Face models (torch nn modules)",
        "model.backend te switches some to Transformer Engine",
    )
    d(
        "make_vocab_size_divisible_by",
        1,
        "the Hugging Face model's embedding (vocab_size rows, unpadded)",
    )
    derive_data_parallel(reading, "Automodel")
    moe_mla_recompute_defaults(reading, "Megatron-Core's TransformerConfig default")


# -- keys ------------------------------------------------------------------------------------

# Megatron field -> the Automodel key that sets it (a key with no space is a patchable key;
# prose says how it is set where no single key does).
_KEY_FOR = {
    "seq_length": "packed_sequence.packed_sequence_size",
    "micro_batch_size": "step_scheduler.local_batch_size",
    "global_batch_size": "step_scheduler.global_batch_size",
    "tensor_model_parallel_size": "distributed.tp_size",
    "pipeline_model_parallel_size": "distributed.pp_size",
    "context_parallel_size": "distributed.cp_size",
    "expert_model_parallel_size": "distributed.ep_size",
    "sequence_parallel": "distributed.sequence_parallel",
    "recompute_granularity": "distributed.activation_checkpointing",
    "data_parallel_size": "distributed.dp_size (none: the launcher's world size, torchrun "
    "--nproc-per-node x --nnodes, over tp x pp x cp), or --dp",
    "world_size": "the launcher's world size (torchrun --nproc-per-node x --nnodes)",
    "zero_stage": "distributed.strategy",
    "bf16": "model.torch_dtype / distributed.mp_policy",
    "fp16": "model.torch_dtype",
    "param_precision": "model.torch_dtype",
    "attention_backend": "model.attn_implementation",
    "optimizer_offload": "distributed.offload_policy",
    "param_offload": "distributed.offload_policy",
}
# Megatron settings Automodel has no key for, and why (patches.py drops them, with the reason).
_WHOLE_LAYERS = "Automodel checkpoints whole decoder layers, each one"
NO_KEY = {
    "recompute_method": _WHOLE_LAYERS,
    "recompute_num_layers": _WHOLE_LAYERS,
    "recompute_modules": "selective AC is PyTorch's per-op policy, not a module list",
    "use_distributed_optimizer": "distributed.strategy fsdp2 / megatron_fsdp shards the optimizer",
    "virtual_pipeline_model_parallel_size": "distributed.pipeline.pp_schedule decides the stages",
    "expert_tensor_parallel_size": "experts are sharded over ep only",
    "cpu_offloading": "no Megatron activation offloading",
    "fine_grained_activation_offloading": "no Megatron activation offloading",
    "offload_modules": "no Megatron activation offloading",
    "cross_entropy_loss_fusion": "loss_fn._target_ chooses the loss",
}


def key_for(field: str) -> str:
    if field in _KEY_FOR:
        return _KEY_FOR[field]
    if field in NO_KEY:
        return f"{field} (no Automodel key: {NO_KEY[field]})"
    if field in KNOWN_KEYS:
        return "model.pretrained_model_name_or_path's config.json"
    return field
