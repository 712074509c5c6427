"""Build and measure the real Megatron-Core model for a kit config, one rank at a time.

This is the reference every number of the kit is checked against: `measure_rank` builds
Megatron-Core's `GPTModel` (local layer spec: unfused `DotProductAttention`, no Transformer
Engine) for a `Config` and a parallel layout, runs one training forward on this rank and records
what autograd keeps for backward, per layer and per module, with the kit's own saved-tensor
tracker (Megatron's module names are the kit's), plus the parameters this rank holds.

Megatron-Core expects CUDA. On a CPU it runs with a gloo process group and the small patches in
`_patch_megatron_for_cpu`; each says what it bypasses and why that does not change what is
measured. They are applied only here.

Use `measure(config, dtype)` for one process (TP=PP=EP=1, or any layout with `world_size`
processes spawned on this machine), or `measure_rank` inside an initialised process group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError
from ..memory.layout import pipeline_layout
from ..memory.model_states import padded_vocab_size
from .megatron_validation import transformer_config_kwargs as megatron_kwargs


def available() -> bool:
    """Whether megatron-core is importable (the `dev` extra installs it)."""
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return False
    return True


class EngineError(ConfigError):
    """Megatron-Core refused or failed on a config (the message is one line)."""


@dataclass
class RankMeasurement:
    """What one rank of a Megatron-Core model keeps, for one micro-batch's forward."""

    rank: int
    pp_rank: int
    layer_numbers: list[int]  # global (0-based) numbers of the layers on this rank
    saved_per_layer: list[int]  # bytes saved for backward inside each layer
    roles_per_layer: list[dict[str, int]]  # the same, per role (kit role names)
    saved_total_bytes: int  # the whole forward (embedding, layers, head, loss)
    parameters: int  # parameters this rank holds
    parameters_by_kind: dict[str, int] = field(default_factory=dict)  # dense / expert
    # The groups the distributed optimizer shards over: dense parameters over data parallel
    # with context parallel, expert parameters over expert data parallel.
    optimizer_shards: dict[str, int] = field(default_factory=dict)
    # Outside the layers: `embedding` (first stage), and on the last stage `final_norm`, the
    # `output` layer (its input) and the `loss` (the cross-entropy's saves, attributed to the
    # GPTModel itself: compute_language_model_loss is not a module); `mtp`, the
    # multi-token-prediction block's modules (on its stage); `other` is the rest.
    edge_roles: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# CPU patches (all of them, in one place)
# --------------------------------------------------------------------------------------------


