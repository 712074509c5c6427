"""Measure activation memory: what a forward saves for backward, per module, and the peak.

* `track_saved_tensors(model)` installs a saved-tensors hook for a forward pass and records every
  tensor autograd keeps, attributed to the innermost module running when it was saved. Sizes
  are counted per distinct storage (views and tensors saved twice count once), parameters and
  buffers are excluded, and sizes are read when the context exits, so storage freed by an
  output-discarding checkpoint during the forward counts as zero.
* `LiveTensorTracker` follows every storage created while it is active (a TorchDispatchMode) and
  records the peak of their live bytes: the activation peak of forward + backward on any device.
* `measure(config, spec)` runs one training step of a runnable model on CPU/CUDA; with
  `fake=True` it runs on the meta device (shapes only, nothing allocated), one layer of each
  kind, and scales the result to the whole model, so a 70B or 671B model is measured on a laptop.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..config import Config, ConfigError, full_recompute_chunks

# --------------------------------------------------------------------------------------------
# Saved-for-backward bytes, per module
# --------------------------------------------------------------------------------------------


@dataclass
class SavedActivations:
    """Saved-for-backward bytes of one forward pass."""

    total_bytes: int = 0
    # module path -> bytes, every module of the model listed ("" is the model itself)
    by_module: dict[str, int] = field(default_factory=dict)

    def by_prefix(self, prefix: str) -> int:
        """Bytes attributed to the module `prefix` and everything inside it."""
        return sum(
            n
            for name, n in self.by_module.items()
            if name == prefix or name.startswith(prefix + ".")
        )

    def top_level(self) -> dict[str, int]:
        """Bytes per top-level module, with each transformer layer reported on its own
        (`embedding`, `decoder`, `decoder.layers.0`, ..., `final_layernorm`, ...)."""
        out: dict[str, int] = {}
        for name, n in self.by_module.items():
            match = re.match(r"(.*?\.layers\.\d+)(\.|$)", name)
            key = match.group(1) if match else name.split(".")[0]
            if key or n:
                out[key or "<model>"] = out.get(key or "<model>", 0) + n
        return out

    def per_layer(self) -> list[int]:
        """Bytes saved inside each transformer layer, in layer order (the decoder's: the
        layers of Megatron's multi-token-prediction block, `mtp.layers.N`, are not)."""
        layers = {
            int(m.group(1)): n
            for key, n in self.top_level().items()
            if (m := re.search(r"\.layers\.(\d+)$", key)) and not key.startswith("mtp.")
        }
        return [layers[i] for i in sorted(layers)]

    def layer_roles(self, index: int) -> dict[str, int]:
        """Bytes of layer `index` per role (`core_attn`, `qkv`, `mlp`, `router`, ...)."""
        prefix = f"decoder.layers.{index}"
        out: dict[str, int] = {}
        for name, n in self.by_module.items():
            if name == prefix or name.startswith(prefix + "."):
                role = module_role(name[len(prefix) :])
                out[role] = out.get(role, 0) + n
        return out


# What each module's saves count as. Matched against the path inside a layer; the first rule
# that matches the longest suffix wins (so `mlp.shared_experts.linear_fc1` is shared_experts).
_ROLE_RULES = [
    (r"\.input_layernorm|\.pre_mlp_layernorm", "layernorm"),
    (r"\.self_attention\.core_attention", "core_attn"),
    (r"\.self_attention\.up_proj", "mla_up_proj"),
    (r"\.self_attention\.linear_proj", "proj"),
    (r"\.self_attention", "qkv"),
    (r"\.mlp\.router", "router"),
    (r"\.mlp\.experts\.activation", "moe_act"),
    (r"\.mlp\.experts", "experts"),
    (r"\.mlp\.shared_experts", "shared_experts"),
    (r"\.mlp", "mlp"),  # a dense MLP, or (MoELayer itself) dispatch indices / the moe unit
]


def module_role(path_in_layer: str) -> str:
    """Role of a module path inside a transformer layer ('' is the layer: dropout masks)."""
    for pattern, role in _ROLE_RULES:
        if re.match(pattern + r"(\.|$)", path_in_layer):
            return role
    return "residual"


class _SavedTensorTracker:
    def __init__(
        self, model: nn.Module, inputs: tuple[Tensor, ...] = (), device: str | None = None
    ):
        # Parameters and buffers (e.g. rotary tables) are model state, not activations; the
        # batch's own tensors (an attention mask) are inputs.
        state = [*model.parameters(), *model.buffers(), *inputs]
        self.state_storages = {t.untyped_storage()._cdata for t in state}
        self.module_names = [name for name, _ in model.named_modules()]
        self.stack: list[str] = []
        self.seen: dict[int, tuple[Tensor, str]] = {}
        self.device = device

    def pack(self, tensor: Tensor) -> Tensor:
        if self.device and tensor.device.type != self.device:
            return tensor  # a host tensor of a device run: not device memory
        key = tensor.untyped_storage()._cdata
        if key not in self.state_storages and key not in self.seen:
            self.seen[key] = (tensor, self.stack[-1] if self.stack else "")
        return tensor

    def push(self, name: str) -> None:
        self.stack.append(name)

    def pop(self, *_: object) -> None:  # a forward hook: must return None
        self.stack.pop()

    def result(self) -> SavedActivations:
        out = SavedActivations(by_module=dict.fromkeys(self.module_names, 0))
        for tensor, module in self.seen.values():
            nbytes = tensor.untyped_storage().nbytes()
            out.total_bytes += nbytes
            out.by_module[module] += nbytes
        self.seen.clear()  # do not keep the activations alive
        return out


@contextlib.contextmanager
def track_saved_tensors(
    model: nn.Module, inputs: tuple[Tensor, ...] = (), device: str | None = None
) -> Iterator[SavedActivations]:
    """Record what the forward passes run inside the block save for backward (with `device`,
    only tensors on that device type: a GPU or meta run's host tensors are not counted).

    The yielded object is filled in when the block exits::

        with track_saved_tensors(model) as saved:
            loss = model(tokens, labels)
        print(saved.total_bytes, saved.top_level())
    """
    tracker = _SavedTensorTracker(model, inputs, device)
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda *_, n=name: tracker.push(n)))
        handles.append(module.register_forward_hook(tracker.pop, always_call=True))
    result = SavedActivations()
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
            yield result
    finally:
        for handle in handles:
            handle.remove()
        measured = tracker.result()
        result.total_bytes, result.by_module = measured.total_bytes, measured.by_module


