"""The verdict: does the evidence decide, and if not, what would.

`diagnosed`: the top finding's category is decided by an artefact in the input (what decides
which category is `DECIDED_BY` below) and its calibrated confidence is at least `DIAGNOSED_AT`.
`needs_evidence`: the paste does not decide; the findings are hypotheses, labelled possible, and
`collect` names the artefacts or commands that would decide between them, chosen per competing
category (`COLLECT_FOR`). `out_of_scope`: host RAM, a data loader's worker, or inference /
serving with no training step in sight: the kit's estimates are of a training step's GPU memory.

What counts as deciding evidence (the same rule labels the corpus cases decidable, from the
paste alone; benchmarks/label_decidable.py):

* a full OOM message (the request and the GPU's capacity, with free or reserved/allocated
  sizes) whose numbers show a cause by themselves: memory reserved but unallocated worth the name,
  memory held by other processes or outside PyTorch's allocator, a request of half the GPU or
  more. An OOM whose numbers show only PyTorch's own allocations filling the GPU decides which
  part of them (weights and optimizer, activations, logits) only with one more artefact that
  splits the memory: a model shape, a memory table, or the frames it failed in;
* a config with a model shape the estimator could split (activations vs model states);
* a memory table: Megatron's memory reports or theoretical footprint, torch.cuda.memory_stats(),
  a memory snapshot, or nvidia-smi's process table;
* a measurement: an ablation table or iteration lines with times;
* a traceback: an exception or warning with the frames it came from (frames cut before the
  exception line say where, not what, failed: they decide nothing);
* a framework's validation error (ValueError, AssertionError, ...) stating the constraint broken
  (`ValueError: ... recompute_method must be "block" or "uniform"`), or a config that
  Megatron's validation (run by the kit) rejects: these decide invalid_config.

Any other bare exception line, prose, or an OOM title without its numbers decides nothing.

A finding that rests on the estimate (its rule does not fire without the config's estimate)
is decided by the config only as far as the config says the values the estimate needs: where
the shared reader ASSUMED a memory-relevant input (its origin `assumed`: the ZeRO stage of a
DeepSpeed JSON that is not there, the launcher's world size), the verdict is `needs_evidence`
and `collect` asks first for the file or key that sets each assumed value.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from ..runstats import RERUN
from ..sources.reading import FROM_ASSUMED, MEMORY_KEYS
from ..sources.semantics import CANNOT_RUN
from .rules.allocator import fragmentation_worth_the_name, reserved_unallocated
from .rules.registry import (
    expandable_on,
    fact,
    from_the_launcher,
    oom_errors,
    outside_this_process,
    steps_without_oom,
)
from .types import Context, Finding

DIAGNOSED_AT = 0.85  # the calibrated confidence a diagnosed verdict needs

# The artefacts or commands that decide, by id: what to collect and how.
COLLECT: dict[str, str] = {
    "oom_message": "the full OOM message, every line from 'CUDA out of memory. Tried to "
    "allocate' to the end (the request, the GPU's capacity, free, allocated and reserved sizes)",
    "memory_summary": "print(torch.cuda.memory_summary()) at the failure (in an except "
    "torch.cuda.OutOfMemoryError block), or a snapshot: torch.cuda.memory._record_memory_history()"
    " then torch.cuda.memory._dump_snapshot('snap.pickle') -> recompute-kit doctor --snapshot",
    "resolved_config": "the resolved config the framework prints at start-up (Megatron's "
    "'arguments' dump, NeMo/Hydra's resolved YAML, Hugging Face TrainingArguments) with the model "
    "shape, parallel sizes and recompute settings -> recompute-kit doctor --config",
    "nvidia_smi": "nvidia-smi (its process table) during the run, just before the failing step",
    "expandable": "the same step with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "traceback": "the full traceback, every frame from 'Traceback (most recent call last)' to "
    "the exception line",
    "versions": "the versions in use (pip list | grep -iE 'torch|transformers|megatron|nemo|"
    "deepspeed|accelerate|peft|vllm') and the last version that worked",
    "timings": "a few iteration lines (time per step) of the same run with and without the "
    "change, on the same nodes, after warm-up",
    # measured settings whose difference their runs do not decide
    "repeats": RERUN + " (skill/scripts/judge.py or doctor --experiments reads them)",
    "memory_by_step": "torch.cuda.max_memory_allocated() after one step with recompute on and "
    "one with it off (or Megatron's memory report lines of each)",
    "warning_context": "the full warning with its source line, and a few iteration lines after "
    "it (does training go on?)",
    # a run that steps without failing: its peak, not an OOM it never printed
    "peak_memory": "torch.cuda.max_memory_reserved(), max_memory_allocated() and "
    "memory_stats()['num_alloc_retries'] on every rank after a few steps (the peak, and how "
    "often the allocator had to free its cache)",
    # memory that grows step after step: what survives each step decides leak from peak
    "memory_series": "torch.cuda.memory_allocated() printed after every step for ten steps, "
    "then the same run with gc.collect() before each print (flat with it: a reference cycle), "
    "and two torch.cuda.memory._snapshot()s a few steps apart (what survives the step) -> "
    "recompute-kit doctor --snapshot",
    # where the estimate is far above what the rank reached
    "tokens_per_batch": "the tokens of the failing micro-batch as it ran (input_ids.shape at "
    "the step: padding pads to the longest sample, not to the cap) -> recompute-kit doctor "
    "--seq-length N",
}

# Readings of memory that grows step after step (rules/general.py, rules/stated.py)
_GROWTH_READINGS = ("RK266", "RK805")

# Per category: the artefacts that would decide it (the first ones first).
COLLECT_FOR: dict[str, tuple[str, ...]] = {
    "fragmentation": ("oom_message", "expandable", "memory_summary", "peak_memory"),
    "other_processes": ("nvidia_smi", "oom_message"),
    "non_pytorch_memory": ("oom_message", "nvidia_smi", "memory_summary"),
    "allocation_exceeds_device": ("oom_message", "traceback"),
    "genuine_pressure": ("oom_message", "resolved_config", "memory_summary", "peak_memory"),
    "activation_memory": ("resolved_config", "oom_message", "memory_summary", "peak_memory"),
    "model_state_memory": ("resolved_config", "oom_message", "memory_summary", "peak_memory"),
    "logits_memory": ("traceback", "resolved_config", "oom_message", "peak_memory"),
    "recompute_no_effect": ("resolved_config", "memory_by_step"),
    "recompute_overhead": ("timings", "repeats", "resolved_config"),
    "invalid_config": ("resolved_config", "traceback"),
    "checkpoint_api_misuse": ("traceback", "versions"),
    "nondeterministic_recompute": ("traceback", "versions"),
    "framework_bug": ("traceback", "versions"),
    "informational": ("warning_context",),
}

# Per category: the kinds of deciding evidence (see `present`) that decide it.
_MEMORY = ("full_oom", "shape", "memory_table", "traceback")
DECIDED_BY: dict[str, tuple[str, ...]] = {
    "fragmentation": ("oom:fragmentation", "memory_table"),
    "other_processes": ("oom:other_processes", "memory_table"),
    "non_pytorch_memory": ("oom:non_pytorch_memory", "memory_table"),
    "allocation_exceeds_device": ("oom:allocation_exceeds_device",),
    "genuine_pressure": _MEMORY,
    "activation_memory": _MEMORY,
    "model_state_memory": _MEMORY,
    "logits_memory": _MEMORY,
    "recompute_no_effect": ("shape", "memory_table", "measurement"),
    "recompute_overhead": ("measurement",),
    "invalid_config": ("validation_message", "config_rejected", "traceback", "shape"),
    "checkpoint_api_misuse": ("traceback",),
    "nondeterministic_recompute": ("traceback",),
    "framework_bug": ("traceback",),
    "informational": ("traceback",),
}
# The memory categories need the OOM's numbers plus one artefact that splits the memory.
_NEEDS_OOM = {"genuine_pressure", "activation_memory", "model_state_memory", "logits_memory"}


def full_oom(ctx: Context) -> bool:
    """An OOM message with its numbers: the request, the capacity, and free or reserved."""
    for oom in ctx.evidence.oom:
        sizes = (oom.free_bytes, oom.reserved_bytes, oom.allocated_bytes, oom.process_bytes)
        if oom.requested_bytes and oom.total_bytes and any(s is not None for s in sizes):
            return True
    return False


# What an OOM message's numbers can show by themselves (see `oom_shows`).
_OOM_SHOWS = {
    "fragmentation": "memory reserved but unallocated",
    "other_processes": "memory held by other processes",
    "non_pytorch_memory": "memory outside PyTorch's allocator",
    "allocation_exceeds_device": "a request of half the GPU or more",
}


def oom_shows(oom) -> str | None:
    """The category an OOM message's numbers decide by themselves, with the allocator rules'
    own thresholds; None where they show PyTorch's own allocations filling the GPU."""
    req, total = oom.requested_bytes or 0, oom.total_bytes or 0
    if not req or not total:
        return None
    if req >= 0.5 * total:  # RK004's threshold
        return "allocation_exceeds_device"
    slack = reserved_unallocated(oom)
    if slack and fragmentation_worth_the_name(slack, req, total):
        return "fragmentation"
    if (outside_this_process(oom) or 0) >= max(req, 0.1 * total):
        return "other_processes"
    pytorch = oom.reserved_bytes  # <= 2.0's "reserved in total"; 2.1+ gives its two parts
    if pytorch is None and oom.allocated_bytes is not None:
        pytorch = oom.allocated_bytes + (slack or 0)
    if oom.process_bytes is not None and pytorch is not None:
        outside = oom.process_bytes - pytorch
        if outside >= max(req, 0.1 * total):
            return "non_pytorch_memory"
    return None