def _patch_megatron_for_cpu() -> None:
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    # 1. Megatron's RNG tracker forks torch.cuda's generator for dropout inside TP regions. On
    #    a CPU the tracker keeps CPU generator states instead: the same forking, another
    #    generator. Dropout masks have the same shapes, so saved bytes are unchanged.
    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        def add(self, name, seed):
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"cuda rng state {name} already exists")
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"cuda rng state {name} is not added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # 2. Checkpoints save and restore "the CUDA RNG state" around the recompute: use the CPU
    #    generator's (only RNG bookkeeping; nothing measured depends on it).
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    # 3. gloo has no all_gather_into_tensor / reduce_scatter_tensor (used by sequence
    #    parallelism): stand-ins built from all_gather / all_reduce give the same tensors.
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    def all_gather_into_tensor(output, input, group=None, async_op=False):
        parts = list(output.chunk(dist.get_world_size(group)))
        gathered = [torch.empty_like(input) for _ in parts]
        dist.all_gather(gathered, input.contiguous(), group=group)
        for part, piece in zip(parts, gathered, strict=True):
            part.copy_(piece)

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        summed = input.clone()
        dist.all_reduce(summed, op=op, group=group)
        output.copy_(summed.chunk(dist.get_world_size(group))[dist.get_rank(group)])

    mappings.dist_all_gather_func = all_gather_into_tensor
    mappings.dist_reduce_scatter_func = reduce_scatter_tensor
    # 6. A bug of megatron-core 0.16.1 without Transformer Engine: the router's GEMM reads the
    #    module global `te_general_gemm`, defined only when TE imports (NameError otherwise).
    #    None selects the plain torch GEMM, which is what runs without TE anyway.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    # 7. `CheckpointWithoutOutput(fp8=False)` sets `self.fp8 = fp8 is not None` (True), then
    #    asks TE's FP8GlobalStateManager, which is not there without TE. fp8 is off in every
    #    measured config, so the checkpoint runs its non-fp8 path, as it would with TE.
    if not getattr(mrandom.CheckpointWithoutOutput, "_rk_patched", False):
        init = mrandom.CheckpointWithoutOutput.__init__

        def __init__(self, fp8=False):
            init(self, fp8)
            self.fp8 = False

        mrandom.CheckpointWithoutOutput.__init__ = __init__
        mrandom.CheckpointWithoutOutput._rk_patched = True
    # 8. The local spec's torch norm refuses sequence parallelism, because its weights would
    #    miss the all-reduce of their gradients over TP (TE's and Apex's norms have it). The
    #    norm itself runs on the sequence-sharded tokens either way; one step's saved bytes do
    #    not depend on that all-reduce, so build it with sequence_parallel off.
    from megatron.core.transformer import torch_norm

    if not getattr(torch_norm.WrappedTorchNorm, "_rk_patched", False):
        new = torch_norm.WrappedTorchNorm.__new__

        def __new__(cls, config, *args, **kwargs):
            return new(cls, dataclasses.replace(config, sequence_parallel=False), *args, **kwargs)

        torch_norm.WrappedTorchNorm.__new__ = __new__
        torch_norm.WrappedTorchNorm._rk_patched = True
    # 9. MLA's spec hands its core attention k_channels / v_channels (q/k and v head sizes
    #    differ), which only TE's attention takes. The local DotProductAttention's forward is
    #    head-size agnostic (batched matmuls) except for its output's width, heads x
    #    kv_channels: taking v_channels as the output head size, as TE's does, runs MLA with
    #    the same unfused ops. The softmax scale MLA passes in is kept.
    from megatron.core.transformer import dot_product_attention as dpa

    if not getattr(dpa.DotProductAttention, "_rk_patched", False):
        dpa_init = dpa.DotProductAttention.__init__

        def dpa_init_with_v_channels(self, *args, k_channels=None, v_channels=None, **kw):
            dpa_init(self, *args, **kw)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

        dpa.DotProductAttention.__init__ = dpa_init_with_v_channels
        dpa.DotProductAttention._rk_patched = True
    # 10. Without TE, multi_latent_attention's TELinear is None or a mock, and it then asks
    #     isinstance(..., TELinear), a TypeError. A class nothing is an instance of gives the
    #     answer the check means: the projection is not TE's.
    from megatron.core.transformer import multi_latent_attention as mla

    if not isinstance(mla.TELinear, type):

        class NoTELinear:  # no module is one
            pass

        mla.TELinear = NoTELinear
    # 11 (meta runs only): `_balanced_dispatch_on_meta`.
    # 12. The grouped_gemm package (a CUDA kernel) for the legacy GroupedMLP: a torch stand-in.
    from megatron.core.transformer.moe import grouped_gemm_util

    if not grouped_gemm_util.grouped_gemm_is_available():
        grouped_gemm_util.grouped_gemm = _grouped_gemm_stand_in()
        grouped_gemm_util.ops = grouped_gemm_util.grouped_gemm.ops


def _grouped_gemm_stand_in():
    """12. The legacy GroupedMLP (the local spec's grouped GEMM experts, the only experts that
    allow moe_act recompute without TE) calls the `grouped_gemm` package's CUDA kernel
    `ops.gmm(a, b, batch_sizes, trans_b)`. This stand-in computes the same product one expert
    at a time and keeps what the package's autograd function keeps: `a` and `b` (the weights
    are model state); the counts are a host tensor, no device memory, so they ride on ctx."""
    import types

    import torch

    class GroupedGemm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, batch_sizes, trans_b):
            ctx.save_for_backward(a, b)
            ctx.sizes, ctx.trans_b = batch_sizes.tolist(), trans_b
            return _gmm(a, b, ctx.sizes, trans_b)

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            grad_a = _gmm(grad, b, ctx.sizes, not ctx.trans_b)
            parts = zip(grad.split(ctx.sizes), a.split(ctx.sizes), strict=True)
            grad_b = torch.stack([(g.T @ x if ctx.trans_b else x.T @ g) for g, x in parts])
            return grad_a, grad_b, None, None

    def _gmm(a, b, sizes, trans_b):
        if a.device.type == "meta":  # shapes only: one product of the right size
            return a.new_empty(a.shape[0], b.shape[1] if trans_b else b.shape[2])
        outs = [x @ (w.T if trans_b else w) for x, w in zip(a.split(sizes), b, strict=True)]
        return torch.cat(outs)

    def gmm(a, b, batch_sizes, trans_b=False):
        return GroupedGemm.apply(a, b, batch_sizes, trans_b)

    return types.SimpleNamespace(ops=types.SimpleNamespace(gmm=gmm))


