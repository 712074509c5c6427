"""The rule catalog: each rule has a stable id, its documentation, and a check.

A check looks at the `Context` (evidence plus what the kit derived from it) and returns a
`Match` - how sure it is and two or three sentences citing the input's numbers - or None.
`recompute-kit rules` prints the catalog; its Markdown is the skill's troubleshooting table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import format_spec, parse_spec
from .engine import Context, Finding

GIB = 2**30
CATEGORIES = (
    "fragmentation",
    "other_processes",
    "non_pytorch_memory",
    "allocation_exceeds_device",
    "genuine_pressure",
    "activation_memory",
    "model_state_memory",
    "logits_memory",
    "recompute_no_effect",
    "recompute_overhead",
    "invalid_config",
    "checkpoint_api_misuse",
    "nondeterministic_recompute",
    "framework_bug",
    "informational",
)
EXPANDABLE = {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}


@dataclass(frozen=True)
class Match:
    confidence: float
    evidence: str
    config_patch: dict[str, Any] | None = None  # replaces the rule's default patch
    fix: str | None = None  # replaces the rule's default fix text


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    category: str
    symptom: str
    cause: str
    confirm: str
    fix: str
    check: Callable[[Context], Match | None]
    config_patch: dict[str, Any] = field(default_factory=dict)
    references: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()  # generic rules this one makes redundant when both fire

    def finding(self, match: Match) -> Finding:
        return Finding(
            rule=self.id,
            category=self.category,
            title=self.title,
            symptom=self.symptom,
            cause=self.cause,
            confirm=self.confirm,
            fix=match.fix or self.fix,
            config_patch=match.config_patch
            if match.config_patch is not None
            else self.config_patch,
            confidence=round(match.confidence, 2),
            references=list(self.references),
            evidence=match.evidence,
        )

    def doc(self) -> dict[str, Any]:
        return {
            "rule": self.id,
            "title": self.title,
            "category": self.category,
            "symptom": self.symptom,
            "cause": self.cause,
            "confirm": self.confirm,
            "fix": self.fix,
            "config_patch": self.config_patch,
            "references": list(self.references),
        }


RULES: list[Rule] = []


def rule(
    id: str,
    title: str,
    category: str,
    *,
    symptom: str,
    cause: str,
    confirm: str,
    fix: str,
    patch: dict | None = None,
    refs: tuple[str, ...] = (),
    supersedes: tuple[str, ...] = (),
):
    """Register a check function as a rule."""
    assert category in CATEGORIES, category

    def register(check: Callable[[Context], Match | None]):
        RULES.append(
            Rule(
                id,
                title,
                category,
                symptom,
                cause,
                confirm,
                fix,
                check,
                patch or {},
                refs,
                supersedes,
            )
        )
        return check

    return register


def gib(n: float | None) -> str:
    """A size as PyTorch's OOM message prints it: GiB from 1 GiB up, MiB below (so that a
    138.00 MiB request reads as in the message, not as 0.13 GiB)."""
    if n is None:
        return "?"
    if abs(n) < GIB:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / GIB:.2f} GiB"


def on_message(*fragments: str, confidence: float = 0.95):
    """A check that fires when any error or warning contains one of the fragments."""

    def check(ctx: Context) -> Match | None:
        for e in ctx.evidence.errors:
            text = " ".join(f"{e.type}: {e.message}".split())  # hard wraps are spaces
            if any(f in text for f in fragments):
                quoted = text if len(text) < 220 else text[:217] + "..."
                return Match(confidence, f'The log says: "{quoted}"')
        return None

    return check


# --------------------------------------------------------------------------------------------
# Reading the OOM message
# --------------------------------------------------------------------------------------------

PT_MEMORY = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"


def _reserved_unallocated(oom) -> int | None:
    """Reserved-but-unallocated bytes; PyTorch <= 2.0 printed other fields: '(... C cached)'
    is that amount itself, '(... A already allocated; ... R reserved in total by PyTorch)'
    gives it as R - A."""
    if oom.reserved_unallocated_bytes is not None:
        return oom.reserved_unallocated_bytes
    if oom.reserved_bytes is None:
        return None
    if oom.generation == "gen1_cached":
        return oom.reserved_bytes
    if oom.allocated_bytes is not None and oom.reserved_bytes >= oom.allocated_bytes:
        return oom.reserved_bytes - oom.allocated_bytes
    return None


@rule(
    "RK001",
    "Fragmentation: memory is reserved but unallocated",
    "fragmentation",
    symptom="CUDA OOM where 'reserved by PyTorch but unallocated' is comparable to or larger "
    "than the failed allocation",
    cause="The caching allocator's segments are split into blocks too small for the request; "
    "the memory is free inside PyTorch but not in one piece",
    confirm="In the OOM message compare 'reserved but unallocated' (before PyTorch 2.1: "
    "'reserved in total' minus 'already allocated', or 'cached') with 'Tried to allocate'; "
    "torch.cuda.memory_stats()['inactive_split_bytes.all.current'] is large",
    fix="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of "
    "splitting); recompute settings are not the problem",
    patch=EXPANDABLE,
    refs=(PT_MEMORY, "NVIDIA-NeMo/Megatron-Bridge PR #3880"),
)
def _fragmentation(ctx: Context) -> Match | None:
    oom = ctx.oom
    slack = _reserved_unallocated(oom) if oom else None
    if not oom or not slack or not oom.requested_bytes:
        return None
    req = oom.requested_bytes
    total = oom.total_bytes or 0
    if slack < req and slack < 0.05 * total:
        return None
    # PYTORCH_CUDA_ALLOC_CONF, or its newer name PYTORCH_ALLOC_CONF (2.9+), or ROCm's
    if any(
        "expandable_segments:True" in value
        for key, value in ctx.evidence.env.items()
        if key.endswith("ALLOC_CONF")
    ):
        return None
    # The allocator's hint is printed on every OOM; it matters when the slack is a real share
    # of the GPU, not just larger than one small request.
    confidence = 0.9 if slack >= max(req, 0.05 * total) else 0.45
    return Match(
        confidence,
        f"{gib(slack)} is reserved by PyTorch but unallocated, against a "
        f"failed request of {gib(req)}: enough free memory exists, but in "
        "pieces.",
    )


@rule(
    "RK002",
    "Other processes hold GPU memory",
    "other_processes",
    symptom="CUDA OOM listing 'Process <pid> has X memory in use' for other processes",
    cause="Another process (a second job, a stale worker, a notebook kernel) shares the GPU",
    confirm="nvidia-smi --query-compute-apps=pid,used_memory --format=csv on the node (in a "
    "container the message lists this process itself as 'Process <pid>' too, without an "
    "'Including non-PyTorch memory, this process has' line)",
    fix="Stop the other process or give this job its own GPU (CUDA_VISIBLE_DEVICES)",
    refs=("https://github.com/pytorch/pytorch/pull/99699",),
)
def _other_processes(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.other_processes_bytes or not oom.total_bytes:
        return None
    others, total = oom.other_processes_bytes, oom.total_bytes
    pytorch = (oom.allocated_bytes or 0) + (oom.reserved_unallocated_bytes or 0)
    if oom.process_bytes is None:
        # NVML listed the GPU's processes but none as "this process": our own PID did not
        # match (a container's PID namespace), so this process is one of the "Process <pid>"
        # entries. Only what exceeds PyTorch's own memory can belong to other processes (an
        # upper bound: it still includes this process's CUDA context and workspaces).
        others = others - pytorch
        share = others / total
        if others < max(2 * GIB, 0.1 * total):
            return None
        return Match(
            min(0.95, 0.5 + share),
            f"Processes other than this one hold up to {gib(others)} ({share:.0%}) of the "
            f"{gib(total)} GPU: {gib(oom.other_processes_bytes)} listed, of which this "
            f"process's own PyTorch memory ({gib(pytorch)}) is a part.",
        )
    share = others / total
    if share < 0.02:
        return None
    return Match(
        min(0.95, 0.5 + share),
        f"Other processes hold {gib(others)} ({share:.0%}) of the {gib(total)} GPU.",
    )


@rule(
    "RK003",
    "Memory used outside PyTorch's allocator",
    "non_pytorch_memory",
    symptom="The process uses much more than PyTorch reserved ('Including non-PyTorch "
    "memory, this process has X' well above allocated + reserved-unallocated)",
    cause="CUDA context, NCCL buffers, cuBLAS/cuDNN workspaces or another allocator "
    "(TransformerEngine userbuffers, a second framework) live outside PyTorch's pool",
    confirm="Compare the process total with torch.cuda.memory_reserved(); check "
    "NCCL_BUFFSIZE, TP communication overlap buffers and CUDA graphs",
    fix="Shrink communication buffers (NCCL_BUFFSIZE, tp_comm_overlap), or budget a few GiB "
    "per GPU for them; recompute cannot free this memory",
    refs=("https://github.com/pytorch/pytorch/issues/16417",),
)
def _non_pytorch(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or oom.process_bytes is None or oom.allocated_bytes is None:
        return None
    pytorch = oom.allocated_bytes + (oom.reserved_unallocated_bytes or 0)
    outside = oom.process_bytes - pytorch
    total = oom.total_bytes or oom.process_bytes
    if outside < max(2 * GIB, 0.1 * total):
        return None
    return Match(
        0.7,
        f"This process uses {gib(oom.process_bytes)} but PyTorch accounts for "
        f"{gib(pytorch)}: {gib(outside)} is outside its allocator.",
    )


@rule(
    "RK004",
    "A single allocation larger than the GPU",
    "allocation_exceeds_device",
    symptom="'Tried to allocate' is larger than the GPU's total or its usable memory",
    cause="One tensor is too big - typically logits [seq x batch x vocab] in fp32, an "
    "unfused attention score matrix [b, a, s, s], or a mistaken shape",
    confirm="Compute the tensor's size from the shapes; recompute-kit estimate --json shows "
    "the logits and core attention terms",
    fix="Shrink that tensor: fused/vocab-parallel cross-entropy, flash attention, a smaller "
    "micro-batch or sequence, more tensor/context parallelism",
    refs=("https://github.com/pytorch/pytorch/issues/16417",),
    supersedes=("RK005",),
)
def _too_big(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.requested_bytes:
        return None
    if not oom.total_bytes:  # no capacity in the message: only an absurd request is clear
        if oom.requested_bytes >= 256 * GIB:
            return Match(
                0.8,
                f"One allocation of {gib(oom.requested_bytes)} was requested; no "
                "GPU has that much memory.",
            )
        return None
    if oom.requested_bytes < 0.5 * oom.total_bytes:
        return None
    return Match(
        0.9,
        f"One allocation of {gib(oom.requested_bytes)} was requested on a "
        f"{gib(oom.total_bytes)} GPU.",
    )


@rule(
    "RK005",
    "PyTorch-allocated memory fills the GPU",
    "genuine_pressure",
    symptom="CUDA OOM with 'allocated by PyTorch' close to the total capacity",
    cause="Tensors in use fill the GPU: activations, weights, gradients or optimizer states. "
    "Which of them needs the model shape and parallel config",
    confirm="Pass the config to recompute-kit doctor --config, or run recompute-kit estimate "
    "to split the peak into activations and model states",
    fix="Reduce the dominant term: more recompute if activations dominate, distributed "
    "optimizer / more parallelism if model states do",
)
def _pressure(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.allocated_bytes or not oom.total_bytes:
        return None
    share = oom.allocated_bytes / oom.total_bytes
    if share < 0.8:
        return None
    return Match(
        0.5,
        f"PyTorch had {gib(oom.allocated_bytes)} allocated of "
        f"{gib(oom.total_bytes)} ({share:.0%}) when the OOM hit.",
    )


@rule(
    "RK006",
    "A per-process memory cap is set",
    "informational",
    symptom="The OOM message includes 'X allowed;'",
    cause="torch.cuda.set_per_process_memory_fraction limits this process below the GPU size",
    confirm="Search the code/launcher for set_per_process_memory_fraction",
    fix="Raise or remove the fraction if the cap is not intended",
)
def _allowed(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.allowed_bytes:
        return None
    return Match(
        0.6, f"The process may use only {gib(oom.allowed_bytes)} of {gib(oom.total_bytes)}."
    )


@rule(
    "RK007",
    "CUDA graphs' private pools hold memory",
    "genuine_pressure",
    symptom="The OOM message reports memory 'allocated in private pools (e.g., CUDA Graphs)'",
    cause="Captured CUDA graphs keep their own memory pools alive between steps",
    confirm="Compare the private-pool size with the failed request; disable graphs to test",
    fix="Narrow cuda_graph_scope, or turn CUDA graphs off while searching for a recompute setting",
    patch={"cuda_graph_impl": "none"},
)
def _private_pools(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.private_pool_bytes or oom.private_pool_bytes < GIB:
        return None
    return Match(0.6, f"{gib(oom.private_pool_bytes)} sit in private pools (CUDA graphs).")


# --------------------------------------------------------------------------------------------
# With a model shape: which memory dominates, and the next recompute step
# --------------------------------------------------------------------------------------------


def next_step(ctx: Context) -> tuple[str, str]:
    """The next recompute setting by architecture: (spec, why)."""
    # With flash/fused attention core_attn holds nothing worth recomputing: drop it.
    mods = set(ctx.modules) - ({"core_attn"} if ctx.flash else set())
    gran = ctx.granularity
    if gran == "full":
        n = ctx.cfg.get("recompute_num_layers") or 1
        if ctx.cfg.get("recompute_method") == "block":
            return f"full:block:{n + 1}", "full recompute with one more block layer per stage"
        return "full:uniform:1", "full recompute of every layer on its own (the most saving)"
    if not ctx.flash and "core_attn" not in mods:
        return _spec(mods | {"core_attn"}), (
            "the unfused attention keeps [b, a, s, s] scores; core_attn removes them cheaply"
        )
    if ctx.is_mla and "mla_up_proj" not in mods:
        return _spec(mods | {"mla_up_proj"}), "MLA's expanded Q/K/V are its largest tensors"
    if ctx.is_moe and ctx.cfg.get("moe_grouped_gemm") and "moe_act" not in mods:
        return _spec(mods | {"moe_act", "layernorm"}), (
            "the expert activations (top-k copies of every token) are cheap to recompute"
        )
    if ctx.is_moe and "moe" not in mods:
        return _spec(mods | {"moe"}), "recomputing the whole MoE layer frees dispatch and experts"
    if not ctx.is_moe and "mlp" not in mods:
        return _spec(
            mods | {"mlp"}
        ), "the dense FFN is the largest block left (costly: ~16% on 70B)"
    return "full:uniform:1", "selective recompute is exhausted; recompute whole layers"


def _spec(mods: set[str]) -> str:
    from ..config import RECOMPUTE_MODULES

    return format_spec(
        parse_spec("selective:" + ",".join(m for m in RECOMPUTE_MODULES if m in mods))
    )


def patch_for(spec: str) -> dict[str, Any]:
    rc = parse_spec(spec)
    return {
        "recompute_granularity": rc.recompute_granularity,
        "recompute_method": rc.recompute_method,
        "recompute_num_layers": rc.recompute_num_layers,
        "recompute_modules": rc.recompute_modules
        if rc.recompute_granularity == "selective"
        else None,
    }


def _candidate_spec(c) -> str:
    return c.estimate.recompute


@rule(
    "RK010",
    "Activations dominate: recompute more",
    "activation_memory",
    symptom="OOM in training; the estimate puts activations above weights + gradients + "
    "optimizer states on the failing rank",
    cause="The current recompute setting keeps too many activations for this sequence "
    "length, micro-batch and parallel layout",
    confirm="recompute-kit estimate --config CONFIG --recompute CURRENT NEXT shows the peak "
    "per setting; recompute-kit plan --gpu-memory-gb X ranks what fits",
    fix="Apply the next recompute step (config_patch); the planner's choice when the GPU "
    "size is known",
    refs=("arXiv:2205.05198",),
    supersedes=("RK005",),
)
def _activations(ctx: Context) -> Match | None:
    e = ctx.estimate
    if e is None or not (ctx.oom or ctx.says("out of memory")):
        return None
    state = e.weights_bytes + e.grads_bytes + e.optimizer_bytes
    if e.peak_activation_bytes < state:
        return None
    spec, why = next_step(ctx)
    if ctx.best is not None:
        spec, why = (
            _candidate_spec(ctx.best),
            (
                "the planner's cheapest setting that fits "
                f"({ctx.best.estimate.recompute_flops_fraction:.1%} extra FLOPs)"
            ),
        )
    current = format_spec(parse_spec_safe(ctx))
    return Match(
        0.85,
        f"Estimated per rank: activations peak at {gib(e.peak_activation_bytes)} vs "
        f"{gib(state)} of weights, gradients and optimizer states under '{current}'. Next: "
        f"'{spec}' - {why}.",
        config_patch=patch_for(spec),
    )


def parse_spec_safe(ctx: Context):
    from ..config import RecomputeConfig

    return ctx.config.recompute if ctx.config else RecomputeConfig()


@rule(
    "RK011",
    "Model states dominate: recompute cannot fix this",
    "model_state_memory",
    symptom="OOM; weights + gradients + optimizer states alone take most of the GPU",
    cause="Too few ranks share the parameters and optimizer states",
    confirm="recompute-kit estimate --config CONFIG shows weights_bytes, grads_bytes and "
    "optimizer_bytes per rank",
    fix="Use the distributed optimizer, more tensor/pipeline/expert parallelism, or FSDP; "
    "recompute only reduces activations",
    patch={"use_distributed_optimizer": True},
    supersedes=("RK005",),
)
def _model_states(ctx: Context) -> Match | None:
    e = ctx.estimate
    if e is None or not ctx.gpu_bytes:
        return None
    state = e.weights_bytes + e.grads_bytes + e.optimizer_bytes
    share = state / ctx.gpu_bytes
    if share < 0.6:
        return None
    # When the whole estimate fits, model states explain the memory but not the OOM.
    explains_oom = e.total_bytes > 0.95 * ctx.gpu_bytes
    return Match(
        (0.85 if explains_oom else 0.5) if ctx.oom else 0.45,
        f"Weights {gib(e.weights_bytes)}, gradients {gib(e.grads_bytes)} and optimizer "
        f"states {gib(e.optimizer_bytes)} already take {share:.0%} of the "
        f"{gib(ctx.gpu_bytes)} GPU.",
    )


@rule(
    "RK012",
    "The logits and loss need the memory",
    "logits_memory",
    symptom="OOM at the output layer or loss; a large vocabulary with a long sequence",
    cause="The fp32 log-softmax of [tokens x vocab] and its gradient are kept in full on the "
    "last pipeline stage; recompute of transformer layers does not touch them",
    confirm="4 x tokens x vocab / TP bytes (recompute-kit estimate shows it under the loss); "
    "the OOM's request often equals one such tensor",
    fix="Use a fused / vocab-parallel cross-entropy (TransformerEngine, "
    "cross_entropy_loss_fusion), a smaller micro-batch, or more tensor parallelism",
    patch={"cross_entropy_loss_fusion": True},
    refs=("NVIDIA-NeMo/Megatron-Bridge PR #5508",),
)
def _logits(ctx: Context) -> Match | None:
    cfg = ctx.config
    if cfg is None or not ctx.gpu_bytes:
        return None
    m, p = cfg.model, cfg.parallel
    tokens = m.seq_length * m.micro_batch_size // p.context_parallel_size
    logits = 4 * tokens * m.vocab_size / p.tensor_model_parallel_size
    oom = ctx.oom
    hit = (
        oom is not None
        and oom.requested_bytes
        and abs(oom.requested_bytes - logits) < 0.05 * logits
    )
    if not hit and 3 * logits < 0.15 * ctx.gpu_bytes:
        return None
    return Match(
        0.8 if hit else 0.55,
        f"The fp32 logits of {tokens} tokens x {m.vocab_size} vocabulary are "
        f"{gib(logits)} per rank; with their gradients about {gib(3 * logits)}.",
    )


@rule(
    "RK013",
    "Even full recompute does not fit",
    "model_state_memory",
    symptom="OOM persists with full recompute (uniform, 1 layer)",
    cause="Weights, gradients, optimizer states and one layer's activations exceed the GPU",
    confirm="recompute-kit plan --gpu-memory-gb X exits 1 and says by how much the smallest "
    "candidate misses",
    fix="Add parallelism (TP/PP/CP/EP), the distributed optimizer, or shorten the sequence",
    supersedes=("RK010", "RK005"),
)
def _nothing_fits(ctx: Context) -> Match | None:
    if not ctx.plan_error or not (ctx.oom or ctx.says("out of memory")):
        return None
    return Match(0.8, ctx.plan_error[0].upper() + ctx.plan_error[1:] + ".")


# --------------------------------------------------------------------------------------------
# Settings that do not do what they seem to
# --------------------------------------------------------------------------------------------


@rule(
    "RK020",
    "core_attn recompute with flash/fused attention buys little",
    "recompute_no_effect",
    symptom="selective core_attn (Megatron's default, --recompute-activations) barely "
    "changes peak memory",
    cause="Flash/fused attention never materialises the s x s scores the paper's saving "
    "comes from; it already recomputes them in its backward",
    confirm="recompute-kit estimate --attention sdpa --recompute none selective: the two "
    "peaks are within a few percent",
    fix="Recompute something that holds memory (mlp, moe_act, mla_up_proj, layernorm) or "
    "use full recompute",
    refs=(
        "https://github.com/NVIDIA/Megatron-LM/issues/1225",
        "https://github.com/NVIDIA/Megatron-LM/issues/464",
    ),
)
def _core_attn_flash(ctx: Context) -> Match | None:
    warned = ctx.says("you have no need to set 'core_attn' to recompute")
    if not (("core_attn" in ctx.modules and ctx.flash) or warned):
        return None
    if ctx.modules and set(ctx.modules) != {"core_attn"} and not warned:
        return None
    spec, why = next_step(ctx)
    return Match(
        0.7 if (ctx.oom or ctx.says("out of memory")) else 0.45,
        "core_attn is recomputed while attention is flash/fused"
        + (" (Megatron warned about it)" if warned else "")
        + f". Next: '{spec}' - {why}.",
        config_patch=patch_for(spec),
    )


@rule(
    "RK021",
    "'mlp' recompute does nothing on MoE layers",
    "recompute_no_effect",
    symptom="recompute_modules contains mlp on an MoE model; memory barely moves",
    cause="Megatron skips 'mlp' on MoE layers; 'moe', 'moe_act' and 'shared_experts' are "
    "the MoE units",
    confirm="recompute-kit verify --model tiny-moe --recompute selective:mlp notes the no-op",
    fix="Use moe_act (+layernorm), then moe",
    patch=patch_for("selective:layernorm,moe_act"),
)
def _mlp_on_moe(ctx: Context) -> Match | None:
    if not (ctx.is_moe and "mlp" in ctx.modules):
        return None
    freq = ctx.cfg.get("moe_layer_freq", 1)
    if isinstance(freq, list) and 0 in freq:
        return Match(
            0.5,
            "mlp is recomputed on a model whose MoE layers ignore it (it only "
            "acts on the dense layers).",
        )
    return Match(0.75, "mlp is in recompute_modules but every layer is MoE: Megatron skips it.")


@rule(
    "RK022",
    "layernorm recompute is too small to fix the OOM",
    "recompute_no_effect",
    symptom="Still OOM after adding layernorm to recompute_modules",
    cause="The norms' outputs are a few bytes per token of hidden size; the peak is elsewhere",
    confirm="Compare peak memory before/after (recompute-kit measure or the experiments "
    "table): the difference is small",
    fix="Add the module that holds the memory: mlp (dense), moe_act/moe (MoE), mla_up_proj "
    "(MLA), or full recompute",
    refs=("NVIDIA skill perf-activation-recompute",),
)
def _layernorm_small(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    with_ln = [
        r for r in rows if r.get("oom") and "layernorm" in (r.get("recompute_modules") or [])
    ]
    if with_ln:
        r = with_ln[0]
        spec, why = next_step(ctx)
        return Match(
            0.8,
            f"Experiment '{r.get('name')}' recomputes "
            f"{r.get('recompute_modules')} and still runs out of memory. "
            f"Next: '{spec}' - {why}.",
            config_patch=patch_for(spec),
        )
    if ctx.modules == ["layernorm"] and (ctx.oom or ctx.says("out of memory")):
        spec, why = next_step(ctx)
        return Match(
            0.6,
            f"Only layernorm is recomputed and the run still OOMs. Next: '{spec}' - {why}.",
            config_patch=patch_for(spec),
        )
    return None


@rule(
    "RK023",
    "Recompute settings never reached the model",
    "recompute_no_effect",
    symptom="Peak memory is the same with and without recompute; or full recompute 'never engages'",
    cause="The settings were set on a config object the model never saw (provider copied "
    "before the change), or the module ran in eval mode (Megatron gates full and "
    "core_attn recompute on self.training)",
    confirm="Print the model's config (Megatron's arguments dump) on rank 0 and check "
    "recompute_granularity there; check model.training is True in the step",
    fix="Set the recompute fields before the model is built (before provider.finalize()); "
    "keep the module in train mode",
    refs=("radixark/miles PR #1482", "NVIDIA-NeMo/Megatron-Bridge PR #5320"),
)
def _never_reached(ctx: Context) -> Match | None:
    rows = [r for r in ctx.evidence.experiments if r.get("peak_memory_bytes")]
    base = [r for r in rows if (r.get("recompute") or "none") in ("none", "selective:")]
    changed = [r for r in rows if r not in base and r.get("recompute") not in (None, "none")]
    for b in base:
        for r in changed:
            if r["peak_memory_bytes"] == b["peak_memory_bytes"] and r.get(
                "recompute", ""
            ).startswith("full"):
                return Match(
                    0.8,
                    f"'{r.get('name')}' ({r['recompute']}) peaks at exactly the "
                    f"same {gib(r['peak_memory_bytes'])} as '{b.get('name')}'.",
                )
    args_gran = ctx.cfg.get("recompute_granularity")
    if ctx.says("recompute never engaged") or (
        args_gran is None and ctx.cfg.get("recompute_num_layers") and ctx.oom
    ):
        return Match(
            0.6,
            "recompute_num_layers is set but recompute_granularity is empty in "
            "the config the model received.",
        )
    return None


# --------------------------------------------------------------------------------------------
# Recompute that costs too much
# --------------------------------------------------------------------------------------------


def _regressions(ctx: Context, threshold: float = -0.10):
    return [
        r
        for r in ctx.evidence.experiments
        if r.get("vs_golden") is not None and r["vs_golden"] <= threshold and not r.get("oom")
    ]


@rule(
    "RK030",
    "mlp recompute on a large FFN costs too much throughput",
    "recompute_overhead",
    symptom=">15% throughput (TFLOP/s/GPU) drop after adding mlp to recompute_modules",
    cause="The FFN is the largest GEMM block (ffn_hidden_size 28672 on Llama-3-70B): "
    "recomputing it re-runs a big share of the forward",
    confirm="Compare TFLOP/s/GPU with and without mlp (the experiments table); "
    "recompute-kit estimate reports recompute_flops_fraction",
    fix="Recompute a few layers fully instead (full:block:N with the smallest N that fits) "
    "or offload; keep mlp only if nothing else fits",
    refs=("NVIDIA skill perf-activation-recompute (Llama3-70B: mlp -16.4%)",),
)
def _mlp_overhead(ctx: Context) -> Match | None:
    for r in _regressions(ctx, -0.15):
        if "mlp" in (r.get("recompute_modules") or []):
            # With a model shape and a GPU size, the planner names the cheaper setting that
            # fits; without, the smallest full block is where to start measuring.
            spec = ctx.best.estimate.recompute if ctx.best is not None else "full:block:1"
            why = (
                f" The planner's cheapest fitting setting is '{spec}' "
                f"({ctx.best.estimate.recompute_flops_fraction:.1%} extra FLOPs)."
                if ctx.best is not None
                else ""
            )
            return Match(
                0.85,
                f"Experiment '{r.get('name')}' with {r.get('recompute_modules')} "
                f"runs {r['vs_golden']:+.1%} vs golden.{why}",
                config_patch=patch_for(spec),
            )
    if "mlp" in ctx.modules and not ctx.is_moe and ctx.config and ctx.estimate:
        frac = ctx.estimate.recompute_flops_fraction
        if frac > 0.12:
            return Match(0.5, f"mlp recompute adds {frac:.1%} to the step's FLOPs here.")
    return None


@rule(
    "RK031",
    "mlp + core_attn is slower than mlp alone",
    "recompute_overhead",
    symptom="Adding core_attn to mlp recompute lowers throughput further for no memory gain",
    cause="Double recompute overhead: with flash attention core_attn saves almost nothing "
    "but still re-runs attention",
    confirm="Compare the [mlp] and [mlp, core_attn] rows: same peak memory, lower TFLOP/s",
    fix="Use mlp alone",
    patch=patch_for("selective:mlp"),
    refs=("NVIDIA skill perf-activation-recompute (Exp 1 vs Exp 2)",),
)
def _double(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    alone = [r for r in rows if (r.get("recompute_modules") or []) == ["mlp"]]
    both = [r for r in rows if set(r.get("recompute_modules") or []) == {"mlp", "core_attn"}]
    for a in alone:
        for b in both:
            if (
                a.get("tflops_per_gpu")
                and b.get("tflops_per_gpu")
                and b["tflops_per_gpu"] < a["tflops_per_gpu"]
                and (b.get("peak_memory_bytes") or 0) >= (a.get("peak_memory_bytes") or 0)
            ):
                return Match(
                    0.85,
                    f"[mlp, core_attn] runs {b['tflops_per_gpu']} TFLOP/s/GPU vs "
                    f"{a['tflops_per_gpu']} for [mlp] at no lower peak memory.",
                )
    return None


@rule(
    "RK032",
    "Full recompute where selective would fit",
    "recompute_overhead",
    symptom="Step time ~30-40% above a no-recompute run; full recompute configured",
    cause="Full recompute re-runs every layer's forward; selective recompute of the right "
    "modules often fits for a few percent",
    confirm="recompute-kit plan --gpu-memory-gb X ranks the settings that fit by added FLOPs",
    fix="Switch to the planner's choice",
    refs=("arXiv:2205.05198 Table 4",),
    supersedes=("RK090",),  # the same advice, said more specifically
)
def _full_overkill(ctx: Context) -> Match | None:
    if ctx.granularity != "full" or ctx.best is None:
        return None
    if ctx.oom or ctx.says("out of memory"):
        return None  # the run does not fit even with full recompute: never advise less
    best = ctx.best.estimate
    if best.recompute.startswith("full") or ctx.estimate is None:
        return None
    if ctx.estimate.recompute_flops_fraction - best.recompute_flops_fraction < 0.05:
        return None
    return Match(
        0.75,
        f"'{best.recompute}' fits ({gib(best.total_bytes)} per rank) for "
        f"{best.recompute_flops_fraction:.1%} extra FLOPs instead of "
        f"{ctx.estimate.recompute_flops_fraction:.1%}.",
        config_patch=patch_for(best.recompute),
    )


@rule(
    "RK033",
    "A recompute setting regresses throughput",
    "recompute_overhead",
    symptom="An experiment runs more than 10% below the golden (no-recompute or baseline) "
    "throughput",
    cause="The recomputed modules re-run a large share of the forward pass",
    confirm="recompute-kit ablate (or the experiments table): TFLOP/s/GPU vs golden",
    fix="Pick the fitting setting with the smallest overhead (recompute-kit plan)",
)
def _regression(ctx: Context) -> Match | None:
    rows = _regressions(ctx)
    if not rows:
        return None
    worst = min(rows, key=lambda r: r["vs_golden"])
    return Match(
        0.6,
        f"Experiment '{worst.get('name')}' ({worst.get('recompute')}) runs "
        f"{worst['vs_golden']:+.1%} vs golden.",
    )


@rule(
    "RK034",
    "Uniform recompute with large groups: the backward peak",
    "activation_memory",
    symptom="Full uniform recompute with recompute_num_layers > 1 still OOMs, in backward",
    cause="Each group of N layers is recomputed at once in backward: its activations come "
    "back together (the recompute buffer)",
    confirm="recompute-kit estimate --recompute full:uniform:N full:uniform:1: compare "
    "peak_activation_bytes",
    fix="Use recompute_num_layers 1 with uniform",
    patch=patch_for("full:uniform:1"),
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/1226",),
)
def _uniform_groups(ctx: Context) -> Match | None:
    if ctx.granularity != "full" or ctx.cfg.get("recompute_method") != "uniform":
        return None
    n = ctx.cfg.get("recompute_num_layers") or 1
    if n <= 1 or not (ctx.oom or ctx.says("out of memory")):
        return None
    return Match(0.7, f"Groups of {n} layers are rematerialised together in backward.")


@rule(
    "RK035",
    "The OOM moved to another rank after enabling recompute",
    "activation_memory",
    symptom="After a recompute change the OOM appears on a different (pipeline) rank",
    cause="Pipeline stages hold different activation loads (the first stage keeps p "
    "micro-batches in flight); recompute per stage shifted the binding stage",
    confirm="Compare the ranks in the OOM messages before/after; recompute-kit estimate "
    "reports the first stage",
    fix="Use block recompute with more layers on the early stages, or rebalance layers "
    "(num_layers_in_first_pipeline_stage)",
    refs=("Megatron-Bridge perf-activation-recompute triage",),
)
def _moved_rank(ctx: Context) -> Match | None:
    if ctx.cfg.get("pipeline_model_parallel_size") == 1:
        return None  # no pipeline stages: data-parallel replicas simply all OOM at once
    ranks = [o.rank for o in ctx.evidence.oom if o.rank is not None]
    if len(set(ranks)) < 2:
        return None
    return Match(0.55, f"OOMs were reported on ranks {sorted(set(ranks))}.")


@rule(
    "RK036",
    "The run gets farther but still OOMs: the peak moved past backward",
    "model_state_memory",
    symptom="A candidate survives more iterations/phases but still OOMs, in the optimizer "
    "step or gradient reduction",
    cause="Recompute lowered the activation peak; now gradient buffers and optimizer states bind",
    confirm="The traceback ends in optimizer.step / the distributed optimizer / grad sync",
    fix="Distributed optimizer, gradient buffer bucketing, or more data/pipeline parallelism",
    patch={"use_distributed_optimizer": True},
    refs=("Megatron-Bridge perf-activation-recompute triage",),
    supersedes=("RK005", "RK010"),
)
def _optimizer_peak(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        if "out of memory" not in e.message.lower():
            continue
        frames = " ".join(e.frames).lower()
        if any(
            k in frames
            for k in (
                "optimizer",
                "step(",
                "in step",
                "reduce_scatter",
                "finish_grad_sync",
                "start_grad_sync",
                "allreduce_params",  # Megatron-LM's older DDP gradient all-reduce
                "allreduce_gradients",
            )
        ):
            return Match(
                0.75,
                "The OOM happened in the optimizer step / gradient sync "
                f"({e.frames[-1] if e.frames else ''}).",
            )
    return None


# --------------------------------------------------------------------------------------------
# Megatron's validation messages (one rule per family, messages verbatim in the tests)
# --------------------------------------------------------------------------------------------

MEGATRON_CONFIG = "megatron/core/transformer/transformer_config.py"


def _validation(*fragments: str):
    """Fires on Megatron's message in a log, or when the kit's own validation of the given
    config raises it."""
    logged = on_message(*fragments, confidence=0.95)

    def check(ctx: Context) -> Match | None:
        found = logged(ctx)
        if found:
            return found
        if ctx.config_error and any(f in ctx.config_error for f in fragments):
            return Match(0.9, f'Megatron would reject this config: "{ctx.config_error}"')
        return None

    return check


VALIDATION_RULES = [
    (
        "RK050",
        "Full recompute needs a method",
        ('recompute_method must be "block" or "uniform"',),
        "recompute_granularity=full without recompute_method",
        "Full recompute must say how layers are grouped",
        "Set recompute_method to uniform (every layer, most saving) or block (first N)",
        patch_for("full:uniform:1"),
    ),
    (
        "RK051",
        "Full recompute needs recompute_num_layers",
        ("recompute_num_layers must be between",),
        "recompute_granularity=full without recompute_num_layers",
        "Megatron only checks that the value is set; out-of-range values act like the layer count",
        "Set recompute_num_layers (1 with uniform for the most saving)",
        patch_for("full:uniform:1"),
    ),
    (
        "RK052",
        "Selective recompute takes no recompute_num_layers",
        ("recompute_num_layers must be None",),
        "recompute_granularity=selective with recompute_num_layers set",
        "Selective recompute always applies to every layer",
        "Remove recompute_num_layers (and recompute_method)",
        {"recompute_num_layers": None, "recompute_method": None},
    ),
    (
        "RK053",
        "Unknown granularity or method",
        ('must be "full"or "selective"', 'must be "block" or "uniform".'),
        "A typo in recompute_granularity or recompute_method",
        "Only selective/full and uniform/block exist (Megatron's message spells 'granuarlity')",
        "Fix the value",
        {},
    ),
    (
        "RK054",
        "Unknown recompute module",
        ("Invalid choices for recompute_modules",),
        "recompute_modules lists a name Megatron does not know",
        "Allowed: core_attn, mlp, layernorm, moe, moe_act, shared_experts, mla_up_proj (+ newer "
        "model-specific ones)",
        "Fix the module name",
        {},
    ),
    (
        "RK055",
        "moe_act recompute needs grouped GEMM",
        ("moe_act in recompute_modules is only supported with moe_grouped_gemm",),
        "moe_act in recompute_modules without moe_grouped_gemm",
        "Only TEGroupedMLP implements the output-discarding activation checkpoint",
        "Enable moe_grouped_gemm, or recompute 'moe' instead",
        {"moe_grouped_gemm": True},
    ),
    (
        "RK056",
        "mla_up_proj needs multi-latent attention",
        ("mla_up_proj in recompute_modules is only supported with",),
        "mla_up_proj in recompute_modules on a non-MLA model",
        "The module exists only in MLA attention",
        "Remove mla_up_proj",
        {},
    ),
    (
        "RK057",
        "shared_experts recompute conflicts with overlap",
        ("shared_experts recompute cannot work with --moe-shared-expert-overlap",),
        "shared_experts recompute together with moe_shared_expert_overlap",
        "Overlapped shared experts run on another stream outside the checkpoint",
        "Drop the overlap or the shared_experts recompute",
        {"moe_shared_expert_overlap": False},
    ),
    (
        "RK058",
        "fp8 delayed scaling cannot recompute moe_act/layernorm",
        (
            "Delayed scaling does not support moe_act and layernorm recompute",
            "moe_act and layernorm recompute for fp8 needs",
        ),
        "fp8 with the delayed recipe (or an old TransformerEngine) and moe_act/layernorm recompute",
        "Output-discarding recompute must re-quantize identically; delayed scaling cannot",
        "Use fp8_recipe tensorwise/blockwise/mxfp8 (TE >= 2.6), or drop moe_act/layernorm",
        {"fp8_recipe": "tensorwise"},
    ),
    (
        "RK059",
        "CPU offloading conflicts",
        (
            "CPU offloading does not work when activation recomputation is enabled",
            "Currently there is no support for Pipeline parallelism with CPU offloading",
            "CPU offloading can be done only for layers less than",
        ),
        "cpu_offloading together with recompute, with PP > 1, or for too many layers",
        "Layer offloading replaces recompute; it needs PP = 1 and fewer layers than the model",
        "Choose one: recompute, or cpu_offloading with PP = 1 and cpu_offloading_num_layers < L",
        {"cpu_offloading": False},
    ),
    (
        "RK060",
        "distribute_saved_activations conflicts",
        (
            "must be false when sequence parallel is enabled",
            "can distribute recomputed activations only across tensor model parallel groups",
            "distributed recompute activations is only application to full recompute",
        ),
        "distribute_saved_activations with sequence parallelism, TP = 1 or selective recompute",
        "It shards full recompute's stored layer inputs over TP; SP already shards them",
        "Turn distribute_saved_activations off (SP already does its job)",
        {"distribute_saved_activations": False},
    ),
    (
        "RK061",
        "Fine-grained offloading conflicts",
        (
            "fine_grained_activation_offloading cannot be enabled with cpu_offloading",
            "attn_proj cannot be set to offload_modules alone without core_attn",
            "while recomputing the entire MoE layer",
            "Invalid choices for offload_modules",
        ),
        "offload_modules combined with cpu_offloading, attn_proj without core_attn, or offloading "
        "inside a recomputed 'moe'",
        "Megatron's offload manager cannot own tensors a checkpoint or another offloader owns",
        "Follow the message: pick one mechanism per tensor",
        {},
    ),
    (
        "RK062",
        "CUDA graphs and recompute",
        (
            "CUDA graphs not supported with activation recomputation",
            "full recompute is only supported with full iteration CUDA graph",
            "not supported with graphed",
            "not supported with moe_router CUDA graph",
        ),
        "CUDA graphs enabled together with (full) recompute",
        "A recompute region cannot straddle a graph; graphed recompute cannot replay RNG",
        "Full recompute: cuda_graph_impl='full_iteration' or no graphs; selective: keep graphed "
        "scopes outside the recomputed modules and dropout off there",
        {"cuda_graph_impl": "none"},
    ),
    (
        "RK063",
        "Deprecated --moe-layer-recompute",
        ("--moe-layer-recompute is deprecated", "Do not set --moe-layer-recompute"),
        "--moe-layer-recompute set (with full granularity it is an error)",
        "The flag became selective recompute of 'moe' (its message says 'moe_layer', the real "
        "module is 'moe')",
        "Use recompute_granularity=selective, recompute_modules=[moe]",
        patch_for("selective:moe"),
    ),
]

for _id, _title, _frags, _symptom, _cause, _fix, _patch in VALIDATION_RULES:
    rule(
        _id,
        _title,
        "invalid_config",
        symptom=_symptom + f" ('{_frags[0]}')",
        cause=_cause,
        confirm="recompute-kit validate CONFIG prints Megatron's message for the config",
        fix=_fix,
        patch=_patch,
        refs=(MEGATRON_CONFIG,),
    )(_validation(*_frags))


@rule(
    "RK064",
    "Uniform recompute crashes when the layer count is not a multiple",
    "framework_bug",
    symptom="IndexError (e.g. 'index 24 is out of range') with full/uniform recompute",
    cause="Megatron before core_v0.17 did not clamp the last chunk when num_layers per stage "
    "is not divisible by recompute_num_layers",
    confirm="num_layers per pipeline stage % recompute_num_layers != 0",
    fix="Upgrade Megatron-Core (>= 0.17, PR #3562) or use a divisor of the layer count",
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/2294",),
)
def _uniform_index(ctx: Context) -> Match | None:
    # Only an IndexError raised with full recompute configured or from inside the recompute
    # loop (checkpoint / transformer_block frames): "list index out of range" in a data
    # loader says nothing about recompute.
    for e in ctx.evidence.errors:
        if e.type.rsplit(".", 1)[-1] != "IndexError":
            continue
        frames = " ".join(e.frames)
        in_recompute = any(
            k in frames for k in ("checkpoint", "transformer_block.py", "_get_layer")
        )
        if ctx.granularity != "full" and not in_recompute:
            continue
        text = f"IndexError: {e.message}"
        layers, pp = ctx.cfg.get("num_layers"), ctx.cfg.get("pipeline_model_parallel_size") or 1
        n = ctx.cfg.get("recompute_num_layers")
        per_stage = layers // pp if isinstance(layers, int) and isinstance(pp, int) else None
        uniform = ctx.cfg.get("recompute_method") == "uniform" and isinstance(n, int) and n > 0
        if uniform and per_stage and per_stage % n:
            return Match(
                0.85,
                f'The log says "{text}"; {per_stage} layers per pipeline stage are not a '
                f"multiple of recompute_num_layers {n}, so the last uniform chunk runs past "
                "the last layer.",
            )
        where = (
            "full recompute is configured"
            if ctx.granularity == "full"
            else "the traceback passes through the recompute loop"
        )
        return Match(0.75, f'The log says "{text}" and {where}.')
    return None


# --------------------------------------------------------------------------------------------
# PyTorch / Hugging Face checkpoint API pitfalls
# --------------------------------------------------------------------------------------------

PT_CKPT = "https://docs.pytorch.org/docs/stable/checkpoint.html"
CKPT_RULES = [
    (
        "RK070",
        "Reentrant checkpoint with .grad() or backward(inputs=...)",
        (
            "incompatible with .grad() or passing an `inputs` parameter",
            "Checkpointing is not compatible with .grad()",
        ),
        "RuntimeError from torch.autograd.grad through a reentrant checkpoint",
        "The reentrant implementation runs its own backward inside backward",
        "Pass use_reentrant=False (or call .backward())",
        {"use_reentrant": False},
    ),
    (
        "RK071",
        "No checkpoint input requires grad",
        (
            "None of the inputs have requires_grad=True",
            "element 0 of tensors does not require grad and does not have a grad_fn",
        ),
        "UserWarning 'None of the inputs have requires_grad=True. Gradients will be None', then "
        "'element 0 of tensors does not require grad'",
        "A reentrant checkpoint whose inputs (e.g. frozen embeddings under PEFT/LoRA) do not "
        "require grad produces outputs without grad_fn",
        "use_reentrant=False, or make the input require grad (Hugging Face: "
        "model.enable_input_require_grads())",
        {"use_reentrant": False},
    ),
    (
        "RK072",
        "use_reentrant not passed",
        (
            "the use_reentrant parameter should be passed explicitly",
            "please pass in use_reentrant=True or use_reentrant=False explicitly",
        ),
        "UserWarning asking to pass use_reentrant explicitly",
        "torch.utils.checkpoint still defaults to the reentrant variant and will start to raise",
        "Pass use_reentrant=False explicitly (Hugging Face: gradient_checkpointing_kwargs="
        "{'use_reentrant': False})",
        {"use_reentrant": False},
    ),
    (
        "RK073",
        "Keyword arguments to a reentrant checkpoint",
        ("Unexpected keyword arguments",),
        "ValueError: Unexpected keyword arguments: ...",
        "The reentrant checkpoint takes positional tensors only",
        "use_reentrant=False, or pass the values positionally (functools.partial for non-tensors)",
        {"use_reentrant": False},
    ),
    (
        "RK074",
        "DDP: parameter marked ready twice",
        ("marked as ready twice", "Expected to mark a variable ready only once"),
        "RuntimeError 'Expected to mark a variable ready only once' with checkpointing under DDP",
        "Reentrant checkpoints run several backward passes that fire DDP's hooks again",
        "use_reentrant=False, or DDP(static_graph=True) / _set_static_graph()",
        {"use_reentrant": False},
    ),
]

for _id, _title, _frags, _symptom, _cause, _fix, _patch in CKPT_RULES:
    rule(
        _id,
        _title,
        "checkpoint_api_misuse",
        symptom=_symptom,
        cause=_cause,
        confirm="The traceback names torch/utils/checkpoint.py",
        fix=_fix,
        patch=_patch,
        refs=(PT_CKPT,),
    )(on_message(*_frags))


rule(
    "RK075",
    "Recomputed tensors differ from the forward's",
    "nondeterministic_recompute",
    symptom="CheckpointError: 'Recomputed values for the following tensors have different "
    "metadata than during the forward pass'",
    cause="The checkpointed function is not deterministic in shape/dtype: data-dependent "
    "control flow, a global flag changed between forward and backward, or torch.compile "
    "picking another graph",
    confirm="Rerun with torch.utils.checkpoint.set_checkpoint_debug_enabled(True) to see the "
    "ops that differ",
    fix="Make the region deterministic (no state changes between "
    "forward and backward; for MoE routing replay, record and replay the routing)",
    refs=(PT_CKPT, "https://github.com/pytorch/pytorch/issues/166926"),
)(
    on_message(
        "have different metadata than during the forward pass",
        "CheckpointError: Recomputed values for the following tensors",
        "A different number of tensors was saved during the original forward and recomputation",
    )
)

rule(
    "RK076",
    "use_cache=True with gradient checkpointing (Hugging Face)",
    "informational",
    symptom="Warning: '`use_cache=True` is incompatible with gradient checkpointing. Setting "
    "`use_cache=False`'",
    cause="The KV cache is useless in training and conflicts with recompute; transformers "
    "turns it off",
    confirm="The warning repeats every step",
    fix="Set model.config.use_cache = False before training",
    patch={"use_cache": False},
    refs=("https://huggingface.co/docs/transformers/perf_train_gpu_one",),
)(on_message("is incompatible with gradient checkpointing", confidence=0.6))

rule(
    "RK077",
    "Gradient checkpointing on a model that does not support it (Hugging Face)",
    "checkpoint_api_misuse",
    symptom="ValueError: '... does not support gradient checkpointing.'",
    cause="The model class has supports_gradient_checkpointing = False",
    confirm="type(model).supports_gradient_checkpointing",
    fix="Wrap the blocks with torch.utils.checkpoint yourself (use_reentrant=False) or use "
    "another model class",
    refs=("https://huggingface.co/docs/transformers/perf_train_gpu_one",),
)(on_message("does not support gradient checkpointing"))


# --------------------------------------------------------------------------------------------
# Known framework bugs and their workarounds
# --------------------------------------------------------------------------------------------


@rule(
    "RK080",
    "MoE + full recompute keeps memory until the next iteration",
    "framework_bug",
    symptom="MoE model with full recompute: memory grows across iterations or is freed late; "
    "residual memory scales with recompute_num_layers",
    cause="unpermute()/CheckpointFunction kept autograd references to intermediates "
    "(Megatron-LM #3221, verl #5251)",
    confirm="max_allocated grows from iteration 1 to 2 and then plateaus high",
    fix="Upgrade Megatron-Core (PR #5197); meanwhile use selective 'moe_act' (+'mlp' on dense "
    "layers)",
    patch=patch_for("selective:layernorm,moe_act"),
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/3221", "verl-project/verl PR #5251"),
)
def _moe_full_leak(ctx: Context) -> Match | None:
    if not (ctx.is_moe and ctx.granularity == "full"):
        return None
    reports = [r for r in ctx.evidence.memory if r.max_allocated_bytes]
    if (
        len(reports) >= 2
        and reports[-1].max_allocated_bytes > 1.05 * reports[0].max_allocated_bytes
    ):
        return Match(
            0.6,
            f"max allocated grew from {gib(reports[0].max_allocated_bytes)} to "
            f"{gib(reports[-1].max_allocated_bytes)} with MoE + full recompute.",
        )
    return None


rule(
    "RK081",
    "Full recompute crashes on multi-RoPE models (Gemma 3/4, multimodal)",
    "framework_bug",
    symptom="TypeError/ValueError about tuples in save_for_backward with recompute "
    "granularity full on Gemma-3/4 or multi-axis RoPE models",
    cause="A tuple of RoPE tensors was passed through the checkpoint; save_for_backward "
    "stores tensors only",
    confirm="The traceback passes through tensor_parallel/random.py",
    fix="Upgrade Megatron-Core (PR #5324/#6519) or use selective recompute",
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/5323",),
)(
    on_message(
        "save_for_backward can only save variables, but argument", "only Tensors should be given"
    )
)

rule(
    "RK082",
    "TransformerEngine CPU offloading without a target",
    "invalid_config",
    symptom="ValueError: 'CPU Offloading is enabled while it is not mentioned what to "
    "offload (weights/activations)'",
    cause="cpu_offloading is on but cpu_offloading_activations and _weights are both off",
    confirm="Check cpu_offloading_activations / cpu_offloading_weights in the config",
    fix="Set cpu_offloading_activations=True (and cpu_offloading_weights=False)",
    patch={"cpu_offloading_activations": True, "cpu_offloading_weights": False},
    refs=("https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/2684",),
)(on_message("it is not mentioned what to offload"))


# --------------------------------------------------------------------------------------------
# When nothing is wrong
# --------------------------------------------------------------------------------------------


@rule(
    "RK090",
    "Headroom: recompute could be reduced",
    "informational",
    symptom="No OOM; the estimate leaves a large part of the GPU unused while recompute is on",
    cause="The recompute setting is stricter than the memory needs",
    confirm="recompute-kit plan --gpu-memory-gb X shows a cheaper setting that fits",
    fix="Switch to the planner's choice for throughput",
)
def _headroom(ctx: Context) -> Match | None:
    if ctx.oom or ctx.says("out of memory") or ctx.best is None or ctx.estimate is None:
        return None
    if not ctx.granularity:
        return None
    best = ctx.best.estimate
    if ctx.estimate.recompute_flops_fraction - best.recompute_flops_fraction < 0.02:
        return None
    return Match(
        0.5,
        f"'{best.recompute}' also fits and adds {best.recompute_flops_fraction:.1%} "
        f"FLOPs instead of {ctx.estimate.recompute_flops_fraction:.1%}.",
        config_patch=patch_for(best.recompute),
    )


# --------------------------------------------------------------------------------------------
# Where in the code the OOM happened, and what the experiments already show
# --------------------------------------------------------------------------------------------


def _oom_errors(ctx: Context):
    return [
        e
        for e in ctx.evidence.errors
        if "out of memory" in e.message.lower() or "OutOfMemory" in e.type
    ]


def _where(e) -> str:
    return " ".join([*e.frames, e.details or ""]).lower()


LOGITS_WORDS = (
    "cross_entropy",
    "log_softmax",
    "logits",
    "logprob",
    "lm_head",
    "output_layer",
    "post_language_model_processing",
    "vocab_parallel",
)
BUILD_WORDS = (
    "build_module",
    "__init__",
    "build_model",
    "get_model",
    "from_pretrained",
    "load_state_dict",
    "model_provider",
    "provide(",
)


@rule(
    "RK016",
    "The OOM happens in the logits / loss",
    "logits_memory",
    symptom="The OOM traceback runs through the output layer, logits, log-softmax or cross-entropy",
    cause="[tokens x vocab] tensors (logits, their fp32 copy, log-probabilities, gradients) "
    "are the largest single allocations of an LLM step",
    confirm="The failing frames name the loss / logits; the requested size is about tokens "
    "x vocab x 4 bytes",
    fix="Fused or chunked cross-entropy (no full fp32 logits), vocab-parallel loss, a "
    "smaller micro-batch or sequence; recompute of transformer layers does not help",
    patch={"cross_entropy_loss_fusion": True},
    supersedes=("RK004", "RK002", "RK005", "RK001"),
)
def _oom_in_logits(ctx: Context) -> Match | None:
    for e in _oom_errors(ctx):
        where = _where(e)
        hit = next((w for w in LOGITS_WORDS if w in where), None)
        if hit:
            frame = next((f for f in reversed(e.frames) if hit in f.lower()), hit)
            return Match(0.9, f"The OOM is raised under '{frame}'.")
    return None


@rule(
    "RK017",
    "The OOM happens while building the model",
    "model_state_memory",
    symptom="CUDA OOM raised from module constructors (build_module, __init__, "
    "from_pretrained, load_state_dict) before training starts",
    cause="The weights alone do not fit the GPU(s) at this parallel layout; activations and "
    "recompute are not involved yet",
    confirm="The traceback's frames are model construction; no iteration line was printed",
    fix="More tensor/pipeline/expert parallelism, FSDP, or a smaller model per GPU",
    supersedes=("RK005", "RK001", "RK010"),
)
def _oom_at_build(ctx: Context) -> Match | None:
    if ctx.evidence.iterations:
        return None
    for e in _oom_errors(ctx):
        tail = " ".join(e.frames[-6:]).lower()
        if any(w in tail for w in BUILD_WORDS):
            return Match(
                0.85,
                f"The OOM is raised while constructing the model "
                f"('{e.frames[-1] if e.frames else ''}').",
            )
    return None


OFF_KEYS = (
    "gradient_checkpointing",
    "activation_checkpointing",
    "use_gradient_checkpointing",
    "enable_gradient_checkpointing",
    "recompute",
)


@rule(
    "RK014",
    "OOM with activation checkpointing switched off",
    "activation_memory",
    symptom="CUDA OOM in training while the config turns gradient/activation checkpointing "
    "off (gradient_checkpointing: false, activation_checkpointing: false)",
    cause="Every layer keeps all its activations; they grow with sequence length x batch",
    confirm="Turn checkpointing on for one run (or halve the sequence) and compare the peak",
    fix="Enable activation checkpointing (Hugging Face: gradient_checkpointing=True with "
    "use_reentrant=False; Megatron: recompute_granularity selective, then full)",
    patch={"gradient_checkpointing": True},
    supersedes=("RK005",),
)
def _checkpointing_off(ctx: Context) -> Match | None:
    if not (ctx.oom or _oom_errors(ctx)):
        return None
    for key, value in ctx.cfg.items():
        name = key.rsplit(".", 1)[-1]
        if value is False and any(name == k or name.startswith(k) for k in OFF_KEYS):
            return Match(0.75, f"The config sets {key} = false and training ran out of memory.")
    return None


@rule(
    "RK015",
    "Experiments: selective recompute OOMs, full recompute fits",
    "activation_memory",
    symptom="In the experiments, the selective settings run out of memory and a full "
    "recompute setting does not",
    cause="Activations dominate; the selective modules tried do not cover the binding tensors",
    confirm="The experiments table: OOM rows are selective, passing rows full",
    fix="Keep full recompute with the fewest layers that fit (full:block:N, rising N), or the "
    "selective module that holds the memory (mlp / moe / mla_up_proj)",
    supersedes=("RK011",),
)
def _selective_oom_full_ok(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    bad = [
        r for r in rows if r.get("oom") and str(r.get("recompute") or "").startswith("selective")
    ]
    good = [
        r for r in rows if not r.get("oom") and str(r.get("recompute") or "").startswith("full")
    ]
    if not (bad and good):
        return None
    return Match(
        0.85,
        f"'{bad[0].get('name')}' ({bad[0]['recompute']}) runs out of memory; "
        f"'{good[0].get('name')}' ({good[0]['recompute']}) fits.",
        config_patch=patch_for(good[0]["recompute"]),
    )


@rule(
    "RK008",
    "OOM far below the GPU's size: the allocator, not the model",
    "fragmentation",
    symptom="A run OOMs although its measured peak is well below the GPU's capacity",
    cause="The caching allocator could not find a large enough free block (fragmentation), "
    "or memory outside PyTorch grew",
    confirm="Compare max_memory_reserved with max_memory_allocated; rerun with "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    fix="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before changing recompute",
    patch=EXPANDABLE,
    supersedes=("RK011", "RK005"),
)
def _oom_below_capacity(ctx: Context) -> Match | None:
    if not ctx.gpu_bytes:
        return None
    rows = [r for r in ctx.evidence.experiments if r.get("oom") and r.get("peak_memory_bytes")]
    for r in rows:
        share = r["peak_memory_bytes"] / ctx.gpu_bytes
        if share < 0.8:
            return Match(
                0.75,
                f"'{r.get('name')}' ran out of memory at a measured peak of "
                f"{gib(r['peak_memory_bytes'])}, {share:.0%} of the "
                f"{gib(ctx.gpu_bytes)} GPU.",
            )
    return None


LIBRARY_OOM = (
    "NCCL WARN Cuda failure 2 'out of memory'",
    "Triton Error [CUDA]: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
)


@rule(
    "RK009",
    "A library outside PyTorch could not allocate",
    "fragmentation",
    symptom="NCCL, Triton, cuBLAS or cuDNN reports 'out of memory' (not PyTorch's allocator)",
    cause="PyTorch's caching allocator holds the free memory in its cache, so the library's "
    "own cudaMalloc fails",
    confirm="torch.cuda.memory_reserved() is close to the GPU size while allocated is lower",
    fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torch.cuda.empty_cache() before "
    "the library call, or cap PyTorch (set_per_process_memory_fraction)",
    patch=EXPANDABLE,
)
def _library_oom(ctx: Context) -> Match | None:
    text = ctx.text
    hit = next((w for w in LIBRARY_OOM if w.lower() in text.lower()), None)
    if hit is None:
        for o in ctx.evidence.oom:
            library = next(
                (
                    n
                    for n in ("nccl", "triton", "cublas", "cudnn")
                    if n in (o.generation or "").lower()
                ),
                None,
            )
            if library or (o.backend and o.backend not in ("cuda", "hip")):
                hit = f"{library or o.backend} out of memory"
                break
    if hit is None:
        return None
    return Match(0.75, f"'{hit}': a library's own allocation failed, not PyTorch's.")


@rule(
    "RK083",
    "ZeRO-3 released the parameters the recompute needs",
    "framework_bug",
    symptom="CheckpointError: recomputed metadata shows shape torch.Size([0]) where the "
    "forward saw real shapes (DeepSpeed ZeRO-3)",
    cause="ZeRO-3 partitions parameters after use; the recompute runs with released "
    "(empty) parameters",
    confirm="The recomputed metadata in the CheckpointError has torch.Size([0])",
    fix="Use DeepSpeed's checkpointing (deepspeed.checkpointing) or use_reentrant=True with "
    "ZeRO-3, or upgrade DeepSpeed",
    supersedes=("RK075",),
)
def _zero3_released(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        text = " ".join(f"{e.message} {e.details or ''}".split())
        if "recomputed metadata" in text and "torch.Size([0])" in text:
            return Match(0.9, "The recomputed tensors have shape torch.Size([0]).")
    return None


@rule(
    "RK084",
    "Pipeline + CPU offloading error with offloading off",
    "framework_bug",
    symptom="'Currently there is no support for Pipeline parallelism with CPU offloading' "
    "although cpu_offloading_num_layers is 0",
    cause="A framework layer (Megatron-Bridge) set cpu_offloading from a default even though "
    "no layer is offloaded",
    confirm="The config has cpu_offloading_num_layers: 0",
    fix="Set cpu_offloading: false explicitly (or upgrade Megatron-Bridge)",
    patch={"cpu_offloading": False},
    supersedes=("RK059",),
)
def _offload_zero_layers(ctx: Context) -> Match | None:
    if not ctx.says("no support for Pipeline parallelism with CPU offloading"):
        return None
    layers = ctx.cfg.get("cpu_offloading_num_layers", ctx.cfg.get("activation_offload_layers"))
    if layers == 0:
        return Match(
            0.9, "Megatron rejects CPU offloading with PP although cpu_offloading_num_layers is 0."
        )
    return None


RULES.sort(key=lambda r: r.id)  # the catalog reads in id order, whatever the file's order


# --------------------------------------------------------------------------------------------
# The generated troubleshooting table
# --------------------------------------------------------------------------------------------


def catalog_markdown() -> str:
    """The symptom / cause / confirm / fix table the agent skill ships (generated)."""
    lines = [
        "<!-- generated by `recompute-kit rules --markdown`; do not edit by hand -->",
        "# recompute-kit troubleshooting table",
        "",
        f"{len(RULES)} rules. `recompute-kit doctor --log LOG --config CONFIG` runs them on "
        "real artefacts and ranks what it finds.",
        "",
        "| id | category | symptom | cause | confirm | fix |",
        "|---|---|---|---|---|---|",
    ]

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    for r in RULES:
        lines.append(
            f"| {r.id} | {r.category} | **{cell(r.title)}**: {cell(r.symptom)} | "
            f"{cell(r.cause)} | {cell(r.confirm)} | {cell(r.fix)} |"
        )
    return "\n".join(lines) + "\n"
