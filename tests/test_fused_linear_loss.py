"""Liger's fused linear cross-entropy (Hugging Face Trainer use_liger_kernel, LLaMA-Factory
enable_liger_kernel): read, sized and offered as a lever.

The file: hiyouga/LLaMA-Factory @ ff6d4d12 examples/train_full/qwen3_full_sft.yaml
(tests/sources/corpus/hf_trainer, URL in its .expect.yaml) with `enable_liger_kernel: true`
added, as LLaMA-Factory's README says to ("Try `enable_liger_kernel: true`"). LLaMA-Factory
applies the fused loss for stages pt and sft only (src/llamafactory/model/loader.py,
require_logits). Sizes: liger_kernel/ops/fused_linear_cross_entropy.py keeps grad_input
[tokens, hidden] and grad_weight [vocab, hidden] from forward to backward, and computes the
logits in chunks of next_pow2(ceil(tokens / ceil(vocab / hidden))) rows."""

from __future__ import annotations

from pathlib import Path

from recompute_kit.memory.estimate import estimate
from recompute_kit.plan.levers import levers
from recompute_kit.sources.resolve import resolve

HERE = Path(__file__).parent / "sources" / "corpus"
YAML = HERE / "hf_trainer" / "qwen3_full_sft.yaml"
Z3 = str(HERE / "hf_trainer" / "ds_z3_config.json")
QWEN3 = str(HERE / "hf_config" / "Qwen--Qwen3-8B.config.json")


def _with(tmp_path, extra: str) -> str:
    path = tmp_path / "sft.yaml"
    path.write_text(YAML.read_text() + extra)
    return str(path)


def _config(path: str):
    return resolve([path, Z3, QWEN3], overrides={"data_parallel_size": 8}).config


def test_enable_liger_kernel_keeps_no_full_logits(tmp_path):
    plain = estimate(_config(str(YAML)))
    liger_cfg = _config(_with(tmp_path, "enable_liger_kernel: true\n"))
    assert liger_cfg.model.fused_linear_cross_entropy
    fused = estimate(liger_cfg)
    m = liger_cfg.model
    tokens, h, v = m.seq_length * m.micro_batch_size, m.hidden_size, m.vocab_size
    width = 2 if (m.bf16 or m.fp16) else 4
    assert fused.loss_saved_bytes == width * (tokens * h + v * h) + 4 * tokens
    rows = -(-tokens // -(-v // h))
    chunk = min(1 << (rows - 1).bit_length(), tokens)
    assert fused.loss_transient_bytes == width * chunk * v
    assert fused.fused_linear_loss and not plain.fused_linear_loss
    # the plain loss keeps an fp32 [tokens, vocab]; the fused one about a [tokens, hidden]
    assert plain.loss_saved_bytes > 4 * tokens * v
    assert fused.total_bytes < plain.total_bytes


def test_a_stage_that_needs_the_logits_keeps_the_plain_loss(tmp_path):
    path = _with(tmp_path, "enable_liger_kernel: true\n")
    Path(path).write_text(Path(path).read_text().replace("stage: sft", "stage: dpo"))
    r = resolve([path, Z3, QWEN3], overrides={"data_parallel_size": 8})
    assert not r.config.model.fused_linear_cross_entropy
    assert any("stage dpo" in w and "require_logits" in w for w in r.warnings)


def test_the_fused_loss_is_a_trainer_lever_in_the_frameworks_key():
    table = levers(_config(str(YAML)), 80, trainer_format="llama-factory")
    row = next(r for r in table.rows if r.lever == "fused loss")
    assert row.setting.startswith("enable_liger_kernel: true")
    assert row.estimate.total_bytes < table.current.estimate.total_bytes