def present(ctx: Context) -> dict[str, str]:
    """The deciding evidence in the input, by kind, with what it is."""
    ev = ctx.evidence
    out: dict[str, str] = {}
    if full_oom(ctx):
        out["full_oom"] = "an OOM message with its sizes"
        for cat in sorted({shown for oom in ev.oom if (shown := oom_shows(oom))}):
            out[f"oom:{cat}"] = f"an OOM message whose sizes show {_OOM_SHOWS[cat]}"
    if ctx.estimate is not None:
        out["shape"] = "a config with a model shape the estimator split"
    if ev.memory or ev.memory_stats or ev.snapshot or ev.theoretical_memory or ev.gpu_processes:
        out["memory_table"] = (
            "a memory table (memory reports, memory stats, a snapshot or nvidia-smi)"
        )
    timed = [it for it in ev.iterations if getattr(it, "elapsed_ms", None)]
    if ev.experiments or len(timed) >= 2:
        out["measurement"] = "measured runs (an ablation table or timed iteration lines)"
    cut = _frames_without_exception(ctx)
    if any(e.frames and (e.type or not cut) for e in ev.errors):
        out["traceback"] = "a traceback with its frames"
    if any(_is_validation(e) for e in ev.errors):
        out["validation_message"] = "a framework's validation error stating the constraint broken"
    if ctx.config_error:
        out["config_rejected"] = "the config, which Megatron's validation rejects"
    return out


