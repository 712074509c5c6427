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
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError
from ..memory.estimate import padded_vocab_size


def available() -> bool:
    """Whether megatron-core is importable (the `dev` extra installs it)."""
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return False
    return True


class EngineError(RuntimeError):
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
def _cpu_as_current_device():
    """4. Megatron allocates buffers and masks on `torch.cuda.current_device()`: while a model
    is built and run here, that is the CPU (the same tensors, on another device)."""
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = saved


# --------------------------------------------------------------------------------------------
# The kit's config as Megatron's TransformerConfig
# --------------------------------------------------------------------------------------------


def transformer_config_kwargs(config: Config, dtype: str) -> dict[str, Any]:
    """TransformerConfig keyword arguments for a kit config (Megatron's names and defaults)."""
    m, p, rc = config.model, config.parallel, config.recompute
    if m.add_bias_linear and rc.selects("mlp"):
        # megatron-core 0.16.1: the mlp checkpoint returns fc2's bias through the checkpoint
        # function and backward recurses until memory runs out. Biases save nothing for
        # backward, so measure such configs without them.
        raise ConfigError(
            "Megatron-Core's mlp recompute with add_bias_linear=True recurses in backward; "
            "measure it with add_bias_linear=False (biases do not change saved bytes)"
        )
    if m.attention_backend != "unfused":
        raise ConfigError(
            "the Megatron-Core reference runs the local layer spec (unfused attention): "
            "set attention_backend=unfused"
        )
    import torch
    import torch.nn.functional as F

    kwargs: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        ffn_hidden_size=m.ffn_size,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        normalization=m.normalization,
        gated_linear_unit=m.swiglu,
        qk_layernorm=m.qk_layernorm,
        activation_func=F.silu if m.swiglu else F.gelu,
        add_bias_linear=m.add_bias_linear,
        bf16=dtype == "bf16",
        params_dtype=torch.bfloat16 if dtype == "bf16" else torch.float32,
        pipeline_dtype=torch.bfloat16 if dtype == "bf16" else torch.float32,
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.etp,
        sequence_parallel=p.sequence_parallel,
        use_cpu_initialization=True,
        recompute_granularity=rc.recompute_granularity,
        recompute_method=rc.recompute_method,
        recompute_num_layers=rc.recompute_num_layers,
        distribute_saved_activations=rc.distribute_saved_activations,
        # The fused softmax is a CUDA kernel: off on a CPU (the estimator then counts the
        # unfused softmax's fp32 copy, as Megatron keeps it). The bias-activation fusions
        # are torch code and run here.
        masked_softmax_fusion=False,
        bias_activation_fusion=m.bias_activation_fusion,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
    )
    if rc.recompute_granularity == "selective":
        kwargs["recompute_modules"] = rc.modules
    if m.num_moe_experts:
        kwargs.update(
            num_moe_experts=m.num_moe_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_size,
            moe_layer_freq=m.moe_layer_freq,
            moe_router_score_function=m.moe_router_score_function,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_grouped_gemm=False,
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


def build_model(config: Config, dtype: str, vp_stage: int | None = None):
    """Megatron-Core's GPTModel (this rank's part) for a kit config."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    tc = TransformerConfig(**transformer_config_kwargs(config, dtype))
    return GPTModel(
        config=tc,
        transformer_layer_spec=_layer_spec(config, tc, vp_stage),
        vocab_size=padded_vocab_size(config.model, config.parallel.tensor_model_parallel_size),
        max_sequence_length=config.model.seq_length,
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        position_embedding_type=config.model.position_embedding_type,
        share_embeddings_and_output_weights=config.model.share_embeddings_and_output_weights,
        vp_stage=vp_stage,
    )


def measure_rank(config: Config, dtype: str = "fp32", seed: int = 0) -> RankMeasurement:
    """Measure this rank of `config`'s layout (the process group must be initialised)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ..memory.measure import track_saved_tensors

    p = config.parallel
    stack = contextlib.ExitStack()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.etp,
    )
    try:
        _patch_megatron_for_cpu()
        stack.enter_context(_cpu_as_current_device())
        stack.enter_context(_gpu_dropout())
        from megatron.core.tensor_parallel import random as mrandom

        mrandom.get_cuda_rng_tracker().add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718)
        mrandom.get_cuda_rng_tracker().add(
            mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + 100
        )
        torch.manual_seed(seed)
        model = build_model(config, dtype)
        if dtype == "bf16":  # what Megatron's Float16Module does to the model it wraps
            model = model.bfloat16()
        model.train()
        m = config.model
        tokens = torch.randint(0, m.vocab_size, (m.micro_batch_size, m.seq_length))
        positions = torch.arange(m.seq_length).unsqueeze(0).expand_as(tokens)
        # Megatron-LM's data pipeline passes this mask (True = masked); without one the
        # local softmax builds a default causal mask on "cuda".
        causal = torch.ones(m.seq_length, m.seq_length, dtype=torch.bool).triu(1)[None, None]
        if not ps.is_pipeline_first_stage():  # a later stage starts from the previous one's output
            p_ = config.parallel
            s_local = m.seq_length // p_.context_parallel_size
            if p_.sequence_parallel:
                s_local //= p_.tensor_model_parallel_size
            hidden = torch.randn(s_local, m.micro_batch_size, m.hidden_size, requires_grad=True)
            model.set_input_tensor(hidden.to(next(model.parameters()).dtype))
        with track_saved_tensors(model, inputs=(causal,)) as saved:
            loss = model(tokens, positions, attention_mask=causal, labels=tokens)
        loss.float().sum().backward()  # the recompute runs: it must not fail either
        offset = _first_layer_number(config)
        n = len(saved.per_layer())
        params = {"dense": 0, "expert": 0}
        for name, prm in model.named_parameters():
            params["expert" if ".experts." in name else "dense"] += prm.numel()
        return RankMeasurement(
            rank=dist.get_rank(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            layer_numbers=list(range(offset, offset + n)),
            saved_per_layer=saved.per_layer(),
            roles_per_layer=[saved.layer_roles(i) for i in range(n)],
            saved_total_bytes=saved.total_bytes,
            parameters=sum(params.values()),
            parameters_by_kind=params,
        )
    finally:
        stack.close()
        ps.destroy_model_parallel()


def _first_layer_number(config: Config) -> int:
    from megatron.core import parallel_state as ps

    per_stage = config.model.num_layers // config.parallel.pipeline_model_parallel_size
    return ps.get_pipeline_model_parallel_rank() * per_stage


# --------------------------------------------------------------------------------------------
# Running it: one process, or a gloo group of several on this machine
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(config: Config, dtype: str = "fp32", seed: int = 0) -> list[RankMeasurement]:
    """Every rank's measurement of `config`'s layout, with one gloo process per rank."""
    world = _world_size(config)
    if world == 1:
        return [_in_process_group(0, 1, _free_port(), config, dtype, seed)]
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        try:
            mp.start_processes(
                _rank_main,
                args=(world, port, config, dtype, seed, tmp),
                nprocs=world,
                start_method="spawn",
            )
        except ProcessException:
            errors = sorted(Path(tmp).glob("*.error"))
            first = errors[0].read_text().strip().splitlines() if errors else ["(no message)"]
            raise EngineError(
                f"Megatron-Core rank {errors[0].stem if errors else '?'} failed: {first[0]}"
            ) from None
        import json

        return [
            RankMeasurement(**json.loads((Path(tmp) / f"{r}.json").read_text()))
            for r in range(world)
        ]


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


def _in_process_group(rank, world, port, config, dtype, seed) -> RankMeasurement:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        return measure_rank(config, dtype, seed)
    finally:
        dist.destroy_process_group()


def _rank_main(rank, world, port, config, dtype, seed, out_dir) -> None:
    import json

    try:
        result = _in_process_group(rank, world, port, config, dtype, seed)
    except Exception as exc:  # reported by the parent as one line
        (Path(out_dir) / f"{rank}.error").write_text(f"{type(exc).__name__}: {exc}")
        raise
    (Path(out_dir) / f"{rank}.json").write_text(json.dumps(result.to_json()))
