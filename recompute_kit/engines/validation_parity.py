"""Validation parity: generated configs through Megatron-Core's TransformerConfig and the kit.

`generate_configs(n, seed)` draws flat configs (Megatron's keys, as a config file holds them)
that exercise every recompute rule, valid and invalid: granularity/method/num_layers, module
subsets with invalid names and MoE/MLA modules on dense models, distributed saved activations
with and without SP/TP, layer CPU offloading with recompute and PP, fine-grained offloading,
fp8 with recompute, CUDA graphs with recompute and offloading, the deprecated
`moe_layer_recompute`, and layer counts against PP/VPP. Same seed, same configs.

`compare(configs)` gets both verdicts per config and sorts each into one category:

* `te_cuda`   - Megatron's outcome depends on Transformer Engine or CUDA (not counted);
* `version`   - the verdict differs between the installed Megatron-Core 0.16.1 and the newer
                Megatron-Core (v0.19) the kit follows for that rule (listed, not counted);
* `kit_only`  - a rule the kit adds because its layers cannot run the config (listed, not
                counted);
* `counted`   - everything else: verdicts must agree.

Messages are compared on the first line, exactly, except that a Python set printed inside a
message is compared as a set (Python prints sets in hash order, which differs between sets
built in a different order).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from ..config import OFFLOAD_MODULES, RECOMPUTE_MODULES
from ..config.validation import (
    MOE_ROUTER_GRAPH_MESSAGE,
    MOE_ROUTER_GRAPH_PRINTED,
    layer_shape_problem,
)
from .megatron_validation import Verdict, kit_config, kit_verdict, megatron_verdict

# Rules of the newer Megatron-Core that the kit follows (shared/reference/megatron-recompute.md
# section 1.2), absent from the installed 0.16.1:
# - rule 22 (v0.19): offloading moe_act/expert_fc1 while recomputing the whole MoE is an error;
# - rule 14 (v0.19): gdn_norm_out is an allowed module name, with its own error without GDN, so
#   the "Invalid choices" message lists it among the allowed modules.
VERSION_NOTES = {
    "rule22": "v0.19 rejects offloading moe_act/expert_fc1 with 'moe' recompute; 0.16.1 accepts",
    "gdn_norm_out": "v0.19 message (gdn_norm_out is a known module); 0.16.1: 'Invalid choices'",
    "allowed_set": "v0.19's allowed recompute_modules include gdn_norm_out",
    "rule22_first": "the kit stops at v0.19's rule 22; 0.16.1 has none and refuses later",
}

INVALID_MODULE_NAMES = ("attn", "moe_layer", "gdn_norm_out", "core_attention", "mlp ")
INVALID_OFFLOAD_NAMES = ("mlp", "router", "fc2")
CUDA_GRAPH_SCOPE_CHOICES = ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess")
FAMILIES = (
    "granularity",
    "modules",
    "distribute",
    "cpu_offload",
    "fine_grained",
    "fp8",
    "cuda_graph",
    "moe_layer_recompute",
    "pipeline_layers",
    "cross",
    "uneven_pipeline",
)


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


def _model(rng: random.Random, kind: str) -> dict[str, Any]:
    flat: dict[str, Any] = dict(
        num_layers=rng.choice((2, 4, 6, 8, 12)),
        hidden_size=64,
        num_attention_heads=8,
        num_query_groups=rng.choice((None, 2, 4, 8)),
        hidden_dropout=rng.choice((0.0, 0.1)),
        attention_dropout=rng.choice((0.0, 0.1)),
        add_bias_linear=rng.random() < 0.5,
        bf16=rng.random() < 0.5,
    )
    if kind == "moe":
        shared = rng.choice((None, 64))
        flat.update(
            num_moe_experts=4,
            moe_router_topk=2,
            moe_layer_freq=rng.choice((1, 2)),
            moe_grouped_gemm=rng.random() < 0.5,
            moe_shared_expert_intermediate_size=shared,
            moe_shared_expert_overlap=shared is not None and rng.random() < 0.5,
            add_bias_linear=False,  # MoE biases need ETP=1; not a recompute rule
        )
    if kind == "mla":
        flat.update(multi_latent_attention=True, q_lora_rank=rng.choice((None, 32)))
    return flat


def _parallel(rng: random.Random, kind: str) -> dict[str, Any]:
    tp = rng.choice((1, 1, 2, 4))
    pp = rng.choice((1, 1, 2, 4))
    flat: dict[str, Any] = dict(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=tp > 1 and rng.random() < 0.5,
    )
    if pp > 1 and rng.random() < 0.3:
        flat["virtual_pipeline_model_parallel_size"] = 2
    if kind == "moe" and rng.random() < 0.5:
        flat["expert_model_parallel_size"] = 2
    return flat


def _granularity(rng: random.Random, layers: int, pp: int) -> dict[str, Any]:
    granularity = rng.choice((None, "selective", "full", "full", "FULL", "block"))
    method = rng.choice((None, "uniform", "block", "chunk"))
    num = rng.choice((None, 1, 2, max(layers // pp, 1), layers, layers + 2))
    return dict(
        recompute_granularity=granularity, recompute_method=method, recompute_num_layers=num
    )


def _module_list(rng: random.Random, invalid: float = 0.15) -> list[str] | None:
    if rng.random() < 0.08:
        return rng.choice((None, []))
    modules = rng.sample(RECOMPUTE_MODULES, rng.randint(1, 3))
    if rng.random() < invalid:
        modules.append(rng.choice(INVALID_MODULE_NAMES))
    return modules


def _selective(rng: random.Random) -> dict[str, Any]:
    return dict(recompute_granularity="selective", recompute_modules=_module_list(rng))


def _any_recompute(rng: random.Random, layers: int) -> dict[str, Any]:
    return rng.choice(
        (
            dict(),
            _selective(rng),
            dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
            dict(
                recompute_granularity="full",
                recompute_method="block",
                recompute_num_layers=max(layers // 2, 1),
            ),
        )
    )


def _family(rng: random.Random, family: str, flat: dict[str, Any]) -> dict[str, Any]:
    layers, pp = flat["num_layers"], flat["pipeline_model_parallel_size"]
    if family == "granularity":
        return _granularity(rng, layers, pp)
    if family == "modules":
        if rng.random() < 0.2:  # shared experts, with and without overlap on MoE models
            return dict(recompute_granularity="selective", recompute_modules=["shared_experts"])
        return _selective(rng)
    if family == "distribute":
        tp = rng.choice((1, 2))
        return dict(
            distribute_saved_activations=True,
            tensor_model_parallel_size=tp,
            sequence_parallel=rng.random() < (0.5 if tp > 1 else 0.1),
            **rng.choice((_granularity(rng, layers, pp), _any_recompute(rng, layers))),
        )
    if family == "cpu_offload":
        return dict(
            cpu_offloading=True,
            cpu_offloading_num_layers=rng.choice((-1, 0, 1, layers - 1, layers)),
            pipeline_model_parallel_size=rng.choice((1, 1, 2)),
            virtual_pipeline_model_parallel_size=None,
            **rng.choice((dict(), _any_recompute(rng, layers))),
        )
    if family == "fine_grained":
        offload = rng.sample(OFFLOAD_MODULES, rng.randint(0, 3))
        if rng.random() < 0.15:
            offload.append(rng.choice(INVALID_OFFLOAD_NAMES))
        recompute = rng.choice(
            (
                dict(),
                _any_recompute(rng, layers),
                dict(recompute_granularity="selective", recompute_modules=["moe"]),
            )
        )
        if rng.random() < 0.15:  # with layer offloading, on a layout that allows it
            return dict(
                fine_grained_activation_offloading=True,
                offload_modules=offload,
                cpu_offloading=True,
                cpu_offloading_num_layers=1,
                pipeline_model_parallel_size=1,
                virtual_pipeline_model_parallel_size=None,
            )
        return dict(fine_grained_activation_offloading=True, offload_modules=offload, **recompute)
    if family == "fp8":
        modules = rng.sample(("layernorm", "moe_act", "core_attn", "mlp"), rng.randint(1, 2))
        return dict(
            fp8=rng.choice(("e4m3", "hybrid")),
            fp8_recipe=rng.choice(("delayed", "delayed", "tensorwise", "mxfp8", "blockwise")),
            recompute_granularity="selective",
            recompute_modules=modules,
        )
    if family == "cuda_graph":
        impl = rng.choice(("local", "transformer_engine", "transformer_engine", "te"))
        scope = rng.sample(CUDA_GRAPH_SCOPE_CHOICES, rng.choice((0, 1, 1, 2)))
        if rng.random() < 0.1:
            impl, scope = rng.choice(
                (
                    (impl, ["full"]),
                    (impl, ["full", "attn"]),
                    (impl, ["mamba"]),
                    (impl, ["bogus"]),
                )
            )
        if rng.random() < 0.6:  # the graph-vs-recompute-region rules
            modules = rng.sample(("core_attn", "mlp", "moe", "layernorm"), rng.randint(1, 2))
            recompute = dict(recompute_granularity="selective", recompute_modules=modules)
        elif rng.random() < 0.3:
            impl, scope = "local", ["full_iteration"]
            recompute = _any_recompute(rng, layers)
        else:
            recompute = _any_recompute(rng, layers)
        return dict(
            cuda_graph_impl=impl,
            cuda_graph_scope=scope,
            cpu_offloading=rng.random() < 0.15,
            cpu_offloading_num_layers=1,
            pipeline_model_parallel_size=1,
            virtual_pipeline_model_parallel_size=None,
            **recompute,
        )
    if family == "moe_layer_recompute":
        extra: dict[str, Any] = {}
        if rng.random() < 0.3:
            extra = dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router"])
        return dict(
            moe_layer_recompute=True,
            **rng.choice((dict(), _selective(rng), _granularity(rng, layers, pp))),
            **extra,
        )
    if family == "pipeline_layers":
        pp = rng.choice((1, 2, 3, 4, 8))
        return dict(
            num_layers=rng.choice((1, 3, 4, 6, 8, 16)),
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=rng.choice((None, 2, 4)) if pp > 1 else None,
            recompute_granularity="full",
            recompute_method=rng.choice(("uniform", "block")),
            recompute_num_layers=rng.choice((None, None, 1, 2, 0)),
        )
    if family == "cross":
        return dict(_model_axes(rng, flat), **_cross(rng, flat))
    if family == "uneven_pipeline":
        return _uneven_pipeline(rng)
    raise ValueError(f"unknown family {family!r}")


def _model_axes(rng: random.Random, flat: dict[str, Any]) -> dict[str, Any]:
    """Head, group and MoE/MLA shapes beyond the other families' fixed ones: uneven head
    sizes, GQA groups that do not divide the heads, top-1 and top-k above the expert count,
    moe_layer_freq lists, expert TP/EP, MoE biases, odd rotary widths."""
    out: dict[str, Any] = dict(
        hidden_size=rng.choice((64, 64, 96, 60)),
        num_attention_heads=rng.choice((4, 8, 8, 6)),
        num_query_groups=rng.choice((None, 1, 2, 3, 4, 8)),
    )
    if rng.random() < 0.25:
        out["kv_channels"] = rng.choice((8, 16))
    if flat.get("num_moe_experts"):
        out.update(
            num_moe_experts=rng.choice((1, 2, 4, 8)),
            moe_router_topk=rng.choice((1, 1, 1, 2, 4, 8)),
            moe_router_score_function=rng.choice(("softmax", "softmax", "sigmoid")),
            moe_layer_freq=rng.choice((1, 2, 3, [1, 0] * (flat["num_layers"] // 2), [0, 1])),
            add_bias_linear=rng.random() < 0.3,
            expert_model_parallel_size=rng.choice((1, 2, 4)),
            expert_tensor_parallel_size=rng.choice((None, 1, 2)),
        )
    if flat.get("multi_latent_attention"):
        out.update(
            kv_lora_rank=rng.choice((16, 32)),
            qk_head_dim=rng.choice((16, 32)),
            qk_pos_emb_head_dim=rng.choice((8, 16, 7)),
            v_head_dim=rng.choice((16, 32)),
        )
    return out


def _cross(rng: random.Random, flat: dict[str, Any]) -> dict[str, Any]:
    """Every axis drawn independently: recompute x fine-grained offloading x CUDA graphs x fp8
    x layer offloading x distributed activations, on the dense/MoE/MLA model already drawn."""
    layers, pp = flat["num_layers"], flat["pipeline_model_parallel_size"]
    out: dict[str, Any] = rng.choice(
        (
            dict(),
            _selective(rng),
            _any_recompute(rng, layers),
            _granularity(rng, layers, pp),
            dict(recompute_granularity="selective", recompute_modules=["moe"]),
            dict(moe_layer_recompute=True),
        )
    )
    if rng.random() < 0.5:
        offload = rng.sample(OFFLOAD_MODULES, rng.randint(1, 3))
        if rng.random() < 0.1:
            offload.append(rng.choice(INVALID_OFFLOAD_NAMES))
        out.update(fine_grained_activation_offloading=True, offload_modules=offload)
    if rng.random() < 0.5:
        out.update(
            cuda_graph_impl=rng.choice(("local", "transformer_engine")),
            cuda_graph_scope=rng.sample(CUDA_GRAPH_SCOPE_CHOICES, rng.choice((0, 1, 1, 2))),
        )
    if rng.random() < 0.25:
        out.update(
            fp8=rng.choice(("e4m3", "hybrid")),
            fp8_recipe=rng.choice(("delayed", "tensorwise", "mxfp8", "blockwise")),
        )
    if rng.random() < 0.1:
        out.update(cpu_offloading=True, cpu_offloading_num_layers=rng.choice((0, 1, layers)))
    if rng.random() < 0.15:
        out.update(distribute_saved_activations=True)
    return out


def _uneven_pipeline(rng: random.Random) -> dict[str, Any]:
    """Uneven first/last stages and the embedding/loss counted as a layer, with and without
    VPP, and full recompute whose recompute_num_layers is below, at and above the layers of a
    virtual chunk."""
    pp = rng.choice((2, 3, 4, 4))
    vpp = rng.choice((None, None, 2, 3))
    layers = rng.choice((4, 6, 7, 8, 10, 12, 14, 16))
    out: dict[str, Any] = dict(
        num_layers=layers,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
    )
    if rng.random() < 0.6:
        counts = (0, 1, 2, 3, 4, vpp or 1, 2 * (vpp or 1))  # multiples of VPP reach the middle
        if rng.random() < 0.7:
            out["num_layers_in_first_pipeline_stage"] = rng.choice(counts)
        if rng.random() < 0.7:
            out["num_layers_in_last_pipeline_stage"] = rng.choice(counts)
    if rng.random() < 0.5:
        out["account_for_embedding_in_pipeline_split"] = rng.random() < 0.7
        out["account_for_loss_in_pipeline_split"] = rng.random() < 0.7
    per_chunk = max(layers // (pp * (vpp or 1)), 1)
    if rng.random() < 0.7:
        out.update(
            recompute_granularity="full",
            recompute_method=rng.choice(("uniform", "block")),
            recompute_num_layers=rng.choice((1, per_chunk, per_chunk + 1, layers // pp, layers)),
        )
    else:
        out.update(_selective(rng))
    return out


def generate_configs(n: int = 1100, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """`n` named flat configs; family i % len(FAMILIES) for the i-th (all equally often)."""
    rng = random.Random(seed)
    configs = []
    for i in range(n):
        family = FAMILIES[i % len(FAMILIES)]
        kind = rng.choice(("dense", "dense", "moe", "mla"))
        flat = _model(rng, kind)
        flat.update(_parallel(rng, kind))
        flat.update(_family(rng, family, flat))
        configs.append((f"{i:04d}-{family}-{kind}", flat))
    return configs


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    flat: dict[str, Any]
    megatron: Verdict
    kit: Verdict
    category: str  # counted / te_cuda / version / kit_only
    note: str = ""

    @property
    def verdict_agrees(self) -> bool:
        return self.megatron.accepted == self.kit.accepted

    @property
    def message_agrees(self) -> bool:
        megatron = _canonical(self.megatron.message)
        if megatron == MOE_ROUTER_GRAPH_PRINTED:  # Megatron prints its own message cut
            megatron = MOE_ROUTER_GRAPH_MESSAGE
        return megatron == _canonical(self.kit.message)


@dataclass
class ParityReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def of(self, category: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.category == category]

    @property
    def counted(self) -> list[Outcome]:
        return self.of("counted")

    @property
    def verdict_agreement(self) -> float:
        return sum(o.verdict_agrees for o in self.counted) / max(len(self.counted), 1)

    @property
    def both_rejected(self) -> list[Outcome]:
        return [o for o in self.counted if not o.megatron.accepted and not o.kit.accepted]

    @property
    def message_agreement(self) -> float:
        """Exact first-line match among counted configs that both reject."""
        rejected = self.both_rejected
        return sum(o.message_agrees for o in rejected) / max(len(rejected), 1)

    @property
    def disagreements(self) -> list[Outcome]:
        return [o for o in self.counted if not o.verdict_agrees]

    @property
    def message_differences(self) -> list[Outcome]:
        return [o for o in self.both_rejected if not o.message_agrees]


_SET_LITERAL = re.compile(r"\{[^{}]*\}")


def _canonical(message: str | None) -> str | None:
    """The message with every printed set's elements sorted (hash order is not meaningful)."""
    if message is None:
        return None
    return _SET_LITERAL.sub(
        lambda match: "{" + ", ".join(sorted(match.group(0)[1:-1].split(", "))) + "}", message
    )