def _frames_without_exception(ctx: Context) -> bool:
    """Frames cut before their exception line, and no exception line (nor OOM message) anywhere
    else in the paste: they say where, not what, failed."""
    ev = ctx.evidence
    cut = any(e.kind == "exception" and e.frames and not e.type for e in ev.errors)
    said = [e for e in ev.errors if e.kind == "exception" and e.type and not from_the_launcher(e)]
    return cut and not (ev.oom or said)


# A framework's own validation error: an exception (not a warning) of a validation type whose
# message states the constraint a setting breaks ("... must be ...", "... not supported with ...").
_VALIDATION_TYPES = ("ValueError", "AssertionError", "ConfigError", "ValidationError")
_CONSTRAINT = re.compile(
    r"\b(?:must|cannot|can ?not|not supported|only supported|does not (?:support|work)|"
    r"not compatible|needs to be|should be|not (?:in|one of)|invalid|only)\b",
    re.I,
)


# A command line the script's argument parser refuses (argparse prints "PROG: error: ..."
# and exits), or Megatron-LM's exit on a flag it retired: the constraint is stated too.
_REFUSED_ARGUMENTS = re.compile(
    r"\berror: (?:unrecognized arguments|argument --|the following arguments are required)"
    r"|--[\w-]+ is no longer valid, use"
)


