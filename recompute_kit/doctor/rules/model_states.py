"""Model states by model size and by where the OOM struck: weights, gradients and optimizer
states of a named model against the GPU (RK101), and an OOM inside the optimizer step (RK110).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..types import Context, Match
from .registry import (
    all_frames,
    assume,
    fact,
    gib,
    is_megatron,
    oom_errors,
    rule,
    tensor_parallel_patch,
    zero_stage,
)

# "Baichuan2-13B-Chat", "Meta-Llama-3-8B-Instruct", "Mixtral-8x7B": billions of parameters.
_PARAMS_RE = re.compile(r"(?<![\w.])(?:(\d+)x)?(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")
MODEL_NAME_KEYS = (
    "model_name_or_path",
    "pretrained_model_name_or_path",
    "model_name",
    "model",
    "base_model",
    "model_id",
    "pretrain",
)
GPU_COUNT_KEYS = (
    "num_processes",
    "nproc_per_node",
    "num_gpus",
    "world_size",
    "gpus",
    "visible_devices",
    # the trained model's GPUs in RL trainers (OpenRLHF's actor, verl's trainer)
    "actor_num_gpus_per_node",
    "trainer.n_gpus_per_node",
    "n_gpus_per_node",
    "num_gpus_per_node",
    "gpus_per_node",
)
NODE_KEYS = ("actor_num_nodes", "trainer.nnodes", "nnodes", "num_nodes")
# The largest memory of the data-centre GPUs most runs use (A100 / H100 / A800 / H800).
COMMON_GPU_BYTES = 80 * 2**30
# Bytes per parameter on one GPU, mixed-precision Adam: 2 (weights) + 2 (grads) + 12 (fp32
# master, exp_avg, exp_avg_sq); ZeRO stage s shards the last terms over n GPUs.
ZERO_BYTES = {
    0: lambda n: 16.0,
    1: lambda n: 4 + 12 / n,
    2: lambda n: 2 + 14 / n,
    3: lambda n: 16 / n,
}


def _model_params(ctx: Context) -> tuple[float, str] | None:
    """Parameters from the model's name in the config (a path's last folder, trailing slash
    or not), else from a size the prose states ("GPT-30B model", "16B模型")."""
    for key in MODEL_NAME_KEYS:
        name = ctx.cfg.get(key)
        if not isinstance(name, str):
            continue
        if m := _PARAMS_RE.search(name.rstrip("/").rsplit("/", 1)[-1]):
            experts, size = m.groups()
            return float(size) * 1e9 * (int(experts) if experts else 1), name
    prose = fact(ctx, "model_prose")
    if isinstance(prose, dict) and prose.get("params"):
        return float(prose["params"]), str(prose["name"])
    return None


def _by_name(name: str, ctx: Context) -> bool:
    """Whether `name` is a model name or path from the config (the size read off it)."""
    return any(ctx.cfg.get(k) == name for k in MODEL_NAME_KEYS)


def size_words(params: float, name: str, ctx: Context) -> str:
    """The parameter count as its source gives it: a model's name rounds ("13B" of a 13.9B
    Baichuan2), so a count from the name is said as the name's size, never as a measured one."""
    size = f"about {params / 1e9:.3g}B parameters"
    return f"{size} by its name" if _by_name(name, ctx) else size


def said(ctx: Context) -> dict:
    """Settings stated in prose and on command lines (evidence/settings_prose.py): ZeRO stage,
    offload, adapters, GPUs."""
    found = fact(ctx, "settings_prose")
    return found if isinstance(found, dict) else {}


def _gpu_count(ctx: Context) -> int | None:
    include = ctx.cfg.get("include")
    if isinstance(include, str) and ":" in include:  # deepspeed --include localhost:4,5,6,7
        return len(include.split(":", 1)[1].split(","))
    for key in GPU_COUNT_KEYS:
        value = ctx.cfg.get(key)
        if isinstance(value, int) and value > 0:
            if "per_node" in key:
                nodes = next((ctx.cfg[n] for n in NODE_KEYS if isinstance(ctx.cfg.get(n), int)), 1)
                return value * max(1, nodes)
            return value
    prose = fact(ctx, "gpu_prose")  # "A100-80Gx8", "8x H100 80GB"
    if isinstance(prose, dict) and prose.get("count"):
        return int(prose["count"])
    count = said(ctx).get("gpu_count")  # "2x NVIDIA A100", "4 A100 GPUs", "4张A100"
    return int(count) if count else None


