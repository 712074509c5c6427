"""Recompute mechanisms and the one place that applies the recompute policy.

Two mechanisms, with Megatron-Core's semantics:

* `checkpoint(fn, *args)` - a normal checkpoint: runs `fn` without building a graph, saves only
  its tensor inputs, and re-runs `fn` in backward. RNG state (CPU and the inputs' device) is
  captured before the forward and replayed for the recompute, so dropout masks are bit-identical.
  Used for `core_attn`, `mlp`, `moe`, `shared_experts` and full-layer recompute.

* `OutputDiscardingCheckpoint` - Megatron's `CheckpointWithoutOutput`. A normal checkpoint still
  keeps its *output* alive, because the next op saves it for its own backward (the QKV linear
  saves the LayerNorm output). This one lets the consumer save the output, then frees the
  output's storage and refills it in backward, from a hook on a tensor whose gradient arrives
  before the consumer needs the output. Used for `layernorm`, `moe_act`, `mla_up_proj`.

Offloading (`offload_saved_tensors`) moves what a region saves for backward to pinned host
memory instead: layer-level `cpu_offloading` and module-level `offload_modules`.

`RecomputePolicy` turns a `RecomputeConfig` into those calls; layers ask it, never the config.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from .config import RecomputeConfig, full_recompute_chunks

# --------------------------------------------------------------------------------------------
# RNG capture and replay
# --------------------------------------------------------------------------------------------


class RNGSnapshot:
    """CPU RNG state plus the RNG state of every CUDA device the inputs live on."""

    def __init__(self, tensors: Sequence[Any]):
        self.cpu = torch.get_rng_state()
        self.cuda: dict[int, Tensor] = {}
        for t in tensors:
            if isinstance(t, Tensor) and t.is_cuda and t.device.index not in self.cuda:
                self.cuda[t.device.index] = torch.cuda.get_rng_state(t.device)

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the body with the captured states, then put the current states back."""
        with torch.random.fork_rng(devices=list(self.cuda), enabled=True):
            torch.set_rng_state(self.cpu)
            for index, state in self.cuda.items():
                torch.cuda.set_rng_state(state, index)
            yield


_recompute_depth = 0


@contextlib.contextmanager
def _recomputing() -> Iterator[None]:
    """Marks the re-run of a checkpointed function in backward (offloading stays off there)."""
    global _recompute_depth
    _recompute_depth += 1
    try:
        yield
    finally:
        _recompute_depth -= 1


def is_recomputing() -> bool:
    return _recompute_depth > 0


def _as_tuple(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _detached_inputs(args: Sequence[Any]) -> list[Any]:
    return [
        a.detach().requires_grad_(a.requires_grad) if isinstance(a, Tensor) else a for a in args
    ]


def _check_backward_not_grad() -> None:
    # Inside torch.autograd.grad() the recompute cannot route parameter gradients.
    if not torch.autograd._is_checkpoint_valid():
        raise RuntimeError(
            "Checkpointing is not compatible with .grad(), please use .backward() if possible"
        )


def _backward_through(outputs: Sequence[Any], grads: Sequence[Any]) -> None:
    pairs = [
        (o, g)
        for o, g in zip(outputs, grads, strict=True)
        if isinstance(o, Tensor) and o.requires_grad and g is not None
    ]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _input_grads(inputs: Sequence[Any]) -> tuple:
    return tuple(a.grad if isinstance(a, Tensor) and a.requires_grad else None for a in inputs)


# --------------------------------------------------------------------------------------------
# Normal checkpoint
# --------------------------------------------------------------------------------------------


class _StorageNotes:
    """The storages a recompute saved for backward (a saved-tensors pack hook), plus its
    inputs': the storages that must outlive the recompute's own outputs."""

    def __init__(self, inputs: Sequence[Any]):
        self.storages = {a.untyped_storage()._cdata for a in inputs if isinstance(a, Tensor)}

    def note(self, t: Tensor) -> Tensor:
        self.storages.add(t.untyped_storage()._cdata)
        return t

    def holds(self, t: Tensor) -> bool:
        return t.untyped_storage()._cdata in self.storages


class _CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_fn: Callable, *args: Any) -> Any:  # type: ignore[override]
        ctx.run_fn = run_fn
        ctx.rng = RNGSnapshot(args)
        ctx.tensor_index = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.args = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_index))
        with torch.no_grad():
            return run_fn(*args)

    @staticmethod
    def backward(ctx, *grads: Any) -> Any:  # type: ignore[override]
        _check_backward_not_grad()
        args = list(ctx.args)
        for i, t in zip(ctx.tensor_index, ctx.saved_tensors, strict=True):
            args[i] = t
        inputs = _detached_inputs(args)
        saved_by_recompute = _StorageNotes(inputs)
        with (
            ctx.rng.replay(),
            torch.enable_grad(),
            _recomputing(),
            torch.autograd.graph.saved_tensors_hooks(saved_by_recompute.note, lambda t: t),
        ):
            outputs = _as_tuple(ctx.run_fn(*inputs))
        # The recomputed outputs only serve as the roots of the backward below (autograd reads
        # their metadata, not their values): free their storage first unless the recomputed
        # graph saved it or it is an input's. torch.utils.checkpoint (non-reentrant) never keeps
        # them either; keeping them cost one output's bytes at the backward peak.
        for out in outputs:
            if isinstance(out, Tensor) and not saved_by_recompute.holds(out):
                out.untyped_storage().resize_(0)
        _backward_through(outputs, grads)
        return (None, *_input_grads(inputs))


