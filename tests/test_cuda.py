"""On a CUDA GPU: every dense spec in bf16 with the SDPA (flash) backend, and bitwise in fp32."""

import pytest

from recompute_kit.presets import get_preset
from recompute_kit.verify import all_specs, verify

pytestmark = pytest.mark.cuda

CFG = get_preset("tiny-gpt").config().replace(attention_backend="flash")


def test_fp32_every_spec_bitwise_on_cuda():
    for r in verify(CFG, all_specs(CFG), device="cuda", dtype="fp32"):
        assert r.loss_match and r.grads_match, r.recompute


def test_bf16_sdpa_every_spec_within_bf16_tolerance():
    for r in verify(CFG, all_specs(CFG), device="cuda", dtype="bf16"):
        assert abs(r.loss - r.baseline_loss) <= 1e-2 * abs(r.baseline_loss), r.recompute
        assert r.max_grad_abs_diff <= 1e-2, r.recompute
