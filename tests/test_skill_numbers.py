"""The estimates SKILL.md and its references quote are the estimator's own: each quoted number
is recomputed here with the command the text names, so a change of the estimator that moves
one fails until the text says the new figure (one source of truth for the agent's numbers)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKILL = (REPO / "SKILL.md").read_text()
MODULES = (REPO / "skill/references/modules.md").read_text()
MOE_MLA = (REPO / "skill/references/moe-mla.md").read_text()
MIB, GIB = 2**20, 2**30

LLAMA = ["--model", "llama3-70b", "--tp", "8", "--pp", "4", "--sp", "--seq-length", "8192"]
QWEN = ["--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "8", "--dp", "8", "--sp"]
QWEN += ["--distributed-optimizer", "--seq-length", "16384"]
MOONLIGHT = ["--model", "moonlight-16b", "--tp", "2", "--etp", "1", "--ep", "8", "--dp", "4"]
MOONLIGHT += ["--sp", "--seq-length", "4096"]


@cache
def estimates(args: tuple[str, ...], *specs: str) -> dict[str, dict]:
    argv = [sys.executable, "-m", "recompute_kit.cli", "estimate", *args, "--json"]
    proc = subprocess.run([*argv, "--recompute", *specs], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    return dict(zip(specs, doc["estimates"], strict=True))


def gib(e: dict, key: str = "activation_bytes") -> str:
    return f"{e[key] / GIB:.1f}"


def flops(e: dict) -> str:
    return f"+{100 * e['recompute_flops_fraction']:.1f}%"


def mib(e: dict, *modules: str) -> str:
    return f"{sum(e['modules'].get(m, 0) for m in modules) / MIB:.1f}"


def quoted(text: str, phrase: str) -> None:
    flat = " ".join(text.split())
    assert phrase in flat, f"not in the text (the estimator says): {phrase}"


def test_core_attn_with_flash_and_unfused_attention_on_llama3_70b():
    for attention in ("flash", "unfused"):
        e = estimates((*LLAMA, "--attention", attention), "none", "selective:core_attn")
        none, core = e["none"], e["selective:core_attn"]
        phrase = f"{gib(none)} -> {gib(core)} GiB"
        quoted(SKILL, phrase)
        quoted(MODULES, phrase)


def test_flops_of_the_dense_settings_on_llama3_70b():
    specs = ("selective:core_attn", "selective:mlp", "full:uniform:1", "full:block:10")
    e = estimates(tuple(LLAMA), *specs)
    quoted(MODULES, f"rerun of core attention: {flops(e['selective:core_attn'])} FLOPs")
    quoted(MODULES, f"rerun of fc1 + activation + fc2: {flops(e['selective:mlp'])} FLOPs")
    quoted(MODULES, f"rerun of every layer's forward: {flops(e['full:uniform:1'])} FLOPs")
    quoted(MODULES, f"rerun of N layers: {flops(e['full:block:10'])} for N=10 of 20")


def test_uniform_groups_backward_peak_on_llama3_70b():
    specs = ("full:uniform:1", "full:uniform:2", "full:uniform:4", "full:uniform:10")
    rows = estimates(tuple(LLAMA), *specs).values()
    p = [f"{e['peak_activation_bytes'] / GIB:.2f}" for e in rows]
    quoted(SKILL, f"{p[0]} (N=1), {p[1]} (N=2), {p[2]} (N=4), {p[3]} GiB (N=10)")
    quoted(MODULES, f"{p[0]} GiB (N=1), {p[1]} (N=2), {p[2]} (N=4), {p[3]} (N=10)")


def test_qwen3_moe_ladder():
    specs = (
        "none",
        "selective:core_attn",
        "selective:moe_act",
        "selective:layernorm,moe_act",
        "selective:moe",
        "full:uniform:1",
    )
    e = estimates(tuple(QWEN), *specs)
    none, moe = e["none"], e["selective:moe"]
    total = "total_bytes"
    other = ("layernorm", "qkv", "proj", "mlp", "residual")
    for spec in ("none", "selective:moe_act", "selective:moe"):
        row = e[spec]
        cells = [mib(row, "moe_act"), mib(row, "experts"), mib(row, "router")]
        cells += [mib(row, "core_attn"), mib(row, *other)]
        cells.append(f"**{row['per_layer_activation_bytes'] / MIB:.1f}**")
        for cell in cells:
            quoted(MOE_MLA, f"| {cell} |")
    quoted(
        MOE_MLA,
        f"from {gib(none, total)} to {gib(e['selective:core_attn'], total)} GiB per rank for "
        f"{flops(e['selective:core_attn'])} FLOPs in that estimate, while `moe` gets to "
        f"{gib(moe, total)} GiB for {flops(moe)}",
    )
    quoted(MOE_MLA, f"{gib(none, total)} -> {gib(e['selective:layernorm,moe_act'], total)} GiB")
    quoted(MOE_MLA, f"{gib(none, total)} -> {gib(moe, total)} GiB (estimate, {flops(moe)} FLOPs)")
    full = e["full:uniform:1"]
    quoted(MOE_MLA, f"({gib(full, total)} GiB, {flops(full)} FLOPs, estimate)")
    quoted(MODULES, f"e.g. {flops(moe)} FLOPs on Qwen3-30B-A3B")


def test_moonlight_mla_up_proj():
    e = estimates(tuple(MOONLIGHT), "none", "selective:mla_up_proj")
    none, up = e["none"], e["selective:mla_up_proj"]
    per = [x["per_layer_activation_bytes"] / MIB for x in (none, up)]
    quoted(
        MOE_MLA,
        f"core attention's saved tensors {mib(none, 'core_attn')} -> {mib(up, 'core_attn')}, the "
        f"up-projection {mib(none, 'mla_up_proj')} -> {mib(up, 'mla_up_proj')}, per layer "
        f"{per[0]:.1f} -> {per[1]:.1f} ({per[1] / per[0] - 1:+.1%}) for {flops(up)} FLOPs",
    )
    quoted(
        MOE_MLA,
        f"experts {mib(none, 'experts')}, `moe_act` {mib(none, 'moe_act')}, shared experts "
        f"{mib(none, 'shared_experts')}",
    )
    quoted(MODULES, f"{flops(up)} FLOPs on Moonlight-16B")


@pytest.mark.parametrize("text", [SKILL, MODULES, MOE_MLA], ids=["SKILL", "modules", "moe-mla"])
def test_no_layout_the_estimator_refuses_is_quoted(text):
    # Moonlight's layout in moe-mla.md names its expert TP: with ETP = TP 2, EP 8 x 2 does not
    # divide the 8 ranks of TP 2 x DP 4 and the estimator refuses it
    assert "TP2 EP8 DP4" not in text


def test_the_plan_quoted_for_qwen3():
    argv = [sys.executable, "-m", "recompute_kit.cli", "plan", *QWEN, "--gpu-memory-gb", "79.1"]
    proc = subprocess.run([*argv, "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    said = doc["explanation"]
    assert doc["best"]["recompute"] == "selective:moe" and "`selective:moe`" in MOE_MLA
    closest = said[said.index("The closest cheaper setting") :].split(" (")[0]
    # "misses by" is the candidate's planned bytes over the usable memory: never negative
    assert "misses by -" not in said
    quoted(MOE_MLA, closest)
