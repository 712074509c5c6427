"""Measure the bytes a forward pass saves for backward.

`track_saved_tensors(model)` installs a saved-tensors hook for the duration of a forward pass and
records every tensor autograd keeps, attributed to the innermost module running when it was
saved. Sizes are counted per distinct storage (views and tensors saved twice count once),
parameters are excluded, and sizes are read when the context exits, so storage freed by an
output-discarding checkpoint during the forward counts as zero.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


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
        """Bytes saved inside each transformer layer, in layer order."""
        layers = {
            int(m.group(1)): n
            for key, n in self.top_level().items()
            if (m := re.search(r"\.layers\.(\d+)$", key))
        }
        return [layers[i] for i in sorted(layers)]


class _Tracker:
    def __init__(self, model: nn.Module):
        # Parameters and buffers (e.g. rotary tables) are model state, not activations.
        state = [*model.parameters(), *model.buffers()]
        self.param_storages = {t.untyped_storage()._cdata for t in state}
        self.module_names = [name for name, _ in model.named_modules()]
        self.stack: list[str] = []
        self.seen: dict[int, tuple[Tensor, str]] = {}

    def pack(self, tensor: Tensor) -> Tensor:
        try:
            key = tensor.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. fake)
            return tensor
        if key not in self.param_storages and key not in self.seen:
            self.seen[key] = (tensor, self.stack[-1] if self.stack else "")
        return tensor

    def pop(self, *_: object) -> None:  # a forward hook: must return None
        self.stack.pop()

    def result(self) -> SavedActivations:
        out = SavedActivations(by_module=dict.fromkeys(self.module_names, 0))
        for tensor, module in self.seen.values():
            nbytes = tensor.untyped_storage().nbytes()
            out.total_bytes += nbytes
            out.by_module[module] = out.by_module.get(module, 0) + nbytes
        self.seen.clear()  # do not keep the activations alive
        return out


@contextlib.contextmanager
def track_saved_tensors(model: nn.Module) -> Iterator[SavedActivations]:
    """Record what the forward passes run inside the block save for backward.

    The yielded object is filled in when the block exits::

        with track_saved_tensors(model) as saved:
            loss = model(tokens, labels)
        print(saved.total_bytes, saved.top_level())
    """
    tracker = _Tracker(model)
    handles = []
    for name, module in model.named_modules():
        handles.append(
            module.register_forward_pre_hook(lambda _m, _a, name=name: tracker.stack.append(name))
        )
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
