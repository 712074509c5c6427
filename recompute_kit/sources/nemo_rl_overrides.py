"""NeMo-RL's Hydra-style command-line overrides (`policy.max_total_sequence_length=8192`,
`+key=value`, `++key=value`, `~key`), applied to the config as NeMo-RL applies them.

NVIDIA-NeMo/RL @ 7ea279ab: every `examples/run_*.py` parses `--config` with argparse's
`parse_known_args()` and hands the rest to Hydra (examples/run_grpo.py:65, examples/run_dpo.py:37);
`load_config()` merges the `defaults:` chain first (nemo_rl/utils/config.py:51-97), then
`parse_hydra_overrides()` applies the overrides in order with the config in struct mode
(nemo_rl/utils/config.py:172-192, examples/run_grpo.py:87-92), and only then
`OmegaConf.to_container(config, resolve=True)` resolves the `${...}` interpolations
(examples/run_grpo.py:94): a value written as `${policy.max_total_sequence_length}` follows an
override of that key. Hydra's rules (hydra/_internal/config_loader_impl.py
`_apply_overrides_to_config`): `key=value` changes a key that exists (struct mode: a key the
config lacks stops the run, "Could not override ... use +key=value"), `+key=value` adds one that
does not exist, `++key=value` adds or changes, `~key` deletes; a mapping value merges into the
mapping it overrides (`OmegaConf.update(..., merge=True)`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, replace
from typing import Any

import yaml

from .reading import FROM_ARGUMENT, FROM_FILE, Reading
from .yaml_paths import Path, dotted, lookup

# `policy.max_total_sequence_length=8192`, `+a.b=1`, `++a.b=1`, `~a.b`, `~a.b=1`
OVERRIDE = re.compile(r"^(?P<op>\+\+|\+|~)?(?P<key>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?:=(?P<v>.*))?$")


@dataclass(frozen=True)
class Override:
    """One override as written, and where: `launch.sh:3`, or the command line of recompute-kit
    (`place` None) applied to the input `applies_to`."""

    written: str
    line: int = 0
    place: str | None = None  # the file the override is written in; None: recompute-kit's args
    applies_to: str = ""

    @property
    def op(self) -> str:
        return _parts(self.written)[0]

    @property
    def path(self) -> Path:
        return tuple(_parts(self.written)[1].split("."))

    @property
    def where(self) -> str:
        if self.place is None:
            return "command line"
        return f"{self.place}:{self.line}" if self.line else self.place


def is_override(word: str) -> bool:
    """A Hydra override: `a.b=c`, `+a=c`, `~a.b` (a bare word without `=` or `~` is not)."""
    m = OVERRIDE.match(word)
    return m is not None and (m.group("v") is not None or m.group("op") == "~")


def _parts(written: str) -> tuple[str, str, str | None]:
    m = OVERRIDE.match(written)
    if m is None:
        raise ValueError(f"not an override: {written!r}")
    return m.group("op") or "", m.group("key"), m.group("v")


def value_of(raw: str) -> Any:
    """Hydra's value grammar, near enough: YAML scalars, lists `[a,b]`, `null`, quoted strings;
    `${...}` stays an interpolation (resolved with the rest after the overrides)."""
    if raw == "":
        return ""
    if raw.startswith("${") and raw.endswith("}"):
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        try:  # Hydra reads 1e3 as a float where YAML 1.1 keeps a string
            return float(value) if re.fullmatch(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+", value) else value
        except ValueError:
            return value
    return value


def put_path(data: dict, p: Path, value: Any, merge: bool) -> None:
    """`value` at the dotted path `p` of `data` (mappings made on the way); with `merge`, a
    mapping value merges into the mapping there, as OmegaConf merges it."""
    node = data
    for key in p[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    old = node.get(p[-1])
    if merge and isinstance(old, dict) and isinstance(value, dict):
        node[p[-1]] = {**old, **copy.deepcopy(value)}
    else:
        node[p[-1]] = copy.deepcopy(value)


def apply(
    merged: dict,
    sources: list[tuple[str, dict, dict[Path, int]]],
    overrides: list[Override],
    reading: Reading,
    complete: bool,
    who: str = "NeMo-RL",
) -> tuple[dict, list[tuple[str, dict, dict[Path, int]]]]:
    """`merged` (the `defaults:` chain, not yet resolved) with `overrides` applied in order, and
    the sources with one per override place first (an overridden key's origin is its line).
    `complete`: every file of the chain was read, so a key it lacks is one the framework (`who`:
    NeMo-RL, NeMo 1.x) lacks too (struct mode); otherwise an override of an unknown key is
    applied with a warning saying so."""
    merged = copy.deepcopy(merged)
    placed: dict[str, tuple[dict, dict[Path, int]]] = {}
    for o in overrides:
        op, key, raw = _parts(o.written)
        p = o.path
        exists = lookup(merged, p)[0]
        if op == "~":
            if not exists:
                why = f"Hydra: could not delete {key}: it does not exist"
                _refused(reading, o, why, complete, who)
                continue
            parent = lookup(merged, p[:-1])[1]
            parent.pop(p[-1])
            continue
        if op == "" and not exists:
            _refused(
                reading,
                o,
                f"Hydra: could not override {key}: the config has no such key (struct mode); "
                f"to add it {who} needs +{o.written}",
                complete,
                who,
            )
            if complete:
                continue
        if op == "+" and exists:
            _refused(
                reading,
                o,
                f"Hydra: could not append {key}: an item is already there; write {o.written[1:]} "
                f"or +{o.written}",
                True,
                who,
            )
            continue
        value = value_of(raw or "")
        put_path(merged, p, value, merge=True)
        data, lines = placed.setdefault(_file(o), ({}, {}))
        put_path(data, p, value, merge=False)
        lines[p] = o.line
    # the most specific first: the later place wins where two give the same key
    extra = [(file, data, lines) for file, (data, lines) in reversed(placed.items())]
    return merged, [*extra, *sources]


def _refused(reading: Reading, o: Override, why: str, stops: bool, who: str) -> None:
    if stops:
        reading.unused[o.written] = o.written
        reading.warnings.append(f"{o.where}: {o.written}: {why}; {who} stops here; not applied")
    else:
        reading.warnings.append(
            f"{o.where}: {o.written}: the config was not read in full, so whether {who} "
            "accepts this override is not known; applied"
        )


def label(reading: Reading, overrides: list[Override]) -> None:
    """Each value an override set shows the override as written (`launch.sh:3
    policy.max_total_sequence_length=8192`); a value from a `${...}` of an overridden key says
    which override it follows (also a value computed from one: `cluster.num_nodes 32`)."""
    by_key = {dotted(o.path): o for o in overrides if o.op != "~"}
    for field, origin in list(reading.origins.items()):
        o = by_key.get(origin.key)
        if o is not None and origin.kind == FROM_FILE and origin.where.startswith(_file(o)):
            kind = FROM_FILE if o.place is not None else FROM_ARGUMENT
            note = origin.note
            if o.place is None and o.applies_to:
                note = f"override of {o.applies_to}" + (f"; {note}" if note else "")
            reading.origins[field] = replace(
                origin, kind=kind, where=o.where, key=o.written, note=note
            )
            continue
        followed = [
            k for k in by_key if re.search(r"(?<![\w.])" + re.escape(k) + r"(?![\w.])", origin.note)
        ]
        if followed:
            written = ", ".join(f"{by_key[k].where} {by_key[k].written}" for k in followed)
            reading.origins[field] = replace(origin, note=f"{origin.note}, after {written}")


def _file(o: Override) -> str:
    return o.place if o.place is not None else "command line"