@contextlib.contextmanager
def _gpu_dropout():
    """5. On a CPU, `F.dropout` multiplies by a noise tensor of the input's dtype and saves it;
    CUDA runs `native_dropout`, which saves a bool mask. Run CUDA's op so the bytes saved are a
    GPU run's (the kit's convention: 1-byte masks)."""
    import torch
    import torch.nn.functional as F

    saved = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = saved


@contextlib.contextmanager
def _balanced_dispatch_on_meta():
    """11. On the meta device tensors have shapes but no values, and the allgather token
    dispatcher's permutation depends on the routing's values: how many tokens each local
    expert gets (`local_map.sum(0).cpu()`) and which (`masked_select`). With balanced routing,
    the routing the estimator assumes and the gloo runs force, each expert gets
    tokens x top-k / experts of the gathered tokens. This runs the dispatcher's
    `dispatch_postprocess` (megatron-core 0.16.1, unfused permute) line by line with those
    counts: the same ops on the same shapes, so autograd keeps the same tensors (the
    masked_select stand-in keeps what the real op keeps: the mask, then its input)."""
    import torch
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

    class MaskedSelect(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, mask, count):
            ctx.save_for_backward(mask, input)
            return input.new_empty(count)

        @staticmethod
        def backward(ctx, grad):  # never called: meta runs stop after the forward
            raise NotImplementedError

    def dispatch_postprocess(self, hidden_states, probs):
        self.hidden_shape_before_permute = hidden_states.shape
        first, last = self.local_expert_indices[0], self.local_expert_indices[-1] + 1
        self.local_map = self.routing_map[:, first:last].contiguous()
        self.local_probs = probs[:, first:last].contiguous()
        per_expert = hidden_states.shape[0] * self.router_topk // self.config.num_moe_experts
        tokens_per_expert = torch.full((last - first,), per_expert, device="cpu")
        picked = per_expert * (last - first)
        # permute(): the token ids the transposed map selects, then the gather of those rows
        sorted_indices = torch.empty(picked, dtype=torch.long, device=hidden_states.device)
        permuted = hidden_states.index_select(0, sorted_indices)
        self.reversed_local_input_permutation_mapping = sorted_indices
        mask = self.local_map.T.contiguous()
        self.local_probs = MaskedSelect.apply(self.local_probs.T.contiguous(), mask, picked)
        self.routing_map = None
        return permuted, tokens_per_expert.long(), self.local_probs

    saved = MoEAllGatherTokenDispatcher.dispatch_postprocess
    MoEAllGatherTokenDispatcher.dispatch_postprocess = dispatch_postprocess
    try:
        yield
    finally:
        MoEAllGatherTokenDispatcher.dispatch_postprocess = saved


@contextlib.contextmanager
def _cpu_as_current_device(device: str = "cpu"):
    """4. Megatron allocates buffers and masks on `torch.cuda.current_device()`: while a model
    is built and run here, that is the CPU, or the meta device for shape-only runs (the same
    tensors, on another device)."""
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: device
    try:
        yield
    finally:
        torch.cuda.current_device = saved


@contextlib.contextmanager
def _tensor_cuda_stays_put():
    """13. A stage that keeps a copy of the embedding (the last one, with tied weights or
    with MTP) moves it with `weight.data.cuda()` before the all-reduce that makes both copies
    equal (LanguageModule.setup_embeddings_and_output_layer): while a model is built here,
    `.cuda()` leaves a tensor where it is (values only; nothing measured depends on them)."""
    import torch

    saved = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = saved


# --------------------------------------------------------------------------------------------
# The kit's config as Megatron's TransformerConfig
# --------------------------------------------------------------------------------------------


