"""One step-time model for every memory lever the planner weighs (`plan --levers`).

A step of one pipeline stage's rank is its compute plus what a lever adds that compute does not
hide. Every term, with its source or marked as an assumption:

* **Compute**: the stage's executed FLOPs per micro-batch (`memory/flops.py`: `step_flops` +
  `recompute_flops`, `executed=True`: causal attention halved on flash/fused backends,
  recomputation included) split over the stage's tensor x context parallel ranks, at
  `tflops_per_gpu` executed TFLOP/s. DEFAULT_TFLOPS = 400 is an ASSUMPTION: about 40% of an
  H100 SXM's 989 dense BF16 TFLOP/s (NVIDIA H100 datasheet); Megatron-LM's README reports up
  to 47% MFU on H100 clusters. A measured step time calibrates it (`calibrate_tflops`). The
  efficiency is the same for every lever: a smaller micro-batch's or a wider TP's lower kernel
  efficiency and MoE token dispatch are NOT modelled (TP's collectives are: below).
  Expert loads are taken as balanced.
* **Pipeline bubble** (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", Sec. 2.2): 1F1B idles (pp - 1) micro-batch slots, the
  interleaved schedule (pp - 1) / vpp; with m micro-batches per step (global batch / (micro
  batch x data parallel)) the bubble fraction is (pp - 1) / (vpp x m). The slowest stage sets
  the pace (uneven stages): step = (m + (pp - 1) / vpp) x t_slowest, t the per-micro-batch
  time of a stage's rank. Point-to-point activation sends between stages: not modelled.
* **Context parallelism**: Megatron's CP (Transformer Engine's `AttnFuncWithCPAndKVP2P`) passes
  each rank's K and V block around a ring: cp - 1 sends per layer forward, each of
  b x (s/cp) x (K + V width per TP rank) elements; backward passes K, V and their gradients,
  twice the forward's bytes; a layer whose attention is recomputed runs the forward ring again.
  Each send overlaps the attention of the block in hand, so per layer only
  max(0, transfer - attention compute) is exposed (forward and backward apart). Bandwidth
  `cp_link_gbps`, default 450 GB/s per direction: NVLink 4 on H100 SXM (900 GB/s bidirectional,
  NVIDIA H100 datasheet), while the TP x CP ranks fit one node (8 GPUs, the NVLink domain of a
  DGX / HGX H100); a larger group's ring crosses nodes at `internode_gbps`, default 50 GB/s per
  direction: one 400 Gb/s NDR InfiniBand adapter per GPU (ConnectX-7, the DGX H100's layout),
  an ASSUMPTION for the ring's slowest hop.
* **Tensor parallelism**: each layer's TP collectives move (tp-1)/tp x b x s/cp x h
  activation bytes per collective and rank (an all-gather or reduce-scatter with sequence
  parallelism, twice that per all-reduce without: the same bytes), 2 per layer for attention
  and 2 for a dense MLP (an MoE layer's experts at expert-TP 1 have none: their token
  dispatch is not modelled) in forward, as many in backward, and again for what recompute
  re-runs (a whole layer under full recompute, the MLP's under selective mlp / moe), over
  NVLink inside a node (`cp_link_gbps`) or the network beyond it. Megatron overlaps them only
  with `tp_comm_overlap` (Transformer Engine's userbuffers, off by default): without it they
  are taken as exposed, with it as hidden (`Hardware.tp_comm_overlap`), an ASSUMPTION either way.
* **Activation offloading**: the bytes a micro-batch sends to the host (the estimator's
  `offloaded_bytes` / micro-batches in flight) go device->host during forward and come back
  during backward, on a side stream: exposed = max(0, bytes / link - forward compute) +
  max(0, bytes / link - backward compute), i.e. the transfer is taken to overlap fully with
  the compute of its own pass (an optimistic ASSUMPTION). Links (per direction, theoretical):
  PCIe 5.0 x16 64 GB/s and PCIe 4.0 x16 32 GB/s (PCI-SIG: 32 / 16 GT/s x 16 lanes, 128b/130b),
  NVLink-C2C 450 GB/s on GH200 (NVIDIA GH200 datasheet: 900 GB/s bidirectional).
* **FSDP / ZeRO-3**: in every micro-batch (torchtitan and DeepSpeed do not skip the gradient
  sync while accumulating) the stage's parameters are all-gathered in the compute dtype for
  forward and again for backward, and the gradients reduce-scattered (fp32 under FSDP2:
  torchtitan's mixed_precision_reduce), (n - 1) / n of each over the n data x context
  parallel ranks that shard them, over NVLink while TP x n fits a node, else the network.
  Prefetching overlaps them with compute: exposed = max(0, transfer - compute) per
  micro-batch, an optimistic ASSUMPTION. Under pipeline parallelism FSDP2 (torch's pipelining
  stage) gathers once a step and syncs the gradients in the last micro-batch: left out, as
  the data-parallel all-reduce is.
* **Expert parallelism**: each MoE layer's token dispatch and combine are all-to-alls of the
  rank's routed token copies (b x s/cp (/tp with SP) x top-k x hidden), (ep - 1) / ep of them
  leaving the rank: two in forward, two in backward, two more where recompute re-runs the
  layer, over NVLink while expert-TP x EP fits a node (Megatron-Core's expert rank grid has
  no CP: parallel_state.py's expert_decoder_rank_generator), else the network. Taken as
  exposed (the defaults: Megatron's overlap_moe_expert_parallel_comm off, torchtitan none), an
  ASSUMPTION; with overlap_moe_expert_parallel_comm on (the recipes of Megatron-Bridge's
  MoE models set it), as hidden behind the compute of the micro-batch it overlaps with:
  exposed = max(0, transfer - compute), as FSDP's. The allgather dispatcher is not timed.
* **Distributed optimizer**: it replaces the gradient all-reduce by a reduce-scatter plus a
  parameter all-gather, the same bytes on the wire (a ring all-reduce IS a reduce-scatter then
  an all-gather; Megatron-LM docs, distrib_optimizer.md), overlapped with backward/forward by
  --overlap-grad-reduce/--overlap-param-gather: it costs 0 s here. Data-parallel communication
  is left out of the model altogether (the same for every lever at a fixed world size).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from ..config import GPUS_PER_NODE, Config, ConfigError, full_recompute_chunks
from ..memory.flops import (
    FLASH_BACKWARD_FACTOR,
    layer_forward_flops,
    model_forward_flops,
    recompute_flops,
    skips_masked_half,
    step_flops,
)
from ..memory.layout import pipeline_layout
from ..memory.model_states import rank_parameters, sharding_mode

GB = 1e9  # link bandwidths are decimal GB/s, as vendors quote them
DEFAULT_TFLOPS = 400.0  # ASSUMPTION: ~40% of H100 SXM's 989 dense BF16 TFLOP/s
DEFAULT_CP_LINK_GBPS = 450.0  # NVLink 4 on H100 SXM, per direction (NVIDIA H100 datasheet)
DEFAULT_INTERNODE_GBPS = 50.0  # 400 Gb/s NDR InfiniBand per GPU (ConnectX-7), per direction
# Host links, GB/s per direction (theoretical).
HOST_LINKS = {
    "pcie5": (
        64.0,
        "PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b, ~63 GB/s per direction (PCI-SIG)",
    ),
    "pcie4": (32.0, "PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b, ~31.5 GB/s per direction"),
    "pcie3": (16.0, "PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b, ~15.8 GB/s per direction"),
    "nvlink-c2c": (450.0, "NVLink-C2C on GH200: 900 GB/s bidirectional (NVIDIA GH200 datasheet)"),
}
DEFAULT_HOST_LINK = "pcie5"


def host_link_gbps(text: str) -> float:
    """A host link by name (pcie5, pcie4, pcie3, nvlink-c2c) or as GB/s per direction ("128")."""
    name = text.strip().lower()
    if name in HOST_LINKS:
        return HOST_LINKS[name][0]
    try:
        value = float(name.removesuffix("gbps").removesuffix("gb/s"))
    except ValueError:
        raise ConfigError(
            f"--host-link must be one of {', '.join(HOST_LINKS)} or GB/s, got {text!r}"
        ) from None
    if value <= 0:
        raise ConfigError(f"--host-link must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class Hardware:
    tflops_per_gpu: float = DEFAULT_TFLOPS  # executed TFLOP/s each GPU sustains
    host_link_gbps: float = HOST_LINKS[DEFAULT_HOST_LINK][0]
    cp_link_gbps: float = DEFAULT_CP_LINK_GBPS
    internode_gbps: float = DEFAULT_INTERNODE_GBPS
    tp_comm_overlap: bool = False  # Megatron's default: TP collectives exposed

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def hardware_for(
    gpu: str | None,
    tflops: float | None = None,
    host_link: str | None = None,
    cp_link_gbps: float | None = None,
    tp_comm_overlap: bool = False,
) -> Hardware:
    """The step-time model's hardware for a GPU named in gpus.py (None: the defaults): the
    default rate's share of an H100's peak (40%) on that GPU, its host link and NVLink; what is
    given explicitly wins."""
    from ..gpus import GPUS

    named = GPUS.get(gpu or "")
    if tflops is None and named is not None:
        tflops = DEFAULT_TFLOPS * named.dense_bf16_tflops / GPUS["h100-80gb"].dense_bf16_tflops
    return Hardware(
        tflops or DEFAULT_TFLOPS,
        host_link_gbps(host_link or (named.host_link if named else DEFAULT_HOST_LINK)),
        cp_link_gbps or (named.nvlink_gbps if named else DEFAULT_CP_LINK_GBPS),
        tp_comm_overlap=tp_comm_overlap,
    )


def bubble_fraction(pp: int, vpp: int, micro_batches: int) -> float:
    """Idle time of the pipeline over its busy time: (pp - 1) / (vpp x m) (Narayanan et al.
    2021, Sec. 2.2.1-2.2.2)."""
    return (pp - 1) / (max(vpp, 1) * micro_batches)


def micro_batches_per_step(config: Config, global_batch_size: int) -> int:
    """m = global batch / (micro batch x data parallel); Megatron requires it to divide."""
    per = config.model.micro_batch_size * config.parallel.data_parallel_size
    if global_batch_size % per:
        raise ConfigError(
            f"global batch {global_batch_size} is not divisible by micro batch "
            f"{config.model.micro_batch_size} x data parallel {config.parallel.data_parallel_size}"
        )
    return global_batch_size // per


def cp_exchange_bytes(config: Config, dtype_bytes: int | None = None) -> int:
    """Bytes one rank sends around the context-parallel ring for ONE layer's forward, one
    micro-batch: (cp - 1) x b x (s / cp) x (K + V width on this TP rank) x dtype. Backward
    sends twice this (K, V and their gradients); 0 without CP. dtype: the training dtype's."""
    m, p = config.model, config.parallel
    if dtype_bytes is None:
        dtype_bytes = 2 if (m.bf16 or m.fp16) else 4
    cp, tp = p.context_parallel_size, p.tensor_model_parallel_size
    if cp == 1:
        return 0
    if m.multi_latent_attention:  # K and V per head after the up projection
        width = m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)
        width //= tp
    else:
        width = 2 * max(m.kv_groups // tp, 1) * m.head_dim  # GQA groups are replicated if < tp
    return (cp - 1) * m.micro_batch_size * (m.seq_length // cp) * width * dtype_bytes


def offload_exposed_seconds(
    bytes_per_micro_batch: float, link_gbps: float, forward_s: float, backward_s: float
) -> tuple[float, float]:
    """(transfer seconds one way, exposed seconds per micro-batch): device->host during the
    forward, host->device during the backward, each hidden up to its pass's compute."""
    one_way = bytes_per_micro_batch / (link_gbps * GB)
    return one_way, max(0.0, one_way - forward_s) + max(0.0, one_way - backward_s)


def _attention_recomputed_layers(config: Config, stage: int) -> int:
    """Layers of `stage` whose forward attention (and its CP ring) runs again in backward."""
    rc = config.recompute
    chunks = pipeline_layout(config.model, config.parallel)[stage]
    if rc.selects("core_attn"):
        return sum(map(len, chunks))
    if rc.recompute_granularity == "full":
        return sum(
            end - start
            for chunk in chunks
            for start, end, ck in full_recompute_chunks(rc, len(chunk))
            if ck
        )
    return 0


@dataclass
class StageTime:
    stage: int
    compute_s: float  # per micro-batch, this stage's rank
    cp_exposed_s: float
    cp_transfer_s: float
    offload_exposed_s: float
    offload_transfer_s: float  # one way
    tp_exposed_s: float = 0.0
    fsdp_exposed_s: float = 0.0
    fsdp_transfer_s: float = 0.0
    ep_exposed_s: float = 0.0

    @property
    def seconds(self) -> float:
        return (
            self.compute_s
            + self.cp_exposed_s
            + self.offload_exposed_s
            + self.tp_exposed_s
            + self.fsdp_exposed_s
            + self.ep_exposed_s
        )


@dataclass
class StepTime:
    seconds: float
    micro_batches: int
    bubble_fraction: float
    compute_s: float  # m x the slowest stage's compute
    bubble_s: float
    cp_exposed_s: float  # m x the slowest stage's
    offload_exposed_s: float
    slowest_stage: int
    stages: list[StageTime]
    tp_exposed_s: float = 0.0  # m x the slowest stage's
    fsdp_exposed_s: float = 0.0  # m x the slowest stage's
    ep_exposed_s: float = 0.0  # m x the slowest stage's

    def to_json(self) -> dict:
        return {
            "seconds": self.seconds,
            "micro_batches": self.micro_batches,
            "bubble_fraction": self.bubble_fraction,
            "compute_seconds": self.compute_s,
            "bubble_seconds": self.bubble_s,
            "cp_exposed_seconds": self.cp_exposed_s,
            "offload_exposed_seconds": self.offload_exposed_s,
            "tp_exposed_seconds": self.tp_exposed_s,
            "fsdp_exposed_seconds": self.fsdp_exposed_s,
            "ep_exposed_seconds": self.ep_exposed_s,
            "slowest_stage": self.slowest_stage,
        }


def stage_time(config: Config, stage: int, hw: Hardware, offloaded_bytes: float = 0.0) -> StageTime:
    """Per-micro-batch time of one rank of `stage` (`offloaded_bytes`: what one micro-batch
    sends to the host on this stage)."""
    m, p = config.model, config.parallel
    ranks = p.tensor_model_parallel_size * p.context_parallel_size
    rate = hw.tflops_per_gpu * 1e12
    flops = step_flops(config, stage, executed=True) + recompute_flops(config, stage, executed=True)
    compute = flops / ranks / rate
    forward = model_forward_flops(config, stage, executed=True) / ranks / rate
    backward = compute - forward
    cp_exposed = cp_transfer = 0.0
    fwd_bytes = cp_exchange_bytes(config)
    if fwd_bytes:
        layers = sum(map(len, pipeline_layout(m, p)[stage]))
        again = _attention_recomputed_layers(config, stage)
        attn = layer_forward_flops(m, moe_layer=False, executed=True)["core_attn"] / ranks / rate
        # the ring's slowest hop: NVLink inside a node, the network once TP x CP spans nodes
        link = _link_gbps(config, hw, ranks)
        t_fwd = fwd_bytes / (link * GB)
        t_bwd = 2 * t_fwd
        attn_bwd = attn * (FLASH_BACKWARD_FACTOR if skips_masked_half(m) else 2.0)
        cp_transfer = (layers + again) * t_fwd + layers * t_bwd
        cp_exposed = (layers + again) * max(0.0, t_fwd - attn) + layers * max(0.0, t_bwd - attn_bwd)
    tp_exposed = 0.0 if hw.tp_comm_overlap else tp_transfer_seconds(config, stage, hw)
    off_transfer, off_exposed = (0.0, 0.0)
    if offloaded_bytes:
        off_transfer, off_exposed = offload_exposed_seconds(
            offloaded_bytes, hw.host_link_gbps, forward, backward
        )
    fsdp = fsdp_transfer_seconds(config, stage, hw)
    ep = ep_transfer_seconds(config, stage, hw)
    if config.model.overlap_moe_expert_parallel_comm:  # hidden behind the other batch's compute
        ep = max(0.0, ep - compute)
    return StageTime(
        stage,
        compute,
        cp_exposed,
        cp_transfer,
        off_exposed,
        off_transfer,
        tp_exposed,
        max(0.0, fsdp - compute),
        fsdp,
        ep,
    )


def node_gpus(config: Config) -> int:
    """The GPUs of a node: the inputs' (cluster.gpus_per_node, --nproc_per_node), else a DGX's."""
    return config.parallel.gpus_per_node or GPUS_PER_NODE


def _link_gbps(config: Config, hw: Hardware, group: int) -> float:
    """A collective's bandwidth: NVLink while its group of ranks fits one node, else the
    network's (the slowest hop)."""
    if group <= node_gpus(config):
        return hw.cp_link_gbps
    return min(hw.cp_link_gbps, hw.internode_gbps)


def _stage_layers(config: Config, stage: int) -> Iterator[tuple[int, bool]]:
    """(layer, whether full recompute re-runs it) for every layer of `stage`, chunk by chunk
    (recompute_method / recompute_num_layers apply per virtual-pipeline chunk)."""
    rc = config.recompute
    for chunk in pipeline_layout(config.model, config.parallel)[stage]:
        full = {
            index
            for start, end, ck in full_recompute_chunks(rc, len(chunk))
            if ck and rc.recompute_granularity == "full"
            for index in range(start, end)
        }
        for index, layer in enumerate(chunk):
            yield layer, index in full


def ep_transfer_seconds(config: Config, stage: int, hw: Hardware) -> float:
    """One micro-batch's expert-parallel all-to-alls on a rank of `stage` (module docstring):
    per MoE layer a dispatch and a combine in forward, as many in backward, and again where
    recompute re-runs the layer; each moves the rank's routed token copies (tokens x top-k x
    hidden), (ep - 1) / ep of them to other ranks. 0 without EP or for the allgather
    dispatcher (not timed)."""
    m, p = config.model, config.parallel
    ep = p.expert_model_parallel_size
    if ep == 1 or not m.num_moe_experts or m.moe_token_dispatcher_type == "allgather":
        return 0.0
    width = 2 if (m.bf16 or m.fp16) else 4
    tokens = m.micro_batch_size * m.seq_length / p.context_parallel_size
    if p.sequence_parallel:
        tokens /= p.tensor_model_parallel_size
    per = tokens * m.moe_router_topk * m.hidden_size * width * (ep - 1) / ep
    # Megatron-Core builds the expert groups on their own rank grid (parallel_state.py:
    # expert_decoder_rank_generator, tp = expert TP, cp = 1): an EP group spans expert-TP x EP
    # consecutive ranks, whatever the attention layers' TP x CP
    link = _link_gbps(config, hw, p.etp * ep)
    again = config.recompute.selects("moe")
    units = sum(
        4 + (2 if full or again else 0)
        for layer, full in _stage_layers(config, stage)
        if m.is_moe_layer(layer)
    )
    return units * per / (link * GB)


def fsdp_transfer_seconds(config: Config, stage: int, hw: Hardware) -> float:
    """One micro-batch's FSDP / ZeRO-3 collectives on a rank of `stage` (module docstring):
    the stage's parameters all-gathered in the compute dtype for forward and again for
    backward, and their gradients reduce-scattered (fp32 under FSDP2, torchtitan's
    mixed_precision_reduce; else as grad_reduce_in_fp32 says), (n - 1) / n of each over the
    n ranks that shard them; in every micro-batch, as torchtitan and DeepSpeed do not skip
    the gradient sync during accumulation."""
    m, p = config.model, config.parallel
    mode = sharding_mode(config)
    n = p.data_parallel_size * p.context_parallel_size
    if mode == "megatron" or p.zero_stage < 3 or n == 1:
        return 0.0
    if mode == "fsdp2" and p.pipeline_model_parallel_size > 1:
        # torch's pipelining stage gathers once and syncs gradients in the last micro-batch
        # only (no reshard after forward): once a step, like DDP's all-reduce, left out
        return 0.0
    half = m.bf16 or m.fp16
    gather_b = 2 if half else 4
    reduce_b = 4 if mode == "fsdp2" or p.grad_reduce_in_fp32 or not half else 2
    if p.frozen_base:
        reduce_b = 0  # no gradients of the frozen weights
    params = rank_parameters(config, stage)
    edp = max(p.tensor_model_parallel_size * n // (p.etp * p.expert_model_parallel_size), 1)
    moved = (2 * gather_b + reduce_b) * (
        params["dense"] * (n - 1) / n + params["expert"] * (edp - 1) / edp
    )
    link = _link_gbps(config, hw, p.tensor_model_parallel_size * n)
    return moved / (link * GB)


def tp_transfer_seconds(config: Config, stage: int, hw: Hardware) -> float:
    """One micro-batch's TP collectives on a rank of `stage` (module docstring)."""
    m, p = config.model, config.parallel
    t = p.tensor_model_parallel_size
    if t == 1:
        return 0.0
    rc = config.recompute
    width = 2 if (m.bf16 or m.fp16) else 4
    per = (t - 1) / t * m.micro_batch_size * m.seq_length / p.context_parallel_size
    per *= m.hidden_size * width
    link = _link_gbps(config, hw, t)
    units = 0
    for layer, full in _stage_layers(config, stage):
        mlp = 2 if not m.is_moe_layer(layer) or p.etp > 1 else 0
        units += 2 * (2 + mlp)  # forward and backward
        if full:
            units += 2 + mlp
        elif rc.selects("mlp") or rc.selects("moe"):
            units += mlp
    return units * per / (link * GB)


def step_time(
    config: Config,
    micro_batches: int,
    hw: Hardware,
    offloaded_bytes: list[float] | None = None,
) -> StepTime:
    """The step: (m + (pp - 1) / vpp) x the slowest stage's per-micro-batch time.
    `offloaded_bytes`: per stage, what one micro-batch sends to the host."""
    p = config.parallel
    pp, vpp = p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size or 1
    off = offloaded_bytes or [0.0] * pp
    stages = [stage_time(config, s, hw, off[s]) for s in range(pp)]
    slow = max(stages, key=lambda t: t.seconds)
    bubble = bubble_fraction(pp, vpp, micro_batches)
    busy = micro_batches * slow.seconds
    return StepTime(
        seconds=busy * (1 + bubble),
        micro_batches=micro_batches,
        bubble_fraction=bubble,
        compute_s=micro_batches * slow.compute_s,
        bubble_s=busy * bubble,
        cp_exposed_s=micro_batches * slow.cp_exposed_s,
        offload_exposed_s=micro_batches * slow.offload_exposed_s,
        slowest_stage=slow.stage,
        stages=stages,
        tp_exposed_s=micro_batches * slow.tp_exposed_s,
        fsdp_exposed_s=micro_batches * slow.fsdp_exposed_s,
        ep_exposed_s=micro_batches * slow.ep_exposed_s,
    )


def calibrate_tflops(
    config: Config,
    micro_batches: int,
    hw: Hardware,
    measured_seconds: float,
    offloaded_bytes: list[float] | None = None,
) -> float:
    """The executed TFLOP/s per GPU at which the model's step time of `config` equals the
    measured one (bisection: the predicted step never grows with the rate, since exposed
    transfer = transfer - compute shrinks slower than compute). Raises ConfigError when the
    measurement is below what the transfers alone take."""
    if measured_seconds <= 0:
        raise ConfigError(f"--measured-step-seconds must be positive, got {measured_seconds:g}")

    def at(tflops: float) -> float:
        h = dataclasses.replace(hw, tflops_per_gpu=tflops)
        return step_time(config, micro_batches, h, offloaded_bytes).seconds

    lo, hi = 1e-6, 1e9
    if at(hi) > measured_seconds:
        raise ConfigError(
            f"a measured step of {measured_seconds:g} s is faster than the model's transfers "
            "alone on this config: check the config the step was measured on"
        )
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        if at(mid) > measured_seconds:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return (lo * hi) ** 0.5
