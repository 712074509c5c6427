"""Every config example in SKILL.md's references reads back, through the shared reader, as the
recompute setting its heading names, and passes Megatron-Core's validation on a real model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recompute_kit.config import parse_spec
from recompute_kit.sources.resolve import resolve

REPO = Path(__file__).resolve().parents[1]
KEY_MAPPING = REPO / "skill/references/key-mapping.md"
SUFFIX = {"python": ".py", "bash": ".sh", "yaml": ".yaml", "toml": ".toml"}
# A model id the registry holds, with experts and grouped GEMM-able MoE layers.
MODEL = "Qwen/Qwen3-30B-A3B"


def examples() -> list[tuple[str, str, str]]:
    """(spec the section renders, fence language, block text) for every rendered block."""
    text = KEY_MAPPING.read_text()
    found = []
    section = text.split("## 2. Rendered examples", 1)[1].split("\n## ", 1)[0]
    for part in re.split(r"^`([^`]+)`:\s*$", section, flags=re.M)[1:]:
        found.append(part)
    pairs = list(zip(found[0::2], found[1::2], strict=True))
    out = []
    for spec, body in pairs:
        for lang, block in re.findall(r"```(\w+)\n(.*?)```", body, flags=re.S):
            out.append((spec, lang, block))
    return out


def hydra_examples() -> list[str]:
    text = KEY_MAPPING.read_text()
    return [
        b
        for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
        if "model.recompute_granularity=" in b
    ]


EXAMPLES = examples()


def test_the_examples_are_found():
    assert len(EXAMPLES) >= 8 and hydra_examples()


@pytest.mark.parametrize(
    ("spec", "lang", "block"), EXAMPLES, ids=[f"{s}-{la}" for s, la, _ in EXAMPLES]
)
def test_rendered_example_reads_as_its_spec(tmp_path, spec, lang, block):
    if lang == "toml":
        pytest.skip("torchtitan's settings are approximations of Megatron's (the text says so)")
    body = block
    if lang == "bash":  # a flag list: as a Megatron-LM argument list of pretrain_gpt.py
        body = f"python pretrain_gpt.py {block.strip().splitlines()[-1]}\n"
    path = tmp_path / f"example{SUFFIX[lang]}"
    path.write_text(body)
    resolved = resolve([str(path)], model=MODEL, overrides={"moe_grouped_gemm": True})
    want = parse_spec(spec)
    got = resolved.config.recompute
    assert got.recompute_granularity == want.recompute_granularity
    assert got.recompute_method == want.recompute_method
    assert got.recompute_num_layers == want.recompute_num_layers
    if want.recompute_granularity == "selective":
        assert got.modules == want.modules
    resolved.config.validate(strict=True)


def test_the_hydra_override_example_validates(tmp_path):
    """The override switches a full-recompute recipe to selective and clears what Megatron
    rejects with it (the old example left the recipe's recompute_num_layers set)."""
    recipe = tmp_path / "overrides.sh"
    base = "model.recompute_granularity=full model.recompute_method=uniform "
    base += "model.recompute_num_layers=1"
    override = hydra_examples()[0].strip().splitlines()[-1]
    recipe.write_text(f"python pretrain_qwen3.py {base} {override}\n")
    resolved = resolve([str(recipe)], model=MODEL, overrides={"moe_grouped_gemm": True})
    assert resolved.config.recompute.spec == "selective:moe_act,layernorm"
    resolved.config.validate(strict=True)
