"""The model registry: every entry reads, cites a source; the chat/instruct variant rule."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from recompute_kit.sources import registry

_MODELS = sorted(
    e.name
    for e in resources.files("recompute_kit.sources").joinpath("models").iterdir()
    if e.name.endswith(".json")
)


@pytest.mark.parametrize("file_name", _MODELS)
def test_every_registry_json_reads_with_shape_and_source(file_name):
    data = json.loads(
        resources.files("recompute_kit.sources").joinpath("models", file_name).read_text("utf-8")
    )
    assert data["source"].startswith("https://github.com/")
    assert "/blob/" in data["source"]  # a pinned file, not a moving page
    model_id = file_name[: -len(".json")].replace("--", "/", 1)
    reading = registry.model_reading(model_id)
    assert reading is not None and reading.model_name == model_id
    for key in ("num_layers", "hidden_size", "num_attention_heads"):
        assert isinstance(reading.values.get(key), int) and reading.values[key] > 0, key
    assert data["source"] in reading.origins["num_layers"].where
    assert not reading.origins["num_layers"].note  # registered ids carry no variant note


@pytest.mark.parametrize(
    ("asked", "registered"),
    [
        # variant -> registered base
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
        ("Qwen/Qwen3-8B-Instruct", "Qwen/Qwen3-8B"),
        ("google/gemma-2-9b-it", "google/gemma-2-9b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3"),
        ("mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Nemo-Base-2407"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),
        ("meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B"),
        # base -> registered variant
        ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"),
        ("llama3-8b", "meta-llama/Meta-Llama-3-8B-Instruct"),
        ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
        ("google/gemma-2-2b", "google/gemma-2-2b-it"),
        ("google/gemma-3-1b-pt", "google/gemma-3-1b-it"),
    ],
)
def test_variant_reads_the_registered_file_with_a_note(asked, registered):
    assert registry.variant_of(asked) == registered
    reading = registry.model_reading(asked)
    assert reading is not None
    assert reading.model_name == registered
    assert reading.values == registry.model_reading(registered).values
    note = f"{asked}: the same architecture as {registered} (config.json shape fields identical)"
    for key, origin in reading.origins.items():
        assert note in origin.note, key


@pytest.mark.parametrize(
    "asked",
    [
        "Qwen/Qwen3-4B-Instruct-2507",  # 2507 re-releases: no source shows their config
        "deepseek-ai/deepseek-moe-16b-chat",  # not a family of the rule
        "allenai/OLMo-2-1124-7B",  # not a family of the rule
        "Qwen/Qwen1.5-MoE-A2.7B",  # Qwen1.5: not a family of the rule
        "meta-llama/Meta-Llama-3-70B-Instruct",  # neither it nor its base registered
    ],
)
def test_no_variant_mapping_outside_the_rule(asked):
    assert registry.variant_of(asked) is None
    assert registry.model_reading(asked) is None


def test_registered_ids_and_llama_31_spellings_carry_no_note():
    assert registry.variant_of("Qwen/Qwen3-8B") is None
    assert registry.variant_of("meta-llama/Llama-3.1-405B") is None
    reading = registry.model_reading("meta-llama/Llama-3.1-405B")
    assert reading.model_name == "meta-llama/Meta-Llama-3.1-405B"
    assert not reading.origins["num_layers"].note