def stated_gpu_bytes(ctx: Context) -> int | None:
    """The GPU's memory: from the OOM message or --gpu-memory-gb, else as the prose states
    it ("A100-80G", "RTX 3090 24GB")."""
    if ctx.gpu_bytes:
        return ctx.gpu_bytes
    prose = fact(ctx, "gpu_prose")
    size = said(ctx).get("gpu_bytes")  # "(40GB each)", "2 16G A4000", "8张T4"
    if isinstance(prose, dict) and prose.get("bytes") and (prose.get("named") or not size):
        return int(prose["bytes"])  # a bare size in words yields to one tied to a card
    return int(size) if size else None


@dataclass(frozen=True)
class StateCount:
    """Model states per GPU of a named model: weights, gradients and Adam states (full
    fine-tuning) or frozen weights (LoRA), by ZeRO stage."""

    params: float  # parameters, from the model's name
    name: str  # the model name as given
    stage: int  # the ZeRO stage in use (0 without ZeRO)
    lora: bool  # adapters on frozen weights
    gpus: int | None  # GPUs counted in the paste (None: unknown)
    frozen: float  # bytes per frozen parameter (2; 0.5 / 1 when quantized)
    per_gpu: float  # bytes of model states per GPU (a lower bound when gpus is None)
    offload_optimizer: bool = False  # optimizer states (and fp32 master) on the CPU
    offload_param: bool = False  # parameters on the CPU too (ZeRO-3 only)
    # the ZeRO stage is no input's value (a DeepSpeed config named but not shown): why it is
    # taken as `stage`, with the key that sets it; None where an input gives the stage
    stage_assumed: str | None = None

    @property
    def zero3_per_gpu(self) -> float:
        """Per GPU under ZeRO-3 over the GPUs counted (one when none is)."""
        return self.params * (self.frozen if self.lora else 16) / (self.gpus or 1)


def model_state_count(ctx: Context) -> StateCount | None:
    """The model states per GPU when the paste names the model's size and says full
    fine-tuning or adapters (finetuning_type) or a ZeRO stage; else None (a guess). None
    where the config gives a model shape: the estimate counts the states exactly."""
    if ctx.estimate is not None:
        return None
    found = _model_params(ctx)
    stated = said(ctx)
    model = stated.get("model")  # a name a CJK character touches: "lora微调baichuan2-7b"
    if found is None and isinstance(model, dict):
        found = (float(model["params"]), str(model["name"]))
    if found is None:
        return None
    params, name = found
    stage = zero_stage(ctx)
    if (
        not ctx.cfg.get("finetuning_type")
        and not ctx.cfg.get("deepspeed")
        and stage is None
        and not stated.get("adapters")
        and not stated.get("offload_optimizer")
    ):
        return None  # full fine-tuning vs adapters unknown: the byte count would be a guess
    counted = _gpu_count(ctx)
    # GPU count unknown: the per-GPU bytes as if the shards were spread over many GPUs, a
    # lower bound (exact for what ZeRO leaves replicated)
    spread = counted or float("inf")
    lora = str(ctx.cfg.get("finetuning_type", "")).lower() in ("lora", "qlora")
    if not ctx.cfg.get("finetuning_type"):  # the command line's own flag wins over words
        lora = bool(stated.get("adapters"))  # --use_lora, "QLoRA" said in prose
    assumed = None
    if stage is None:
        named = ctx.cfg.get("deepspeed")
        by_reader = ((ctx.evidence.read or {}).get("config") or {}).get("zero_stage")
        if named and isinstance(by_reader, int):
            stage = by_reader  # the shared reader's assumption (DeepSpeed's default): one, not two
        else:  # DeepSpeed's (and Lightning's DeepSpeedStrategy's) usual stage is 2; optimizer
            # offload needs a ZeRO stage
            stage = 2 if named or stated.get("offload_optimizer") else 0
        if named or stated.get("offload_optimizer"):
            place = f"the DeepSpeed config {named}" if isinstance(named, str) else "no input"
            assumed = (
                f"ZeRO stage {stage} assumed: {place} was not shown, and its "
                "zero_optimization.stage sets it"
            )
    frozen = 2.0  # bytes per frozen (LoRA) parameter: bf16/fp16 weights
    bits = ctx.cfg.get("quantization_bit")
    if isinstance(bits, int) and bits in (4, 8):
        frozen = bits / 8
    elif ctx.cfg.get("load_in_4bit") is True:
        frozen = 0.5
    elif stated.get("quant_bits") in (4, 8):
        frozen = stated["quant_bits"] / 8
    offload_opt = bool(stated.get("offload_optimizer") or _cfg_offload(ctx, "offload_optimizer"))
    offload_param = stage == 3 and bool(
        stated.get("offload_param") or _cfg_offload(ctx, "offload_param")
    )
    sharded = spread if stage == 3 else 1
    if lora and frozen < 2:  # DeepSpeed ZeRO-3 leaves bitsandbytes 4/8-bit weights whole
        sharded = 1
    bytes_per_param = frozen / sharded if lora else ZERO_BYTES[stage](spread)
    if offload_opt and not lora:  # fp32 master and moments on the CPU: bf16 weights + grads
        bytes_per_param = (0 if offload_param else 2 / sharded) + (2 if stage < 2 else 2 / spread)
    return StateCount(
        params,
        name,
        stage,
        lora,
        counted,
        frozen,
        params * bytes_per_param,
        offload_opt,
        offload_param,
        assumed,
    )


