"""Run the kit's notebooks in batch, as `recompute-kit notebook oom|ablation OUT.ipynb -p ...`.

papermill's own command line answers a bad parameter with its traceback and leaves the failed
output notebook behind. This runs the same notebooks through papermill's Python API: a bad
parameter is the notebook's one-line message (the first cells check every parameter), and a run
that fails leaves no output notebook. Parameters are read as papermill's command line reads them
(`-p NAME VALUE`, `-y YAML`, `-f params.yaml`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = {"oom": "oom_diagnosis.ipynb", "ablation": "recompute_ablation.ipynb"}


def parameter_value(text: str) -> Any:
    """A `-p` value as papermill's command line reads it: None, True, False, an int, a float,
    else the string itself."""
    words = {"None": None, "True": True, "False": False, "true": True, "false": False}
    if text in words:
        return words[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def parameters(pairs: list[list[str]], yaml_text: str | None, yaml_file: str | None) -> dict:
    """The notebook's parameters: the file's, then -y's, then each -p (later wins)."""
    values: dict[str, Any] = {}
    for source, text in (
        (yaml_file, _read(yaml_file) if yaml_file else None),
        ("-y", yaml_text),
    ):
        if text is None:
            continue
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not YAML ({str(exc).splitlines()[0]})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{source}: parameters must be a mapping of name: value")
        values.update(loaded or {})
    for name, value in pairs:
        values[name] = parameter_value(value)
    return values


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"-f {path}: cannot read it ({exc.__class__.__name__})") from None


def run(name: str, output: str, values: dict[str, Any]) -> Path:
    """Execute notebook `name` (oom or ablation) into `output`; ConfigError with one line when
    a parameter is bad or a cell fails (and then no output notebook is left)."""
    try:
        import papermill
    except ImportError:
        raise ConfigError(
            "papermill is not installed: pip install -e '.[notebooks]' (or the skill's "
            "bootstrap.py --with-notebooks)"
        ) from None
    source = NOTEBOOKS / NAMES[name]
    if not source.is_file():
        raise ConfigError(f"{source}: not found (the notebooks ship with the source tree)")
    out = Path(output)
    if out.suffix != ".ipynb":
        raise ConfigError(f"{output}: the executed notebook's name must end in .ipynb")
    known = papermill.inspect_notebook(str(source))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"{NAMES[name]} has no parameter {', '.join(unknown)} (its parameters: "
            f"{', '.join(known)})"
        )
    if name == "oom":  # every missing input in one line, before a kernel starts
        from .reports import missing_inputs

        missing = missing_inputs(values.get("config_path"), values.get("error_log"))
        if missing:
            raise ConfigError(f"not found: {', '.join(missing)}")
    if not out.parent.is_dir():
        raise ConfigError(f"{output}: its folder {out.parent} does not exist")
    partial = out.with_name(f".{out.stem}.partial.ipynb")  # renamed into place once it ran
    try:
        papermill.execute_notebook(
            str(source),
            str(partial),
            parameters=values,
            progress_bar=True,
            log_output=False,
            # the kernel's own start-up warnings are not the user's business
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    except papermill.PapermillExecutionError as exc:
        partial.unlink(missing_ok=True)
        where = "" if exc.ename == "ConfigError" else f" (cell {exc.exec_count})"
        raise ConfigError(f"{NAMES[name]}: {exc.ename}: {exc.evalue}{where}") from None
    except BaseException:  # interrupted: nothing half-written stays
        partial.unlink(missing_ok=True)
        raise
    partial.replace(out)
    return out