def transformer_config_kwargs(config: Config, dtype: str) -> dict[str, Any]:
    """TransformerConfig keyword arguments to measure a kit config on a CPU: the same mapping
    the validation parity uses, plus what a measurement here must set."""
    import torch

    m, rc = config.model, config.recompute
    if m.add_bias_linear and rc.selects("mlp"):
        # megatron-core 0.16.1: the mlp checkpoint returns fc2's bias through the checkpoint
        # function and backward recurses until memory runs out. Biases save nothing for
        # backward, so measure such configs without them.
        raise ConfigError(
            "Megatron-Core's mlp recompute with add_bias_linear=True recurses in backward; "
            "measure it with add_bias_linear=False (biases do not change saved bytes)"
        )
    kwargs = megatron_kwargs(config)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    kwargs.update(
        bf16=dtype == "bf16",
        fp16=False,
        params_dtype=torch_dtype,
        pipeline_dtype=torch_dtype,
        use_cpu_initialization=True,
        # The fused softmax is a CUDA kernel: off here (the estimator then counts the unfused
        # softmax's fp32 copy where attention_softmax_in_fp32 asks for one, as Megatron keeps
        # it; the run's own value, not TransformerConfig's default). The bias-activation
        # fusions are torch code and run here.
        bias_activation_fusion=m.bias_activation_fusion,
        attention_softmax_in_fp32=m.attention_softmax_in_fp32,
        # The loss: unfused, or the native fused cross-entropy (torch code, compiled by
        # Megatron's jit_fuser); TE's needs Transformer Engine.
        cross_entropy_loss_fusion=m.cross_entropy_loss_fusion,
        cross_entropy_fusion_impl=m.cross_entropy_fusion_impl,
    )
    if m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl == "te":
        raise ConfigError(
            "cross_entropy_fusion_impl=te needs Transformer Engine, which does not run on a "
            "CPU: measure the native fused or the unfused cross-entropy"
        )
    if m.loss_implementation != "megatron":
        raise ConfigError("the Megatron-Core reference runs Megatron's loss (loss_implementation)")
    if m.multi_latent_attention:
        kwargs["rope_type"] = "rope"
    if m.mtp_num_layers:
        kwargs["mtp_num_layers"] = m.mtp_num_layers
    if m.num_moe_experts:
        kwargs.update(
            # With the local spec: the legacy GroupedMLP, which Megatron runs in bf16 only.
            moe_grouped_gemm=m.moe_grouped_gemm,
            # allgather: the token dispatcher that runs on gloo (alltoall needs NCCL's
            # all_to_all_single with uneven splits).
            moe_token_dispatcher_type="allgather",
            moe_router_load_balancing_type="aux_loss" if m.moe_aux_loss_coeff else "none",
        )
    return kwargs


# --------------------------------------------------------------------------------------------
# Build and measure one rank
# --------------------------------------------------------------------------------------------


def _layer_spec(config: Config, tc, vp_stage: int | None):
    """The local (no Transformer Engine) spec; per layer when the model mixes dense and MoE
    layers (moe_layer_freq), as Megatron-LM builds it."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )

    m = config.model
    if m.num_moe_experts:
        return get_gpt_decoder_block_spec(
            tc, use_transformer_engine=False, normalization=m.normalization, vp_stage=vp_stage
        )
    return get_gpt_layer_local_spec(
        multi_latent_attention=m.multi_latent_attention,
        normalization=m.normalization,
        qk_layernorm=m.qk_layernorm,
    )


def _mtp_block_spec(config: Config, tc, spec, vp_stage: int | None):
    """The multi-token-prediction block as Megatron-LM's gpt_builders builds it: each MTP layer
    wraps the spec of this stage's last decoder layer (a MoE layer's spec when the stage has
    no decoder layer and the model has experts); None on stages without MTP."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_mtp_block_spec,
    )

    if not config.model.mtp_num_layers:
        return None
    if hasattr(spec, "layer_specs") and not spec.layer_specs:
        spec = get_gpt_decoder_block_spec(
            dataclasses.replace(tc, moe_layer_freq=1),
            use_transformer_engine=False,
            normalization=config.model.normalization,
        ).layer_specs[-1]
    return get_gpt_mtp_block_spec(tc, spec, use_transformer_engine=False, vp_stage=vp_stage)