def checkpoint(fn: Callable, *args: Any) -> Any:
    """Run `fn(*args)` keeping only the tensor inputs for backward; recompute in backward."""
    return _CheckpointFunction.apply(fn, *args)


# --------------------------------------------------------------------------------------------
# Output-discarding checkpoint (Megatron's CheckpointWithoutOutput)
# --------------------------------------------------------------------------------------------


class _DiscardingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner: OutputDiscardingCheckpoint, *args: Tensor) -> Any:  # type: ignore[override]
        ctx.owner = owner
        owner.ctx = ctx
        ctx.save_for_backward(*args)
        with torch.no_grad():
            return owner.fn(*args)

    @staticmethod
    def backward(ctx, *grads: Any) -> Any:  # type: ignore[override]
        _check_backward_not_grad()
        owner = ctx.owner
        if owner.recomputed is None:  # the hook did not fire (hook tensor outside the graph)
            owner.recompute()
        inputs, outputs = owner.recomputed
        owner.ctx = owner.recomputed = owner.outputs = None  # break the ctx <-> owner cycle
        _backward_through(outputs, grads)
        return (None, *_input_grads(inputs))


class OutputDiscardingCheckpoint:
    """Run a function, let its consumer save the output, free that output, refill it in backward.

    Usage (LayerNorm before the QKV projection)::

        ln = OutputDiscardingCheckpoint()
        y = ln.run(norm, x)              # y is consumed (and saved) by the next op
        out = attention(y)
        ln.discard_output_and_register_recompute(out)   # frees y's storage now

    The tensor given to `discard_output_and_register_recompute` must receive its gradient in
    backward before the consumer of `y` runs its backward.
    """

    def __init__(self) -> None:
        self.fn: Callable | None = None
        self.ctx: Any = None
        self.outputs: tuple | None = None
        self.recomputed: tuple | None = None

    def run(self, fn: Callable, *args: Tensor) -> Any:
        self.fn = fn
        self.rng = RNGSnapshot(args)
        out = _DiscardingFunction.apply(self, *args)
        self.outputs = _as_tuple(out)
        return out

    def discard_output_and_register_recompute(self, hook_tensor: Tensor) -> None:
        if self.outputs is None or not hook_tensor.requires_grad:
            return
        for out in self.outputs:
            out.untyped_storage().resize_(0)
        hook_tensor.register_hook(self._on_grad)

    def _on_grad(self, grad: Tensor) -> None:
        if self.recomputed is None and self.ctx is not None:
            self.recompute()

    def recompute(self) -> None:
        inputs = _detached_inputs(self.ctx.saved_tensors)
        saved_by_recompute: set[int] = set()

        def note(t: Tensor) -> Tensor:
            saved_by_recompute.add(t.untyped_storage()._cdata)
            return t

        with (
            self.rng.replay(),
            torch.enable_grad(),
            _recomputing(),
            torch.autograd.graph.saved_tensors_hooks(note, lambda t: t),
        ):
            fresh = _as_tuple(self.fn(*inputs))
        # Put the values back into the storage the consumers saved (their tensors see it
        # again), then free the fresh copy unless the recomputed graph itself saved it: its
        # tensors only serve as the roots of the backward below.
        for old, new in zip(self.outputs, fresh, strict=True):
            storage = old.untyped_storage()
            storage.resize_(new.untyped_storage().nbytes())
            storage.copy_(new.untyped_storage())
            if new.untyped_storage()._cdata not in saved_by_recompute:
                new.untyped_storage().resize_(0)
        self.recomputed = (inputs, fresh)


class _NoDiscard:
    """Stand-in when the module is not recomputed: runs the function, discards nothing."""

    def run(self, fn: Callable, *args: Tensor) -> Any:
        return fn(*args)

    def discard_output_and_register_recompute(self, hook_tensor: Tensor) -> None:
        pass


# --------------------------------------------------------------------------------------------
# Activation offloading
# --------------------------------------------------------------------------------------------


