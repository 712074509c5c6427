"""The next tensor-parallel size worth suggesting, or why there is none.

Advice such as "TP 8 -> 16" must be a layout Megatron runs and a change at all:

* Megatron-Core's rules (the kit's `Config.validate`, which mirrors them): num_attention_heads a
  multiple of TP, num_query_groups a multiple or a divisor of it, and the shapes the estimator
  splits (the MLP's width, experts) dividing too;
* within the GPUs the run has: TP x PP x CP divides the world size (data parallel takes the
  rest), so the step needs no new GPUs;
* within one node: TP's all-reduces run every layer, on NVLink inside a node (8 GPUs on DGX /
  HGX machines); beyond it they cross the inter-node network, so TP stops at a node and the
  next lever is pipeline parallelism or sharding the optimizer state;
* above the current value: a suggestion equal to the current one is no suggestion.

Without a Config (a pasted command line) only the rules the paste gives numbers for are
checked, and the step says which it could not check.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import GPUS_PER_NODE, Config, ConfigError
from ..memory.estimate import estimate


@dataclass(frozen=True)
class TensorParallelStep:
    current: int
    value: int | None  # the next TP size; None: there is none worth suggesting
    why: str  # why this value, or why none
    gpus: int | None = None  # the run's GPUs, when known
    gpus_needed: int | None = None  # more GPUs than the run has, data parallel kept (or None)

    @property
    def words(self) -> str:
        if self.value is None:
            return f"no larger tensor parallelism: {self.why}"
        more = f" on {self.gpus_needed} GPUs instead of {self.gpus}" if self.gpus_needed else ""
        return f"tensor_model_parallel_size {self.current} -> {self.value}{more} ({self.why})"


def next_tensor_parallel(
    config: Config | None = None,
    *,
    current: int | None = None,
    heads: int | None = None,
    query_groups: int | None = None,
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    more_gpus: bool = False,
    world_known: bool = True,
) -> TensorParallelStep:
    """The smallest TP above the current one that Megatron accepts for this model and that the
    run's GPUs hold, up to one node. With `config` its shape and layout decide (`gpus`, when
    given, is the world size); else `current`, `heads`, `query_groups` and `gpus` as known.
    `more_gpus`: where the run's GPUs hold no larger TP, the smallest that more GPUs would
    (data parallel kept), with the GPUs it needs. `world_known=False`: the config's data-
    parallel size is an assumption, so its world size bounds nothing (one node does)."""
    gpus_per_node = gpus_per_node or (
        config.parallel.gpus_per_node if config is not None else None
    ) or GPUS_PER_NODE
    if config is not None:
        p = config.parallel
        current = p.tensor_model_parallel_size
        others = p.pipeline_model_parallel_size * p.context_parallel_size
        world = gpus or (current * others * p.data_parallel_size if world_known else None)
    else:
        current, others, world = current or 1, 1, gpus
    if current >= gpus_per_node:
        return TensorParallelStep(
            current,
            None,
            f"TP {current} already spans a node's {gpus_per_node} GPUs; more would run its "
            "all-reduces across nodes: add pipeline parallelism or shard the optimizer state",
            world,
        )
    limit = min(gpus_per_node, world // others) if world else gpus_per_node
    refused = []
    for t in range(current + 1, limit + 1):
        if (world or gpus_per_node) % (t * others):
            continue  # data parallel takes a whole share of the GPUs (of a node, if unknown)
        reason = _refusal(config, t, world, heads, query_groups)
        if reason is None:
            why = _why(config, t, heads, query_groups)
            where = f"within the run's {world} GPUs and one node" if world else "within one node"
            return TensorParallelStep(current, t, f"{why}; {where}", world)
        refused.append(f"{t} ({reason})")
    if world and more_gpus:
        dp = max(1, world // (current * others))
        for t in range(current + 1, gpus_per_node + 1):
            needed = t * others * dp
            if gpus_per_node % t or needed <= world:
                continue
            if _refusal(config, t, needed, heads, query_groups) is None:
                why = _why(config, t, heads, query_groups)
                return TensorParallelStep(
                    current,
                    t,
                    f"{why}; the run's {world} GPU(s) hold no larger TP, so it needs {needed}",
                    world,
                    needed,
                )
    if world and not refused and current * others >= world:
        why = (
            f"the run's {world} GPU(s) leave no room: TP x PP x CP ({current} x {others}) "
            "already uses them; a larger TP needs more GPUs"
        )
    else:
        shown = "; ".join(refused[:3]) or f"none divides the {world} GPUs"
        why = f"no TP from {current + 1} to {limit} is valid: {shown}"
    return TensorParallelStep(current, None, why, world)


def _refusal(
    config: Config | None, t: int, world: int | None, heads: int | None, groups: int | None
) -> str | None:
    """Why Megatron refuses TP `t` (None: it accepts it)."""
    if config is not None:
        p = config.parallel
        others = p.pipeline_model_parallel_size * p.context_parallel_size
        dp = world // (t * others) if world else p.data_parallel_size
        try:
            candidate = config.replace(tensor_model_parallel_size=t, data_parallel_size=dp)
            candidate.validate()
            estimate(candidate)  # the shapes it splits must divide
        except (ConfigError, ValueError, ZeroDivisionError, AssertionError) as exc:
            return str(exc).splitlines()[0][:120]
        return None
    if heads and heads % t:
        return f"num_attention_heads {heads} is no multiple of it"
    if groups and groups % t and t % groups:
        return f"num_query_groups {groups} is neither a multiple nor a divisor of it"
    return None


def _why(config: Config | None, t: int, heads: int | None, groups: int | None) -> str:
    if config is not None:
        m = config.model
        said = f"divides the {m.num_attention_heads} attention heads"
        if m.kv_groups and m.kv_groups != m.num_attention_heads:
            said += f" and fits the {m.kv_groups} query groups"
        return said
    if heads:
        return f"divides the {heads} attention heads" + (
            f" and fits the {groups} query groups" if groups else ""
        )
    return (
        "valid only where num_attention_heads and num_query_groups are multiples of it: "
        "the input does not say them"
    )
