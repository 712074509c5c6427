"""What the notebooks run: parameter checks, the OOM diagnosis and the ablation report.

The notebooks narrate and plot; every decision is here (and shared with the CLI), so a batch
run with papermill, a notebook in JupyterLab and `recompute-kit doctor/plan/ablate` agree.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Config, ConfigError, parse_spec
from .presets import PRESETS, get_preset
from .units import byte_unit, integer_bytes

GIB = 2**30
PROXIES = {"dense": "tiny-gpt", "moe": "tiny-moe", "mla": "tiny-mla"}
# A real PyTorch OOM message, verbatim from https://github.com/pytorch/pytorch/issues/16417 ;
# the OOM notebook diagnoses it when `error_log` is "example".
EXAMPLE_OOM_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a tot"
    "al capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this "
    "process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by P"
    "yTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If reserved but unallocat"
    "ed memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid"
    " fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stab"
    "le/notes/cuda.html#environment-variables)"
)


# --------------------------------------------------------------------------------------------
# Notebook front end: parameter checks with one-line errors, tables as Markdown
# --------------------------------------------------------------------------------------------


def one_line_errors() -> None:
    """In an IPython kernel, show a ConfigError as its one line (`ConfigError: message`) instead
    of a traceback through the library: papermill and JupyterLab print just that line."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def handler(shell, etype, value, tb, tb_offset=None):
        # IPython hands custom exceptions to this handler only: it must show the error itself
        # (as an `error` output, which papermill and JupyterLab report).
        line = f"{etype.__name__}: {value}"
        shell._showtraceback(etype, value, [line])
        return [line]

    shell.set_custom_exc((ConfigError,), handler)


def _type_ok(value: Any, annotation: Any) -> bool:
    if annotation is Any or isinstance(annotation, str):  # a string annotation: not checked
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(annotation) or annotation
    return isinstance(value, origin)


def _type_name(annotation: Any) -> str:
    """Optional[int] -> 'int or None', list[str] -> 'list[str]'."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if typing.get_args(annotation):
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def check_types(annotations: dict[str, Any], namespace: dict[str, Any]) -> None:
    """Each notebook parameter against the type its parameters cell declares (papermill passes
    `-p steps abc` as a string): one ConfigError naming the first that does not match."""
    for name, annotation in annotations.items():
        if name in namespace and not _type_ok(namespace[name], annotation):
            raise ConfigError(
                f"parameter {name} must be {_type_name(annotation)}, got {namespace[name]!r}"
            )


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def show_markdown(text: str) -> None:
    """Render Markdown in a notebook (plain text elsewhere)."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        print(text)
        return
    if get_ipython() is None:
        print(text)
    else:
        display(Markdown(text))


def breakdown_markdown(parts: dict[str, int], gpu_memory_gb: float) -> str:
    unit, scale = byte_unit([sum(parts.values())])
    rows = [[name, f"{value / scale:.2f}"] for name, value in parts.items()]
    rows.append(["**total**", f"**{sum(parts.values()) / scale:.2f}**"])
    rows.append(["GPU", f"{gpu_memory_gb * GIB / scale:.2f}"])
    return markdown_table(["component", f"per rank ({unit})"], rows)


def stages_markdown(stages) -> str:
    """The plan's per-stage table (plan/stages.py): every pipeline stage's rank, not only the
    first (under pipelining the stages hold different micro-batches and layers)."""
    unit, scale = byte_unit([s.total_bytes for s in stages])
    rows = [
        [
            s.stage,
            f"{s.layers[0]}-{s.layers[-1]}" if s.layers else "-",
            f"{s.micro_batches_in_flight:g}",
            f"{s.peak_activation_bytes / scale:.2f}",
            f"{s.model_state_bytes / scale:.2f}",
            f"{s.total_bytes / scale:.2f}",
            f"{s.held_bytes / scale:.2f}",
            f"{s.headroom_bytes / scale:.2f}",
            f"{s.ranks[0]}-{s.ranks[1]}",
        ]
        for s in stages
    ]
    headers = ["stage", "layers", "in flight", f"peak act ({unit})", f"model states ({unit})"]
    tail = [f"total ({unit})", f"held ({unit})", f"headroom ({unit})", "global ranks"]
    return markdown_table([*headers, *tail], rows)


