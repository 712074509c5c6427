#!/usr/bin/env python3
"""Make recompute-kit runnable from this skill folder; prints one JSON document on stdout.

The skill folder holds the kit's source (pyproject.toml, recompute_kit/); it needs an interpreter
with torch >= 2.5 and the kit's other dependencies (PyYAML, OmegaConf, bashlex; tomli before
Python 3.11). Looked for, in order (the first that works wins, nothing is
installed):

  1. --python PY or $RECOMPUTE_KIT_PYTHON (if given, it must work: no fallback);
  2. the bootstrap venv, --venv DIR or $RECOMPUTE_KIT_VENV or <skill>/.venv, if it exists;
  3. the interpreter running this script.

Otherwise a venv is created at that place (with --system-site-packages, so a torch already
installed system-wide or in conda is reused; --isolated to not), then inside it: torch only if it
is not importable, the other dependencies where missing, the kit itself from this folder (`pip
install --no-deps -e`; a .pth file pointing here if that fails), and with --with-notebooks
papermill, ipykernel, matplotlib and nbformat.

torch: on a machine without a GPU, the CPU build torch==2.13.0 (Linux x86_64: 2.13.0+cpu from
https://download.pytorch.org/whl/cpu). On a machine with an NVIDIA/AMD GPU it installs nothing
without --allow-cuda-torch: a CUDA build is gigabytes and should match the driver, so it stops
with status "action_required" - point RECOMPUTE_KIT_PYTHON at the training environment's python
instead, or pass --allow-cuda-torch (and --torch-spec) once the user agrees.

Output: {"status": "ready" | "action_required" | "error" | "dry_run", "python", "source",
"skill_root", "recompute_kit", "torch", "cuda_available", "notebooks", "venv", "actions": [...],
"run": "<how to call the CLI>", "error"?}. Exit 0 when ready (or --dry-run), 1 otherwise.
Everything pip prints goes to stderr. Idempotent: a second run finds the venv and does nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from _kit import ROOT, SCRIPTS, emit, venv_python

MIN_TORCH = (2, 5)
NOTEBOOK_PACKAGES = ["papermill", "ipykernel", "matplotlib", "nbformat"]
# The kit's dependencies other than torch (pyproject.toml's [project] dependencies; the
# probe's `need` lists their modules): installed where missing, as `pip install --no-deps -e`
# of the kit does not.
RUNTIME_PACKAGES = {
    "yaml": "pyyaml>=6",
    "omegaconf": "omegaconf>=2.3",
    "bashlex": "bashlex>=0.18",
    "tomli": "tomli>=2",  # Python < 3.11 only (tomllib from 3.11)
}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

PROBE = r"""
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
out = {"python": sys.executable, "python_version": sys.version.split()[0],
       "prefix": sys.prefix}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["torch_cuda"] = torch.version.cuda
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
need = ["yaml", "omegaconf", "bashlex"] + (["tomli"] if sys.version_info < (3, 11) else [])
out["missing"] = [m for m in need if importlib.util.find_spec(m) is None]
try:
    import recompute_kit
    out["recompute_kit"] = recompute_kit.__file__
    out["kit_version"] = recompute_kit.__version__
except Exception as exc:
    out["kit_error"] = f"{type(exc).__name__}: {exc}"
out["notebooks"] = all(importlib.util.find_spec(m) is not None
                       for m in ("papermill", "ipykernel", "matplotlib", "nbformat"))