def _cfg_offload(ctx: Context, key: str) -> bool:
    """An offload block in the config: zero_optimization.offload_optimizer.device cpu/nvme."""
    device = ctx.cfg.get(f"zero_optimization.{key}.device", ctx.cfg.get(f"{key}.device"))
    return str(device).lower() in ("cpu", "nvme")


def next_state_step(count: StateCount) -> tuple[dict, str, float]:
    """One step up the ladder from what the paste already uses (ZeRO-2 -> ZeRO-3 -> optimizer
    offload -> parameter offload -> LoRA): (patch, words, model states per GPU after it)."""
    p, n = count.params, count.gpus or 1
    zero: dict = {"stage": 3}
    if count.lora and count.frozen < 2:  # quantized: ZeRO-3 leaves them whole, FSDP shards
        return (
            {"fsdp": "full_shard auto_wrap", "fsdp_config": {"cpu_ram_efficient_loading": True}},
            f"FSDP + QLoRA over {n} GPU(s) shards the 4-bit weights (ZeRO-3 does not)",
            p * count.frozen / n,
        )
    if count.lora:
        if count.stage != 3:
            return (
                {"zero_optimization": zero},
                f"ZeRO-3 over {n} GPU(s) shards the frozen weights",
                p * count.frozen / n,
            )
        return ({"load_in_4bit": True}, "4-bit frozen weights (QLoRA)", p * 0.5 / n)
    if count.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if count.stage != 3:
        after = p * (4 if count.offload_optimizer else 16) / n
        return ({"zero_optimization": zero}, f"ZeRO-3 over {n} GPU(s)", after)
    if not count.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
        return ({"zero_optimization": zero}, "ZeRO-3 with optimizer offload to CPU", p * 4 / n)
    if not count.offload_param:
        zero["offload_param"] = {"device": "cpu"}
        return ({"zero_optimization": zero}, "ZeRO-3 with parameter offload to CPU too", 0.0)
    return ({"finetuning_type": "lora"}, "fewer trainable parameters (LoRA)", p * 2 / n)


