"""Megatron-Core's `TransformerConfig.__post_init__` rules for the kit's fields, in Megatron's
order and with its own messages."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields

from .model import (
    ATTENTION_BACKENDS,
    NORMALIZATIONS,
    OFFLOAD_MODULES,
    RECOMPUTE_MODULES,
    Config,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RecomputeConfig,
)
from .pipeline_layout import pipeline_layout
from .versions import held_beyond_estimate, ignored_settings, known_broken, parse_version

# Megatron's messages verbatim.
# Numbers refer to the rule list in shared/reference/megatron-recompute.md section 1.2.
# Checked against Megatron-Core 0.16.1 (tests/test_validation_parity.py); rules 14 (gdn_norm_out)
# and 22 (offloading inside a recomputed MoE) follow the newer v0.19.


def validate(cfg: Config, strict: bool = False, modules_given: bool = True) -> list[str]:
    m, p, r = cfg.model, cfg.parallel, cfg.recompute
    warnings: list[str] = []
    _check_types(cfg)
    _check_parallel_sizes(m, p)

    # Rules 1-3: layer-level CPU offloading.
    if r.cpu_offloading and (
        r.cpu_offloading_num_layers < 0 or r.cpu_offloading_num_layers >= m.num_layers
    ):
        raise ConfigError(f"CPU offloading can be done only for layers less than {m.num_layers}")
    if r.cpu_offloading and p.pipeline_model_parallel_size > 1:
        raise ConfigError(
            "Currently there is no support for Pipeline parallelism with CPU offloading"
        )
    if r.cpu_offloading and r.recompute_granularity is not None:
        raise ConfigError("CPU offloading does not work when activation recomputation is enabled")

    # Rules 4-9: granularity, method, num_layers.
    g = r.recompute_granularity
    if g is not None:
        if g not in ("full", "selective"):
            raise ConfigError(
                f'When using recompute_granuarlity: {g} must be "full"or "selective".'
            )
        if r.recompute_method is not None:
            if r.recompute_method not in ("block", "uniform"):
                raise ConfigError(
                    f'recompute_method: {r.recompute_method} must be "block" or "uniform".'
                )
        elif g != "selective":
            raise ConfigError(
                f'Using recompute_granularity: {g} so recompute_method must be "block" or "uniform"'
            )
        if g != "selective" and r.recompute_num_layers is None:
            raise ConfigError(
                f"When using recompute_granularity: {g} "
                "recompute_num_layers must be between "
                "1 and num_layers_per_pipeline_rank: "
                f"{m.num_layers // p.pipeline_model_parallel_size}"
            )
        if g == "selective" and r.recompute_num_layers is not None:
            raise ConfigError(
                f"When using recompute_granularity: {g} recompute_num_layers must be None."
            )
        if r.distribute_saved_activations and p.sequence_parallel:
            raise ConfigError(
                f"distribute_saved_activations: {r.distribute_saved_activations} must be "
                f"false when sequence parallel is enabled: {p.sequence_parallel}"
            )

    # (before rule 10 fills in the default; a default the reader filled in is not written)
    modules_as_written = r.recompute_modules if modules_given else None
    # Rule 10: the default module list.
    if r.recompute_modules is None:
        r.recompute_modules = ["core_attn"]

    # Rules 11-17: selective modules.
    if g == "selective":
        allowed = {*RECOMPUTE_MODULES, "gdn_norm_out"}
        invalid = set(r.recompute_modules) - allowed
        if r.recompute_modules and invalid:
            raise ConfigError(
                f"Invalid choices for recompute_modules: {invalid}. Allowed modules are: {allowed}"
            )
        mods = r.recompute_modules
        if "moe_act" in mods and not m.moe_grouped_gemm:
            raise ConfigError(
                "moe_act in recompute_modules is only supported with moe_grouped_gemm."
            )
        if "mla_up_proj" in mods and not m.multi_latent_attention:
            raise ConfigError(
                "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
            )
        if "gdn_norm_out" in mods:  # recompute-kit has no gated-delta-net attention
            raise ConfigError(
                "gdn_norm_out in recompute_modules is only supported with "
                "experimental_attention_variant='gdn' or 'gdn2'."
            )
        if "core_attn" in mods:
            warnings.append(
                "If you are using transformer_engine as the transformer implementation, "
                "the core_attn is from transformer_engine and may be the fused version. "
                "For fused attention, you have no need to set 'core_attn' to recompute. "
                "Please check that the core_attn recompute is really needed."
            )
        if (
            "shared_experts" in mods
            and m.moe_shared_expert_intermediate_size is not None
            and m.moe_shared_expert_overlap
        ):
            raise ConfigError(
                "shared_experts recompute cannot work with --moe-shared-expert-overlap."
            )
        if m.fp8 and ("moe_act" in mods or "layernorm" in mods) and m.fp8_recipe == "delayed":
            # Megatron also requires transformer-engine>=2.6.0dev0 here; the kit has no TE.
            raise ConfigError(
                "Delayed scaling does not support moe_act and layernorm recompute for fp8."
            )

    # Rule 18: the deprecated MoE flag. It comes after the module checks, so a name it adds is
    # never checked (Megatron's order).
    if r.moe_layer_recompute:
        warnings.append(
            "--moe-layer-recompute is deprecated. "
            "Use --recompute-granularity selective --recompute-modules moe_layer instead."
        )
        if g == "full":
            raise ConfigError("Do not set --moe-layer-recompute with full recompute granularity. ")
        r.recompute_granularity = g = "selective"
        if "moe" not in r.recompute_modules:
            r.recompute_modules.append("moe")

    # Rules 20-22: fine-grained activation offloading.
    if r.fine_grained_activation_offloading:
        if r.cpu_offloading:
            raise ConfigError(
                "fine_grained_activation_offloading cannot be enabled with cpu_offloading."
            )
        if not r.offload_modules:
            # Megatron: a bare `assert len(self.offload_modules) > 0`.
            raise ConfigError(
                "fine_grained_activation_offloading needs a non-empty offload_modules, "
                f"choose from {list(OFFLOAD_MODULES)}"
            )
        allowed_offload = set(OFFLOAD_MODULES)
        invalid = set(r.offload_modules) - allowed_offload
        if invalid:
            raise ConfigError(
                f"Invalid choices for offload_modules: {invalid}. "
                f"Allowed modules are: {allowed_offload}"
            )
        if "attn_proj" in r.offload_modules and "core_attn" not in r.offload_modules:
            raise ConfigError(
                "attn_proj cannot be set to offload_modules alone without core_attn because "
                "the input of attn_proj is the output of core_attn, which is needed in "
                "core_attn.backward()."
            )
        offload_inside_moe = [x for x in r.offload_modules if x in ("moe_act", "expert_fc1")]
        if g == "selective" and "moe" in r.recompute_modules and offload_inside_moe:
            raise ConfigError(
                f"Cannot offload {offload_inside_moe} while recomputing the entire MoE layer. "
                "'moe' in recompute_modules wraps the full MoE forward in a checkpoint, so "
                "offloading activations inside it is redundant and will cause errors. Either "
                "remove 'moe' from --recompute-modules or remove "
                f"{offload_inside_moe} from --offload-modules."
            )

    _check_pipeline_split(m.num_layers, p)
    if m.loss_implementation == "hf" and r.recompute_granularity == "selective":
        # transformers' gradient_checkpointing wraps whole decoder layers; no module sets
        raise ConfigError(
            "a Hugging Face model checkpoints whole decoder layers (gradient_checkpointing): "
            "selective recompute of modules is Megatron-Core's; use full:uniform:1 or none"
        )
    if m.num_moe_experts is not None and m.add_bias_linear and cfg.parallel.etp != 1:
        raise ConfigError("Bias in Moe is only supported when ETP==1")
    if (
        m.loss_implementation == "torchtitan"
        and p.expert_model_parallel_size > 1
        and p.etp not in (1, p.tensor_model_parallel_size)
    ):
        # torchtitan's own rule (distributed/parallel_dims.py _validate, v0.2.2)
        raise ConfigError("Currently we only support ETP=TP or ETP=1 (torchtitan)")
    if (
        m.num_moe_experts is not None
        and m.moe_router_topk == 1
        and m.moe_router_score_function == "softmax"
        and not m.moe_router_pre_softmax
        and m.moe_router_load_balancing_type != "sinkhorn"
    ):
        # A softmax over the one selected expert is 1 everywhere: its gradient is zero.
        raise ConfigError("Please use --moe-router-pre-softmax when topk is 1.")

    _check_ep_overlap(m, p, r)
    _check_cuda_graphs(m, r, parse_version(cfg.megatron_core_version))

    # Rules 26-28: only Megatron-LM's argument parser enforces these. Then the warnings of
    # config/versions.py: settings broken on the run's Megatron-Core version (unknown: the
    # strictest) and settings Megatron ignores.
    if strict:
        if r.distribute_saved_activations:
            if p.tensor_model_parallel_size <= 1:
                raise ConfigError(
                    "can distribute recomputed activations only across tensor model parallel groups"
                )
            if g != "full":
                raise ConfigError(
                    "distributed recompute activations is only application to full recompute "
                    "granularity"
                )
            if r.recompute_method is None:
                raise ConfigError(
                    "for distributed recompute activations to work you need to use a recompute "
                    "method "
                )
        if g == "selective" and r.recompute_method is not None:
            raise ConfigError(
                "recompute method is not yet supported for selective recomputing granularity"
            )
        if te_cross_entropy_refused(cfg):
            raise ConfigError(
                f"{TE_CROSS_ENTROPY_REFUSED} (Megatron-LM core_v0.19 and later; "
                "--megatron-core-version 0.18 or older allows it)"
            )
        # Not refused by Megatron, but broken on the run's version or not acted on as written.
        warnings += known_broken(cfg, parse_version(cfg.megatron_core_version))
        warnings += held_beyond_estimate(cfg, parse_version(cfg.megatron_core_version))
        warnings += ignored_settings(cfg, modules_as_written)

    # Not a Megatron rule, but the layers must be able to run the config.
    problem = layer_shape_problem(m)
    if problem:
        raise ConfigError(problem)
    if g == "full" and r.recompute_num_layers is not None and r.recompute_num_layers < 1:
        raise ConfigError(
            f"recompute_num_layers must be at least 1 for full recompute, got "
            f"{r.recompute_num_layers}"
        )
    # the layers each stage builds: Megatron-LM's arguments refuse layers that do not split
    # over the stages (arguments.py); Megatron-Core's TransformerConfig accepts them and fails
    # only when it builds the model (get_num_layers_to_build). Checked last, so that a pasted
    # recompute setting without its layer count is still checked above.
    try:
        pipeline_layout(m, p)
    except ConfigError as exc:
        if strict:
            raise
        warnings.append(f"{exc} (Megatron-LM refuses it; Megatron-Core when it builds the model)")
    return warnings


def batch_split_problem(cfg: Config) -> str | None:
    """The global batch splits into whole micro-batches per data-parallel rank: Megatron-Core's
    num_microbatches_calculator.py asserts it when training starts (Megatron-LM, Bridge and
    NeMo all start there; TransformerConfig does not check it). None when it splits or the
    global batch is not known."""
    m, p = cfg.model, cfg.parallel
    gbs, step = p.global_batch_size, m.micro_batch_size * p.data_parallel_size
    if gbs is None or step <= 0 or gbs % step == 0:
        return None
    return (
        f"global batch size ({gbs}) is not divisible by micro batch size "
        f"({m.micro_batch_size}) times data parallel size ({p.data_parallel_size})"
    )


# Megatron-LM's arguments.py from core_v0.19.0 (PR #5115, #5162): TE's fused cross-entropy is
# refused on its command line (Megatron-Core itself, which Bridge runs, accepts it)
TE_CROSS_ENTROPY_REFUSED = (
    "Transformer Engine cross entropy loss fusion is disabled due to stability issues. "
    "Use --cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion."
)
TE_CROSS_ENTROPY_FROM = (0, 19)


def te_cross_entropy_refused(cfg: Config) -> bool:
    """Megatron-LM (0.19 or later, or a version not known: the strictest) refuses it."""
    m = cfg.model
    if not (m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl == "te"):
        return False
    version = parse_version(cfg.megatron_core_version)
    return version is None or version >= TE_CROSS_ENTROPY_FROM


def _check_types(cfg: Config) -> None:
    """Reject values of the wrong type with a one-line message naming the key."""
    for section in (cfg.model, cfg.parallel, cfg.recompute):
        for f in fields(section):
            value = getattr(section, f.name)
            expected = f.type if isinstance(f.type, str) else str(f.type)
            if expected == "int | list[int]":  # moe_layer_freq: checked with the MoE shapes
                continue
            if value is None:
                if "None" not in expected:
                    raise ConfigError(f"{f.name} must not be null")
                continue
            if expected.startswith("int") and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise ConfigError(f"{f.name} must be an integer, got {value!r}")
            if expected.startswith("float") and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise ConfigError(f"{f.name} must be a number, got {value!r}")
            if expected == "bool" and not isinstance(value, bool):
                raise ConfigError(f"{f.name} must be true or false, got {value!r}")
            if expected.startswith("str") and not isinstance(value, str):
                raise ConfigError(f"{f.name} must be a string, got {value!r}")
            if expected.startswith("list") and not isinstance(value, list):
                raise ConfigError(f"{f.name} must be a list, got {value!r}")


def _check_parallel_sizes(m: ModelConfig, p: ParallelConfig) -> None:
    """The rules Megatron checks before any recompute rule (ModelParallelConfig first)."""
    if p.sequence_parallel and p.tensor_model_parallel_size <= 1:
        raise ConfigError("Cannot use sequence parallelism without tensor parallelism")
    if m.fp16 and m.bf16:
        raise ConfigError(f"Only one of self.fp16: {m.fp16} and self.bf16 {m.bf16} should be True.")
    tp = p.tensor_model_parallel_size
    if tp >= 1 and m.num_attention_heads % tp:
        raise ConfigError(
            f"num_attention_heads ({m.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})."
        )
    if tp >= 1 and m.kv_groups >= 1 and m.kv_groups % tp and tp % m.kv_groups:
        raise ConfigError(
            f"num_query_groups ({m.kv_groups}) must be a multiple or divisor of "
            f"tensor_model_parallel_size ({tp})."
        )
    if p.expert_model_parallel_size > 1 and m.num_moe_experts is None:
        raise ConfigError("num_moe_experts must be non None to use expert-parallel.")


CUDA_GRAPH_SCOPES = (
    "full_iteration",
    "attn",
    "mlp",
    "moe",
    "moe_router",
    "moe_preprocess",
    "mamba",
)


def _check_ep_overlap(m: ModelConfig, p: ParallelConfig, r: RecomputeConfig) -> None:
    """Megatron-Core 0.16.1's overlap_moe_expert_parallel_comm rules (TransformerConfig
    __post_init__; Megatron-Bridge's comm_overlap.py asserts the same at setup), in its order.
    Its torch >= 2.6 and MTP rules are not the kit's to check."""
    if not m.overlap_moe_expert_parallel_comm:
        return
    if p.pipeline_model_parallel_size > 1 and p.virtual_pipeline_model_parallel_size is None:
        raise ConfigError(
            "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be "
            "specified when pipeline_model_parallel_size > 1"
        )
    rules = (
        (
            p.expert_model_parallel_size > 1,
            "overlap_moe_expert_parallel_comm is only supported with expert model parallelism",
        ),
        (
            m.moe_token_dispatcher_type in ("alltoall", "flex"),
            "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher",
        ),
        (
            r.recompute_granularity != "full",
            "disable full recomputation when enabling overlap_moe_expert_parallel_comm",
        ),
        (
            r.recompute_method is None,
            "disable recomputation method when enabling overlap_moe_expert_parallel_comm",
        ),
        (
            r.recompute_num_layers is None,
            "recompute_num_layers must be None when enabling overlap_moe_expert_parallel_comm",
        ),
        (
            m.bf16 or m.fp16,
            "overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model",
        ),
        (
            not m.moe_shared_expert_overlap,
            "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm",
        ),
    )
    for holds, message in rules:
        if not holds:
            raise ConfigError(message)
    scope = set(m.cuda_graph_scope)
    if m.cuda_graph_impl != "none" and (
        m.cuda_graph_impl != "transformer_engine" or scope & {"moe", "mlp"}
    ):
        raise ConfigError(
            "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm"
        )