@dataclass
class Setup:
    config: Config
    name: str
    out_dir: Path
    gpu_memory_gb: float | None = None  # the OOM notebook's budget (given or read)
    error_log: str | None = None  # the OOM notebook's log ("example" only for the example run)


def _number(name: str, value: Any, positive: bool = True, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"parameter {name} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"parameter {name} must be positive, got {value!r}")


def load_setup(
    model: str | None,
    config_path: str | list[str] | None,
    out_dir: str,
    runnable: bool = False,
    example: dict[str, Any] | None = None,
    **overrides: Any,
) -> Setup:
    """The model (a runnable preset, or the config files / model id through the shared reader)
    with overrides (the parameters given: None is "as the model or the files say"), and a
    writable out_dir. What the reader read and assumed is shown.
    runnable: the model is built and run here, so a named model must be a runnable preset.
    example: the notebook's example sizes, used for the parameters left None only when no
    config_path is given (never over a config file's values), and said aloud."""
    from .ablation import prepare_out_dir

    if (
        runnable
        and model
        and not config_path
        and not (model in PRESETS and PRESETS[model].runnable)
    ):
        if model not in PRESETS:
            from .sources.resolve import read_input

            read_input(model)  # an unknown name is said as such
        small = ", ".join(p.name for p in PRESETS.values() if p.runnable)
        raise ConfigError(
            f"model {model!r} is not a runnable preset: it is shape-only here (too large "
            f"to run on this machine); run {small}, or give config_path of a small model"
        )

    flat = {k: v for k, v in overrides.items() if v is not None}
    if example and not config_path:
        filled = {k: v for k, v in example.items() if flat.get(k) is None}
        flat.update(filled)
        if filled:
            said = ", ".join(f"{k} {v}" for k, v in filled.items())
            show_markdown(f"    example sizes (no config_path given): {said}")
    for key, value in flat.items():
        if key not in ("sequence_parallel", "use_distributed_optimizer"):
            _number(key, value)
    paths = [config_path] if isinstance(config_path, str) else list(config_path or [])
    if not paths and (model or "tiny-gpt") in PRESETS:
        name = model or "tiny-gpt"
        cfg = get_preset(name).config().replace(**flat)
    else:
        from .sources.resolve import resolve
        from .sources.summary import summary_lines

        resolved = resolve(paths, model=model, overrides=flat)
        cfg, name = resolved.config, " + ".join([*([model] if model else []), *paths])
        show_markdown(
            "\n".join(f"    {line}" for line in summary_lines(resolved.reading, resolved.inputs))
        )
    cfg.validate()
    return Setup(cfg, name, prepare_out_dir(out_dir))


# --------------------------------------------------------------------------------------------
# OOM diagnosis
# --------------------------------------------------------------------------------------------


# The OOM notebook's example (no model, no config_path): Llama-3-8B on the example log's
# 23.65 GiB GPU (EXAMPLE_OOM_MESSAGE), at this layout.
EXAMPLE_OOM_MODEL = "llama3-8b"
EXAMPLE_OOM_LAYOUT = {
    "seq_length": 8192,
    "tensor_model_parallel_size": 4,
    "pipeline_model_parallel_size": 1,
    "data_parallel_size": 8,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
}
EXAMPLE_GPU_GB = 23.65


def oom_setup(
    model,
    config_path,
    seq_length,
    micro_batch_size,
    tp,
    pp,
    cp,
    ep,
    dp,
    sequence_parallel,
    distributed_optimizer,
    gpu_memory_gb,
    recompute,
    out_dir,
    error_log=None,
) -> Setup:
    """Check every parameter of the OOM notebook; one ConfigError naming what is wrong. The
    parameters left None are what the model or the config files say; with neither a model
    nor a config_path, the example (EXAMPLE_OOM_MODEL at EXAMPLE_OOM_LAYOUT)."""
    missing = missing_inputs(config_path, error_log)
    if missing:
        raise ConfigError(f"not found: {', '.join(missing)}")
    example = EXAMPLE_OOM_LAYOUT if not model and not config_path else None
    if example:
        model = EXAMPLE_OOM_MODEL
        show_markdown(f"    example run (no model or config_path given): {model}")
    setup = load_setup(
        model,
        config_path,
        out_dir,
        example=example,
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        data_parallel_size=dp,
        sequence_parallel=sequence_parallel,
        use_distributed_optimizer=distributed_optimizer,
    )
    if error_log is None and example:
        error_log = "example"
        show_markdown("    error_log: the example's OOM message (pytorch/pytorch#16417)")
    elif error_log == "example" and not example:
        # asked for by name beside the user's own run: never taken for that run's
        show_markdown(
            "    error_log example: pytorch/pytorch#16417's OOM (a 23.65 GiB GPU), "
            "NOT this run's: pass the run's log or error text"
        )
    setup.error_log = error_log
    setup.gpu_memory_gb = _gpu_memory(gpu_memory_gb, error_log, bool(example))
    if recompute:
        setup.config = setup.config.with_recompute(parse_spec(recompute))
        setup.config.validate()
    from .memory.estimate import check_divisible

    check_divisible(setup.config)
    return setup


def _gpu_memory(gpu_memory_gb, error_log, example: bool) -> float:
    """The budget: given, else the OOM message's total capacity, else the example's GPU."""
    if gpu_memory_gb is not None:
        _number("gpu_memory_gb", gpu_memory_gb)
        return float(gpu_memory_gb)
    ooms = read_error_log(error_log).oom
    total = next((o.total_bytes for o in ooms if o.total_bytes), None)
    if total:
        show_markdown(f"    gpu_memory_gb {total / GIB:.2f}: the OOM message's total capacity")
        return total / GIB
    if example:
        return EXAMPLE_GPU_GB
    raise ConfigError(
        "gpu_memory_gb is not given and the error log has no OOM message with the GPU's total "
        "capacity: pass -p gpu_memory_gb X (GiB as the GPU reports it, about 79.1 for an H100)"
    )


def check_device(device: str) -> None:
    """cpu, cuda or auto, checked with the other parameters (not when the proxy run starts)."""
    if device not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"unknown device {device!r}; choose cpu, cuda or auto")