def _moe_recomputed(flat: dict[str, Any]) -> bool:
    """Whether 'moe' is in recompute_modules after Megatron's normalisation (rule 10, 18)."""
    granularity = flat.get("recompute_granularity")
    modules = flat.get("recompute_modules")
    modules = ["core_attn"] if modules is None else modules
    if flat.get("moe_layer_recompute"):
        return True
    return granularity == "selective" and "moe" in modules


def _offloads_inside_recomputed_moe(flat: dict[str, Any]) -> bool:
    """v0.19's rule 22: fine-grained offloading of moe_act/expert_fc1 while 'moe' is
    recomputed (0.16.1 accepts it)."""
    offload_inside_moe = {"moe_act", "expert_fc1"} & set(flat.get("offload_modules", []))
    return bool(
        flat.get("fine_grained_activation_offloading")
        and offload_inside_moe
        and _moe_recomputed(flat)
    )


def _category(flat: dict[str, Any], megatron: Verdict) -> tuple[str, str]:
    category, note = _rule_category(flat, megatron)
    if category == "counted" and megatron.accepted:
        problem = layer_shape_problem(kit_config(flat).model)
        if problem:
            # Megatron's TransformerConfig accepts the shape and fails (or computes something
            # else) only when it builds or runs the layers.
            return "kit_only", f"the kit's layers cannot run it: {problem}"
    return category, note