# --------------------------------------------------------------------------------------------
# Live bytes and their peak
# --------------------------------------------------------------------------------------------


class LiveTensorTracker(TorchDispatchMode):
    """Peak of the bytes of storages created while active and still alive.

    Every op's outputs are registered; a storage leaves when Python frees it. Sizes are re-read
    after each op, so storage an output-discarding checkpoint freed (resized to 0) or refilled
    counts as it is. Works on CPU, CUDA and meta tensors (meta storages report their size).
    """

    def __init__(self, exclude: nn.Module | None = None) -> None:
        super().__init__()
        self.live: dict[int, weakref.ref] = {}
        self.peak_bytes = 0
        # Model state (parameters, their gradients, buffers) is not activation memory.
        self.exclude = set()
        if exclude is not None:
            state = [*exclude.parameters(), *exclude.buffers()]
            state += [p.grad for p in exclude.parameters() if p.grad is not None]
            self.exclude = {t.untyped_storage()._cdata for t in state}

    @property
    def live_bytes(self) -> int:
        return sum(ref().nbytes() for ref in self.live.values() if ref() is not None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                self._register(t)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _register(self, t: Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.live and key not in self.exclude:
            self.live[key] = weakref.ref(storage, lambda _ref, k=key: self.live.pop(k, None))


# --------------------------------------------------------------------------------------------
# One training step, measured

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepResult:
    loss: Tensor
    grads: dict[str, Tensor]
    saved: SavedActivations
    offloaded_bytes: int


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "--device cuda was asked for but no CUDA GPU is visible; use --device cpu"
        )
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {device!r}; choose cpu, cuda or auto")
    return torch.device(device)


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}") from None