def oom_evidence(error_log, config_path, setup: Setup, overrides: dict[str, Any]):
    """The doctor's evidence as `recompute-kit doctor` collects it: the log, and the config
    files through the shared reader (so patches are written in their framework's keys), with
    the parameters given as overrides; a preset without files gives its flat config."""
    from .doctor.evidence import Evidence, collect

    log = read_error_log(error_log)
    paths = [config_path] if isinstance(config_path, str) else list(config_path or [])
    if not paths:
        flat = config_keys(setup.config)
        if flat.get("recompute_granularity") != "selective":
            # Megatron's default module list, not a setting the run wrote (RK025 read it as
            # "recompute_modules set while granularity is unset": the demo's example run)
            flat.pop("recompute_modules", None)
        return log.merge(Evidence(config=flat))
    return log.merge(collect(config=paths, overrides=overrides))


def plan_format(evidence) -> str:
    """The export format of the framework the config files were read as (export.format_for)."""
    from .export import format_for

    read = evidence.read or {}
    return format_for(read.get("framework"), read.get("format") or "")


def oom_overrides(tp, pp, cp, ep, dp, seq_length, micro_batch_size, sp, dist_opt, recompute):
    """The OOM notebook's parameters as the Megatron keys a reader override sets (None: not
    given, the files decide)."""
    out = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "context_parallel_size": cp,
        "expert_model_parallel_size": ep,
        "data_parallel_size": dp,
        "seq_length": seq_length,
        "micro_batch_size": micro_batch_size,
        "sequence_parallel": sp,
        "use_distributed_optimizer": dist_opt,
    }
    if recompute:
        rc = parse_spec(recompute)
        out.update(
            recompute_granularity=rc.recompute_granularity,
            recompute_method=rc.recompute_method,
            recompute_num_layers=rc.recompute_num_layers,
            recompute_modules=rc.recompute_modules,
        )
    return {k: v for k, v in out.items() if v is not None or k.startswith("recompute_")}


_PATH_LIKE = re.compile(r"^[^\s]*(?:/[^\s]*|\.[A-Za-z]\w{0,5})$")  # one word, a folder or a suffix


def missing_inputs(config_path: str | list | None, error_log: str | None) -> list[str]:
    """Every input file named that does not exist, all at once (a fix-and-rerun per file is
    slow): config_path's files (a `file::function` by its file; a Hydra override `a.b=c` is
    not a file) and an error_log that is a file's name rather than the error text."""
    items = [config_path] if isinstance(config_path, str) else list(config_path or [])
    named = [str(i).split("::", 1)[0] for i in items]
    named = [n for n in named if n and "=" not in n and not n.startswith("-")]
    if error_log and error_log != "example" and _PATH_LIKE.match(str(error_log)):
        named.append(str(error_log))
    return [n for n in named if not Path(n).exists()]


