"""Analytic activation, weight, gradient and optimizer memory per rank, for any recompute spec.

The per-module terms generalise Korthikanti et al. (2022) to GQA, SwiGLU, RMSNorm, flash
attention, MoE (top-k token copies, router, shared experts) and MLA, and they describe exactly
what the reference layers keep for backward (tests check them against measurement, byte for
byte). Conventions, as in a GPU run: activations in the training dtype (B bytes), dropout masks
1 byte, norm statistics fp32, indices int64.

Per rank (Megatron's layout):
* tensor parallel t shards heads, ffn and experts' inner dims; with sequence parallelism the
  sequence-sharded tensors outside those regions (norm inputs, dropout masks, the inputs of the
  QKV/fc1 GEMMs, layer inputs) are split by t too;
* context parallel cp splits the sequence;
* pipeline parallel p: the first stage holds L/p layers for p micro-batches in flight (1F1B),
  x (1 + (p-1)/(p*vpp)) with interleaving;
* expert parallel ep splits the experts (weights); each rank still processes ~T*k token copies;
* weights bf16 (2 B), fp32 main gradients (4 B) and Adam (fp32 master + m + v, 12 B) sharded
  over data parallel with the distributed optimizer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..config import (
    NORMAL_CHECKPOINT_MODULES,
    Config,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RecomputeConfig,
    format_spec,
    full_recompute_chunks,
)
from . import torchtitan as titan
from .flops import model_recompute_flops_fraction, recompute_flops_fraction
from .layout import chunk_micro_batches_at_peak, micro_batches_in_flight, pipeline_layout
from .model_states import ModelStates, model_states, padded_vocab_size
from .mtp import mtp_activation_bytes, mtp_layer_is_moe, mtp_location
from .overheads import overhead_terms
from .te_saves import (
    attention_norm_fused,
    attention_output_shared,
    mlp_norm_fused,
    norm_recomputed,
    te_spec,
)

MASK_BYTES = 1  # bool dropout masks
STAT_BYTES = 4  # fp32 norm statistics
INDEX_BYTES = 8  # int64 indices


@dataclass
class Estimate:
    recompute: str
    per_layer_activation_bytes: float  # mean over the first stage's layers, per micro-batch
    activation_bytes: int  # first pipeline stage, all in-flight micro-batches
    peak_activation_bytes: int  # activation_bytes + the largest transient of backward
    modules: dict[str, float]  # role -> mean bytes per layer
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    total_bytes: int  # weights + grads + optimizer + peak activations (or the step's)
    recompute_flops_fraction: float  # executed FLOPs of this stage's rank (memory/flops.py)
    model_recompute_flops_fraction: float = 0.0  # the same in model FLOPs (full s x s)
    offloaded_bytes: int = 0  # activations sent to host per micro-batch
    layer_kinds: dict[str, dict] = field(default_factory=dict)
    stage: int = 0  # the pipeline stage this estimate is for
    layers: list[int] = field(default_factory=list)  # its transformer layers (0-based)
    micro_batches_in_flight: float = 1.0  # activations held at the schedule's peak
    # the micro-batches each virtual-pipeline chunk holds then (one entry without VPP)
    chunk_micro_batches: list[int] = field(default_factory=list)
    stage_total_bytes: list[int] = field(default_factory=list)  # every stage, when searched
    stage_held_bytes: list[int] = field(default_factory=list)  # the same with held_bytes's terms
    # Model-state sharding (memory/model_states.py) and what is neither activations nor model
    # states (memory/overheads.py): named terms with stated defaults, outside total_bytes.
    sharding: str = "megatron"
    cuda_context_bytes: int = 0
    nccl_buffers_bytes: int = 0
    moe_imbalance_factor: float = 1.0
    moe_imbalance_bytes: int = 0
    dispatcher_buffers_bytes: int = 0
    gathered_params_bytes: int = 0
    zero_buffers_bytes: int = 0
    overhead_bytes: int = 0
    total_with_overheads_bytes: int = 0  # total_bytes + overhead_bytes
    overhead_assumptions: list[str] = field(default_factory=list)
    # Multi-token prediction on this stage, per micro-batch, by part (memory/mtp.py); inside
    # activation_bytes. Empty on stages without MTP.
    mtp_bytes: dict[str, float] = field(default_factory=dict)
    # The logits and loss on the last pipeline stage (loss_bytes), zero elsewhere: the logits'
    # [rows, columns] per rank (tokens of a micro-batch, vocabulary / TP), what the loss keeps
    # for backward (inside activation_bytes, every micro-batch in flight), the most it adds
    # while it runs (inside peak_activation_bytes when loss_sets_peak: the step's peak is the
    # loss's moment, not a layer's backward).
    logits_shape: list[int] = field(default_factory=list)
    loss_saved_bytes: int = 0
    loss_transient_bytes: int = 0
    loss_sets_peak: bool = False
    fused_linear_loss: bool = False  # Liger's fused linear cross-entropy: logits in chunks
    # What the optimizer step allocates beside the model states once the activations are freed
    # (DeepSpeed ZeRO's fp32 copy of the gradient partition, a foreach AdamW's temporary):
    # total_bytes takes the larger of it and peak_activation_bytes (step_sets_peak).
    optimizer_step_bytes: int = 0
    step_sets_peak: bool = False

    @property
    def model_state_bytes(self) -> int:
        """Weights, gradients and optimizer states: what no recompute setting frees."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def held_bytes(self) -> int:
        """The total and the terms the run holds beside it that no safety margin covers (MoE
        routing imbalance, dispatcher buffers, gathered parameters, ZeRO buckets): what a
        stage needs, and so what decides which stage binds."""
        return (
            self.total_bytes
            + self.moe_imbalance_bytes
            + self.dispatcher_buffers_bytes
            + self.gathered_params_bytes
            + self.zero_buffers_bytes
        )

    def beside_words(self) -> str:
        """The terms held beside the total, by name ("ZeRO-3 gathered parameters 2.1 GiB, ...")."""
        terms = (
            ("MoE routing imbalance", self.moe_imbalance_bytes),
            ("dispatcher buffers", self.dispatcher_buffers_bytes),
            ("gathered parameters", self.gathered_params_bytes),
            ("ZeRO buckets", self.zero_buffers_bytes),
        )
        return ", ".join(f"{name} {b / 2**30:.1f} GiB" for name, b in terms if b)

    def to_json(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Shapes per rank
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """Per-rank sizes used by the formulas."""

    b: int
    s: int  # local sequence (s / cp)
    s_kv: int  # keys per query row (full sequence)
    h: int
    t: int  # tensor-parallel divisor for head/ffn-sharded tensors
    sp: int  # divisor for sequence-sharded hidden tensors (t with SP, else 1)
    B: int  # activation bytes

    @property
    def sbh(self) -> float:
        return self.s * self.b * self.h

    @property
    def tokens(self) -> int:
        return self.s * self.b


# Rotary position embeddings: YaRN's (gpt-oss) rotates q and k as RoPE does (GPTModel builds
# its rotary_pos_emb the same way and attention applies apply_rotary_pos_emb to both)
_ROTARY = ("rope", "yarn")

def _shape(m: ModelConfig, p: ParallelConfig, dtype_bytes: int) -> _Shape:
    t, cp = p.tensor_model_parallel_size, p.context_parallel_size
    return _Shape(
        b=m.micro_batch_size,
        s=m.seq_length // cp,
        s_kv=m.seq_length,
        h=m.hidden_size,
        t=t,
        sp=t if p.sequence_parallel else 1,
        B=dtype_bytes,
    )


def _q_is_copied(m: ModelConfig, t: int) -> bool:
    """Megatron views the fused QKV output as [s, b, groups, (heads/groups + 2) x d] and
    reshapes q to [s, b, heads, d]: a copy when a rank holds several query groups of several
    heads each (GQA), a view otherwise (MHA, or one group per rank)."""
    groups_per_rank = max(m.kv_groups // t, 1)
    return groups_per_rank > 1 and m.num_attention_heads > m.kv_groups


def _softmax_copy_in_fp32(m: ModelConfig, x: _Shape, B: int) -> bool:
    """Whether Megatron's unfused softmax runs on an fp32 copy of 16-bit scores: with
    attention_softmax_in_fp32 unless the fused CUDA kernel takes them (masked_softmax_fusion and
    the shapes it accepts: 16 < keys <= 4096, both lengths and batch x heads multiples of 4)."""
    if B >= 4 or not m.attention_softmax_in_fp32:
        return False
    fused = (
        m.masked_softmax_fusion
        and 16 < x.s_kv <= 4096
        and x.s % 4 == 0
        and x.s_kv % 4 == 0
        and (x.b * m.num_attention_heads // x.t) % 4 == 0
    )
    return not fused


def _norm_stats(m: ModelConfig, tokens: float) -> float:
    return (2 if m.normalization == "LayerNorm" else 1) * STAT_BYTES * tokens


def _act_internal(swiglu: bool, rows: float, ffn: float, B: int) -> float:
    """Bytes the reference layers' activation keeps between fc1 and fc2, fc2's input included:
    GeLU: its input and output; SwiGLU: fc1 out (gate|up), silu(gate), and the product."""
    return (4 if swiglu else 2) * B * rows * ffn


def _megatron_act_internal(
    m: ModelConfig, rows: float, ffn: float, B: int, fused: bool | None = None
) -> float:
    """The same for Megatron-Core's MLP. GeLU (fused or not): its input and output. SwiGLU
    fused (`fused`, by default bias_activation_fusion): fc1's output only, plus the output fc2
    keeps; unfused: fc1's output, silu(gate), `up + glu_linear_offset` (a copy), the product."""
    if not m.swiglu:
        return 2 * B * rows * ffn
    fused = m.bias_activation_fusion if fused is None else fused
    return (3 if fused else 5) * B * rows * ffn


# --------------------------------------------------------------------------------------------
# One layer
# --------------------------------------------------------------------------------------------


ENGINES = ("megatron", "reference", "torchtitan")


def activation_engine(m: ModelConfig, engine: str) -> str:
    """The engine whose saves are counted: a run the reader found to be torchtitan's (its
    loss_implementation, set by sources/torchtitan.py) is counted as torchtitan keeps it
    (memory/torchtitan.py), unless the caller asked for another than Megatron's default."""
    if engine == "megatron" and m.loss_implementation == "torchtitan":
        return "torchtitan"
    return engine


def layer_activation_bytes(
    m: ModelConfig,
    rc: RecomputeConfig,
    p: ParallelConfig,
    dtype_bytes: int,
    moe_layer: bool,
    training: bool = True,
    engine: str = "megatron",
) -> dict[str, float]:
    """Bytes one layer keeps for backward, per role, on one rank, for one micro-batch, with the
    selective part of `rc` applied (full recompute is applied by the caller).

    `engine` is the implementation whose saves are counted: "megatron" (Megatron-Core, with
    `m.transformer_impl` and its fusion flags; checked against the real engine), "reference"
    (recompute-kit's own layers; checked against them) or "torchtitan" (its dense blocks,
    memory/torchtitan.py; other blocks as Megatron's)."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if engine == "torchtitan":
        if titan.applies(m, moe_layer):
            return titan.block_bytes(m, rc, p, dtype_bytes)
        engine = "megatron"
    megatron = engine == "megatron"
    x = _shape(m, p, dtype_bytes)
    B, t, sp = x.B, x.t, x.sp
    # Outside training megatron-core 0.16.1 skips only the core_attn checkpoint (attention.py
    # checks `self.training`; moe_layer.py, mlp and the norms do not, measured); the reference
    # layers skip every input-saving checkpoint.
    training_only = ("core_attn",) if megatron else NORMAL_CHECKPOINT_MODULES

    def sel(module: str) -> bool:
        return rc.selects(module) and (training or module not in training_only)

    # TE fuses a norm into the next linear (LayerNormLinear) where Megatron's TE spec builds no
    # norm module of its own: `layernorm` recomputes only the norms that are modules
    # (memory/te_saves.py, from TE's and Megatron's source).
    attn_fused = megatron and attention_norm_fused(m)
    mlp_fused = megatron and mlp_norm_fused(m, moe_layer)
    attn_norm_recompute = norm_recomputed(attn_fused, sel("layernorm"))
    mlp_norm_recompute = norm_recomputed(mlp_fused, sel("layernorm"))
    # A dense TE layer's `mlp` checkpoint takes the residual stream (pre_mlp_layernorm is an
    # IdentityOp): the fused norm runs inside it and keeps nothing outside.
    mlp_norm_inside = mlp_fused and sel("mlp") and not moe_layer
    hidden_dropout = training and m.hidden_dropout > 0
    attn_dropout = training and m.attention_dropout > 0
    # a norm output saved by its consumer
    attn_norm_out = 0.0 if attn_norm_recompute else B * x.sbh / sp
    norm_out = 0.0 if mlp_norm_recompute else B * x.sbh / sp
    roles: dict[str, float] = {}

    # The two norms: their input (kept by the discarding checkpoint too) and fp32 statistics;
    # torch's RMSNorm (Megatron's local spec) also keeps its normalized input for the weight.
    local_rms = megatron and m.transformer_impl == "local" and m.normalization == "RMSNorm"

    def norm_bytes(recomputed: bool) -> float:
        if local_rms and not recomputed:
            # torch's RMSNorm computes on an fp32 copy of its input and keeps it with its fp32
            # normalized output (the 16-bit input itself is kept only by a norm checkpoint).
            return 2 * STAT_BYTES * x.sbh / sp + _norm_stats(m, x.tokens / sp)
        return B * x.sbh / sp + (0.0 if recomputed else _norm_stats(m, x.tokens / sp))

    mlp_norm = 0.0 if mlp_norm_inside else norm_bytes(mlp_norm_recompute)
    roles["layernorm"] = norm_bytes(attn_norm_recompute) + mlp_norm

    # Attention.
    a = m.num_attention_heads
    if m.multi_latent_attention:
        dq, dv = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        q_bytes = k_bytes = B * x.tokens * a * dq / t
        v_bytes = B * x.tokens * a * dv / t
        k_stored, v_stored = k_bytes, v_bytes
        roles["qkv"] = attn_norm_out  # the down projections' input
        if megatron and m.transformer_impl == "local":
            roles["mla_up_proj"] = _megatron_local_mla_latents(m, x, sel("mla_up_proj"))
        else:
            kv_down = B * x.tokens * (m.kv_lora_rank + m.qk_pos_emb_head_dim)
            q_down = B * x.tokens * m.q_lora_rank if m.q_lora_rank else 0.0
            # The latents stay either way; the latent norms' outputs and statistics only
            # without mla_up_proj recompute (Megatron has the norms with qk_layernorm, fused
            # into the up projections by TE; the reference layers always).
            up = q_down + kv_down
            if (m.qk_layernorm or not megatron) and not sel("mla_up_proj"):
                up += B * x.tokens * ((m.q_lora_rank or 0) + m.kv_lora_rank)
                up += (2 if m.q_lora_rank else 1) * _norm_stats(m, x.tokens)
            roles["mla_up_proj"] = up
        expanded_gone = sel("mla_up_proj")  # q, k, v storage discarded after core attention
        heads_out = a * dv
    else:
        d, g = m.head_dim, m.kv_groups
        q_bytes = B * x.tokens * a * d / t
        k_bytes = v_bytes = B * x.tokens * g * d / t  # un-expanded
        k_stored = v_stored = B * x.tokens * a * d / t  # expanded for the unfused path
        roles["qkv"] = attn_norm_out
        if megatron and m.position_embedding_type in _ROTARY and not m.apply_rope_fusion:
            # Unfused RoPE computes cos and sin of the rotary angles for q and for k and keeps
            # them ([s, 1, 1, d] in the activation dtype); the fused kernel keeps only the
            # angles, once per forward.
            roles["qkv"] += 4 * B * x.s * d
        qk_norm = megatron and m.qk_layernorm
        if qk_norm:
            # q/k norms over each head keep their inputs: q (a copy with GQA) and k, a view
            # that keeps the whole fused QKV output alive; plus statistics, and for torch's
            # RMSNorm (local spec) the normalized q and k too.
            qk_heads = x.tokens * (a + g) / t
            kept_inputs = (q_bytes if _q_is_copied(m, t) else 0.0) + q_bytes + 2 * k_bytes
            roles["qkv"] += kept_inputs + _norm_stats(m, qk_heads)
            if m.transformer_impl == "local" and m.normalization == "RMSNorm":
                # in fp32 whatever the activation dtype (measured: bf16 keeps 2 B more per
                # element of q and k than the activation dtype would)
                roles["qkv"] += (q_bytes + k_bytes) * STAT_BYTES / B
        expanded_gone = False
        heads_out = a * d

    scores = x.b * (a / t) * x.s * x.s_kv  # elements of one [b, a, s, s] tensor
    if sel("core_attn") and megatron and not m.multi_latent_attention and m.qk_layernorm:
        core = q_bytes + k_bytes  # the normed q and k; v's storage is kept by the k norm
    elif sel("core_attn"):
        core = 0.0 if expanded_gone else q_bytes + k_bytes + v_bytes
        if megatron and not m.multi_latent_attention:
            # Megatron splits the fused QKV output per query group into views: v (and k, q
            # when nothing replaces them) keeps the whole QKV output alive in the checkpoint.
            # q is a new tensor when it is copied (GQA) or rotated, k when it is rotated: RoPE
            # (unfused or fused) returns new tensors, and the checkpoint keeps those too
            # (megatron-core 0.16.1, measured per tensor: Llama-3-70B TP8 keeps 2q + 2k + v).
            rope = m.position_embedding_type in _ROTARY
            core += (q_bytes if _q_is_copied(m, t) or rope else 0.0) + (k_bytes if rope else 0.0)
    elif m.attention_backend == "unfused":
        qkv_kept = 0.0 if expanded_gone else q_bytes + k_stored + v_stored
        probs = B * scores * (2 if attn_dropout else 1) + (
            MASK_BYTES * scores if attn_dropout else 0
        )
        if megatron and _softmax_copy_in_fp32(m, x, B):
            # The softmax runs on an fp32 copy and keeps its fp32 output; the probabilities
            # cast back to B bytes are what the next op keeps.
            probs += (STAT_BYTES - B if attn_dropout else STAT_BYTES) * scores
        core = qkv_kept + probs
    else:  # flash: q, k, v, output and the fp32 log-sum-exp
        qkv_kept = 0.0 if expanded_gone else q_bytes + k_bytes + v_bytes
        lse = STAT_BYTES * x.b * (a / t) * x.s
        # TE's fused attention saves the output linear_proj saves (one storage, counted in
        # proj); flash-attn through TE keeps its own copy when the micro-batch is above 1.
        shared = megatron and attention_output_shared(m, x.b)
        out = 0.0 if shared else B * x.tokens * heads_out / t
        # TE keeps the rng state (2 x int64) with or without dropout (cuDNN's aux tensors,
        # fused_attn_f16_arbitrary_seqlen.cu:1128-1131; flash-attn returns it always).
        rng = 16 if attn_dropout or (megatron and te_spec(m)) else 0
        core = qkv_kept + out + lse + rng
    roles["core_attn"] = core
    # Megatron-Bridge's LoRA under SP (peft/utils.py ParallelLinearAdapter.forward, its default
    # sequence_parallel_input_regather False): the adapters on linear_qkv and (dense layers)
    # linear_fc1 gather the norm's output, and LoRA-A keeps the whole sequence for its weight
    lora_gathered = B * x.sbh if megatron and p.frozen_base and sp > 1 else 0.0
    if p.lora_input_regather:  # the local shard kept, gathered again in backward
        lora_gathered /= sp
    roles["qkv"] += lora_gathered
    roles["proj"] = B * x.tokens * heads_out / t
    roles["residual"] = 2 * MASK_BYTES * x.sbh / sp if hidden_dropout else 0.0

    # Feed-forward.
    if not moe_layer:
        if mlp_norm_inside:
            roles["mlp"] = B * x.sbh / sp  # the checkpoint's input: the residual stream
        elif sel("mlp"):
            roles["mlp"] = norm_out  # the checkpoint's input
        elif megatron:
            roles["mlp"] = norm_out + _megatron_act_internal(m, x.tokens, m.ffn_size / t, B)
            roles["mlp"] += lora_gathered
        else:
            roles["mlp"] = norm_out + _act_internal(m.swiglu, x.tokens, m.ffn_size / t, B)
        return roles

    if megatron:
        roles.update(_megatron_moe_layer_bytes(m, p, x, norm_out, sel, training))
    else:
        roles.update(_moe_layer_bytes(m, x, norm_out, sel, training))
    return roles


def _megatron_local_mla_latents(m: ModelConfig, x: _Shape, up_recompute: bool) -> float:
    """What Megatron-Core's MLA (local spec, megatron-core 0.16.1, measured per tensor) keeps
    between the down projections and core attention: the latents the up projections read,
    the latent norms (with qk_layernorm) and RoPE's tables.

    Storages: the q latent [T, q_lora] and the kv down projection's [T, kv_lora + rope], over
    the full sequence (with TP the down projections' outputs are gathered whole; SP then
    takes this rank's rows as views, and copies the kv latent out). A view keeps its whole
    storage: the q latent the up projection reads, the kv latent without SP's copy, the
    input of an fp32 norm (its "fp32 copy" is the input itself), the rope part of k under
    mla_up_proj. torch's norm keeps its fp32 input copy, its fp32 normalized output and
    statistics; the up projection keeps the norm's output. Under mla_up_proj the norms still
    run outside the checkpoint, which keeps its inputs and the fp32 rotary angles; without it
    the unfused rope multiplications keep cos and sin for q and for k (what the fused kernel
    keeps is not measured here: the angles are assumed)."""
    B, T, T_local = x.B, x.tokens, x.tokens / x.sp
    q_w, kv_w, rope = m.q_lora_rank or 0, m.kv_lora_rank, m.qk_pos_emb_head_dim
    fp32 = B == STAT_BYTES
    kv_copied = x.t > 1 and x.sp > 1  # SP's scatter copies the kv latent out of its storage
    latent_saved = not m.qk_layernorm or fp32  # by the up projection, or as an fp32 norm's input
    out = 0.0
    if up_recompute or (latent_saved and not kv_copied):
        out += B * T * (kv_w + rope)  # the kv down projection's whole output
    if latent_saved and kv_copied:
        out += B * T_local * kv_w
    if not m.qk_layernorm:
        out += B * T * q_w
    else:
        # each norm: its fp32 input copy (fp32: the input, already counted for kv), its fp32
        # normalized output, statistics, and its output in the activation dtype
        if q_w:
            out += B * T * q_w if fp32 else STAT_BYTES * T_local * q_w
            out += STAT_BYTES * T_local * q_w + _norm_stats(m, T_local) + B * T_local * q_w
        out += 0.0 if fp32 else STAT_BYTES * T_local * kv_w
        out += STAT_BYTES * T_local * kv_w + _norm_stats(m, T_local) + B * T_local * kv_w
    angles_only = up_recompute or m.apply_rope_fusion
    return out + (STAT_BYTES * x.s * rope if angles_only else 4 * B * x.s * rope)


def _moe_layer_bytes(m: ModelConfig, x: _Shape, norm_out: float, sel, training: bool) -> dict:
    # Tokens of this rank (sequence-sharded with SP); experts are not tensor-parallel (ETP = 1).
    B, T, k, E = x.B, x.tokens / x.sp, m.moe_router_topk, m.num_moe_experts or 1
    picks = T * k
    if sel("moe"):
        # One checkpoint of the whole layer: only its input stays (the norm output, unless the
        # layernorm recompute discarded it).
        return {
            "mlp": norm_out,
            "router": 0.0,
            "experts": 0.0,
            "moe_act": 0.0,
            "shared_experts": 0.0,
        }
    roles: dict[str, float] = {}
    router = norm_out + INDEX_BYTES * picks  # the router GEMM's input, top-k ids
    if m.moe_router_score_function == "sigmoid":
        router += B * T * E + B * picks + B * T  # sigmoid output, top scores, their sum
    else:
        router += B * picks  # softmax over the top-k logits
    if training and m.moe_aux_loss_coeff > 0:
        router += STAT_BYTES * T * E + STAT_BYTES * E  # fp32 softmax over all experts, fractions
    roles["router"] = router
    roles["mlp"] = 2 * INDEX_BYTES * picks  # dispatch: slot -> token, pick order
    f_e = m.moe_ffn_size
    fc1_out = B * picks * f_e * (2 if m.swiglu else 1)
    act_out = B * picks * f_e
    # Between fc1's output and fc2's input: the activation's own intermediates (SwiGLU:
    # silu(gate)) and the activation before it is scaled by the pick's probability.
    internals = _act_internal(m.swiglu, picks, f_e, B) - fc1_out - act_out + B * picks * f_e
    probs = B * picks
    roles["experts"] = B * picks * x.h + (0.0 if sel("moe_act") else act_out)
    roles["moe_act"] = fc1_out + probs + (0.0 if sel("moe_act") else internals)
    f_s = m.moe_shared_expert_intermediate_size
    if f_s and not sel("shared_experts"):
        roles["shared_experts"] = _act_internal(m.swiglu, x.tokens, f_s / x.t, B)
    else:
        roles["shared_experts"] = 0.0
    return roles


def _megatron_moe_layer_bytes(
    m: ModelConfig, p: ParallelConfig, x: _Shape, norm_out: float, sel, training: bool
) -> dict[str, float]:
    """What Megatron-Core's MoE layer keeps (router, allgather dispatcher, SequentialMLP
    experts with the routing probabilities applied inside the activation, shared experts),
    measured per tensor on megatron-core 0.16.1.

    The router sees this rank's tokens (T, sequence-sharded with SP). The dispatcher gathers
    the tokens of the expert-tensor x expert-parallel group (T x ETP x EP) and keeps the
    copies routed to this rank's experts: T x ETP x k of them with balanced routing, each
    through 1/ETP of every expert's width. Router scores are fp32."""
    B, T, k, E = x.B, x.tokens / x.sp, m.moe_router_topk, m.num_moe_experts or 1
    etp, ep = p.etp, p.expert_model_parallel_size
    if sel("moe"):  # one checkpoint of the whole MoE layer keeps its input
        return {"mlp": norm_out, "router": 0.0, "experts": 0.0, "moe_act": 0.0}
    sigmoid = m.moe_router_score_function == "sigmoid"
    router = INDEX_BYTES * T * k  # the top-k ids
    if sigmoid:  # fp32 sigmoid scores; the top-k scores and their sum in the activation dtype
        router += STAT_BYTES * T * E + B * (T * k + T)
    else:  # the fp32 top-k probabilities
        router += STAT_BYTES * T * k
    if training and m.moe_aux_loss_coeff > 0:
        # The aux loss's scores over all experts (fp32 softmax; sigmoid scores and their sum
        # in the activation dtype), its top-k map and counts, the loss scalar.
        scores = B * (T * E + T) + B if sigmoid else STAT_BYTES * T * E + 4
        router += scores + INDEX_BYTES * (T * k + E)
    gathered = T * etp * ep
    picks = T * etp * k
    local_experts = E / ep
    f_e = m.moe_ffn_size / etp
    roles = {
        "router": router,
        # dispatch: the ids of the picked token copies; the local experts' columns of the
        # gathered routing map and probabilities
        "mlp": norm_out + INDEX_BYTES * picks + (MASK_BYTES + B) * local_experts * gathered,
        "experts": B * picks * x.h + B * picks,  # the permuted token copies; their probs
    }
    if sel("moe_act"):
        roles["moe_act"] = B * picks * f_e * (2 if m.swiglu else 1)
    else:
        # The activation x probability: fused SwiGLU keeps fc1's output, unfused keeps the
        # SwiGLU intermediates and the unscaled output; fc2 keeps the scaled output.
        if m.moe_grouped_gemm and m.transformer_impl == "local":
            # The local spec's grouped GEMM experts (legacy GroupedMLP, experts.py) run
            # `activation(x) * probs` as one torch.compile'd function (jit_fuser): it keeps
            # its input, fc1's output, whatever the activation (inductor recomputes GeLU in
            # backward), and fc2 keeps its output (measured: GeLU keeps 2, not 3, copies).
            roles["moe_act"] = B * picks * f_e * ((2 if m.swiglu else 1) + 1)
        else:
            fused = m.bias_activation_fusion
            roles["moe_act"] = _megatron_act_internal(m, picks, f_e, B, fused) + (
                0.0 if fused and m.swiglu else B * picks * f_e
            )
    f_s = m.moe_shared_expert_intermediate_size
    if f_s and not sel("shared_experts"):
        roles["shared_experts"] = _megatron_act_internal(m, x.tokens, f_s / x.t, B)
    else:
        roles["shared_experts"] = 0.0
    return roles


# --------------------------------------------------------------------------------------------
# The whole model on one rank
# --------------------------------------------------------------------------------------------

OFFLOAD_ROLES = {  # offload unit -> (role, share of that role)
    "attn_norm": ("layernorm", 0.5),
    "mlp_norm": ("layernorm", 0.5),
    "qkv_linear": ("qkv", 1.0),
    "core_attn": ("core_attn", 1.0),
    "attn_proj": ("proj", 1.0),
    "moe_act": ("moe_act", 1.0),
}


def edge_bytes(
    m: ModelConfig,
    p: ParallelConfig,
    dtype_bytes: int,
    training: bool = True,
    engine: str = "megatron",
) -> dict:
    """What the embedding (first stage) and the output head and loss (last stage) keep: as
    Megatron-Core 0.16.1 keeps them (engine "megatron", checked against it in
    tests/test_megatron_parity.py), the kit's reference layers ("reference") or torchtitan
    ("torchtitan", memory/torchtitan.py)."""
    if engine == "torchtitan":
        return titan.edge_bytes(m, p, dtype_bytes, loss_bytes(m, p, dtype_bytes, engine)[0])
    x = _shape(m, p, dtype_bytes)
    tokens = x.tokens
    mask = MASK_BYTES * x.sbh / x.sp if training and m.hidden_dropout > 0 else 0.0
    megatron = engine == "megatron" and m.loss_implementation == "megatron"
    ids = INDEX_BYTES * tokens  # the token ids the lookup keeps
    norm = x.B * x.sbh / x.sp + _norm_stats(m, tokens / x.sp)
    if megatron:
        # Vocab-parallel (TP > 1) the lookup keeps its own copy of the ids shifted to this
        # rank's vocabulary range and the out-of-range mask (VocabParallelEmbedding.forward).
        # Learned positions keep the position ids: Megatron-LM's `arange(s).expand_as(tokens)`
        # (one row of storage), a [b, s/cp] copy once CP slices it.
        ids += MASK_BYTES * tokens if x.t > 1 else 0.0
        if m.position_embedding_type == "learned_absolute":
            ids += INDEX_BYTES * (x.s_kv if p.context_parallel_size == 1 else tokens)
        if m.transformer_impl == "local" and m.normalization == "RMSNorm":
            # torch's RMSNorm keeps an fp32 copy of its input and its fp32 output
            norm = 2 * STAT_BYTES * x.sbh / x.sp + _norm_stats(m, tokens / x.sp)
    return {
        "embedding": ids + mask,  # token (and position) ids, embedding dropout mask
        "final_norm": norm,
        "output": x.B * x.sbh / x.sp,  # the output layer's input (sequence-sharded with SP)
        "loss": loss_bytes(m, p, dtype_bytes, engine)[0],
    }


def loss_bytes(
    m: ModelConfig, p: ParallelConfig, dtype_bytes: int, engine: str = "megatron"
) -> tuple[float, float]:
    """(saved, transient): what the loss keeps for backward on a last-stage rank, and the most
    it adds on top of that while it runs (forward or backward). The logits are the output
    layer's [s/cp, b, v/t] in the activation dtype (the layer gathers SP's sequence first).

    Megatron-Core 0.16.1 (`GPTModel.compute_language_model_loss`):
    * unfused `vocab_parallel_cross_entropy` and the native fused one
      (cross_entropy_loss_fusion, fusions/fused_cross_entropy.py) keep the same tensors
      (tensor_parallel/cross_entropy.py, `ctx.save_for_backward(exp_logits, target_mask,
      masked_target_1d)`): the softmax in fp32 over the padded vocabulary ([s, b, v/t], an
      fp32 copy of 16-bit logits, the logits themselves in place when they are fp32), the
      bool out-of-range mask and the int64 shifted targets. The 16-bit logits live beside
      their fp32 copy in the forward; the gradient is made in place in the softmax and cast
      to the logits' dtype (unfused: only if 16-bit; fused: always to bf16, then autograd
      casts it to the logits' dtype).
    * TE's (cross_entropy_fusion_impl "te", transformer_engine/pytorch/cross_entropy.py) writes
      the gradient into the logits in place and keeps them in their own dtype, the int64
      targets and its fp32 (max, sum, target logit) per row, gathered over TP.
    Hugging Face (`ForCausalLMLoss`), torchtitan (`cross_entropy_loss`) and the kit's reference
    layers run torch's cross_entropy on logits upcast to fp32: log_softmax keeps its fp32
    output, nll_loss the int64 targets and its fp32 total weight; the 16-bit logits and their
    fp32 copy live in the forward, and backward holds two fp32 gradients (of the
    log-softmax's output and of its input)."""
    x = _shape(m, p, dtype_bytes)
    B, tokens, t = x.B, x.tokens, x.t
    impl = m.loss_implementation
    if impl not in ("megatron", "hf", "torchtitan"):
        raise ConfigError(f"loss_implementation must be megatron, hf or torchtitan, got {impl!r}")
    logits = tokens * logits_columns(m, p, engine)
    if impl != "megatron" and m.fused_linear_cross_entropy:
        if m.fused_linear_cross_entropy_impl == "trl_chunked_nll":
            return _trl_chunked_loss_bytes(m, tokens, B)
        if m.fused_linear_cross_entropy_impl == "torchtitan_chunked":
            return _torchtitan_chunked_loss_bytes(m, tokens, logits, B)
        return _fused_linear_loss_bytes(m, tokens, B)
    if impl != "megatron" or engine != "megatron":
        saved = STAT_BYTES * logits + INDEX_BYTES * tokens + STAT_BYTES
        upcast = STAT_BYTES * logits if B < STAT_BYTES else 0.0
        return saved, max(B * logits + upcast, 2 * STAT_BYTES * logits)
    fusion = m.cross_entropy_fusion_impl if m.cross_entropy_loss_fusion else None
    if fusion not in (None, "native", "te"):
        raise ConfigError(
            f"cross_entropy_fusion_impl must be native or te, got {m.cross_entropy_fusion_impl!r}"
        )
    if fusion == "te":
        saved = B * logits + INDEX_BYTES * tokens + 3 * STAT_BYTES * tokens * t
        return saved, 0.0
    saved = STAT_BYTES * logits + (MASK_BYTES + INDEX_BYTES) * tokens
    copy = B * logits if B < STAT_BYTES else 0.0  # the 16-bit logits beside the fp32 copy
    # fused: the bf16 gradient, then autograd's cast to the logits' dtype
    cast = 2 * logits + (B * logits if B != 2 else 0.0)
    return saved, max(copy, cast if fusion == "native" else copy)


def _fused_linear_loss_bytes(m: ModelConfig, tokens: float, B: int) -> tuple[float, float]:
    """Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py):
    forward computes the loss and both gradients chunk by chunk and keeps them for backward:
    grad_input [tokens, hidden] in the activations' dtype, grad_weight [vocab, hidden] in the
    output weight's (16-bit here: DeepSpeed's and LLaMA-Factory's; fp32 under autocast,
    not told apart) and an fp32 loss per token; the transient is one [chunk, vocab] logits
    tile, chunk = next_pow2(ceil(tokens / ceil(vocab / hidden))), about [tokens, hidden]."""
    h, v = m.hidden_size, m.vocab_size
    saved = B * tokens * h + B * v * h + STAT_BYTES * tokens
    rows = -(-int(tokens) // -(-v // h))
    chunk = min(1 << max(rows - 1, 0).bit_length(), int(tokens))
    return saved, B * chunk * v


TRL_CHUNK_TOKENS = 256  # trl/trainer/sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE


def _trl_chunked_loss_bytes(m: ModelConfig, tokens: float, B: int) -> tuple[float, float]:
    """TRL's chunked_nll (sft_trainer.py `_chunk` under torch.utils.checkpoint, 256 tokens at a
    time): the checkpoints keep the hidden states (views of one [tokens, hidden] tensor) and
    the int64 labels; each chunk computes `h.float() @ w.float().t()`, so its forward, and its
    recompute in backward, cast the whole output weight to fp32, and backward adds that
    copy's fp32 gradient before it is cast into the weight's: two fp32 [vocab, hidden] at
    the peak, with the chunk's fp32 logits, log-probabilities and their gradient."""
    h, v = m.hidden_size, m.vocab_size
    chunk = min(TRL_CHUNK_TOKENS, tokens)
    saved = B * tokens * h + INDEX_BYTES * tokens
    return saved, 2 * STAT_BYTES * v * h + 3 * STAT_BYTES * chunk * v


def _torchtitan_chunked_loss_bytes(
    m: ModelConfig, tokens: float, logits: float, B: int
) -> tuple[float, float]:
    """torchtitan's ChunkedLossWrapper (components/loss.py): after the decoder's forward the
    hidden states [tokens, hidden] are split into `fused_linear_cross_entropy_chunks` detached
    contiguous copies, and each chunk runs the output layer, the loss and its backward at once,
    adding its gradient into an fp32 [tokens, hidden] accumulator (GradAccumulator); the sum,
    cast to the hidden states' dtype, is saved for the decoder's backward
    (_DecoderOutputGradientBackProp). The hidden states stay whole on every TP rank (the final
    norm's output is replicated before chunking). Kept: that gradient and the int64 labels.
    Transient, while the chunks run: the fp32 accumulator, the chunk copies (the size of the
    kept gradient, which does not exist yet) and one chunk's logits through torch's
    cross_entropy (see `loss_bytes`)."""
    h, n = m.hidden_size, max(1, m.fused_linear_cross_entropy_chunks)
    saved = B * tokens * h + INDEX_BYTES * tokens
    chunk = logits / n
    upcast = STAT_BYTES * chunk if B < STAT_BYTES else 0.0
    one_chunk = STAT_BYTES * chunk + max(B * chunk + upcast, 2 * STAT_BYTES * chunk)
    return saved, STAT_BYTES * tokens * h + one_chunk


def logits_columns(m: ModelConfig, p: ParallelConfig, engine: str = "megatron") -> float:
    """The logits' columns on one rank: the vocabulary over TP, padded as Megatron pads it
    (no padding outside Megatron's loss)."""
    t = p.tensor_model_parallel_size
    if m.loss_implementation != "megatron" or engine != "megatron":
        return m.vocab_size / t
    return padded_vocab_size(m, t) / t


def check_divisible(config: Config) -> None:
    """Shapes must split evenly over the parallel sizes (one line per problem)."""
    m, p = config.model, config.parallel
    t, pp, ep, cp = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.expert_model_parallel_size,
        p.context_parallel_size,
    )
    for name, value in (
        ("tp", t),
        ("pp", pp),
        ("ep", ep),
        ("cp", cp),
        ("dp", p.data_parallel_size),
    ):
        if value < 1:
            raise ConfigError(f"--{name} must be at least 1, got {value}")
    if m.num_attention_heads % t:
        raise ConfigError(
            f"num_attention_heads ({m.num_attention_heads}) is not divisible by tensor parallel "
            f"size {t}; pick a --tp that divides it"
        )
    if m.loss_implementation == "torchtitan" and m.kv_groups % t:
        # torchtitan shards wk / wv column-wise: each TP rank holds whole KV heads
        raise ConfigError(
            f"torchtitan shards the {m.kv_groups} KV heads over tensor parallelism: "
            f"tensor_parallel_degree {t} must divide them"
        )
    if not m.multi_latent_attention and m.kv_groups % t and t % m.kv_groups:
        raise ConfigError(
            f"num_query_groups ({m.kv_groups}) and tensor parallel size {t} must divide one another"
        )
    pipeline_layout(m, p)  # stages and virtual chunks must split (one line if not)
    if m.num_moe_experts and m.num_moe_experts % ep:
        raise ConfigError(
            f"num_moe_experts ({m.num_moe_experts}) is not divisible by expert parallel size {ep}"
        )
    if ep > 1 and not m.num_moe_experts:
        raise ConfigError(f"expert parallel size {ep} needs an MoE model (num_moe_experts)")
    if m.seq_length % (cp * (t if p.sequence_parallel else 1)):
        raise ConfigError(
            f"seq_length ({m.seq_length}) is not divisible by context parallel size {cp}"
            + (f" x sequence-parallel size {t}" if p.sequence_parallel else "")
        )
    if m.ffn_size % t or (m.moe_shared_expert_intermediate_size or 0) % t:
        raise ConfigError(
            f"ffn_hidden_size ({m.ffn_size}) is not divisible by tensor parallel size {t}"
        )


def estimate(
    config: Config,
    dtype_bytes: int | None = None,
    training: bool = True,
    engine: str = "megatron",
    stage: int | None = None,
    moe_imbalance: float | None = None,
) -> Estimate:
    """Estimate per-rank memory of one training step under `config` (its recompute settings)
    on one pipeline stage: `stage`, or (None) the stage that holds the most.
    `moe_imbalance` scales the experts' token copies (memory/overheads.py; None: the config's
    moe_expert_capacity_factor where it sets one, else 1.0, balanced)."""
    m, p = config.model, config.parallel
    if m.not_modelled:
        raise ConfigError(m.not_modelled)
    check_divisible(config)
    engine = activation_engine(m, engine)
    B = dtype_bytes or (2 if (m.bf16 or m.fp16) else 4)
    layout = pipeline_layout(m, p)
    if stage is not None and not 0 <= stage < len(layout):
        raise ConfigError(f"--stage must be in 0..{len(layout) - 1}, got {stage}")
    stages = range(len(layout)) if stage is None else [stage]
    results = [_stage_estimate(config, B, training, engine, s, layout) for s in stages]
    for e in results:
        _add_overheads(e, config, B, moe_imbalance)
    # the binding stage is the one that holds the most, its imbalance and buffers included
    # (the stage with more MoE layers can bind at a routing imbalance though its total is less)
    best = max(results, key=lambda e: e.held_bytes)
    if stage is None:
        best.stage_total_bytes = [e.total_bytes for e in results]
        best.stage_held_bytes = [e.held_bytes for e in results]
    return best


def _stage_estimate(
    config: Config, B: int, training: bool, engine: str, stage: int, layout: list
) -> Estimate:
    m, p, rc = config.model, config.parallel, config.recompute
    x = _shape(m, p, B)
    pp = len(layout)
    layers = [n for chunk in layout[stage] for n in chunk]
    n_layers = max(len(layers), 1)
    moe = [m.is_moe_layer(n) for n in layers]
    roles = [layer_activation_bytes(m, rc, p, B, k, training, engine) for k in moe]
    plain = [layer_activation_bytes(m, RecomputeConfig(), p, B, k, training, engine) for k in moe]
    edges = edge_bytes(m, p, B, training, engine)
    head = edges["final_norm"] + edges["output"] + edges["loss"] if stage == pp - 1 else 0.0
    embedding = edges["embedding"] if stage == 0 else 0.0
    mtp = _mtp_bytes(config, B, training, engine, stage, layout, edges)
    head += sum(mtp.values())  # backward passes the MTP block right after the loss

    layer_input = B * x.sbh / x.sp  # what a full-recompute chunk stores
    if rc.distribute_saved_activations and not p.sequence_parallel:
        layer_input /= x.t
    # Full recompute runs per virtual-pipeline chunk: each chunk is its own TransformerBlock.
    chunks, offset, model_chunks = [], 0, []
    for chunk in layout[stage]:
        model_chunks.append((offset, offset + len(chunk)))
        chunks += [
            (offset + a, offset + b, ck)
            for a, b, ck in full_recompute_chunks(rc, len(chunk), training)
        ]
        offset += len(chunk)
    kept = [0.0] * len(layers)  # device-resident saved bytes per layer
    offloaded = 0.0
    for start, end, checkpointed in chunks:
        for i in range(start, end):
            if not checkpointed:
                off = _offloaded(rc, roles[i], i, x, m)
                kept[i] = sum(roles[i].values()) - off
                offloaded += off
    stored = layer_input * sum(1 for c in chunks if c[2])
    layer_total = sum(kept) + stored

    # one micro-batch's saves in each model chunk: the embedding is the first chunk's of the
    # first stage, the loss the last chunk's of the last stage
    chunk_bytes = [
        sum(kept[a:b]) + layer_input * sum(1 for c in chunks if c[2] and a <= c[0] < b)
        for a, b in model_chunks
    ]
    chunk_bytes[0] += embedding
    mtp_where = mtp_location(m, p)
    mtp_chunk = mtp_where[1] if mtp and mtp_where is not None else len(chunk_bytes) - 1
    chunk_bytes[-1] += head - sum(mtp.values())
    chunk_bytes[mtp_chunk] += sum(mtp.values())  # (layout `m`: not always the loss's chunk)
    held = chunk_micro_batches_at_peak(p, stage, chunk_bytes, m.micro_batch_size)
    in_flight = micro_batches_in_flight(p, stage, m.micro_batch_size)
    activation = sum(n * b for n, b in zip(held, chunk_bytes, strict=True))
    loss_transient = loss_bytes(m, p, B, engine)[1] if stage == pp - 1 else 0.0
    transient = _backward_transient(
        m, rc, x, chunks, roles, plain, kept, layer_input, head, moe, loss_transient
    )
    peak = activation + transient

    modules: dict[str, float] = {}
    for start, end, checkpointed in chunks:
        for i in range(start, end):
            for role, value in roles[i].items():
                modules[role] = modules.get(role, 0.0) + (0.0 if checkpointed else value) / n_layers
    if stored:
        modules["layer_inputs"] = stored / n_layers

    states = model_states(config, stage, engine)
    weights, grads, optimizer = states.weights, states.grads, states.optimizer
    step = optimizer_step_bytes(config, states)
    return Estimate(
        recompute=format_spec(rc),
        per_layer_activation_bytes=layer_total / n_layers,
        activation_bytes=round(activation),
        peak_activation_bytes=round(peak),
        modules=modules,
        weights_bytes=weights,
        grads_bytes=grads,
        optimizer_bytes=optimizer,
        total_bytes=round(weights + grads + optimizer + max(peak, step)),
        optimizer_step_bytes=round(step),
        step_sets_peak=step > peak,
        recompute_flops_fraction=recompute_flops_fraction(config, stage),
        model_recompute_flops_fraction=model_recompute_flops_fraction(config, stage),
        offloaded_bytes=round(offloaded * in_flight),
        stage=stage,
        layers=layers,
        micro_batches_in_flight=in_flight,
        chunk_micro_batches=held,
        sharding=states.mode,
        gathered_params_bytes=states.gathered_params,
        mtp_bytes=mtp,
        **_loss_terms(m, p, B, engine, stage == pp - 1, held[-1], loss_transient, transient),
    )


# zero_optimization.sub_group_size's default (deepspeed/runtime/zero/config.py)
ZERO3_SUB_GROUP = 1_000_000_000


def optimizer_step_bytes(config: Config, states: ModelStates) -> float:
    """What the optimizer step holds beside the model states, after backward freed the
    activations: DeepSpeed ZeRO's fp32 copy of this rank's gradient partition
    (model_states.step_fp32_grads: stage_1_and_2.py step(), flatten(...).to(fp32)) and, with
    torch's foreach AdamW (adam_step_temporary), a temporary of one moment's size
    (_multi_tensor_adamw: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs))."""
    p = config.parallel
    step = float(states.step_fp32_grads)
    moment = 0.0
    if p.adam_step_temporary and states.optimizer and not p.optimizer_offload:
        # Adam's two moments, beside a master copy where the weights are 16-bit with one
        moment = states.optimizer / (
            3 if p.param_precision == "fp32_master" and states.mode != "fsdp2" else 2
        )
    if states.mode == "zero" and p.zero_stage >= 3:
        # stage 3 steps one sub-group at a time (stage3.py, _prepare_fp32_grad_for_sub_group):
        # at most sub_group_size elements (DeepSpeed's default 1e9) of each
        step, moment = min(step, 4 * ZERO3_SUB_GROUP), min(moment, 4 * ZERO3_SUB_GROUP)
    return step + moment


def _loss_terms(m, p, B, engine, last, in_flight, loss_transient, transient) -> dict:
    """Estimate's logits / loss fields for one stage (zero unless it holds the loss)."""
    if not last:
        return {}
    return {
        "logits_shape": [_shape(m, p, B).tokens, round(logits_columns(m, p, engine))],
        "fused_linear_loss": m.fused_linear_cross_entropy and m.loss_implementation != "megatron",
        "loss_saved_bytes": round(loss_bytes(m, p, B, engine)[0] * in_flight),
        "loss_transient_bytes": round(loss_transient),
        "loss_sets_peak": loss_transient > 0 and loss_transient >= transient,
    }


def _mtp_bytes(config, B, training, engine, stage, layout, edges) -> dict[str, float]:
    """The MTP block's saves (memory/mtp.py) on the stage that holds it; Megatron's engine
    only (the others build no MTP layers)."""
    where = mtp_location(config.model, config.parallel)
    if where is None or where[0] != stage or engine != "megatron":
        return {}
    if config.model.loss_implementation != "megatron":
        return {}
    moe = mtp_layer_is_moe(config.model, layout[stage][where[1]])
    return mtp_activation_bytes(config, B, edges, moe, training)


def _add_overheads(e: Estimate, config: Config, B: int, moe_imbalance: float | None) -> None:
    """The named overhead terms of memory/overheads.py and total_with_overheads_bytes."""
    m, p = config.model, config.parallel
    moe_stage = any(m.is_moe_layer(n) for n in e.layers)
    experts = (e.modules.get("experts", 0.0) + e.modules.get("moe_act", 0.0)) * max(
        len(e.layers), 1
    )
    x = _shape(m, p, B)
    gathered = x.tokens / x.sp * p.etp * p.expert_model_parallel_size
    terms = overhead_terms(
        config,
        e.sharding,
        e.gathered_params_bytes,
        experts * e.micro_batches_in_flight,
        gathered,
        moe_stage,
        B,
        moe_imbalance,
    )
    for key, value in terms.items():
        setattr(e, key, value)
    e.total_with_overheads_bytes = e.total_bytes + e.overhead_bytes


def _offloaded(rc: RecomputeConfig, roles: dict[str, float], layer: int, x, m) -> float:
    """Bytes of one layer that offloading sends to the host."""
    if rc.cpu_offloading and layer < rc.cpu_offloading_num_layers:
        return sum(roles.values())
    if not rc.fine_grained_activation_offloading:
        return 0.0
    total = 0.0
    for unit in rc.offload_modules:
        if unit == "expert_fc1" and roles.get("experts"):  # the token copies fc1 reads
            total += x.B * (x.tokens / x.sp) * m.moe_router_topk * x.h
        elif unit in OFFLOAD_ROLES:
            role, share = OFFLOAD_ROLES[unit]
            total += share * roles.get(role, 0.0)
    return total


# --------------------------------------------------------------------------------------------
# The backward transient: what backward needs on top of the saved activations
# --------------------------------------------------------------------------------------------


def _backward_transient(
    m, rc, x, chunks, roles, plain, kept, layer_input, head, moe, loss_transient=0.0
) -> float:
    """The largest extra backward needs on top of everything saved at the end of the forward.

    Backward walks the layers last to first and frees each layer's saved tensors once it has
    passed it, so an early layer's recompute has less company than the first moments of
    backward. At each layer the extra is the rematerialised activations (a full-recompute
    chunk's layers all at once; a selective unit's internals) plus gradient workspace.
    """
    # The loss (last stage only): what it adds while it runs (loss_bytes), at the end of the
    # forward or the first moment of backward.
    best = loss_transient
    freed = head  # saved bytes backward has already released
    for start, end, checkpointed in reversed(chunks):
        if checkpointed:  # the whole chunk comes back at once, then its last layer's backward
            remat = sum(sum(plain[i].values()) for i in range(start, end))
            attention, ffn = _workspace(m, x, moe[end - 1])
            work = max(ffn, attention - _ffn_part(plain[end - 1]))
            best = max(best, remat + work - freed)
            freed += layer_input
            continue
        for i in reversed(range(start, end)):
            attention, ffn = _workspace(m, x, moe[i])
            # The feed-forward's backward runs first; the attention's once its saves are gone.
            ffn_extra = _remat(roles[i], plain[i], rc, _FFN_UNITS) + ffn
            attention_extra = (
                _remat(roles[i], plain[i], rc, _ATTENTION_UNITS) + attention - _ffn_part(roles[i])
            )
            best = max(best, max(ffn_extra, attention_extra) - freed)
            freed += kept[i]
    return max(best, 0.0)


_FFN_ROLES = ("mlp", "router", "experts", "moe_act", "shared_experts")


def _ffn_part(roles: dict[str, float]) -> float:
    """Saved bytes of a layer's feed-forward half (its norm and dropout mask included)."""
    return (
        sum(roles.get(r, 0.0) for r in _FFN_ROLES)
        + (roles.get("layernorm", 0.0) + roles.get("residual", 0.0)) / 2
    )


# Which roles a selective unit's recompute brings back, per sub-block of the layer.
_ATTENTION_UNITS = {
    "core_attn": ("core_attn",),
    "mla_up_proj": ("mla_up_proj", "core_attn"),
    "layernorm": ("qkv",),
}
_FFN_UNITS = {
    # a fused norm inside the mlp checkpoint comes back with it (TE spec)
    "mlp": ("mlp", "layernorm"),
    "moe": ("mlp", "router", "experts", "moe_act", "shared_experts"),
    "moe_act": ("moe_act", "experts"),
    "shared_experts": ("shared_experts",),
    "layernorm": ("mlp", "router"),
}


def _remat(roles: dict, plain: dict, rc: RecomputeConfig, units: dict) -> float:
    """Bytes the recomputed units of a sub-block bring back while its backward runs (they are
    all alive together: a refilled norm output is still needed after the checkpointed unit)."""
    if rc.recompute_granularity != "selective":
        return 0.0
    affected = {role for unit in rc.modules if unit in units for role in units[unit]}
    return sum(plain.get(r, 0.0) - roles.get(r, 0.0) for r in affected)


def _workspace(m: ModelConfig, x: _Shape, moe_layer: bool) -> tuple[float, float]:
    """Gradient workspace of a layer's attention and feed-forward backward: the gradient in
    and out of the layer plus the largest moment inside (an activation gradient next to a
    weight gradient, or two [b, a, s, s] gradients)."""
    B, t = x.B, x.t
    grads_in_out = 2 * B * x.sbh / x.sp
    a = m.num_attention_heads / t
    if m.attention_backend == "unfused":
        attention = B * x.b * a * x.s * x.s_kv + 2 * B * x.tokens * a * m.head_dim
    else:
        attention = 3 * B * x.tokens * a * m.head_dim
    width = 2 if m.swiglu else 1
    if moe_layer:  # the activation's input gradient for every pick, and the token rows'
        picks = x.tokens / x.sp * m.moe_router_topk
        ffn = B * picks * m.moe_ffn_size * width + B * x.tokens / x.sp * x.h
    else:
        f = m.ffn_size / t
        ffn = B * x.tokens * f * width + B * x.h * f * width
    return grads_in_out + attention, grads_in_out + ffn
