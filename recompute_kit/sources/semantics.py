"""Megatron's rules that hold whatever framework wrote the config, applied to a merged reading:
values in the form Megatron-Core normalises them to, and the parallel layout (SP needs TP > 1,
DP from the world size, the expert layout)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..config import Config, ConfigError, ModelConfig, ParallelConfig, RecomputeConfig
from ..config.pipeline_layout import layout_from_stages
from ..config.validation import expert_layout_problem
from .reading import FROM_ASSUMED, FROM_DERIVED, Origin, Reading

CANNOT_RUN = "this layout cannot run as written"  # (the doctor's verdict reads it)

def normalize(reading: Reading) -> None:
    """Values in the form Megatron-Core itself normalises them to (TransformerConfig's
    __post_init__), so that every framework's spelling validates the same way; a null for a
    field that cannot be null (a serialized ConfigContainer's `offload_modules: null`) is the
    field's default."""
    defaults = Config().to_flat()
    for key in list(reading.values):
        if reading.values[key] is None and key in _NOT_NULL:
            origin = reading.origins[key]
            note = f"null: Megatron-Core's default {defaults[key]!r}"
            reading.set(key, defaults[key], dataclasses.replace(origin, note=note))
    if "recompute_modules" in reading and reading.get("recompute_modules") is None:
        origin = reading.origins["recompute_modules"]  # (kept None: the config reads it so)
        note = origin.note or "null: Megatron-Core's TransformerConfig makes it ['core_attn']"
        reading.set("recompute_modules", None, dataclasses.replace(origin, note=note))
    for key in ("recompute_modules", "offload_modules"):
        value = reading.get(key)
        if isinstance(value, str):  # "core_attn,mlp", "[`core_attn`, `mlp`]" as pasted
            items = [v.strip("`'\" ") for v in re.split(r"[\s,]+", value.strip("[]() "))]
            origin = reading.origins[key]
            note = f"{value!r} read as a list"
            reading.set(key, [v for v in items if v], dataclasses.replace(origin, note=note))
    layout = reading.get("pipeline_model_parallel_layout")
    if isinstance(layout, (list, tuple)):  # Megatron's list-of-stages spelling
        origin = reading.origins["pipeline_model_parallel_layout"]
        text = layout_from_stages(layout)
        note = "a list of stages, written as Megatron's layout string"
        reading.set("pipeline_model_parallel_layout", text, dataclasses.replace(origin, note=note))
    scope = reading.get("cuda_graph_scope")
    if scope is None and "cuda_graph_scope" in reading:
        scope = []
    if isinstance(scope, str):  # "attn,mlp"; "full" (deprecated) = the whole layer = []
        scope = [s.strip().rsplit(".", 1)[-1] for s in scope.split(",") if s.strip()]
    if isinstance(scope, list) and scope != reading.get("cuda_graph_scope"):
        origin = reading.origins["cuda_graph_scope"]
        scope = [] if scope == ["full"] else scope
        reading.set(
            "cuda_graph_scope",
            scope,
            dataclasses.replace(origin, note=origin.note or "as Megatron-Core normalises it"),
        )


# Config fields whose type has no None (a null in a file means the default).
_NOT_NULL = frozenset(
    f.name
    for cls in (ModelConfig, ParallelConfig, RecomputeConfig)
    for f in dataclasses.fields(cls)
    if "None" not in str(f.type)
)


def derive_layout(reading: Reading, overrides: dict[str, Any], strict: bool) -> None:
    """Megatron's rules every framework shares: SP needs TP > 1; DP = world / (TP x PP x CP);
    the expert layout (EP x ETP) must divide TP x CP x DP. A layout the world cannot hold is
    refused (strict) or, when only reading, said as a warning with DP left undecided."""
    tp = reading.get("tensor_model_parallel_size") or 1
    if reading.get("sequence_parallel") and tp == 1:
        if "sequence_parallel" in overrides:
            return  # asked for explicitly: validation raises Megatron's own error
        origin = reading.origins["sequence_parallel"]
        reading.set(
            "sequence_parallel",
            False,
            dataclasses.replace(origin, note="turned off: sequence parallelism needs TP > 1"),
        )
        reading.warnings.append(
            f"sequence_parallel ({origin.describe()}) with TP=1: turned off, as Megatron-LM "
            "and NeMo do"
        )
    world = reading.get("world_size")
    cp = reading.get("context_parallel_size") or 1
    model_parallel = tp * (reading.get("pipeline_model_parallel_size") or 1) * cp
    asked_dp = overrides.get("data_parallel_size")
    if world and asked_dp and asked_dp * model_parallel != world and "world_size" not in overrides:
        # recompute-kit's own --dp is the user's word about the run (a launch script's node
        # count often comes from the scheduler's environment, unset here): the world follows it
        origin = reading.origins["world_size"]
        origin_world = reading.get("world_size")
        was = f"{origin_world} ({origin.describe()})"
        world = asked_dp * model_parallel
        reading.set(
            "world_size",
            world,
            Origin(FROM_DERIVED, f"--dp {asked_dp} x (TP x PP x CP = {model_parallel})"),
        )
        # (what a reader said of the world it replaces no longer holds)
        stale = f"world_size {origin_world} is not a multiple of TP*PP*CP"
        reading.warnings = [w for w in reading.warnings if not w.startswith(stale)]
        reading.warnings.append(
            f"--dp {asked_dp} x (TP x PP x CP = {model_parallel}) sets the world size: {world} "
            f"GPUs, instead of {was}"
        )
    elif not world and asked_dp:
        # no input says the world: the user's --dp does, with the layout read (the GPUs this
        # run makes, to check against the job's)
        world = asked_dp * model_parallel
        reading.set(
            "world_size",
            world,
            Origin(FROM_DERIVED, f"--dp {asked_dp} x (TP x PP x CP = {model_parallel})"),
        )
    elif world and asked_dp and reading.origins["world_size"].kind == FROM_ASSUMED:
        # the same world, now said by the user's --dp: no longer an assumption to ask about
        reading.set(
            "world_size",
            world,
            Origin(FROM_DERIVED, f"--dp {asked_dp} x (TP x PP x CP = {model_parallel})"),
        )
    problem = None
    if world:
        dp = world // model_parallel
        if world % model_parallel:
            problem = (
                f"a world of {world} GPUs ({reading.origins['world_size'].describe()}) is not "
                f"divisible by TP x PP x CP = {model_parallel}"
                + _layouts_that_divide(
                    world,
                    tp,
                    cp,
                    reading.get("pipeline_model_parallel_size"),
                    reading.get("num_layers"),
                )
            )
        elif "data_parallel_size" in reading and reading.get("data_parallel_size") != dp:
            problem = (
                f"data_parallel_size {reading.get('data_parallel_size')} does not match a world "
                f"of {world} GPUs / (TP x PP x CP = {model_parallel}) = {dp}"
            )
        else:
            problem = _expert_layout_problem(reading, tp * cp * dp)
        if problem is None:
            reading.derive(
                "data_parallel_size", dp, f"world size {world} / (TP x PP x CP = {model_parallel})"
            )
    elif reading.get("data_parallel_size"):
        problem = _expert_layout_problem(reading, tp * cp * reading.get("data_parallel_size"))
    if problem is not None and not strict and _smallest_world_instead(reading, tp * cp):
        return
    if problem is not None:
        if strict:
            raise ConfigError(problem + _world_hint(reading, tp * cp, model_parallel))
        reading.warnings.append(f"{problem}: {CANNOT_RUN}")
        dp_origin = reading.origins.get("data_parallel_size")
        if dp_origin is not None and dp_origin.kind == "derived":  # (by the framework's rule)
            del reading.values["data_parallel_size"], reading.origins["data_parallel_size"]


def _smallest_world_instead(reading: Reading, dense_model_ranks: int) -> bool:
    """When only reading: an assumed world size (a launch script's node count left to the
    scheduler) too small for the expert layout is replaced by the smallest world that holds it,
    itself an assumption said as such, rather than a DP that contradicts it (True: done)."""
    origin = reading.origins.get("world_size")
    if origin is None or origin.kind != FROM_ASSUMED or not reading.get("num_moe_experts"):
        return False
    if "data_parallel_size" in reading and reading.origins["data_parallel_size"].kind not in (
        FROM_ASSUMED,
        FROM_DERIVED,
    ):
        return False  # a DP the inputs give is the user's: its problem is said, not hidden
    tp = reading.get("tensor_model_parallel_size") or 1
    experts = (reading.get("expert_model_parallel_size") or 1) * (
        reading.get("expert_tensor_parallel_size") or tp
    )
    dp = experts // math.gcd(experts, dense_model_ranks)
    world = dp * dense_model_ranks * (reading.get("pipeline_model_parallel_size") or 1)
    note = (
        f"the smallest world the expert layout allows (EP x expert TP = {experts}: DP {dp}); "
        f"{origin.note or origin.describe()} gives {reading.get('world_size')}, too few for it"
    )
    reading.set("world_size", world, Origin(FROM_ASSUMED, origin.where, origin.key, note))
    reading.set("data_parallel_size", dp, Origin(FROM_ASSUMED, origin.where, origin.key, note))
    return True


def _layouts_that_divide(
    world: int, tp: int, cp: int, pp: int | None, num_layers: int | None = None
) -> str:
    """The nearest layouts that a world of `world` GPUs holds: the pipeline or the tensor size
    the files give, the other reduced (--pp N / --tp N, as estimate and plan take them); a
    pipeline size the layers divide (evenly: uneven stages are the user's to choose)."""
    pp = pp or 1
    options = []
    for p in range(pp - 1, 0, -1):
        if not world % (tp * cp * p) and not (num_layers or 0) % p:
            options.append(f"--pp {p} (DP {world // (tp * cp * p)})")
            break
    t = tp // 2  # tensor sizes halve: the heads divide a power of two where they divided TP
    while t >= 1:
        if not world % (t * cp * pp):
            options.append(f"--tp {t} (DP {world // (t * cp * pp)})")
            break
        t //= 2
    return f"; layouts this world holds: {' or '.join(options)}" if options else ""


def _expert_layout_problem(reading: Reading, dense_ranks: int) -> str | None:
    if not reading.get("num_moe_experts"):
        return None
    tp = reading.get("tensor_model_parallel_size") or 1
    cp = reading.get("context_parallel_size") or 1
    etp = reading.get("expert_tensor_parallel_size") or tp
    ep = reading.get("expert_model_parallel_size") or 1
    return expert_layout_problem(tp, cp, dense_ranks // (tp * cp), ep, etp)


def _world_hint(reading: Reading, dense_model_ranks: int, model_parallel: int) -> str:
    """Where a refused layout rests on an assumed world size (a launch script's node count
    left to the scheduler's environment): how to give the real one."""
    origin = reading.origins.get("world_size")
    if origin is None or origin.kind != FROM_ASSUMED:
        return ""
    said = origin.describe().removeprefix(f"{FROM_ASSUMED}: ")
    hint = f"; the world size {reading.get('world_size')} is assumed ({said})"
    if reading.get("num_moe_experts"):
        tp = reading.get("tensor_model_parallel_size") or 1
        experts = (reading.get("expert_model_parallel_size") or 1) * (
            reading.get("expert_tensor_parallel_size") or tp
        )
        dp = experts // math.gcd(experts, dense_model_ranks)
        return hint + (
            f": give the run's data-parallel size with --dp (the smallest this expert layout "
            f"allows is {dp}, {dp * model_parallel} GPUs)"
        )
    return hint + ": give the run's data-parallel size with --dp"