def build_model(config: Config, dtype: str, vp_stage: int | None = None):
    """Megatron-Core's GPTModel (this rank's part) for a kit config."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    kind = MLATransformerConfig if config.model.multi_latent_attention else TransformerConfig
    tc = kind(**transformer_config_kwargs(config, dtype))
    spec = _layer_spec(config, tc, vp_stage)
    return GPTModel(
        config=tc,
        transformer_layer_spec=spec,
        mtp_block_spec=_mtp_block_spec(config, tc, spec, vp_stage),
        vocab_size=padded_vocab_size(config.model, config.parallel.tensor_model_parallel_size),
        max_sequence_length=config.model.seq_length,
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        position_embedding_type=config.model.position_embedding_type,
        share_embeddings_and_output_weights=config.model.share_embeddings_and_output_weights,
        vp_stage=vp_stage,
    )


def measure_rank(
    config: Config,
    dtype: str = "fp32",
    seed: int = 0,
    device: str = "cpu",
    training: bool = True,
) -> RankMeasurement:
    """Measure this rank of `config`'s layout (the process group must be initialised).

    device="cpu" runs a real forward and backward; "meta" builds and runs shapes only (a
    full-size rank without allocating; MoE layers there route every expert the same number of
    tokens)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    p, m = config.parallel, config.model
    stack = contextlib.ExitStack()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.etp,
        create_gloo_process_groups=False,
    )
    try:
        _patch_megatron_for_cpu()
        stack.enter_context(_cpu_as_current_device(device))
        stack.enter_context(_gpu_dropout())
        from megatron.core.tensor_parallel import random as mrandom

        tracker = mrandom.get_cuda_rng_tracker()
        tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718)
        tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + 100)
        torch.manual_seed(seed)
        if device == "meta":
            stack.enter_context(_balanced_dispatch_on_meta())
        stage = ps.get_pipeline_model_parallel_rank()
        chunks = pipeline_layout(m, p)[stage]
        vpp = p.virtual_pipeline_model_parallel_size if len(chunks) > 1 else None
        # MTPLossAutoScaler's loss scale is a class-level tensor made when its module is first
        # imported: imported under the meta device below, it stays on meta for every later
        # real run in this process ("Tensor on device meta is not on the expected device")
        from megatron.core.transformer import multi_token_prediction  # noqa: F401

        # Built on `device`; the forward then runs as on a GPU: a tensor made without a
        # device (e.g. core attention's mask type) is a host tensor, not counted.
        with torch.device(device), _tensor_cuda_stays_put():
            models = [build_model(config, dtype, v if vpp else None) for v in range(len(chunks))]
        if dtype == "bf16":  # what Megatron's Float16Module does to the model it wraps
            models = [model.bfloat16() for model in models]
        params = {"dense": 0, "expert": 0}
        for model in models:
            for name, prm in model.named_parameters():
                params["expert" if ".experts." in name else "dense"] += prm.numel()
        if m.attention_backend != "unfused":
            raise ConfigError(
                "the Megatron-Core reference runs the local layer spec (unfused attention) "
                "without Transformer Engine: set attention_backend=unfused"
            )
        saved_per_layer, roles, total, edges = [], [], 0, {}
        for v, (model, layers) in enumerate(zip(models, chunks, strict=True)):
            if not layers:
                continue
            saved = _forward(model, config, stage == 0 and v == 0, device, training)
            saved_per_layer += saved.per_layer()
            roles += [saved.layer_roles(i) for i in range(len(layers))]
            total += saved.total_bytes
            for role, n in _edge_roles(saved).items():
                edges[role] = edges.get(role, 0) + n
        return RankMeasurement(
            rank=dist.get_rank(),
            pp_rank=stage,
            layer_numbers=[n for chunk in chunks for n in chunk],
            saved_per_layer=saved_per_layer,
            roles_per_layer=roles,
            saved_total_bytes=total,
            parameters=sum(params.values()),
            parameters_by_kind=params,
            edge_roles=edges,
            optimizer_shards={
                "dense": ps.get_data_parallel_world_size(with_context_parallel=True),
                "expert": ps.get_expert_data_parallel_world_size(),
            },
        )
    finally:
        stack.close()
        ps.destroy_model_parallel()
        # The MoE aux-loss logging tracker is process-global, sized by the first model's
        # layer count (and on its device): one Megatron-LM process trains one model, this
        # one measures many.
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        get_moe_layer_wise_logging_tracker().clear()
        # So is the MTP loss tracker, sized by the first model's mtp_num_layers.
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        MTPLossLoggingHelper.tracker.clear()


_EDGE_MODULES = {  # role -> Megatron's module path in GPTModel
    "embedding": "embedding",
    "final_norm": "decoder.final_layernorm",
    "output": "output_layer",
    "mtp": "mtp",  # the MTP block's own modules; its lookup is `embedding`'s, its logits the
    # output layer's, its loss the model's
}