def make_batch(config: Config, device: torch.device, seed: int) -> tuple[Tensor, Tensor]:
    """Random tokens and next-token labels of the configured micro-batch and sequence length."""
    m = config.model
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, m.vocab_size, (m.micro_batch_size, m.seq_length + 1), generator=gen)
    return data[:, :-1].to(device), data[:, 1:].to(device)


def training_step(
    model: nn.Module,
    tokens: Tensor,
    labels: Tensor,
    seed: int,
    keep_grad_buffers: bool = False,
) -> StepResult:
    """One forward + backward with a fixed dropout seed; returns loss, grads and saved bytes.

    `keep_grad_buffers` (memory measurements) zeroes existing gradients in place instead of
    dropping them, so the step allocates no gradient buffers, and returns no gradient copies.
    """
    model.train()
    model.zero_grad(set_to_none=not keep_grad_buffers)
    torch.manual_seed(seed)
    with track_saved_tensors(model) as saved:
        loss = model(tokens, labels)
    loss.backward()
    grads = {
        name: p.grad.detach().clone()
        for name, p in model.named_parameters()
        if p.grad is not None and not keep_grad_buffers
    }
    return StepResult(loss.detach(), grads, saved, model.policy.offloaded.total_bytes)


@dataclass
class Measurement:
    recompute: str
    device: str  # cpu | cuda | meta (shape-only)
    per_layer_activation_bytes: float  # mean over layers, full-recompute layer inputs included
    activation_bytes: int  # saved for backward at the end of the forward, whole model
    peak_activation_bytes: int  # peak live bytes of forward + backward (model state excluded)
    modules: dict[str, float]  # role -> mean bytes per layer
    layers: list[int]  # bytes kept inside each layer
    offloaded_bytes: int = 0
    scaled_from_layers: int | None = None  # shape-only runs: layers actually run

    def to_json(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def _roles_mean(saved: SavedActivations, n_layers: int) -> dict[str, float]:
    modules: dict[str, float] = {}
    for i in range(n_layers):
        for role, value in saved.layer_roles(i).items():
            modules[role] = modules.get(role, 0.0) + value / n_layers
    stored = saved.by_module.get("decoder", 0)
    if stored:
        modules["layer_inputs"] = stored / n_layers
    return modules


def run_step(model: nn.Module, tokens: Tensor, labels: Tensor, seed: int = 0):
    """One forward + backward: (saved activations, peak live bytes, offloaded bytes)."""
    device = tokens.device
    cuda = device.type == "cuda"
    for p in model.parameters():  # gradients exist before: the peak counts activations only
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if cuda:
        # cuBLAS takes a workspace from the caching allocator at each thread's first matmul
        # (forward here, backward in autograd's device thread): take both before the peak is
        # reset, or the first step measured pays them (32 MiB each on an H100)
        dtype = next(model.parameters()).dtype
        warm = torch.ones(8, 8, device=device, dtype=dtype, requires_grad=True)
        (warm @ warm).sum().backward()
        del warm
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        step = training_step(model, tokens, labels, seed, keep_grad_buffers=True)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - start
    else:
        with LiveTensorTracker(model) as live:
            step = training_step(model, tokens, labels, seed, keep_grad_buffers=True)
        peak = live.peak_bytes
    return step.saved, peak, step.offloaded_bytes


def measure(config: Config, device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> Measurement:
    """Measure one training step of `config` (its recompute settings) on a real device."""
    from ..layers import GPTModel

    torch_device = resolve_device(device)
    torch.manual_seed(seed)
    model = GPTModel(config).to(torch_device, resolve_dtype(dtype))
    tokens, labels = make_batch(config, torch_device, seed)
    saved, peak, offloaded = run_step(model, tokens, labels, seed + 1)
    layers = saved.per_layer()
    n = len(layers)
    return Measurement(
        recompute=config.recompute.spec,
        device=torch_device.type,
        per_layer_activation_bytes=saved.by_prefix("decoder") / n,
        activation_bytes=saved.total_bytes,
        peak_activation_bytes=peak,
        modules=_roles_mean(saved, n),
        layers=layers,
        offloaded_bytes=offloaded,
    )


# --------------------------------------------------------------------------------------------
# Shape-only ("fake") measurement of full-size models
# --------------------------------------------------------------------------------------------


def _run_on_meta(config: Config, dtype: torch.dtype) -> tuple[SavedActivations, int]:
    """One step of `config` on the meta device: (saved activations, peak live bytes)."""
    from ..layers import GPTModel

    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)  # build the parameters directly in the training dtype
        with torch.device("meta"):
            model = GPTModel(config)
    finally:
        torch.set_default_dtype(default)
    m = config.model
    tokens = torch.zeros(m.micro_batch_size, m.seq_length, dtype=torch.long, device="meta")
    saved, peak, _ = run_step(model, tokens, tokens)
    return saved, peak


def measure_fake(config: Config, dtype: str | None = None) -> Measurement:
    """Measure a full-size model without allocating: each distinct layer kind runs once on the
    meta device and the whole model is composed from it.

    Saved bytes add up exactly (every layer of a kind keeps the same bytes). The peak is the
    whole model's saved bytes plus the backward transient measured on a reduced model: one
    layer per kind, or for full recompute the first checkpoint chunk's layers. MoE routing on
    meta tensors is perfectly balanced.
    """
    from .. import config as cfgmod

    m, rc = config.model, config.recompute
    torch_dtype = resolve_dtype(dtype or ("bf16" if m.bf16 else "fp32"))
    flags = [m.is_moe_layer(i) for i in range(m.num_layers)]
    kinds = sorted(set(flags))  # dense (False) first, then MoE (True)
    reduced_layers = len(kinds)
    reduced = config.replace(
        num_layers=reduced_layers,
        moe_layer_freq=[int(k) for k in kinds] if m.num_moe_experts else 1,
        cpu_offloading_num_layers=min(rc.cpu_offloading_num_layers, reduced_layers - 1),
    )

    # Per-kind layer bytes (under the selective part of the spec) and the edges.
    per_layer_spec = rc if rc.recompute_granularity != "full" else cfgmod.RecomputeConfig()
    saved, _ = _run_on_meta(reduced.with_recompute(per_layer_spec), torch_dtype)
    kind_bytes = dict(zip(kinds, saved.per_layer(), strict=True))
    kind_roles = {k: saved.layer_roles(i) for i, k in enumerate(kinds)}
    edges = saved.total_bytes - saved.by_prefix("decoder")

    # The backward transient, from the same spec on a reduced model. Full recompute: the first
    # chunk's layers (the largest rematerialisation) as one chunk.
    if rc.recompute_granularity == "full":
        n = rc.recompute_num_layers or 1
        chunk = min(n, m.num_layers) if rc.recompute_method == "uniform" else 1
        first = config.replace(
            num_layers=chunk,
            moe_layer_freq=[int(f) for f in flags[:chunk]] if m.num_moe_experts else 1,
        ).with_recompute(f"full:uniform:{chunk}")
        run_saved, run_peak = _run_on_meta(first, torch_dtype)
        layer_input = run_saved.by_module.get("decoder", 0)
        chunks = full_recompute_chunks(rc, m.num_layers)
    else:
        run_saved, run_peak = saved, _run_on_meta(reduced, torch_dtype)[1]
        layer_input, chunks = 0, [(0, m.num_layers, False)]
    transient = run_peak - run_saved.total_bytes

    layers = []
    for start, end, checkpointed in chunks:
        layers += [0 if checkpointed else kind_bytes[flags[i]] for i in range(start, end)]
    stored = layer_input * sum(1 for c in chunks if c[2])
    activation = edges + sum(layers) + stored
    modules: dict[str, float] = {}
    for start, end, checkpointed in chunks:
        for i in range(start, end):
            for role, value in kind_roles[flags[i]].items():
                add = 0.0 if checkpointed else value / m.num_layers
                modules[role] = modules.get(role, 0.0) + add
    if stored:
        modules["layer_inputs"] = stored / m.num_layers
    return Measurement(
        recompute=rc.spec,
        device="meta",
        per_layer_activation_bytes=(sum(layers) + stored) / m.num_layers,
        activation_bytes=round(activation),
        peak_activation_bytes=round(activation + transient),
        modules=modules,
        layers=layers,
        scaled_from_layers=reduced_layers,
    )
