"""The reader corpus: real public artefacts with the values each must read (see
corpus/README.md), its fixed split, and the scoring shared by the test and the benchmark
(`python benchmarks/reader_corpus.py`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).parent / "corpus"


def split_of(source_url: str) -> str:
    """`held-out` for about 3 in 10 sources, `development` for the rest, forever."""
    digest = int(hashlib.sha256(source_url.strip().encode()).hexdigest()[:8], 16)
    return "held-out" if digest % 10 < 3 else "development"


@dataclass
class Case:
    path: Path  # the artefact
    expect: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def split(self) -> str:
        return split_of(self.expect["source"])

    @property
    def inputs(self) -> list[str]:
        return [str(self.path.parent / w) for w in self.expect.get("with", [])] + [str(self.path)]


def cases() -> list[Case]:
    found = []
    for expect_path in sorted(CORPUS.glob("*/*.expect.yaml")):
        stem = expect_path.name[: -len(".expect.yaml")]
        artefacts = [
            p for p in expect_path.parent.iterdir()
            if p.name != expect_path.name and not p.name.endswith(".expect.yaml")
            and (p.stem == stem or p.name == stem)
        ]
        if len(artefacts) != 1:
            raise ValueError(f"{expect_path}: expected one artefact named {stem}.*")
        found.append(Case(artefacts[0], yaml.safe_load(expect_path.read_text())))
    return found


def same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    return a == b


@dataclass
class Score:
    case: Case
    right: int = 0
    expected: int = 0
    wrong: list[str] = field(default_factory=list)
    error: str | None = None  # resolve refused the case (a one-line ConfigError)


def score(case: Case) -> Score:
    """Resolve the case the way every command does and compare each expected value; a field
    listed under `assumed` must carry the origin `assumed`."""
    from recompute_kit.config import ConfigError
    from recompute_kit.sources.resolve import resolve

    result = Score(case)
    values = case.expect.get("values") or {}
    assumed = case.expect.get("assumed") or []
    result.expected = len(values) + len(assumed) + ("model_name" in case.expect)
    try:
        resolved = resolve(case.inputs, model=case.expect.get("model"), require_shape=False)
    except ConfigError as exc:
        result.error = str(exc)
        return result
    reading = resolved.reading
    if "model_name" in case.expect:
        if reading.model_name == case.expect["model_name"]:
            result.right += 1
        else:
            result.wrong.append(f"model_name: read {reading.model_name!r}")
    for key, want in values.items():
        got = reading.values.get(key, "<unset>")
        if same(got, want):
            result.right += 1
        else:
            result.wrong.append(f"{key}: read {got!r}, expected {want!r}")
    for key in assumed:
        origin = reading.origins.get(key)
        # world_size is no estimate input: "assumed" there means no input decides it
        if (origin is not None and origin.kind == "assumed") or (
            origin is None and key == "world_size"
        ):
            result.right += 1
        else:
            got = origin.describe() if origin else "nothing"
            result.wrong.append(f"{key}: expected an assumption, got {got}")
    return result