def _edge_roles(saved) -> dict[str, int]:
    """Bytes saved outside the transformer layers, per role (RankMeasurement.edge_roles)."""
    out = {role: saved.by_prefix(path) for role, path in _EDGE_MODULES.items()}
    out["loss"] = saved.by_module.get("", 0)
    out["other"] = saved.total_bytes - sum(saved.per_layer()) - sum(out.values())
    return out


def _forward(model, config: Config, first: bool, device: str, training: bool = True):
    """One forward of a model chunk with autograd on (in training or eval mode), tracking what
    it saves; on a CPU, backward too (the recompute must run without error)."""
    import torch

    from ..memory.measure import track_saved_tensors

    m, p = config.model, config.parallel
    model.train(training)
    tokens = torch.randint(0, m.vocab_size, (m.micro_batch_size, m.seq_length), device=device)
    positions = torch.arange(m.seq_length, device=device).unsqueeze(0).expand_as(tokens)
    # Megatron-LM's data pipeline passes this mask (True = masked); without one the local
    # softmax builds a default causal mask on "cuda".
    causal = torch.ones(m.seq_length, m.seq_length, dtype=torch.bool, device=device)
    causal = causal.triu(1)[None, None]
    if not first:  # a later chunk starts from the previous one's output
        s_local = m.seq_length // p.context_parallel_size
        if p.sequence_parallel:
            s_local //= p.tensor_model_parallel_size
        dtype = next(model.parameters()).dtype
        shape = (s_local, m.micro_batch_size, m.hidden_size)
        hidden = torch.randn(shape, dtype=dtype, device=device)
        model.set_input_tensor(hidden.requires_grad_())
    # On a CPU host and device are one: there every saved tensor counts.
    counted = None if device == "cpu" else device
    with track_saved_tensors(model, inputs=(causal,), device=counted) as saved:
        # Megatron-LM passes the data's fp32 loss mask (MTP rolls and keeps it).
        loss_mask = torch.ones(tokens.shape, dtype=torch.float32, device=device)
        out = model(tokens, positions, attention_mask=causal, labels=tokens, loss_mask=loss_mask)
    if device != "meta":
        out.float().sum().backward()
    return saved


# --------------------------------------------------------------------------------------------
# Running it: one process, or a gloo group of several on this machine
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(config: Config, dtype: str = "fp32", seed: int = 0) -> list[RankMeasurement]:
    """Every rank's measurement of `config`'s layout, with one gloo process per rank."""
    return measure_many([config], dtype, seed)[0]


def measure_many(
    configs: list[Config], dtype: str = "fp32", seed: int = 0, training: bool = True
) -> list[list[RankMeasurement]]:
    """`measure` for several configs of one layout in one process group (one start-up);
    training=False runs the forward in eval mode with autograd still on."""
    worlds = {_world_size(c) for c in configs}
    if len(worlds) != 1:
        raise ConfigError("measure_many needs configs of one parallel layout")
    world = worlds.pop()
    if world == 1:
        results = _in_process_group(0, 1, _free_port(), configs, dtype, seed, training)
        return [[r] for r in results]
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        try:
            mp.start_processes(
                _rank_main,
                args=(world, port, configs, dtype, seed, training, tmp),
                nprocs=world,
                start_method="spawn",
            )
        except ProcessException:
            errors = sorted(Path(tmp).glob("*.error"))
            first = errors[0].read_text().strip().splitlines() if errors else ["(no message)"]
            raise EngineError(
                f"Megatron-Core rank {errors[0].stem if errors else '?'} failed: {first[0]}"
            ) from None
        per_rank = [json.loads((Path(tmp) / f"{r}.json").read_text()) for r in range(world)]
    return [[RankMeasurement(**ranks[i]) for ranks in per_rank] for i in range(len(configs))]