print(json.dumps(out))
"""


def log(message: str) -> None:
    print(f"bootstrap: {message}", file=sys.stderr, flush=True)


def probe(python: str, timeout: float = 120) -> dict:
    try:
        proc = subprocess.run(
            [python, "-c", PROBE, str(ROOT)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"python": python, "probe_error": f"{type(exc).__name__}: {exc}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"python": python, "probe_error": tail}


def torch_ok(info: dict) -> bool:
    version = info.get("torch")
    if not version:
        return False
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return True  # a dev build: let the kit decide
    return (major, minor) >= MIN_TORCH


def usable(info: dict, notebooks: bool) -> bool:
    kit = info.get("recompute_kit") or ""
    from_here = Path(kit).resolve().is_relative_to(ROOT) if kit else False
    return (
        torch_ok(info)
        and info.get("missing") == []
        and from_here
        and (info.get("notebooks", False) or not notebooks)
    )


def problems(info: dict, notebooks: bool) -> list[str]:
    out = []
    if info.get("probe_error"):
        return [f"cannot run {info['python']}: {info['probe_error']}"]
    if not info.get("torch"):
        out.append(f"torch not importable ({info.get('torch_error', '')})")
    elif not torch_ok(info):
        out.append(f"torch {info['torch']} is older than 2.5")
    if info.get("missing"):
        out.append(f"not importable: {', '.join(info['missing'])}")
    if info.get("kit_error"):
        out.append(f"recompute_kit import failed: {info['kit_error']}")
    if notebooks and not info.get("notebooks"):
        out.append(f"notebook packages missing ({', '.join(NOTEBOOK_PACKAGES)})")
    return out


def gpu_present() -> str | None:
    if shutil.which("nvidia-smi"):
        return "nvidia-smi is on PATH"
    for path, what in (("/proc/driver/nvidia/version", "NVIDIA driver"), ("/dev/kfd", "ROCm")):
        if Path(path).exists():
            return f"{path} exists ({what})"
    return None


def default_torch(spec: str | None, index: str | None) -> tuple[str, str | None]:
    """(requirement, extra index URL or None) for a CPU-only torch."""
    linux_x86 = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
    if spec is None:
        spec = "torch==2.13.0+cpu" if linux_x86 else "torch==2.13.0"
    if index is None:
        index = CPU_INDEX if linux_x86 else None
    elif index.lower() in ("", "none"):
        index = None
    return spec, index


def pip(python: str, args: list[str], dry_run: bool, actions: list[str]) -> bool:
    cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", *args]
    actions.append(" ".join(cmd))
    if dry_run:
        return True
    log(" ".join(cmd))
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
    return proc.returncode == 0


def write_pth(python: str, actions: list[str], dry_run: bool) -> bool:
    """Fallback for a failed editable install: a .pth file that puts the skill folder on
    sys.path."""
    proc = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return False
    target = Path(proc.stdout.strip()) / "recompute_kit_skill.pth"
    actions.append(f"write {target} -> {ROOT}")
    if not dry_run:
        target.write_text(f"{ROOT}\n", encoding="utf-8")
    return True


def result(status: str, info: dict | None, source: str | None, actions: list[str], **extra):
    info = info or {}
    python = info.get("python")
    doc = {
        "status": status,
        "python": python,
        "source": source,
        "skill_root": str(ROOT),
        "recompute_kit": info.get("recompute_kit"),
        "kit_version": info.get("kit_version"),
        "torch": info.get("torch"),
        "cuda_available": info.get("cuda_available"),
        "notebooks": info.get("notebooks"),
        "venv": extra.pop("venv", None),
        "actions": actions,
    }
    if python and status == "ready":
        env = f"RECOMPUTE_KIT_PYTHON={python} "
        doc["run"] = {
            "cli": f"{env}python3 {SCRIPTS / 'rk.py'} SUBCOMMAND ... --json",
            "diagnose": f"{env}python3 {SCRIPTS / 'diagnose.py'} --log LOG [--config CFG]",
            "plan": f"{env}python3 {SCRIPTS / 'plan.py'} --model PRESET --gpu-memory-gb X",
            "notebook": f"{env}python3 {SCRIPTS / 'rk.py'} notebook oom|ablation OUT.ipynb "
            "-p NAME VALUE",
        }
    doc.update(extra)
    return doc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bootstrap.py",
        description=__doc__.split("\n\n")[0],
        epilog="Env: RECOMPUTE_KIT_PYTHON (use this interpreter), RECOMPUTE_KIT_VENV (venv "
        "location), RECOMPUTE_KIT_TORCH_INDEX (extra index for torch, 'none' for pip's own).",
    )
    p.add_argument("--python", metavar="PY", help="use this interpreter (must have torch)")
    p.add_argument("--venv", metavar="DIR", help="venv location (default: <skill>/.venv)")
    p.add_argument(
        "--with-notebooks",
        action="store_true",
        help="also papermill, ipykernel, matplotlib, nbformat (for the notebooks)",
    )
    p.add_argument(
        "--allow-cuda-torch",
        action="store_true",
        help="on a GPU machine, allow installing torch from pip's index (CUDA build)",
    )
    p.add_argument(
        "--torch-spec",
        metavar="REQ",
        help="torch requirement (default torch==2.13.0, +cpu on Linux x86_64)",
    )
    p.add_argument(
        "--torch-index-url",
        metavar="URL",
        help=f"extra index for torch (default {CPU_INDEX} on Linux x86_64; 'none')",
    )
    p.add_argument(
        "--isolated", action="store_true", help="create the venv without --system-site-packages"
    )
    p.add_argument("--dry-run", action="store_true", help="probe and say what would be done")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    actions: list[str] = []
    explicit = args.python or os.environ.get("RECOMPUTE_KIT_PYTHON")
    if args.venv:
        os.environ["RECOMPUTE_KIT_VENV"] = args.venv
    venv = Path(os.environ.get("RECOMPUTE_KIT_VENV") or ROOT / ".venv").expanduser().absolute()
    vpy = venv_python(venv)

    if explicit:
        info = probe(explicit)
        if usable(info, args.with_notebooks):
            src = "--python" if args.python else "RECOMPUTE_KIT_PYTHON"
            return emit(result("ready", info, src, actions))
        why = "; ".join(problems(info, args.with_notebooks))
        return emit(
            result(
                "error",
                info,
                "explicit",
                actions,
                error=f"{explicit}: {why}; fix it, or unset RECOMPUTE_KIT_PYTHON to use a venv",
            ),
            1,
        )

    tried = []
    for python, source in ((vpy, f"venv {venv}"), (Path(sys.executable), "current python")):
        if source.startswith("venv") and not python.exists():
            continue
        info = probe(str(python))
        if usable(info, args.with_notebooks):
            return emit(
                result(
                    "ready",
                    info,
                    source,
                    actions,
                    venv=str(venv) if source.startswith("venv") else None,
                )
            )
        tried.append(f"{source}: {'; '.join(problems(info, args.with_notebooks))}")
        if source.startswith("venv"):
            break  # repair the existing venv below instead of falling back

    # Create (or repair) the venv.
    if not vpy.exists():
        cmd = [
            sys.executable,
            "-m",
            "venv",
            *([] if args.isolated else ["--system-site-packages"]),
            str(venv),
        ]
        actions.append(" ".join(cmd))
        if not args.dry_run:
            log(" ".join(cmd))
            if subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False).returncode:
                return emit(
                    result(
                        "error",
                        None,
                        None,
                        actions,
                        venv=str(venv),
                        error=f"could not create a venv at {venv}",
                        tried=tried,
                    ),
                    1,
                )
    info = probe(str(vpy)) if vpy.exists() else {"python": str(vpy)}

    if not torch_ok(info):
        gpu = gpu_present()
        if gpu and not args.allow_cuda_torch:
            return emit(
                result(
                    "action_required",
                    info,
                    f"venv {venv}",
                    actions,
                    venv=str(venv),
                    tried=tried,
                    error=f"torch is not importable and this machine has a GPU ({gpu}). Installing "
                    "a CUDA torch downloads gigabytes and must match the driver: ask the user. "
                    "Either set RECOMPUTE_KIT_PYTHON to a python that already has torch (the "
                    "training environment), or rerun with --allow-cuda-torch [--torch-spec REQ].",
                ),
                1,
            )
        if gpu:
            spec, index = args.torch_spec or "torch==2.13.0", None
        else:
            spec, index = default_torch(
                args.torch_spec, args.torch_index_url or os.environ.get("RECOMPUTE_KIT_TORCH_INDEX")
            )
        extra = ["--extra-index-url", index] if index else []
        if not pip(str(vpy), [spec, *extra], args.dry_run, actions):
            return emit(
                result(
                    "error",
                    info,
                    f"venv {venv}",
                    actions,
                    venv=str(venv),
                    error=f"pip could not install {spec}",
                    tried=tried,
                ),
                1,
            )
    needed = [RUNTIME_PACKAGES[m] for m in info.get("missing") or []]
    if needed and not pip(str(vpy), needed, args.dry_run, actions):
        return emit(
            result(
                "error",
                info,
                f"venv {venv}",
                actions,
                venv=str(venv),
                error=f"pip could not install {' '.join(needed)}",
                tried=tried,
            ),
            1,
        )
    if (
        not args.dry_run
        and not pip(str(vpy), ["--no-deps", "-e", str(ROOT)], args.dry_run, actions)
        and not write_pth(str(vpy), actions, args.dry_run)
    ):
        return emit(
            result(
                "error",
                info,
                f"venv {venv}",
                actions,
                venv=str(venv),
                error=f"could not install the kit from {ROOT}",
                tried=tried,
            ),
            1,
        )
    if args.dry_run:
        actions.append(f"{vpy} -m pip install --no-deps -e {ROOT}  (or a .pth file on failure)")
    if (
        args.with_notebooks
        and not info.get("notebooks")
        and not pip(str(vpy), NOTEBOOK_PACKAGES, args.dry_run, actions)
    ):
        return emit(
            result(
                "error",
                info,
                f"venv {venv}",
                actions,
                venv=str(venv),
                error="pip could not install the notebook packages",
            ),
            1,
        )
    if args.dry_run:
        return emit(result("dry_run", info, f"venv {venv}", actions, venv=str(venv), tried=tried))

    info = probe(str(vpy))
    if usable(info, args.with_notebooks):
        return emit(result("ready", info, f"venv {venv}", actions, venv=str(venv)))
    return emit(
        result(
            "error",
            info,
            f"venv {venv}",
            actions,
            venv=str(venv),
            tried=tried,
            error="; ".join(problems(info, args.with_notebooks)),
        ),
        1,
    )


if __name__ == "__main__":
    sys.exit(main())
