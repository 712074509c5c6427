"""Prove that recompute does not change the math: one training step with and without each spec.

Same weights, same batch, same seed (dropout on): the loss and every parameter gradient of a
recompute run are compared with the no-recompute run, bitwise, and the saved-activation bytes
of both forwards are reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .config import (
    Config,
    ConfigError,
    RecomputeConfig,
    all_specs,
    format_spec,
    parse_spec,
)
from .layers import GPTModel
from .memory.measure import make_batch, resolve_device, resolve_dtype, training_step


@dataclass
class VerifyResult:
    recompute: str
    loss_match: bool  # loss bitwise equal to the no-recompute step
    grads_match: bool  # every parameter gradient bitwise equal
    max_grad_abs_diff: float
    loss: float
    baseline_loss: float
    saved_activation_bytes: int  # device-resident saved bytes
    baseline_saved_activation_bytes: int
    offloaded_bytes: int  # saved bytes sent to host (CPU run: that would have been sent)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def spec_notes(config: Config, rc: RecomputeConfig) -> list[str]:
    """What the kit wants the user to know about a spec on this model (no-ops, backends)."""
    notes = []
    m = config.model
    if rc.recompute_granularity == "selective":
        moe_layers = m.num_moe_layers
        if not moe_layers:
            notes += [
                f"'{mod}' has no effect: the model has no MoE layers"
                for mod in rc.modules
                if mod in ("moe", "moe_act", "shared_experts")
            ]
        if "mlp" in rc.modules and moe_layers:
            dense = m.num_layers - moe_layers
            notes.append(
                f"'mlp' is a no-op on the {moe_layers} MoE layers (as in Megatron); "
                + (
                    f"it acts on the {dense} dense layer(s) only"
                    if dense
                    else "no dense layer left"
                )
            )
        if (
            "shared_experts" in rc.modules
            and moe_layers
            and not (m.moe_shared_expert_intermediate_size)
        ):
            notes.append("'shared_experts' has no effect: the MoE layers have no shared experts")
        if "shared_experts" in rc.modules and "moe" in rc.modules:
            notes.append("'shared_experts' adds nothing under 'moe', which already covers them")
        if "core_attn" in rc.modules and m.attention_backend != "unfused":
            notes.append(
                f"'core_attn' with the {m.attention_backend} backend stores no s^2 tensors to "
                "save; expect little memory gain"
            )
    if rc.recompute_granularity == "full" and (rc.recompute_num_layers or 0) > m.num_layers:
        notes.append(
            f"recompute_num_layers {rc.recompute_num_layers} > num_layers {m.num_layers}: "
            "behaves like N = num_layers"
        )
    return notes


def verify(
    config: Config,
    specs: list[str] | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 1234,
) -> list[VerifyResult]:
    """Run the no-recompute step and one step per spec; compare losses and gradients."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    configs = []
    for spec in specs or all_specs(config):
        candidate = config.with_recompute(parse_spec(spec))
        try:
            candidate.validate()
        except ConfigError:
            if specs:  # asked for by name: say why it cannot run
                raise
            continue  # from the default list: skip what the offload settings rule out
        configs.append(candidate.recompute)

    torch.manual_seed(seed)
    # The baseline keeps everything on the device: no recompute, no offloading.
    baseline_config = Config(config.model, config.parallel, RecomputeConfig())
    model = GPTModel(baseline_config).to(torch_device, torch_dtype)
    tokens, labels = make_batch(config, torch_device, seed)
    baseline = training_step(model, tokens, labels, seed + 1)

    results = []
    for rc in configs:
        model.set_recompute(rc)
        step = training_step(model, tokens, labels, seed + 1)
        diffs = [
            (step.grads[name].float() - g.float()).abs().max().item()
            for name, g in baseline.grads.items()
        ]
        results.append(
            VerifyResult(
                recompute=format_spec(rc),
                loss_match=bool(torch.equal(step.loss, baseline.loss)),
                grads_match=step.grads.keys() == baseline.grads.keys()
                and all(torch.equal(step.grads[n], g) for n, g in baseline.grads.items()),
                max_grad_abs_diff=max(diffs, default=0.0),
                loss=step.loss.item(),
                baseline_loss=baseline.loss.item(),
                saved_activation_bytes=step.saved.total_bytes,
                baseline_saved_activation_bytes=baseline.saved.total_bytes,
                offloaded_bytes=step.offloaded_bytes,
                notes=spec_notes(config, rc),
            )
        )
    return results
