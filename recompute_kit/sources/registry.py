"""The model registry: popular open models by Hugging Face id, each the model's public
`config.json` (values verbatim, `models/<org>--<name>.json`) with the URL it was copied from.

`model_reading(name)` accepts the id (case-insensitive), the id without its organisation, and
the short aliases of recompute-kit's presets.
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from ..config import ConfigError
from .reading import Origin, Reading

# Registry-only keys in the JSON files (not part of the model's config.json).
_META_KEYS = ("source", "source_note")

# Short names -> HF id. Presets of recompute_kit/presets.py whose exact model is registered
# (llama3-8b / llama3-70b are Meta-Llama-3, not 3.1: not registered, so no alias).
ALIASES = {
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


def _resolve(name: str) -> str | None:
    """The registered id (as spelled in the file name) for `name`, or None."""
    index = _index()
    key = name.strip().lower()
    key = ALIASES.get(key, key).lower()
    if key in index:
        return index[key][: -len(".json")].replace("--", "/", 1)
    if "/" not in key:
        matches = [i for i in index if i.split("/", 1)[1] == key]
        if len(matches) == 1:
            return index[matches[0]][: -len(".json")].replace("--", "/", 1)
    return None


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

    model_id = _resolve(name)
    if model_id is None:
        return None
    data = _load(model_id.replace("/", "--", 1) + ".json")
    config = {k: v for k, v in data.items() if k not in _META_KEYS}
    try:
        reading = fields_from_hf(config, f"{model_id} config.json ({data['source']})")
    except ConfigError as exc:  # a broken registry entry is a bug, said in one line
        raise ConfigError(f"model registry entry {model_id}: {exc}") from None
    reading.model_name = model_id
    reading.model_name_origin = Origin("model", "recompute-kit model registry", name)
    return reading
