"""The generic memory findings in the paste's own knobs.

An OOM with nothing more specific gets a generic finding: RK087 (activations are the first
lever), RK005 (PyTorch-allocated memory fills the GPU), RK004 (one allocation too large for the
device), RK102 (a small GPU). When the paste also sets memory knobs (a training command, a
config, a YAML block), their advice names those knobs with their values under the framework's
own keys (rules/knobs.py, as the default readings RK170/RK171 do), derives the config_patch
from them (halve `per_device_train_batch_size` and double `gradient_accumulation_steps`; the
framework's checkpointing key; Megatron's `recompute_granularity: selective`), and, where the
OOM message gives numbers, says how much the change frees against what the request lacked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..types import Context
from .fallback import batch_step, ckpt_step, seq_step
from .knobs import Knobs, read_knobs
from .registry import RULES, gib

RULE_IDS = ("RK004", "RK005", "RK087", "RK102")

# What activation checkpointing typically frees of the activations: every layer keeps only its
# input (Korthikanti et al. 2022: full recompute keeps 2sbh of ~34sbh + 5as^2b per layer);
# 60% is a conservative floor for the estimate.
CKPT_FREES = 0.6


@dataclass
class KnobAdvice:
    """What the paste sets, the steps in its keys, and the patch they add up to."""

    knobs: Knobs
    set_knobs: str  # "per_device_train_batch_size = 8; gradient_accumulation_steps = 2; ..."
    steps: list[str]  # cheapest first, each in the paste's keys with the new value
    patch: dict[str, Any] = field(default_factory=dict)
    frees: str = ""  # what the change frees against the failed request ("" without numbers)

    def fix(self, lead: str) -> str:
        """`lead` (a rule's fix text, or its id), then the steps numbered in the paste's keys."""
        if lead in RULE_IDS:
            lead = next(r.fix for r in RULES if r.id == lead)
        numbered = " ".join(f"{i}. {s}." for i, s in enumerate(self.steps, 1))
        return f"{lead}. In the paste's own keys: {numbered}"

    def says(self) -> str:
        """The sentences a finding's evidence adds: the knobs set, what the change frees."""
        return f" The paste sets {self.set_knobs}. {self.frees}".rstrip()


def set_knob_list(ctx: Context, k: Knobs) -> str:
    """Only what the paste sets, with values: nothing about what it leaves out."""
    parts = []
    if k.batch:
        parts.append(f"{k.batch[0]} = {k.batch[1]}")
    if k.accum:
        parts.append(f"{k.accum[0]} = {k.accum[1]}")
    parts += [f"{key} = {n}" for key, n in k.seq[:2]]
    if k.ckpt is not None and k.ckpt_key and k.ckpt_key in ctx.cfg:
        parts.append(f"{k.ckpt_key} = {ctx.cfg[k.ckpt_key]}")
    elif k.ckpt is not None:
        parts.append(f"{k.ckpt_key or 'activation checkpointing'} {'on' if k.ckpt else 'off'}")
    if k.zero is not None:
        parts.append(f"ZeRO stage {k.zero}")
    if k.dtype:
        parts.append(k.dtype)
    return "; ".join(parts)


def knob_advice(ctx: Context) -> KnobAdvice | None:
    """The activation-memory steps in the paste's keys, or None when the paste sets no batch,
    sequence or checkpointing knob (the rules then keep their generic patch)."""
    k = read_knobs(ctx)
    if not (k.batch or k.seq or k.ckpt is not None or k.ckpt_key):
        return None
    batch, ckpt, seq = batch_step(k), ckpt_step(ctx, k), seq_step(ctx, k)
    steps = [s for s in (batch, ckpt, seq) if s is not None]
    if not steps:
        return None
    # The patch: the batch halved (the global batch kept) and checkpointing turned on where it
    # is off - the two changes that need no new data or hardware; the sequence cap alone
    # when neither applies (halving it changes what the model sees).
    # A script's own checkpoint flag is unknown: its checkpointing step stays in the words.
    if ckpt is not None and not (k.ckpt_key or k.framework in ("hf", "llamafactory", "megatron")):
        ckpt_patch = None
    else:
        ckpt_patch = ckpt
    patch: dict[str, Any] = {}
    for step in (batch, ckpt_patch):
        if step is not None:
            patch.update(step[0])
    if not patch and seq is not None:
        patch = dict(seq[0])
    advice = KnobAdvice(k, set_knob_list(ctx, k), [w for _, w in steps], patch)
    advice.frees = _frees(ctx, k, batch, ckpt_patch, seq)
    return advice


def _frees(ctx: Context, k: Knobs, batch, ckpt, seq) -> str:
    """How much the patched change frees against what the failed request lacked."""
    oom = ctx.oom
    if oom is None or not oom.requested_bytes:
        return ""
    req = oom.requested_bytes
    lacking = req - oom.free_bytes if oom.free_bytes is not None else req
    if lacking <= 0:
        return ""
    held = oom.allocated_bytes
    need = (
        f"The OOM lacked {gib(lacking)} (the {gib(req)} request against {gib(oom.free_bytes)} free)"
        if oom.free_bytes is not None
        else f"The OOM lacked at least the {gib(req)} request (the message gives no free memory)"
    )
    if batch is not None or (ckpt is None and seq is not None):
        key, n = k.batch if batch is not None else k.seq[0]
        # Halving batch or tokens halves every activation, the failed request among them when
        # it is one: it frees half of the activations held and asks for half as much.
        enough = max(0, 2 * lacking - req)
        said = (
            f". Halving {key} ({n} -> {n // 2}) halves the activations that scale with it: the "
            "request becomes "
            f"about {gib(req / 2)} and half of the activations held are freed"
        )
        if enough == 0:
            said += f", and the halved request fits the {gib(oom.free_bytes)} free"
        elif held:
            said += (
                f", enough when activations are at least {gib(enough)} of the {gib(held)} "
                "PyTorch held"
            )
        if ckpt is not None:
            said += "; checkpointing on top frees most of the rest"
        return need + said + "."
    if ckpt is not None:
        said = (
            f". Activation checkpointing keeps only each layer's input, typically freeing "
            f"{CKPT_FREES:.0%} or more of the activations"
        )
        if held:
            said += (
                f": enough when activations are at least {gib(lacking / CKPT_FREES)} of the "
                f"{gib(held)} PyTorch held"
            )
        return need + said + "."
    return need + "."


def shrink_step(ctx: Context) -> tuple[dict[str, Any], str] | None:
    """RK004's generic branch in the paste's keys: the batch (or the sequence cap) that one
    oversized tensor scales with, halved as often as the request needs to fit."""
    oom, k = ctx.oom, read_knobs(ctx)
    if oom is None or not oom.requested_bytes:
        return None
    knob = k.batch if k.batch and k.batch[1] > 1 else (k.seq[0] if k.seq else None)
    if knob is None:
        return None
    key, n = knob
    req = oom.requested_bytes
    room = oom.free_bytes or oom.total_bytes
    halvings = max(1, math.ceil(math.log2(req / room))) if room and req > room else 1
    new = max(1, n >> halvings)
    patch: dict[str, Any] = {key: new}
    if knob == k.batch and k.accum is not None:
        patch[k.accum[0]] = k.accum[1] * (n // new)  # the global batch is kept
    words = (
        f"the tensor scales with {key} = {n}: {key} {n} -> {new} brings the {gib(req)} request "
        f"to about {gib(req * new / n)}"
    )
    if room:
        words += f" against {gib(room)} {'free' if oom.free_bytes else 'on the device'}"
    if n >> halvings == 0:
        words += f" (still too large at {key} 1: shrink the input or chunk the tensor too)"
    return patch, words