def _rule_category(flat: dict[str, Any], megatron: Verdict) -> tuple[str, str]:
    if megatron.depends_on:
        return "te_cuda", f"Megatron asks {megatron.depends_on}"
    if megatron.accepted and _offloads_inside_recomputed_moe(flat):
        return "version", VERSION_NOTES["rule22"]
    num = flat.get("recompute_num_layers")
    if (
        megatron.accepted
        and flat.get("recompute_granularity") == "full"
        and num is not None
        and num < 1
    ):
        # Megatron checks only for None; uniform with 0 layers per chunk never advances.
        return "kit_only", "recompute_num_layers < 1 with full recompute"
    return "counted", ""


def _invalid_modules(verdict: Verdict) -> bool:
    return (verdict.message or "").startswith("Invalid choices for recompute_modules")


def compare(configs: list[tuple[str, dict[str, Any]]]) -> ParityReport:
    report = ParityReport()
    for name, flat in configs:
        megatron = megatron_verdict(kit_config(flat))
        kit = kit_verdict(flat)
        category, note = _category(flat, megatron)
        rejected_by_both = not (megatron.accepted or kit.accepted)
        if category == "counted" and rejected_by_both and _invalid_modules(megatron):
            modules = flat.get("recompute_modules") or []
            note = VERSION_NOTES["gdn_norm_out" if "gdn_norm_out" in modules else "allowed_set"]
        elif category == "counted" and rejected_by_both and _offloads_inside_recomputed_moe(flat):
            note = VERSION_NOTES["rule22_first"]
        report.outcomes.append(Outcome(name, flat, megatron, kit, category, note))
    return report


def version_message_differences(report: ParityReport) -> list[Outcome]:
    """Counted configs whose message differs only because the kit quotes v0.19's message."""
    return [o for o in report.message_differences if o.note in VERSION_NOTES.values()]