def _is_path(text: str) -> bool:
    try:
        return "\n" not in text and Path(text).is_file()
    except OSError:  # e.g. a pasted message longer than a file name may be
        return False


def read_error_log(error_log: str | None):
    """`error_log` is a path, the pasted text itself, or "example" (EXAMPLE_OOM_MESSAGE);
    returns Evidence."""
    from .doctor.evidence import Evidence, parse_log

    if not error_log:
        return Evidence()
    if error_log == "example":
        return parse_log(EXAMPLE_OOM_MESSAGE)
    if _is_path(error_log):
        from .doctor.evidence import parse_log_file

        return parse_log_file(error_log)
    return parse_log(error_log)


def config_keys(cfg: Config) -> dict[str, Any]:
    """The config as the flat Megatron keys the doctor reads."""
    return cfg.to_flat()


def memory_breakdown(cfg: Config) -> dict[str, int]:
    """Per-rank bytes by component: model states and activations by role (first stage)."""
    from .memory.estimate import estimate

    e = estimate(cfg)
    layers = cfg.model.num_layers // cfg.parallel.pipeline_model_parallel_size
    parts = {"weights": e.weights_bytes, "gradients": e.grads_bytes, "optimizer": e.optimizer_bytes}
    # the layers' roles for every micro-batch in flight, within what is not the loss's
    layered = e.activation_bytes - e.loss_saved_bytes
    roles = {r: b * layers * e.micro_batches_in_flight for r, b in e.modules.items()}
    scale = min(1.0, layered / sum(roles.values())) if sum(roles.values()) else 0.0
    for role, held in roles.items():
        parts[f"act:{role}"] = held * scale
    _without_offloaded(parts, cfg, e.offloaded_bytes)
    if cfg.model.num_moe_experts and "act:mlp" in parts:
        # on a MoE layer the estimator's `mlp` role is the MoE block's input and dispatch
        # indices (recompute_modules' mlp acts on dense layers only)
        label = "act:mlp (dense MLP / MoE block input)"
        parts = {(label if k == "act:mlp" else k): v for k, v in parts.items()}
    parts["act:logits and loss"] = e.loss_saved_bytes
    parts["act:other (embedding, head)"] = max(
        0.0, e.activation_bytes - sum(v for k, v in parts.items() if k.startswith("act:"))
    )
    parts["backward transient"] = e.peak_activation_bytes - e.activation_bytes
    return {name: round(value) for name, value in parts.items()}


def _without_offloaded(parts: dict[str, float], cfg: Config, offloaded: float) -> None:
    """Take what offloading sends to the host out of the roles it comes from (in proportion
    to their bytes): the breakdown is of the GPU, where those bytes are not."""
    from .memory.estimate import OFFLOAD_ROLES

    rc = cfg.recompute
    if not offloaded:
        return
    if rc.cpu_offloading:
        roles = {k for k in parts if k.startswith("act:")}
    else:
        units = rc.offload_modules if rc.fine_grained_activation_offloading else []
        roles = {f"act:{OFFLOAD_ROLES[u][0]}" for u in units if u in OFFLOAD_ROLES}
        roles |= {"act:experts"} if "expert_fc1" in units else set()
    roles &= set(parts)
    held = sum(parts[k] for k in roles)
    for k in roles:
        parts[k] -= min(parts[k], offloaded * parts[k] / held) if held else 0.0


