"""The keys each framework sets a patch's settings with (doctor/patches.py checks patches against
them): which framework owns a key, the framework key for each Megatron-Core field, LLaMA-Factory's
own names, and which settings lower recompute on purpose."""

from __future__ import annotations

from typing import Any

from ..export_layout import NEMO2_STRATEGY

# Frameworks the shared reader names whose keys a patch can be written in. ("hf-config" is a
# model's config.json: it says nothing about the trainer, so the framework stays unknown.)
FRAMEWORKS = (
    "megatron-core",
    "megatron-lm",
    "megatron-bridge",
    "nemo2",
    "nemo1",
    "nemo-rl",
    "torchtitan",
    "hf-trainer",
    "automodel",
)
# Megatron-Core fields the rules write that the kit's Config does not carry.
_MCORE_EXTRA = (
    "cross_entropy_loss_fusion",
    "moe_layer_recompute",
    "overlap_grad_reduce",
    "overlap_param_gather",
)
# Keys that belong to one framework family, with the frameworks that read them.
_HF = ("hf-trainer",)
OWNED_KEYS: dict[str, tuple[str, ...]] = {
    "gradient_checkpointing": _HF,
    "gradient_checkpointing_kwargs": _HF,
    "per_device_train_batch_size": _HF,
    "gradient_accumulation_steps": _HF,
    "use_liger_kernel": _HF,
    "enable_liger_kernel": _HF,
    "disable_gradient_checkpointing": _HF,
    "use_reentrant_gc": _HF,
    "cutoff_len": _HF,
    "max_seq_length": _HF,
    "zero_optimization": _HF,  # a DeepSpeed JSON (read with the Trainer's)
    "zero_init": _HF,
    "optim": _HF,
    "adam_offload": ("openrlhf",),
    "ref_reward_offload": ("openrlhf",),
    "placement_policy": ("colossalai",),
    # NeMo 1.x's recompute keys (model.activations_checkpoint_*): Megatron-Core's recompute_*
    # everywhere else
    "activations_checkpoint_granularity": ("nemo1",),
    "activations_checkpoint_method": ("nemo1",),
    "activations_checkpoint_num_layers": ("nemo1",),
    "logprob_chunk_size": ("nemo-rl",),
    "defer_fp32_logits": ("nemo-rl",),
}
_OWNER_NAMES = {
    "hf-trainer": "Hugging Face Trainer / TRL / LLaMA-Factory (with DeepSpeed)",
    "openrlhf": "OpenRLHF",
    "colossalai": "ColossalAI",
    "nemo-rl": "NeMo-RL",
}

