"""Megatron-Core's own verdict on a kit config: build `TransformerConfig` on the CPU and report
whether its `__post_init__` accepts it, or the exception and the first line of its message.

`transformer_config_kwargs` maps a kit `Config` (its Megatron-named fields, including the
recompute, offloading, fp8, CUDA-graph and deprecated `moe_layer_recompute` keys) to keyword
arguments; `megatron_verdict` constructs the config; `kit_verdict` runs the kit's `validate()`
on the same flat keys, as `recompute-kit validate` does.

Nothing here needs CUDA or Transformer Engine. Where Megatron's checks would ask TE for its
version (fp8 with `moe_act`/`layernorm` recompute, MoE with fp8), the answer depends on an
installed TE: the verdict says so (`depends_on="transformer_engine"`) instead of guessing. An
exception raised inside `torch.cuda` is classified the same way (`depends_on="cuda"`).
"""

from __future__ import annotations

import contextlib
import copy
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

from ..config import Config, ConfigError, config_from_dict


@dataclass(frozen=True)
class Verdict:
    """Accepted, or rejected with the exception type and its message's first line."""

    accepted: bool
    error_type: str | None = None
    message: str | None = None
    depends_on: str | None = None  # "transformer_engine" / "cuda": outcome not decidable here

    def __str__(self) -> str:
        if self.depends_on:
            return f"depends on {self.depends_on}"
        return "accepted" if self.accepted else f"{self.error_type}: {self.message}"


def transformer_config_kwargs(config: Config) -> dict[str, Any]:
    """TransformerConfig keyword arguments for a kit config, Megatron's names and semantics.

    `moe_shared_expert_overlap` with the default (allgather) dispatcher implies Megatron's
    alltoall one (it refuses the overlap with any other).
    Fused kernels are off (they need CUDA or TE and no recompute rule reads them)."""
    import torch
    import torch.nn.functional as F

    m, p, rc = config.model, config.parallel, config.recompute
    dtype = torch.bfloat16 if m.bf16 else torch.float16 if m.fp16 else torch.float32
    kwargs: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        ffn_hidden_size=m.ffn_hidden_size,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        normalization=m.normalization,
        gated_linear_unit=m.swiglu,
        activation_func=F.silu if m.swiglu else F.gelu,
        add_bias_linear=m.add_bias_linear,
        bf16=m.bf16,
        fp16=m.fp16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        fp8=m.fp8,
        fp8_recipe=m.fp8_recipe,
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=getattr(p, "expert_tensor_parallel_size", None),
        sequence_parallel=p.sequence_parallel,
        recompute_granularity=rc.recompute_granularity,
        recompute_method=rc.recompute_method,
        recompute_num_layers=rc.recompute_num_layers,
        # Megatron appends to these lists in place: give it copies.
        recompute_modules=copy.copy(rc.recompute_modules),
        distribute_saved_activations=rc.distribute_saved_activations,
        moe_layer_recompute=rc.moe_layer_recompute,
        cpu_offloading=rc.cpu_offloading,
        cpu_offloading_num_layers=rc.cpu_offloading_num_layers,
        fine_grained_activation_offloading=rc.fine_grained_activation_offloading,
        offload_modules=list(rc.offload_modules),
        # 0.18's cuda_graph_impl "full_iteration" is 0.16.1's local impl with that scope
        cuda_graph_impl="local" if m.cuda_graph_impl == "full_iteration" else m.cuda_graph_impl,
        cuda_graph_scope=(
            ["full_iteration"]
            if m.cuda_graph_impl == "full_iteration"
            else list(m.cuda_graph_scope)
        ),
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        qk_layernorm=m.qk_layernorm,
        num_layers_in_first_pipeline_stage=p.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=p.num_layers_in_last_pipeline_stage,
        account_for_embedding_in_pipeline_split=p.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=p.account_for_loss_in_pipeline_split,
    )
    if m.num_moe_experts is not None:
        kwargs.update(
            num_moe_experts=m.num_moe_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size,
            moe_layer_freq=m.moe_layer_freq,
            moe_router_score_function=m.moe_router_score_function,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_shared_expert_overlap=m.moe_shared_expert_overlap,
            moe_grouped_gemm=m.moe_grouped_gemm,
            moe_token_dispatcher_type=m.moe_token_dispatcher_type,
            overlap_moe_expert_parallel_comm=m.overlap_moe_expert_parallel_comm,
        )
        if m.moe_shared_expert_overlap and m.moe_token_dispatcher_type == "allgather":
            kwargs["moe_token_dispatcher_type"] = "alltoall"
    if m.multi_latent_attention:
        kwargs.update(mla_kwargs(m))
    return kwargs


def mla_kwargs(m) -> dict[str, Any]:
    """MLATransformerConfig's latent and head sizes for a kit ModelConfig."""
    return dict(
        multi_latent_attention=True,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_head_dim,
        qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
        v_head_dim=m.v_head_dim,
    )


class _NeedsTransformerEngine(Exception):
    """Raised in place of Megatron's TE version queries: the verdict would depend on TE."""


def _no_te_version(*args: Any, **kwargs: Any) -> Any:
    raise _NeedsTransformerEngine


@contextlib.contextmanager
def _te_version_queries_marked():
    """Megatron without TE answers `is_te_min_version` with a TypeError (None >= Version);
    mark those calls instead, for the duration of one construction."""
    from megatron.core.transformer import transformer_config as module

    saved = module.is_te_min_version, module.get_te_version
    module.is_te_min_version = module.get_te_version = _no_te_version
    try:
        yield
    finally:
        module.is_te_min_version, module.get_te_version = saved


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def _raised_in_torch_cuda(exc: BaseException) -> bool:
    return any(
        "/torch/cuda/" in frame.filename for frame in traceback.extract_tb(exc.__traceback__)
    )


def megatron_verdict(config: Config) -> Verdict:
    """Construct Megatron-Core's TransformerConfig (MLATransformerConfig for MLA) on the CPU."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    kwargs = transformer_config_kwargs(config)
    cls = MLATransformerConfig if config.model.multi_latent_attention else TransformerConfig
    with warnings.catch_warnings(), _te_version_queries_marked():
        warnings.simplefilter("ignore")
        try:
            cls(**kwargs)
        except _NeedsTransformerEngine:
            return Verdict(False, depends_on="transformer_engine")
        except Exception as exc:  # every rejection is a verdict
            if _raised_in_torch_cuda(exc):
                return Verdict(False, depends_on="cuda")
            return Verdict(False, type(exc).__name__, _first_line(exc))
    return Verdict(True)


def kit_config(flat: dict[str, Any]) -> Config:
    """The kit Config for a flat mapping of Megatron keys (as a config file would hold them)."""
    config, unused = config_from_dict(copy.deepcopy(flat))
    if unused:
        raise ConfigError(unused[0])
    return config


def kit_verdict(flat: dict[str, Any]) -> Verdict:
    """The kit's `validate()` on a flat config, exactly as `recompute-kit validate` runs it."""
    try:
        kit_config(flat).validate()
    except ConfigError as exc:
        return Verdict(False, type(exc).__name__, _first_line(exc))
    return Verdict(True)