class OffloadLedger:
    """Bytes of saved activations sent to host memory in the last forward, per offload unit
    (on a CPU-only run: the bytes that would have left the device)."""

    def __init__(self) -> None:
        self.by_unit: dict[str, int] = {}

    @property
    def total_bytes(self) -> int:
        return sum(self.by_unit.values())

    def reset(self) -> None:
        self.by_unit.clear()

    def add(self, unit: str, nbytes: int) -> None:
        self.by_unit[unit] = self.by_unit.get(unit, 0) + nbytes


class _OnHost:
    """What autograd keeps instead of an offloaded tensor."""

    __slots__ = ("device", "host", "tensor")

    def __init__(self, device: torch.device, host: Tensor | None, tensor: Tensor | None):
        self.device, self.host, self.tensor = device, host, tensor


_offload_streams: dict[int, torch.cuda.Stream] = {}


def _is_weight(t: Tensor) -> bool:
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


@contextlib.contextmanager
def offload_saved_tensors(ledger: OffloadLedger, unit: str) -> Iterator[None]:
    """Send every activation saved for backward inside the block to pinned host memory.

    On CUDA the copy runs on a side stream (the allocator is told, via record_stream, not to
    reuse the GPU memory before the copy finished) and comes back on the current stream when
    backward unpacks it. On CPU nothing needs to move: the tensor stays and only its bytes are
    counted. Weights are never offloaded.
    """

    # A tensor saved twice (same view of the same storage) moves once. The storage is held by
    # a weak reference: once freed, its address may come back for a new tensor, which must not
    # be mistaken for the old one.
    moved: dict[tuple, tuple[weakref.ref, _OnHost]] = {}

    def pack(t: Tensor) -> Any:
        if _is_weight(t):
            return t
        storage = t.untyped_storage()
        key = (storage._cdata, t.storage_offset(), tuple(t.shape), t.stride())
        if key in moved and moved[key][0]() is storage:
            return moved[key][1]
        moved[key] = (weakref.ref(storage), _move_to_host(t))
        ledger.add(unit, t.numel() * t.element_size())
        return moved[key][1]

    def _move_to_host(t: Tensor) -> _OnHost:
        if not t.is_cuda:
            return _OnHost(t.device, None, t)
        stream = _offload_streams.setdefault(t.device.index, torch.cuda.Stream(t.device))
        stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(stream):
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
        t.record_stream(stream)
        return _OnHost(t.device, host, None)

    def unpack(saved: Any) -> Tensor:
        if isinstance(saved, Tensor):
            return saved
        if saved.tensor is not None:
            return saved.tensor
        torch.cuda.current_stream(saved.device).wait_stream(_offload_streams[saved.device.index])
        return saved.host.to(saved.device, non_blocking=True)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


# --------------------------------------------------------------------------------------------
# The recompute policy
# --------------------------------------------------------------------------------------------


class RecomputePolicy:
    """Decides, from a RecomputeConfig, which mechanism each module's activations get.

    Layers call `policy.checkpoint("core_attn", fn, *args)` or `policy.discarding("layernorm")`;
    the block calls `policy.full_recompute_chunks(n)`. Megatron's rules: selective modules act
    only with granularity 'selective'; full recompute supersedes them; normal checkpoints and full
    recompute act only in training mode.
    """

    def __init__(self, config: RecomputeConfig):
        self.config = config
        self.offloaded = OffloadLedger()

    def offload(self, module: str) -> contextlib.AbstractContextManager:
        """Fine-grained offloading of what `module` saves (offload_modules)."""
        rc = self.config
        if (
            rc.fine_grained_activation_offloading
            and module in rc.offload_modules
            and torch.is_grad_enabled()
            and not is_recomputing()
        ):
            return offload_saved_tensors(self.offloaded, module)
        return contextlib.nullcontext()

    def offload_layer(self, index: int) -> contextlib.AbstractContextManager:
        """Layer-level offloading (cpu_offloading) of the first cpu_offloading_num_layers."""
        rc = self.config
        if (
            rc.cpu_offloading
            and index < rc.cpu_offloading_num_layers
            and torch.is_grad_enabled()
            and not is_recomputing()
        ):
            return offload_saved_tensors(self.offloaded, f"layer {index}")
        return contextlib.nullcontext()

    def checkpoint(self, module: str, fn: Callable, *args: Any, training: bool = True) -> Any:
        if training and torch.is_grad_enabled() and self.config.selects(module):
            return checkpoint(fn, *args)
        return fn(*args)

    def discarding(self, module: str) -> OutputDiscardingCheckpoint | _NoDiscard:
        if torch.is_grad_enabled() and self.config.selects(module):
            return OutputDiscardingCheckpoint()
        return _NoDiscard()

    def full_recompute_chunks(
        self, num_layers: int, training: bool = True
    ) -> list[tuple[int, int, bool]]:
        """Split layers [0, num_layers) into (start, end, checkpointed) runs (see
        `config.full_recompute_chunks`); nothing is checkpointed without autograd."""
        return full_recompute_chunks(self.config, num_layers, training and torch.is_grad_enabled())