# Megatron-Core 0.18 takes cuda_graph_impl "full_iteration" (transformer_config.py: the whole
# training iteration, cuda_graph_scope empty); before it the same graph is impl "local" with
# scope "full_iteration", and "full_iteration" as an impl is refused.
FULL_ITERATION_IMPL_VERSION = (0, 18)


def _check_cuda_graphs(
    m: ModelConfig, r: RecomputeConfig, version: tuple[int, int] | None = None
) -> None:
    """Megatron-Core 0.16.1's cuda_graph_impl/cuda_graph_scope rules, recompute and offloading
    included, and 0.18's cuda_graph_impl "full_iteration" (where the version is 0.18 or later,
    or unknown: Megatron-Bridge's recipes write it). The kit has no capacity factor or input
    jitter: Megatron's defaults (None) apply."""
    scope = list(m.cuda_graph_scope)
    if m.cuda_graph_impl == "full_iteration":
        if version is not None and version < FULL_ITERATION_IMPL_VERSION:
            raise ConfigError(
                "Invalid cuda graph implementation: full_iteration (Megatron-Core "
                f"{version[0]}.{version[1]} spells it cuda_graph_impl local with "
                "cuda_graph_scope full_iteration; 0.18 takes cuda_graph_impl full_iteration)"
            )
        if [s for s in scope if s not in ("full_iteration", "full")]:  # ("full": deprecated,
            # the whole layer, migrated to an empty list)
            raise ConfigError(  # 0.18's message, its cuda_graph_modules being the scope
                'cuda_graph_modules must be empty when cuda_graph_impl="full_iteration". '
                "(cuda_graph_scope here: the graph is the whole training iteration)"
            )
        m = dataclasses.replace(m, cuda_graph_impl="local", cuda_graph_scope=["full_iteration"])
        scope = ["full_iteration"]
    if "full" in scope:  # the deprecated spelling of "the whole layer" (an empty list)
        if scope != ["full"]:
            raise ConfigError("full scope cannot be used with other scopes.")
        scope = []
    unknown = [s for s in scope if s not in CUDA_GRAPH_SCOPES]
    if unknown:
        # Megatron: a bare KeyError from CudaGraphScope[name].
        raise ConfigError(
            f"unknown cuda_graph_scope {unknown[0]!r}; choose from {list(CUDA_GRAPH_SCOPES)}"
        )
    impl = m.cuda_graph_impl
    if impl == "none":
        return
    if impl not in ("transformer_engine", "local"):
        raise ConfigError(f"Invalid cuda graph implementation: {impl}")
    if r.cpu_offloading:
        raise ConfigError("CUDA graphs not supported with CPU offloading.")
    if impl == "local" and ("moe_router" in scope or "moe_preprocess" in scope):
        scope += [s for s in ("moe_router", "moe_preprocess") if s not in scope]
    if impl == "transformer_engine" and "full_iteration" in scope:
        raise ConfigError(
            "To use full iteration cuda graph, please use "
            "cuda_graph_impl=local instead of cuda_graph_impl=transformer_engine."
        )
    if "moe" in scope and "moe_router" in scope:
        raise ConfigError("cuda_graph_scope must not contain both moe and moe_router.")
    if "moe_preprocess" in scope and "moe_router" not in scope:
        raise ConfigError("moe_preprocess cuda graph is only supported with moe_router cuda graph.")
    if m.num_moe_experts is None or m.num_moe_experts <= 1:
        if "moe" in scope or "moe_router" in scope:
            raise ConfigError("moe cuda graph is only supported for MoE.")
    else:
        freq = m.moe_layer_freq
        if (freq == 1 or (isinstance(freq, list) and 0 not in freq)) and "mlp" in scope:
            raise ConfigError(
                "mlp cuda graph is only supported for dense layers, but not found in the model."
            )
        if "moe" in scope:
            raise ConfigError("moe cuda graph is only supported with drop-padding MoE.")
    g, mods = r.recompute_granularity, r.recompute_modules or []
    if not g:
        return
    if g != "selective":
        if scope != ["full_iteration"]:
            raise ConfigError("full recompute is only supported with full iteration CUDA graph.")
        return
    # A recompute region must lie wholly inside or outside a graph, and a graphed recompute
    # cannot draw random numbers (dropout).
    if impl == "transformer_engine" and "moe" in mods and "moe_router" in scope:
        # Megatron's message as its source writes it: the assert's second string literal
        # ("--cuda-graph-impl transformer_engine.") is a statement of its own there
        # (transformer_config.py:1792-1795 in 0.16.1), so Megatron prints the text cut after
        # "with: "; the kit says it whole.
        raise ConfigError(MOE_ROUTER_GRAPH_MESSAGE)
    whole = not scope or "full_iteration" in scope
    if m.attention_dropout != 0.0 and "core_attn" in mods and (whole or "attn" in scope):
        raise ConfigError(
            "attention dropout is not supported with graphed attention recomputation."
        )
    if m.hidden_dropout != 0.0 and (
        ("mlp" in mods and (whole or "mlp" in scope))
        or ("moe" in mods and (whole or "moe" in scope))
    ):
        raise ConfigError("hidden dropout is not supported with graphed MLP/MoE recomputation.")


