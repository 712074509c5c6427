"""The sync-free MoE path: one grouped GEMM over stacked expert weights, offsets on the device.

* the grouped kernel and the per-expert loop give bitwise equal outputs and gradients (fp32,
  empty experts included), and the weight gradient accumulated into an existing .grad buffer
  equals the one autograd returns;
* nothing in an MoE layer's forward or backward (with every MoE recompute unit) calls an op that
  makes a CUDA device wait for the host: .item()/.tolist() (aten._local_scalar_dense), nonzero,
  boolean indexing, bincount and the other data-dependent output sizes (a dispatch-mode spy);
* torch.compile(fullgraph=True) of an MoE layer's forward and backward in bf16 succeeds and
  matches eager bitwise. (On torch 2.13 fullgraph alone is no sync proof: dynamo traces .tolist()
  and bincount into unbacked sizes without a graph break, hence the spy.)
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from recompute_kit.checkpoint import RecomputePolicy
from recompute_kit.config import parse_spec
from recompute_kit.layers import GPTModel
from recompute_kit.layers.moe import MoELayer, expert_offsets, grouped_matmul
from recompute_kit.presets import get_preset

MOE = get_preset("tiny-moe").config().model


def test_offsets_count_picks_per_expert_on_the_device():
    picks = torch.tensor([2, 0, 2, 2, 3, 0])  # expert 1 gets none
    assert expert_offsets(picks, 4).tolist() == [2, 2, 5, 6]
    assert expert_offsets(picks, 4).dtype == torch.int32


def _grouped_vs_loop(tokens, weight, offsets):
    results = []
    for grouped in (True, False):
        t = tokens.detach().requires_grad_()
        w = weight.detach().requires_grad_()
        out = grouped_matmul(t, w, offsets, grouped)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).view_as(out).sin())
        results.append((out, t.grad, w.grad))
    return results


def test_grouped_kernel_equals_the_loop_bitwise_with_an_empty_expert():
    torch.manual_seed(0)
    tokens, weight = torch.randn(37, 16), torch.randn(4, 16, 24)
    offsets = torch.tensor([10, 10, 30, 37], dtype=torch.int32)
    (out_g, dt_g, dw_g), (out_l, dt_l, dw_l) = _grouped_vs_loop(tokens, weight, offsets)
    assert torch.equal(out_g, out_l) and torch.equal(dt_g, dt_l) and torch.equal(dw_g, dw_l)
    assert torch.equal(dw_g[1], torch.zeros(16, 24))  # the expert without tokens
    reference = torch.cat(
        [tokens[0:10] @ weight[0], tokens[10:30] @ weight[2], tokens[30:] @ weight[3]]
    )
    assert torch.equal(out_g, reference)


def test_weight_grad_accumulates_into_an_existing_buffer():
    torch.manual_seed(1)
    tokens, weight = torch.randn(20, 8), torch.randn(3, 8, 12)
    offsets = torch.tensor([7, 12, 20], dtype=torch.int32)
    grad_out = torch.randn(20, 12)
    fresh = weight.detach().requires_grad_()
    grouped_matmul(tokens, fresh, offsets).backward(grad_out)
    buffered = weight.detach().requires_grad_()
    buffered.grad = torch.ones_like(weight)
    grouped_matmul(tokens, buffered, offsets).backward(grad_out)
    torch.testing.assert_close(buffered.grad, fresh.grad + 1, rtol=0, atol=1e-5)


def _layer_step(layer, x):
    x = x.detach().requires_grad_()
    out = layer(x)
    out.float().square().sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.mark.slow
def test_fullgraph_compile_of_moe_forward_and_backward_matches_eager_in_bf16():
    assert MOE.moe_aux_loss_coeff > 0  # the aux-loss counts are part of the graph too
    torch.manual_seed(0)
    layer = MoELayer(MOE, RecomputePolicy(parse_spec("none"))).to(torch.bfloat16).train()
    x = torch.randn(2, MOE.seq_length, MOE.hidden_size, dtype=torch.bfloat16)
    eager_out, eager_grads = _layer_step(layer, x)
    # aot_eager traces forward and backward into graphs (AOTAutograd) without a C++ toolchain;
    # fullgraph=True turns any graph break (a host sync) into an error.
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out, grads = _layer_step(compiled, x)
    assert torch.equal(out, eager_out)
    assert len(grads) == len(eager_grads)
    for got, expected in zip(grads, eager_grads, strict=True):
        assert torch.equal(got, expected)


# Ops whose output size or value the host must read back from the device.
HOST_SYNC_OPS = {
    "aten._local_scalar_dense",  # .item(), .tolist(), int(t)
    "aten.nonzero",
    "aten.masked_select",
    "aten.bincount",
    "aten._unique2",
    "aten.unique_consecutive",
    "aten.unique_dim",
    "aten.repeat_interleave.Tensor",
}


class _HostSyncSpy(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket) if func.overloadpacket else str(func)
        if name in HOST_SYNC_OPS or str(func) in HOST_SYNC_OPS:
            self.calls.append(str(func))
        if func.overloadpacket.__name__ == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None
        ):
            self.calls.append("boolean indexing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("spec", ["none", "selective:moe", "selective:moe_act,shared_experts"])
def test_moe_forward_and_backward_never_sync_with_the_host(spec, monkeypatch):
    cfg = get_preset("tiny-moe").config().replace(moe_layer_freq=1, num_layers=1)
    torch.manual_seed(0)
    model = GPTModel(cfg.with_recompute(spec))
    moe = model.decoder.layers[0].mlp
    x = torch.randn(2, cfg.model.seq_length, cfg.model.hidden_size, requires_grad=True)
    # On CPU .tolist()/.item() read memory without dispatching an op: count the calls too.
    reads = []
    for method in ("tolist", "item"):
        original = getattr(torch.Tensor, method)
        monkeypatch.setattr(
            torch.Tensor, method, lambda t, *a, _o=original, _m=method: reads.append(_m) or _o(t)
        )
    with _HostSyncSpy() as spy:
        moe(x).sum().backward()
    monkeypatch.undo()
    assert spy.calls == [] and reads == []
    # the spy sees what it must: the old dispatch's bincount and an .item()
    with _HostSyncSpy() as spy:
        torch.bincount(torch.tensor([0, 2]), minlength=3)
        torch.tensor([1]).sum().item()
    assert spy.calls == ["aten.bincount.default", "aten._local_scalar_dense.default"]