# Per-framework keys that SET a field (where `key_for` names it in prose).
_NEMO_RL_MEGATRON = "policy.megatron_cfg"
PATCH_KEYS: dict[str, dict[str, str | None]] = {
    "megatron-lm": {
        "recompute_granularity": "--recompute-granularity",
        "recompute_modules": "--recompute-modules",
        "cpu_offloading_num_layers": "--cpu-offloading-num-layers",
        "virtual_pipeline_model_parallel_size": "--num-layers-per-virtual-pipeline-stage",
        "num_query_groups": "--num-query-groups",
        "fp8": "--fp8-format",
        "world_size": None,
        "data_parallel_size": None,
        "zero_stage": None,
    },
    "nemo1": {
        "recompute_granularity": "model.activations_checkpoint_granularity",
        "recompute_method": "model.activations_checkpoint_method",
        "recompute_num_layers": "model.activations_checkpoint_num_layers",
        # build_transformer_config passes TransformerConfig fields of `model:` by name
        # (NeMo megatron_base_model.py `elif field.name in cfg`), where Megatron-Core has them
        "recompute_modules": "model.recompute_modules",
        "use_distributed_optimizer": "model.optim.name",
        "bf16": "trainer.precision",
        "fp16": "trainer.precision",
        "zero_stage": None,
        "world_size": None,
        "data_parallel_size": None,
    },
    "megatron-bridge": {
        "bf16": "mixed_precision",
        "fp16": "mixed_precision",
        "seq_length": "dataset.seq_length",
        "zero_stage": None,
        "world_size": None,
        "data_parallel_size": None,
        "swiglu": None,
    },
    # NeMo 2.0 recipes (nemo.collections.llm): a recipe object's attributes, as NeMo-Run
    # overrides name them; every other Megatron-Core field is model.config.<field>
    "nemo2": {
        **{key: f"trainer.strategy.{key}" for key in NEMO2_STRATEGY},
        "seq_length": "data.seq_length",
        "micro_batch_size": "data.micro_batch_size",
        "global_batch_size": "data.global_batch_size",
        "use_distributed_optimizer": "optim.config.use_distributed_optimizer",
        "optimizer_offload": "optim.config.optimizer_cpu_offload",
        "bf16": "trainer.plugins",
        "fp16": "trainer.plugins",
        "zero_stage": None,
        "world_size": None,
        "data_parallel_size": None,
        "swiglu": None,
    },
    "nemo-rl": {
        "recompute_granularity": f"{_NEMO_RL_MEGATRON}.recompute_granularity",
        "recompute_modules": f"{_NEMO_RL_MEGATRON}.recompute_modules",
        "recompute_method": None,  # NeMo-RL: full is uniform, one layer
        "recompute_num_layers": None,
        "bf16": "policy.precision",
        "fp16": "policy.precision",
        "fp8": None,
        "zero_stage": None,
        "world_size": None,
        "data_parallel_size": None,
    },
    "torchtitan": {
        "recompute_granularity": "activation_checkpoint.mode",
        "recompute_method": None,
        "recompute_num_layers": None,
        "recompute_modules": None,
        "micro_batch_size": "training.local_batch_size",
        "global_batch_size": "training.global_batch_size",
        "seq_length": "training.seq_len",
        "tensor_model_parallel_size": "parallelism.tensor_parallel_degree",
        "pipeline_model_parallel_size": "parallelism.pipeline_parallel_degree",
        "context_parallel_size": "parallelism.context_parallel_degree",
        "expert_model_parallel_size": "parallelism.expert_parallel_degree",
        "expert_tensor_parallel_size": "parallelism.expert_tensor_parallel_degree",
        "use_distributed_optimizer": None,  # FSDP2 shards the optimizer already
        # FSDP2's CPUOffloadPolicy: one switch for parameters, gradients and optimizer states
        "optimizer_offload": "training.enable_cpu_offload",
        "param_offload": "training.enable_cpu_offload",
    },
    # torchtitan main's config registry (sources/torchtitan_registry.py): the policy is an
    # object and the batch counted in tokens; the rest as the TOML's section.key (overrides)
    "torchtitan-registry": {
        "recompute_granularity": "activation_checkpoint",
        # (the values in tokens: patches._value_for)
        "micro_batch_size": "training.num_tokens_per_microbatch_per_dp_rank",
        "global_batch_size": "training.num_tokens_per_train_step",
        "seq_length": "training.max_context_length",
    },
    # NeMo Automodel (sources/automodel.py): its key_for gives the rest, prose where none
    "automodel": {
        "recompute_granularity": "distributed.activation_checkpointing",
        "recompute_method": None,  # every decoder layer, each one
        "recompute_num_layers": None,
        "recompute_modules": None,  # its selective AC is PyTorch's per-op policy
        "use_distributed_optimizer": None,  # distributed.strategy fsdp2 shards it already
        "micro_batch_size": "step_scheduler.local_batch_size",
        "bf16": None,  # model.torch_dtype is the storage dtype, not mixed precision
        "fp16": None,
        "fp8": None,
        "zero_stage": None,
        "world_size": None,
        "data_parallel_size": None,
    },
    "hf-trainer": {
        "recompute_granularity": "gradient_checkpointing",
        "recompute_method": None,
        "recompute_num_layers": None,
        "recompute_modules": None,
        "micro_batch_size": "per_device_train_batch_size",
        "bf16": "bf16",
        "fp16": "fp16",
        "use_distributed_optimizer": None,  # DeepSpeed ZeRO stage >= 1 is the equivalent
        "tensor_model_parallel_size": None,
        "pipeline_model_parallel_size": None,
        "cross_entropy_loss_fusion": "use_liger_kernel",
    },
}
# LLaMA-Factory (read as "hf-trainer": it parses the Trainer's arguments) switches a few of
# them by keys of its own (hiyouga/LLaMA-Factory @ ff6d4d12 src/llamafactory/hparams/
# model_args.py: `disable_gradient_checkpointing`, `use_reentrant_gc`, `enable_liger_kernel`):
# Trainer key -> (LLaMA-Factory key, how the value is written there).
LLAMA_FACTORY_KEYS: dict[str, tuple[str, Any]] = {
    "gradient_checkpointing": ("disable_gradient_checkpointing", lambda v: not v),
    "gradient_checkpointing_kwargs": (
        "use_reentrant_gc",
        lambda v: v.get("use_reentrant") if isinstance(v, dict) else None,
    ),
    "use_liger_kernel": ("enable_liger_kernel", lambda v: v),
}
# Categories whose point may be to recompute less, and what the patch then trades.
LOWERING_IS_THE_POINT = {
    "recompute_overhead": "trades memory for speed",  # the step is slow because of recompute
    "framework_bug": "works around the bug at a memory cost",  # the recompute path is broken
    "invalid_config": "the setting Megatron-Core accepts costs memory",  # the current is refused
}
_IMPLIED = {"recompute_method": "uniform", "recompute_num_layers": 1}
_WHOLE_LAYER = ("nemo-rl", "hf-trainer", "torchtitan", "automodel")
_GRANULARITY_RANK = {None: 0, "selective": 1, "full": 2}