def breakdown_figure(
    parts: dict[str, float], gpu_memory_gb: float, title: str, oom: Any = None
):
    """The per-rank stack against the GPU; `oom` (an OOM message's figures) adds what the rank
    had allocated plus its request, for the estimate to be read against."""
    import textwrap

    from matplotlib import colormaps

    from .plots import new_figure

    fig, ax = new_figure(7)
    unit, scale = byte_unit([sum(parts.values()), gpu_memory_gb * GIB])
    bottom = 0.0
    cmap = colormaps["tab20"]
    for i, (name, value) in enumerate(p for p in parts.items() if p[1] > 0):
        ax.bar(["per rank"], [value / scale], bottom=bottom, label=name, color=cmap(i % 20))
        bottom += value / scale
    ax.axhline(
        gpu_memory_gb * GIB / scale,
        color="tab:red",
        linestyle="--",
        label=f"GPU {gpu_memory_gb:g} GiB",
    )
    needed = getattr(oom, "allocated_bytes", None)
    if needed:
        needed += getattr(oom, "requested_bytes", None) or 0
        ax.axhline(
            needed / scale,
            color="black",
            linestyle=":",
            label=f"the OOM: allocated + request {needed / GIB:.2f} GiB",
        )
    ax.set_ylabel(unit)
    ax.set_title(textwrap.fill(title, 48), fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    return fig


def proxy_preset(cfg: Config) -> str:
    m = cfg.model
    if m.multi_latent_attention:
        return PROXIES["mla"]
    return PROXIES["moe" if m.num_moe_experts else "dense"]


def verify_on_proxy(
    preset: str, specs: list[str], device: str, out_dir: Path, steps: int = 2
) -> list[dict[str, Any]]:
    """A small ablation of the given settings on a runnable model of the same family (specs
    that do not apply to it are skipped): does the planned setting run, what does it cost?"""
    from .ablation import AblationSetup, run_ablation

    cfg = get_preset(preset).config()
    valid = []
    for spec in dict.fromkeys(specs):
        try:
            cfg.with_recompute(parse_spec(spec)).validate()
            valid.append(parse_spec(spec).spec)
        except ConfigError:
            continue
    setup = AblationSetup(cfg, preset, valid or ["none"], steps=steps, warmup=1, device=device)
    # a smoke run: whether it runs, not how fast (too few steps: the ablation says so itself;
    # the ablation notebook times)
    return run_ablation(setup, out_dir / f"verify-{preset}", resume=True)


def write_report(out_dir: Path, report: dict[str, Any], markdown: str) -> None:
    document = integer_bytes(report)
    (out_dir / "report.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (out_dir / "report.md").write_text(markdown)


def oom_markdown(report: dict[str, Any]) -> str:
    """report.md: the verdict first (and what to collect when the input does not decide), the
    findings, where the memory goes, the plan, and the plots the notebook wrote."""
    from .doctor.verdict import Verdict

    verdict = Verdict.from_json(report["verdict"]).lines()
    lines = [f"# OOM diagnosis: {report['model']}", "", "```", *verdict, "```", ""]
    lines += [report["summary"], ""]
    for f in report["findings"]:
        lines += [
            f"## [{f['rule']}] {f['title']} ({f['category']}, {f['confidence']:.0%})",
            "",
            f"- evidence: {f['evidence']}",
            f"- cause: {f['cause']}",
            f"- confirm: {f['confirm']}",
            f"- fix: {f['fix']}",
            # in the framework's own keys where the doctor wrote them (Bridge's model.*)
            f"- patch: `{json.dumps(f.get('patch_keys') or f['config_patch'])}`",
            "",
        ]
    if report.get("breakdown_bytes") and report.get("gpu_memory_gb"):
        lines += [
            "## Where the memory goes (first pipeline stage, per rank, estimated)",
            "",
            breakdown_markdown(report["breakdown_bytes"], report["gpu_memory_gb"]),
            "",
        ]
    plan = report.get("plan") or {}
    if plan.get("best"):
        lines += [
            "## Plan",
            "",
            plan["explanation"],
            "",
            "```",
            plan["rendered"].rstrip(),
            "```",
            "",
        ]
    elif plan.get("error"):
        lines += ["## Plan", "", plan["error"], ""]
    said = ((report.get("evidence") or {}).get("read") or {}).get("warnings") or []
    if said:
        lines += ["## What reading the inputs said", "", *[f"- {w}" for w in said], ""]
    plots = report.get("plots") or []
    ours = [png for png in plots if not png.startswith("verify-")]
    proxy = [png for png in plots if png.startswith("verify-")]
    if ours:
        lines += ["## Plots", ""] + [f"![{Path(png).stem}]({png})" for png in ours] + [""]
    if proxy:
        name = proxy[0].split("/", 1)[0].removeprefix("verify-")
        lines += [
            f"## The proxy's check ({name} on {report.get('device') or 'this machine'})",
            "",
            f"These plots are of {name}, a small runnable model of the same family: whether "
            "the settings run and their relative cost there, not this model's numbers.",
            "",
        ] + [f"![{name}: {Path(png).stem}]({png})" for png in proxy] + [""]
    return "\n".join(lines)
