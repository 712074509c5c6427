"""On a CUDA GPU: every spec in bf16 with the SDPA (flash) backend, bitwise in fp32, and
offloading that really moves saved activations to pinned host memory."""

import pytest
import torch

from recompute_kit.presets import get_preset
from recompute_kit.verify import all_specs, verify

pytestmark = pytest.mark.cuda

PRESETS = ["tiny-gpt", "tiny-moe", "tiny-mla"]


def flash(name):
    return get_preset(name).config().replace(attention_backend="flash")


@pytest.mark.parametrize("name", PRESETS)
def test_fp32_every_spec_bitwise_on_cuda(name):
    cfg = flash(name)
    for r in verify(cfg, all_specs(cfg), device="cuda", dtype="fp32"):
        assert r.loss_match and r.grads_match, r.recompute


@pytest.mark.parametrize("name", PRESETS)
def test_bf16_sdpa_every_spec_within_bf16_tolerance(name):
    cfg = flash(name)
    for r in verify(cfg, all_specs(cfg), device="cuda", dtype="bf16"):
        assert abs(r.loss - r.baseline_loss) <= 1e-2 * abs(r.baseline_loss), r.recompute
        assert r.max_grad_abs_diff <= 1e-2, r.recompute


def test_cpu_offloading_moves_to_pinned_host_memory_on_cuda():
    cfg = flash("tiny-moe").replace(cpu_offloading=True, cpu_offloading_num_layers=2)
    [r] = verify(cfg, ["none"], device="cuda", dtype="bf16")
    assert r.loss_match and r.grads_match
    assert r.offloaded_bytes > 0
    assert r.saved_activation_bytes + r.offloaded_bytes == r.baseline_saved_activation_bytes
    torch.cuda.synchronize()