def _is_validation(e) -> bool:
    if _REFUSED_ARGUMENTS.search(e.message):
        return True
    return (
        e.kind == "exception"
        and e.type.split(".")[-1] in _VALIDATION_TYPES
        and bool(_CONSTRAINT.search(e.message))
    )


def deciding(ctx: Context) -> dict[str, str]:
    """The evidence present that decides some category (the corpus's `decidable` label): an
    OOM message whose numbers show only PyTorch's allocations filling the GPU decides none by
    itself."""
    kinds = present(ctx)
    return kinds if any(decides(category, kinds) for category in DECIDED_BY) else {}


def decides(category: str, kinds: dict[str, str] | set[str]) -> bool:
    """Whether the deciding evidence present decides this category."""
    have = set(kinds)
    if category in _NEEDS_OOM:
        with_oom = "full_oom" in have and bool(have & {"shape", "memory_table", "traceback"})
        return with_oom or ("shape" in have and "memory_table" in have)
    return bool(have & set(DECIDED_BY.get(category, ())))


# Out of scope: the failure is not a training step's GPU memory or recompute.
_HOST_RAM = re.compile(
    r"DefaultCPUAllocator: (?:can't|not enough memory)|std::bad_alloc|Cannot allocate memory|"
    r"\bout of memory: Killed process|oom-kill|killed by the OOM killer|host memory",
    re.I,
)
_DATA_LOADER = re.compile(
    r"DataLoader worker \(pid[^)]*\) (?:is killed|exited unexpectedly)|"
    r"pin[_ ]memory thread|_worker_loop|dataloader worker",
    re.I,
)
_INFERENCE = re.compile(
    r"\bvllm[/.]|\bsglang[/.]|text_generation_server|/generation/utils\.py|\.generate\(|"
    r"\btensorrt_llm[/.]|\btrtllm|\bVllm\w*Worker"  # NeMo-RL's VllmInternalWorkerExtension
)
_TRAINING = re.compile(
    r"backward|optimizer|\.step\(|trainer|train_step|training|checkpoint|forward_backward|"
    r"recompute|accelerate|deepspeed|grpo|ppo|rollout|actor",
    re.I,
)


def scope(ctx: Context, findings: list[Finding]) -> str | None:
    """'host_ram', 'data_loader' or 'inference' when the failure is out of the kit's scope."""
    ev = ctx.evidence
    text = "\n".join(
        f"{e.type}: {e.message}\n{e.details}\n" + "\n".join(e.frames) for e in ev.errors
    )
    text += "".join(f"\n{o.prefix}" for o in ev.oom if o.prefix)  # who raised each OOM
    if not ev.oom and _DATA_LOADER.search(text):  # the more specific reading first
        return "data_loader"
    if findings and findings[0].rule == "RK660":  # the host's RAM, not the GPU's
        return "host_ram"
    logged_training = ev.iterations or ev.experiments or _TRAINING.search(text)
    if ev.oom:
        # an OOM raised inside an inference engine (TensorRT-LLM, vLLM) with no training step in
        # the log is a serving run's, whatever config came with it
        return "inference" if _INFERENCE.search(text) and not logged_training else None
    if _HOST_RAM.search(text):
        return "host_ram"
    if _INFERENCE.search(text) and not (logged_training or ctx.granularity):
        return "inference"
    return None