@rule(
    "RK101",
    "Weights, gradients and Adam states of a model this size exceed the GPU",
    "model_state_memory",
    symptom="OOM fine-tuning a model whose size (from its name: 8B, 13B, 8x7B) times the "
    "bytes per parameter of its ZeRO stage is near or above the GPU's capacity",
    cause="Mixed-precision Adam keeps 16 bytes per parameter (bf16 weights and gradients, fp32 "
    "master and two moments); ZeRO-1/2 shard only the optimizer terms, ZeRO-3 all of them; "
    "LoRA keeps about 2 bytes per frozen parameter",
    confirm="params x bytes-per-param for the stage in use, against the GPU's total",
    fix="The smallest ZeRO stage that fits (ZeRO-3 shards everything over the GPUs), then CPU "
    "offload of optimizer states; activation recompute cannot free model states",
    patch={"zero_optimization": {"stage": 3}},
    supersedes=("RK005", "RK087", "RK010", "RK500"),
)
def _states_by_model_size(ctx: Context) -> Match | None:
    oom = bool(ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions"))
    count = model_state_count(ctx)
    if count is None:
        return None
    params, name, stage, lora = count.params, count.name, count.stage, count.lora
    counted, gpus, per_gpu = count.gpus, count.gpus or 1, count.per_gpu
    gpu = stated_gpu_bytes(ctx)
    shard = _state_sized_request(ctx, count)
    if gpu:
        if not oom or (per_gpu < 0.7 * gpu and not (shard and per_gpu >= 0.4 * gpu)):
            return None
    elif per_gpu < COMMON_GPU_BYTES:
        return None  # no GPU size given: only a count above any common GPU is conclusive
    if not counted and per_gpu < (gpu or COMMON_GPU_BYTES):
        return None  # the real per-GPU share is unknown and the lower bound fits
    z3 = count.zero3_per_gpu
    gpu = gpu or COMMON_GPU_BYTES
    if said(ctx) and (stage or count.lora or count.offload_optimizer):
        # settings stated in words: one step up from what the paste already uses
        patch, words, after = next_state_step(count)
        if after >= 0.7 * gpu and "offload" not in words and not count.lora:
            patch["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
            words += " with optimizer offload to CPU"
            after = params * 4 / gpus
        plan = f"next: {words}, about {gib(after)} of model states per GPU"
    elif z3 < 0.7 * gpu:
        patch = {"zero_optimization": {"stage": 3}}
        plan = f"ZeRO-3 over {gpus} GPU(s) brings them to {gib(z3)} per GPU"
    else:
        patch = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
        plan = f"even ZeRO-3 over {gpus} GPU(s) needs {gib(z3)}: offload the optimizer to CPU"
    kind = "LoRA (frozen weights)" if lora else f"full fine-tuning with ZeRO stage {stage}"
    if count.stage_assumed and not lora:
        kind += " (assumed)"
    if count.offload_optimizer and not lora:
        kind += " and the optimizer offloaded to CPU"
    if not lora and stage == 0:
        kind = "full fine-tuning without ZeRO (DDP replicates everything)"
    elif lora and count.frozen < 2:
        kind = f"{count.frozen * 8:.0f}-bit LoRA (quantized frozen weights, whole on every GPU)"
    elif lora and stage != 3:
        kind = "LoRA without ZeRO-3 (every GPU holds all frozen weights)"
    against = f"the {gib(gpu)} GPU" if stated_gpu_bytes(ctx) else f"the {gib(gpu)} of an A100/H100"
    shard_words = (
        f" The failed request ({shard}) is about one shard of the model states." if shard else ""
    )
    where, conf = f"on {gpus} GPU(s)", 0.9 if per_gpu >= gpu else 0.85
    if not counted:  # "over 1 GPU(s)" would be a count the paste does not give
        where = "(GPU count not in the paste)"
        plan = re.sub(r" over 1 GPU\(s\)", " over the run's GPUs", plan)
        plan = re.sub(r", about [\d.]+ [GMK]iB of model states per GPU$", "", plan)
    if not counted and not oom and not stated_gpu_bytes(ctx):
        conf = 0.6  # no OOM, no GPU, no GPU count in the paste: the model's size alone
        shard_words += (
            " The paste shows no OOM, no GPU and no GPU count: this is the model's size alone"
            " against an 80 GiB GPU, if the run uses one."
        )
    if count.stage_assumed:  # one assumption, said once, with the key that sets it
        assume(ctx, count.stage_assumed)
        shard_words += f" {count.stage_assumed}."
    return Match(
        conf,  # states alone above capacity: this leads
        f"{name} has {size_words(params, name, ctx)}; {kind} {where} keeps "
        f"about {gib(per_gpu)} of model states per GPU against {against}; {plan}."
        f"{shard_words}",
        config_patch=patch,
        fix=(
            "Quantized frozen weights do not fit: DeepSpeed ZeRO-3 leaves 4/8-bit weights whole "
            "on every GPU; FSDP + QLoRA shards them (fsdp full_shard with "
            "cpu_ram_efficient_loading), else a GPU with more memory; activation recompute "
            "cannot free model states"
        )
        if lora and count.frozen < 2
        else (
            "Frozen weights do not fit: shard them with DeepSpeed ZeRO-3 (zero_optimization."
            "stage 3) or FSDP, or keep them in 4-bit (QLoRA: load_in_4bit); activation "
            "recompute cannot free model states"
        )
        if lora
        else "Model states do not fit: shard them with DeepSpeed ZeRO-3 (zero_optimization."
        "stage 3) or FSDP, then CPU offload (offload_optimizer / offload_param), a distributed "
        "optimizer, or fewer trainable parameters (LoRA); activation recompute cannot free "
        "model states",
    )


def _state_sized_request(ctx: Context, count: StateCount) -> str | None:
    """The OOM's failed request is one model-state tensor: the parameters times 2 (bf16) or 4
    (fp32) bytes, whole or split over the GPUs (ZeRO's flat partitions), within 8% (a name's
    "7B" may be 6.7B). Said as a closeness with both numbers, never as an equality."""
    req = ctx.oom.requested_bytes if ctx.oom is not None else None
    if not req or not count.gpus:
        return None
    for nbytes, what in ((4, "fp32"), (2, "bf16/fp16")):
        for parts in {1, count.gpus}:
            tensor = count.params * nbytes / parts
            if abs(req - tensor) <= 0.08 * req:
                split = f" / {parts} GPUs" if parts > 1 else ""
                size = f"{count.params / 1e9:.3g}B"
                size += " (by its name)" if _by_name(count.name, ctx) else ""
                return f"{gib(req)} against {size} x {nbytes} bytes ({what}){split} = {gib(tensor)}"
    return None


# Adam's states as they appear in the frames or pasted source lines of an optimizer step:
# torch.optim's _init_group / _single_tensor_adam / _multi_tensor_adam, the state tensors
# themselves, DeepSpeed's and Apex's fused Adam, Megatron's optimizer step.
OPTIMIZER_STATE_WORDS = (
    "exp_avg_sq",
    "exp_avg",
    "_init_group",
    "_multi_tensor_adam",
    "_single_tensor_adam",
    "_fused_adam",
    "fused_adam",
    "initialize_optimizer_states",
    "torch/optim/",
    "optimizer/optimizer.py",
)


def _optimizer_state_hit(ctx: Context) -> str | None:
    """The optimizer word in the innermost frames of the OOM (a trainer that runs forward and
    backward inside optimizer.step(closure), as Lightning does, has optimizer frames further
    out), or in a pasted source line or call chain next to it."""
    pieces: list[str] = []
    for e in oom_errors(ctx):
        pieces += [*reversed(e.frames[-3:]), e.details or "", *e.context]
    if ctx.oom is not None:
        pieces += ctx.oom.context
    for piece in pieces:
        low = piece.lower()
        if any(w in low for w in OPTIMIZER_STATE_WORDS):
            piece = piece.strip().strip("`")
            if re.match(r"\S+\.py:\d+", piece):  # a frame: the file's name, not its folders
                piece = piece.rsplit("/", 1)[-1]
            return piece if len(piece) <= 120 else piece[:117] + "..."
    return None


@rule(
    "RK110",
    "The OOM happens in the optimizer step: optimizer states",
    "model_state_memory",
    symptom="The OOM traceback (or the pasted source line) is in optimizer.step: Adam's "
    "exp_avg / exp_avg_sq, torch.optim's _init_group, a fused Adam",
    cause="The first optimizer step allocates two fp32 moments per trainable parameter (plus "
    "fp32 master weights under mixed precision): 8-12 bytes per parameter on top of weights and "
    "gradients. Activations are already freed at this point, so recompute cannot help",
    confirm="The failing frame is the optimizer's; the OOM comes after the first backward, "
    "at the first step (or when resuming)",
    fix="Shard the optimizer states (ZeRO-1/2/3, Megatron's distributed optimizer, FSDP), "
    "offload them to CPU, use an 8-bit / paged AdamW, or train fewer parameters (LoRA)",
    patch={"zero_optimization": {"stage": 3}},
    supersedes=("RK036", "RK005", "RK087", "RK010"),
)
def _oom_in_optimizer_step(ctx: Context) -> Match | None:
    if not (ctx.oom or oom_errors(ctx)):
        return None
    hit = _optimizer_state_hit(ctx)
    if hit is None:
        return None
    oom = ctx.oom
    # the update's arithmetic (denom = exp_avg_sq.sqrt() ..., torch._foreach_sqrt): a temporary
    # of one moment's size, the states already there; else the states being created
    update = _UPDATE_MATH.search(hit) is not None and _STATE_INIT.search(hit) is None
    numbers = ""
    if oom is not None and oom.requested_bytes:
        numbers = f" The failed request is {gib(oom.requested_bytes)}"
        if oom.total_bytes and oom.allocated_bytes:
            numbers += (
                f" with {gib(oom.allocated_bytes)} of {gib(oom.total_bytes)} already allocated"
            )
        numbers += " - a temporary of the update." if update else " - one more state tensor."
    what = (
        "the update's arithmetic allocates a temporary of one moment's size beside the states "
        "already there"
        if update
        else "Adam's states are being allocated"
    )
    fused = (
        "a fused AdamW (optim: adamw_torch_fused; DeepSpeed's FusedAdam) makes no such "
        "temporaries; "
        if update
        else ""
    )
    patch, words = optimizer_shard_step(ctx)
    return Match(
        0.85,
        f"The OOM is raised in the optimizer step ('{hit}'): {what}.{numbers} Next: {words}.",
        config_patch=patch,
        fix=f"Optimizer states, not activations: {fused}{words}; else {OPTIMIZER_OFFLOAD}, an "
        "8-bit / paged AdamW (optim: paged_adamw_8bit) or LoRA. Recompute cannot free them",
    )


# A line of the update's arithmetic, not of the states' creation (torch/optim/adam.py)
_UPDATE_MATH = re.compile(r"denom|\.sqrt\(|_foreach_sqrt|addcdiv|_foreach_add|_foreach_div")
_STATE_INIT = re.compile(r"zeros_like|_init_group|torch\.zeros|initialize_optimizer_states|state\[")


# CPU offload of optimizer states under each framework's own key (one list for every rule
# that gives this advice, whichever framework the paste shows).
OPTIMIZER_OFFLOAD = (
    "CPU offload of the optimizer states (DeepSpeed: zero_optimization.offload_optimizer; "
    "FSDP: CPUOffload / offload_policy; Megatron: --optimizer-cpu-offload; verl: "
    "fsdp_config.optimizer_offload) or a per-layer optimizer step"
)


def optimizer_shard_step(ctx: Context) -> tuple[dict, str]:
    """The next step that shards (or offloads) optimizer states, under the framework's keys:
    (patch, words)."""
    stage = zero_stage(ctx)
    if is_megatron(ctx):
        return (
            {"use_distributed_optimizer": True},
            "Megatron's distributed optimizer (use_distributed_optimizer) shards them",
        )
    if stage == 3:
        return (
            {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
            "ZeRO-3 already shards them: offload the optimizer states to CPU",
        )
    if stage is not None or ctx.cfg.get("deepspeed"):
        nxt = min(3, (stage or 1) + 1)
        return (
            {"zero_optimization": {"stage": nxt}},
            f"ZeRO-{nxt} (zero_optimization.stage {nxt}) shards more of them",
        )
    return (
        {"zero_optimization": {"stage": 3}},
        "shard them: DeepSpeed ZeRO-3 (zero_optimization.stage 3) or FSDP",
    )


# Config keys that name how the model states are kept: with any of them the byte count is
# RK101's (or not a default reading at all).
# A DeepSpeed config named (`--deepspeed ds_config.json`) is ZeRO with its stage unread: RK101
# counts it, with the stage said as an assumption.
_STATE_KEY_WORDS = (
    "zero",
    "fsdp",
    "offload",
    "lora",
    "peft",
    "quant",
    "load_in_",
    "optim",
    "deepspeed",
)


def _trains(ctx: Context) -> bool:
    """Training keys in the config or command line (do_train, a train batch size)."""
    return any(
        k in ctx.cfg for k in ("do_train", "per_device_train_batch_size", "train_batch_size")
    )


@rule(
    "RK500",
    "Default reading: a named model size with mixed-precision Adam fills the GPU",
    "model_state_memory",
    symptom="An OOM on a GPU whose size is known (or, training with none named, states above "
    "an 80 GB GPU), a model size named (in a name or in words: "
    "'the little 1.3b', 'a 7B model'), and no ZeRO stage, offload, adapters or quantization "
    "named, where 16 bytes per parameter alone reach 80% of the GPU",
    cause="Full training with mixed-precision Adam keeps about 16 bytes per parameter (fp16/"
    "bf16 weights and gradients, fp32 master weights and two Adam moments) before any "
    "activation: a 1.3B model needs ~21 GB of model states",
    confirm="params x 16 bytes against the GPU's total; torch.cuda.memory_allocated() right "
    "after the first optimizer step (before the next forward)",
    fix="Shard or move the model states (weights, gradients, optimizer state): DeepSpeed "
    "ZeRO with optimizer offload to CPU "
    "(offload_optimizer) on one GPU, ZeRO-3 / FSDP over several, an 8-bit optimizer, or "
    "fewer trainable parameters (LoRA); activation recompute cannot free model states",
    patch={"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    supersedes=("RK005", "RK087", "RK102", "RK170"),
)
def _default_adam_states(ctx: Context) -> Match | None:
    if not (ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions")):
        return None
    if zero_stage(ctx) is not None or fact(ctx, "not_full_training"):
        return None  # states kept another way, or not training: 16 bytes/param is wrong
    said = fact(ctx, "settings_prose", "log")
    if isinstance(said, dict) and said.get("model_parallel"):
        return None  # split over pipeline / tensor ranks ("PP4", "each rank will hold 5B"):
        # the whole model's count is no rank's
    if any(w in str(k).lower() for k in ctx.cfg for w in _STATE_KEY_WORDS):
        return None
    found, gpu = _model_params(ctx), stated_gpu_bytes(ctx)
    if found is None:
        return None
    params, name = found
    states = params * 16
    stated = bool(gpu)
    if not gpu:
        # no GPU size given: conclusive only when the paste says it trains the model and the
        # states alone exceed the largest common GPU (any GPU it could have been), and names
        # no GPU larger than that (a B300 is no 80 GB card)
        if not (fact(ctx, "training_prose") or _trains(ctx)) or states < COMMON_GPU_BYTES:
            return None
        if fact(ctx, "gpu_unsized"):
            return None
        gpu = COMMON_GPU_BYTES
    if states < 0.8 * gpu:
        return None
    kept = params * 4  # weights and gradients stay on the GPU when the optimizer is offloaded
    if kept < 0.7 * gpu:
        patch = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
        plan = (
            f"with the optimizer offloaded to CPU about {gib(kept)} (weights and gradients) "
            "stays on the GPU"
        )
    else:
        patch = {
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "cpu"},
                "offload_param": {"device": "cpu"},
            }
        }
        plan = f"even weights and gradients take {gib(kept)}: ZeRO-3 with parameter offload"
    against = f"the {gib(gpu)} GPU" if stated else f"the {gib(gpu)} of an A100/H100 (no GPU named)"
    if is_megatron(ctx):  # Megatron's own keys: shard the optimizer state, split the model
        tp, words = tensor_parallel_patch(ctx, _gpu_count(ctx))
        patch = {"use_distributed_optimizer": True, **tp}
        plan = (
            "shard the optimizer state (--use-distributed-optimizer) and split the model "
            f"(--tensor-model-parallel-size / --pipeline-model-parallel-size): {words}"
        )
    fix = None
    if is_megatron(ctx):
        fix = (
            "Model states do not fit: shard the optimizer state with the distributed optimizer "
            "(--use-distributed-optimizer), raise --tensor-model-parallel-size / "
            "--pipeline-model-parallel-size, or --optimizer-cpu-offload; activation recompute "
            "cannot free model states"
        )
    return Match(
        0.65 if states >= gpu else 0.6,
        f"{name} has {size_words(params, name, ctx)}; assuming full training with "
        f"mixed-precision Adam (16 bytes per parameter; no ZeRO stage, offload or adapters "
        f"named), its model states alone take about {gib(states)} against "
        f"{against} ({states / gpu:.0%}) before any activation; {plan}.",
        config_patch=patch,
        fix=fix,
    )


@rule(
    "RK670",
    "ColossalAI Gemini with placement policy 'auto' / 'cuda' runs out of memory",
    "model_state_memory",
    symptom="An OOM (or 'got OOM' in words) with ColossalAI Gemini (GeminiDDP, GeminiPlugin, "
    "zero_model_wrapper) and placement_policy 'auto' or 'cuda'",
    cause="With 'cuda' Gemini keeps every parameter, gradient and optimizer chunk on the GPU; "
    "with 'auto' it moves chunks to the GPU by its estimate of the free margin, which "
    "under-counts activations and the allocator's cache, so model states crowd the GPU as "
    "the batch grows",
    confirm="The same run with placement_policy 'cpu' fits (it keeps model states in host "
    "memory and moves chunks in on demand)",
    fix="Use placement_policy='cpu' for large models (newer GeminiPlugin: "
    "placement_policy='static' with offload_optim_frac=1.0 and offload_param_frac=1.0), or "
    "lower the batch with 'auto'; activation recompute does not free model states",
    patch={"placement_policy": "cpu"},
    refs=("https://colossalai.org/docs/features/zero_with_chunk",),
    supersedes=("RK171", "RK005", "RK170", "RK102"),
)
def _gemini_placement(ctx: Context) -> Match | None:
    placed = fact(ctx, "gemini_placement")
    if not isinstance(placed, dict) or placed.get("policy") not in ("auto", "cuda"):
        return None
    said = fact(ctx, "oom_mentions") or []
    if not (ctx.oom or oom_errors(ctx) or said):
        return None
    policy = placed["policy"]
    return Match(
        0.7,
        f"The paste sets Gemini's placement policy '{policy}' (\"{placed['line'][:140]}\") "
        "and runs out of memory: "
        + (
            "'cuda' keeps all model states on the GPU."
            if policy == "cuda"
            else "'auto' moves model-state chunks onto the GPU by an estimate of the free "
            "margin that leaves too little for activations."
        ),
        config_patch={"placement_policy": "cpu"},
    )


@rule(
    "RK826",
    "prepare_model_for_kbit_training casts the 16-bit weights to fp32",
    "model_state_memory",
    symptom="An OOM (or a traceback) inside PEFT's prepare_model_for_kbit_training, at "
    "param.data.to(torch.float32)",
    cause="prepare_model_for_kbit_training upcasts every parameter that is not quantized to "
    "fp32 (for a k-bit model: norms, embeddings, the LM head; for a model loaded in 16 bits: "
    "all of it), doubling those weights' memory before training starts",
    confirm="torch.cuda.memory_allocated() before and after the call; the model's dtype after "
    "it is float32",
    fix="Call prepare_model_for_kbit_training only on a model loaded in 4 or 8 bits "
    "(BitsAndBytesConfig); for 16-bit LoRA skip it and use model.enable_input_require_grads() "
    "with gradient_checkpointing_enable(), loading with torch_dtype=torch.bfloat16",
    patch={"code": "model.enable_input_require_grads()  # not prepare_model_for_kbit_training"},
    refs=("https://github.com/huggingface/peft/issues/1149",),
    supersedes=("RK170", "RK087", "RK005", "RK500"),
)
def _kbit_upcast(ctx: Context) -> Match | None:
    frames = all_frames(ctx)
    if "prepare_model_for_kbit_training" not in frames:
        return None
    if not (ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions")):
        return None
    return Match(
        0.7,
        "The traceback is inside prepare_model_for_kbit_training (PEFT), which casts every "
        "parameter that is not quantized to fp32: the weights' memory doubles before the first "
        "step.",
    )
