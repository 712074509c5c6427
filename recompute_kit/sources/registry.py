"""The model registry: popular open models by Hugging Face id, each the model's public
`config.json` (values verbatim, `models/<org>--<name>.json`) with the URL it was copied from.

`model_reading(name)` accepts the id (case-insensitive), the id without its organisation, and
the short aliases of recompute-kit's presets.

Chat / instruct variants. Where the registry holds one of a base model and its chat/instruct
variant, the other id reads the registered file, each origin noting "<asked>: the same
architecture as <registered> (config.json shape fields identical)". The rule, for these
families only (their variants are fine-tunes that keep config.json's shape fields): Llama 3.x
(`meta-llama/[Meta-]Llama-3*`), Qwen2.5 and Qwen3 (`Qwen/Qwen2.5-*`, `Qwen/Qwen3-*`), Gemma 2
and Gemma 3 (`google/gemma-2-*`, `google/gemma-3-*`), Mistral (`mistralai/Mistral-*`,
`mistralai/Mixtral-*`):
  <base>-Instruct, -instruct, -it, -Chat, -chat  <->  <base>
  <base>-Instruct-YYMM                             <->  <base>
  gemma-3: <base>-it                               <->  <base>-pt (Gemma 3's base suffix)
  Mistral: <name>-Instruct-vX.Y                    <->  <name>-vX.Y
           <name>-Instruct-YYMM                    <->  <name>-Base-YYMM
Not mapped: Qwen's 2507 re-releases (Qwen3-4B-Instruct-2507 and the like): no source seen here
shows their config.json, so no claim that it matches the original's.
Also `meta-llama/Llama-3.1-*` <-> `meta-llama/Meta-Llama-3.1-*` (the Hub's two spellings).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from ..config import ConfigError
from .reading import Origin, Reading

# Registry-only keys in the JSON files (not part of the model's config.json).
_META_KEYS = ("source", "source_note")

# Short names -> HF id. Presets of recompute_kit/presets.py whose exact model is registered
# (llama3-8b is Meta-Llama-3-8B, read from the registered Meta-Llama-3-8B-Instruct by the variant
# rule; llama3-70b is Meta-Llama-3-70B: not registered, so no alias).
ALIASES = {
    "llama3-8b": "meta-llama/Meta-Llama-3-8B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
    "llama3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "llama3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
    # The current Hub names of the Llama 3.1 repositories.
    "meta-llama/llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/llama-3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
    "llama3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama3.2-3b": "meta-llama/Llama-3.2-3B",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gemma2-9b": "google/gemma-2-9b",
    "gemma2-27b": "google/gemma-2-27b",
}


# Families whose chat/instruct variants share the base's architecture (lower-case id prefixes).
_VARIANT_FAMILIES = re.compile(
    r"^(meta-llama/(meta-)?llama-3|qwen/qwen2\.5-|qwen/qwen3-|google/gemma-[23]-|mistralai/mi[sx]tral-)"
)
# Not mapped (see the module docstring).
_VARIANT_EXCLUDED = re.compile(r"^qwen/.*-2507$")
_VARIANT_SUFFIXES = ("-instruct", "-it", "-chat")


def _variant_candidates(key: str) -> list[str]:
    """Lower-case ids that share `key`'s architecture by the module's rule (not `key` itself)."""
    if not _VARIANT_FAMILIES.match(key) or _VARIANT_EXCLUDED.match(key):
        return []
    out: list[str] = []
    for suffix in _VARIANT_SUFFIXES:  # variant -> base
        if key.endswith(suffix):
            out.append(key[: -len(suffix)])
    m = re.match(r"^(.*)-instruct-(\d{4})$", key)
    if m:
        out.append(m.group(1))
        if key.startswith("mistralai/"):
            out.append(f"{m.group(1)}-base-{m.group(2)}")
    m = re.match(r"^(mistralai/.*)-instruct-(v\d+(\.\d+)*)$", key)
    if m:
        out.append(f"{m.group(1)}-{m.group(2)}")
    if key.startswith("google/gemma-3-") and key.endswith("-it"):
        out.append(key[: -len("-it")] + "-pt")
    # base -> variant
    m = re.match(r"^(mistralai/.*)-base-(\d{4})$", key)
    if m:
        out.append(f"{m.group(1)}-instruct-{m.group(2)}")
    m = re.match(r"^(mistralai/.*)-(v\d+(\.\d+)*)$", key)
    if m:
        out.append(f"{m.group(1)}-instruct-{m.group(2)}")
    base = key[: -len("-pt")] if key.startswith("google/gemma-3-") and key.endswith("-pt") else key
    if not any(key.endswith(s) for s in _VARIANT_SUFFIXES):
        out.extend(base + s for s in _VARIANT_SUFFIXES)
    return [c for c in dict.fromkeys(out) if c != key]


def _spellings(key: str) -> list[str]:
    """`key` and its other Llama 3.1 spelling."""
    for a, b in (
        ("meta-llama/llama-3.1-", "meta-llama/meta-llama-3.1-"),
        ("meta-llama/meta-llama-3.1-", "meta-llama/llama-3.1-"),
    ):
        if key.startswith(a):
            return [key, b + key[len(a) :]]
    return [key]


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """lower-case id -> file name."""
    out: dict[str, str] = {}
    for entry in resources.files(__package__).joinpath("models").iterdir():
        name = entry.name
        if name.endswith(".json"):
            out[name[: -len(".json")].replace("--", "/", 1).lower()] = name
    return out


@cache
def _load(file_name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("models", file_name).read_text(encoding="utf-8")
    return json.loads(text)


def _file_id(index_key: str) -> str:
    return _index()[index_key][: -len(".json")].replace("--", "/", 1)


def _resolve_variant(name: str) -> tuple[str, str | None] | None:
    """(registered id, variant note or None) for `name`, or None."""
    index = _index()
    key = name.strip().lower()
    key = ALIASES.get(key, key).lower()
    if "/" not in key:
        matches = [i for i in index if i.split("/", 1)[1] == key]
        if len(matches) == 1:
            return _file_id(matches[0]), None
    for spelled in _spellings(key):
        if spelled in index:
            return _file_id(spelled), None
    for spelled in _spellings(key):
        for candidate in _variant_candidates(spelled):
            for c in _spellings(candidate):
                if c in index:
                    registered = _file_id(c)
                    asked = name.strip()
                    return registered, (
                        f"{asked}: the same architecture as {registered} "
                        "(config.json shape fields identical)"
                    )
    return None


def _resolve(name: str) -> str | None:
    """The registered id (as spelled in the file name) for `name`, or None."""
    found = _resolve_variant(name)
    return found[0] if found else None


def variant_of(name: str) -> str | None:
    """The registered id whose architecture `name` shares by the chat/instruct rule, or None
    (also None when `name` itself, or an alias of it, is registered)."""
    found = _resolve_variant(name)
    return found[0] if found and found[1] else None


def list_models() -> list[tuple[str, str]]:
    """(HF id, source URL) of every registered model, sorted by id."""
    out = []
    for key in sorted(_index()):
        file_name = _index()[key]
        out.append((file_name[: -len(".json")].replace("--", "/", 1), _load(file_name)["source"]))
    return out


def model_config(name: str) -> dict[str, Any] | None:
    """The registered model's config.json values (without the registry's own keys)."""
    model_id = _resolve(name)
    if model_id is None:
        return None
    data = _load(model_id.replace("/", "--", 1) + ".json")
    return {k: v for k, v in data.items() if k not in _META_KEYS}


def model_reading(name: str) -> Reading | None:
    """The Megatron-Core fields of a registered model (by HF id, case-insensitive, or alias),
    each with Origin("model", "<id> config.json (<source url>)", "<hf key>"); None if unknown."""
    from .hf_config import fields_from_hf

    found = _resolve_variant(name)
    if found is None:
        return None
    model_id, variant_note = found
    data = _load(model_id.replace("/", "--", 1) + ".json")
    config = {k: v for k, v in data.items() if k not in _META_KEYS}
    try:
        reading = fields_from_hf(config, f"{model_id} config.json ({data['source']})")
    except ConfigError as exc:  # a broken registry entry is a bug, said in one line
        raise ConfigError(f"model registry entry {model_id}: {exc}") from None
    if variant_note:
        for field, origin in reading.origins.items():
            note = f"{origin.note}; {variant_note}" if origin.note else variant_note
            reading.origins[field] = replace(origin, note=note)
    reading.model_name = model_id
    reading.model_name_origin = Origin("model", "recompute-kit model registry", name)
    return reading


_SHORT_NAMES = {"dsv3": ("deepseek", "v3"), "dsv2": ("deepseek", "v2")}


def named_in(text: str) -> str | None:
    """A registered model whose name's parts all appear among `text`'s (a file name such as
    `qwen3_moe_30b_a3b_pretrain_override_example`: Qwen/Qwen3-30B-A3B), for a suggestion only;
    the longest such name, None when none or several equally long match."""
    words = set(re.split(r"[^a-z0-9.]+", text.lower()))
    for short, parts in _SHORT_NAMES.items():  # (NeMo-RL's recipes say dsv3)
        if short in words:
            words |= set(parts)
    found: list[tuple[int, str]] = []
    for model_id, _ in list_models():
        parts = [w for w in re.split(r"[^a-z0-9.]+", model_id.split("/")[-1].lower()) if w]
        if parts and all(part in words for part in parts):
            found.append((len(parts), model_id))
    found.sort(reverse=True)
    if not found or (len(found) > 1 and found[0][0] == found[1][0]):
        return None
    return found[0][1]