def measure_one_rank(config: Config, dtype: str = "bf16", stage: int = 0) -> RankMeasurement:
    """One rank of `stage` of a full-size layout, shapes only: this process joins a fake
    process group of the whole world size (collectives return at once) and builds and runs
    its part of the model on the meta device, so nothing of the model's size is allocated."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    p = config.parallel
    world = _world_size(config)
    if config.model.num_moe_experts and config.model.moe_grouped_gemm:
        # Measured: on the meta device the compiled activation of the local spec's grouped
        # experts keeps 28,672 B where a real CPU run keeps 53,504 B (tiny-moe, bf16).
        raise ConfigError(
            "grouped-GEMM experts cannot be measured shapes-only: their activation is "
            "torch.compile'd (Megatron's jit_fuser), which keeps other tensors on the meta "
            "device than on a real one; measure without --fake, or set moe_grouped_gemm: false"
        )
    if not 0 <= stage < p.pipeline_model_parallel_size:
        raise ConfigError(f"--stage must be in 0..{p.pipeline_model_parallel_size - 1}")
    # Megatron's default rank order puts the pipeline rank outermost.
    rank = stage * (world // p.pipeline_model_parallel_size)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        return measure_rank(config, dtype, device="meta")
    finally:
        dist.destroy_process_group()


def _world_size(config: Config) -> int:
    p = config.parallel
    model_parallel = (
        p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size
    )
    # Expert parallelism reuses the data-parallel ranks: the world must hold EP x ETP.
    world = model_parallel * p.data_parallel_size
    if world % p.expert_model_parallel_size:
        raise ConfigError(
            f"world size {world} (TP x PP x CP x DP) is not divisible by expert parallel size "
            f"{p.expert_model_parallel_size}: raise --dp"
        )
    return world


def _in_process_group(
    rank, world, port, configs, dtype, seed, training=True
) -> list[RankMeasurement]:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        return [measure_rank(config, dtype, seed, training=training) for config in configs]
    finally:
        dist.destroy_process_group()


def _rank_main(rank, world, port, configs, dtype, seed, training, out_dir) -> None:
    import torch

    torch.set_num_threads(1)  # several ranks share this machine's cores
    try:
        results = _in_process_group(rank, world, port, configs, dtype, seed, training)
    except Exception as exc:  # reported by the parent as one line
        (Path(out_dir) / f"{rank}.error").write_text(f"{type(exc).__name__}: {exc}")
        raise
    (Path(out_dir) / f"{rank}.json").write_text(json.dumps([r.to_json() for r in results]))


# --------------------------------------------------------------------------------------------
# The loss region alone: saved bytes and what it adds while it runs
# --------------------------------------------------------------------------------------------


def measure_loss(config: Config, dtype: str = "bf16", seed: int = 0) -> dict[str, int]:
    """Megatron-Core's loss (`GPTModel.compute_language_model_loss`, with the config's
    cross_entropy_loss_fusion / cross_entropy_fusion_impl) on this rank's logits
    [s, b, padded vocab] in `dtype`, one process (TP 1): `saved`, what it keeps for backward;
    `after_forward`, the bytes alive once it returned (saved, the loss and its per-token
    bookkeeping); `transient`, the most its forward (from the logits on) and backward (down
    to the logits' gradient) hold above `after_forward`."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.common.language_module.language_module import LanguageModule

    from ..memory.measure import LiveTensorTracker, track_saved_tensors

    m = config.model
    transformer_config_kwargs(config, dtype)  # the same refusals as a model measurement
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(create_gloo_process_groups=False)
    try:
        torch.manual_seed(seed)
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        vocab = padded_vocab_size(m, 1)
        shape = (m.seq_length, m.micro_batch_size, vocab)
        leaf = torch.randn(shape, dtype=torch_dtype).requires_grad_()
        labels = torch.randint(0, m.vocab_size, (m.micro_batch_size, m.seq_length))
        # compute_language_model_loss reads only the config's two fields and the TP group.
        module = _LossOnly(
            config=_LossConfig(m.cross_entropy_loss_fusion, m.cross_entropy_fusion_impl),
            pg_collection=_TpOnly(ps.get_tensor_model_parallel_group()),
        )
        live = LiveTensorTracker()
        with live, track_saved_tensors(torch.nn.Module()) as saved:
            logits = leaf.clone()  # the output layer's logits (their storage counts)
            loss = LanguageModule.compute_language_model_loss(module, labels, logits)
            del logits
        after = live.live_bytes
        forward_peak = live.peak_bytes
        live.peak_bytes = 0
        with live:
            loss.float().sum().backward()
        return {
            "saved": saved.total_bytes,
            "after_forward": after,
            "transient": max(forward_peak, live.peak_bytes) - after,
        }
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@dataclass
class _LossConfig:
    cross_entropy_loss_fusion: bool
    cross_entropy_fusion_impl: str


@dataclass
class _TpOnly:
    tp: Any


@dataclass
class _LossOnly:
    config: _LossConfig
    pg_collection: _TpOnly