_SCOPE_WHY = {
    "host_ram": "the host's (CPU) RAM ran out, not the GPU's: the kit estimates GPU memory",
    "data_loader": "a data loader worker failed: not the training step's GPU memory",
    "inference": "an inference engine's memory (serving, or an RL job's generation worker) "
    "with no training step in the log: the kit estimates a training step's",
}


@dataclass
class Verdict:
    verdict: str  # diagnosed | needs_evidence | out_of_scope
    why: str
    deciding_evidence: list[str] = field(default_factory=list)  # the kinds present
    hypotheses: list[dict[str, Any]] = field(default_factory=list)
    collect: list[dict[str, Any]] = field(default_factory=list)
    scope: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "verdict_why": self.why,
            "deciding_evidence": self.deciding_evidence,
            "hypotheses": self.hypotheses,
            "collect": self.collect,
            "scope": self.scope,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Verdict:
        return cls(
            doc["verdict"],
            doc["verdict_why"],
            list(doc.get("deciding_evidence") or []),
            list(doc.get("hypotheses") or []),
            list(doc.get("collect") or []),
            doc.get("scope"),
        )

    def lines(self) -> list[str]:
        """The human output's head: the verdict, then what to collect when it asks."""
        out = [f"verdict: {self.verdict} - {self.why}"]
        if self.verdict == "needs_evidence":
            if self.hypotheses:
                out.append("possible (not decided by the input):")
                out += [
                    f"  {h['category']} ({h['rule']}, {h['confidence']:.0%}): {h['title']}"
                    for h in self.hypotheses
                ]
            out.append("collect, to decide:")
            out += [f"  - {c['what']}" for c in self.collect]
        return out


def collect_for(categories: list[str], have: set[str]) -> list[dict[str, Any]]:
    """The artefacts that would decide between the competing categories, each with the
    categories it decides, in the categories' order; those already given are left out."""
    given = {
        "oom_message": "full_oom" in have,
        "resolved_config": "shape" in have,
        "memory_summary": "memory_table" in have,
        "peak_memory": "memory_table" in have,
        "nvidia_smi": "memory_table" in have,
        "traceback": "traceback" in have,
        "timings": "measurement" in have,
    }
    items: dict[str, list[str]] = {}
    for cat in categories:
        for item in COLLECT_FOR.get(cat, ()):
            if given.get(item):
                continue
            items.setdefault(item, [])
            if cat not in items[item]:
                items[item].append(cat)
    return [{"id": k, "what": COLLECT[k], "decides": v} for k, v in items.items()]