# Megatron-Core 0.16.1 transformer_config.py:1792-1795, its assert's two string literals whole
# (Megatron prints the first alone: MOE_ROUTER_GRAPH_PRINTED).
MOE_ROUTER_GRAPH_MESSAGE = (
    "moe recompute is not supported with moe_router CUDA graph with: "
    "--cuda-graph-impl transformer_engine."
)
MOE_ROUTER_GRAPH_PRINTED = "moe recompute is not supported with moe_router CUDA graph with: "


def _check_pipeline_split(num_layers: int, p: ParallelConfig) -> None:
    """Megatron-Core 0.16.1's checks of uneven first/last pipeline stages and of the embedding
    or loss counted as a layer, with and without VPP (its messages verbatim, missing spaces
    included). Megatron checks the total against the pipeline size only through these
    settings: an even split of num_layers is left to Megatron-LM's argument parser."""
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    embedding, loss = (
        p.account_for_embedding_in_pipeline_split,
        p.account_for_loss_in_pipeline_split,
    )
    vpp = p.virtual_pipeline_model_parallel_size
    if (first is not None or last is not None) and (embedding or loss):
        raise ConfigError(
            "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be"
            "set at the same time with account_for_embedding_in_pipeline_split"
            "and account_for_loss_in_pipeline_split"
        )
    if p.pipeline_model_parallel_layout is not None:
        # (embedding/loss with uneven stages was refused above, so only these can conflict)
        if first is not None or last is not None or embedding or loss:
            raise ConfigError(
                "pipeline_model_parallel_layout cannot be set with other pipeline layout "
                f"arguments. self.num_layers_in_first_pipeline_stage={first!r}, "
                f"self.num_layers_in_last_pipeline_stage={last!r}, "
                f"self.account_for_embedding_in_pipeline_split={embedding!r}, "
                f"self.account_for_loss_in_pipeline_split={loss!r}."
            )
        return
    if first is not None or last is not None:
        _check_uneven_stages(num_layers, p.pipeline_model_parallel_size, first, last, vpp)
    elif embedding or loss:
        layers = num_layers + embedding + loss
        pp = p.pipeline_model_parallel_size
        if vpp is None:
            if layers % pp:
                raise ConfigError(
                    f"number of middle layers: {layers} must be divisible by "
                    f"middle pipeline_model_parallel_size {pp}"
                )
            return
        if layers % pp:
            raise ConfigError(
                f"num_layers: {layers} after enableaccount_for_embedding_in_pipeline_split or "
                "account_for_loss_in_pipeline_split must be divisibleby "
                f"pipeline_model_parallel_size {pp}"
            )
        if (layers // pp) % vpp:
            raise ConfigError(
                f"number of layers on each pipeline rank: {layers // pp}(after enable "
                "account_for_embedding_in_pipeline_split or account_for_loss_in_pipeline_split) "
                f"must be divisible byvirtual_pipeline_model_parallel_size{vpp}"
            )


def _check_uneven_stages(
    layers: int, stages: int, first: int | None, last: int | None, vpp: int | None
) -> None:
    for where, count in (("first", first), ("last", last)):
        if count is None:
            continue
        if count <= 0:
            raise ConfigError(f"num_layers_in_{where}_pipeline_stage must be larger than 0")
        if vpp is not None and count % vpp:
            raise ConfigError(
                f"number of layers at {where} stage: {count}must be divisible by virtual "
                f"pipelineparallel degree {vpp}"
            )
        layers -= count
        stages -= 1
    if bool(layers) != bool(stages):
        raise ConfigError(
            f"Mismatch: {layers} middle layers remaining but {stages} middle PP stages available."
        )
    if stages and layers % stages:
        raise ConfigError(
            f"number of layers at middle stage: {layers} must be divisible bythe middle "
            f"pipeline model parallel size {stages}"
        )
    if stages and vpp is not None and (layers // stages) % vpp:
        raise ConfigError(
            f"number of layers on each middle pipeline rank:{layers // stages} must be "
            f"divisible by virtualpipeline parallel degree {vpp}"
        )


def layer_shape_problem(m: ModelConfig) -> str | None:
    """Why the kit's layers cannot run the model's shapes (not Megatron-Core rules: its
    TransformerConfig accepts these and fails later, or never runs them), or None."""
    try:
        _check_shapes(m)
    except ConfigError as exc:
        return str(exc)
    return None


def _check_shapes(m: ModelConfig) -> None:
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "micro_batch_size",
        "vocab_size",
    ):
        if getattr(m, key) < 1:
            raise ConfigError(f"{key} must be positive, got {getattr(m, key)}")
    # Attention sizes come from kv_channels when it is set (Megatron's and the layers'
    # head_dim), and MLA's from its own head dims; it has no query groups either.
    mla = m.multi_latent_attention
    if not mla and m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise ConfigError(
            f"hidden_size ({m.hidden_size}) must be divisible by num_attention_heads "
            f"({m.num_attention_heads})"
        )
    if not mla and m.num_attention_heads % m.kv_groups:
        raise ConfigError(
            f"num_attention_heads ({m.num_attention_heads}) must be divisible by "
            f"num_query_groups ({m.kv_groups})"
        )
    if m.normalization not in NORMALIZATIONS:
        raise ConfigError(
            f"normalization must be one of {list(NORMALIZATIONS)}, got {m.normalization!r}"
        )
    if m.attention_backend not in ATTENTION_BACKENDS:
        raise ConfigError(
            f"attention_backend must be one of {list(ATTENTION_BACKENDS)}, got "
            f"{m.attention_backend!r}"
        )
    for key in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= getattr(m, key) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {getattr(m, key)}")
    if m.num_moe_experts:
        if not 1 <= m.moe_router_topk <= m.num_moe_experts:
            raise ConfigError(
                f"moe_router_topk ({m.moe_router_topk}) must be between 1 and num_moe_experts "
                f"({m.num_moe_experts})"
            )
        if m.moe_router_score_function not in ("softmax", "sigmoid"):
            raise ConfigError(
                "moe_router_score_function must be 'softmax' or 'sigmoid', got "
                f"{m.moe_router_score_function!r}"
            )
        freq = m.moe_layer_freq
        if isinstance(freq, list):
            if len(freq) != m.num_layers or any(x not in (0, 1) for x in freq):
                raise ConfigError(
                    f"moe_layer_freq as a list needs one 0/1 entry per layer ({m.num_layers}), "
                    f"got {freq}"
                )
        elif isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
            raise ConfigError(
                f"moe_layer_freq must be a positive integer or a 0/1 list, got {freq!r}"
            )
    if m.multi_latent_attention:
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if getattr(m, key) < 1:
                raise ConfigError(f"{key} must be positive for multi_latent_attention")
        if m.qk_pos_emb_head_dim % 2:
            raise ConfigError(
                f"qk_pos_emb_head_dim ({m.qk_pos_emb_head_dim}) must be even (rotary pairs)"
            )


def expert_layout_problem(tp: int, cp: int, dp: int, ep: int, etp: int) -> str | None:
    """Megatron's expert layout (parallel_state): the TP x CP x DP ranks of a pipeline stage
    regroup as expert-TP x EP x expert-DP, so EP x expert-TP must divide them. Every command
    refuses a layout that breaks it with this line."""
    if (tp * cp * dp) % (ep * etp):
        least = ep * etp // math.gcd(tp * cp, ep * etp)  # the smallest DP the layout divides
        return (
            f"EP {ep} x expert TP {etp} does not divide the {tp * cp * dp} ranks of TP {tp} x "
            f"CP {cp} x DP {dp} in each pipeline stage; the world the job ran on says its DP "
            f"(--dp, the notebook's dp): a multiple of {least}"
        )
    return None


def check_expert_layout(cfg: Config) -> None:
    """`expert_layout_problem` for a Config with experts (raises ConfigError)."""
    p = cfg.parallel
    # (experts that EP does not divide get Megatron's own message from validation)
    if cfg.model.num_moe_experts and not cfg.model.num_moe_experts % p.expert_model_parallel_size:
        problem = expert_layout_problem(
            p.tensor_model_parallel_size,
            p.context_parallel_size,
            p.data_parallel_size,
            p.expert_model_parallel_size,
            p.etp,
        )
        if problem:
            raise ConfigError(problem)