def _for_a_running_job(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The OOM message and the summary at the failure become the run's measured peak."""
    out, peak = [], None
    for item in items:
        if item["id"] in ("oom_message", "memory_summary", "peak_memory"):  # one peak item
            peak = peak or {"id": "peak_memory", "what": COLLECT["peak_memory"], "decides": []}
            peak["decides"] += [c for c in item["decides"] if c not in peak["decides"]]
            if peak not in out:
                out.append(peak)
        else:
            out.append(item)
    return out


def assumed_inputs(ctx: Context) -> list[dict[str, Any]]:
    """The memory-relevant inputs of the estimate that no input says (the shared reader's
    origin `assumed`), each with its assumed value and the key that would set it. The data-
    parallel size counts only where something may shard over it (a ZeRO stage or the
    distributed optimizer that is on or itself assumed): else per-rank memory is the same at
    any DP."""
    read = ctx.evidence.read or {}
    sources, values = read.get("sources") or {}, read.get("config") or {}
    assumed = {
        key: src
        for key, src in sources.items()
        if isinstance(src, dict) and src.get("from") == FROM_ASSUMED and key in MEMORY_KEYS
    }
    sharded = (
        "zero_stage" in assumed
        or "use_distributed_optimizer" in assumed
        or bool(values.get("zero_stage"))
        or bool(values.get("use_distributed_optimizer"))
    )
    out = []
    for key, src in assumed.items():
        if key == "data_parallel_size" and not sharded:
            continue
        out.append({"key": key, "value": values.get(key), "set_by": src.get("key") or key})
    return out


def rests_on_estimate(ctx: Context, finding: Finding) -> bool:
    """Whether the finding's rule fires only with the config's estimate (asked again with the
    config, estimate and plan taken away)."""
    if ctx.config is None and ctx.estimate is None:
        return False
    from .rules import RULES  # (the catalog imports the helpers this module shares)

    rule = next((r for r in RULES if r.id == finding.rule), None)
    if rule is None:
        return False
    bare = dataclasses.replace(ctx, config=None, estimate=None, best=None, plan_error=None)
    try:
        again = rule.check(bare)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        return True  # it needs what was taken away
    return again is None


def collect_assumed(ctx: Context, assumed: list[dict[str, Any]], cats: list[str]) -> dict:
    """The collect item that decides an estimate resting on assumed values: each key that sets
    one, and the files the reader was told of but could not find."""
    missing = [w for w in (ctx.evidence.read or {}).get("warnings") or [] if "not found" in str(w)]
    keys = "; ".join(f"{a['set_by']} (assumed {a['key']} = {a['value']!r})" for a in assumed)
    what = f"the values the estimate assumed, from the file or key that sets each: {keys}"
    if missing:
        what += ". Not found: " + "; ".join(missing)
    return {"id": "assumed_inputs", "what": what, "decides": cats, "keys": assumed}


# Without a hypothesis: the artefacts that decide most categories (where nothing ran out of
# memory, those that decide a failure that is not one: an OOM's numbers decide nothing there).
_DEFAULT_COMPETING = ["genuine_pressure", "fragmentation", "other_processes", "framework_bug"]
_DEFAULT_COMPETING_NO_OOM = ["framework_bug"]
# hypotheses that are not a failure to allocate: where they are all there is and nothing speaks
# of memory, an OOM's numbers decide nothing (a framework's crash may be an OOM cut short)
_NOT_MEMORY = {
    "recompute_overhead",
    "recompute_no_effect",
    "informational",
    "checkpoint_api_misuse",
    "nondeterministic_recompute",
    "invalid_config",
}


_SMI_WHILE_RUNNING = (
    "nvidia-smi (its process table) during the run, at the steps whose memory is in question"
)


def _ran_out(ctx: Context) -> bool:
    """The input says memory ran out: an OOM message or error, or an OOM named in words."""
    return bool(ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions"))


def _no_oom_in_sight(ctx: Context, competing: list[str]) -> bool:
    """Every hypothesis is one of _NOT_MEMORY, and nothing in the input ran out of memory or
    speaks of memory (with no hypothesis at all, nothing says what the failure is)."""
    said = ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions") or fact(ctx, "memory_prose")
    return bool(competing) and not said and set(competing) <= _NOT_MEMORY


def judge(ctx: Context, findings: list[Finding]) -> Verdict:
    """The verdict on ranked, calibrated findings."""
    kinds = present(ctx)
    have = list(kinds)
    where = scope(ctx, findings)
    if where:
        return Verdict("out_of_scope", _SCOPE_WHY[where], have, scope=where)
    top = findings[0] if findings else None
    assumed: list[dict[str, Any]] = []
    overstated = None
    # the reader's word that the files' layout cannot run on their world (semantics.py)
    on_estimate = top is not None and rests_on_estimate(ctx, top)
    # a finding that does not rest on the estimate keeps its reading
    warnings = (ctx.evidence.read or {}).get("warnings", []) if on_estimate else []
    unrunnable = next((w for w in warnings if CANNOT_RUN in w), None)
    if top and decides(top.category, kinds):
        assumed = assumed_inputs(ctx) if on_estimate else []
        if on_estimate:
            from .rules.estimate_gap import estimate_overstates  # (the catalog imports this)

            overstated = estimate_overstates(ctx)
        if not (assumed or overstated or unrunnable) and top.confidence >= DIAGNOSED_AT:
            why = (
                f"{top.category} ({top.rule}, confidence {top.confidence:.0%}), decided by "
                + "; ".join(kinds[k] for k in have if k in DECIDED_BY.get(top.category, ()))
            )
            return Verdict("diagnosed", why, have)
    hypotheses = [
        {
            "rule": f.rule,
            "category": f.category,
            "title": f.title,
            "confidence": f.confidence,
            "label": "possible",
        }
        for f in findings[:5]
    ]
    competing = list(dict.fromkeys(f.category for f in findings[:3]))
    measured_only = bool(ctx.evidence.experiments) and not ctx.oom
    if len(competing) < 2 and not measured_only:
        # one guess is no choice between causes: ask for the usual deciders (not an OOM's, for
        # measured runs that printed none)
        no_oom = _no_oom_in_sight(ctx, competing)
        defaults = _DEFAULT_COMPETING_NO_OOM if no_oom else _DEFAULT_COMPETING
        competing += [c for c in defaults if c not in competing]
    items = collect_for(competing, set(have))
    if not items:  # everything those categories need was given: ask for the next deciders
        items = collect_for(competing, set())
    if expandable_on(ctx):  # the run has them on: that re-run is the run itself
        items = [i for i in items if i["id"] != "expandable"]
    ran_out = _ran_out(ctx)
    if steps_without_oom(ctx) or not ran_out:
        # the run steps and printed no OOM, or nothing says it ran out (memory that does not
        # go down, a crash): its peak decides, not an OOM message to come, and an
        # expandable-segments re-run of an OOM it never had decides nothing
        items = _for_a_running_job(items)
        if not ran_out:
            items = [i for i in items if i["id"] != "expandable"]
        if not ran_out and not ctx.evidence.errors:
            # nothing failed: no traceback to come, and no failing step to watch
            items = [i for i in items if i["id"] != "traceback"]
            items = [
                {**i, "what": _SMI_WHILE_RUNNING} if i["id"] == "nvidia_smi" else i
                for i in items
            ]
    if _frames_without_exception(ctx) and not any(i["id"] == "traceback" for i in items):
        what = COLLECT["traceback"] + " (the paste cuts it before its exception line)"
        items.insert(0, {"id": "traceback", "what": what, "decides": competing})
    if assumed:
        items.insert(0, collect_assumed(ctx, assumed, competing))
    if any(f.rule in _GROWTH_READINGS for f in findings[:3]):
        # a leak or growth read: step-by-step figures decide it, not one OOM
        items.insert(0, {"id": "memory_series", "what": COLLECT["memory_series"],
                         "decides": competing})
    if overstated:
        tokens = {"id": "tokens_per_batch", "what": COLLECT["tokens_per_batch"]}
        items.insert(0, {**tokens, "decides": competing})
    if top is None:
        why = "no finding: the input shows no known pattern"
    elif unrunnable:
        why = (
            f"{top.category} ({top.rule}, {top.confidence:.0%}) rests on the estimate of a layout "
            f"the files cannot run: {unrunnable}; give the layout the job ran with (--dp, or the "
            "launch that set it)"
        )
    elif overstated:
        from .rules.estimate_gap import overstated_words

        why = (
            f"{top.category} ({top.rule}, {top.confidence:.0%}) rests on the estimate, and "
            + overstated_words(ctx, overstated)
        )
    elif assumed:
        said = ", ".join(f"{a['key']} = {a['value']!r}" for a in assumed)
        why = (
            f"{top.category} ({top.rule}, {top.confidence:.0%}) rests on the estimate, and the "
            f"estimate assumes {said}: no input says it"
        )
    elif not decides(top.category, kinds):
        why = f"nothing in the input decides {top.category}" + (
            f" (it has {', '.join(kinds[k] for k in have)})" if have else " (prose or a bare line)"
        )
    else:
        why = (
            f"the input holds evidence of the kind that decides {top.category}, but "
            f"{top.rule} is only {top.confidence:.0%} likely (a diagnosis takes "
            f"{DIAGNOSED_AT:.0%})"
        )
    return Verdict("needs_evidence", why, have, hypotheses, items)
